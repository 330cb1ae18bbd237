"""Runs that pause and resume, at their edges (E5, E7, E8, E10, E14, O3, O4, O6, R6, T2): a
cancel that meets a question, calls past what a journal holds, a resumed wave's audit line,
approvals that are not bools, budgets below what was spent, blank answers, and an
orchestration's listed budget after a resume. Each test failed before its fix."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import journaled
from journaled import AgentResult, NeedsInput, Observation, Plan, Step
from journaled.events.inputs import INT64_MAX

WAIT = 20.0


def ask(step: Step, ctx: journaled.AgentContext) -> AgentResult:
    """Wait for an answer (E10), then use it."""
    if ctx.answer is None:
        raise NeedsInput(f"which colour for {step.id}?")
    return AgentResult(output=f"{step.id}={ctx.answer}", calls_used=0)


@pytest.fixture
def rt(sqlite_url: str) -> Iterator[journaled.Runtime]:
    """A runtime with an asking agent, a tool and a one-call skill on a fresh SQLite file."""
    with journaled.open(sqlite_url) as runtime:
        runtime.register_agent("ask", ask)
        runtime.register_tool("echo", lambda x: x)
        runtime.register_skill("think", lambda x: f"thought about {x}")
        yield runtime


def test_a_step_that_asks_after_a_cancel_leaves_the_run_cancelled(rt: journaled.Runtime) -> None:
    """E5/E10: a run cancelled while its agent step is in flight, whose step then asks, ends
    ``cancelled``, the step skipped; an answer for it is refused, nothing appended. It ended
    ``waiting``: the answer was taken and journaled, then the step was skipped without
    running."""
    gate, inside = threading.Event(), threading.Event()

    def slow_asker(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        if ctx.answer is None:
            inside.set()
            gate.wait(WAIT)
            raise NeedsInput("which colour?")
        return AgentResult(output=ctx.answer, calls_used=0)

    rt.register_agent("slow_asker", slow_asker)
    handle = rt.start(
        Plan(
            goal="g",
            steps=[Step("a", agent="slow_asker"), Step("t", tool="echo", depends_on=["a"])],
        )
    )
    assert inside.wait(WAIT)
    assert rt.cancel(handle.run_id)
    gate.set()
    handle.result(WAIT)
    state = rt.runs.state(handle.run_id)
    assert state.cancel_requested
    assert state.run_status == "cancelled", state.run_status
    assert rt.runs.summary(handle.run_id).status == "cancelled"
    position = rt.journal.position()
    with pytest.raises(journaled.RunNotResumable, match="cancelled"):
        rt.resume(handle.run_id, answers={"a": "red"})
    assert rt.journal.position() == position


def test_calls_reported_past_what_a_journal_holds_never_crash_the_run(
    rt: journaled.Runtime,
) -> None:
    """E8/R6/E13: a report that would take the run's calls past what a journal holds fails
    its step (agent-failed, naming calls_used), charged its reservation, and the run ends with
    a status. Each report fitted, their sum did not: ``execute`` raised OverflowError, the run
    was left running, and every resume crashed the same way."""

    def big(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        if step.id == "c" and ctx.answer is None:
            return AgentResult(ok=False, code="agent-waiting", error="more?", calls_used=INT64_MAX)
        return AgentResult(output=step.id, calls_used=INT64_MAX)

    rt.register_agent("big", big)
    plan = Plan(
        goal="g",
        steps=[
            Step("a", agent="big"),
            Step("b", agent="big", depends_on=["a"]),
            Step("c", agent="big", depends_on=["b"]),
        ],
    )
    try:
        result = rt.execute(plan)
    except OverflowError as exc:
        run_id = rt.runs.ids()[-1]
        pytest.fail(
            f"execute raised {exc!r}; run {run_id} is left "
            f"{rt.runs.summary(run_id).status} with {rt.runs.state(run_id).in_flight()} in flight"
        )
    state = rt.runs.state(result.run_id)
    assert state.is_finished
    assert state.calls_used <= INT64_MAX
    assert rt.runs.summary(result.run_id).status != "running"


def test_why_names_every_step_a_resumed_wave_starts(rt: journaled.Runtime) -> None:
    """O6/E10: ``why`` names every step a resumed wave starts (``wave 1: runnable a, b``).
    Only starts of attempt 1 extended the line, and a resume re-runs steps at attempt 2 or
    more, so it read ``runnable a``."""
    first = rt.execute(Plan(goal="g", steps=[Step("a", agent="ask"), Step("b", agent="ask")]))
    assert sorted(first.waiting) == ["a", "b"]
    done = rt.resume(first.run_id, answers={"a": "red", "b": "blue"})
    assert isinstance(done, journaled.ExecuteResult)
    assert done.ok
    lines = rt.runs.why(first.run_id).splitlines()
    resumed = next(i for i, line in enumerate(lines) if "resumed (resumption 1)" in line)
    told = [line for line in lines[resumed:] if "wave 1: runnable" in line]
    assert len(told) == 1, lines
    assert told[0].endswith("wave 1: runnable a, b"), "\n".join(lines)


@pytest.mark.parametrize("approve", ["no", "false", 0.5, [0]])
def test_approve_must_be_a_bool(rt: journaled.Runtime, sqlite_url: str, approve: object) -> None:
    """O4: ``resume(run_id, approve=...)`` refuses anything but a bool, naming ``approve``,
    nothing appended. ``approve="no"`` used to approve the plan and run it."""

    def planner(
        goal: str, observations: list[Observation], clarifications: list[tuple[str, str]]
    ) -> Plan:
        return Plan(goal=goal, steps=[Step("t", tool="echo", input="painted")])

    first = rt.orchestrate("paint", planner, require_approval=True)
    assert first.status == "waiting_for_approval"
    position = rt.journal.position()
    with pytest.raises((journaled.RunNotResumable, ValueError, TypeError), match="approve"):
        rt.resume(first.run_id, approve=approve)  # type: ignore[arg-type]
    assert rt.journal.position() == position
    assert rt.runs.summary(first.run_id).status == "waiting_for_approval"


def test_a_resume_budget_below_the_calls_used_is_refused_for_runs_too(
    rt: journaled.Runtime,
) -> None:
    """E14/O3: a run's resume refuses a ``call_budget`` below the calls already used, as an
    orchestration's does. It journaled ``run.budget-raised`` from 2 to 1, stopped for budget
    at once, and ``why`` read "2 of 1 used"."""
    plan = Plan(
        goal="g",
        steps=[
            Step("k1", skill="think"),
            Step("k2", skill="think"),
            Step("k3", skill="think", depends_on=["k1"]),
        ],
    )
    first = rt.execute(plan, call_budget=2)
    assert first.stopped_for_budget
    assert first.calls_used == 2
    position = rt.journal.position()
    with pytest.raises(ValueError, match="call_budget"):
        rt.resume(first.run_id, call_budget=1)
    assert rt.journal.position() == position


@pytest.mark.parametrize("answer", ["", "   ", "\n"])
def test_an_empty_answer_is_refused_as_an_empty_clarification_is(
    rt: journaled.Runtime, answer: str
) -> None:
    """E10/O4: a blank answer is refused naming its step, as a blank clarification is, nothing
    appended. It was journaled, and the agent got ``ctx.answer == ""``."""
    first = rt.execute(Plan(goal="g", steps=[Step("a", agent="ask")]))
    assert first.waiting == ["a"]
    position = rt.journal.position()
    with pytest.raises(journaled.RunNotResumable, match="the answer for step 'a' is empty"):
        rt.resume(first.run_id, answers={"a": answer})
    assert rt.journal.position() == position
    assert rt.runs.state(first.run_id).waiting == ["a"]


def test_an_orchestration_summary_shows_the_budget_a_resume_gave_it() -> None:
    """T2/O3/ADR 0037: an orchestration resumed with a bigger budget lists that budget. It
    listed the one it started with ("calls 2/1"), while its pass showed 2/5."""

    def planner(goal: str, observations: object, clarifications: object) -> Plan:
        return Plan(
            goal=goal,
            steps=[Step("a", skill="think"), Step("b", skill="think", depends_on=["a"])],
        )

    with journaled.open("memory://") as rt:
        rt.register_skill("think", lambda _: "thought")
        out = rt.orchestrate("g", planner, call_budget=1)
        assert out.status == "waiting_for_budget"
        resumed = rt.resume(out.run_id, call_budget=5)
        assert isinstance(resumed, journaled.Outcome)
        assert resumed.status == "completed"
        row = {s.run_id: s for s in rt.runs.list()}[out.run_id]
    assert (row.status, row.calls_used) == ("completed", 2)
    assert row.call_budget == 5
