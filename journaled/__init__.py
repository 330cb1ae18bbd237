"""journaled: an event-sourced actor runtime for AI agents.

Open a runtime with :func:`open`; its ``memory`` is scoped long-term memory whose every change is an
event in one journal, so it can be audited (``why``, ``history``) and viewed as of any point.
"""

from __future__ import annotations

from events.base import DomainEvent, Event
from events.memory import Fact
from events.messages import Deletion
from journaled.errors import (
    ActorsError,
    ActorTimeout,
    ConcurrencyConflict,
    ConfigurationError,
    CorruptEvent,
    EventsError,
    InvalidFact,
    JournalClosed,
    JournaledError,
    JournalUrlError,
    OrganizationNotConfigured,
    UnknownEventType,
)
from journaled.memory import Embedder, Memory, MemoryView
from journaled.runtime import JournalHandle, Runtime, open

__all__ = [
    "ActorTimeout",
    "ActorsError",
    "ConcurrencyConflict",
    "ConfigurationError",
    "CorruptEvent",
    "Deletion",
    "DomainEvent",
    "Embedder",
    "Event",
    "EventsError",
    "Fact",
    "InvalidFact",
    "JournalClosed",
    "JournalHandle",
    "JournalUrlError",
    "JournaledError",
    "Memory",
    "MemoryView",
    "OrganizationNotConfigured",
    "Runtime",
    "UnknownEventType",
    "open",
]
