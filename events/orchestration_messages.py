"""Requests the orchestrator actor is told (never stored), and the replies it sends (SPEC A4).

Every message is data (ADR 0024, ADR 0029): the orchestrator is reached by its address, the planner
is user code its worker was built with (never a message field), and a pass's end is told back by the
pass's run id and a correlation id.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from journaled.events.orchestration import Gap, Outcome
from journaled.events.plans import Observation, Plan


class OrchestrationMessage(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every orchestration message."""

    version: ClassVar[int] = 1
    """The message's schema version (see :attr:`journaled.events.messages.Message.version`)."""


class BeginOrchestration(
    OrchestrationMessage, frozen=True, kw_only=True, tag="orchestration.begin"
):
    """Start driving the orchestration the actor was built for, from its folded phase."""


class CancelOrchestration(
    OrchestrationMessage, frozen=True, kw_only=True, tag="orchestration.cancel"
):
    """Stop before the next decision: no plan settled, no pass started, no replan (E5)."""


class DrainOrchestration(
    OrchestrationMessage, frozen=True, kw_only=True, tag="orchestration.drain"
):
    """The runtime is closing: decide nothing more; the orchestration stays resumable (R3)."""


class OrchestrationTick(
    OrchestrationMessage, frozen=True, kw_only=True, tag="orchestration.heartbeat-tick"
):
    """Time to show the orchestration's owner is alive, if it appended nothing for a while."""


class AskPlanner(OrchestrationMessage, frozen=True, kw_only=True, tag="orchestration.ask-planner"):
    """Ask the planner for a pass's plan; the worker tells :class:`PlannerAnswered` back."""

    goal: str
    observations: list[Observation] = []
    clarifications: list[tuple[str, str]] = []
    """(question, answer) pairs, oldest first."""
    pass_no: int
    reply_to: str
    """The orchestrator's address."""
    correlation: str


class PlannerAnswered(
    OrchestrationMessage, frozen=True, kw_only=True, tag="orchestration.planner-answered"
):
    """What the planner answered, checked: a valid plan, a question, or why planning failed."""

    correlation: str
    plan: Plan | None = None
    """A valid plan, as the journal stores it."""
    question: str | None = None
    """The planner asked this (``Clarify``)."""
    failure: str | None = None
    """Planning failed: the reason, for ``orchestration.planning-failed``."""
    gaps: tuple[Gap, ...] = ()
    """The capability gaps the planner reported (with ``failure``)."""


class PassStopped(
    OrchestrationMessage, frozen=True, kw_only=True, tag="orchestration.pass-stopped"
):
    """A pass's run stopped executing (finished, waiting, suspended): read it from the journal."""

    correlation: str
    run_id: str


class OrchestrationStopped(
    OrchestrationMessage, frozen=True, kw_only=True, tag="orchestration.stopped"
):
    """An orchestrator stopped: the orchestration's outcome at this stop (O1)."""

    correlation: str
    outcome: Outcome
