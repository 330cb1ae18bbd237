"""Memory as it was at a journal position, folded cheaply for one view (M12, T1).

A view of the past is usually read a few times and searched rarely, so its scopes defer their
search index and the plain/conditional classes until a search needs them
(:meth:`ScopeState.defer_index`): folding is then a dict update per event instead of tokenising
every text.

:func:`restore_memory` starts a past state from memory's snapshot (ADR 0009's cache of the
fold) when it lies at or before the position, so only the events after it are folded.

Nothing here reads the journal, a clock or user code.
"""

from __future__ import annotations

from collections.abc import Sequence

from journaled.events.memory_state import (
    MEMORY_SNAPSHOT_SCHEMA,
    SCOPE_SNAPSHOT_DECODER,
    MemorySnapshot,
    MemoryState,
    ScopeState,
)

__all__ = ["past_memory", "restore_memory"]


def past_memory(physical: Sequence[str], organization: str | None) -> MemoryState:
    """Return an empty memory state whose scopes build their search index lazily."""
    state = MemoryState(physical, organization)
    for scope in state.scopes.values():
        scope.defer_index()
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
        p: ScopeState.restore(SCOPE_SNAPSHOT_DECODER.decode(snapshot.scopes[p])) for p in physical
    }
    for scope in state.scopes.values():
        scope.defer_index()
    state.route = dict(snapshot.route)
    state.position = snapshot.position
    return state
