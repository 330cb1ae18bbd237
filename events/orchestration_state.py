"""The orchestration projection: where an orchestration stands, folded from its events (O1-O6, R5).

An orchestration is a small state machine whose state is only ever the fold of its stream: the
orchestrator (``actors.orchestrator``) reads :attr:`OrchestrationState.phase`, decides, appends
the events of its decision, and folds them here, exactly as a resume or ``rt.runs`` time travel
folds them from the journal. Folding reads no clock and calls no planner.

Phases and the events that move between them::

    planning  --plan-proposed-->  settling  --pass-started-->  running  --pass-ended-->  reviewing
       ^  (clarification-requested, planning-failed end it here)  (approval-requested and
       |                                                          budget-awaited end it here)
       +-------------------------- replan-decided -------------------------------------+

``orchestration.ended`` stops the machine in its phase (a waiting status, or a terminal one);
``orchestration.suspended`` (its runtime closed while it planned or ran a pass) leaves it in its
phase, let go and undecided; ``orchestration.resumed`` starts it again there. An orchestration
that stops in ``reviewing`` (its pass waits for an answer or for budget) is taken up again in
``running``, by the same pass.
"""

from __future__ import annotations

import copy
from typing import Literal

import msgspec

from journaled.events.base import DomainEvent, Event
from journaled.events.orchestration import (
    ApprovalRequested,
    Budget,
    BudgetAwaited,
    BudgetGiven,
    ClarificationGiven,
    ClarificationRequested,
    Gap,
    OrchestrationEnded,
    OrchestrationResumed,
    OrchestrationStarted,
    OrchestrationSuspended,
    OutcomeStatus,
    PassEnded,
    PassStarted,
    PlanApproved,
    PlanningFailed,
    PlanProposed,
    ReplanDecided,
)
from journaled.events.plans import ExecuteResult, Plan
from journaled.events.runs import RunHeartbeat, RunPurged

Phase = Literal["planning", "settling", "running", "reviewing"]
"""What the orchestrator does next: ask the planner; approve and cost the plan, then start the
pass; execute (or carry on) the pass's run; look at how the pass ended."""


