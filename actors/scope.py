"""The scope actor: one physical scope's facts and index, folded from the events it is told.

The state lives on a :class:`ScopeShelf` that the actor shares with the memory door, so that a
search can read every scope in place, on the caller's thread, when no scope has a message
queued or in hand (ADR 0053). Otherwise reads are messages to the actors, as always.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import msgspec
import pykka

from journaled.events.memory import FactRemembered
from journaled.events.memory_state import SCOPE_SNAPSHOT_DECODER, ScopeState, combine
from journaled.events.messages import (
    All,
    Apply,
    Candidates,
    ExportScope,
    Get,
    Links,
    LinksAnswer,
    RestoreScope,
    SearchScore,
    SearchStats,
    WithKey,
)

__all__ = ["ScopeActor", "ScopeShelf"]

_ENCODER = msgspec.msgpack.Encoder()


class _CountingInbox(queue.SimpleQueue[Any]):
    """A scope actor's inbox (C, as the executor's) counting what was put into it."""

    def __init__(self) -> None:
        super().__init__()
        self._count = threading.Lock()
        self.puts = 0
        """Messages put so far, pykka's stop included; counted before each is queued."""

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Count the message, then queue it."""
        with self._count:
            self.puts += 1
        super().put(item, block, timeout)


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
        self.lock = lock if lock is not None else threading.Condition()
        self.done = 0
        """Messages the actor finished (or gave up on), counted under :attr:`lock`."""
        self.broken = False
        """A change failed part way and the state may hold half of it: it is never read in place
        again (pykka stops an actor whose told message raised, so reads by message fail)."""
        self.inbox: _CountingInbox | None = None

    @property
    def settled(self) -> bool:
        """Whether the actor finished every message put into its inbox; read holding the lock."""
        inbox = self.inbox
        return inbox is not None and not self.broken and inbox.puts == self.done


class ScopeActor(pykka.ThreadingActor):
    """Hold one physical scope's facts and index; fold events; answer reads."""

    use_daemon_thread = True
    """A program that ends without ``close()`` must still exit; the runtime's exit hook drains
    and closes first (R3)."""

    _create_actor_inbox = staticmethod(_CountingInbox)

    def __init__(self, shelf: ScopeShelf) -> None:
        super().__init__()
        self.shelf = shelf
        assert isinstance(self.actor_inbox, _CountingInbox)
        shelf.inbox = self.actor_inbox

    @property
    def state(self) -> ScopeState:
        """The scope's state, on the shared shelf."""
        return self.shelf.state

    def on_receive(self, message: object) -> object:
        """Handle one message holding the shelf's lock, and count it finished."""
        shelf = self.shelf
        with shelf.lock:
            try:
                return self._handle(message)
            except BaseException:
                shelf.broken = shelf.broken or isinstance(message, Apply | RestoreScope)
                raise
            finally:
                shelf.done += 1
                if shelf.settled:
                    shelf.lock.notify_all()

    def _handle(self, message: object) -> object:
        state = self.shelf.state
        match message:
            case Apply(events=events, texts=texts):
                for data in events:
                    text = texts.get(data.fact_id) if isinstance(data, FactRemembered) else None
                    state.apply(data, text)
                return None
            case Get(fact_id=fact_id):
                return state.get(fact_id)
            case All():
                return state.all()
            case WithKey(conflict_key=key):
                return [(f, state.superseder_until(f.id)) for f in state.with_key(key)]
            case Links(fact_id=fact_id):
                return LinksAnswer(
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
            case RestoreScope(data=data):
                self.shelf.state = ScopeState.restore(SCOPE_SNAPSHOT_DECODER.decode(data))
                return None
        raise TypeError(f"scope actor got an unknown message {type(message).__name__}")
