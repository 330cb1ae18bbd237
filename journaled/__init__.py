"""journaled: an event-sourced actor runtime for AI agents.

Open a runtime with :func:`open`; its ``memory`` is scoped long-term memory whose every change is an
event in one journal, so it can be audited (``why``, ``history``) and viewed as of any point.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from journaled.actors.errors import (
    RunNotFound,
    RunNotPurgeable,
    RunNotResumable,
    RunOwnedElsewhere,
    RuntimeClosed,
)
from journaled.actors.runs import RunHandle, Runs
from journaled.actors.steps import AgentContext, NeedsInput
from journaled.errors import (
    ActorsError,
    ActorTimeout,
    ConcurrencyConflict,
    ConfigurationError,
    CorruptEvent,
    EventsError,
    InvalidArgument,
    InvalidFact,
    JournalClosed,
    JournaledError,
    JournalUnreadable,
    JournalUrlError,
    OrganizationNotConfigured,
    ScrubPending,
    UnknownEventType,
)
from journaled.events.base import DomainEvent, Event
from journaled.events.errors import PlanRejected
from journaled.events.fork import Lineage, RunComparison, StepComparison
from journaled.events.journal import Problem, VerifyReport
from journaled.events.memory import Fact
from journaled.events.messages import Deletion
from journaled.events.orchestration import Budget, Clarify, Gap, Gaps, Outcome
from journaled.events.plans import (
    AgentResult,
    ExecuteResult,
    Limits,
    Observation,
    Plan,
    RunDiff,
    StatusChange,
    Step,
)
from journaled.memory import Embedder, Memory, MemoryView
from journaled.runtime import JournalHandle, Runtime, open

if TYPE_CHECKING:
    from journaled import aio


def __getattr__(name: str) -> Any:
    # journaled.aio (asyncio runtime, A1) loads on first use: a sync program never imports it.
    if name == "aio":
        return importlib.import_module("journaled.aio")
    raise AttributeError(f"module 'journaled' has no attribute {name!r}")


__all__ = [
    "ActorTimeout",
    "ActorsError",
    "AgentContext",
    "AgentResult",
    "Budget",
    "Clarify",
    "ConcurrencyConflict",
    "ConfigurationError",
    "CorruptEvent",
    "Deletion",
    "DomainEvent",
    "Embedder",
    "Event",
    "EventsError",
    "ExecuteResult",
    "Fact",
    "Gap",
    "Gaps",
    "InvalidArgument",
    "InvalidFact",
    "JournalClosed",
    "JournalHandle",
    "JournalUnreadable",
    "JournalUrlError",
    "JournaledError",
    "Limits",
    "Lineage",
    "Memory",
    "MemoryView",
    "NeedsInput",
    "Observation",
    "OrganizationNotConfigured",
    "Outcome",
    "Plan",
    "PlanRejected",
    "Problem",
    "RunComparison",
    "RunDiff",
    "RunHandle",
    "RunNotFound",
    "RunNotPurgeable",
    "RunNotResumable",
    "RunOwnedElsewhere",
    "Runs",
    "Runtime",
    "RuntimeClosed",
    "ScrubPending",
    "StatusChange",
    "Step",
    "StepComparison",
    "UnknownEventType",
    "VerifyReport",
    "aio",
    "open",
]
