"""The incremental inverted index behind memory search: BM25 over filtered candidates (spec M6).

One memory scope owns one :class:`InvertedIndex`, and scopes live in separate actors, so a
query runs in two rounds: :meth:`InvertedIndex.stats` on every index, summed by the caller
into global N, total length and n; then :meth:`InvertedIndex.score` on every index with the
global idf and avgdl, merged by :func:`events.bm25.merge_top`. :func:`search` is that protocol
for indexes in one process; :func:`events.bm25.bm25_rescore` is the reference it must equal.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from types import MappingProxyType
from typing import Any

import msgspec

from journaled.events.bm25 import (
    BOUND_SLACK,
    K1,
    B,
    check_limit,
    idf,
    merge_top,
    query_terms,
    summation_order,
    tokenize,
)
from journaled.events.errors import IndexTorn

__all__ = ["IndexSnapshot", "InvertedIndex", "decode_posting", "search"]

_EMPTY: Mapping[str, int] = MappingProxyType({})
_POSTING_DECODER = msgspec.msgpack.Decoder(dict[int, int])


def decode_posting(posting: msgspec.Raw) -> dict[int, int]:
    """Decode one term's posting as an :class:`IndexSnapshot` holds it."""
    return _POSTING_DECODER.decode(posting)


class IndexSnapshot(msgspec.Struct, frozen=True):
    """What an :class:`InvertedIndex` holds, in the shape it holds it (restored without loops)."""

    postings: dict[str, msgspec.Raw]
    """term -> {document number: tf}, each posting as encoded: a restore decodes a term's on
    its first use (ADR 0060). An export holds the live dicts (and the untouched encodings)."""
    names: list[str]
    """Document number -> id (numbers are never reused)."""
    terms: dict[str, str]
    lengths: dict[str, int]
    dl: dict[int, int]
    """Document number -> length, as ``lengths`` keyed by number."""


