"""The scope actor: one physical scope's facts and index, folded from the events it is told.

The state lives on a :class:`ScopeShelf` that the actor shares with the memory door, so that a
search can read every scope in place, on the caller's thread, when no scope has a message
queued or in hand (ADR 0053). Otherwise reads are messages to the actors, as always.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import msgspec
import pykka

from journaled.actors.directory import CountingInbox
from journaled.actors.errors import MemoryBehind
from journaled.events.interrupts import interrupts_deferred
from journaled.events.memory import FactRemembered
from journaled.events.memory_state import ScopeState, combine
from journaled.events.messages import (
    All,
    Apply,
    Candidates,
    ExportScope,
    Get,
    RestoreScope,
    SearchScore,
    SearchStats,
    SupersessionLinks,
    SupersessionLinksAnswer,
    WithKey,
)

__all__ = [
    "UNSETTLED",
    "ScopeActor",
    "ScopeShelf",
    "Unsettled",
    "fold",
    "read_in_place",
]

T = TypeVar("T")

log = logging.getLogger("journaled.memory")

_ENCODER = msgspec.msgpack.Encoder()


class FoldMark:
    """How far the memory writer has queued its folds for the scopes: a journal position.

    Set under the scopes' lock once every fold up to it is queued, so a read begun after it was
    taken (in place once settled, or by message behind those folds) reflects at least that
    position: a change after it is one the read may not have seen (ADR 0062).
    """

    __slots__ = ("position",)

    def __init__(self) -> None:
        self.position = 0


class ScopeShelf:
    """One physical scope's state, kept by its actor and readable in place (ADR 0053).

    The actor handles every message holding ``lock``, which all scopes of one memory share with
    the writer's sends, and counts each message it finished, notifying the lock's waiters. A
    reader holding the lock reads in place only when every scope is :attr:`settled` (each
    finished all that was put into its inbox). Since the writer queues a command's folds for
    all its scopes under the same lock, before it answers the command, a reader in place sees
    each command whole or not at all, and a read asked after a write returned sees it (a fold
    still queued unsettles its scope).
    """

    def __init__(self, physical: str, lock: threading.Condition | None = None) -> None:
        self.state = ScopeState(physical)
        # What the scope folds is indexed by the next search, not as it comes: the open's fold
        # of the whole log (ADR 0056) and each remember after it (ADR 0091).
        self.state.defer_index()
        self.lock = lock if lock is not None else threading.Condition()
        self.done = 0
        """Messages the actor finished (or gave up on), counted under :attr:`lock`."""
        self._failed = False
        self.stale = False
        """The writer is rebuilding memory from the journal, or could not finish: the state is
        empty or partial, and is read neither in place nor by message until it is whole."""
        self.inbox: CountingInbox | None = None

    @property
    def broken(self) -> bool:
        """A fold failed part way, or building the deferred index stopped part way through a
        fact (ADR 0056), and the state may hold half of it, or a posting restored from the
        snapshot cannot be read (ADR 0060): until a restore gives it a whole
        state again, it is read neither in place nor by message, and the writer rebuilds memory
        (ADR 0053). The index's half is seen by everyone at once, whatever interrupted whom."""
        return self._failed or self.state.torn or self.state.index.unreadable

    @broken.setter
    def broken(self, failed: bool) -> None:
        self._failed = failed

    @property
    def settled(self) -> bool:
        """Whether the actor finished every message put into its inbox; read holding the lock."""
        inbox = self.inbox
        return inbox is not None and not self.broken and inbox.puts == self.done

    def fold_here(self, apply: Apply) -> bool:
        """Fold ``apply`` on this thread if the scope is settled, as its actor would; call it
        holding :attr:`lock`. Returns False, folding nothing, if the actor must be told instead.

        A fold that raises part way marks the shelf broken (until a restore) and re-raises.
        """
        if not self.settled:
            return False
        try:
            fold(self.state, apply)
        except BaseException:
            self.broken = True
            raise
        return True


class Unsettled:
    """A scope had a message queued or in hand: ask its actor instead (ADR 0053)."""


UNSETTLED = Unsettled()
"""What :func:`read_in_place` answers when the scopes stayed busy."""


