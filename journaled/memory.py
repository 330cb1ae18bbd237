"""``rt.memory``: scoped long-term memory, every change an event (SPEC section 1)."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

import msgspec
import pykka

from journaled.actors.asking import ask, ask_all, await_reply
from journaled.actors.desk import Sent, WriterDesk
from journaled.actors.directory import Directory, Inbox
from journaled.actors.errors import MemoryBehind, RuntimeClosed
from journaled.actors.scope import UNSETTLED, FoldMark, ScopeShelf, Unsettled, read_in_place
from journaled.actors.scrubber import Scrubber
from journaled.errors import InvalidArgument
from journaled.events.base import Event
from journaled.events.catalog import NOT_MEMORY
from journaled.events.inputs import int_problem, short, text_problem
from journaled.events.journal import Journal, erasures_here
from journaled.events.memory import FACT_EVENTS, Fact, FactRemembered
from journaled.events.memory_audit import explain
from journaled.events.memory_past import Erasures, PastCheckpoints, past_memory
from journaled.events.memory_state import (
    MemoryState,
    Query,
    ScopeState,
    Stats,
    all_candidates,
    combine,
    merge_scored,
    plan_terms,
    rank_bm25,
)
from journaled.events.messages import (
    All,
    Candidates,
    CatchUp,
    Delete,
    Deletion,
    Get,
    Purge,
    Remember,
    Remembered,
    SaveSnapshot,
    SearchScore,
    SearchStats,
)
from journaled.events.provenance import Use, fact_uses
from journaled.events.tenancy import Boundary
from journaled.semantic import EMBED_TIMEOUT, Embedder, Semantic, by_cosine

__all__ = ["Embedder", "Memory", "MemoryView"]  # Embedder: re-exported as journaled.Embedder

_FOLD_BATCH = 1000
"""Events folded per read of their facts' texts by :meth:`Memory.as_of`."""

T = TypeVar("T")

SETTLE_WAIT = 0.005
"""Seconds a read waits for busy scope actors to finish their queued messages (folds, mostly,
which take microseconds each) before it asks them instead (ADR 0053)."""


def _query(
    query: str,
    now: int,
    scopes: Iterable[str] | None,
    domains: Iterable[str] | None,
    min_confidence: float,
    limit: int,
) -> Query:
    _check("query", text_problem(query))
    _check("now", int_problem(now, unit="epoch milliseconds (int)"))
    names = {"scopes": _names("scopes", scopes), "domains": _names("domains", domains)}
    _check("limit", int_problem(limit, low=0, unit="a non-negative int"))
    if (
        not isinstance(min_confidence, int | float)
        or isinstance(min_confidence, bool)  # True would filter as 1.0
        or math.isnan(min_confidence)
    ):
        raise InvalidArgument("min_confidence", f"must be a number, got {short(min_confidence)}")
    return Query(
        terms=plan_terms(query),
        now=now,
        scopes=names["scopes"],
        domains=names["domains"],
        min_confidence=float(min_confidence),
        limit=limit,
    )


def _first(facts: Iterable[Fact | None]) -> Fact | None:
    return next((f for f in facts if f is not None), None)


def _check(field: str, problem: str | None) -> None:
    if problem:
        raise InvalidArgument(field, problem)


def _names(field: str, names: Iterable[str] | None) -> frozenset[str] | None:
    """Return a filter of scope or domain names, or raise naming the argument."""
    if names is None:
        return None
    if isinstance(names, str | bytes) or not isinstance(names, Iterable):
        raise InvalidArgument(field, f"takes a list of names, got {type(names).__name__}")
    out = frozenset(names)
    for name in out:
        _check(f"{field} entry {short(name)}", text_problem(name))
    return out


