"""Run handles (SPEC A2): start returns at once with an id readable in the journal."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from aio_facade import FLAVOURS, open_runtime

import journaled
from journaled import Plan, Step
from journaled.testing import ManualClock

WAIT = 10.0


@pytest.fixture(params=FLAVOURS)
def flavour(request: pytest.FixtureRequest) -> str:
    """Run the runtime fixture's tests on the sync and the asyncio runtime (A1)."""
    param: str = request.param
    return param


@pytest.fixture
def runtime(journal_url: str, clock: ManualClock, flavour: str) -> Iterator[journaled.Runtime]:
    with open_runtime(flavour, journal_url, clock=clock) as rt:
        yield rt


def test_start_returns_at_once_with_a_readable_run_id(runtime: journaled.Runtime) -> None:
    """A2: start returns before the run ends; its id is in the journal; result() waits for it."""
    release = threading.Event()
    runtime.register_tool("slow", lambda x: release.wait(WAIT) and x)
    handle = runtime.start(Plan(goal="g", steps=[Step("a", tool="slow", input=1)]))
    assert not handle.done()
    assert runtime.runs.history(handle.run_id)[0].kind == "run.started"
    assert handle.state().plan.steps[0].status in ("pending", "running")
    with pytest.raises(TimeoutError):
        handle.result(timeout=0.05)
    release.set()
    result = handle.result(timeout=WAIT)
    assert result.ok
    assert result.run_id == handle.run_id
    assert handle.done()
    assert handle.state().ok


def test_a_handle_cancels_its_run(runtime: journaled.Runtime) -> None:
    """A2/E5: handle.cancel() cancels the run it started; a finished run answers False."""
    started = threading.Event()

    def wait_for_cancel(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        started.set()
        while not ctx.cancelled():
            threading.Event().wait(0.01)
        return journaled.AgentResult(ok=False, error="stopped")

    runtime.register_agent("waiter", wait_for_cancel)
    runtime.register_tool("after", lambda x: x)
    plan = Plan(
        goal="g",
        steps=[Step("a", agent="waiter"), Step("b", tool="after", depends_on=["a"])],
    )
    handle = runtime.start(plan)
    assert started.wait(WAIT)
    assert handle.cancel() is True
    result = handle.result(timeout=WAIT)
    assert not result.ok
    assert runtime.runs.history(handle.run_id)[-1].data.status == "cancelled"  # type: ignore[attr-defined]
    assert handle.cancel() is False


def test_start_refuses_a_bad_plan_before_anything_is_appended(runtime: journaled.Runtime) -> None:
    """A2/E1: a malformed plan raises from start itself and appends nothing."""
    before = runtime.journal.position()
    with pytest.raises(journaled.PlanRejected):
        runtime.start(Plan(goal="g", steps=[Step("a", tool="missing")]))
    assert runtime.journal.position() == before


def test_resume_start_hands_back_the_resumed_run(runtime: journaled.Runtime) -> None:
    """A2/E14: resume_start answers at once; its result is what resume would return."""
    runtime.register_skill("think", lambda x: "idea")
    stopped = runtime.execute(Plan(goal="g", steps=[Step("a", skill="think")]), call_budget=0)
    assert stopped.stopped_for_budget
    handle = runtime.resume_start(stopped.run_id, call_budget=1)
    assert handle.run_id == stopped.run_id
    result = handle.result(timeout=WAIT)
    assert isinstance(result, journaled.ExecuteResult)
    assert result.ok


def test_on_progress_receives_the_run_id_when_it_asks_for_it(
    runtime: journaled.Runtime,
) -> None:
    """A2/E12: an on_progress taking a run_id keyword gets the id; a four-argument one works."""
    runtime.register_tool("echo", lambda x: x)
    seen: list[str] = []
    plain: list[str] = []

    def progress(
        at: str, delta: list[journaled.Observation], calls: int, waiting: list[str], run_id: str
    ) -> None:
        seen.append(run_id)

    plan = Plan(goal="g", steps=[Step("a", tool="echo", input=1)])
    result = runtime.execute(plan, on_progress=progress)
    runtime.execute(plan, on_progress=lambda at, delta, calls, waiting: plain.append(at))
    assert seen
    assert set(seen) == {result.run_id}
    assert plain


def test_on_progress_taking_the_run_id_first_gets_it_first(runtime: journaled.Runtime) -> None:
    """A2/E12: ``def p(run_id, at, delta, calls, waiting)`` gets the run id first and E12's four
    after it; a keyword-only ``run_id`` gets it by keyword; each call succeeds (it used to be
    called with run_id twice, a TypeError logged and swallowed at every quiescent point)."""
    runtime.register_tool("echo", lambda x: x)
    first: list[tuple[str, str, int]] = []
    keyword: list[str] = []

    def run_id_first(
        run_id: str, at: str, delta: list[journaled.Observation], calls: int, waiting: list[str]
    ) -> None:
        first.append((run_id, at, calls))

    def keyword_only(*note: object, run_id: str) -> None:
        assert len(note) == 4
        keyword.append(run_id)

    plan = Plan(goal="g", steps=[Step("a", tool="echo", input=1)])
    one = runtime.execute(plan, on_progress=run_id_first)
    two = runtime.execute(plan, on_progress=keyword_only)
    assert first
    assert {run_id for run_id, _, _ in first} == {one.run_id}
    assert all(isinstance(at, str) and isinstance(calls, int) for _, at, calls in first)
    assert keyword
    assert set(keyword) == {two.run_id}
