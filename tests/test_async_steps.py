"""``async def`` skills, tools and agents on both runtimes (A1).

The sync runtime runs a step's coroutine on a loop it owns; the asyncio runtime (here through the
sync facade, whose loop thread plays the application's loop) on the loop it was opened on. Either
way a run cancel or a step deadline cancels the step's task, and close drains async steps like
sync ones.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aio_facade import FLAVOURS, open_runtime

import journaled
import journaled.aio
from journaled import AgentContext, AgentResult, AsyncAgentContext, NeedsInput, Plan, Step

WAIT = 10.0


@pytest.fixture(params=FLAVOURS)
def flavour(request: pytest.FixtureRequest) -> str:
    """Run each test on the sync and the asyncio runtime (A1)."""
    param: str = request.param
    return param


@pytest.fixture
def runtime(sqlite_url: str, flavour: str) -> Iterator[journaled.Runtime]:
    with open_runtime(flavour, sqlite_url) as rt:
        yield rt


def one(step: Step) -> Plan:
    return Plan(goal="g", steps=[step])


class Sighting:
    """What a step's coroutine saw: that it started, and whether it was cancelled."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.cancelled = threading.Event()
        self.finished = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None

    async def hang(self, x: Any) -> Any:
        self.loop = asyncio.get_running_loop()
        self.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        finally:
            self.finished.set()
        return x


def test_async_tool_output_is_observed(runtime: journaled.Runtime) -> None:
    """A1: an async def tool runs on an event loop and its return value is the step's output."""

    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    runtime.register_tool("double", double)
    result = runtime.execute(one(Step("a", tool="double", input=21)))
    assert result.ok
    assert result.observations[0].output == 42
    assert result.calls_used == 0


def test_async_skill_costs_one_call(runtime: journaled.Runtime) -> None:
    """A1: an async def skill's output is observed and it is charged one model call."""

    async def think(x: str) -> str:
        await asyncio.sleep(0)
        return f"thought about {x}"

    runtime.register_skill("think", think)
    result = runtime.execute(one(Step("a", skill="think", input="tea")))
    assert result.ok
    assert result.observations[0].output == "thought about tea"
    assert result.calls_used == 1


def test_async_tool_error_fails_its_step(runtime: journaled.Runtime) -> None:
    """A1: an exception raised by an async tool fails the step with its message."""

    async def broken(x: Any) -> Any:
        await asyncio.sleep(0)
        raise ValueError("no such city")

    runtime.register_tool("broken", broken)
    result = runtime.execute(one(Step("a", tool="broken", input=1)))
    assert not result.ok
    assert result.observations[0].error == "no such city"


def test_async_steps_run_on_the_runtimes_loop(runtime: journaled.Runtime, flavour: str) -> None:
    """A1: the asyncio runtime runs async steps on its own (the application's) loop."""
    seen: list[asyncio.AbstractEventLoop] = []

    async def where(x: Any) -> Any:
        seen.append(asyncio.get_running_loop())
        return x

    runtime.register_tool("where", where)
    assert runtime.execute(one(Step("a", tool="where", input=1))).ok
    if flavour == "aio":
        assert seen == [runtime._loop.loop]  # type: ignore[attr-defined]
    else:
        assert seen
        assert seen[0].is_running()


def test_async_agent_result_and_question(runtime: journaled.Runtime) -> None:
    """A1: an async agent returns an AgentResult, or raises NeedsInput and resumes on an answer."""

    async def agent(step: Step, ctx: AgentContext) -> AgentResult:
        await asyncio.sleep(0)
        if ctx.answer is None:
            raise NeedsInput("which city?")
        return AgentResult(output=f"weather in {ctx.answer}", calls_used=2)

    runtime.register_agent("weather", agent)
    first = runtime.execute(one(Step("a", agent="weather", input=None)))
    assert first.waiting == ["a"]
    assert first.observations[0].code == "agent-waiting"
    assert first.observations[0].error == "which city?"
    resumed = runtime.resume(first.run_id, answers={"a": "Oslo"})
    assert isinstance(resumed, journaled.ExecuteResult)
    assert resumed.ok
    assert resumed.observations[-1].output == "weather in Oslo"