class MemoryView:
    """The memory store as it was at one journal position (M12): get, all, search."""

    def __init__(self, state: MemoryState, now: int, semantic: Semantic) -> None:
        self._state = state
        self._now = now
        self._semantic = semantic
        self.position = state.position
        """The journal position this view reflects."""

    def get(self, fact_id: str) -> Fact | None:
        """Return the fact as it was then, or None."""
        return self._state.get(fact_id)

    def all(self) -> list[Fact]:
        """Return every fact stored then."""
        return sorted(self._state.all(), key=lambda f: f.id)

    def search(
        self,
        query: str,
        scopes: Iterable[str] | None = None,
        domains: Iterable[str] | None = None,
        min_confidence: float = 0.0,
        limit: int = 10,
        now: int | None = None,
    ) -> list[Fact]:
        """Search as the store would have then; ``now`` defaults to the view's time."""
        q = _query(query, self._now if now is None else now, scopes, domains, min_confidence, limit)
        return self._state.search(q)

    def search_semantic(
        self,
        query: str,
        scopes: Iterable[str] | None = None,
        domains: Iterable[str] | None = None,
        min_confidence: float = 0.0,
        limit: int = 10,
        now: int | None = None,
    ) -> list[Fact]:
        """Rank semantically as the store would have then (M7 fallbacks included)."""
        q = _query(query, self._now if now is None else now, scopes, domains, min_confidence, limit)
        return self._semantic.rank(query, q, self._state.candidates(q), self._bm25(q))

    def search_hybrid(
        self,
        query: str,
        scopes: Iterable[str] | None = None,
        domains: Iterable[str] | None = None,
        min_confidence: float = 0.0,
        limit: int = 10,
        now: int | None = None,
    ) -> list[Fact]:
        """Fuse BM25 and semantic ranks as the store would have then (ADR 0047)."""
        q = _query(query, self._now if now is None else now, scopes, domains, min_confidence, limit)
        return self._semantic.hybrid(query, q, self._state.candidates(q), self._bm25(q))

    def _bm25(self, q: Query) -> Callable[[int], list[tuple[float, Fact]]]:
        return lambda n: self._state.search_scored(msgspec.structs.replace(q, limit=n))


