"""Orchestration, SPEC O1-O6: outcomes, modes, budget policy, approval, clarification, audit.

A planner here is a :class:`Scripted` callable that records what it was given and answers from a
script. Tools and skills record every call in ``ran`` so a test can prove nothing ran.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import journaled
from journaled import (
    AgentResult,
    Budget,
    Clarify,
    Gap,
    Gaps,
    NeedsInput,
    Observation,
    Outcome,
    Plan,
    Step,
)
from journaled.events.orchestration import (
    BudgetAwaited,
    OrchestrationEnded,
    OrchestrationResumed,
    PassStarted,
    PlanningFailed,
)
from journaled.events.runs import RunStarted
from journaled.testing import ManualClock

GOAL = "ship the release notes"

PlannerCall = tuple[str, list[Observation], list[tuple[str, str]]]


class Scripted:
    """A planner answering from a script (the last answer repeats) and recording every call."""

    def __init__(self, *answers: object) -> None:
        assert answers
        self.answers = list(answers)
        self.calls: list[PlannerCall] = []

    def __call__(
        self, goal: str, observations: list[Observation], clarifications: list[tuple[str, str]]
    ) -> object:
        self.calls.append((goal, list(observations), list(clarifications)))
        answer = self.answers[min(len(self.calls), len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer


def plan(*steps: Step) -> Plan:
    """Return a plan toward GOAL."""
    return Plan(goal=GOAL, steps=list(steps))


@pytest.fixture
def ran() -> list[str]:
    """Return the record of every tool, skill and agent call."""
    return []


@pytest.fixture
def runtime(journal_url: str, clock: ManualClock, ran: list[str]) -> Iterator[journaled.Runtime]:
    """Yield a runtime with recording tools, skills and agents, on each backend."""

    def fetch(x: Any) -> Any:
        ran.append(f"fetch {x}")
        return x

    def boom(x: Any) -> Any:
        ran.append(f"boom {x}")
        raise RuntimeError(f"no route to {x}")

    def think(x: Any) -> str:
        ran.append(f"think {x}")
        return f"thought about {x}"

    def flop(x: Any) -> str:
        ran.append(f"flop {x}")
        raise ValueError("model refused")

    def asker(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        ran.append(f"asker {step.id} {ctx.answer}")
        if ctx.answer is None:
            raise NeedsInput(f"which branch for {step.id}?")
        return AgentResult(output=f"{step.id} on {ctx.answer}", calls_used=0)

    def helper(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        ran.append(f"helper {step.id} {ctx.reservation}")
        return AgentResult(output=ctx.reservation)

    with journaled.open(journal_url, clock=clock) as rt:
        rt.register_tool("fetch", fetch)
        rt.register_tool("boom", boom)
        rt.register_skill("think", think)
        rt.register_skill("flop", flop)
        rt.register_agent("asker", asker)
        rt.register_agent("helper", helper)
        yield rt


def resumed(rt: journaled.Runtime, run_id: str, **options: Any) -> Outcome:
    """Resume an orchestration, which gives back an Outcome."""
    out = rt.resume(run_id, **options)
    assert isinstance(out, Outcome)
    return out


def kinds(rt: journaled.Runtime, run_id: str) -> list[str]:
    """Return the event kinds of one stream, in order."""
    return [e.kind for e in rt.runs.history(run_id)]


def resumes(rt: journaled.Runtime, run_id: str) -> list[OrchestrationResumed]:
    """Return what each resume of an orchestration journaled, in order (R5)."""
    return [e.data for e in rt.runs.history(run_id) if isinstance(e.data, OrchestrationResumed)]


def run_kinds(rt: journaled.Runtime) -> list[str]:
    """Return the kinds of every ``run.*`` event in the journal."""
    return [e.kind for e in rt.journal.read() if e.kind.startswith("run.")]


def pass_runs(rt: journaled.Runtime, run_id: str) -> list[str]:
    """Return the child run of each pass of an orchestration, in order."""
    return [e.data.run for e in rt.runs.history(run_id) if isinstance(e.data, PassStarted)]


def statuses(out: Outcome) -> dict[str, str]:
    """Map step id to status in the outcome's plan."""
    assert out.plan is not None
    return {s.id: s.status for s in out.plan.steps}


def one_line(text: str) -> bool:
    """Tell whether a summary is one non-empty line."""
    return bool(text.strip()) and "\n" not in text


# -- O1 outcome: every status ----------------------------------------------------------------------


def _completed(rt: journaled.Runtime) -> Outcome:
    return rt.orchestrate(GOAL, Scripted(plan(Step("a", tool="fetch", input="x"))))


def _failed(rt: journaled.Runtime) -> Outcome:
    return rt.orchestrate(GOAL, Scripted(plan(Step("a", tool="boom", input="db"))))


def _clarification(rt: journaled.Runtime) -> Outcome:
    return rt.orchestrate(GOAL, Scripted(Clarify("which repository?")))


def _approval(rt: journaled.Runtime) -> Outcome:
    return rt.orchestrate(GOAL, Scripted(plan(Step("a", tool="fetch"))), require_approval=True)


def _budget(rt: journaled.Runtime) -> Outcome:
    return rt.orchestrate(GOAL, Scripted(plan(Step("a", skill="think"))), call_budget=0)


