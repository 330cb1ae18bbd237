"""journaled: an event-sourced actor runtime for AI agents.

Open a runtime with :func:`open`; its ``memory`` is scoped long-term memory whose every change is an
event in one journal, so it can be audited (``why``, ``history``) and viewed as of any point.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from journaled import aio
    from journaled.actors.errors import (
        RememberInterrupted,
        RunNotFound,
        RunNotPurgeable,
        RunNotResumable,
        RunOwnedElsewhere,
        RuntimeClosed,
    )
    from journaled.actors.runs import (
        RunHandle,
        Runs,
    )
    from journaled.actors.steps import (
        AgentContext,
        AsyncAgentContext,
        NeedsInput,
    )
    from journaled.errors import (
        ActorsError,
        ActorTimeout,
        AppendOutcomeUnknown,
        ConcurrencyConflict,
        ConfigurationError,
        CorruptEvent,
        EventsError,
        IndexTorn,
        InvalidArgument,
        InvalidFact,
        JournalBusy,
        JournalClosed,
        JournaledError,
        JournalFull,
        JournalReadOnly,
        JournalUnavailable,
        JournalUnreadable,
        JournalUrlError,
        OrganizationNotConfigured,
        ScrubPending,
        UnknownEventType,
        UnreadableEvent,
    )
    from journaled.events.base import (
        DomainEvent,
        Event,
    )
    from journaled.events.errors import (
        PlanRejected,
    )
    from journaled.events.fork import (
        Lineage,
        RunComparison,
        StepComparison,
    )
    from journaled.events.journal import (
        Problem,
        VerifyReport,
    )
    from journaled.events.memory import (
        Fact,
    )
    from journaled.events.messages import (
        Deletion,
    )
    from journaled.events.orchestration import (
        Budget,
        Clarify,
        Gap,
        Gaps,
        Outcome,
    )
    from journaled.events.plans import (
        AgentResult,
        ExecuteResult,
        Limits,
        Observation,
        Plan,
        Retry,
        RunDiff,
        RunState,
        StatusChange,
        Step,
    )
    from journaled.events.provenance import (
        Stale,
        Use,
    )
    from journaled.events.run_summaries import (
        RunSummary,
    )
    from journaled.memory import (
        Embedder,
        Memory,
        MemoryView,
    )
    from journaled.runtime import (
        JournalHandle,
        Runtime,
        open,
    )


_HOMES: dict[str, str] = {
    "ActorTimeout": "journaled.errors",
    "ActorsError": "journaled.errors",
    "AgentContext": "journaled.actors.steps",
    "AgentResult": "journaled.events.plans",
    "AppendOutcomeUnknown": "journaled.errors",
    "AsyncAgentContext": "journaled.actors.steps",
    "Budget": "journaled.events.orchestration",
    "Clarify": "journaled.events.orchestration",
    "ConcurrencyConflict": "journaled.errors",
    "ConfigurationError": "journaled.errors",
    "CorruptEvent": "journaled.errors",
    "Deletion": "journaled.events.messages",
    "DomainEvent": "journaled.events.base",
    "Embedder": "journaled.memory",
    "Event": "journaled.events.base",
    "EventsError": "journaled.errors",
    "IndexTorn": "journaled.errors",
    "ExecuteResult": "journaled.events.plans",
    "Fact": "journaled.events.memory",
    "Gap": "journaled.events.orchestration",
    "Gaps": "journaled.events.orchestration",
    "InvalidArgument": "journaled.errors",
    "InvalidFact": "journaled.errors",
    "JournalBusy": "journaled.errors",
    "JournalClosed": "journaled.errors",
    "JournalFull": "journaled.errors",
    "JournalReadOnly": "journaled.errors",
    "JournalUnavailable": "journaled.errors",
    "JournalHandle": "journaled.runtime",
    "JournalUnreadable": "journaled.errors",
    "JournalUrlError": "journaled.errors",
    "JournaledError": "journaled.errors",
    "Limits": "journaled.events.plans",
    "Lineage": "journaled.events.fork",
    "Memory": "journaled.memory",
    "MemoryView": "journaled.memory",
    "NeedsInput": "journaled.actors.steps",
    "Observation": "journaled.events.plans",
    "OrganizationNotConfigured": "journaled.errors",
    "Outcome": "journaled.events.orchestration",
    "Plan": "journaled.events.plans",
    "PlanRejected": "journaled.events.errors",
    "Problem": "journaled.events.journal",
    "RememberInterrupted": "journaled.actors.errors",
    "Retry": "journaled.events.plans",
    "RunComparison": "journaled.events.fork",
    "RunDiff": "journaled.events.plans",
    "RunHandle": "journaled.actors.runs",
    "RunNotFound": "journaled.actors.errors",
    "RunNotPurgeable": "journaled.actors.errors",
    "RunNotResumable": "journaled.actors.errors",
    "RunOwnedElsewhere": "journaled.actors.errors",
    "RunState": "journaled.events.plans",
    "RunSummary": "journaled.events.run_summaries",
    "Runs": "journaled.actors.runs",
    "Runtime": "journaled.runtime",
    "RuntimeClosed": "journaled.actors.errors",
    "ScrubPending": "journaled.errors",
    "Stale": "journaled.events.provenance",
    "StatusChange": "journaled.events.plans",
    "Step": "journaled.events.plans",
    "StepComparison": "journaled.events.fork",
    "UnknownEventType": "journaled.errors",
    "UnreadableEvent": "journaled.errors",
    "Use": "journaled.events.provenance",
    "VerifyReport": "journaled.events.journal",
    "open": "journaled.runtime",
}
"""Where each public name lives: it is imported on first use (T4, ADR 0037)."""


if not TYPE_CHECKING:  # type checkers see the names imported above, so a misspelling is an error

    def __getattr__(name: str) -> Any:
        # Every public name loads on first use, so `import journaled` costs only this module
        # (T4): a CLI reading a journal never starts the actor system or imports rich for --json.
        home = _HOMES.get(name)
        if home is not None:
            value = getattr(importlib.import_module(home), name)
        elif not name.startswith("_") and importlib.util.find_spec(f"journaled.{name}"):
            value = importlib.import_module(f"journaled.{name}")  # a submodule: journaled.errors
        else:
            raise AttributeError(f"module 'journaled' has no attribute {name!r}")
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "ActorTimeout",
    "ActorsError",
    "AgentContext",
    "AgentResult",
    "AppendOutcomeUnknown",
    "AsyncAgentContext",
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
    "IndexTorn",
    "InvalidArgument",
    "InvalidFact",
    "JournalBusy",
    "JournalClosed",
    "JournalFull",
    "JournalHandle",
    "JournalReadOnly",
    "JournalUnavailable",
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
    "RememberInterrupted",
    "Retry",
    "RunComparison",
    "RunDiff",
    "RunHandle",
    "RunNotFound",
    "RunNotPurgeable",
    "RunNotResumable",
    "RunOwnedElsewhere",
    "RunState",
    "RunSummary",
    "Runs",
    "Runtime",
    "RuntimeClosed",
    "ScrubPending",
    "Stale",
    "StatusChange",
    "Step",
    "StepComparison",
    "UnknownEventType",
    "UnreadableEvent",
    "Use",
    "VerifyReport",
    "aio",
    "open",
]
