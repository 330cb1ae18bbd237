"""Semantic and hybrid ranking for ``rt.memory`` (SPEC M7; hybrid: ADR 0047).

Both rank the candidates that survived the same filters as BM25. Semantic ranking orders them by
cosine with the query's vector; hybrid fuses cosine with BM25 by a convex combination of scores.
Either falls back to BM25 — never raises, never returns silently empty — when the embedder cannot
help: no embedder, no candidates, the embedder raises, an unusable query vector, or no candidate
embedded usably.
"""

from __future__ import annotations

import math
import operator
import sqlite3
from collections.abc import Callable, Sequence
from typing import Protocol

from journaled.embedders.cache import VectorCache, digest
from journaled.events.fusion import FUSION_WINDOW, convex_fusion
from journaled.events.journal import Journal
from journaled.events.memory import Fact
from journaled.events.memory_state import Query, usable

__all__ = ["Embedder", "Semantic", "cache_path"]


class Embedder(Protocol):
    """Anything that turns texts into vectors.

    An embedder that also has a ``model`` attribute (a string naming its model) gets a vector
    cache that survives restarts beside a SQLite journal (ADR 0048); without one, vectors are
    cached for the open runtime only, since nothing tells two embedders' vectors apart.
    """

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Return one vector per text."""
        ...


def model_of(embedder: object) -> str | None:
    """Return the model an embedder names, or None when it names none."""
    model = getattr(embedder, "model", None)
    return model if isinstance(model, str) and model else None


def cache_path(journal: Journal, embedder: object) -> str | None:
    """Return where a persistent vector cache goes: beside a SQLite journal's file, or nowhere."""
    config = journal.config
    if config.backend != "sqlite" or config.path is None or model_of(embedder) is None:
        return None
    return config.path + ".vectors"


class Semantic:
    """Rank by cosine over cached fact vectors, alone or fused with BM25 (M7, ADR 0047)."""

    def __init__(self, embedder: Embedder | None, journal: Journal) -> None:
        self.embedder = embedder
        self._journal = journal
        self._model = model_of(embedder) or ""
        path = cache_path(journal, embedder) if embedder is not None else None
        try:
            self.cache = VectorCache(path)
        except (sqlite3.Error, OSError):
            # A journal read where nothing can be written: vectors last as long as the runtime.
            self.cache = VectorCache(None)

    def scores(self, text: str, candidates: Sequence[Fact]) -> list[tuple[float, Fact]] | None:
        """Return ``(cosine, fact)`` for every usably embedded candidate, or None to fall back."""
        embedder = self.embedder
        if embedder is None or not candidates:
            return None
        try:
            if self.cache.path is not None:
                self.cache.catch_up(self._journal)
            keys = {c.id: digest(c.text) for c in candidates}
            known = self.cache.get(self._model, list(keys.values()))
            need: dict[bytes, str] = {}
            for c in candidates:
                if keys[c.id] not in known:
                    need.setdefault(keys[c.id], c.text)
            if need:
                vectors = embedder.embed(list(need.values()))
                fresh = {
                    d: [float(x) for x in v]
                    for d, v in zip(need, vectors, strict=False)
                    if usable(v)
                }
                self.cache.put(
                    self._model,
                    [
                        (c.id, keys[c.id], fresh[keys[c.id]])
                        for c in candidates
                        if keys[c.id] in fresh
                    ],
                )
                known |= fresh
            query_vectors = embedder.embed([text])
            query_vector = query_vectors[0] if query_vectors else None
            docs = [(c, known[keys[c.id]]) for c in candidates if keys[c.id] in known]
            if not usable(query_vector) or not docs:
                return None
            assert query_vector is not None
            return _cosines(query_vector, docs)
        except Exception:
            return None

    def rank(
        self,
        text: str,
        query: Query,
        candidates: Sequence[Fact],
        bm25: Callable[[int], list[tuple[float, Fact]]],
    ) -> list[Fact]:
        """Return the top ``query.limit`` by cosine (> 0), ties by id; else BM25's (M7)."""
        scored = self.scores(text, candidates)
        if scored is None:
            return [f for _, f in bm25(query.limit)]
        return [f for _, f in by_cosine(scored)[: query.limit]]

    def hybrid(
        self,
        text: str,
        query: Query,
        candidates: Sequence[Fact],
        bm25: Callable[[int], list[tuple[float, Fact]]],
    ) -> list[Fact]:
        """Fuse BM25's and cosine's top ``max(limit, FUSION_WINDOW)`` by their scores.

        ``0.5 * bm25 / max(bm25) + 0.5 * cosine`` (:func:`convex_fusion`), ties by id. Falls
        back to BM25's answer exactly when semantic ranking would (M7).
        """
        if query.limit == 0:
            return []
        scored = self.scores(text, candidates)
        if scored is None:
            return [f for _, f in bm25(query.limit)]
        window = max(query.limit, FUSION_WINDOW)
        lexical = bm25(window)
        semantic = by_cosine(scored)[:window]
        by_id = {f.id: f for f in candidates} | {f.id: f for _, f in lexical}
        fused = convex_fusion([(s, f.id) for s, f in lexical], [(s, f.id) for s, f in semantic])
        return [by_id[i] for _, i in fused[: query.limit]]

    def forget(self, fact_id: str) -> None:
        """Drop a purged fact's vector (M10): from memory and from the file beside the journal."""
        self.cache.forget_facts([fact_id])


def _cosines(query: list[float], docs: list[tuple[Fact, list[float]]]) -> list[tuple[float, Fact]]:
    """Return M7's ``cosine(query, v)`` for every doc, bit for bit, with the query's norm once.

    Same products summed in the same order as :func:`journaled.events.memory_state.cosine`.
    """
    qn = math.fsum(x * x for x in query)
    out = []
    for fact, v in docs:
        if len(v) != len(query) or qn == 0:
            out.append((0.0, fact))
            continue
        vn = math.fsum(y * y for y in v)
        dot = sum(map(operator.mul, query, v))
        out.append((0.0 if vn == 0 else dot / (math.sqrt(qn) * math.sqrt(vn)), fact))
    return out


def by_cosine(scored: list[tuple[float, Fact]]) -> list[tuple[float, Fact]]:
    """Return the hits with a positive cosine, best first, ties by id (M7)."""
    return sorted(((s, c) for s, c in scored if s > 0), key=lambda h: (-h[0], h[1].id))
