"""The orchestration projection: where an orchestration stands, folded from its events (O1-O6)."""

from __future__ import annotations

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
    OrchestrationStarted,
    OutcomeStatus,
    PassEnded,
    PassStarted,
    PlanApproved,
    PlanningFailed,
    PlanProposed,
)
from journaled.events.plans import Plan
from journaled.events.runs import RunPurged


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
        match data:
            case OrchestrationStarted():
                self.started = data
                self.run_id = data.run_id
                self.budget = data.call_budget
                self.pass_no = 1
            case PlanProposed():
                self.pass_no = data.pass_no
                self.plan = data.plan
                self.plans[data.pass_no] = data.plan
                self.failure = None
            case PlanningFailed():
                self.failure = data
                self.gaps = list(data.gaps)
            case ClarificationRequested():
                self.question = data.question
                self.question_at = data.at
            case ClarificationGiven():
                self.clarifications.append((data.question, data.answer))
                self.question = None
            case ApprovalRequested():
                self.approval_pending = True
                self.approval_at = data.at
            case PlanApproved():
                self.approval_pending = False
                self.approved.add(data.pass_no)
            case BudgetAwaited():
                self.budget_wait = data
            case BudgetGiven():
                self.budget = data.budget
                self.budget_wait = None
            case PassStarted():
                self.pass_no = data.pass_no
                self.pass_runs[data.pass_no] = data.run
            case PassEnded():
                self.pass_status[data.pass_no] = data.status
            case OrchestrationEnded():
                self.ended = data
            case RunPurged():
                self.purged = data
            case _:
                raise TypeError(f"an orchestration cannot fold {type(data).__qualname__}")

    def reopen(self) -> None:
        """Forget the last waiting status when a resume takes the orchestration up again."""
        self.ended = None


def fold_orchestration(events: list[Event]) -> OrchestrationState:
    """Fold an orchestration's events (oldest first)."""
    state = OrchestrationState()
    for event in events:
        state.apply(event)
    return state
