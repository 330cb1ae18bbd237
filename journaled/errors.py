"""Errors a user of ``journaled`` meets, re-exported from the layer that raises them.

::

    JournaledError
    └── ConfigurationError (ValueError)        a setting of open() that cannot be used
    EventsError                                (from the log layer)
    ├── JournalUrlError (ValueError)
    ├── JournalClosed (RuntimeError)
    ├── ConcurrencyConflict
    └── CorruptEvent (ValueError)
        └── UnknownEventType
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
    ConcurrencyConflict,
    CorruptEvent,
    EventsError,
    JournalClosed,
    JournalUrlError,
    UnknownEventType,
)


class JournaledError(Exception):
    """Root of the errors raised by the ``journaled`` package itself."""


class ConfigurationError(JournaledError, ValueError):
    """A setting of :func:`journaled.open` that cannot be used."""


__all__ = [
    "ActorTimeout",
    "ActorsError",
    "ConcurrencyConflict",
    "ConfigurationError",
    "CorruptEvent",
    "EventsError",
    "InvalidFact",
    "JournalClosed",
    "JournalUrlError",
    "JournaledError",
    "OrganizationNotConfigured",
    "RunNotFound",
    "RunNotPurgeable",
    "RunNotResumable",
    "RunOwnedElsewhere",
    "RuntimeClosed",
    "ScrubPending",
    "UnknownEventType",
]
