"""Orchestrations are a fold: every journaled position rebuilds the live state (R5, O1-O7).

Each story runs ``orchestrate`` and then ``resume`` until it settles, with a ``trace`` that records
the orchestrator's live state (a copy) right after each event it appends. Every traced position is
then rebuilt from the journal alone and must equal what was live there; and every event of the
orchestration's stream must have been traced exactly once, so no state change went unobserved.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import journaled
from journaled import AgentResult, Clarify, Gap, Gaps, NeedsInput, Observation, Outcome, Plan, Step
from journaled.events.base import DomainEvent, Pending
from journaled.events.orchestration import (
    BudgetGiven,
    ClarificationGiven,
    OrchestrationResumed,
    PlanApproved,
    ReplanDecided,
)
from journaled.events.orchestration_state import OrchestrationState
from journaled.testing import ManualClock

GOAL = "ship the release notes"

Trace = list[tuple[int, OrchestrationState]]


class Scripted:
    """A planner answering from a script (the last answer repeats)."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.calls: list[list[tuple[str, str]]] = []

    def __call__(
        self, goal: str, observations: list[Observation], clarifications: list[tuple[str, str]]
    ) -> object:
        self.calls.append(list(clarifications))
        answer = self.answers[min(len(self.calls), len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer


def _plan(*steps: Step) -> Plan:
    return Plan(goal=GOAL, steps=list(steps))


def _register(rt: journaled.Runtime) -> None:
    def boom(x: Any) -> Any:
        raise RuntimeError(f"no route to {x}")

    def asker(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        if ctx.answer is None:
            raise NeedsInput(f"which branch for {step.id}?")
        return AgentResult(output=f"{step.id} on {ctx.answer}", calls_used=0)

    rt.register_tool("fetch", lambda x: x)
    rt.register_tool("boom", boom)
    rt.register_skill("think", lambda x: f"thought about {x}")
    rt.register_agent("asker", asker)


@dataclass
class Story:
    """One orchestration driven through its calls, with what each call traced."""

    rt: journaled.Runtime
    traces: list[Trace] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)

    def tracer(self) -> Callable[[int, OrchestrationState], None]:
        trace: Trace = []
        self.traces.append(trace)
        return lambda position, state: trace.append((position, state))

    def start(self, planner: Any, **options: Any) -> Outcome:
        out = self.rt._orchestrations.orchestrate(GOAL, planner, trace=self.tracer(), **options)
        self.outcomes.append(out)
        return out

    def resume(self, **options: Any) -> Outcome:
        out = self.rt._orchestrations.resume(
            self.outcomes[0].run_id, trace=self.tracer(), **options
        )
        self.outcomes.append(out)
        return out

    def check(self) -> None:
        """R5: each traced live state equals the state rebuilt at its position, for every event."""
        run_id = self.outcomes[0].run_id
        orchestrations = self.rt._orchestrations
        history = self.rt.runs.history(run_id)
        traced = [p for trace in self.traces for p, _ in trace]
        assert traced == [e.position for e in history], "every event is traced once, in order"
        for trace in self.traces:
            for position, live in trace:
                rebuilt = orchestrations.state(run_id, position)
                assert vars(rebuilt) == vars(live), f"position {position}"
        last = orchestrations.state(run_id)
        assert last == self.traces[-1][-1][1]
        assert orchestrations.outcome(last) == self.outcomes[-1]


@pytest.fixture
def story(journal_url: str, clock: ManualClock) -> Iterator[Story]:
    """Yield a story on a runtime with recording tools, skills and agents, on each backend."""
    with journaled.open(journal_url, clock=clock) as rt:
        _register(rt)
        yield Story(rt)


def _kinds(story: Story) -> list[str]:
    return [e.kind for e in story.rt.runs.history(story.outcomes[0].run_id)]


def test_plain_success_rebuilds_at_every_position(story: Story) -> None:
    """R5/O1: a one-pass success rebuilds the live state at each of its journal positions."""
    out = story.start(Scripted(_plan(Step("a", tool="fetch", input="x"))))
    assert out.status == "completed"
    story.check()


def test_planner_failure_rebuilds_at_every_position(story: Story) -> None:
    """R5/O1: a planner that raises fails the orchestration; every position rebuilds live state."""
    out = story.start(Scripted(RuntimeError("model down")))
    assert out.status == "failed"
    story.check()


def test_planner_failure_on_a_replan_rebuilds_at_every_position(story: Story) -> None:
    """R5/O2: after a failed pass the next pass number is journaled before the planner fails."""
    planner = Scripted(_plan(Step("a", tool="boom", input="db")), RuntimeError("model down"))
    out = story.start(planner, mode="orchestrate")
    assert out.status == "failed"
    assert "planning failed" in out.summary
    story.check()
    assert story.rt._orchestrations.state(out.run_id).pass_no == 2


def test_clarify_then_answer_then_success_rebuilds_at_every_position(story: Story) -> None:
    """R5/O4: a question, its answer on resume, then success: every position rebuilds."""
    planner = Scripted(Clarify("which repository?"), _plan(Step("a", tool="fetch")))
    assert story.start(planner).status == "waiting_for_clarification"
    assert story.resume(clarification="acme/notes").status == "completed"
    assert planner.calls == [[], [("which repository?", "acme/notes")]]
    story.check()


def test_clarify_on_a_replan_then_answer_rebuilds_at_every_position(story: Story) -> None:
    """R5/O2/O4: a question asked while replanning belongs to pass 2, live and rebuilt."""
    planner = Scripted(
        _plan(Step("a", tool="boom")), Clarify("which mirror?"), _plan(Step("b", tool="fetch"))
    )
    assert story.start(planner, mode="orchestrate").status == "waiting_for_clarification"
    assert story.rt._orchestrations.state(story.outcomes[0].run_id).pass_no == 2
    assert story.resume(clarification="eu").status == "completed"
    story.check()


def test_agent_waiting_for_input_then_answer_rebuilds_at_every_position(story: Story) -> None:
    """R5/O4/E10: an agent step's question answered by clarification=: every position rebuilds."""
    out = story.start(Scripted(_plan(Step("g", agent="asker"))))
    assert out.status == "waiting_for_clarification"
    assert story.resume(clarification="main").status == "completed"
    story.check()


def test_approval_then_approve_rebuilds_at_every_position(story: Story) -> None:
    """R5/O4: waiting for approval, then approve=True: every position rebuilds."""
    planner = Scripted(_plan(Step("a", tool="fetch")))
    assert story.start(planner, require_approval=True).status == "waiting_for_approval"
    assert story.resume(approve=True).status == "completed"
    story.check()


@pytest.mark.parametrize("partial", [False, True], ids=["notify-and-wait", "partial"])
def test_budget_pause_then_more_budget_rebuilds_at_every_position(
    story: Story, partial: bool
) -> None:
    """R5/O3: a budget wait (either policy), a still-short resume, then enough: every position."""
    planner = Scripted(
        _plan(
            Step("a", skill="think"),
            Step("b", skill="think", depends_on=["a"]),
            Step("c", skill="think", depends_on=["b"]),
        )
    )
    assert story.start(planner, call_budget=1, partial=partial).status == "waiting_for_budget"
    assert story.resume(call_budget=2).status == "waiting_for_budget"
    assert story.resume(call_budget=3).status == "completed"
    story.check()


def test_max_passes_reached_rebuilds_at_every_position(story: Story) -> None:
    """R5/O2: every pass fails until max_passes; each replan is an event; every position."""
    planner = Scripted(_plan(Step("a", tool="boom")))
    out = story.start(planner, mode="orchestrate", max_passes=3)
    assert out.status == "failed"
    assert len(planner.calls) == 3
    story.check()
    assert _kinds(story).count("orchestration.replan-decided") == 2


def test_gaps_rebuild_at_every_position(story: Story) -> None:
    """R5/O1: capability gaps fail planning; every position rebuilds, gaps included."""
    out = story.start(Scripted(Gaps([Gap(kind="tool", name="deploy")])))
    assert out.status == "failed"
    assert out.gaps == [Gap(kind="tool", name="deploy")]
    story.check()


def test_dry_run_rebuilds_at_every_position(story: Story) -> None:
    """R5/O2: plan mode journals the plan and ends dry_run; every position rebuilds."""
    assert story.start(Scripted(_plan(Step("a", tool="fetch"))), mode="plan").status == "dry_run"
    story.check()


def test_resume_journals_what_it_changed(story: Story) -> None:
    """R5/O4/O3: rt.resume journals one orchestration.resumed with budget, approval and answer."""
    planner = Scripted(Clarify("which repository?"), _plan(Step("a", skill="think")))
    run_id = story.start(planner, call_budget=0, require_approval=True).run_id
    story.resume(clarification="acme/notes")
    story.resume(approve=True)
    story.resume(call_budget=1)
    resumed = [
        e.data for e in story.rt.runs.history(run_id) if isinstance(e.data, OrchestrationResumed)
    ]
    assert [(r.question, r.answer, r.approved, r.previous_budget, r.budget) for r in resumed] == [
        ("which repository?", "acme/notes", None, None, None),
        (None, None, 1, None, None),
        (None, None, None, 0, 1),
    ]
    assert [r.resumption for r in resumed] == [1, 2, 3]
    why = story.rt.runs.why(run_id)
    assert "resumed: answered 'which repository?' with 'acme/notes'" in why
    assert "resumed: the plan of pass 1 approved" in why
    assert "resumed: call budget changed from 0 to 1" in why
    story.check()


def test_a_replan_is_journaled_with_its_reason(story: Story) -> None:
    """R5/O2/O6: the decision to replan is an event naming the failed pass and why; why shows it."""
    planner = Scripted(_plan(Step("a", tool="boom", input="db")), _plan(Step("b", tool="fetch")))
    out = story.start(planner, mode="orchestrate")
    assert out.status == "completed"
    [replan] = [
        e.data for e in story.rt.runs.history(out.run_id) if isinstance(e.data, ReplanDecided)
    ]
    assert replan.pass_no == 2
    assert "no route to db" in replan.reason
    assert "replanning as pass 2 of at most 3" in story.rt.runs.why(out.run_id)


# -- random stories --------------------------------------------------------------------------------

ANSWERS = ("ok", "boom", "costly", "asker", "clarify", "gaps", "raise", "garbage")
LIKELY = ("ok", "costly", "asker", "boom", "clarify")
"""Drawn twice as often: most planners answer with a plan or a question."""


def _answer(kind: str, n: int) -> object:
    match kind:
        case "ok":
            return _plan(Step("a", tool="fetch", input=n))
        case "boom":
            return _plan(Step("a", tool="fetch"), Step("b", tool="boom", depends_on=["a"]))
        case "costly":
            return _plan(
                Step("a", skill="think", input=n),
                Step("b", skill="think", depends_on=["a"]),
                Step("t", tool="fetch"),
            )
        case "asker":
            return _plan(Step("t", tool="fetch"), Step("g", agent="asker", depends_on=["t"]))
        case "clarify":
            return Clarify(f"question {n}?")
        case "gaps":
            return Gaps([Gap(kind="skill", name=f"missing-{n}")])
        case "raise":
            return RuntimeError(f"planner broke {n}")
    return f"not a plan {n}"


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    script=st.lists(st.sampled_from(ANSWERS + LIKELY), min_size=1, max_size=4),
    mode=st.sampled_from(["plan", "execute", "orchestrate", "orchestrate"]),
    budget=st.none() | st.integers(0, 3),
    partial=st.booleans(),
    approval=st.booleans(),
    max_passes=st.integers(1, 3),
)
def test_random_stories_rebuild_at_every_position(
    clock: ManualClock,
    script: list[str],
    mode: str,
    budget: int | None,
    partial: bool,
    approval: bool,
    max_passes: int,
) -> None:
    """R5 (O1-O4): any mix of plans, questions, failures, waits and resumes folds to live state."""
    planner = Scripted(*(_answer(kind, n) for n, kind in enumerate(script)))
    with journaled.open("memory://", clock=clock) as rt:
        _register(rt)
        story = Story(rt)
        out = story.start(
            planner,
            mode=mode,
            call_budget=budget,
            partial=partial,
            require_approval=approval,
            max_passes=max_passes,
        )
        for _ in range(12):
            match out.status:
                case "waiting_for_approval":
                    out = story.resume(approve=True)
                case "waiting_for_budget":
                    assert out.budget is not None
                    out = story.resume(call_budget=out.budget.max_calls + 1)
                case "waiting_for_clarification":
                    out = story.resume(clarification=f"answer {len(story.outcomes)}")
                case _:
                    break
        event(f"ended {out.status} after {len(story.outcomes)} call(s)")
        story.check()


# -- journals written before orchestration.resumed and replan-decided ------------------------------


def _legacy_copy(source: journaled.Runtime, target: journaled.Runtime, run_id: str) -> None:
    """Copy a journal as the previous release wrote it: no replan event, three resume events."""
    versions: dict[str, int] = {}
    pending: list[Pending] = []
    for e in source.journal.read():
        data = e.data
        if isinstance(data, ReplanDecided):
            continue  # the previous release replanned without an event
        olds: list[DomainEvent] = [data]
        if isinstance(data, OrchestrationResumed):
            olds = []
            if data.budget is not None:
                olds.append(
                    BudgetGiven(at=data.at, previous=data.previous_budget, budget=data.budget)
                )
            if data.approved is not None:
                olds.append(PlanApproved(at=data.at, pass_no=data.approved))
            if data.question is not None and data.answer is not None:
                olds.append(
                    ClarificationGiven(at=data.at, question=data.question, answer=data.answer)
                )
        for old in olds:
            versions[e.stream] = versions.get(e.stream, 0) + 1
            pending.append(Pending(stream=e.stream, version=versions[e.stream], data=old))
    target._journal.append(pending)
    assert target._orchestrations.is_orchestration(run_id)


def _essentials(state: OrchestrationState) -> dict[str, object]:
    keep = ("pass_no", "phase", "question", "clarifications", "approved", "budget", "ended")
    return {k: getattr(state, k) for k in keep} | {"runs": state.pass_runs, "plans": state.plans}


def test_a_journal_of_the_previous_release_folds_and_resumes(
    journal_url: str, clock: ManualClock
) -> None:
    """R5/J6: old resume events and an unjournaled replan still fold, and such a run resumes."""
    planner = Scripted(
        _plan(Step("a", tool="boom")), Clarify("which mirror?"), _plan(Step("b", skill="think"))
    )
    with journaled.open("memory://", clock=clock) as source:
        _register(source)
        run_id = source.orchestrate(
            GOAL, planner, mode="orchestrate", call_budget=0, require_approval=True
        ).run_id
        assert isinstance(source.resume(run_id, approve=True), Outcome)
        assert source._orchestrations.state(run_id).status == "waiting_for_clarification"
        with journaled.open(journal_url, clock=clock) as rt:
            _register(rt)
            _legacy_copy(source, rt, run_id)
            legacy = rt._orchestrations.state(run_id)
            assert _essentials(legacy) == _essentials(source._orchestrations.state(run_id))
            assert (legacy.pass_no, legacy.phase) == (2, "planning")

            story = Story(rt, outcomes=[rt._orchestrations.outcome(legacy)])
            again = Scripted(_plan(Step("b", skill="think")))
            assert story.resume(clarification="eu", planner=again).status == "waiting_for_approval"
            assert again.calls == [[("which mirror?", "eu")]]
            assert story.resume(approve=True).status == "waiting_for_budget"
            done = story.resume(call_budget=1)
            assert done.status == "completed"
            assert "in 2 pass(es)" in done.summary
            assert sorted(rt._orchestrations.state(run_id).pass_runs) == [1, 2]


def test_resume_events_of_the_previous_release_fold_like_resumed(
    journal_url: str, clock: ManualClock
) -> None:
    """R5/J6: a story resumed with the old events folds to the state orchestration.resumed gives."""
    planner = Scripted(Clarify("which repository?"), _plan(Step("a", skill="think")))
    with journaled.open("memory://", clock=clock) as source:
        _register(source)
        run_id = source.orchestrate(GOAL, planner, call_budget=0, require_approval=True).run_id
        source.resume(run_id, clarification="acme/notes")
        source.resume(run_id, approve=True)
        source.resume(run_id, call_budget=1)
        new = source._orchestrations.state(run_id)
        assert new.status == "completed"
        with journaled.open(journal_url, clock=clock) as rt:
            _legacy_copy(source, rt, run_id)
            old_events = rt.runs.history(run_id)
            assert "orchestration.resumed" not in [e.kind for e in old_events]
            assert _essentials(rt._orchestrations.state(run_id)) == _essentials(new)
            for e in old_events:
                if isinstance(e.data, BudgetGiven | PlanApproved | ClarificationGiven):
                    assert rt._orchestrations.state(run_id, e.position).ended is None
            why = rt.runs.why(run_id)
            assert "call budget changed from 0 to 1" in why
            assert "pass 1: the plan was approved" in why