def test_async_agent_runs_a_child_with_execute_async(runtime: journaled.Runtime) -> None:
    """A1: ``await ctx.execute_async(plan)`` runs a child run without blocking the agent's loop."""
    runtime.register_tool("echo", lambda x: x)

    async def agent(step: Step, ctx: AgentContext) -> AgentResult:
        child = await ctx.execute_async(one(Step("c", tool="echo", input="hi")))
        return AgentResult(output=child.observations[0].output)

    runtime.register_agent("delegate", agent)
    result = runtime.execute(one(Step("a", agent="delegate", input=None)))
    assert result.ok
    assert result.observations[0].output == "hi"
    child = result.observations[0].agent_task_id
    assert child is not None
    assert runtime.runs.current(child).ok


def test_an_async_agent_awaits_ctx_execute_for_its_child(runtime: journaled.Runtime) -> None:
    """A1, E9, SPEC section 5 (``ctx.execute(plan)`` for a linked child run): an ``async def``
    agent's ``await ctx.execute(plan)`` runs the child linked to its step, as a sync agent's
    ``ctx.execute(plan)`` does; it used to fail the step, naming execute_async."""
    runtime.register_tool("echo", lambda x: x)

    async def agent(step: Step, ctx: AsyncAgentContext) -> AgentResult:
        first = await ctx.execute(one(Step("c", tool="echo", input="hi")))
        second = await ctx.execute(one(Step("d", tool="echo", input="there")))
        outputs = [first.observations[0].output, second.observations[0].output]
        return AgentResult(output=" ".join(outputs))

    runtime.register_agent("delegate", agent)
    result = runtime.execute(one(Step("a", agent="delegate", input=None)))
    assert result.ok, result.observations
    assert result.observations[0].output == "hi there"
    children = [s.run_id for s in runtime.runs.list() if s.parent_run == result.run_id]
    assert len(children) == 2
    assert all(runtime.runs.current(c).ok for c in children)


def test_reading_an_unawaited_ctx_execute_says_to_await_it(runtime: journaled.Runtime) -> None:
    """A1: reading a result's attribute from ``ctx.execute(plan)`` not awaited, in an async
    agent, raises an error saying to await it; the step fails with it and no child run starts."""
    runtime.register_tool("echo", lambda x: x)

    async def agent(step: Step, ctx: AgentContext) -> AgentResult:
        child = ctx.execute(one(Step("c", tool="echo", input="hi")))
        return AgentResult(output=child.observations[0].output)

    runtime.register_agent("hasty", agent)
    result = runtime.execute(one(Step("a", agent="hasty", input=None)))
    assert not result.ok
    assert "await ctx.execute(plan)" in (result.observations[0].error or "")
    assert [s for s in runtime.runs.list() if s.parent_run == result.run_id] == []


def test_sync_execute_from_an_async_agent_fails_the_step(runtime: journaled.Runtime) -> None:
    """A1: ``ctx.execute`` not awaited inside an async agent fails its step, saying to await it,
    instead of a deadlock or a step that passes on a child run that never started."""
    runtime.register_tool("echo", lambda x: x)

    async def agent(step: Step, ctx: AgentContext) -> AgentResult:
        ctx.execute(one(Step("c", tool="echo", input="hi")))
        return AgentResult(output="unreachable")

    runtime.register_agent("blocking", agent)
    result = runtime.execute(one(Step("a", agent="blocking", input=None)))
    assert not result.ok
    assert "execute_async" in (result.observations[0].error or "")


