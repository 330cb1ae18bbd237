"""Memory events and the fact record they fold into (SPEC section 1).

Every fact is its own stream, keyed by the fact id; its single writer is the memory writer actor of
the process that holds it. A conflict key is a stream too (``key:<conflict key>``): every fact that
claims a key appends to it, so two processes remembering facts with one key at the same moment
collide there, and the loser re-decides its supersessions with the winner's fact in view (J3).

The fact's text is not in any event: it is a *forgettable payload* kept beside the event log and
written in the same transaction, so that purge (M10) can erase it without rewriting history.
"""

from __future__ import annotations

import msgspec

from journaled.events.base import DomainEvent

PHYSICAL_SCOPES: tuple[str, ...] = ("user", "project", "repository", "organization")
"""Where facts are stored. ``organization`` exists only when an organization is configured."""

KEY_STREAM_PREFIX = "key:"


def key_stream(conflict_key: str) -> str:
    """Return the stream id of a conflict key."""
    return KEY_STREAM_PREFIX + conflict_key


class Fact(msgspec.Struct, frozen=True, kw_only=True):
    """A remembered fact as the memory store holds it (a projection of its events)."""

    id: str
    """Collision-safe id, unique across processes and runtimes."""
    scope: str
    """Logical scope the fact was remembered into (``session``, ``project``, ``user``, …)."""
    text: str
    """The fact, with secrets redacted before it was ever appended."""
    domain: str | None = None
    """Optional domain used by search filters."""
    confidence: float = 1.0
    """Confidence in [0, 1]."""
    conflict_key: str | None = None
    """Facts sharing a conflict key supersede each other: the newest wins."""
    source: str | None = None
    """Where the fact came from (a URL, a run id, a person)."""
    valid_from: int | None = None
    """Epoch ms before which the fact is not yet valid."""
    valid_until: int | None = None
    """Epoch ms after which the fact has expired."""
    created_at: int
    """Epoch ms when the fact was remembered."""
    superseded_by: str | None = None
    """Id of the fact that superseded this one, if any."""
    supersedes: tuple[str, ...] = ()
    """Ids of the facts this one superseded."""

    @property
    def physical(self) -> str:
        """Return the physical scope that stores this fact (M1)."""
        return physical_scope(self.scope)


def physical_scope(scope: str) -> str:
    """Map a logical scope to its physical scope (M1).

    ``organization`` must be matched before the ``project`` catch-all, or organization facts would
    silently land in ``project``.
    """
    if scope in ("user", "repository", "organization"):
        return scope
    return "project"


class FactRemembered(DomainEvent, frozen=True, kw_only=True, tag="memory.fact-remembered"):
    """A fact was remembered. Its text is the stream's forgettable payload."""

    fact_id: str
    scope: str
    organization: str | None = None
    """The configured organization, for facts stored in the ``organization`` scope."""
    domain: str | None = None
    confidence: float = 1.0
    conflict_key: str | None = None
    source: str | None = None
    valid_from: int | None = None
    valid_until: int | None = None
    supersedes: tuple[str, ...] = ()
    """Facts superseded by this one in the same atomic append (M3)."""
    redacted: tuple[str, ...] = ()
    """Kinds of secret that were removed from the text before it was appended (M9)."""
    run_id: str | None = None
    """The run whose step remembered the fact through ``ctx.memory`` (P1)."""
    step_id: str | None = None
    """That step."""


def remembered_fact(event: FactRemembered, text: str) -> Fact:
    """Return the fact a remember's event makes, with its (redacted) text: the one mapping the
    writer's answer and every fold share."""
    return Fact(
        id=event.fact_id,
        scope=event.scope,
        text=text,
        domain=event.domain,
        confidence=event.confidence,
        conflict_key=event.conflict_key,
        source=event.source,
        valid_from=event.valid_from,
        valid_until=event.valid_until,
        created_at=event.at,
        supersedes=event.supersedes,
    )


class FactSuperseded(DomainEvent, frozen=True, kw_only=True, tag="memory.fact-superseded"):
    """A fact was superseded by a newer fact claiming the same conflict key (M3)."""

    fact_id: str
    by: str
    """The superseding fact."""
    conflict_key: str
    by_valid_until: int | None = None
    """The superseder's expiry: once it passes, this fact is visible again (M5)."""


class FactUnlinked(DomainEvent, frozen=True, kw_only=True, tag="memory.fact-unlinked"):
    """A deleted fact left this fact's ``supersedes``; its heirs may be gained (M8)."""

    fact_id: str
    deleted: str
    """The deleted fact this one no longer lists."""
    gained: tuple[str, ...] = ()
    """Facts the deleted one had superseded, now superseded by this fact (the chain heals)."""


class FactRelinked(DomainEvent, frozen=True, kw_only=True, tag="memory.fact-relinked"):
    """This fact's superseder was deleted; it is now superseded by that fact's superseder (M8)."""

    fact_id: str
    deleted: str
    to: str
    to_valid_until: int | None = None
    """The new superseder's expiry (M5)."""


class FactRestored(DomainEvent, frozen=True, kw_only=True, tag="memory.fact-restored"):
    """This fact's superseder was deleted and had no superseder itself: the fact is active again."""

    fact_id: str
    deleted: str


class FactDeleted(DomainEvent, frozen=True, kw_only=True, tag="memory.fact-deleted"):
    """A fact was deleted; the cascade's events are in the same atomic append (M8, J2)."""

    fact_id: str
    relationships: int
    """How many other facts were re-linked, restored or stripped by the cascade."""


class FactPurged(DomainEvent, frozen=True, kw_only=True, tag="memory.fact-purged"):
    """A fact's text was erased from the journal (M10). The events remain; the payload is gone."""

    fact_id: str
    reason: str | None = None


class ConflictKeyClaimed(DomainEvent, frozen=True, kw_only=True, tag="memory.conflict-key-claimed"):
    """A fact claimed a conflict key; concurrent claims collide on the key's stream (J3)."""

    conflict_key: str
    fact_id: str


FACT_EVENTS: tuple[type[DomainEvent], ...] = (
    FactRemembered,
    FactSuperseded,
    FactUnlinked,
    FactRelinked,
    FactRestored,
    FactDeleted,
    FactPurged,
)
MEMORY_EVENTS: tuple[type[DomainEvent], ...] = (*FACT_EVENTS, ConflictKeyClaimed)

FactEvent = (
    FactRemembered
    | FactSuperseded
    | FactUnlinked
    | FactRelinked
    | FactRestored
    | FactDeleted
    | FactPurged
)
"""Any event about one fact: a tagged union, so that a message holding one decodes to its type."""