def _dry_run(rt: journaled.Runtime) -> Outcome:
    return rt.orchestrate(GOAL, Scripted(plan(Step("a", tool="fetch"))), mode="plan")


SCENARIOS: dict[str, Callable[[journaled.Runtime], Outcome]] = {
    "completed": _completed,
    "failed": _failed,
    "waiting_for_clarification": _clarification,
    "waiting_for_approval": _approval,
    "waiting_for_budget": _budget,
    "dry_run": _dry_run,
}


@pytest.mark.parametrize("status", list(SCENARIOS))
def test_every_status_is_reached_with_a_one_line_summary(
    runtime: journaled.Runtime, status: str
) -> None:
    """O1: each of the six statuses is reached; one-line summary; budget only when awaited."""
    out = SCENARIOS[status](runtime)
    assert out.status == status
    assert one_line(out.summary), out.summary
    assert (out.budget is not None) == (status == "waiting_for_budget")
    assert out.gaps is None
    assert out.run_id in runtime.runs.ids()
    ended = [
        e.data for e in runtime.runs.history(out.run_id) if isinstance(e.data, OrchestrationEnded)
    ]
    assert [(e.status, e.summary) for e in ended] == [(status, out.summary)]


def test_completed_outcome_fields(runtime: journaled.Runtime, ran: list[str]) -> None:
    """O1: completed carries the plan with statuses, the observations and a summary."""
    planner = Scripted(
        plan(Step("a", tool="fetch", input="notes"), Step("b", skill="think", depends_on=["a"]))
    )
    out = runtime.orchestrate(GOAL, planner)
    assert out.status == "completed"
    assert out.plan is not None
    assert out.plan.goal == GOAL
    assert statuses(out) == {"a": "succeeded", "b": "succeeded"}
    assert [(o.step_id, o.ok, o.output) for o in out.observations] == [
        ("a", True, "notes"),
        ("b", True, "thought about None"),
    ]
    assert out.summary == "completed 2 step(s) in 1 pass(es) using 1 model call(s)"
    assert out.budget is None
    assert out.gaps is None
    assert ran == ["fetch notes", "think None"]
    [child] = pass_runs(runtime, out.run_id)
    assert out.pass_run == child


def test_failed_outcome_names_the_step_and_error(runtime: journaled.Runtime) -> None:
    """O1: a failed pass is `failed` with the plan statuses, observations and the error."""
    planner = Scripted(
        plan(Step("a", tool="boom", input="db"), Step("b", tool="fetch", depends_on=["a"]))
    )
    out = runtime.orchestrate(GOAL, planner)
    assert out.status == "failed"
    assert statuses(out) == {"a": "failed", "b": "skipped"}
    by_step = {o.step_id: o for o in out.observations}
    assert by_step["a"].error == "no route to db"
    assert by_step["b"].error == "skipped: a dependency failed"
    assert "'a'" in out.summary
    assert "no route to db" in out.summary
    assert out.budget is None


def test_waiting_for_budget_outcome_fields(runtime: journaled.Runtime, ran: list[str]) -> None:
    """O1/O3: waiting_for_budget carries the plan and Budget(est, max, completed, total)."""
    planner = Scripted(plan(Step("a", skill="think"), Step("b", skill="think")))
    out = runtime.orchestrate(GOAL, planner, call_budget=1)
    assert out.status == "waiting_for_budget"
    assert out.budget == Budget(est_calls=2, max_calls=1, completed_steps=0, total_steps=2)
    assert statuses(out) == {"a": "pending", "b": "pending"}
    assert out.observations == []
    assert "2" in out.summary
    assert "1" in out.summary
    assert ran == []


def test_gaps_are_a_structured_planning_failure(journal_url: str, clock: ManualClock) -> None:
    """O1: a Gaps answer fails planning; the outcome and the event carry the gaps as data."""
    gaps = [
        Gap(kind="tool", name="browser", reason="the goal needs the web"),
        Gap(kind="skill", name="translate"),
    ]
    with journaled.open(journal_url, clock=clock) as rt:
        out = rt.orchestrate(GOAL, Scripted(Gaps(gaps)))
        assert out.status == "failed"
        assert out.gaps == gaps
        assert out.plan is None
        assert out.observations == []
        assert one_line(out.summary)
        assert "browser" in out.summary
        assert "translate" in out.summary
        failed = [e.data for e in rt.runs.history(out.run_id) if e.kind.endswith("planning-failed")]
        assert len(failed) == 1
        assert isinstance(failed[0], PlanningFailed)
        assert list(failed[0].gaps) == gaps
        assert run_kinds(rt) == []


def test_dry_run_outcome_fields(runtime: journaled.Runtime) -> None:
    """O1/O2: dry_run carries the proposed plan, no observations, no budget."""
    planner = Scripted(plan(Step("a", tool="fetch"), Step("b", skill="think", depends_on=["a"])))
    out = runtime.orchestrate(GOAL, planner, mode="plan", call_budget=0)
    assert out.status == "dry_run"
    assert statuses(out) == {"a": "pending", "b": "pending"}
    assert out.observations == []
    assert out.budget is None
    assert "2 step(s)" in out.summary


# -- O2 modes --------------------------------------------------------------------------------------