def read_in_place(
    shelves: Sequence[ScopeShelf], read: Callable[[list[ScopeState]], T], wait: float
) -> T | Unsettled:
    """Read every scope's state on this thread once no scope actor has a message queued or in
    hand, waiting up to ``wait`` seconds for that; else answer :data:`UNSETTLED`, and the caller
    asks the actors (ADR 0053).

    Holding the scopes' lock keeps their actors and the writer's sends out for the read, so the
    scopes are read as of one moment, each command's changes whole or not at all. The shelves
    share one lock; none at all answers :data:`UNSETTLED`.
    """
    if not shelves:
        return UNSETTLED
    lock = shelves[0].lock

    def behind() -> bool:
        return any(shelf.broken or shelf.stale for shelf in shelves)

    def settled() -> bool:
        return all(shelf.settled for shelf in shelves)

    # The scopes' lock is taken on the reader's thread: Ctrl-C waits for it (ADR 0076).
    with interrupts_deferred(), lock:
        if not settled() and wait > 0:
            lock.wait_for(lambda: behind() or settled(), wait)
        # Checked after any wait: a rebuild may have begun meanwhile, its restores settling.
        if behind():
            return UNSETTLED  # asked by message, such a scope says what is wrong
        if settled():
            return read([shelf.state for shelf in shelves])
    return UNSETTLED


def fold(state: ScopeState, apply: Apply) -> None:
    """Fold one :class:`Apply`'s events into a scope's state."""
    texts = apply.texts
    for data in apply.events:
        state.apply(data, texts.get(data.fact_id) if isinstance(data, FactRemembered) else None)


class ScopeActor(pykka.ThreadingActor):
    """Hold one physical scope's facts and index; fold events; answer reads."""

    use_daemon_thread = True
    """A program that ends without ``close()`` must still exit; the runtime's exit hook drains
    and closes first (R3)."""

    _create_actor_inbox = staticmethod(CountingInbox)

    def __init__(self, shelf: ScopeShelf) -> None:
        super().__init__()
        self.shelf = shelf
        assert isinstance(self.actor_inbox, CountingInbox)
        shelf.inbox = self.actor_inbox

    def on_receive(self, message: object) -> object:
        """Handle one message holding the shelf's lock, and count it finished.

        A fold that fails marks the shelf broken and is logged, not raised: the actor lives to
        take the restore that the writer's rebuild sends (it rebuilds on seeing a broken shelf).
        """
        shelf = self.shelf
        with shelf.lock:
            try:
                return self._handle(message)
            except Exception:
                if isinstance(message, Apply | RestoreScope):
                    shelf.broken = True
                if isinstance(message, Apply):
                    log.exception("memory scope %s could not fold a change", shelf.state.physical)
                    return None
                raise
            finally:
                shelf.done += 1
                if shelf.settled:
                    shelf.lock.notify_all()

    def _handle(self, message: object) -> object:
        state = self.shelf.state
        if self.shelf.broken and not isinstance(message, RestoreScope):
            if isinstance(message, Apply):
                return None  # folded onto half a change it means nothing: a rebuild replays it
            raise MemoryBehind(
                f"memory scope {state.physical} failed to fold a change and holds part of it: "
                "it answers nothing until memory is rebuilt from the journal"
            )
        if self.shelf.stale and not isinstance(message, Apply | RestoreScope):
            raise MemoryBehind(
                f"memory scope {state.physical} is being rebuilt from the journal: it answers "
                "no read until it is whole"
            )
        match message:
            case Apply():
                fold(state, message)
                return None
            case Get(fact_id=fact_id):
                return state.get(fact_id)
            case All():
                return state.all()
            case WithKey(conflict_key=key):
                return [(f, state.superseder_until(f.id)) for f in state.with_key(key)]
            case SupersessionLinks(fact_id=fact_id):
                return SupersessionLinksAnswer(
                    listing=tuple(state.listing(fact_id)),
                    superseded=tuple(state.superseded_by(fact_id)),
                )
            case SearchStats(query=query, score_alone=alone):
                stats = state.stats(query)
                if alone and stats.n_docs and any(stats.df.values()):
                    idfs, avgdl, _ = combine([stats], query.terms)
                    hits = tuple(state.score(query, idfs, avgdl))
                    return msgspec.structs.replace(stats, hits=hits)
                return stats
            case SearchScore(query=query, idfs=idfs, avgdl=avgdl):
                return state.score(query, idfs, avgdl)
            case Candidates(query=query):
                return state.candidates(query)
            case ExportScope():
                return _ENCODER.encode(state.export())
            case RestoreScope(state=snapshot):
                restored = ScopeState.restore(snapshot)  # with its index: nothing pending
                restored.defer_index()  # what comes after it, as after any open (ADR 0091)
                self.shelf.state = restored
                self.shelf.broken = False  # a whole state again, whatever a fold left before
                return None
        raise TypeError(f"scope actor got an unknown message {type(message).__name__}")
