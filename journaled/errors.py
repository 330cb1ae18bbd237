"""Errors a user of ``journaled`` meets, re-exported from the layer that raises them.

::

    JournaledError
    ├── ConfigurationError (ValueError)        a setting of open() that cannot be used
    └── InvalidArgument (ValueError)           an argument of a call that cannot be used
    EventsError                                (from the log layer)
    ├── JournalUrlError (ValueError)
    │   └── JournalUnreadable                  the file or database is no journal
    ├── JournalClosed (RuntimeError)
    ├── JournalBusy                            another writer held the lock past lock_wait
    ├── JournalFull                            the disk holding the journal is full
    ├── JournalReadOnly                        the journal's file cannot be written
    ├── JournalUnavailable                     the database was unreachable; nothing stored
    │   └── AppendOutcomeUnknown               ... after an append was sent: it may be stored
    ├── ConcurrencyConflict
    ├── CorruptEvent (ValueError)
    │   └── UnknownEventType
    ├── UnreadableEvent (ValueError)           an append refused: it would not read back
    └── IndexTorn (RuntimeError)               an as_of view's index was left half built
    ActorsError                                (from the live layer)
    ├── InvalidFact (ValueError)
    │   └── OrganizationNotConfigured
    ├── ActorTimeout (TimeoutError)
    ├── RunNotFound (KeyError)
    ├── RuntimeClosed (RuntimeError)
    ├── RunNotResumable (ValueError)
    │   └── RunOwnedElsewhere
    ├── RunNotPurgeable (ValueError)
    └── ScrubPending                           erased bytes still in the files (retried)
"""

from __future__ import annotations

from journaled.actors.errors import (
    ActorsError,
    ActorTimeout,
    InvalidFact,
    OrganizationNotConfigured,
    RunNotFound,
    RunNotPurgeable,
    RunNotResumable,
    RunOwnedElsewhere,
    RuntimeClosed,
    ScrubPending,
)
from journaled.events.errors import (
    AppendOutcomeUnknown,
    ConcurrencyConflict,
    CorruptEvent,
    EventsError,
    IndexTorn,
    JournalBusy,
    JournalClosed,
    JournalFull,
    JournalReadOnly,
    JournalUnavailable,
    JournalUnreadable,
    JournalUrlError,
    PlanRejected,
    UnknownEventType,
    UnreadableEvent,
)


class JournaledError(Exception):
    """Root of the errors raised by the ``journaled`` package itself."""


class ConfigurationError(JournaledError, ValueError):
    """A setting of :func:`journaled.open` that cannot be used."""


class InvalidArgument(JournaledError, ValueError):
    """An argument of a call that cannot be used; it names the argument. Nothing was appended."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field} {problem}")

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuilt from its fields: the default rebuilds from ``args``, the one message.
        return (type(self), (self.field, self.problem))


__all__ = [
    "ActorTimeout",
    "ActorsError",
    "AppendOutcomeUnknown",
    "ConcurrencyConflict",
    "ConfigurationError",
    "CorruptEvent",
    "EventsError",
    "IndexTorn",
    "InvalidArgument",
    "InvalidFact",
    "JournalBusy",
    "JournalClosed",
    "JournalFull",
    "JournalReadOnly",
    "JournalUnavailable",
    "JournalUnreadable",
    "JournalUrlError",
    "JournaledError",
    "OrganizationNotConfigured",
    "PlanRejected",
    "RunNotFound",
    "RunNotPurgeable",
    "RunNotResumable",
    "RunOwnedElsewhere",
    "RuntimeClosed",
    "ScrubPending",
    "UnknownEventType",
    "UnreadableEvent",
]