def test_plan_mode_runs_nothing(runtime: journaled.Runtime, ran: list[str]) -> None:
    """O2: mode="plan" journals the plan but runs nothing: no run.* event, no tool call."""
    planner = Scripted(plan(Step("a", tool="fetch"), Step("b", skill="think")))
    out = runtime.orchestrate(GOAL, planner, mode="plan")
    assert out.status == "dry_run"
    assert ran == []
    assert run_kinds(runtime) == []
    assert len(planner.calls) == 1
    assert kinds(runtime, out.run_id) == [
        "orchestration.started",
        "orchestration.plan-proposed",
        "orchestration.ended",
    ]


def test_execute_mode_is_one_pass(runtime: journaled.Runtime, ran: list[str]) -> None:
    """O2: mode="execute" runs one pass: a failing step fails it and the planner is asked once."""
    planner = Scripted(plan(Step("a", tool="boom", input="db")), plan(Step("b", tool="fetch")))
    out = runtime.orchestrate(GOAL, planner, mode="execute")
    assert out.status == "failed"
    assert len(planner.calls) == 1
    assert ran == ["boom db"]
    assert len(pass_runs(runtime, out.run_id)) == 1


def test_orchestrate_mode_replans_with_the_observations(
    runtime: journaled.Runtime, ran: list[str]
) -> None:
    """O2: after a failed pass the planner is asked again with its observations; passes logged."""
    planner = Scripted(
        plan(Step("a", tool="boom", input="db")),
        plan(Step("b", tool="fetch", input="cache")),
    )
    out = runtime.orchestrate(GOAL, planner, mode="orchestrate")
    assert out.status == "completed"
    assert ran == ["boom db", "fetch cache"]
    assert [c[0] for c in planner.calls] == [GOAL, GOAL]
    assert planner.calls[0][1] == []
    [seen] = planner.calls[1][1]
    assert (seen.step_id, seen.tool, seen.ok, seen.error) == ("a", "boom", False, "no route to db")
    assert planner.calls[1][2] == []
    assert "2 pass(es)" in out.summary
    assert statuses(out) == {"b": "succeeded"}
    children = pass_runs(runtime, out.run_id)
    assert len(children) == 2
    for number, child in enumerate(children, start=1):
        started = runtime.runs.history(child)[0].data
        assert isinstance(started, RunStarted)
        assert (started.parent_run, started.parent_step) == (out.run_id, f"pass-{number}")
    orchestration = kinds(runtime, out.run_id)
    assert orchestration.count("orchestration.pass-started") == 2
    assert orchestration.count("orchestration.pass-ended") == 2
    assert orchestration.count("orchestration.plan-proposed") == 2


def test_orchestrate_mode_is_bounded_by_max_passes(
    runtime: journaled.Runtime, ran: list[str]
) -> None:
    """O2: the replan loop stops after max_passes failed passes, each journaled, then fails."""
    planner = Scripted(plan(Step("a", tool="boom", input="db")))
    out = runtime.orchestrate(GOAL, planner, mode="orchestrate", max_passes=2)
    assert out.status == "failed"
    assert len(planner.calls) == 2
    assert ran == ["boom db", "boom db"]
    assert [len(c[1]) for c in planner.calls] == [0, 1]
    children = pass_runs(runtime, out.run_id)
    assert len(children) == 2
    assert all(runtime.runs.state(c).run_status == "failed" for c in children)
    assert "no route to db" in out.summary


@pytest.mark.timeout(60)
def test_a_failed_replan_shows_the_last_pass_that_ran(
    runtime: journaled.Runtime, ran: list[str]
) -> None:
    """O1/E13/T2: when the planner fails after a failed pass, the outcome's plan is that pass's
    run (its step statuses agree with its observations) and pass_run names it, as the listing
    has it; not the plan as proposed with every step pending."""
    planner = Scripted(
        plan(
            Step("a", tool="fetch", input="db"), Step("b", tool="boom", input="x", depends_on=["a"])
        ),
        RuntimeError("the model is down"),
    )
    out = runtime.orchestrate(GOAL, planner, mode="orchestrate")
    assert out.status == "failed"
    assert {o.step_id: o.ok for o in out.observations} == {"a": True, "b": False}
    assert statuses(out) == {"a": "succeeded", "b": "failed"}
    [child] = pass_runs(runtime, out.run_id)
    assert out.pass_run == child
    summary = runtime.runs.summary(out.run_id)
    assert (summary.current_run, summary.steps_done, summary.steps_total) == (child, 2, 2)


# -- O3 budget policy ------------------------------------------------------------------------------


def test_notify_and_wait_runs_nothing_then_resumes(
    runtime: journaled.Runtime, ran: list[str]
) -> None:
    """O3: an estimate over the budget runs nothing; resume with a bigger budget completes."""
    planner = Scripted(
        plan(
            Step("t", tool="fetch", input="t"),
            Step("a", skill="think", input="a"),
            Step("b", skill="think", input="b", depends_on=["a"]),
            Step("c", skill="think", input="c", depends_on=["t"]),
        )
    )
    out = runtime.orchestrate(GOAL, planner, call_budget=2)
    assert out.status == "waiting_for_budget"
    assert out.budget == Budget(est_calls=3, max_calls=2, completed_steps=0, total_steps=4)
    assert ran == []
    assert run_kinds(runtime) == []
    assert pass_runs(runtime, out.run_id) == []

    done = resumed(runtime, out.run_id, call_budget=3)
    assert done.status == "completed"
    assert done.budget is None
    assert sorted(ran) == ["fetch t", "think a", "think b", "think c"]
    assert len(planner.calls) == 1
    [given] = resumes(runtime, out.run_id)
    assert (given.previous_budget, given.budget) == (2, 3)
    [child] = pass_runs(runtime, out.run_id)
    assert runtime.runs.state(child).calls_used == 3


