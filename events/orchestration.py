"""Orchestration: planning, approval, clarification and budget policy around runs (SPEC section 3).

An orchestration is one stream (its run id). Each pass executes its settled plan as a child run
linked to the orchestration (``RunStarted.parent_run`` is the orchestration's id, ``parent_step`` is
``pass-N``), so a pass is journaled before its first step (O5) and the replan loop (O2) keeps every
pass's history.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal, Self

import msgspec
from msgspec import UNSET, UnsetType

from journaled.events.base import DomainEvent, Unpackable
from journaled.events.plans import Observation, Plan, map_plan

OutcomeStatus = Literal[
    "completed",
    "failed",
    "waiting_for_clarification",
    "waiting_for_approval",
    "waiting_for_budget",
    "dry_run",
]
Mode = Literal["plan", "execute", "orchestrate"]


class Clarify(msgspec.Struct, frozen=True):
    """A planner's answer asking the user a question before it can plan (O4)."""

    question: str


class Gap(msgspec.Struct, frozen=True, kw_only=True):
    """A capability the planner needed but the runtime lacks."""

    kind: str
    """What is missing: ``skill``, ``tool``, ``agent`` or another capability name."""
    name: str
    reason: str = ""


class Gaps(msgspec.Struct, frozen=True):
    """A planner's answer that it cannot plan: the structured capability gaps (O1)."""

    gaps: list[Gap]


class Budget(Unpackable, frozen=True, kw_only=True):
    """Estimated against available model calls, when waiting for budget (O1, O3)."""

    est_calls: int
    """Model calls the steps not yet succeeded would cost."""
    max_calls: int
    completed_steps: int
    total_steps: int


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """The result of an orchestration (O1)."""

    run_id: str
    status: OutcomeStatus
    plan: Plan | None
    observations: list[Observation]
    summary: str
    """One line: what happened or what is awaited."""
    budget: Budget | None = None
    gaps: list[Gap] | None = None
    pass_run: str | None = None
    """The execution run of the current pass, if one started; when the current pass has no plan
    (its planning failed or asks a question), the last pass's run (ADR 0010)."""


class OrchestrationStarted(DomainEvent, frozen=True, kw_only=True, tag="orchestration.started"):
    """Someone asked to reach a goal."""

    run_id: str
    goal: str
    mode: Mode
    call_budget: int | None = None
    partial: bool = False
    require_approval: bool = False
    max_passes: int = 3
    owner: str = ""
    """The process driving it (``host/pid/start-time``); empty in journals before owners."""
    reserve: str | None = None
    """The ``reserve`` policy as ``module:qualname``, so a resume costs agents the same (R6)."""
    organization: str | UnsetType | None = UNSET
    """The organization of the runtime that started it (None: none configured); its passes
    carry the same (R1, ADR 0074). UNSET in orchestrations of earlier releases."""

    version: ClassVar[int] = 2
    has_content: ClassVar[bool] = True

    def map_content(self, f: Callable[[Any], Any]) -> Self:
        """Apply ``f`` to the goal."""
        return msgspec.structs.replace(self, goal=f(self.goal))


class PlanProposed(DomainEvent, frozen=True, kw_only=True, tag="orchestration.plan-proposed"):
    """The planner proposed a plan for a pass."""

    pass_no: int
    plan: Plan

    version: ClassVar[int] = 2
    has_content: ClassVar[bool] = True

    def map_content(self, f: Callable[[Any], Any]) -> Self:
        """Apply ``f`` to the plan's goal and step inputs."""
        return msgspec.structs.replace(self, plan=map_plan(self.plan, f))


class PlanningFailed(DomainEvent, frozen=True, kw_only=True, tag="orchestration.planning-failed"):
    """The planner could not plan: it raised, answered garbage, an invalid plan, or gaps."""

    pass_no: int
    reason: str
    gaps: tuple[Gap, ...] = ()

    version: ClassVar[int] = 2
    has_content: ClassVar[bool] = True

    def map_content(self, f: Callable[[Any], Any]) -> Self:
        """Apply ``f`` to the reason and each gap's kind, name and reason (a planner writes
        them all)."""
        gaps = tuple(
            msgspec.structs.replace(g, kind=f(g.kind), name=f(g.name), reason=f(g.reason))
            for g in self.gaps
        )
        return msgspec.structs.replace(self, reason=f(self.reason), gaps=gaps)


class ClarificationRequested(
    DomainEvent, frozen=True, kw_only=True, tag="orchestration.clarification-requested"
):
    """The planner asked a question before it could plan (O4)."""

    question: str

    version: ClassVar[int] = 2
    has_content: ClassVar[bool] = True

    def map_content(self, f: Callable[[Any], Any]) -> Self:
        """Apply ``f`` to the question."""
        return msgspec.structs.replace(self, question=f(self.question))


class ClarificationGiven(
    DomainEvent, frozen=True, kw_only=True, tag="orchestration.clarification-given"
):
    """The user answered the planner's question."""

    question: str
    answer: str

    version: ClassVar[int] = 2
    has_content: ClassVar[bool] = True

    def map_content(self, f: Callable[[Any], Any]) -> Self:
        """Apply ``f`` to the question and the answer."""
        return msgspec.structs.replace(self, question=f(self.question), answer=f(self.answer))


class ApprovalRequested(
    DomainEvent, frozen=True, kw_only=True, tag="orchestration.approval-requested"
):
    """The plan waits for a human to approve it (O4)."""

    pass_no: int


