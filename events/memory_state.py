"""The memory projection: facts of one physical scope folded from events, with a live BM25 index.

:class:`ScopeState` is what a scope actor holds; :class:`MemoryState` combines every scope for
views that run without actors (time travel, M12). Both change only by :meth:`apply`, which reads no
clock and makes no id: replaying the same events always gives the same state.

Search statistics are exact over the filtered candidates (M5, M6) without scanning the store.
Facts fall in three classes, kept current as events arrive:

- *plain*: confidence 1, no validity window, not superseded — visible at any time, so they are
  counted in per-(scope, domain) totals and never inspected one by one;
- *hidden*: superseded by a fact without expiry — invisible until a delete heals the chain, and
  kept out of the index;
- *conditional*: everything else (a validity window, a superseder that expires, confidence below
  1) — checked one by one per query. These are few in practice; correctness never depends on it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from journaled.events.base import DomainEvent, Event
from journaled.events.bm25 import check_limit, idf, tokenize
from journaled.events.errors import IndexTorn
from journaled.events.inputs import decode_text
from journaled.events.inverted_index import IndexSnapshot, InvertedIndex
from journaled.events.memory import (
    FACT_EVENTS,
    Fact,
    FactDeleted,
    FactPurged,
    FactRelinked,
    FactRemembered,
    FactRestored,
    FactSuperseded,
    FactUnlinked,
    remembered_fact,
)
from journaled.events.tenancy import home_scope

PURGED_TEXT = "[purged]"
"""Text shown for a fact whose payload was erased, in a view of a time before the erasure."""


class Query(msgspec.Struct, frozen=True, kw_only=True):
    """The filter stage shared by BM25 and semantic search (M5), plus the query's terms."""

    terms: tuple[str, ...] = ()
    now: int
    scopes: frozenset[str] | None = None
    """Logical scope names to keep, or all."""
    domains: frozenset[str] | None = None
    min_confidence: float = 0.0
    limit: int = 10


class Stats(msgspec.Struct, frozen=True, kw_only=True):
    """Per-scope BM25 statistics over the filtered candidates."""

    n_docs: int
    total_length: int
    df: dict[str, int]
    hits: tuple[tuple[float, Fact], ...] | None = None
    """This scope's top hits under its own statistics, when asked to score alone: exact
    whenever no other scope holds a candidate (then its statistics are the global ones)."""


class ScopeSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A scope's folded state, restorable without replaying or re-tokenising (a cache)."""

    physical: str
    facts: dict[str, Fact]
    index: IndexSnapshot
    superseder_until: dict[str, int | None]
    listed_by: dict[str, list[str]]
    by_key: dict[str, list[str]]
    erased: list[str]
    conditional: list[str]
    plain_group: dict[str, tuple[str, str | None]]
    groups: list[tuple[str, str | None, int, int]]
    """(scope, domain, plain facts, their summed length): totals restored without a loop."""


MEMORY_SNAPSHOT_SCHEMA = 4
"""Bump when the snapshot layout changes incompatibly: older snapshots are then ignored.
4: each scope's snapshot is embedded as it was encoded, not wrapped in bytes (ADR 0058)."""
MEMORY_SNAPSHOT_PREFIX = "memory:"


def memory_snapshot_key(organization: str | None) -> str:
    """Return the snapshot key of memory as seen with this organization configured."""
    return MEMORY_SNAPSHOT_PREFIX + (organization or "")


class MemorySnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Memory folded up to a journal position: the writer's bookkeeping and each scope's state."""

    schema: int = MEMORY_SNAPSHOT_SCHEMA
    position: int
    organization: str | None
    versions: dict[str, int]
    route: dict[str, str | None]
    purged: list[str]
    hidden_superseders: dict[str, str] = {}
    """Another organization's superseded fact -> its superseder (healed by a delete, R1)."""
    hidden_valid_until: dict[str, int | None] = {}
    """Another organization's live facts -> their expiry (a delete may re-link to one, R1)."""
    scopes: dict[str, msgspec.Raw]
    """Physical scope -> encoded :class:`ScopeSnapshot`, embedded as it is: decoding the
    snapshot leaves each scope's part undecoded and uncopied (ADR 0058)."""