def test_notify_and_wait_costs_agent_reservations(
    runtime: journaled.Runtime, ran: list[str]
) -> None:
    """O3/E6: agent steps cost their reservation in the estimate; resume with reserve= runs them."""

    def reserve(step: Step, remaining: float) -> float:
        return 4.5

    planner = Scripted(plan(Step("s", skill="think"), Step("g", agent="helper", depends_on=["s"])))
    out = runtime.orchestrate(GOAL, planner, call_budget=4, reserve=reserve)
    assert out.status == "waiting_for_budget"
    assert out.budget == Budget(est_calls=5, max_calls=4, completed_steps=0, total_steps=2)
    assert ran == []
    done = resumed(runtime, out.run_id, call_budget=5, reserve=reserve)
    assert done.status == "completed"
    assert ran == ["think None", "helper g 4"]
    assert "using 5 model call(s)" in done.summary


def test_partial_runs_the_waves_that_fit(runtime: journaled.Runtime, ran: list[str]) -> None:
    """O3/E7: partial=True runs the fitting waves, pauses at the first that does not, resumes."""
    planner = Scripted(
        plan(
            Step("a", skill="think", input="a"),
            Step("t", tool="fetch", input="t"),
            Step("b", skill="think", input="b", depends_on=["a"]),
            Step("c", skill="think", input="c", depends_on=["b"]),
            Step("d", skill="think", input="d", depends_on=["b"]),
        )
    )
    out = runtime.orchestrate(GOAL, planner, call_budget=2, partial=True)
    assert out.status == "waiting_for_budget"
    assert statuses(out) == {
        "a": "succeeded",
        "t": "succeeded",
        "b": "succeeded",
        "c": "pending",
        "d": "pending",
    }
    assert out.budget == Budget(est_calls=2, max_calls=2, completed_steps=3, total_steps=5)
    assert sorted(ran) == ["fetch t", "think a", "think b"]
    assert sorted(o.step_id for o in out.observations) == ["a", "b", "t"]
    [child] = pass_runs(runtime, out.run_id)
    assert runtime.runs.state(child).stopped_for_budget

    ran.clear()
    done = resumed(runtime, out.run_id, call_budget=4)
    assert done.status == "completed"
    assert sorted(ran) == ["think c", "think d"]  # succeeded steps never run again
    assert pass_runs(runtime, out.run_id) == [child]  # the same pass carries on
    assert runtime.runs.state(child).calls_used == 4
    assert len(planner.calls) == 1


@pytest.mark.timeout(60)
def test_a_pass_run_resumes_only_through_its_orchestration(
    runtime: journaled.Runtime, ran: list[str]
) -> None:
    """O3/ADR 0010: a pass run is driven by its orchestration: resuming it directly is refused
    naming the orchestration, nothing appended, so no pass spends past the orchestration's
    budget behind its back; the orchestration still resumes it."""
    planner = Scripted(
        plan(
            Step("a", skill="think", input="a"),
            Step("b", skill="think", input="b", depends_on=["a"]),
        )
    )
    out = runtime.orchestrate(GOAL, planner, call_budget=1, partial=True)
    assert out.status == "waiting_for_budget"
    assert out.pass_run is not None
    end = runtime.journal.position()
    for resume in (runtime.resume, runtime.runs.resume):
        with pytest.raises(journaled.RunNotResumable, match=f"orchestration {out.run_id}"):
            resume(out.pass_run, call_budget=5)
    assert runtime.journal.position() == end
    assert runtime.runs.summary(out.run_id).status == "waiting_for_budget"
    ran.clear()
    done = resumed(runtime, out.run_id, call_budget=2)
    assert done.status == "completed"
    assert ran == ["think b"]
    assert runtime.runs.state(out.pass_run).calls_used == 2


def test_partial_pause_that_is_still_short_waits_again(runtime: journaled.Runtime) -> None:
    """O3: a resume whose budget still does not fit waits again, with the estimate updated."""
    planner = Scripted(
        plan(
            Step("a", skill="think"),
            Step("b", skill="think", depends_on=["a"]),
            Step("c", skill="think", depends_on=["b"]),
        )
    )
    out = runtime.orchestrate(GOAL, planner, call_budget=1, partial=True)
    assert out.budget == Budget(est_calls=2, max_calls=1, completed_steps=1, total_steps=3)
    again = resumed(runtime, out.run_id, call_budget=2)
    assert again.status == "waiting_for_budget"
    assert again.budget == Budget(est_calls=1, max_calls=2, completed_steps=2, total_steps=3)
    done = resumed(runtime, out.run_id, call_budget=3)
    assert done.status == "completed"


