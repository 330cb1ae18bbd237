"""Edges of the embedding API: on_progress shapes (A2, E12), ``await ctx.execute`` in async
agents (A1, E9), ``memory.as_of()`` now (M12) and message versions (A4)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import journaled
from journaled import AgentContext, AgentResult, AsyncAgentContext, Plan, Step
from journaled.actors.run_args import child_run_id
from journaled.events.errors import ProtocolError
from journaled.events.protocol import decode_envelope_json, decode_json, encode_json

WAIT = 10.0


def one(step: Step) -> Plan:
    return Plan(goal="g", steps=[step])


def children(rt: journaled.Runtime, run_id: str) -> list[str]:
    return [s.run_id for s in rt.runs.list() if s.parent_run == run_id]


def test_on_progress_with_a_positional_only_run_id_first_gets_it(sqlite_url: str) -> None:
    """A2: a ``run_id`` parameter first among the positional ones gets the run id there, also
    when it is positional-only; it used to get nothing and fail at every quiescent point."""
    seen: list[tuple[str, str]] = []

    def progress(run_id: str, /, at: str, delta: Any, calls: int, waiting: Any) -> None:
        seen.append((run_id, at))

    with journaled.open(sqlite_url) as rt:
        rt.register_tool("echo", lambda x: x)
        result = rt.execute(one(Step("a", tool="echo", input=1)), on_progress=progress)
    assert seen
    assert {run_id for run_id, _ in seen} == {result.run_id}


def test_on_progress_with_run_id_after_parameters_of_its_own_gets_it_by_name(
    sqlite_url: str,
) -> None:
    """A2: ``def p(at, delta, calls, waiting, label=None, run_id=None)`` gets the run id as
    ``run_id``; it used to be put in ``label``'s place, and ``run_id`` stayed None."""
    seen: list[tuple[object, object]] = []

    def progress(
        at: str, delta: Any, calls: int, waiting: Any, label: str = "mine", run_id: object = None
    ) -> None:
        seen.append((label, run_id))

    with journaled.open(sqlite_url) as rt:
        rt.register_tool("echo", lambda x: x)
        result = rt.execute(one(Step("a", tool="echo", input=1)), on_progress=progress)
    assert seen
    assert set(seen) == {("mine", result.run_id)}


def test_awaiting_ctx_execute_twice_starts_one_child_and_keeps_the_step(
    sqlite_url: str,
) -> None:
    """A1, E9: ``await`` of the same ``ctx.execute(plan)`` a second time raises RuntimeError, as
    a coroutine's does; it used to start a second child run, then fail the step saying
    ctx.execute was never awaited."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("echo", lambda x: x)

        async def agent(step: Step, ctx: AgentContext) -> AgentResult:
            call = ctx.execute(one(Step("c", tool="echo", input="hi")))
            first = await call  # type: ignore[misc]
            try:
                await call  # type: ignore[misc]
            except RuntimeError as exc:
                return AgentResult(output=[first.run_id, str(exc)])
            return AgentResult(ok=False, error="awaited twice")

        rt.register_agent("twice", agent)
        result = rt.execute(one(Step("a", agent="twice", input=None)))
        assert result.ok, result.observations
        first, said = result.observations[0].output
        assert "awaited already" in said
        assert children(rt, result.run_id) == [first]


def test_create_task_takes_ctx_execute(sqlite_url: str) -> None:
    """A1: ``asyncio.create_task(ctx.execute(plan))`` runs the child, as ``gather`` does; it
    used to raise TypeError (a coroutine was expected) and fail the step."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("echo", lambda x: x)

        async def agent(step: Step, ctx: AgentContext) -> AgentResult:
            call: Any = ctx.execute(one(Step("c", tool="echo", input="hi")))
            task: asyncio.Task[journaled.ExecuteResult] = asyncio.create_task(call)
            child = await task
            return AgentResult(output=child.observations[0].output)

        rt.register_agent("tasked", agent)
        result = rt.execute(one(Step("a", agent="tasked", input=None)))
        assert result.ok, result.observations
        assert result.observations[0].output == "hi"
        assert len(children(rt, result.run_id)) == 1