SCOPE_SNAPSHOT_DECODER: msgspec.msgpack.Decoder[ScopeSnapshot]
MEMORY_SNAPSHOT_DECODER: msgspec.msgpack.Decoder[MemorySnapshot]


class ScopeState:
    """The facts of one physical scope and their index. Not thread-safe: one owner (an actor)."""

    def __init__(self, physical: str) -> None:
        self.physical = physical
        self.facts: dict[str, Fact] = {}
        self.index = InvertedIndex()
        self._deferred = False
        """Whether facts are classified and indexed only when a search or an export needs it."""
        self._touched: dict[str, None] = {}
        """Facts whose class and index entry were deferred, in the order the fold touched them."""
        self.torn = False
        """A :meth:`settle` was interrupted part way through one fact: the index may hold part
        of it, and the state must be rebuilt, not read (a live scope's shelf reads as broken)."""
        self._settling = threading.Lock()
        """Held while settling: a second reader waits for the whole index, not a part of it."""
        self.settles = 0
        """How many times :meth:`settle` indexed every fact that was pending: a backlog noted
        before it changed is no longer pending (ADR 0091)."""
        self._superseder_until: dict[str, int | None] = {}
        self._listed_by: dict[str, set[str]] = {}
        self._conditional: set[str] = set()
        self._plain_group: dict[str, tuple[str, str | None]] = {}
        self._group_count: dict[tuple[str, str | None], int] = {}
        self._group_length: dict[tuple[str, str | None], int] = {}
        self._by_key: dict[str, set[str]] = {}
        self._erased: set[str] = set()

    # -- snapshots -------------------------------------------------------------------------------

    def export(self) -> ScopeSnapshot:
        """Return this scope's state as a snapshot."""
        self.settle()
        return ScopeSnapshot(
            physical=self.physical,
            facts=self.facts,
            index=self.index.export(),
            superseder_until=self._superseder_until,
            listed_by={k: sorted(v) for k, v in self._listed_by.items()},
            by_key={k: sorted(v) for k, v in self._by_key.items()},
            erased=sorted(self._erased),
            conditional=sorted(self._conditional),
            plain_group=self._plain_group,
            groups=[
                (scope, domain, count, self._group_length[scope, domain])
                for (scope, domain), count in self._group_count.items()
            ],
        )

    @classmethod
    def restore(cls, snap: ScopeSnapshot) -> ScopeState:
        """Rebuild a scope's state from :meth:`export` output, freshly decoded (it is adopted)."""
        state = cls(snap.physical)
        # Decoded containers are fresh and owned by nobody else: adopted, not copied.
        state.facts = snap.facts
        state.index = InvertedIndex.restore(snap.index)
        state._superseder_until = dict(snap.superseder_until)
        state._listed_by = {k: set(v) for k, v in snap.listed_by.items()}
        state._by_key = {k: set(v) for k, v in snap.by_key.items()}
        state._erased = set(snap.erased)
        state._conditional = set(snap.conditional)
        state._plain_group = snap.plain_group
        for scope, domain, count, length in snap.groups:
            state._group_count[scope, domain] = count
            state._group_length[scope, domain] = length
        return state

    def copy_deferred(self) -> ScopeState:
        """Return a copy of a scope folded with its index deferred and never settled (a view of
        the past, T1): what such a fold holds, copied so that neither copy's fold nor search
        changes the other. Facts are frozen Structs, shared.

        Raises:
            ValueError: the scope indexes as it folds, or was settled (its index is not empty).
        """
        if not self._deferred or self.settles or self._plain_group or self._conditional:
            raise ValueError(f"scope {self.physical}: only an unsettled deferred fold is copied")
        copy = ScopeState(self.physical)
        copy._deferred = True
        copy.facts = dict(self.facts)
        copy._touched = dict(self._touched)
        copy._superseder_until = dict(self._superseder_until)
        copy._listed_by = {k: set(v) for k, v in self._listed_by.items()}
        copy._by_key = {k: set(v) for k, v in self._by_key.items()}
        copy._erased = set(self._erased)
        return copy

    # -- folding ---------------------------------------------------------------------------------

    def apply(self, event: DomainEvent, text: str | None = None) -> None:
        """Fold one event about a fact of this scope; ``text`` is a remembered fact's payload."""
        match event:
            case FactRemembered():
                fact = remembered_fact(event, text if text is not None else PURGED_TEXT)
                if text is None:
                    self._erased.add(fact.id)
                self._put(fact)
                for old in event.supersedes:
                    self._listed_by.setdefault(old, set()).add(fact.id)
                if fact.conflict_key is not None:
                    self._by_key.setdefault(fact.conflict_key, set()).add(fact.id)
            case FactSuperseded():
                self._superseder_until[event.fact_id] = event.by_valid_until
                self._replace(event.fact_id, superseded_by=event.by)
            case FactRelinked():
                self._superseder_until[event.fact_id] = event.to_valid_until
                self._replace(event.fact_id, superseded_by=event.to)
            case FactRestored():
                self._superseder_until.pop(event.fact_id, None)
                self._replace(event.fact_id, superseded_by=None)
            case FactUnlinked():
                current = self.facts.get(event.fact_id)
                if current is not None:
                    fact = current
                    kept = tuple(i for i in fact.supersedes if i != event.deleted)
                    self._drop_listing(event.deleted, fact.id)
                    for gained in event.gained:
                        self._listed_by.setdefault(gained, set()).add(fact.id)
                    self._replace(fact.id, supersedes=kept + event.gained)
            case FactDeleted() | FactPurged():
                self._remove(event.fact_id)
            case _:
                raise TypeError(f"scope state cannot apply {type(event).__qualname__}")

    def _put(self, fact: Fact) -> None:
        if fact.id in self.facts:  # a fact not held was never classified, or was unclassified
            self._unclassify(fact.id)
        self.facts[fact.id] = fact
        self._classify(fact)

    def _replace(self, fact_id: str, **changes: object) -> None:
        fact = self.facts.get(fact_id)
        if fact is None:
            return
        self._unclassify(fact_id)
        updated = msgspec.structs.replace(fact, **changes)
        self.facts[fact_id] = updated
        self._classify(updated)

    def _remove(self, fact_id: str) -> None:
        self._erased.discard(fact_id)
        fact = self.facts.pop(fact_id, None)
        if fact is None:
            return
        self._unclassify(fact_id)
        self.index.remove(fact_id)
        self._superseder_until.pop(fact_id, None)
        for old in fact.supersedes:
            self._drop_listing(old, fact_id)
        if fact.conflict_key is not None:
            holders = self._by_key.get(fact.conflict_key)
            if holders is not None:
                holders.discard(fact_id)
                if not holders:
                    del self._by_key[fact.conflict_key]

    def _drop_listing(self, listed: str, lister: str) -> None:
        listers = self._listed_by.get(listed)
        if listers is not None:
            listers.discard(lister)
            if not listers:
                del self._listed_by[listed]

    def _is_hidden(self, fact: Fact) -> bool:
        return fact.superseded_by is not None and self._superseder_until.get(fact.id) is None

    # -- deferred indexing (ADR 0056) ------------------------------------------------------------

    def defer_index(self) -> None:
        """Classify and index facts only when a search or an export next needs them.

        Folding is then a dict update per event instead of tokenising every text; :meth:`settle`
        later classifies each fact the folds touched, which gives the same index and totals as
        classifying them as the events came (a fact's class depends on the fact as it is now,
        and BM25 scores do not depend on the order documents entered the index). It lasts until
        :meth:`index_now`: a live scope defers for good (ADR 0091), each search settling what
        the folds since the last one touched.
        """
        self._deferred = True

    def index_now(self) -> None:
        """Classify and index facts folded from now on at once; those deferred wait for
        :meth:`settle` (a fact folded again meanwhile is classified now, and again then)."""
        self._deferred = False

    @property
    def pending(self) -> bool:
        """Whether some facts wait for :meth:`settle` to be classified and indexed."""
        return bool(self._touched)

    @property
    def pending_count(self) -> int:
        """How many facts wait for :meth:`settle`: what the next search or export indexes."""
        return len(self._touched)

    def settle(self) -> None:
        """Classify and index every fact whose indexing was deferred (folds go on deferring).

        Interrupted part way through a fact, the state is marked :attr:`torn` (its index may hold
        part of that fact) and must be rebuilt; interrupted between facts, the next call goes on
        where this one stopped.
        """
        if not self._touched:
            return
        with self._settling:
            if self.torn:
                # Live memory never gets here: its owner rebuilds a torn scope (ADR 0056). A view
                # of the past has no owner to rebuild it: a new view folds afresh.
                raise IndexTorn(
                    f"memory scope {self.physical}: building its search index was interrupted "
                    "part way through a fact, so this state answers no search; for a view of "
                    "the past, take a new one with memory.as_of(...)"
                )
            touched = self._touched
            # Over a list of the ids: taking each from the front of the dict itself would scan
            # past the slots already deleted, quadratic in the facts.
            for fact_id in list(touched):
                fact = self.facts.get(fact_id)
                if fact is not None:  # a fact deleted or purged since left the index then
                    self.torn = True
                    self._unclassify(fact_id)  # a call stopped before the del classified it
                    self._classify_now(fact)
                    self.torn = False
                del touched[fact_id]
            self.settles += 1

    def _classify(self, fact: Fact) -> None:
        if self._deferred:
            # Unclassifying stays eager: it only reads what a classification left, which a fact
            # touched while deferred never got.
            self._touched[fact.id] = None
            return
        self._classify_now(fact)

    def _classify_now(self, fact: Fact) -> None:
        if fact.id in self._erased:
            return  # erased text: nothing to find
        if self._is_hidden(fact):
            self.index.remove(fact.id)
            return
        if fact.id not in self.index:
            self.index.add(fact.id, fact.text)
        conditional = (
            fact.valid_from is not None
            or fact.valid_until is not None
            or fact.superseded_by is not None
            or fact.confidence < 1.0
        )
        if conditional:
            self._conditional.add(fact.id)
            return
        group = (fact.scope, fact.domain)
        self._plain_group[fact.id] = group
        self._group_count[group] = self._group_count.get(group, 0) + 1
        self._group_length[group] = self._group_length.get(group, 0) + self.index.length(fact.id)

    def _unclassify(self, fact_id: str) -> None:
        self._conditional.discard(fact_id)
        group = self._plain_group.pop(fact_id, None)
        if group is not None:
            self._group_count[group] -= 1
            self._group_length[group] -= self.index.length(fact_id)
            if not self._group_count[group]:
                del self._group_count[group]
                del self._group_length[group]

    # -- reading ---------------------------------------------------------------------------------

    def get(self, fact_id: str) -> Fact | None:
        """Return a fact of this scope, or None."""
        return self.facts.get(fact_id)

    def all(self) -> list[Fact]:
        """Return every fact of this scope, superseded and expired included (M4)."""
        return list(self.facts.values())

    def superseder_until(self, fact_id: str) -> int | None:
        """Return the expiry of the fact that supersedes ``fact_id`` (None: never expires)."""
        return self._superseder_until.get(fact_id)

    def with_key(self, conflict_key: str) -> list[Fact]:
        """Return the facts of this scope that claim a conflict key."""
        return [self.facts[i] for i in sorted(self._by_key.get(conflict_key, ()))]

    def listing(self, fact_id: str) -> list[Fact]:
        """Return the facts of this scope whose ``supersedes`` lists ``fact_id``."""
        return [self.facts[i] for i in sorted(self._listed_by.get(fact_id, ())) if i in self.facts]

    def superseded_by(self, fact_id: str) -> list[Fact]:
        """Return the facts of this scope currently superseded by ``fact_id``."""
        return [f for f in self.facts.values() if f.superseded_by == fact_id]

    def visible(self, fact: Fact, query: Query) -> bool:
        """Tell whether a fact passes the M5 filter at ``query.now``."""
        now = query.now
        if fact.valid_until is not None and fact.valid_until < now:
            return False
        if fact.valid_from is not None and fact.valid_from > now:
            return False
        if fact.superseded_by is not None:
            until = self._superseder_until.get(fact.id)
            if until is None or until >= now:
                return False
        if fact.confidence < query.min_confidence:
            return False
        if query.scopes is not None and fact.scope not in query.scopes:
            return False
        return query.domains is None or fact.domain in query.domains

    def candidates(self, query: Query) -> list[Fact]:
        """Return the facts passing the M5 filter, in id order."""
        return sorted(
            (f for f in self.facts.values() if self.visible(f, query)), key=lambda f: f.id
        )

    def _groups(self, query: Query) -> list[tuple[str, str | None]]:
        if query.min_confidence > 1.0:
            return []
        return [
            g
            for g in self._group_count
            if (query.scopes is None or g[0] in query.scopes)
            and (query.domains is None or g[1] in query.domains)
        ]

    def _filter_for(self, query: Query) -> tuple[bool, set[tuple[str, str | None]]]:
        """Return (whether the query admits every indexed fact, the plain groups it keeps)."""
        groups = set(self._groups(query))
        unfiltered = query.scopes is None and query.domains is None and query.min_confidence <= 1.0
        return unfiltered and not self._conditional, groups

    def _admits(self, doc: str, query: Query, groups: set[tuple[str, str | None]]) -> bool:
        group = self._plain_group.get(doc)
        if group is not None:
            return group in groups
        return self.visible(self.facts[doc], query)

    def stats(self, query: Query) -> Stats:
        """Return N, total length and document frequencies over this scope's filtered candidates."""
        self.settle()
        admits_all, groups = self._filter_for(query)
        n_docs = sum(self._group_count[g] for g in groups)
        total = sum(self._group_length[g] for g in groups)
        for doc in self._conditional:
            if self.visible(self.facts[doc], query):
                n_docs += 1
                total += self.index.length(doc)
        df: dict[str, int] = {}
        accept = None if admits_all else (lambda d: self._admits(d, query, groups))
        for term in query.terms:
            df[term] = self.index.count(term, accept)
        return Stats(n_docs=n_docs, total_length=total, df=df)

    def score(
        self, query: Query, idfs: Mapping[str, float], avgdl: float
    ) -> list[tuple[float, Fact]]:
        """Return this scope's top ``query.limit`` (score, fact), best first, ties by id."""
        self.settle()
        admits_all, groups = self._filter_for(query)
        accept = None if admits_all else (lambda d: self._admits(d, query, groups))
        hits = self.index.score(list(query.terms), idfs, avgdl, accept, query.limit)
        return [(s, self.facts[d]) for s, d in hits]