class InvertedIndex:
    """Per-document term frequencies and postings, updated incrementally.

    Running totals of the document count and token length keep unfiltered statistics O(1),
    and scoring touches only the postings of the query terms.
    """

    def __init__(self, impact_min: int = 32) -> None:
        """Create an empty index.

        Args:
            impact_min: Postings at least this long get impact buckets once a query reads them
                (see :meth:`score`); shorter ones are cheaper to read whole.
        """
        self.impact_min = impact_min
        # term -> {(tf, document length): document numbers}: a long posting split by what
        # decides a document's contribution, built on the first query that reads the posting
        # and kept up to date from then on, so scoring can visit the strongest first.
        self._impacts: dict[str, dict[tuple[int, int], set[int]]] = {}
        # term -> (changes, avgdl, its buckets strongest first as (tf / (tf + norm), docs)):
        # the order a query reads a long posting in, kept while neither the index nor the
        # candidates' mean length change, so a repeated query does not sort its buckets again.
        self._orders: dict[str, tuple[int, float, list[tuple[float, set[int]]]]] = {}
        self._changes = 0
        """Counts adds and removes: a bucket order made before a change is not used after."""
        # Each document's distinct terms, space-joined: what remove() needs, compact to store.
        self._terms: dict[str, str] = {}
        self._lengths: dict[str, int] = {}
        # Postings key documents by a small number, not their (long) id: smaller to snapshot
        # and faster to decode; ``_names`` maps numbers back, ``_numbers`` ids to numbers.
        self._postings: dict[str, dict[int, int]] = {}
        # Postings restored from a snapshot, as encoded: decoded into ``_postings`` on first
        # use (ADR 0060), which shadows the encoding from then on; dropped with the posting.
        self._packed: dict[str, msgspec.Raw] = {}
        self.unreadable = False
        """A restored posting failed to decode: the index must be rebuilt, not read."""
        self._names: list[str] = []
        self._numbers: dict[str, int] = {}
        self._dl: dict[int, int] = {}
        self._total_length = 0

    def export(self) -> IndexSnapshot:
        """Return the index's contents, to be restored without re-tokenising any text.

        The snapshot holds the live containers, not copies: encode it before the index changes.
        """
        # Decoded postings shadow their encodings; untouched ones are encoded as they came.
        postings: dict[str, Any] = {**self._packed, **self._postings}
        return IndexSnapshot(
            postings=postings,
            names=self._names,
            terms=self._terms,
            lengths=self._lengths,
            dl=self._dl,
        )

    @classmethod
    def restore(cls, snapshot: IndexSnapshot, impact_min: int = 32) -> InvertedIndex:
        """Rebuild an index from :meth:`export` output, decoded.

        The snapshot's containers are adopted, not copied, so pass a freshly decoded snapshot,
        never the live result of another index's :meth:`export`. The postings are the
        exception: each stays encoded until first used (ADR 0060), as a copy of its bytes.
        """
        index = cls(impact_min)
        # Each posting's encoding copied out of the snapshot's buffer, so that the buffer (the
        # whole memory snapshot) is not kept alive by the terms nobody searches; a posting
        # already decoded (an export not encoded since) is taken as it is.
        postings: Mapping[str, Any] = snapshot.postings
        for term, raw in postings.items():
            if isinstance(raw, msgspec.Raw):
                index._packed[term] = msgspec.Raw(bytes(raw))
            else:
                index._postings[term] = dict(raw)
        index._names = snapshot.names
        index._numbers = dict(zip(snapshot.names, range(len(snapshot.names)), strict=True))
        index._terms = snapshot.terms
        index._lengths = snapshot.lengths
        index._dl = snapshot.dl
        index._total_length = sum(snapshot.lengths.values())
        return index

    def add(self, doc_id: str, text: str) -> None:
        """Index a document, replacing any earlier text under the same id.

        Args:
            doc_id: The document's id.
            text: The document's text; it is tokenised with :func:`tokenize`.
        """
        if doc_id in self._lengths:
            self.remove(doc_id)
        tokens = tokenize(text)
        counts: dict[str, int] = {}
        for token in tokens:  # a plain loop counts a short text faster than Counter
            counts[token] = counts.get(token, 0) + 1
        number = self._numbers.get(doc_id)
        if number is None:
            number = self._numbers[doc_id] = len(self._names)
            self._names.append(doc_id)
        length = len(tokens)
        self._changes += 1
        self._terms[doc_id] = " ".join(counts)
        self._lengths[doc_id] = length
        self._dl[number] = length
        self._total_length += length
        postings = self._postings
        for term, tf in counts.items():
            posting = postings.get(term) or self._unpacked(term)
            if posting is None:
                postings[term] = {number: tf}
            else:
                posting[number] = tf
        impacts = self._impacts
        if impacts:  # built on a first query only: none while a log is folded on open
            for term, tf in counts.items():
                buckets = impacts.get(term)
                if buckets is not None:
                    buckets.setdefault((tf, length), set()).add(number)

    def remove(self, doc_id: str) -> None:
        """Drop a document from the index; do nothing if it is absent.

        Args:
            doc_id: The document's id.
        """
        terms = self._terms.pop(doc_id, None)
        if terms is None:
            return
        dl = self._lengths.pop(doc_id)
        self._changes += 1
        self._total_length -= dl
        number = self._numbers[doc_id]
        del self._dl[number]
        impacts = self._impacts
        for term in terms.split(" ") if terms else ():
            posting = self._posting(term)
            assert posting is not None, term  # the document's terms have postings
            tf = posting.pop(number)
            buckets = impacts.get(term)
            if buckets is not None:
                bucket = buckets[tf, dl]
                bucket.discard(number)
                if not bucket:
                    del buckets[tf, dl]
                if len(posting) < self.impact_min // 2 or not posting:
                    del impacts[term]  # short again: reading it whole is cheaper
                    self._orders.pop(term, None)
            # Empty postings would otherwise accumulate forever under churn.
            if not posting:
                self._orders.pop(term, None)
                del self._postings[term]
                self._packed.pop(term, None)  # its encoding would bring it back

    def _posting(self, term: str) -> dict[int, int] | None:
        """Return a term's posting (None if no document has it), decoding it on first use."""
        posting = self._postings.get(term)
        return posting if posting is not None else self._unpacked(term)

    def _unpacked(self, term: str) -> dict[int, int] | None:
        """Decode a term's posting restored from a snapshot; None if it has none there.

        The decoded posting is assigned whole and the encoding stays (shadowed), so readers of
        an index nobody writes to, decoding at once, find the same posting whichever wins (as
        impact buckets are built, ADR 0014).
        """
        packed = self._packed.get(term)
        if packed is None:
            return None
        try:
            posting = _POSTING_DECODER.decode(packed)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # The snapshot's check could not see it (postings stay encoded): the index answers
            # nothing from now on, and its owner rebuilds it from the journal.
            self.unreadable = True
            raise IndexTorn(
                f"the search index restored from memory's snapshot holds a posting that cannot "
                f"be read (term {term!r}: {exc}); memory is rebuilt from the journal"
            ) from None
        self._postings[term] = posting
        return posting

    def __contains__(self, doc_id: object) -> bool:
        """Tell whether a document with this id is indexed."""
        return doc_id in self._lengths

    def __len__(self) -> int:
        """Count the indexed documents."""
        return len(self._lengths)

    def length(self, doc_id: str) -> int:
        """Return the token count of a document.

        Args:
            doc_id: The document's id.

        Returns:
            How many tokens the document's text has, repeats included.

        Raises:
            KeyError: If the document is not indexed.
        """
        return self._lengths[doc_id]

    def postings(self, term: str) -> Mapping[str, int]:
        """Return a read-only view of the documents containing a term.

        Args:
            term: A token, as produced by :func:`tokenize`.

        Returns:
            A live mapping of doc id to term frequency; empty if no document has the term.
        """
        posting = self._posting(term)
        if posting is None:
            return _EMPTY
        names = self._names
        return MappingProxyType({names[i]: tf for i, tf in posting.items()})

    def count(self, term: str, accept: Callable[[str], bool] | None = None) -> int:
        """Count the documents containing a term (that ``accept`` keeps, if given)."""
        posting = self._posting(term)
        if not posting:
            return 0
        if accept is None:
            return len(posting)
        names = self._names
        return sum(1 for i in posting if accept(names[i]))

    def stats(
        self,
        terms: Sequence[str],
        accept: Callable[[str], bool] | None,
        universe: Iterable[str] | None = None,
    ) -> tuple[int, int, dict[str, int]]:
        """Compute (N, total_length, {term: n}) over the docs accepted by `accept`.

        The candidates are the indexed documents that pass `accept` (all of them if None)
        and, when `universe` is given, also belong to it. With neither, N and total_length
        are O(1) and each n is a posting length. With only `accept`, N and total_length
        must call it on every document; pass `universe`, a pre-narrowed set of ids that
        holds every document the caller wants, to bound that work by its size instead.
        Ids in `universe` that are not indexed are ignored. :meth:`score` has no
        `universe`, so give it an `accept` that also rejects documents outside it.

        Args:
            terms: Query terms; duplicates are counted once.
            accept: Filter on doc ids, or None to accept every document.
            universe: Optional set of doc ids that bounds the candidates.

        Returns:
            N, the candidates' summed token length, and for each distinct term the number
            of candidates containing it.
        """
        lengths = self._lengths
        if universe is None:
            if accept is None:
                n_docs, total = len(lengths), self._total_length
            else:
                accepted = [dl for doc, dl in lengths.items() if accept(doc)]
                n_docs, total = len(accepted), sum(accepted)
            members: Set[str] | None = None
        else:
            members = universe if isinstance(universe, Set) else set(universe)
            accepted = [
                lengths[doc]
                for doc in members
                if doc in lengths and (accept is None or accept(doc))
            ]
            n_docs, total = len(accepted), sum(accepted)

        counts: dict[str, int] = {}
        names = self._names
        numbers = self._numbers
        for term in dict.fromkeys(terms):
            posting = self._posting(term) or {}
            if members is None:
                counts[term] = self.count(term, accept)
            elif len(members) < len(posting):
                # Walk whichever side is smaller; both count the same intersection.
                found = (numbers.get(doc) for doc in members)
                counts[term] = sum(
                    1
                    for i in found
                    if i is not None and i in posting and (accept is None or accept(names[i]))
                )
            else:
                counts[term] = sum(
                    1
                    for i in posting
                    if names[i] in members and (accept is None or accept(names[i]))
                )
        return n_docs, total, counts

    def score(
        self,
        terms: Sequence[str],
        idf: Mapping[str, float],
        avgdl: float,
        accept: Callable[[str], bool] | None,
        limit: int,
    ) -> list[tuple[float, str]]:
        """Rank accepted docs that contain a query term by BM25 and keep the top `limit`.

        `idf` and `avgdl` come from the caller so that they can describe candidates spread
        over several indexes. Only the query terms' postings are read. Terms are taken in
        decreasing idf order, and once the best score the remaining terms could give an
        unseen document falls below the current `limit`-th score, their postings are
        skipped (max-score pruning); the result is the same as scoring every posting.
        A posting of at least ``impact_min`` documents is read by impact bucket, strongest
        first, and left at the first bucket that cannot reach the top (ADR 0014). Building
        those buckets on first use is the only change a read makes to the index; it is
        assigned whole, so concurrent readers of an index nobody writes to stay safe.

        Args:
            terms: Query terms; duplicates are used once.
            idf: The idf of every term in `terms` that occurs in this index.
            avgdl: Mean token length of the candidates, greater than zero.
            accept: Filter on doc ids, or None to accept every document.
            limit: Maximum number of results.

        Returns:
            Up to `limit` (score, doc_id) pairs, best first, ties by doc id ascending.

        Raises:
            ValueError: If `limit` is negative or `avgdl` is not positive.
            KeyError: If a term that occurs in this index has no entry in `idf`.
        """
        check_limit(limit)
        if avgdl <= 0:
            raise ValueError(f"avgdl must be > 0, got {avgdl}")
        found = {t: p for t in dict.fromkeys(terms) if (p := self._posting(t)) is not None}
        weighted = [(t, idf[t] * (K1 + 1.0)) for t in found]
        if limit == 0 or not weighted:
            return []
        c1 = K1 * (1.0 - B)
        c2 = K1 * B / avgdl
        order: list[tuple[dict[int, int], float]] = []
        # Per term: its buckets strongest first with what a document in each gets from the
        # term, or None to read the posting whole; and a cap on what the term gives anyone.
        visits: list[tuple[float, list[tuple[float, set[int]]]] | None] = []
        caps: list[float] = []
        for term, weight in summation_order(weighted):
            posting = found[term]
            order.append((posting, weight))
            if len(posting) < self.impact_min:
                visits.append(None)
                caps.append(weight)  # tf / (tf + norm) < 1
                continue
            ranked = self._bucket_order(term, avgdl, c1, c2)
            visits.append((weight, ranked))
            caps.append(weight * ranked[0][0])
        # rest[i] caps what terms i.. can give a document that none of the earlier terms reached.
        rest = [0.0] * (len(order) + 1)
        for i in range(len(order) - 1, -1, -1):
            rest[i] = rest[i + 1] + caps[i]

        lengths = self._dl
        names = self._names
        scores: dict[int, float] = {}
        rejected: set[int] = set()
        best: list[float] = []  # min-heap of the `limit` best scores so far
        slack = 1.0 + BOUND_SLACK

        def visit(docs: Iterable[int], first: bool) -> None:
            for doc in docs:
                # A doc already met under an earlier term was scored in full then.
                if not first and (doc in scores or doc in rejected):
                    continue
                if accept is not None and not accept(names[doc]):
                    rejected.add(doc)
                    continue
                norm = c1 + c2 * lengths[doc]
                total = 0.0
                for other, weight in order:
                    tf = other.get(doc)
                    if tf:
                        total += weight * tf / (tf + norm)
                scores[doc] = total
                if len(best) < limit:
                    heapq.heappush(best, total)
                elif total > best[0]:
                    heapq.heapreplace(best, total)

        # Max-score pruning: once what an unseen document could still reach falls below the
        # current `limit`-th score, it cannot enter the top, ties included (the slack covers
        # rounding). Terms go in decreasing weight; a long posting goes bucket by bucket, from
        # the strongest, and stops at the first bucket that cannot reach the top.
        for i, (posting, _) in enumerate(order):
            if len(best) == limit and rest[i] * slack < best[0]:
                break
            buckets = visits[i]
            if buckets is None:
                visit(posting, i == 0)
                continue
            weight, ranked = buckets
            for factor, docs in ranked:
                if len(best) == limit and (weight * factor + rest[i + 1]) * slack < best[0]:
                    break
                visit(docs, False)

        if len(scores) > limit:
            # A key call per item is slow on long postings, so cut on bare floats first.
            kth = best[0]
            scores = {doc: value for doc, value in scores.items() if value >= kth}
        top = heapq.nsmallest(limit, scores.items(), key=lambda kv: (-kv[1], names[kv[0]]))
        return [(value, names[doc]) for doc, value in top]

    def _bucket_order(
        self, term: str, avgdl: float, c1: float, c2: float
    ) -> list[tuple[float, set[int]]]:
        """Return a long posting's impact buckets strongest first, with what a document in each
        gets from the term per unit of its weight: ``tf / (tf + norm)``.

        The order depends only on the buckets and on ``avgdl`` (the weight scales every bucket
        alike), so it is kept until the index changes or a query brings another ``avgdl``; it
        is assigned whole, as the buckets are, so concurrent readers stay safe.
        """
        kept = self._orders.get(term)
        if kept is not None and kept[0] == self._changes and kept[1] == avgdl:
            return kept[2]
        ranked = sorted(
            (
                (tf / (tf + (c1 + c2 * dl)), docs)
                for (tf, dl), docs in self._impact_buckets(term).items()
            ),
            key=lambda bucket: -bucket[0],
        )
        self._orders[term] = (self._changes, avgdl, ranked)
        return ranked

    def _impact_buckets(self, term: str) -> dict[tuple[int, int], set[int]]:
        """Return the term's impact buckets, building them from its posting on first use."""
        buckets = self._impacts.get(term)
        if buckets is None:
            buckets = {}
            lengths = self._dl
            posting = self._posting(term)
            assert posting is not None, term  # only terms with postings get buckets
            for doc, tf in posting.items():
                key = (tf, lengths[doc])
                bucket = buckets.get(key)
                if bucket is None:
                    buckets[key] = {doc}
                else:
                    bucket.add(doc)
            self._impacts[term] = buckets
        return buckets