class OrchestrationState:
    """Everything known about one orchestration at one position of its stream."""

    def __init__(self) -> None:
        self.started: OrchestrationStarted | None = None
        self.run_id = ""
        self.budget: int | None = None
        self.pass_no = 0
        self.plan: Plan | None = None
        self.plans: dict[int, Plan] = {}
        self.pass_runs: dict[int, str] = {}
        self.pass_status: dict[int, str] = {}
        self.clarifications: list[tuple[str, str]] = []
        self.question: str | None = None
        self.question_at = 0
        self.approval_pending = False
        self.approval_at = 0
        self.approved: set[int] = set()
        self.budget_wait: BudgetAwaited | None = None
        self.failure: PlanningFailed | None = None
        self.gaps: list[Gap] = []
        self.ended: OrchestrationEnded | None = None
        self.suspended: OrchestrationSuspended | None = None
        """Set while the orchestration is let go by a closing runtime (R3); a resume clears it."""
        self.phase: Phase = "planning"
        self.resumptions = 0
        self.owner = ""
        """The process that started or last resumed it; empty in journals before owners."""
        self.last_at = 0
        self.version = 0
        self.position = 0
        self.purged: RunPurged | None = None
        """Set once the orchestration's content was erased (ADR 0018)."""

    @property
    def status(self) -> OutcomeStatus | None:
        """Return the last status the orchestration reached (None while it runs)."""
        return self.ended.status if self.ended is not None else None

    @property
    def current_run(self) -> str | None:
        """Return the execution run of the current pass, if it started."""
        return self.pass_runs.get(self.pass_no)

    def not_yet_run(self) -> ExecuteResult:
        """Return the current pass as ``runs.at`` shows it before its run began (planning,
        waiting for an approval or a budget, O3, O4, O7): the plan proposed for it, every step
        pending, no observation, no call of its own; before any plan, an empty plan of the
        goal. Its run id is the orchestration's."""
        goal = self.started.goal if self.started is not None else ""
        plan = self.plan if self.plan is not None else Plan(goal=goal, steps=[])
        pending = [msgspec.structs.replace(step, status="pending") for step in plan.steps]
        return ExecuteResult(
            run_id=self.run_id,
            ok=False,
            plan=msgspec.structs.replace(plan, steps=pending),
            observations=[],
            calls_used=0,
        )

    @property
    def waiting_budget(self) -> Budget | None:
        """Return the budget awaited, if waiting for one."""
        return self.budget_wait.budget if self.budget_wait is not None else None

    def apply(self, event: Event) -> None:
        """Fold one event of this orchestration's stream."""
        self.version = event.version
        self.position = event.position
        self.fold(event.data)

    def fold(self, data: DomainEvent) -> None:
        """Fold one orchestration event."""
        self.last_at = data.at
        match data:
            case OrchestrationStarted():
                self.started = data
                self.owner = data.owner
                self.run_id = data.run_id
                self.budget = data.call_budget
                self.pass_no = 1
                self.phase = "planning"
            case PlanProposed():
                self.pass_no = data.pass_no
                self.plan = data.plan
                self.plans[data.pass_no] = data.plan
                self.failure = None
                self.phase = "settling"
            case PlanningFailed():
                self.pass_no = data.pass_no
                self.failure = data
                self.gaps = list(data.gaps)
            case ClarificationRequested():
                if self.phase == "reviewing":
                    # Journals written before replan-decided existed replanned without an event.
                    self.pass_no += 1
                self.phase = "planning"
                self.question = data.question
                self.question_at = data.at
            case ApprovalRequested():
                self.approval_pending = True
                self.approval_at = data.at
            case BudgetAwaited():
                self.budget_wait = data
            case PassStarted():
                self.pass_no = data.pass_no
                self.pass_runs[data.pass_no] = data.run
                self.phase = "running"
            case PassEnded():
                self.pass_status[data.pass_no] = data.status
                self.phase = "reviewing"
            case ReplanDecided():
                self.pass_no = data.pass_no
                self.phase = "planning"
            case OrchestrationEnded():
                self.ended = data
                if self.phase == "reviewing" and data.status.startswith("waiting"):
                    self.phase = "running"  # the pass waits: a resume carries on the same run
            case OrchestrationSuspended():
                self.suspended = data  # its phase stays: a resume carries on from there
            case OrchestrationResumed():
                self.ended = None
                self.suspended = None
                self.owner = data.owner
                self.resumptions = data.resumption
                if data.budget is not None:
                    self._give_budget(data.budget)
                if data.approved is not None:
                    self._approve(data.approved)
                if data.question is not None and data.answer is not None:
                    self._clarify(data.question, data.answer)
            # Written by resumes before orchestration.resumed existed, each right after the
            # resume took the orchestration up again (then without an event).
            case BudgetGiven():
                self.ended = None
                self._give_budget(data.budget)
            case PlanApproved():
                self.ended = None
                self._approve(data.pass_no)
            case ClarificationGiven():
                self.ended = None
                self._clarify(data.question, data.answer)
            case RunPurged():
                self.purged = data
            case RunHeartbeat():
                pass  # the orchestrator was alive then (ADR 0029): last_at is all it changes
            case _:
                raise TypeError(f"an orchestration cannot fold {type(data).__qualname__}")

    def _give_budget(self, budget: int | None) -> None:
        self.budget = budget
        self.budget_wait = None

    def _approve(self, pass_no: int) -> None:
        self.approval_pending = False
        self.approved.add(pass_no)

    def _clarify(self, question: str, answer: str) -> None:
        self.clarifications.append((question, answer))
        self.question = None

    def copy(self) -> OrchestrationState:
        """Return an independent copy of this state (what a trace observes at one position)."""
        return copy.deepcopy(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OrchestrationState) and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]  # mutable: equal states must not share a hash


def fold_orchestration(events: list[Event]) -> OrchestrationState:
    """Fold an orchestration's events (oldest first)."""
    state = OrchestrationState()
    for event in events:
        state.apply(event)
    return state