def plan_terms(query: str) -> tuple[str, ...]:
    """Return the distinct query terms in first-seen order (M6)."""
    return tuple(dict.fromkeys(tokenize(query)))


def combine(stats: Iterable[Stats], terms: Sequence[str]) -> tuple[dict[str, float], float, int]:
    """Combine per-scope statistics into (idf per term, avgdl, N)."""
    n_docs = 0
    total = 0
    df = dict.fromkeys(terms, 0)
    for s in stats:
        n_docs += s.n_docs
        total += s.total_length
        for term, n in s.df.items():
            df[term] += n
    avgdl = total / n_docs if n_docs else 0.0
    if not any(df.values()):
        return {}, avgdl, n_docs
    return {t: idf(n_docs, n) for t, n in df.items()}, avgdl, n_docs


def merge_hits(per_scope: Iterable[list[tuple[float, Fact]]], limit: int) -> list[Fact]:
    """Merge per-scope hit lists into the global top ``limit``: score desc, id asc."""
    return [f for _, f in merge_scored(per_scope, limit)]


def merge_scored(
    per_scope: Iterable[list[tuple[float, Fact]]], limit: int
) -> list[tuple[float, Fact]]:
    """Merge per-scope hit lists into the global top ``limit`` (score, fact), as merge_hits.

    As :func:`merge_top` orders (score desc, id asc), without pairing ids and facts apart: the
    lists are short (a scope's top ``limit``), so one sort of them all is the cheapest cut.
    """
    check_limit(limit)
    merged = [hit for hits in per_scope for hit in hits]
    merged.sort(key=_score_then_id)
    del merged[limit:]
    return merged


