"""Orchestrations under attack: odd resumes, garbage planners, cancels, races, lying audits.

Each test is one defect found by driving the orchestration state machine (R5, ADR 0022) the way
a careless caller, a broken planner or a second process would; its docstring cites the SPEC item.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

import journaled
import journaled.aio
from journaled import Clarify, Gap, Gaps, Observation, Plan, RunNotResumable, Step, timeline
from journaled.testing import ManualClock

GOAL = "ship the release notes"


def _plan(*steps: Step) -> Plan:
    return Plan(goal=GOAL, steps=list(steps))


def _always(answer: object) -> Any:
    def planner(
        goal: str, observations: list[Observation], clarifications: list[tuple[str, str]]
    ) -> object:
        return answer

    return planner


def _kinds(rt: journaled.Runtime, run_id: str) -> list[str]:
    return [e.kind for e in rt.runs.history(run_id)]


THREE_THINKS = _plan(
    Step("a", skill="think"),
    Step("b", skill="think", depends_on=["a"]),
    Step("c", skill="think", depends_on=["b"]),
)


@pytest.fixture
def rt(journal_url: str, clock: ManualClock) -> Iterator[journaled.Runtime]:
    """Yield a runtime with a tool, a failing tool and a one-call skill, on each backend."""
    with journaled.open(journal_url, clock=clock) as runtime:
        _register(runtime)
        yield runtime


def _register(runtime: journaled.Runtime) -> None:
    def boom(x: Any) -> Any:
        raise RuntimeError(f"no route to {x}")

    runtime.register_tool("fetch", lambda x: x)
    runtime.register_tool("boom", boom)
    runtime.register_skill("think", lambda x: f"thought about {x}")


# -- resume with odd arguments ---------------------------------------------------------------------


def test_a_budget_below_the_calls_already_used_is_refused(rt: journaled.Runtime) -> None:
    """O3/bad input: a resume budget below the calls already used is refused, appends nothing."""
    out = rt.orchestrate(GOAL, _always(THREE_THINKS), call_budget=1, partial=True)
    assert out.status == "waiting_for_budget"
    before = _kinds(rt, out.run_id)
    with pytest.raises(ValueError, match="call_budget"):
        rt.resume(out.run_id, call_budget=0)
    assert _kinds(rt, out.run_id) == before


def test_a_planner_that_is_not_callable_is_refused_on_resume(rt: journaled.Runtime) -> None:
    """O4/bad input: resume(planner=<not callable>) is refused before anything is appended."""
    out = rt.orchestrate(GOAL, _always(Clarify("which repository?")))
    assert out.status == "waiting_for_clarification"
    before = _kinds(rt, out.run_id)
    with pytest.raises(ValueError, match="planner"):
        rt.resume(out.run_id, clarification="acme/notes", planner="not a planner")  # type: ignore[arg-type]
    assert _kinds(rt, out.run_id) == before
    assert rt.resume(out.run_id, clarification="acme/notes", planner=_always(THREE_THINKS))


# -- planners that answer garbage ------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [Gaps(None), Gaps(5)],  # type: ignore[arg-type]
    ids=["gaps-none", "gaps-int"],
)
def test_a_malformed_planner_answer_is_a_failed_outcome(
    rt: journaled.Runtime, answer: object
) -> None:
    """O1: whatever the planner returns, orchestrate answers with an ended outcome, never raises."""
    out = rt.orchestrate(GOAL, _always(answer))
    assert out.status == "failed"
    assert "planning failed" in out.summary
    assert _kinds(rt, out.run_id)[-1] == "orchestration.ended"


def test_a_planner_error_that_cannot_be_printed_is_a_failed_outcome(
    rt: journaled.Runtime,
) -> None:
    """O1: a planner raising an exception whose str() raises still ends the orchestration."""

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise ValueError("no text")

    def planner(*_: object) -> object:
        raise Unprintable()

    out = rt.orchestrate(GOAL, planner)
    assert out.status == "failed"
    assert "Unprintable" in out.summary
    assert _kinds(rt, out.run_id)[-1] == "orchestration.ended"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("field", ["kind", "name", "reason"])
def test_a_gap_holding_a_lone_surrogate_is_a_failed_outcome(
    rt: journaled.Runtime, field: str
) -> None:
    """O1, ADR 0010, ADR 0023: a gap's text is checked as a clarifying question is; a lone
    surrogate in it used to raise an empty UnicodeEncodeError out of orchestrate, leaving the
    orchestration running with only its start journaled."""
    fields = {"kind": "tool", "name": "search", "reason": "not registered"}
    fields[field] = "bad \ud800 text"
    out = rt.orchestrate(GOAL, _always(Gaps([Gap(**fields)])))
    assert out.status == "failed"
    assert f"gap #0 {field} holds a lone surrogate" in out.summary
    assert _kinds(rt, out.run_id)[-1] == "orchestration.ended"
    assert [s.status for s in rt.runs.list() if s == out.run_id] == ["failed"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("gaps", "says"),
    [
        ([Gap(kind="tool", name="x" * (4 << 20))], "gap #0 name is 4194304 bytes"),
        ([Gap(kind="tool", name="x" * (600 << 10)) for _ in range(2)], "gaps are 1228808 bytes"),
    ],
    ids=["one-field", "in-total"],
)
def test_gaps_over_the_text_bound_fail_the_planning_unjournaled(
    rt: journaled.Runtime, gaps: list[Gap], says: str
) -> None:
    """O1, ADR 0023: each gap field, and all of them together, are bounded at 1 MiB as a
    clarifying question is; a 4 MiB gap name used to be journaled three times (~12 MiB)."""
    out = rt.orchestrate(GOAL, _always(Gaps(gaps)))
    assert out.status == "failed"
    assert says in out.summary
    assert "over the 1048576-byte bound" in out.summary
    stored = sum(len(msgspec.msgpack.encode(e.data)) for e in rt.runs.history(out.run_id))
    assert stored < 64 << 10


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "plan",
    [
        Plan(goal=GOAL, steps=[Step("a", tool="fetch")], id=None),  # type: ignore[arg-type]
        _plan(Step("a", tool="fetch", status=None)),  # type: ignore[arg-type]
        _plan(Step("a", tool="fetch", status="done")),  # type: ignore[arg-type]
    ],
    ids=["id-none", "status-none", "status-done"],
)
def test_a_plan_execute_runs_is_run_by_an_orchestration(rt: journaled.Runtime, plan: Plan) -> None:
    """O1, E1, ADR 0010: a planner's plan is normalised as execute normalises it (no id: one
    is assigned; a preset status is ignored). These used to crash the orchestrator with a raw
    ValidationError out of orchestrate, leaving the orchestration unended."""
    assert rt.execute(plan).ok
    out = rt.orchestrate(GOAL, _always(plan))
    assert out.status == "completed", out.summary
    assert out.plan is not None
    assert out.plan.id
    assert [s.status for s in out.plan.steps] == ["succeeded"]


@pytest.mark.timeout(60)
def test_an_answer_that_cannot_be_checked_is_a_failed_outcome(rt: journaled.Runtime) -> None:
    """O1, ADR 0010: an error while checking a planner's answer fails the planning naming it;
    it used to crash the orchestrator and leave the orchestration unended."""

    class Unnamed:
        def __str__(self) -> str:
            raise ValueError("no name")

    out = rt.orchestrate(GOAL, _always(Gaps([Unnamed()])))  # type: ignore[list-item]
    assert out.status == "failed"
    assert "could not be checked: ValueError: no name" in out.summary
    assert _kinds(rt, out.run_id)[-1] == "orchestration.ended"


async def _async_planner(
    goal: str, observations: list[Observation], clarifications: list[tuple[str, str]]
) -> Plan:
    await asyncio.sleep(0)
    return _plan(Step("a", tool="fetch", input=goal))


@pytest.mark.timeout(60)
def test_an_async_planner_runs_on_the_runtime_s_loop(rt: journaled.Runtime) -> None:
    """O1, A1, ADR 0029 (update 2026-12-07): an ``async def`` planner is awaited on the loop
    async steps run on; it used to fail every orchestration ('the planner returned
    coroutine') with a 'never awaited' warning."""
    out = rt.orchestrate(GOAL, _async_planner)
    assert out.status == "completed", out.summary
    assert [o.output for o in out.observations] == [GOAL]


@pytest.mark.timeout(60)
def test_an_async_planner_runs_on_the_application_s_loop(sqlite_url: str) -> None:
    """O1, A1, ADR 0025, ADR 0029 (update 2026-12-07): on journaled.aio an ``async def``
    planner runs on the application's loop, as its async steps do, and its error is a
    failed outcome as a plain planner's is."""

    async def failing(*_: object) -> Plan:
        raise RuntimeError("no model")

    async def main() -> None:
        async with journaled.aio.open(sqlite_url) as art:
            art.register_tool("fetch", lambda x: x)
            out = await asyncio.wait_for(art.orchestrate(GOAL, _async_planner), 30)
            assert out.status == "completed", out.summary
            out = await asyncio.wait_for(art.orchestrate(GOAL, failing), 30)
            assert out.status == "failed"
            assert "RuntimeError: no model" in out.summary

    asyncio.run(main())


# -- cancel ---------------------------------------------------------------------------------------


def test_a_cancelled_pass_is_not_replanned(rt: journaled.Runtime) -> None:
    """E5/O2: cancelling an orchestration's pass stops the orchestration; it does not replan."""
    orchestration: list[str] = []

    def cancel_me(x: Any) -> Any:
        [run_id] = [r for r in rt.runs.ids() if rt._orchestrations.is_orchestration(r)]
        orchestration.append(run_id)
        rt.cancel(rt._orchestrations.state(run_id).pass_runs[1])
        return x

    rt.register_tool("cancel_me", cancel_me)
    calls: list[int] = []

    def planner(*_: object) -> Plan:
        calls.append(1)
        return _plan(Step("a", tool="cancel_me"), Step("b", tool="fetch", depends_on=["a"]))

    out = rt.orchestrate(GOAL, planner, mode="orchestrate")
    assert out.status == "failed"
    assert "cancelled" in out.summary
    assert len(calls) == 1
    assert "orchestration.replan-decided" not in _kinds(rt, out.run_id)


def test_a_cancel_while_the_planner_thinks_stops_the_orchestration(rt: journaled.Runtime) -> None:
    """E5: rt.cancel(orchestration) while its planner runs is accepted and no pass runs after."""
    accepted: list[bool] = []

    def planner(*_: object) -> Plan:
        [run_id] = [r for r in rt.runs.ids() if rt._orchestrations.is_orchestration(r)]
        accepted.append(rt.cancel(run_id))
        return _plan(Step("a", tool="fetch"))

    out = rt.orchestrate(GOAL, planner)
    assert accepted == [True]
    assert out.status == "failed"
    assert "cancelled" in out.summary
    assert "orchestration.pass-started" not in _kinds(rt, out.run_id)


# -- audit ----------------------------------------------------------------------------------------


def test_why_does_not_say_waiting_once_a_resume_took_the_orchestration_up(
    rt: journaled.Runtime,
) -> None:
    """O6/R5: during a pass after resume(approve=True), why says running, not waiting."""
    seen: list[str] = []

    def look(x: Any) -> Any:
        [run_id] = [r for r in rt.runs.ids() if rt._orchestrations.is_orchestration(r)]
        seen.append(rt.runs.why(run_id))
        return x

    rt.register_tool("look", look)
    out = rt.orchestrate(GOAL, _always(_plan(Step("a", tool="look"))), require_approval=True)
    assert out.status == "waiting_for_approval"
    done = rt.resume(out.run_id, approve=True)
    assert isinstance(done, journaled.Outcome)
    assert done.status == "completed"
    [why] = seen
    head = why.splitlines()[0]
    assert "waiting" not in head, head
    assert "now: waiting for approval" not in why


# -- two resumes at once ---------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_url(request: pytest.FixtureRequest) -> str:
    """A journal two runtimes open at once: a SQLite file, or PostgreSQL."""
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    url: str = request.getfixturevalue(name)
    return url


def test_a_second_resume_of_a_running_orchestration_is_refused_and_the_first_finishes(
    shared_url: str,
) -> None:
    """R8/R5: a resume while another runtime runs the pass is refused; the first completes."""
    entered = threading.Event()
    release = threading.Event()

    def gate(x: Any) -> Any:
        entered.set()
        release.wait(30)
        return x

    with journaled.open(shared_url) as first, journaled.open(shared_url) as second:
        for runtime in (first, second):
            _register(runtime)
            runtime.register_tool("gate", gate)
        planner = _always(_plan(Step("a", tool="gate"), Step("b", tool="fetch", depends_on=["a"])))
        out = first.orchestrate(GOAL, planner, require_approval=True)
        assert out.status == "waiting_for_approval"
        results: dict[str, Any] = {}

        def approve() -> None:
            try:
                results["first"] = first.resume(out.run_id, approve=True)
            except Exception as exc:  # the assertion below names it
                results["first"] = exc

        worker = threading.Thread(target=approve)
        worker.start()
        try:
            assert entered.wait(30)
            before = _kinds(second, out.run_id)
            with pytest.raises(RunNotResumable):
                second.resume(out.run_id, planner=planner)
            assert _kinds(second, out.run_id) == before
        finally:
            release.set()
            worker.join(30)
        done = results["first"]
        assert isinstance(done, journaled.Outcome), repr(done)
        assert done.status == "completed"


def test_at_and_the_timeline_show_the_new_pass_once_a_replan_proposed_it(
    rt: journaled.Runtime,
) -> None:
    """O7/R5: after a replan, runs.at and the timeline never show the failed pass as current."""
    answers = iter([_plan(Step("a", tool="boom")), _plan(Step("b", tool="fetch"))])
    out = rt.orchestrate(GOAL, lambda *_: next(answers), mode="orchestrate", require_approval=True)
    again = rt.resume(out.run_id, approve=True)
    assert isinstance(again, journaled.Outcome)
    assert again.status == "waiting_for_approval"
    proposed = [
        e.position for e in rt.runs.history(out.run_id) if e.kind == "orchestration.plan-proposed"
    ][-1]
    assert rt._orchestrations.state(out.run_id, proposed).pass_no == 2
    then = rt.runs.at(out.run_id, proposed)  # pass 2's plan, not yet run (O7, ADR 0010)
    assert [(s.id, s.status) for s in then.plan.steps] == [("b", "pending")]
    assert (then.observations, then.calls_used) == ([], 0)
    page = timeline.build(rt, out.run_id)
    [frame] = [f for f in page.frames if f.position == proposed]
    assert frame.plan is not None
    assert [box.id for wave in page.plans[frame.plan].waves for box in wave] == ["b"]
    assert frame.state is None


# -- a resume without the planner ----------------------------------------------------------------


def test_a_resume_that_may_have_to_replan_needs_the_planner(sqlite_url: str) -> None:
    """O2: a resume that may have to replan but has no planner is refused, appending nothing."""
    answers = iter([_plan(Step("a", tool="boom")), _plan(Step("b", tool="fetch"))])

    def planner(*_: object) -> Plan:
        return next(answers)

    with journaled.open(sqlite_url) as first:
        _register(first)
        out = first.orchestrate(GOAL, planner, mode="orchestrate", require_approval=True)
        assert out.status == "waiting_for_approval"
    with journaled.open(sqlite_url) as fresh:
        _register(fresh)
        before = _kinds(fresh, out.run_id)
        with pytest.raises(RunNotResumable, match="planner"):
            fresh.resume(out.run_id, approve=True)
        assert _kinds(fresh, out.run_id) == before
        replanned = fresh.resume(out.run_id, approve=True, planner=planner)
        assert isinstance(replanned, journaled.Outcome)
        assert replanned.status == "waiting_for_approval"  # pass 2's plan, after the replan
        done = fresh.resume(out.run_id, approve=True)
        assert isinstance(done, journaled.Outcome)
        assert (done.status, "in 2 pass(es)" in done.summary) == ("completed", True)


def test_a_resume_racing_one_that_just_took_the_orchestration_up_is_refused(
    shared_url: str,
) -> None:
    """R8/R5: a resume racing one that just took the orchestration up is refused; one proceeds."""
    planner = _always(_plan(Step("a", tool="fetch")))
    with journaled.open(shared_url) as first, journaled.open(shared_url) as second:
        _register(first)
        _register(second)
        out = first.orchestrate(GOAL, planner, require_approval=True)
        refused: list[BaseException] = []

        def race(position: int, state: Any) -> None:
            if state.resumptions == 1 and state.phase == "settling" and not refused:
                before = _kinds(second, out.run_id)
                try:
                    second.resume(out.run_id, planner=planner)
                except RunNotResumable as exc:
                    refused.append(exc)
                else:
                    refused.append(AssertionError("the second resume was not refused"))
                assert _kinds(second, out.run_id) == before

        done = first._orchestrations.resume(out.run_id, approve=True, trace=race)
        assert [type(e) for e in refused] == [journaled.RunOwnedElsewhere]
        assert done.status == "completed"