def test_cancel_cancels_an_async_steps_task(runtime: journaled.Runtime) -> None:
    """A1, E5: cancelling a run cancels its async step's task; the step fails as cancelled."""
    seen = Sighting()
    runtime.register_tool("hang", seen.hang)
    handle = runtime.start(one(Step("a", tool="hang", input=1)))
    assert seen.started.wait(WAIT)
    assert runtime.cancel(handle.run_id)
    result = handle.result(WAIT)
    assert seen.cancelled.wait(WAIT)
    assert seen.finished.is_set()
    assert not result.ok
    assert result.observations[0].error == "cancelled: the run was aborted"
    assert result.observations[0].code == "cancelled"


def test_cancel_of_a_running_async_agent_records_code_cancelled(runtime: journaled.Runtime) -> None:
    """E5, A1: an ``async def`` agent whose task a cancel of its run cancelled records code
    ``cancelled`` (``cancelled: the run was aborted``), as an agent the cancel kept from starting
    does; it used to record ``agent-failed``, as if the agent had failed."""
    started = threading.Event()

    async def slow(step: Step, ctx: AgentContext) -> AgentResult:
        started.set()
        await asyncio.sleep(30)
        return AgentResult(output="unreachable")

    runtime.register_agent("slow", slow)
    handle = runtime.start(one(Step("a", agent="slow")))
    assert started.wait(WAIT)
    assert runtime.cancel(handle.run_id)
    result = handle.result(WAIT)
    [obs] = result.observations
    assert (obs.code, obs.error) == ("cancelled", "cancelled: the run was aborted")
    assert runtime.runs.summary(handle.run_id).status == "cancelled"


def test_step_timeout_cancels_an_async_steps_task(runtime: journaled.Runtime) -> None:
    """A1: a step deadline fails an async step as timed out and cancels its task."""
    seen = Sighting()
    runtime.register_tool("hang", seen.hang)
    result = runtime.execute(one(Step("a", tool="hang", input=1)), step_timeout=0.2)
    assert not result.ok
    assert result.observations[0].error == "timed out after 0.2s"
    assert seen.cancelled.wait(WAIT), "the step's coroutine never saw CancelledError"


def test_async_generator_fails_its_step(runtime: journaled.Runtime) -> None:
    """A1: an async generator function is not awaitable: its step fails, the run does not hang."""

    async def gen(x: Any) -> AsyncIterator[Any]:
        yield x

    runtime.register_tool("gen", gen)
    result = runtime.execute(one(Step("a", tool="gen", input=1)))
    assert not result.ok
    assert "cannot be journaled" in (result.observations[0].error or "")


def test_awaitable_that_is_not_a_coroutine_is_awaited(runtime: journaled.Runtime) -> None:
    """A1: a plain function returning an awaitable object gets the awaited value as output."""

    class Later:
        def __await__(self) -> Any:
            yield from asyncio.sleep(0).__await__()
            return "later"

    runtime.register_tool("later", lambda x: Later())
    result = runtime.execute(one(Step("a", tool="later", input=1)))
    assert result.ok
    assert result.observations[0].output == "later"


def test_close_drains_async_steps(sqlite_url: str, flavour: str) -> None:
    """A1, R3: close waits for an async step in flight to finish and journals its output."""
    started = threading.Event()

    async def slow(x: int) -> int:
        started.set()
        await asyncio.sleep(0.3)
        return x + 1

    rt = open_runtime(flavour, sqlite_url)
    rt.register_tool("slow", slow)
    handle = rt.start(one(Step("a", tool="slow", input=1)))
    assert started.wait(WAIT)
    rt.close(drain=WAIT)
    result = handle.result(WAIT)
    assert result.ok
    assert not result.suspended
    assert result.observations[0].output == 2
    with journaled.open(sqlite_url) as again:
        assert again.runs.current(handle.run_id).ok


