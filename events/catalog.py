"""Every event type this release stores, and the codec that reads them all."""

from __future__ import annotations

from typing import Any

from journaled.events.base import DomainEvent
from journaled.events.codec import Codec, tag_of
from journaled.events.memory import MEMORY_EVENTS
from journaled.events.orchestration import ORCHESTRATION_EVENTS
from journaled.events.runs import POSITIONAL_RUN_EVENTS, RUN_EVENTS

STORED_EVENTS: tuple[type[DomainEvent], ...] = (*MEMORY_EVENTS, *RUN_EVENTS, *ORCHESTRATION_EVENTS)

NOT_MEMORY: tuple[str, ...] = ("run.", "orchestration.")
"""Topic prefixes of every stored event that memory does not fold: memory's replay leaves them
to the database, so a journal of many runs and few facts opens at the speed of its facts. An
event of any other topic, even one no release knows, still reaches memory's decoder."""


def _content_inline(raw: dict[str, Any]) -> dict[str, Any]:
    # Version 1 of a content event held its content inline; version 2 has the same fields and
    # keeps the content in a forgettable payload, so the old payload reads as it is (ADR 0018).
    return raw


def codec() -> Codec:
    """Return a codec for every stored event type (with their upcasters, when there are any)."""
    built = Codec(STORED_EVENTS, positional=POSITIONAL_RUN_EVENTS)
    for cls in STORED_EVENTS:
        if cls.has_content:
            built.register_upcaster(tag_of(cls), 1, _content_inline)
    return built
