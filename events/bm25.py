"""Okapi BM25 over a filtered candidate set: the formula, its terms and its reference (spec M6).

Every statistic BM25 needs (N, the per-term document frequency n, and avgdl) is taken over
the candidates that survive the caller's filter, never over the whole corpus, so a filter
changes the scores and not only which documents come back.

The incremental index that answers queries is :mod:`events.inverted_index`; this module holds
what it and its reference share: tokenising, idf, the agreed summation order, :func:`merge_top`,
and :func:`bm25_rescore`, the from-scratch reference every index answer must equal.

Query terms are the distinct tokens of the query, each used once in order of first
appearance: repeating a word in a query does not weight it more.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import chain

__all__ = [
    "BOUND_SLACK",
    "K1",
    "B",
    "bm25_rescore",
    "check_limit",
    "idf",
    "merge_top",
    "query_terms",
    "summation_order",
    "tokenize",
]

K1: float = 1.2
B: float = 0.75

_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)
# The same split for ASCII text, in C without the regex engine (about 4x faster on a fact):
# every byte that is not a letter or a digit becomes a space.
_ASCII_WORDS = bytes(b if chr(b).isascii() and chr(b).isalnum() else 32 for b in range(256))
# Scores are sums of rounded terms, so a pruning bound needs headroom beyond the exact
# mathematical bound to never discard a document that would tie or win after rounding.
BOUND_SLACK: float = 1e-9


def tokenize(text: str) -> list[str]:
    """Split text into lower-cased runs of Unicode letters and digits.

    Underscore and every other non-alphanumeric character separate tokens.

    Args:
        text: Any text.

    Returns:
        The tokens in order of appearance, repeats kept.
    """
    if text.isascii():
        return text.encode().lower().translate(_ASCII_WORDS).decode().split()
    return _TOKEN.findall(text.lower())


def query_terms(query: str) -> list[str]:
    """Tokenise a query into its distinct terms, in order of first appearance.

    Args:
        query: The query text.

    Returns:
        Each distinct token once; empty for an empty or all-punctuation query.
    """
    return list(dict.fromkeys(tokenize(query)))


def idf(n_docs: int, n_with_term: int) -> float:
    """Compute the BM25 inverse document frequency ln(1 + (N - n + 0.5) / (n + 0.5)).

    The ``1 +`` keeps it positive even when every candidate contains the term, so a single
    candidate is still found by its own words.

    Args:
        n_docs: N, the number of filtered candidates.
        n_with_term: n, how many of those candidates contain the term.

    Returns:
        The idf, always greater than zero.

    Raises:
        ValueError: If n is negative or greater than N.
    """
    if not 0 <= n_with_term <= n_docs:
        raise ValueError(f"need 0 <= n_with_term <= n_docs, got n={n_with_term}, N={n_docs}")
    return math.log1p((n_docs - n_with_term + 0.5) / (n_with_term + 0.5))


def check_limit(limit: int) -> None:
    """Raise ValueError for a negative result limit."""
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")


def summation_order(weights: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """Order (term, weight) pairs by weight descending, then term, for summing a score.

    Floating-point addition is not associative, so the index and the reference baseline
    must add a document's term contributions in one agreed order to produce identical
    scores, hence identical tie-breaks. Heaviest first also lets pruning skip the light
    terms, which have the longest postings.
    """
    return sorted(weights, key=lambda tw: (-tw[1], tw[0]))


def _rank_key(item: tuple[float, str]) -> tuple[float, str]:
    return (-item[0], item[1])


def merge_top(results: Iterable[list[tuple[float, str]]], limit: int) -> list[tuple[float, str]]:
    """Merge per-index top lists into one top `limit`, score desc, id asc.

    Each document is expected to live in exactly one index, so entries are not
    de-duplicated.

    Args:
        results: One :meth:`InvertedIndex.score` result per index.
        limit: Maximum number of results.

    Returns:
        Up to `limit` (score, doc_id) pairs, best first, ties by doc id ascending.

    Raises:
        ValueError: If `limit` is negative.
    """
    check_limit(limit)
    return heapq.nsmallest(limit, chain.from_iterable(results), key=_rank_key)


def bm25_rescore(
    query: str, docs: Sequence[tuple[str, str]], limit: int
) -> list[tuple[float, str]]:
    """Tokenise and score every (doc_id, text) from scratch: the slow reference baseline.

    Every given document is a candidate; filter `docs` beforehand to apply a filter.

    Args:
        query: The query text; see the module docstring for how terms are taken.
        docs: The candidates as (doc_id, text), ids distinct.
        limit: Maximum number of results.

    Returns:
        Up to `limit` (score, doc_id) pairs with a positive score, best first, ties by doc
        id ascending; empty for an empty or all-punctuation query.

    Raises:
        ValueError: If `limit` is negative.
    """
    check_limit(limit)
    terms = query_terms(query)
    if not terms or limit == 0:
        return []
    counted = [(doc_id, Counter(tokenize(text))) for doc_id, text in docs]
    lengths = {doc_id: counts.total() for doc_id, counts in counted}
    n_docs = len(counted)
    total_length = sum(lengths.values())
    if n_docs == 0 or total_length == 0:
        return []
    avgdl = total_length / n_docs
    weights = summation_order(
        [
            (term, idf(n_docs, sum(1 for _, counts in counted if term in counts)) * (K1 + 1.0))
            for term in terms
        ]
    )
    # Same constants and summation order as InvertedIndex.score, so results match exactly.
    c1 = K1 * (1.0 - B)
    c2 = K1 * B / avgdl
    scored: list[tuple[float, str]] = []
    for doc_id, counts in counted:
        norm = c1 + c2 * lengths[doc_id]
        total = 0.0
        matched = False
        for term, weight in weights:
            tf = counts.get(term)
            if tf:
                total += weight * tf / (tf + norm)
                matched = True
        if matched:
            scored.append((total, doc_id))
    return heapq.nsmallest(limit, scored, key=_rank_key)