def _score_then_id(hit: tuple[float, Fact]) -> tuple[float, str]:
    return (-hit[0], hit[1].id)


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Return the cosine similarity, 0 for different lengths or a zero magnitude (M7)."""
    if len(a) != len(b):
        return 0.0
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.fsum(x * x for x in a)
    nb = math.fsum(y * y for y in b)
    if na == 0 or nb == 0:
        return 0.0
    return dot / (math.sqrt(na) * math.sqrt(nb))


def usable(vector: object) -> bool:
    """Tell whether an embedding can be ranked and cached: non-empty, all finite numbers (M7)."""
    if not isinstance(vector, list | tuple) or not vector:
        return False
    return all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in vector
    )


class MemoryState:
    """Every scope's facts, folded from the log without actors (time travel and tests)."""

    def __init__(self, physical: Sequence[str], organization: str | None) -> None:
        self.organization = organization
        self.scopes = {p: ScopeState(p) for p in physical}
        self.route: dict[str, str | None] = {}
        """Fact id -> physical scope, or None for a fact outside this view (other organization)."""
        self.position = 0

    def scope_of(self, event: DomainEvent) -> str | None:
        """Return the physical scope an event's fact lives in, learning it from remembers."""
        if isinstance(event, FactRemembered):
            home = home_scope(event, self.scopes, self.organization)
            self.route[event.fact_id] = home
            return home
        if not isinstance(event, FACT_EVENTS):
            return None
        fact_id: str = event.fact_id  # type: ignore[attr-defined]
        return self.route.get(fact_id)

    def apply(self, event: Event, texts: Mapping[str, bytes]) -> None:
        """Fold one journal event (memory events only; others pass through)."""
        self.position = event.position
        physical = self.scope_of(event.data)
        if physical is None:
            return
        text = None
        if isinstance(event.data, FactRemembered):
            raw = texts.get(event.data.fact_id)
            if raw is not None:
                text = decode_text(raw, event.data.fact_id, event.position, event.kind)
        self.scopes[physical].apply(event.data, text)

    def get(self, fact_id: str) -> Fact | None:
        """Return a fact from any traversed scope, or None (M4)."""
        for state in self.scopes.values():
            fact = state.get(fact_id)
            if fact is not None:
                return fact
        return None

    def all(self) -> list[Fact]:
        """Return every stored fact across scopes (M4)."""
        return [f for state in self.scopes.values() for f in state.all()]

    def search(self, query: Query) -> list[Fact]:
        """Rank the filtered candidates by BM25 (M6)."""
        return [f for _, f in self.search_scored(query)]

    def search_scored(self, query: Query) -> list[tuple[float, Fact]]:
        """Rank the filtered candidates by BM25 (M6), with their scores."""
        return rank_bm25(list(self.scopes.values()), query)

    def candidates(self, query: Query) -> list[Fact]:
        """Return every filtered candidate across scopes, in id order."""
        return all_candidates(list(self.scopes.values()), query)


def rank_bm25(states: Sequence[ScopeState], query: Query) -> list[tuple[float, Fact]]:
    """Rank the filtered candidates of several scopes by BM25 (M6): (score, fact), best first.

    The statistics are summed over every scope first, as the scope actors' two rounds do, so
    the answer is the same whichever way the scopes are read.
    """
    if not query.terms or query.limit == 0:
        return []
    stats = [s.stats(query) for s in states]
    idfs, avgdl, n_docs = combine(stats, query.terms)
    if not n_docs or not idfs:
        return []
    holders = (s for s, st in zip(states, stats, strict=True) if any(st.df.values()))
    return merge_scored((s.score(query, idfs, avgdl) for s in holders), query.limit)


def all_candidates(states: Sequence[ScopeState], query: Query) -> list[Fact]:
    """Return every filtered candidate of several scopes, in id order."""
    return sorted((f for s in states for f in s.candidates(query)), key=_id)


def _id(fact: Fact) -> str:
    return fact.id


SCOPE_SNAPSHOT_DECODER = msgspec.msgpack.Decoder(ScopeSnapshot)
MEMORY_SNAPSHOT_DECODER = msgspec.msgpack.Decoder(MemorySnapshot)
