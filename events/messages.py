"""Requests the memory actors exchange (imperative, frozen, never stored), and the replies.

Only the memory writer turns requests into events, so each stream has one writer in a process and a
version conflict in the journal always means another process wrote first.

Every message is data (SPEC A4, ADR 0024): no future, callable, lock or actor reference. A request
answered later names its asker by address (``reply_to``) and a ``correlation`` id, and the answer is
a reply message carrying that id back.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from journaled.events.base import Unpackable
from journaled.events.memory import Fact, FactEvent
from journaled.events.memory_state import Query, ScopeSnapshot


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every actor message."""

    version: ClassVar[int] = 1
    """The message's schema version, printed by ``journaled schema`` beside its tag (A4). As for
    events: fields only grow (new ones with defaults); a breaking change is a new version."""


class Failure(Message, frozen=True, kw_only=True, tag="reply.failure"):
    """A request failed: the error's class name, its text, and the field it names, if any."""

    correlation: str
    error: str
    """The exception's class name, e.g. ``InvalidFact``."""
    message: str
    """Its text: the one string it was raised with, else what ``str()`` showed."""
    field: str | None = None
    attributes: dict[str, str | int | float | bool | list[str | int] | None] = {}
    """Its public attributes that are plain data (``step_id``, ``streams``, ...)."""


class Remembered(Message, frozen=True, kw_only=True, tag="memory.remembered"):
    """A remember was stored: the fact as stored (M2)."""

    correlation: str
    fact: Fact


# -- to the memory writer ------------------------------------------------------------------------


class Remember(Message, frozen=True, kw_only=True, tag="memory.remember"):
    """Store a fact, superseding the facts that claim its conflict key (M2, M3)."""

    text: str
    scope: str = "project"
    domain: str | None = None
    confidence: float | None = None
    conflict_key: str | None = None
    source: str | None = None
    valid_from: int | None = None
    valid_until: int | None = None
    run_id: str | None = None
    """The run whose step remembers the fact through ``ctx.memory`` (P1), recorded with it."""
    step_id: str | None = None
    reply_to: str | None = None
    """The asker's address: the writer tells it :class:`Remembered` (or :class:`Failure`) once
    the fact is stored. With one, remembers that arrive together are stored in one transaction
    (group commit); without one the fact is the answer to an ask."""
    correlation: str | None = None
    deadline: float | None = None
    """Wall-clock time (``time.time()``) by which the writer must hold the journal's lock for
    this command, its caller giving up soon after (ADR 0039); past it the writer answers
    ``JournalBusy`` and appends nothing. None: the journal's own ``lock_wait``."""


class Delete(Message, frozen=True, kw_only=True, tag="memory.delete"):
    """Delete a fact and heal the supersession links around it (M8)."""

    fact_id: str
    deadline: float | None = None
    """Wall-clock time (``time.time()``) by which the writer must hold the journal's lock for
    this command, its caller giving up soon after (ADR 0039); past it the writer answers
    ``JournalBusy`` and appends nothing. None: the journal's own ``lock_wait``."""


class Purge(Message, frozen=True, kw_only=True, tag="memory.purge"):
    """Delete a fact and erase its text from the journal itself (M10)."""

    fact_id: str
    reason: str | None = None
    deadline: float | None = None
    """Wall-clock time (``time.time()``) by which the writer must hold the journal's lock for
    this command, its caller giving up soon after (ADR 0039); past it the writer answers
    ``JournalBusy`` and appends nothing. None: the journal's own ``lock_wait``."""


class CatchUp(Message, frozen=True, kw_only=True, tag="memory.catch-up"):
    """Fold every journal event the writer has not seen yet; answer the position reached."""

    initial: bool = False
    """The first fold after open: also check that no fact lost its text unpurged (J5)."""


class Deletion(Unpackable, frozen=True, kw_only=True):
    """What a delete did (M8)."""

    primary: bool
    """Whether the fact existed."""
    relationships: int
    """How many other facts were re-linked, restored or stripped."""


# -- to a scope actor ----------------------------------------------------------------------------


class Apply(Message, frozen=True, kw_only=True, tag="memory.apply"):
    """Fold journal events about facts of the receiving scope, with the texts of remembered ones."""

    events: tuple[FactEvent, ...]
    texts: dict[str, str] = {}


class Get(Message, frozen=True, kw_only=True, tag="memory.get"):
    """Answer the fact with this id, or None."""

    fact_id: str


class All(Message, frozen=True, kw_only=True, tag="memory.all"):
    """Answer every fact of the scope."""


class WithKey(Message, frozen=True, kw_only=True, tag="memory.with-key"):
    """Answer (fact, its superseder's expiry) for every fact claiming a conflict key."""

    conflict_key: str


class SupersessionLinks(Message, frozen=True, kw_only=True, tag="memory.links"):
    """Answer the facts listing ``fact_id`` in ``supersedes`` and those it currently supersedes."""

    fact_id: str


class SupersessionLinksAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """The facts around a fact about to be deleted."""

    listing: tuple[Fact, ...]
    superseded: tuple[Fact, ...]


class SearchStats(Message, frozen=True, kw_only=True, tag="memory.search-stats"):
    """Answer BM25 statistics over this scope's filtered candidates."""

    query: Query
    score_alone: bool = False
    """Also answer the top hits under these statistics alone (``Stats.hits``), so that a search
    whose candidates all live in one scope needs one round of asks, not two."""


class SearchScore(Message, frozen=True, kw_only=True, tag="memory.search-score"):
    """Answer this scope's top hits under global BM25 parameters."""

    query: Query
    idfs: dict[str, float]
    avgdl: float


class Candidates(Message, frozen=True, kw_only=True, tag="memory.candidates"):
    """Answer this scope's filtered candidates (for semantic ranking)."""

    query: Query


class ExportScope(Message, frozen=True, kw_only=True, tag="memory.export-scope"):
    """Answer the scope's state, encoded as a ScopeSnapshot."""


class RestoreScope(Message, frozen=True, kw_only=True, tag="memory.restore-scope"):
    """Replace the scope's state with a ScopeSnapshot, freshly decoded (it is adopted).

    An open decodes memory's snapshot once, to check its texts, and hands each scope its part
    as decoded (ADR 0058); nothing else may hold the same containers.
    """

    state: ScopeSnapshot


class SaveSnapshot(Message, frozen=True, kw_only=True, tag="memory.save-snapshot"):
    """Store a snapshot of memory at the writer's position, if enough changed since the last."""

    min_events: int = 1
    auto: bool = False
    """Sent by the writer to itself: a failure is logged instead of answered."""
