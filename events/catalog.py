"""Every event type this release stores, and the codec that reads them all."""

from __future__ import annotations

from events.base import DomainEvent
from events.codec import Codec
from events.memory import MEMORY_EVENTS
from events.orchestration import ORCHESTRATION_EVENTS
from events.runs import RUN_EVENTS

STORED_EVENTS: tuple[type[DomainEvent], ...] = (*MEMORY_EVENTS, *RUN_EVENTS, *ORCHESTRATION_EVENTS)


def codec() -> Codec:
    """Return a codec for every stored event type (with their upcasters, when there are any)."""
    return Codec(STORED_EVENTS)