def test_budget_spans_passes_and_max_calls_is_the_orchestration_budget(
    runtime: journaled.Runtime,
) -> None:
    """O3/O1: after a replan, Budget.max_calls is the orchestration's call_budget (a total, E14)."""
    planner = Scripted(
        plan(Step("x", skill="flop")),  # fails, charged 1 call
        plan(Step("a", skill="think"), Step("b", skill="think"), Step("c", skill="think")),
    )
    out = runtime.orchestrate(GOAL, planner, mode="orchestrate", call_budget=3)
    assert out.status == "waiting_for_budget"
    assert out.budget == Budget(est_calls=3, max_calls=3, completed_steps=0, total_steps=3)
    done = resumed(runtime, out.run_id, call_budget=4)  # 1 used by pass 1 + 3 needed
    assert done.status == "completed"
    assert "using 4 model call(s)" in done.summary


# -- O4 approval and clarification -----------------------------------------------------------------


def test_require_approval_waits_then_runs_on_approve(
    runtime: journaled.Runtime, ran: list[str]
) -> None:
    """O4: require_approval journals the plan and waits; approve=True journals it and runs."""
    planner = Scripted(plan(Step("a", tool="fetch", input="x")))
    out = runtime.orchestrate(GOAL, planner, require_approval=True)
    assert out.status == "waiting_for_approval"
    assert statuses(out) == {"a": "pending"}
    assert ran == []
    assert run_kinds(runtime) == []
    assert kinds(runtime, out.run_id)[1:3] == [
        "orchestration.plan-proposed",
        "orchestration.approval-requested",
    ]

    done = resumed(runtime, out.run_id, approve=True)
    assert done.status == "completed"
    assert ran == ["fetch x"]
    assert len(planner.calls) == 1
    orchestration = kinds(runtime, out.run_id)
    assert [r.approved for r in resumes(runtime, out.run_id)] == [1]
    assert orchestration.index("orchestration.resumed") < orchestration.index(
        "orchestration.pass-started"
    )


def test_approval_then_budget_then_run(runtime: journaled.Runtime, ran: list[str]) -> None:
    """O4/O3/O5: a plan runs only once settled: approved first, then inside the budget."""
    planner = Scripted(plan(Step("a", skill="think"), Step("b", skill="think")))
    out = runtime.orchestrate(GOAL, planner, call_budget=1, require_approval=True)
    assert out.status == "waiting_for_approval"
    waiting = resumed(runtime, out.run_id, approve=True)
    assert waiting.status == "waiting_for_budget"
    assert waiting.budget == Budget(est_calls=2, max_calls=1, completed_steps=0, total_steps=2)
    assert ran == []
    done = resumed(runtime, out.run_id, call_budget=2)
    assert done.status == "completed"
    assert len(ran) == 2
    assert [r.approved for r in resumes(runtime, out.run_id)] == [1, None]


def test_clarify_waits_and_the_answer_goes_to_the_planner(
    runtime: journaled.Runtime, ran: list[str]
) -> None:
    """O4: Clarify waits with the question in summary and why; the answer is journaled and given."""
    question = "which repository holds the notes?"
    planner = Scripted(Clarify(question), plan(Step("a", tool="fetch", input="acme/notes")))
    out = runtime.orchestrate(GOAL, planner)
    assert out.status == "waiting_for_clarification"
    assert question in out.summary
    assert one_line(out.summary)
    assert out.plan is None
    assert question in runtime.runs.why(out.run_id)
    assert ran == []

    done = resumed(runtime, out.run_id, clarification="acme/notes")
    assert done.status == "completed"
    assert ran == ["fetch acme/notes"]
    assert [c[2] for c in planner.calls] == [[], [(question, "acme/notes")]]
    given = resumes(runtime, out.run_id)
    assert given == [
        OrchestrationResumed(
            at=given[0].at,
            resumption=1,
            question=question,
            answer="acme/notes",
            owner=given[0].owner,
        )
    ]
    assert given[0].owner  # the process that took it up (R8)


def test_two_questions_accumulate_clarifications(runtime: journaled.Runtime) -> None:
    """O4: each answer is kept; the planner sees every (question, answer) pair so far."""
    planner = Scripted(
        Clarify("which repo?"), Clarify("which branch?"), plan(Step("a", tool="fetch"))
    )
    out = runtime.orchestrate(GOAL, planner)
    second = resumed(runtime, out.run_id, clarification="acme")
    assert second.status == "waiting_for_clarification"
    assert "which branch?" in second.summary
    done = resumed(runtime, out.run_id, clarification="main")
    assert done.status == "completed"
    assert planner.calls[2][2] == [("which repo?", "acme"), ("which branch?", "main")]


def test_agent_needing_input_waits_for_an_answer(
    runtime: journaled.Runtime, ran: list[str]
) -> None:
    """O4/E10: an agent raising NeedsInput → waiting_for_clarification; answers= completes it."""
    planner = Scripted(
        plan(Step("w", agent="asker"), Step("after", tool="fetch", input="n", depends_on=["w"]))
    )
    out = runtime.orchestrate(GOAL, planner)
    assert out.status == "waiting_for_clarification"
    assert "which branch for w?" in out.summary
    assert "'w'" in out.summary
    assert statuses(out) == {"w": "pending", "after": "pending"}
    assert ran == ["asker w None"]

    done = resumed(runtime, out.run_id, answers={"w": "main"})
    assert done.status == "completed"
    assert ran == ["asker w None", "asker w main", "fetch n"]
    assert {o.step_id: o.output for o in done.observations if o.ok}["w"] == "w on main"
    assert len(planner.calls) == 1
    assert len(pass_runs(runtime, out.run_id)) == 1


