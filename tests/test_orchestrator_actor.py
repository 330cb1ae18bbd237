"""The orchestrator is an actor: never blocked, its planner in a worker, answering by address (A4).

Planners here block on events the test controls, so every "while the planner thinks" is a real
state of the actor, not a race won by timing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pykka
import pytest

import journaled
from journaled import Plan, Step
from journaled.actors.errors import ActorsError
from journaled.actors.orchestrator_actor import Orchestrator, PlannerWorker
from journaled.events.orchestration_state import OrchestrationState
from journaled.testing import wait_for

GOAL = "ship the release notes"
WAIT = 30.0

PlannerFn = Callable[[str, list[Any], list[Any]], Any]


class Thinking:
    """A planner that blocks until released, recording the thread it ran in."""

    def __init__(self, answer: Any = None) -> None:
        self.thinking = threading.Event()
        self.release = threading.Event()
        self.threads: list[threading.Thread] = []
        self.answer = answer

    def __call__(self, goal: str, observations: list[Any], clarifications: list[Any]) -> Any:
        self.threads.append(threading.current_thread())
        self.thinking.set()
        assert self.release.wait(WAIT)
        if self.answer is not None:
            return self.answer
        return Plan(goal=goal, steps=[Step("a", tool="fetch", input=1)])

    def done(self) -> None:
        """Let the planner return and wait for its worker to stop."""
        self.release.set()
        wait_for(lambda: not pykka.ActorRegistry.get_by_class(PlannerWorker), WAIT)


def _kinds(rt: journaled.Runtime, run_id: str) -> list[str]:
    return [e.kind for e in rt.runs.history(run_id)]


@pytest.fixture
def runtime(rt: journaled.Runtime) -> journaled.Runtime:
    rt.register_tool("fetch", lambda x: x)
    return rt


def test_the_planner_runs_off_the_callers_thread(runtime: journaled.Runtime) -> None:
    """A4/A2: orchestrate_start returns a handle while the planner still thinks, in a worker."""
    planner = Thinking()
    handle = runtime.orchestrate_start(GOAL, planner)
    try:
        assert planner.thinking.wait(WAIT)
        assert not handle.done()
        assert _kinds(runtime, handle.run_id) == ["orchestration.started"]
        assert planner.threads[0] is not threading.current_thread()
    finally:
        planner.done()
    outcome = handle.result(WAIT)
    assert outcome.status == "completed"
    assert outcome.run_id == handle.run_id


def test_heartbeats_are_appended_during_a_long_planner_call(
    runtime: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """J3/R8: while the planner thinks, the orchestration appends heartbeats naming its owner."""
    monkeypatch.setattr(Orchestrator, "heartbeat_seconds", 0.05)
    planner = Thinking()
    handle = runtime.orchestrate_start(GOAL, planner)
    try:
        assert planner.thinking.wait(WAIT)
        wait_for(lambda: _kinds(runtime, handle.run_id).count("run.heartbeat") >= 2, WAIT)
    finally:
        planner.done()
    assert handle.result(WAIT).status == "completed"
    history = runtime.runs.history(handle.run_id)
    beats = [e for e in history if e.kind == "run.heartbeat"]
    started = history[0].data
    assert {b.data.owner for b in beats} == {started.owner}  # type: ignore[attr-defined]
    # R5: a state folded from the journal at a heartbeat is the state of that moment.
    state = runtime._orchestrations.state(handle.run_id, beats[0].position)
    assert (state.phase, state.last_at) == ("planning", beats[0].data.at)
    assert "heartbeat" not in runtime.runs.why(handle.run_id).splitlines()[0]


@pytest.fixture
def patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """An orchestrator that would wait longer than the tests for a worker to stop.

    The planners here block until the test releases them: an answer that waited for such a busy
    worker to stop would come after the test gave up, not after a short timeout. Before the fix,
    a cancel or a close while the planner thought waited the whole stop timeout (5 s), and the
    close's own 5 s wait for the orchestration raced it: its handle was sometimes left pending.
    """
    monkeypatch.setattr(Orchestrator, "worker_stop_seconds", 2 * WAIT)


@pytest.mark.usefixtures("patient")
def test_a_cancel_while_the_planner_thinks_answers_at_once(runtime: journaled.Runtime) -> None:
    """E5/A4: a cancel during planning ends the orchestration before the planner returns."""
    planner = Thinking()
    handle = runtime.orchestrate_start(GOAL, planner)
    try:
        assert planner.thinking.wait(WAIT)
        assert handle.cancel()
        outcome = handle.result(WAIT)  # the planner still blocks: the actor did not wait for it
        assert not planner.release.is_set()
    finally:
        planner.done()
    assert outcome.status == "failed"
    assert outcome.summary == "cancelled in pass 1 (planning)"
    assert _kinds(runtime, handle.run_id) == ["orchestration.started", "orchestration.ended"]
    assert not handle.cancel()  # not driven any more


@pytest.mark.usefixtures("patient")
def test_a_close_while_the_planner_thinks_leaves_it_resumable(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """R3/R5/A4: closing during planning answers RuntimeClosed and journals only the
    orchestration's suspension (ADR 0087); a resume plans. The close does not wait for the
    planner, and no orchestration is left driven."""
    planner = Thinking()
    with journaled.open(sqlite_url) as first:
        first.register_tool("fetch", lambda x: x)
        handle = first.orchestrate_start(GOAL, planner)
        assert planner.thinking.wait(WAIT)
        first.close()
        assert handle.done()
        assert not planner.release.is_set()
        assert "still driven" not in caplog.text
        with pytest.raises(journaled.RuntimeClosed):
            handle.result(0)
        planner.done()
    with journaled.open(sqlite_url) as second:
        second.register_tool("fetch", lambda x: x)
        assert _kinds(second, handle.run_id) == [
            "orchestration.started",
            "orchestration.suspended",
        ]
        outcome = second.resume(handle.run_id, planner=lambda *_: planner.answer or _plan())
        assert isinstance(outcome, journaled.Outcome)
        assert outcome.status == "completed"


def _plan() -> Plan:
    return Plan(goal=GOAL, steps=[Step("a", tool="fetch", input=1)])


class Abort(BaseException):
    """Not an Exception: what a planner may raise that is no planning failure."""


def test_a_planner_raising_a_base_exception_answers_the_handle(
    runtime: journaled.Runtime,
) -> None:
    """A4/R5: a BaseException from the planner answers the handle; the orchestration resumes."""

    def planner(*_: object) -> Plan:
        raise Abort("pulled the plug")

    handle = runtime.orchestrate_start(GOAL, planner)
    with pytest.raises(ActorsError, match="Abort: pulled the plug"):
        handle.result(WAIT)
    assert _kinds(runtime, handle.run_id) == ["orchestration.started"]
    outcome = runtime.resume(handle.run_id, planner=lambda *_: _plan())
    assert isinstance(outcome, journaled.Outcome)
    assert outcome.status == "completed"


def test_an_error_inside_the_orchestrator_answers_the_handle(runtime: journaled.Runtime) -> None:
    """A4: an exception raised inside the actor (here by a trace) answers the handle, no hang."""

    def trace(position: int, state: OrchestrationState) -> None:
        if state.phase == "settling":
            raise RuntimeError("the trace broke")

    handle = runtime._orchestrations.start(GOAL, lambda *_: _plan(), trace=trace)
    with pytest.raises(RuntimeError, match="the trace broke"):
        handle.result(WAIT)
    assert not runtime._orchestrations.cancel(handle.run_id)  # let go: resumable again


def test_resume_start_returns_the_orchestrators_handle(runtime: journaled.Runtime) -> None:
    """A2/O4: rt.resume_start of an orchestration answers at once with the actor's handle."""
    waiting = runtime.orchestrate(GOAL, lambda *_: _plan(), require_approval=True)
    assert waiting.status == "waiting_for_approval"
    planner = Thinking()
    handle = runtime.resume_start(waiting.run_id, approve=True, planner=planner)
    outcome = handle.result(WAIT)
    assert isinstance(outcome, journaled.Outcome)
    assert outcome.status == "completed"
    assert "orchestration.resumed" in _kinds(runtime, waiting.run_id)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"mode": "bogus"}, "mode"),
        ({"max_passes": 0}, "max_passes"),
        ({"call_budget": -1}, "call_budget"),
    ],
)
def test_orchestrate_start_refuses_bad_input_before_appending(
    runtime: journaled.Runtime, options: dict[str, Any], field: str
) -> None:
    """O1/A2: orchestrate_start raises a bad argument from the call, with nothing appended."""
    before = runtime.journal.position()
    with pytest.raises(ValueError, match=field):
        runtime.orchestrate_start(GOAL, lambda *_: _plan(), **options)
    assert runtime.journal.position() == before
    assert not pykka.ActorRegistry.get_by_class(Orchestrator)


def test_cancelling_an_orchestrations_future_changes_nothing(runtime: journaled.Runtime) -> None:
    """A2/O4 (ADR 0031): an orchestration handle's future is the caller's to wait on: its
    cancel() answers False and the orchestration goes on to its outcome, which result() gives."""
    planner = Thinking()
    handle = runtime.orchestrate_start(GOAL, planner)
    try:
        assert planner.thinking.wait(WAIT)
        assert handle.future.cancel() is False
    finally:
        planner.done()
    outcome = handle.result(WAIT)
    assert outcome.status == "completed"
    assert not handle.future.cancelled()