def test_an_async_agent_cancelled_while_awaiting_its_child_names_it(sqlite_url: str) -> None:
    """E9, E5: an async agent cancelled (by its run's cancel) while it awaits ``ctx.execute``
    records code cancelled and carries the child run as ``agent_task_id``, as a sync agent's
    step does; it used to carry none, though the child ran and was cancelled with it."""
    started = threading.Event()

    def slow(x: Any) -> Any:
        started.set()
        time.sleep(0.5)
        return x

    child_plan = Plan(
        goal="c",
        steps=[
            Step("c1", tool="slow", input=1),
            Step("c2", tool="slow", input=2, depends_on=["c1"]),
        ],
    )
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("slow", slow)

        async def agent(step: Step, ctx: AsyncAgentContext) -> AgentResult:
            child = await ctx.execute(child_plan)
            return AgentResult(output=child.run_id)

        rt.register_agent("waiter", agent)
        handle = rt.start(one(Step("a", agent="waiter", input=None)))
        assert started.wait(WAIT)
        handle.cancel()
        result = handle.result(WAIT)
        observation = result.observations[0]
        assert observation.code == "cancelled"
        kids = children(rt, result.run_id)
        assert len(kids) == 1
        assert observation.agent_task_id == kids[0]


def test_as_of_now_judges_validity_now(sqlite_url: str) -> None:
    """M12, SPEC section 5: ``memory.as_of()`` views the journal as it is now, so its search
    answers what ``memory.search`` answers; it used to judge validity at the last event's time
    and find a fact whose ``valid_until`` has passed since."""
    with journaled.open(sqlite_url) as rt:
        now = int(time.time() * 1000)
        rt.memory.remember("deploy window opens", valid_until=now + 200)
        time.sleep(0.4)
        assert rt.memory.search("deploy") == []
        assert rt.memory.as_of().search("deploy") == []


def test_a_message_of_another_version_is_not_taken_for_this_one() -> None:
    """A4: every message type has a schema version (1 now); a message that says it is version 2
    is refused, not decoded as version 1 with its version ignored."""
    with pytest.raises(ProtocolError) as raised:
        decode_envelope_json(b'{"to": "runs", "message": {"type": "run.begin", "version": 2}}')
    assert "run.begin version 2 is not one this release reads" in str(raised.value)
    assert "at `$.message.version`" in str(raised.value)
    with pytest.raises(ProtocolError, match=r"at `\$\.version`"):
        decode_json(b'{"type": "run.begin", "version": "1"}')
    for said in (b"", b', "version": 1'):
        envelope = decode_envelope_json(
            b'{"to": "runs", "message": {"type": "run.begin"%s}}' % said
        )
        assert envelope.message == decode_json(b'{"type": "run.begin"%s}' % said)
    assert b"version" not in encode_json(envelope)  # version 1 is the one a message omits


def test_gathered_child_runs_take_their_ordinals_in_the_agents_order(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R5, E9, A1: ``asyncio.gather(ctx.execute(a), ctx.execute(b))`` gives a the step's first
    child and b its second, however the worker threads are scheduled, so a re-run of the step
    finds each call's own child. The ordinal used to be taken in the worker thread: one
    scheduled late got the other's child, and a re-run could be handed the other plan's run."""
    real = asyncio.to_thread
    calls = 0

    async def late_first(func: Any, /, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:  # the first call's worker runs after the second's

            def later() -> Any:
                time.sleep(0.3)
                return func(*args, **kwargs)

            return await real(later)
        return await real(func, *args, **kwargs)

    monkeypatch.setattr("journaled.actors.steps.asyncio.to_thread", late_first)
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("echo", lambda x: x)

        async def agent(step: Step, ctx: AgentContext) -> AgentResult:
            a: Any = ctx.execute(Plan(goal="a", steps=[Step("c", tool="echo", input="a")]))
            b: Any = ctx.execute(Plan(goal="b", steps=[Step("c", tool="echo", input="b")]))
            done = await asyncio.gather(a, b)
            return AgentResult(output=[r.observations[0].output for r in done])

        rt.register_agent("pair", agent)
        result = rt.execute(one(Step("s", agent="pair", input=None)))
        assert result.ok, result.observations
        assert result.observations[0].output == ["a", "b"]
        goals = {
            call: rt.runs.at(
                child_run_id(result.run_id, "s", call), rt.journal.position()
            ).plan.goal
            for call in (1, 2)
        }
    assert goals == {1: "a", 2: "b"}