def test_single_waiting_step_can_be_answered_by_clarification(runtime: journaled.Runtime) -> None:
    """O4: with exactly one step waiting, clarification= answers it."""
    out = runtime.orchestrate(GOAL, Scripted(plan(Step("w", agent="asker"))))
    assert out.status == "waiting_for_clarification"
    done = resumed(runtime, out.run_id, clarification="dev")
    assert done.status == "completed"
    assert done.observations[-1].output == "w on dev"


# -- O5 settled plan -------------------------------------------------------------------------------


def test_settled_plan_is_journaled_before_the_first_step(
    journal_url: str, clock: ManualClock
) -> None:
    """O5: inside the first tool call, the pass and its run.started with the plan are journaled."""
    seen: list[list[journaled.Event]] = []
    with journaled.open(journal_url, clock=clock) as rt:
        rt.register_tool("peek", lambda x: seen.append(rt.journal.read()))
        settled = plan(Step("a", tool="peek"), Step("b", tool="peek", depends_on=["a"]))
        out = rt.orchestrate(GOAL, Scripted(settled))
        assert out.status == "completed"
        assert len(seen) == 2
        first = seen[0]
        kinds_then = [e.kind for e in first]
        assert "orchestration.pass-started" in kinds_then
        assert kinds_then.index("orchestration.pass-started") < kinds_then.index("run.started")
        [started] = [e.data for e in first if isinstance(e.data, RunStarted)]
        assert started.parent_run == out.run_id
        assert [(s.id, s.tool, list(s.depends_on)) for s in started.plan.steps] == [
            ("a", "peek", []),
            ("b", "peek", ["a"]),
        ]
        assert not any(e.kind == "run.step-succeeded" for e in first)


# -- O6 audit --------------------------------------------------------------------------------------


def test_why_explains_a_partial_budget_pause(runtime: journaled.Runtime) -> None:
    """O6: why names the wave (from 1) that stopped for budget, its estimate, calls used, budget."""
    planner = Scripted(
        plan(
            Step("a", skill="think"),
            Step("b", skill="think", depends_on=["a"]),
            Step("c", skill="think", depends_on=["a"]),
        )
    )
    out = runtime.orchestrate(GOAL, planner, call_budget=1, partial=True)
    why = runtime.runs.why(out.run_id)
    assert "waiting for budget" in why
    assert re.search(r"wave 2\b.*2 model call\(s\).*1 of the budget of 1 used", why), why
    assert "wave 0" not in why


def test_why_explains_a_budget_wait_before_running(runtime: journaled.Runtime) -> None:
    """O6: why for notify-and-wait gives the estimate, the budget and that nothing ran."""
    planner = Scripted(plan(Step("a", skill="think"), Step("b", skill="think")))
    out = runtime.orchestrate(GOAL, planner, call_budget=1)
    why = runtime.runs.why(out.run_id)
    assert "waiting for budget" in why
    assert "2 more call(s) needed, 0 of 1 used" in why
    assert "0 of 2 step(s) done" in why
    budget = [e.data for e in runtime.runs.history(out.run_id) if isinstance(e.data, BudgetAwaited)]
    assert [b.budget for b in budget] == [out.budget]


def test_why_explains_a_waiting_step(runtime: journaled.Runtime) -> None:
    """O6: why names the step that waits and the question it waits on."""
    out = runtime.orchestrate(GOAL, Scripted(plan(Step("w", agent="asker"))))
    why = runtime.runs.why(out.run_id)
    assert "step 'w' waits for an answer" in why
    assert "which branch for w?" in why


def test_why_explains_a_failed_step(runtime: journaled.Runtime) -> None:
    """O6: why names the failed step and its error."""
    out = runtime.orchestrate(GOAL, Scripted(plan(Step("a", tool="boom", input="db"))))
    why = runtime.runs.why(out.run_id)
    assert "step 'a' failed" in why
    assert "no route to db" in why
    assert why.splitlines()[0].endswith("failed:")


def test_why_explains_waiting_for_approval(runtime: journaled.Runtime) -> None:
    """O6: why says the plan waits for approval."""
    out = runtime.orchestrate(GOAL, Scripted(plan(Step("a", tool="fetch"))), require_approval=True)
    why = runtime.runs.why(out.run_id)
    assert "waits for approval" in why
    assert "waiting for approval" in why.splitlines()[0]


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (RuntimeError("planner model offline"), "raised RuntimeError: planner model offline"),
        (42, "returned int"),
        ({"goal": GOAL, "steps": []}, "returned dict"),
        (None, "returned NoneType"),
        (plan(Step("a", tool="nope")), "tool 'nope' is not registered"),
        (
            plan(
                Step("a", tool="fetch", depends_on=["b"]), Step("b", tool="fetch", depends_on=["a"])
            ),
            "cycle",
        ),
        (Plan(goal=GOAL, steps=[]), "no steps"),
        (plan(Step("a", tool="fetch", input=object())), "cannot be journaled"),
    ],
)
def test_bad_planner_answers_fail_the_orchestration(
    runtime: journaled.Runtime, ran: list[str], answer: object, words: str
) -> None:
    """Bad input (O1): a raising planner, a non-plan or an invalid plan → failed, never raises."""
    out = runtime.orchestrate(GOAL, Scripted(answer))
    assert out.status == "failed"
    assert out.summary.startswith("planning failed")
    assert words in out.summary
    assert one_line(out.summary)
    failed = [
        e.data for e in runtime.runs.history(out.run_id) if isinstance(e.data, PlanningFailed)
    ]
    assert len(failed) == 1
    assert words in failed[0].reason
    assert ran == []
    assert run_kinds(runtime) == []


