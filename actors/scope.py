"""The scope actor: one physical scope's facts and index, folded from the events it is told."""

from __future__ import annotations

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

__all__ = ["ScopeActor"]

_ENCODER = msgspec.msgpack.Encoder()


class ScopeActor(pykka.ThreadingActor):
    """Hold one physical scope's facts and index; fold events; answer reads."""

    use_daemon_thread = True
    """A program that ends without ``close()`` must still exit; the runtime's exit hook drains
    and closes first (R3)."""

    def __init__(self, physical: str) -> None:
        super().__init__()
        self.state = ScopeState(physical)

    def on_receive(self, message: object) -> object:
        """Dispatch one message."""
        state = self.state
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
                self.state = ScopeState.restore(SCOPE_SNAPSHOT_DECODER.decode(data))
                return None
        raise TypeError(f"scope actor got an unknown message {type(message).__name__}")
