"""A representative story touching every part of the protocol, for the schema and message tests.

Memory: conflict keys and a supersession, a search over two scopes, a delete and a purge.
Runs: a plan with a tool, a skill, an agent that waits and is answered and an agent that runs a
child plan through ``ctx.execute``; a step timeout; a cancel; an orchestration, and one cancelled
while its planner thinks; a run purge; and a close that drains a run in flight and suspends it,
and stops an orchestration whose planner thinks.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pykka

import journaled
from journaled import AgentResult, NeedsInput, Plan, Step
from journaled.actors.memory import MemoryWriter
from journaled.actors.orchestrator_actor import PlannerWorker
from journaled.actors.steps import StepWorker
from journaled.testing import wait_for

WAIT = 30.0


def _asker(step: Step, ctx: journaled.AgentContext) -> AgentResult:
    if ctx.answer is None:
        raise NeedsInput(f"which branch for {step.id}?")
    return AgentResult(output=f"{step.id} on {ctx.answer}", calls_used=1)


def _delegator(step: Step, ctx: journaled.AgentContext) -> AgentResult:
    child = ctx.execute(Plan(goal="look it up", steps=[Step("x", tool="echo", input=5)]))
    return AgentResult(output=child.observations[0].output, calls_used=0)


def _planner(goal: str, observations: list[Any], clarifications: list[Any]) -> Plan:
    return Plan(goal=goal, steps=[Step("read", tool="echo", input="notes")])


@contextlib.contextmanager
def _by_message(rt: journaled.Runtime) -> Iterator[None]:
    """Send memory's messages as it does when its actors are busy: remembers to the writer,
    folds to the scope actors, reads to them (ADR 0053, ADR 0054). Idle, memory does that work
    on the caller's thread and sends nothing."""
    writer = rt._actors.desk.writer
    assert isinstance(writer, MemoryWriter)
    saved = rt.memory._desk, rt.memory._shelves, writer.shelves
    rt.memory._desk, rt.memory._shelves, writer.shelves = None, [], {}
    try:
        yield
    finally:
        rt.memory._desk, rt.memory._shelves, writer.shelves = saved


def _memory(rt: journaled.Runtime) -> None:
    rt.memory.remember("deploys go through staging", conflict_key="deploy.path", domain="ops")
    rota = rt.memory.remember("the rota is in the wiki", source="https://wiki.example/rota")
    assert rt.memory.search("deploys")  # idle actors: stored and read in place
    with _by_message(rt):
        rt.memory.remember("deploys go straight to production", conflict_key="deploy.path")
        secret = rt.memory.remember("alice's phone is 555-0100", confidence=0.9)
        rt.memory.remember("deploys need my approval", scope="user")
        assert rt.memory.search("deploys")  # two scopes hold candidates: stats, then scores
        assert rt.memory.delete(rota.id).primary
        assert rt.memory.purge(secret.id, reason="erasure request")


def _execute(rt: journaled.Runtime) -> None:
    rt.register_tool("echo", lambda x: x)
    rt.register_skill("shout", lambda x: str(x).upper())
    rt.register_agent("asker", _asker)
    rt.register_agent("delegator", _delegator)
    plan = Plan(
        goal="ship the notes",
        steps=[
            Step("fetch", tool="echo", input="notes"),
            Step("loud", skill="shout", depends_on=["fetch"]),
            Step("ask", agent="asker"),
            Step("delegate", agent="delegator"),
        ],
    )
    first = rt.execute(plan, call_budget=10)
    assert first.waiting == ["ask"]
    done = rt.resume(first.run_id, answers={"ask": "main"})
    assert isinstance(done, journaled.ExecuteResult)
    assert done.ok
    rt.runs.purge(done.run_id, reason="erasure request")


def _timeout(rt: journaled.Runtime) -> None:
    release = threading.Event()
    rt.register_tool("hang", lambda x: release.wait(WAIT))
    try:
        result = rt.execute(Plan(goal="slow", steps=[Step("h", tool="hang")]), step_timeout=0.2)
    finally:
        release.set()
    assert result.observations[0].error == "timed out after 0.2s"
    wait_for(lambda: not pykka.ActorRegistry.get_by_class(StepWorker))


def _hold(rt: journaled.Runtime, name: str) -> tuple[threading.Event, threading.Event]:
    inside, release = threading.Event(), threading.Event()

    def hold(_: object) -> str:
        inside.set()
        release.wait(WAIT)
        return "held"

    rt.register_tool(name, hold)
    return inside, release


def _cancel(rt: journaled.Runtime) -> None:
    inside, release = _hold(rt, "hold")
    plan = Plan(goal="g", steps=[Step("a", tool="hold"), Step("b", tool="echo", depends_on=["a"])])
    results: list[journaled.ExecuteResult] = []
    thread = threading.Thread(target=lambda: results.append(rt.execute(plan)))
    thread.start()
    assert inside.wait(WAIT)
    [run_id] = rt.runs.active()
    assert rt.cancel(run_id)
    release.set()
    thread.join(WAIT)
    assert [o.step_id for o in results[0].observations if o.ok] == ["a"]


def _thinking_planner() -> tuple[threading.Event, threading.Event, Any]:
    """Return (thinking, release, planner): the planner blocks until released."""
    thinking, release = threading.Event(), threading.Event()

    def planner(goal: str, observations: list[Any], clarifications: list[Any]) -> Plan:
        thinking.set()
        release.wait(WAIT)
        return _planner(goal, observations, clarifications)

    return thinking, release, planner


def _orchestrate(rt: journaled.Runtime) -> None:
    outcome = rt.orchestrate("summarize the notes", _planner)
    assert outcome.status == "completed", outcome
    thinking, release, planner = _thinking_planner()
    handle = rt.orchestrate_start("summarize them again", planner)
    assert thinking.wait(WAIT)
    assert handle.cancel()
    assert handle.result(WAIT).status == "failed"
    release.set()
    wait_for(lambda: not pykka.ActorRegistry.get_by_class(PlannerWorker))


def _close_with_drain(rt: journaled.Runtime) -> None:
    inside, release = _hold(rt, "drained")
    plan = Plan(
        goal="g", steps=[Step("a", tool="drained"), Step("b", tool="echo", depends_on=["a"])]
    )
    thread = threading.Thread(target=lambda: rt.execute(plan))
    thread.start()
    assert inside.wait(WAIT)
    thinking, planned, planner = _thinking_planner()
    handle = rt.orchestrate_start("summarize the notes once more", planner)
    assert thinking.wait(WAIT)
    threading.Timer(0.2, release.set).start()
    rt.close()
    thread.join(WAIT)
    assert handle.done()
    assert isinstance(handle.future.exception(), journaled.RuntimeClosed)
    planned.set()
    wait_for(lambda: not pykka.ActorRegistry.get_by_class(PlannerWorker))


def tell(url: str) -> None:
    """Run the whole story on the journal at ``url``; the runtime is closed (drained) after it."""
    rt = journaled.open(url, drain=WAIT)
    try:
        _memory(rt)
        _execute(rt)
        _timeout(rt)
        _cancel(rt)
        _orchestrate(rt)
        _close_with_drain(rt)
    finally:
        rt.close()