def test_planner_failing_on_a_replan_fails_the_orchestration(runtime: journaled.Runtime) -> None:
    """Bad input (O2): a planner raising on the second pass fails, after the first pass's work."""
    planner = Scripted(plan(Step("a", tool="boom")), ValueError("out of ideas"))
    out = runtime.orchestrate(GOAL, planner, mode="orchestrate")
    assert out.status == "failed"
    assert "out of ideas" in out.summary
    assert [o.step_id for o in out.observations] == ["a"]


def test_approve_on_a_run_not_waiting_for_approval(runtime: journaled.Runtime) -> None:
    """Bad input (O4): approve=True on a run not waiting for approval → RunNotResumable."""
    out = runtime.orchestrate(GOAL, Scripted(Clarify("which?")))
    before = runtime.journal.position()
    with pytest.raises(journaled.RunNotResumable, match="not waiting for approval"):
        runtime.resume(out.run_id, approve=True)
    assert runtime.journal.position() == before


@pytest.mark.parametrize("scenario", ["waiting_for_budget", "waiting_for_approval"])
def test_clarification_on_a_run_that_asked_none(runtime: journaled.Runtime, scenario: str) -> None:
    """Bad input (O4): a clarification for a run that asked no question → RunNotResumable."""
    out = SCENARIOS[scenario](runtime)
    before = runtime.journal.position()
    with pytest.raises(journaled.RunNotResumable, match="nothing to clarify"):
        runtime.resume(out.run_id, clarification="main")
    assert runtime.journal.position() == before


def test_answers_for_a_step_that_is_not_waiting(runtime: journaled.Runtime) -> None:
    """Bad input (O4): answers= naming a step that does not wait → RunNotResumable."""
    planner = Scripted(plan(Step("w", agent="asker"), Step("t", tool="fetch")))
    out = runtime.orchestrate(GOAL, planner)
    before = runtime.journal.position()
    with pytest.raises(journaled.RunNotResumable, match="'t' is not waiting"):
        runtime.resume(out.run_id, answers={"t": "x"})
    assert runtime.journal.position() == before


@pytest.mark.parametrize("status", ["completed", "failed", "dry_run"])
def test_finished_orchestrations_are_not_resumable(runtime: journaled.Runtime, status: str) -> None:
    """Bad input (O1): resuming a completed, failed or dry-run orchestration → RunNotResumable."""
    out = SCENARIOS[status](runtime)
    before = runtime.journal.position()
    with pytest.raises(journaled.RunNotResumable, match="already finished"):
        runtime.resume(out.run_id)
    with pytest.raises(journaled.RunNotResumable):
        runtime.resume(out.run_id, approve=True)
    assert runtime.journal.position() == before


@pytest.mark.parametrize(
    "options",
    [{}, {"approve": True}, {"clarification": "main"}, {"answers": {"a": "x"}}],
)
def test_resume_of_an_unknown_run(runtime: journaled.Runtime, options: dict[str, Any]) -> None:
    """Bad input (O4): resuming an id that is not in the journal → RunNotFound, whatever the ask."""
    with pytest.raises(journaled.RunNotFound, match="no run 'run_nope'"):
        runtime.resume("run_nope", **options)
    assert runtime.journal.position() == 0


