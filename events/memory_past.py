"""Memory as it was at a journal position, folded cheaply for one view (M12, T1).

A view of the past is usually read a few times and searched rarely, so :class:`LazyScopeState`
folds facts, supersessions, keys and erasures as :class:`ScopeState` does but defers its search
index and the plain/conditional classes until a search needs them: folding is then a dict
update per event instead of tokenising every text. Building them later classifies each fact
the fold touched, which gives the same index and totals as classifying as the events came
(the classes depend on the facts as they are now, and BM25 scores do not depend on the order
documents entered the index).

:func:`restore_memory` starts a past state from memory's snapshot (ADR 0009's cache of the
fold) when it lies at or before the position, so only the events after it are folded.

Nothing here reads the journal, a clock or user code.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from journaled.events.memory import Fact
from journaled.events.memory_state import (
    MEMORY_SNAPSHOT_SCHEMA,
    SCOPE_SNAPSHOT_DECODER,
    MemorySnapshot,
    MemoryState,
    Query,
    ScopeState,
    Stats,
)

__all__ = ["LazyScopeState", "past_memory", "restore_memory"]


class LazyScopeState(ScopeState):
    """A scope's state whose search index and classes are built on the first search."""

    def __init__(self, physical: str) -> None:
        super().__init__(physical)
        self._touched: dict[str, None] = {}
        """Facts whose class was left to settle, in the order the fold touched them."""
        self._settling = threading.Lock()
        """Held while settling: a second search waits for the whole index, not a part of it."""

    def _classify(self, fact: Fact) -> None:
        # Unclassifying stays eager: it only reads what a settled classification left, which
        # an untouched fact still has and a touched one never got.
        self._touched[fact.id] = None

    def _settle(self) -> None:
        """Classify and index every fact the fold touched (once: later calls find none)."""
        with self._settling:
            touched, self._touched = self._touched, {}
            for fact_id in touched:
                fact = self.facts.get(fact_id)
                if fact is not None:  # a fact deleted or purged since left the index then
                    ScopeState._classify(self, fact)

    def stats(self, query: Query) -> Stats:
        """Return N, total length and document frequencies, building the index first."""
        self._settle()
        return super().stats(query)

    def score(
        self, query: Query, idfs: Mapping[str, float], avgdl: float
    ) -> list[tuple[float, Fact]]:
        """Return this scope's top hits, building the index first."""
        self._settle()
        return super().score(query, idfs, avgdl)


def past_memory(physical: Sequence[str], organization: str | None) -> MemoryState:
    """Return an empty memory state whose scopes build their search index lazily."""
    state = MemoryState(physical, organization)
    state.scopes = {p: LazyScopeState(p) for p in physical}
    return state


def restore_memory(
    snapshot: MemorySnapshot, physical: Sequence[str], organization: str | None
) -> MemoryState | None:
    """Return memory's state at its snapshot's position, or None when the snapshot does not fit.

    It fits when it is of this schema, for this organization and for exactly these physical
    scopes. Checking its texts against the journal's payloads (R7) is the caller's.
    """
    if (
        snapshot.schema != MEMORY_SNAPSHOT_SCHEMA
        or snapshot.organization != organization
        or set(snapshot.scopes) != set(physical)
    ):
        return None
    state = MemoryState(physical, organization)
    state.scopes = {
        p: LazyScopeState.restore(SCOPE_SNAPSHOT_DECODER.decode(snapshot.scopes[p]))
        for p in physical
    }
    state.route = dict(snapshot.route)
    state.position = snapshot.position
    return state