class Memory:
    """Scoped long-term memory over the memory actors. Safe to use from any thread."""

    def __init__(
        self,
        journal: Journal,
        writer: Any,
        scopes: dict[str, Any],
        clock: Callable[[], int],
        embedder: Embedder | None,
        organization: str | None,
        scrubber: Scrubber | None = None,
        inbox: Inbox | None = None,
        shelves: Mapping[str, ScopeShelf] | None = None,
        desk: WriterDesk | None = None,
        mark: FoldMark | None = None,
        embed_timeout: float | None = EMBED_TIMEOUT,
    ) -> None:
        self._inbox = inbox if inbox is not None else Inbox(Directory(), "memory")
        self._journal = journal
        self._scrubber = scrubber if scrubber is not None else Scrubber(journal)
        self._writer = writer
        self._scopes = scopes
        self._refs = list(scopes.values())
        self._desk = desk
        """Where a remember is stored on the caller's thread while the writer is idle."""
        self._mark = mark
        """How far the writer has queued its folds (ADR 0062): see :meth:`read_mark`."""
        self._shelves = [shelves[name] for name in scopes] if shelves else []
        """The scopes' states where their actors keep them, in the order of ``_refs``: a read
        takes them in place when every actor is idle (ADR 0053)."""
        self._clock = clock
        self._organization = organization
        self._semantic = Semantic(embedder, journal, embed_timeout, organization)
        self._past_checkpoints = PastCheckpoints()
        """Memory's past states this runtime kept, which views of the past start from (T1)."""
        if self._semantic.cache.path is not None:  # a purge's rows leave its log as well
            self._scrubber.include(self._semantic.cache)
        self._lone_scope = True
        """Whether the last BM25 search found all its candidates in one scope."""
        self._boundary = Boundary(organization, journal.first, journal.firsts)

    @property
    def embedder(self) -> Embedder | None:
        """Return the embedder semantic and hybrid searches rank with (None: BM25 only, M7)."""
        return self._semantic.embedder

    @property
    def embed_timeout(self) -> float | None:
        """Return how long one semantic or hybrid search waits for the embedder, in seconds
        (None: for as long as it takes; ADR 0067)."""
        return self._semantic.timeout

    def remember(
        self,
        text: str,
        scope: str = "project",
        domain: str | None = None,
        confidence: float | None = None,
        conflict_key: str | None = None,
        source: str | None = None,
        valid_from: int | None = None,
        valid_until: int | None = None,
        *,
        run_id: str | None = None,
        step_id: str | None = None,
    ) -> Fact:
        """Store a fact, superseding older facts with its conflict key, in one append (M2, M3).

        ``run_id`` and ``step_id`` record the step that remembered it (``ctx.memory`` sets them,
        P1); ``memory.why`` names them.

        Raises:
            InvalidFact: the text, confidence, scope or validity window cannot be stored.
            OrganizationNotConfigured: ``scope="organization"`` without an organization.
        """
        request = Remember(
            text=text,
            scope=scope,
            domain=domain,
            confidence=confidence,
            conflict_key=conflict_key,
            source=source,
            valid_from=valid_from,
            valid_until=valid_until,
            run_id=run_id,
            step_id=step_id,
            deadline=self._deadline(),
        )
        here: Fact | Sent[tuple[str, Future[Remembered]]] | Unsettled = UNSETTLED
        if self._desk is not None:
            here = self._desk.remember(request, self.request_remember)
            if isinstance(here, Fact):
                return here
        correlation, reply = (
            here.handle if isinstance(here, Sent) else self.request_remember(request)
        )
        try:
            answer: Remembered = await_reply(self._writer, reply, "Remember")
        finally:
            self._inbox.forget(correlation)
        return answer.fact

    def _close_inbox(self) -> None:
        """Fail every remember still awaiting its answer, and wake every search waiting for
        its embedder: the runtime is closed."""
        self._inbox.close()
        self._semantic.close()

    def request_remember(self, request: Remember) -> tuple[str, Future[Remembered]]:
        """Tell the writer a remember, addressed to reply here; return (correlation, future).

        The future completes with :class:`Remembered` (or the error) once the fact is stored;
        the caller waits on it however suits it (a thread, an event loop).
        """
        correlation, reply = self._inbox.expect()
        try:
            self._writer.tell(
                msgspec.structs.replace(
                    request,
                    reply_to=self._inbox.address,
                    correlation=correlation,
                    deadline=request.deadline or self._deadline(),
                )
            )
        except pykka.ActorDeadError:
            self._inbox.forget(correlation)
            raise RuntimeClosed(
                "the runtime is closed: open a new one with journaled.open()"
            ) from None
        return correlation, reply

    def _deadline(self) -> float:
        """Return when a write asked now must hold the journal's lock, its asker giving up
        :data:`~journaled.actors.asking.ASK_TIMEOUT` after asking (ADR 0039)."""
        return time.time() + self._journal.config.lock_wait

    def _in_place(self, read: Callable[[list[ScopeState]], T]) -> T | Unsettled:
        """Read the traversed scopes in place, or :data:`UNSETTLED` if they stay busy."""
        return read_in_place(self._shelves, read, SETTLE_WAIT)

    def _read(self, here: Callable[[list[ScopeState]], T], by_message: Callable[[], T]) -> T:
        """Read in place, else by message; a memory behind the journal (a failed fold, a rebuild
        under way or that failed) is first rebuilt by the writer, and read once whole."""
        found = self._in_place(here)
        if not isinstance(found, Unsettled):
            return found
        try:
            return by_message()
        except MemoryBehind:
            self._heal()
        found = self._in_place(here)
        return found if not isinstance(found, Unsettled) else by_message()

    def _heal(self) -> None:
        """Have the writer rebuild memory from the journal (it does before any command)."""
        try:
            ask(self._writer, CatchUp())
        except pykka.ActorDeadError:
            raise RuntimeClosed(
                "the runtime is closed: open a new one with journaled.open()"
            ) from None
        if any(shelf.broken or shelf.stale for shelf in self._shelves):
            raise MemoryBehind(
                "memory is behind the journal and could not be rebuilt yet: see the log; "
                "reads work again once a rebuild succeeds"
            )

    def _ask(self, refs: list[Any], message: object) -> list[Any]:
        """Ask scope actors, saying so when the runtime was closed under the read.

        The asks are queued holding the scopes' lock, as the writer queues its folds, so every
        scope answers as of the same commands: none between two of the read's messages.
        """
        held = self._shelves[0].lock if self._shelves else None
        try:
            return ask_all(refs, message, sent_under=held)
        except pykka.ActorDeadError:
            if self._writer.is_alive():
                raise
            raise RuntimeClosed(
                "the runtime is closed: open a new one with journaled.open()"
            ) from None

    def get(self, fact_id: str) -> Fact | None:
        """Return a fact from any traversed scope, or None (M4)."""
        return self._read(
            lambda states: _first(s.get(fact_id) for s in states),
            lambda: _first(self._ask(self._refs, Get(fact_id=fact_id))),
        )

    def all(self) -> list[Fact]:
        """Return every stored fact across scopes, superseded and expired included (M4)."""
        facts = self._read(
            lambda states: [f for s in states for f in s.all()],
            lambda: [f for answer in self._ask(self._refs, All()) for f in answer],
        )
        return sorted(facts, key=lambda f: f.id)

    def search(
        self,
        query: str,
        scopes: Iterable[str] | None = None,
        domains: Iterable[str] | None = None,
        min_confidence: float = 0.0,
        limit: int = 10,
        now: int | None = None,
    ) -> list[Fact]:
        """Rank the filtered candidates by BM25 and return the top ``limit`` (M5, M6)."""
        q = _query(
            query, self._clock() if now is None else now, scopes, domains, min_confidence, limit
        )
        return self._bm25(q)

    def _bm25(self, q: Query) -> list[Fact]:
        return [f for _, f in self._bm25_scored(q)]

    def _bm25_scored(self, q: Query) -> list[tuple[float, Fact]]:
        if not q.terms or q.limit == 0:
            return []
        return self._read(lambda states: rank_bm25(states, q), lambda: self._bm25_asked(q))

    def _bm25_asked(self, q: Query) -> list[tuple[float, Fact]]:
        alone = self._lone_scope
        stats: list[Stats] = self._ask(self._refs, SearchStats(query=q, score_alone=alone))
        idfs, avgdl, n_docs = combine(stats, q.terms)
        if not n_docs or not idfs:
            return []
        filled = [st for st in stats if st.n_docs]
        # Where one scope holds every candidate, its statistics are the global ones and its
        # hits the exact answer: one round of asks. Whether to ask for them follows the last
        # search, so stores spread over scopes do not pay for scoring twice.
        self._lone_scope = len(filled) == 1
        if len(filled) == 1 and filled[0].hits is not None:
            return list(filled[0].hits)
        # Only scopes holding a candidate with a query term can contribute hits.
        holders = [ref for ref, st in zip(self._refs, stats, strict=True) if any(st.df.values())]
        hits = self._ask(holders, SearchScore(query=q, idfs=idfs, avgdl=avgdl))
        return merge_scored(hits, q.limit)

    def search_scored(
        self,
        query: str,
        scopes: Iterable[str] | None = None,
        domains: Iterable[str] | None = None,
        min_confidence: float = 0.0,
        limit: int = 10,
        now: int | None = None,
        *,
        semantic: bool = False,
    ) -> tuple[list[tuple[float, Fact]], str]:
        """Search like :meth:`search` (or :meth:`search_semantic`) and keep each hit's score.

        Returns:
            ((score, fact) pairs best first, the ranking used): "bm25" (Okapi BM25 score, M6)
            or "semantic" (cosine similarity, M7); a semantic search that fell back says "bm25".
        """
        q = _query(
            query, self._clock() if now is None else now, scopes, domains, min_confidence, limit
        )
        if not semantic:
            return self._bm25_scored(q), "bm25"
        scored = self._semantic.scores(query, self._candidates(q))
        if scored is None:
            return self._bm25_scored(q), "bm25"
        return by_cosine(scored)[: q.limit], "semantic"

    def search_semantic(
        self,
        query: str,
        scopes: Iterable[str] | None = None,
        domains: Iterable[str] | None = None,
        min_confidence: float = 0.0,
        limit: int = 10,
        now: int | None = None,
    ) -> list[Fact]:
        """Rank the filtered candidates by cosine similarity, falling back to BM25 (M7)."""
        q = _query(
            query, self._clock() if now is None else now, scopes, domains, min_confidence, limit
        )
        return self._semantic.rank(query, q, self._candidates(q), self._bm25_top(q))

    def search_hybrid(
        self,
        query: str,
        scopes: Iterable[str] | None = None,
        domains: Iterable[str] | None = None,
        min_confidence: float = 0.0,
        limit: int = 10,
        now: int | None = None,
    ) -> list[Fact]:
        """Fuse the BM25 and semantic rankings of the filtered candidates (ADR 0047).

        Each ranking's top ``max(limit, 100)`` hits are fused by their scores: a fact scores
        ``0.5 * bm25 / best bm25 + 0.5 * cosine`` (0 where a ranking lacks it; cosine <= 0
        is dropped, as in M7); ties by id. Same filters and arguments as :meth:`search`.
        Without an embedder that can help — none configured, no candidates, the embedder
        raises, an unusable query vector, no candidate embedded usably — it answers exactly
        what :meth:`search` answers (M7's fallbacks).
        """
        q = _query(
            query, self._clock() if now is None else now, scopes, domains, min_confidence, limit
        )
        if q.limit == 0:
            return []
        return self._semantic.hybrid(query, q, self._candidates(q), self._bm25_top(q))

    def _candidates(self, q: Query) -> list[Fact]:
        return self._read(
            lambda states: all_candidates(states, q),
            lambda: sorted(
                (f for answer in self._ask(self._refs, Candidates(query=q)) for f in answer),
                key=lambda f: f.id,
            ),
        )

    def _bm25_top(self, q: Query) -> Callable[[int], list[tuple[float, Fact]]]:
        return lambda n: self._bm25_scored(msgspec.structs.replace(q, limit=n))

    def delete(self, fact_id: str) -> Deletion:
        """Delete a fact and heal the supersession chain around it, atomically (M8)."""
        deletion: Deletion = ask(self._writer, Delete(fact_id=fact_id, deadline=self._deadline()))
        return deletion

    def purge(self, fact_id: str, reason: str | None = None) -> bool:
        """Delete a fact and erase its text from the journal itself (M10).

        Returns:
            True if a text was erased; False for an unknown or already purged fact.
        """
        if reason is not None:
            _check("reason", text_problem(reason))
        purged: bool = ask(
            self._writer, Purge(fact_id=fact_id, reason=reason, deadline=self._deadline())
        )
        if purged:
            try:
                self._semantic.forget(fact_id)
            finally:
                # The erasure is committed; scrubbing the files gives way to readers and retries
                # in the background, so a backup or report holding old data never fails a purge
                # nor holds up a remember (see scrub()).
                self._scrubber.after_erasure()
        return purged

    def scrub(self, timeout: float = 10.0) -> None:
        """Remove erased texts' bytes from the journal's files now, waiting up to ``timeout`` s.

        ``purge`` erases a text from every table when it commits, then scrubs the files (SQLite's
        write-ahead log, PostgreSQL's dead rows) as cleanup: at once when no other connection
        holds older data, else retried in the background until it succeeds; what is owed is kept
        in the journal, so a runtime opened after a process died before its scrub does it.
        Call this to make sure, e.g. after a backup that was reading during a purge has finished.
        The vector cache file beside a SQLite journal (ADR 0048) has its log emptied with it.

        Raises:
            ScrubPending: another connection still holds older data after ``timeout`` seconds;
                the background retries go on.
        """
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
            raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
        self._scrubber.scrub(float(timeout))

    @property
    def scrub_pending(self) -> bool:
        """Tell whether bytes of an erased text may still be in the journal's files.

        Read from the journal: a purge by another process, or by one killed before its scrub,
        counts until some scrub has removed it; so does a purged vector still in the log of the
        vector cache file, which a reader kept this process from emptying (ADR 0065).
        """
        return self._scrubber.pending

    def history(self, fact_id: str) -> list[Event]:
        """Return the events of a fact's life, oldest first (M11).

        Empty for an unknown id, an id that names no fact (a run, a conflict key), and another
        organization's fact, which this runtime must not see (R1).
        """
        if not isinstance(fact_id, str):
            return []
        events = self._journal.stream(fact_id)
        if not events or not isinstance(events[0].data, FactRemembered):
            return []
        if self._boundary.hides(events[0]):
            return []
        return self._boundary.scrub_links(events)

    def why(self, fact_id: str) -> str:
        """Explain a fact's life in plain words from its events (M11), and the steps that read it.

        A fact remembered through ``ctx.memory`` names its step and run (P1); each step that read
        it is listed after its events (P2).
        """
        history = self.history(fact_id)
        text = explain(fact_id, history)
        if history:
            for use in self._uses(fact_id):
                text += f"\n  read by step {use.step_id!r} of run {use.run_id} [#{use.position}]"
                if use.carried_from is not None:
                    text += f" (a fork: its output is run {use.carried_from}'s)"
        return text

    def read_mark(self) -> tuple[int | None, int]:
        """Return where a read begun now starts: (journal position, epoch-ms time).

        The position is one every read begun after this call reflects at least (ADR 0062); a
        change appended after it may be one such a read did not see. None when this memory has
        no writer to say so.
        """
        return (None if self._mark is None else self._mark.position), self._clock()

    def used_by(self, fact_id: str) -> list[Use]:
        """Return every step that read the fact, in journal order (P2).

        A projection of the journal's ``run.memory-read`` events: a process that never saw the
        reads answers the same. A fork's step that kept its source's output rests on the
        source's read: it is listed at that read, ``carried_from`` naming the source (F1). Empty
        for an unknown id and for another organization's fact, and without another
        organization's runs (R1, ADR 0074).
        """
        if not self.history(fact_id):
            return []
        return self._uses(fact_id)

    def _uses(self, fact_id: str) -> list[Use]:
        """Return the uses of a fact this runtime sees: another organization's runs are
        unknown here, and so are their reads (ADR 0074)."""
        here = self._boundary
        return [u for u in fact_uses(fact_id, self._journal) if not here.run_elsewhere(u.run_id)]

    def as_of(self, position: int | None = None, at: int | None = None) -> MemoryView:
        """View the store as it was at a journal position or a time (M12).

        ``position`` is a journal position; ``at`` an epoch-ms time (the view holds memory's
        events recorded at or before it, up to the first recorded after it: a later event
        stamped earlier by another process's clock came after that one). Other events (runs,
        another organization's facts) do not end it. The view's searches default ``now`` to
        that time. A position inside one append (a remember that supersedes is several events)
        is taken at the end of that append, which readers saw whole or not at all (J2): the
        view's ``position`` says so.
        With neither (SPEC section 5's defaults), the view is of the journal as it is now: its
        last position, its searches' ``now`` the clock's (a fact whose ``valid_until`` passed
        since the last event is not found, as :meth:`search` does not find it).
        """
        if position is not None and at is not None:
            raise InvalidArgument("as_of", "takes one of position= or at=, not both")
        current = position is None and at is None
        if current:
            position = self._journal.position()
        if at is not None:
            _check("at", int_problem(at, unit="epoch milliseconds (int)"))
        last = self._journal.position()
        if position is not None:
            if isinstance(position, bool) or not isinstance(position, int) or position < 0:
                raise InvalidArgument(
                    "position", f"must be a journal position >= 0, got {short(position)}"
                )
            if position > last:
                raise InvalidArgument(
                    "position", f"{position} is past the end of the journal ({last})"
                )
            position = self._journal.commit_end(position)
        state, now = self._past(position, at)
        if current:  # as it is now: its searches judge validity now, as memory.search does
            now = max(now, self._clock())
        return MemoryView(state, now, self._semantic)

    def _past(
        self, position: int | None, at: int | None, attempts: int = 3
    ) -> tuple[MemoryState, int]:
        """Fold memory up to a position (or a time) from the journal's events alone.

        Never from memory's snapshot: a snapshot is a cache outside the digest chain, which
        ``journal verify`` checks but an answer about the past could not (ADR 0034). Returns the
        state and its time: the last event's (a position) or ``at``. The texts of the facts
        remembered are read with each batch of events, not all at once; the search index is
        built only if the view is searched (T1). At a position, the fold starts from the
        nearest checkpoint this runtime kept at or before it, and leaves checkpoints as it goes
        (:class:`PastCheckpoints`, ADR 0034's update).
        """
        if at is not None:
            erasures = self._erasures()
            folded = self._past_at(at)
            if self._erasures() != erasures and attempts > 1:
                # A purge committed while it folded: the view may hold a text read before (R2).
                return self._past(None, at, attempts - 1)
            return folded
        assert position is not None
        counted = self._journal.counts_erasures
        if not counted:
            # No count would tell a checkpoint of another process's purge (R2): none is used,
            # and the fold below leaves none.
            self._past_checkpoints.clear()
        erasures = self._erasures()
        started = self._past_checkpoints.nearest(position, erasures) if counted else None
        if started is None:
            state, now = past_memory(list(self._scopes), self._organization), 0
        else:
            state, now = started
        every, ahead = (
            self._past_checkpoints.spacing(state.position, position)
            if counted
            else (sys.maxsize, None)
        )
        last = state.position
        batch: list[Event] = []
        for event in self._journal.read(after=state.position, upto=position):
            batch.append(event)
            if len(batch) >= _FOLD_BATCH:
                now, last = self._fold_keeping(state, batch, now, last, every, ahead, erasures)
                batch = []
        now, last = self._fold_keeping(state, batch, now, last, every, ahead, erasures)
        self._past_checkpoints.settle()
        if self._erasures() != erasures:
            # A purge committed while this view folded: it may hold a text read before; the
            # checkpoints are dropped and the view folded again, so none holds what is erased
            # (a view folded with purges all along, as one without checkpoints could be, is
            # judged from where it began: ADR 0062).
            self._past_checkpoints.clear()
            if attempts > 1:
                return self._past(position, None, attempts - 1)
        return state, now

    def _erasures(self) -> Erasures:
        """Return what tells whether content was erased since: the journal's count (every
        process's purges) and this process's mark (its own, counted or not)."""
        return self._journal.erasures(), erasures_here()

    def _fold_keeping(
        self,
        state: MemoryState,
        events: list[Event],
        now: int,
        last: int,
        every: int,
        ahead: int | None,
        erasures: Erasures,
    ) -> tuple[int, int]:
        """Fold events into a past state, keeping a checkpoint wherever one is due; return the
        state's time and the position of the last checkpoint passed."""
        remembered = [e.data.fact_id for e in events if isinstance(e.data, FactRemembered)]
        texts = self._journal.payloads(remembered) if remembered else {}
        for event in events:
            state.apply(event, texts)
            now = event.data.at
            due = event.position - last >= every
            if due and (ahead is None or ahead - event.position >= every):
                self._past_checkpoints.keep(state, now, erasures)
                last = event.position
        return now, last

    def _past_at(self, at: int) -> tuple[MemoryState, int]:
        """Fold memory as it was at a time (epoch ms): from the start, its events alone."""
        state = past_memory(list(self._scopes), self._organization)
        batch: list[Event] = []
        # Runs' events are not even read: they change no fact, and say no time of memory's.
        for event in self._journal.read(skip_prefixes=NOT_MEMORY):
            if event.data.at > at:
                # Memory's own events say when memory was so: an event of a run or of another
                # organization, which the fold passes by, does not end it, whatever its clock
                # said (two processes' clocks disagree). One of this memory ends it, even if a
                # later one carries an earlier time: memory was never past it by then.
                if not isinstance(event.data, FACT_EVENTS):
                    continue
                self._fold_into(state, batch)
                batch = []
                if state.scope_of(event.data) is not None:
                    break
                continue
            batch.append(event)
            if len(batch) >= _FOLD_BATCH:
                self._fold_into(state, batch)
                batch = []
        self._fold_into(state, batch)
        return state, at

    def _fold_into(self, state: MemoryState, events: list[Event]) -> None:
        remembered = [e.data.fact_id for e in events if isinstance(e.data, FactRemembered)]
        texts = self._journal.payloads(remembered) if remembered else {}
        for event in events:
            state.apply(event, texts)

    def checkpoint(self) -> bool:
        """Snapshot the memory projection now, so the next open folds only what follows.

        Runtimes on a file journal also do this on close once 500 events were folded since the
        last snapshot. Snapshots are a cache: a purge drops them, and a missing or unreadable one
        only means the next open folds the whole journal.

        Returns:
            True if a snapshot was written (False when nothing changed since the last).
        """
        saved: bool = ask(self._writer, SaveSnapshot(min_events=1))
        return saved

    def remembered(self, fact_id: str) -> FactRemembered | None:
        """Return the event that remembered a fact (even after delete), or None."""
        for event in self.history(fact_id):
            if isinstance(event.data, FactRemembered):
                return event.data
        return None