def test_clarification_answer_without_the_planner_in_a_new_runtime(sqlite_url: str) -> None:
    """Bad input (O4): another runtime must pass planner= to answer a planner's question."""
    planner = Scripted(Clarify("which?"), plan(Step("a", tool="fetch")))
    with journaled.open(sqlite_url) as rt:
        out = rt.orchestrate(GOAL, planner)
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("fetch", lambda x: x)
        before = rt.journal.position()
        with pytest.raises(journaled.RunNotResumable, match="planner="):
            rt.resume(out.run_id, clarification="this one")
        assert rt.journal.position() == before
        done = resumed(rt, out.run_id, clarification="this one", planner=planner)
        assert done.status == "completed"
        assert planner.calls[1][2] == [("which?", "this one")]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"mode": "agent"}, "mode"),
        ({"mode": "debug"}, "mode"),
        ({"call_budget": -1}, "call_budget"),
        ({"call_budget": 1.5}, "call_budget"),
        ({"call_budget": True}, "call_budget"),
        ({"call_budget": "10"}, "call_budget"),
        ({"planner": None}, "planner"),
        ({"planner": 42}, "planner"),
        ({"goal": ""}, "goal"),
        ({"goal": None}, "goal"),
        ({"max_passes": 0}, "max_passes"),
        ({"reserve": 3}, "reserve"),
        ({"on_progress": "print"}, "on_progress"),
    ],
)
def test_bad_options_are_rejected_before_anything_is_appended(
    runtime: journaled.Runtime, ran: list[str], kwargs: dict[str, Any], words: str
) -> None:
    """Bad input (O1): bad mode, budget, planner, goal, callback → ValueError, nothing appended."""
    options: dict[str, Any] = {
        "goal": GOAL,
        "planner": Scripted(plan(Step("a", tool="fetch"))),
        **kwargs,
    }
    with pytest.raises(ValueError, match=words):
        runtime.orchestrate(**options)
    assert runtime.journal.position() == 0
    assert runtime.runs.ids() == []
    assert ran == []


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"call_budget": -1}, "call_budget"),
        ({"call_budget": 2.5}, "call_budget"),
        ({"reserve": 3}, "reserve"),
        ({"on_progress": "print"}, "on_progress"),
    ],
)
def test_bad_resume_options_are_rejected_before_anything_is_appended(
    runtime: journaled.Runtime, ran: list[str], kwargs: dict[str, Any], words: str
) -> None:
    """Bad input (O3): resume with a bad budget or callback → ValueError, nothing appended."""
    out = runtime.orchestrate(GOAL, Scripted(plan(Step("a", skill="think"))), call_budget=0)
    assert out.status == "waiting_for_budget"
    before = runtime.journal.position()
    with pytest.raises(ValueError, match=words):
        runtime.resume(out.run_id, **{"call_budget": 1, **kwargs})
    assert runtime.journal.position() == before
    assert ran == []


def test_an_orchestration_before_its_pass_runs_is_rebuilt_with_its_plan_pending(
    journal_url: str,
) -> None:
    """O7, O4, O3: at every position of an orchestration's history, also before its pass has
    a run (planning, waiting for approval or for budget), runs.at gives the pass's plan with
    every step pending, no observation and no call; diff from there to the end shows the pass;
    before any plan, an empty plan of its goal."""

    def planner(goal: str, observations: object, clarifications: object) -> Plan:
        return Plan(goal=goal, steps=[Step("a", skill="s"), Step("b", skill="s", depends_on=["a"])])

    with journaled.open(journal_url) as rt:
        rt.register_skill("s", lambda i: i)
        outcome = rt.orchestrate("g", planner, require_approval=True)
        assert outcome.status == "waiting_for_approval"
        opened = rt.runs.history(outcome.run_id)[0].position
        waiting = rt.journal.position()
        at = rt.runs.at(outcome.run_id, waiting)
        assert [(s.id, s.status) for s in at.plan.steps] == [("a", "pending"), ("b", "pending")]
        assert (at.observations, at.calls_used, at.waiting, at.ok) == ([], 0, [], False)
        assert rt.runs.at(outcome.run_id, opened).plan.steps == []
        done = rt.resume(outcome.run_id, approve=True)
        assert isinstance(done, journaled.Outcome)
        assert done.status == "completed"
        diff = rt.runs.diff(outcome.run_id, waiting, rt.journal.position())
        assert (diff.calls_used_before, diff.calls_used_after) == (0, 2)
        assert [o.step_id for o in diff.new_observations] == ["a", "b"]
        short = rt.orchestrate("h", planner, call_budget=1)  # notify-and-wait (O3)
        assert short.status == "waiting_for_budget"
        pending = rt.runs.at(short.run_id, rt.journal.position())
        assert [s.status for s in pending.plan.steps] == ["pending", "pending"]


def test_diff_across_passes_lists_the_new_pass_observations(sqlite_url: str) -> None:
    """O7, T1, ADR 0010: between the end of a failed pass and the end of the replanned one,
    ``runs.diff`` of the orchestration lists the new pass's observations as new (the two
    positions show two pass runs, not one run whose observations grew)."""

    def boom(_: object) -> str:
        raise RuntimeError("x")

    with journaled.open(sqlite_url) as rt:
        rt.register_tool("ok", lambda _: "ok")
        rt.register_tool("boom", boom)
        calls = {"n": 0}

        def planner(goal: str, _obs: object, _cl: object) -> Plan:
            calls["n"] += 1
            if calls["n"] == 1:
                return Plan(
                    goal=goal,
                    steps=[Step("x", tool="ok"), Step("y", tool="boom", depends_on=["x"])],
                )
            return Plan(goal=goal, steps=[Step("z", tool="ok")])

        out = rt.orchestrate("g", planner, mode="orchestrate")
        assert out.status == "completed"
        passes = [
            e.data.run for e in rt.runs.history(out.run_id) if isinstance(e.data, PassStarted)
        ]
        a = rt.runs.history(passes[0])[-1].position  # the first pass has ended
        b = rt.journal.position()
        assert [o.step_id for o in rt.runs.at(out.run_id, a).observations] == ["x", "y"]
        assert [o.step_id for o in rt.runs.at(out.run_id, b).observations] == ["z"]
        diff = rt.runs.diff(out.run_id, a, b)
        assert [o.step_id for o in diff.new_observations] == ["z"]
        assert [(c.step_id, c.after) for c in diff.status_changes] == [("z", "succeeded")]