def search(
    indexes: Sequence[InvertedIndex],
    query: str,
    limit: int,
    accept: Callable[[str], bool] | None = None,
    universe: Iterable[str] | None = None,
) -> list[tuple[float, str]]:
    """Rank the filtered candidates of several in-process indexes by BM25.

    This is the two-round protocol that actor-hosted indexes follow through messages:
    sum :meth:`InvertedIndex.stats` over the indexes, derive idf and avgdl once, then
    merge every :meth:`InvertedIndex.score`.

    Args:
        indexes: The indexes, each holding different documents.
        query: The query text; see the module docstring for how terms are taken.
        limit: Maximum number of results.
        accept: Filter on doc ids, or None to accept every document.
        universe: Optional set of doc ids that bounds the candidates, as in
            :meth:`InvertedIndex.stats`.

    Returns:
        Up to `limit` (score, doc_id) pairs, best first, ties by doc id ascending; empty
        for an empty or all-punctuation query.

    Raises:
        ValueError: If `limit` is negative.
    """
    check_limit(limit)
    terms = query_terms(query)
    if not terms or limit == 0:
        return []
    members: Set[str] | None = None
    if universe is not None:
        members = universe if isinstance(universe, Set) else set(universe)
    n_docs = 0
    total = 0
    counts = dict.fromkeys(terms, 0)
    for index in indexes:
        part_docs, part_total, part_counts = index.stats(terms, accept, members)
        n_docs += part_docs
        total += part_total
        for term, n in part_counts.items():
            counts[term] += n
    # total == 0 means every candidate is empty, so none can contain a term.
    if n_docs == 0 or total == 0:
        return []
    idfs = {term: idf(n_docs, n) for term, n in counts.items()}
    avgdl = total / n_docs
    effective = accept
    if members is not None:
        effective = members.__contains__ if accept is None else _both(members, accept)
    return merge_top(
        (index.score(terms, idfs, avgdl, effective, limit) for index in indexes), limit
    )


def _both(members: Set[str], accept: Callable[[str], bool]) -> Callable[[str], bool]:
    return lambda doc: doc in members and accept(doc)