class PlanApproved(DomainEvent, frozen=True, kw_only=True, tag="orchestration.plan-approved"):
    """A human approved the plan."""

    pass_no: int


class BudgetAwaited(DomainEvent, frozen=True, kw_only=True, tag="orchestration.budget-awaited"):
    """The plan does not fit the call budget: it waits for a bigger one (O3)."""

    pass_no: int
    budget: Budget
    partial: bool = False
    """True when the waves that fit ran first (the pass run stopped for budget)."""
    used: int = 0
    """Model calls used so far, across passes."""


class BudgetGiven(DomainEvent, frozen=True, kw_only=True, tag="orchestration.budget-given"):
    """The call budget was raised on resume."""

    previous: int | None
    budget: int | None


class PassStarted(DomainEvent, frozen=True, kw_only=True, tag="orchestration.pass-started"):
    """A pass's settled plan started executing as a child run (O5)."""

    pass_no: int
    run: str


class PassEnded(DomainEvent, frozen=True, kw_only=True, tag="orchestration.pass-ended"):
    """A pass's run stopped: completed, failed, waiting for an answer, or stopped for budget."""

    pass_no: int
    run: str
    status: str
    calls_used: int


class ReplanDecided(DomainEvent, frozen=True, kw_only=True, tag="orchestration.replan-decided"):
    """A pass failed with passes left: the planner is asked again for the next pass (O2, R5)."""

    pass_no: int
    """The pass about to be planned (the failed one plus one)."""
    reason: str
    """Why the previous pass failed: its first failed step and error."""
    max_passes: int
    """The orchestration's bound on passes, which this one is within."""

    version: ClassVar[int] = 2  # content in a forgettable payload from its first release
    has_content: ClassVar[bool] = True

    def map_content(self, f: Callable[[Any], Any]) -> Self:
        """Apply ``f`` to the reason."""
        return msgspec.structs.replace(self, reason=f(self.reason))


class OrchestrationResumed(DomainEvent, frozen=True, kw_only=True, tag="orchestration.resumed"):
    """``rt.resume`` took the orchestration up again, with everything it changed (O3, O4, R5).

    One event per resume, so a resume is atomic and the state it leaves is the fold of it. The
    older ``budget-given``, ``plan-approved`` and ``clarification-given`` events still fold (they
    were written before this one existed) but are no longer appended.
    """

    resumption: int
    """1 for the first resume of this orchestration, then 2, ..."""
    budget: int | None = None
    """The new total call budget, or None when the resume left the budget as it was."""
    previous_budget: int | None = None
    """The budget before, when ``budget`` changed it."""
    approved: int | None = None
    """The pass whose plan this resume approved, if it approved one."""
    question: str | None = None
    """The planner's question this resume answered, if any."""
    answer: str | None = None
    """The answer to ``question``."""
    answered: tuple[str, ...] = ()
    """Steps of the current pass given an answer (the answers are in the pass run's events)."""
    owner: str = ""
    """The process that took it up and drives it now (``host/pid/start-time``)."""

    version: ClassVar[int] = 2  # content in a forgettable payload from its first release
    has_content: ClassVar[bool] = True

    def map_content(self, f: Callable[[Any], Any]) -> Self:
        """Apply ``f`` to the question and the answer."""
        question = None if self.question is None else f(self.question)
        answer = None if self.answer is None else f(self.answer)
        return msgspec.structs.replace(self, question=question, answer=answer)


class OrchestrationSuspended(DomainEvent, frozen=True, kw_only=True, tag="orchestration.suspended"):
    """The runtime closed while it drove the orchestration, which it let go (R3, R5, ADR 0087).

    Not an end: no status is reached and the phase stays where it was, so ``rt.resume`` carries
    it on from there, in this process or another, without waiting for the owner's lease (the
    owner let it go). ``orchestration.resumed`` clears it.
    """

    pass_no: int
    """The pass it stood at."""
    phase: str
    """Where it stood: ``planning`` (the planner's answer is asked again on resume) or
    ``running`` (its pass's run was suspended with it)."""
    run: str | None = None
    """The pass's run, suspended with it (its ``run.suspended`` names the steps in flight)."""
    cause: str = "close"
    """``close`` (``rt.close()`` or leaving ``with``), ``exit`` (the interpreter exiting), or
    what suspended the pass's run."""


class OrchestrationEnded(DomainEvent, frozen=True, kw_only=True, tag="orchestration.ended"):
    """The orchestration reached a status (terminal or waiting) with a one-line summary."""

    status: OutcomeStatus
    summary: str

    version: ClassVar[int] = 2
    has_content: ClassVar[bool] = True

    def map_content(self, f: Callable[[Any], Any]) -> Self:
        """Apply ``f`` to the summary (it may quote a question or an error)."""
        return msgspec.structs.replace(self, summary=f(self.summary))


ORCHESTRATION_EVENTS: tuple[type[DomainEvent], ...] = (
    OrchestrationStarted,
    PlanProposed,
    PlanningFailed,
    ClarificationRequested,
    ClarificationGiven,
    ApprovalRequested,
    PlanApproved,
    BudgetAwaited,
    BudgetGiven,
    PassStarted,
    PassEnded,
    ReplanDecided,
    OrchestrationResumed,
    OrchestrationSuspended,
    OrchestrationEnded,
)
