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

import bisect
import threading
from collections.abc import Sequence

from journaled.events.memory_state import (
    MEMORY_SNAPSHOT_SCHEMA,
    SCOPE_SNAPSHOT_DECODER,
    MemorySnapshot,
    MemoryState,
    ScopeState,
)

__all__ = ["Erasures", "PastCheckpoints", "copy_past", "past_memory", "restore_memory"]

Erasures = tuple[int, int]
"""What tells a checkpoint that content may have been erased since it was made: the journal's
count of erasures and this process's mark (``Journal.erasures``, ``erasures_here``)."""


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


def copy_past(state: MemoryState) -> MemoryState:
    """Return a copy of a past state (folded by :func:`past_memory`, never searched).

    The copy shares the state's route (fact id -> physical scope): a fold only adds to it, the
    scope a remember names for its fact whatever the position (the organization and scopes are
    the runtime's), and an event only names facts remembered before it, so an entry for a
    later fact is never read by a fold that stops earlier. Its scopes are copied.
    """
    copy = MemoryState(list(state.scopes), state.organization)
    copy.scopes = {p: scope.copy_deferred() for p, scope in state.scopes.items()}
    copy.route = state.route
    copy.position = state.position
    return copy


class PastCheckpoints:
    """Memory as it was at some journal positions, kept in this process to start views of the
    past from (T1): a view at a position copies the nearest state at or before it and folds the
    events after it, instead of folding the journal from its start.

    The journal stays the truth: a checkpoint is a copy of the plain fold at its position, made
    while some view folded past it, never read from storage, never handed out (a view gets a
    copy). It holds facts' texts, so its owner drops every checkpoint once the journal counts
    an erasure it has not seen (R2). Checkpoints lie at least :attr:`every` positions apart;
    when the facts they hold pass :attr:`budget`, every other one is dropped and the spacing
    doubles. Thread-safe.
    """

    FIRST_FOLD_CHECKPOINTS = 16

    def __init__(self, budget: int = 400_000, least_every: int = 256) -> None:
        self.budget = budget
        """How many facts (and touched ids waiting for a search's index) all checkpoints may
        hold together (about 90 bytes each); one bigger than that alone is not kept."""
        self.least_every = least_every
        self.every = least_every
        """Positions between two checkpoints, at least."""
        self._held: list[tuple[int, MemoryState, int]] = []
        """(position, state, its time), by position."""
        self._erasures: Erasures | None = None
        self._settled = False
        """Whether a first view's fold ended with checkpoints held (see :meth:`keep`)."""
        self._lock = threading.Lock()

    def nearest(self, position: int, erasures: Erasures) -> tuple[MemoryState, int] | None:
        """Return a copy of the checkpoint nearest at or before ``position`` and its time, or
        None; every checkpoint is dropped first when ``erasures`` is not the count they saw."""
        with self._lock:
            if erasures != self._erasures:
                self._held.clear()
                self._erasures = erasures
                self._settled = False
                self.every = self.least_every
                return None
            at = bisect.bisect_right([p for p, _, _ in self._held], position)
            if not at:
                return None
            _, state, now = self._held[at - 1]
            return copy_past(state), now

    def spacing(self, position: int, upto: int) -> tuple[int, int | None]:
        """Return how far apart checkpoints lie and the first one after ``position`` (None:
        none): a fold from ``position`` to ``upto`` leaves one wherever it is that far from
        both sides. With none held, the spacing is at least a sixteenth of that fold, so a
        first view pays for some sixteen copies, not one every few hundred events."""
        with self._lock:
            positions = [p for p, _, _ in self._held]
            if not positions:
                self.every = max(self.every, (upto - position) // self.FIRST_FOLD_CHECKPOINTS)
            at = bisect.bisect_right(positions, position)
            return self.every, positions[at] if at < len(positions) else None

    def keep(self, state: MemoryState, now: int, erasures: Erasures) -> None:
        """Keep a copy of ``state`` (folded to ``state.position``, at time ``now``), folded
        while the journal counted ``erasures``.

        Past the budget, the first checkpoints thin out (every other one dropped, the spacing
        doubled); once there are others, a new one that would not fit is not kept, so views
        never pay for copies dropped again at once.
        """
        weight = _weight(state)
        with self._lock:
            if erasures != self._erasures:
                return  # an erasure since: the next view starts over
            positions = [p for p, _, _ in self._held]
            at = bisect.bisect_left(positions, state.position)
            if at < len(positions) and positions[at] == state.position:
                return
            held = sum(_weight(s) for _, s, _ in self._held)
            if held + weight > self.budget and self._settled:
                return
            self._held.insert(at, (state.position, copy_past(state), now))
            while self._held and sum(_weight(s) for _, s, _ in self._held) > self.budget:
                # One alone over the budget is not kept either: views then fold from the start.
                self._held = self._held[1::2]
                self.every *= 2

    def settle(self) -> None:
        """Say that the first view's fold ended: checkpoints past the budget are refused now."""
        with self._lock:
            self._settled = bool(self._held)

    def clear(self) -> None:
        """Drop every checkpoint."""
        with self._lock:
            self._held.clear()
            self._erasures = None
            self._settled = False
            self.every = self.least_every

    @property
    def positions(self) -> list[int]:
        """Return the positions held, in order (tests, the benchmark)."""
        with self._lock:
            return [p for p, _, _ in self._held]


def _weight(state: MemoryState) -> int:
    """Return what a checkpoint holds of its own: its facts, and the ids its fold touched (a
    deleted fact's too) whose indexing waits for a search; its route is shared."""
    return sum(len(s.facts) + s.pending_count for s in state.scopes.values())
