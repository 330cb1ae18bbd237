"""Semantic and hybrid ranking for ``rt.memory`` (SPEC M7; hybrid: ADR 0047).

Both rank the candidates that survived the same filters as BM25. Semantic ranking orders them by
cosine with the query's vector; hybrid fuses cosine with BM25 by a convex combination of scores.
Either falls back to BM25 — never raises, never returns silently empty — when the embedder cannot
help: no embedder, no candidates, the embedder raises, an unusable query vector, or no candidate
embedded usably.
"""

from __future__ import annotations

import contextvars
import logging
import math
import operator
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from journaled.embedders.cache import VectorCache, digest
from journaled.events.fusion import convex_fusion
from journaled.events.journal import Journal
from journaled.events.memory import Fact, physical_scope
from journaled.events.memory_state import Query, usable

__all__ = ["EMBED_TIMEOUT", "Embedder", "Semantic", "cache_path", "check_embed_timeout"]

log = logging.getLogger("journaled.semantic")

EMBED_TIMEOUT = 30.0
"""How long one search waits for the embedder, in seconds, by default (ADR 0067): as long as a
caller waits for any answer of memory's actors."""


def check_embed_timeout(timeout: object) -> float | None:
    """Return ``embed_timeout`` checked: a positive, finite number of seconds, or None.

    Raises:
        ValueError: anything else, saying what was given.
    """
    if timeout is None:
        return None
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout < math.inf
    ):
        raise ValueError(
            f"embed_timeout must be a positive number of seconds or None (no bound), "
            f"got {timeout!r}"
        )
    return float(timeout)