def test_close_without_drain_cancels_async_steps_and_suspends(
    sqlite_url: str, flavour: str
) -> None:
    """A1, R3: an async step still running when the drain ends is cancelled; its run suspends."""
    seen = Sighting()
    rt = open_runtime(flavour, sqlite_url)
    rt.register_tool("hang", seen.hang)
    handle = rt.start(one(Step("a", tool="hang", input=1)))
    assert seen.started.wait(WAIT)
    rt.close(drain=0)
    assert handle.result(WAIT).suspended
    assert seen.cancelled.wait(WAIT)


def test_nested_async_agents_hold_no_thread_of_the_loops_executor(sqlite_url: str) -> None:
    """A1/E9 (ADR 0025): an async agent's ``await ctx.execute(plan)`` awaits its child's future
    instead of holding a thread of the loop's default executor for the child's life: three
    parallel async agents, each awaiting a child whose async agent awaits a grandchild, complete
    on a loop whose default executor has one thread (they deadlocked), linked as E9 says."""
    from concurrent.futures import ThreadPoolExecutor

    async def fetch(x: Any) -> Any:
        await asyncio.sleep(0.01)
        return x

    async def inner(step: Step, ctx: AsyncAgentContext) -> AgentResult:
        result = await ctx.execute(one(Step("t", tool="fetch", input=step.input)))
        return AgentResult(output=result.observations[0].output)

    async def outer(step: Step, ctx: AsyncAgentContext) -> AgentResult:
        result = await ctx.execute(one(Step("i", agent="inner", input=step.input)))
        return AgentResult(output=result.observations[0].output)

    async def story() -> tuple[journaled.ExecuteResult, dict[str, str | None]]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        async with journaled.aio.open(sqlite_url, drain=0.5) as rt:
            rt.register_tool("fetch", fetch)
            rt.register_agent("inner", inner)
            rt.register_agent("outer", outer)
            plan = Plan(goal="g", steps=[Step(f"o{i}", agent="outer", input=i) for i in range(3)])
            result = await asyncio.wait_for(rt.execute(plan, max_parallel_steps=3), 3 * WAIT)
            parents = {s.run_id: s.parent_run for s in await rt.runs.list()}
            return result, parents

    result, parents = asyncio.run(story())
    assert result.ok, result.observations
    assert sorted(o.output for o in result.observations) == [0, 1, 2]
    for observation in result.observations:
        child = observation.agent_task_id
        assert child is not None
        assert parents[child] == result.run_id
        assert sum(1 for p in parents.values() if p == child) == 1  # one grandchild each


def test_cancelling_an_async_agents_run_cancels_the_child_it_awaits(
    runtime: journaled.Runtime,
) -> None:
    """E5/E9/A1: a cancel of a run whose async agent awaits ``ctx.execute`` cancels the agent's
    task and the child run (its next step never starts); the step records code ``cancelled``
    and names the child."""
    started = threading.Event()

    def block(x: Any) -> Any:
        started.set()
        for _ in range(int(WAIT / 0.01)):
            if released.is_set():
                break
            threading.Event().wait(0.01)
        return x

    released = threading.Event()
    runtime.register_tool("block", block)

    async def agent(step: Step, ctx: AsyncAgentContext) -> AgentResult:
        steps = [
            Step("b", tool="block", input=1),
            Step("c", tool="block", input=2, depends_on=["b"]),
        ]
        await ctx.execute(Plan(goal="child", steps=steps))
        return AgentResult(output="not cancelled")

    runtime.register_agent("delegate", agent)
    handle = runtime.start(one(Step("a", agent="delegate", input=None)))
    try:
        assert started.wait(WAIT)
        assert handle.cancel()
    finally:
        released.set()
    result = handle.result(WAIT)
    observation = result.observations[0]
    assert observation.code == "cancelled", observation
    child = observation.agent_task_id
    assert child is not None
    assert runtime.runs.summary(child).parent_run == result.run_id
    assert runtime.runs.wait_idle(WAIT) == []
    assert runtime.runs.summary(child).status == "cancelled"