class _PastBound(Exception):
    """The embedder did not answer within the search's bound (M7 falls back)."""


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

    def __init__(
        self,
        embedder: Embedder | None,
        journal: Journal,
        embed_timeout: float | None = EMBED_TIMEOUT,
        organization: str | None = None,
    ) -> None:
        self.embedder = embedder
        self._journal = journal
        self._organization = organization
        """Whose organization scope's fact vectors are keyed as its own (ADR 0078)."""
        self.timeout = check_embed_timeout(embed_timeout)
        """How long one search waits for the embedder (None: for as long as it takes)."""
        self._late = 0
        """Calls still running past their search's bound: while any is, searches fall back at
        once instead of starting another call on an embedder that is stuck or slow."""
        self._late_lock = threading.Lock()
        self._closed = False
        self._waits: set[threading.Event] = set()
        """The waits of searches for the embedder now: a close wakes them (R3)."""
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
        if self.timeout is not None:
            with self._late_lock:
                if self._late:
                    return None
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        try:
            caught_up = self._catch_up()
            gone = self.cache.purged(c.id for c in candidates)
            if gone:
                # Purged by another process, which memory has not folded yet: its text is
                # never sent to the embedder, nor its vector kept (R2).
                candidates = [c for c in candidates if c.id not in gone]
            keys = {c.id: self._digest(c) for c in candidates}
            known = self._cached(list(keys.values()))
            need: dict[bytes, str] = {}
            for c in candidates:
                if keys[c.id] not in known:
                    need.setdefault(keys[c.id], c.text)

            def store(vectors: dict[bytes, list[float]]) -> None:
                self._store(candidates, keys, vectors, caught_up)

            fresh = self._embed(embedder, need, deadline, store)
            if fresh is None:
                return None
            store(fresh)
            known |= fresh
            query_vectors = self._call(embedder, [text], deadline, None)
            query_vector = query_vectors[0] if query_vectors else None
            if not usable(query_vector):
                return None
            assert query_vector is not None
            # A cached vector of another length was made by another setting of the model (its
            # dimensions): embedded again, once; a fresh one of another length scores 0 (M7).
            stale = {
                keys[c.id]: c.text
                for c in candidates
                if keys[c.id] in known
                and keys[c.id] not in fresh
                and len(known[keys[c.id]]) != len(query_vector)
            }
            again = self._embed(embedder, stale, deadline, store) if stale else {}
            if again:
                store(again)
                known |= again
            docs = [(c, known[keys[c.id]]) for c in candidates if keys[c.id] in known]
            if not docs:
                return None
            return _cosines(query_vector, docs)
        except Exception:
            return None

    def _embed(
        self,
        embedder: Embedder,
        need: dict[bytes, str],
        deadline: float | None,
        late: Callable[[dict[bytes, list[float]]], None],
    ) -> dict[bytes, list[float]] | None:
        """Embed the texts by digest; None when the answer is not one vector per text (nothing
        is then cached: the vectors could not be told apart). An answer that comes after the
        search gave up on it is still cached (``late``): the next search need not wait again."""
        if not need:
            return {}

        def parsed(vectors: object) -> dict[bytes, list[float]] | None:
            if not isinstance(vectors, list | tuple) or len(vectors) != len(need):
                return None
            pairs = zip(need, vectors, strict=True)
            return {d: [float(x) for x in v] for d, v in pairs if usable(v)}

        def stored_late(vectors: object) -> None:
            found = parsed(vectors)
            if found:
                late(found)

        return parsed(self._call(embedder, list(need.values()), deadline, stored_late))

    def _call(
        self,
        embedder: Embedder,
        texts: list[str],
        deadline: float | None,
        late: Callable[[object], None] | None,
    ) -> Any:
        """Call the embedder, waiting until ``deadline`` at most (ADR 0067).

        Without a bound it runs on the caller's thread. With one, on a daemon thread of its own
        (a call that never returns must not keep the process from exiting), in the caller's
        context (a current span, T3). Past the deadline :class:`_PastBound` is raised and the
        search falls back (M7); the call's answer, when it comes, goes to ``late``.
        """
        if deadline is None:
            return embedder.embed(texts)
        answer: Future[Any] = Future()
        context = contextvars.copy_context()

        def call() -> None:
            try:
                answer.set_result(context.run(embedder.embed, texts))
            except BaseException as exc:  # the caller's thread raises it, or nobody does
                answer.set_exception(exc)

        done = threading.Event()
        with self._late_lock:
            if self._closed:
                raise _PastBound  # the runtime closed: its memory answers for itself
            self._waits.add(done)
        threading.Thread(target=call, name="journaled-embed", daemon=True).start()
        remaining = deadline - time.monotonic()
        answer.add_done_callback(lambda _: done.set())
        try:
            if remaining > 0 and done.wait(remaining) and answer.done():
                return answer.result()
        finally:
            with self._late_lock:
                self._waits.discard(done)
        if self._closed and not answer.done():
            # Woken by the runtime's close (R3): the search falls back, and the closed memory
            # refuses it as it refuses every call now.
            raise _PastBound
        with self._late_lock:
            if answer.done():  # it answered as the wait ended: nothing is late
                return answer.result()
            self._late += 1
        answer.add_done_callback(lambda ended: self._ended_late(ended, late))
        log.warning(
            "embedder %s did not answer within %g s: this search falls back to BM25 (M7), and "
            "searches do until it answers",
            type(embedder).__name__,
            self.timeout,
        )
        raise _PastBound

    def close(self) -> None:
        """Wake every search waiting for the embedder: the runtime is closed (R3)."""
        with self._late_lock:
            self._closed = True
            waits = list(self._waits)
        for done in waits:
            done.set()

    def _ended_late(self, ended: Future[Any], late: Callable[[object], None] | None) -> None:
        with self._late_lock:
            self._late -= 1
        if late is None or ended.exception() is not None:
            return
        try:
            late(ended.result())
        except Exception:  # a cache: the answers never needed it
            log.warning("a late embedding was not cached", exc_info=True)

    def _catch_up(self) -> int | None:
        """Apply purges to the cache before it serves; None when it cannot be read now
        (search goes on with the vectors it computes, M7), and for an in-memory cache.

        An in-memory cache (a PostgreSQL journal, an embedder naming no model) learns other
        processes' purges from the journal too: a fact memory has not folded the purge of yet is
        neither embedded nor ranked from the memo (R2).
        """
        if self.cache.path is None:
            self.cache.catch_up(self._journal)
            return None
        try:
            return self.cache.catch_up(self._journal)
        except (sqlite3.Error, OSError):
            log.warning("vector cache %s unreadable for now; embedding without it", self.cache.path)
            self.cache.learn(self._journal)  # the journal still says what was purged (R2)
            return None

    def _digest(self, fact: Fact) -> bytes:
        own = physical_scope(fact.scope) == "organization"
        return digest(fact.text, self._organization if own else None)

    def _cached(self, digests: list[bytes]) -> dict[bytes, list[float]]:
        try:
            return self.cache.get(self._model, digests)
        except (sqlite3.Error, OSError):
            return {}

    def _store(
        self,
        candidates: Sequence[Fact],
        keys: dict[str, bytes],
        vectors: dict[bytes, list[float]],
        caught_up: int | None,
    ) -> None:
        """Cache fresh vectors, with any an earlier write could not store; then drop any of a
        fact another process purged since the catch-up (R2). A cache that cannot be written now
        keeps them in memory for a later write: the answer does not need it. Without a
        catch-up nothing is written, since nothing would vouch for the rows afterwards."""
        entries = [
            (c.id, keys[c.id], vectors[keys[c.id]]) for c in candidates if keys[c.id] in vectors
        ]
        if not entries and not self.cache.owes_writes:
            return
        vouched = self.cache.path is not None and caught_up is not None
        try:
            if vouched:
                # First too, to the memo and owed rows: a late answer (ADR 0067) may come long
                # after its catch-up, once another process purged one of its facts and moved the
                # file past the purge, or once the runtime closed, when nothing afterwards could
                # take the row out again (R2). A journal that cannot be read (closed) raises:
                # nothing is written.
                self.cache.learn(self._journal)
            self.cache.put(self._model, entries, write=caught_up is not None)
            if vouched:
                assert caught_up is not None
                self.cache.forget_purged(self._journal, caught_up)
        except (sqlite3.Error, OSError):
            log.warning("vector cache %s busy or unwritable; not stored this time", self.cache.path)

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
        """Fuse the BM25 and cosine scores of every candidate, and return the best ``limit``.

        ``0.5 * bm25 / max(bm25) + 0.5 * cosine`` (:func:`convex_fusion`), ties by id, over
        every candidate with a query term or a positive cosine: a fact far down one ranking
        keeps its score there. Falls back to BM25's answer exactly when semantic ranking would
        (M7).
        """
        if query.limit == 0:
            return []
        scored = self.scores(text, candidates)
        if scored is None:
            return [f for _, f in bm25(query.limit)]
        lexical = bm25(max(query.limit, len(candidates)))
        by_id = {f.id: f for f in candidates} | {f.id: f for _, f in lexical}
        fused = convex_fusion(
            [(s, f.id) for s, f in lexical], [(s, f.id) for s, f in scored if s > 0]
        )
        return [by_id[i] for _, i in fused[: query.limit]]

    def forget(self, fact_id: str) -> None:
        """Drop a purged fact's vector (M10): from memory and from the file beside the journal.

        A file that cannot be written now is left to the next catch-up, which reads the purge
        from the journal: the purge itself is committed already and never fails for it.
        """
        try:
            self.cache.forget_facts([fact_id])
        except (sqlite3.Error, OSError):
            log.warning("vector cache %s: purge applied at its next use", self.cache.path)


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
