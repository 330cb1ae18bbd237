"""Tests for the BM25 inverted index over filtered candidates (spec M6)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from journaled.events.bm25 import K1, B, bm25_rescore, idf, merge_top, query_terms, tokenize
from journaled.events.inverted_index import InvertedIndex, search

Ranked = list[tuple[float, str]]


def _index(docs: dict[str, str]) -> InvertedIndex:
    index = InvertedIndex()
    for doc_id, text in docs.items():
        index.add(doc_id, text)
    return index


def _combined(
    indexes: Sequence[InvertedIndex],
    query: str,
    limit: int,
    accept: Callable[[str], bool] | None = None,
    universe: Iterable[str] | None = None,
) -> Ranked:
    """Run the two-round protocol by hand, as a caller holding one index per actor does."""
    terms = query_terms(query)
    if not terms:
        return []
    n_docs, total, counts = 0, 0, dict.fromkeys(terms, 0)
    for index in indexes:
        part_docs, part_total, part_counts = index.stats(terms, accept, universe)
        n_docs += part_docs
        total += part_total
        for term, n in part_counts.items():
            counts[term] += n
    if n_docs == 0 or total == 0:
        return []
    idfs = {term: idf(n_docs, n) for term, n in counts.items()}
    return merge_top(
        [index.score(terms, idfs, total / n_docs, accept, limit) for index in indexes], limit
    )


def _assert_same_ranking(actual: Ranked, expected: Ranked) -> None:
    assert [doc for _, doc in actual] == [doc for _, doc in expected]
    for (got, _), (want, _) in zip(actual, expected, strict=True):
        assert abs(got - want) <= 1e-9


def test_tokenize_keeps_unicode_letters_and_digits() -> None:
    """M6: tokens are lower-cased runs of Unicode letters and digits."""
    assert tokenize("Zürich 2024, ÉCOLE Straße") == ["zürich", "2024", "école", "straße"]
    assert tokenize("日本語 and x86") == ["日本語", "and", "x86"]


def test_tokenize_splits_on_punctuation_and_underscore() -> None:
    """M6: punctuation, whitespace and underscore all separate tokens."""
    assert tokenize("snake_case--kebab...dot/slash") == ["snake", "case", "kebab", "dot", "slash"]
    assert tokenize("__init__") == ["init"]
    assert tokenize("!!! ... ___ \t\n") == []
    assert tokenize("") == []


_ALL_OF_ASCII = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=127), max_size=60)


@settings(max_examples=400)
@given(st.one_of(_ALL_OF_ASCII, st.text(max_size=60)))
def test_tokenize_fast_ascii_path_splits_as_the_unicode_rule(text: str) -> None:
    """M6: ASCII text is split without the regex; every text splits as ``[^\\W_]+`` does on
    its lower-cased form (control characters, digits, underscore and DEL included)."""
    assert tokenize(text) == re.findall(r"[^\W_]+", text.lower())
    assert tokenize(text.upper()) == re.findall(r"[^\W_]+", text.upper().lower())


def test_query_terms_are_distinct_in_first_seen_order() -> None:
    """M6: each distinct query term is used once, in order of first appearance."""
    assert query_terms("Cat dog CAT, cat_dog") == ["cat", "dog"]
    docs = [("a", "cat dog"), ("b", "cat cat mouse"), ("c", "bird")]
    assert bm25_rescore("cat cat cat", docs, 5) == bm25_rescore("cat", docs, 5)


def test_parameters_are_okapi_defaults() -> None:
    """M6: k1 = 1.2 and b = 0.75."""
    assert K1 == 1.2
    assert B == 0.75


def test_idf_matches_formula_and_is_always_positive() -> None:
    """M6: idf = ln(1 + (N - n + 0.5) / (n + 0.5)) and stays positive even when n = N."""
    assert idf(3, 1) == pytest.approx(math.log(8 / 3), abs=1e-12)
    assert idf(1, 1) == pytest.approx(math.log(1 + 0.5 / 1.5), abs=1e-12)
    for n_docs in range(60):
        for n in range(n_docs + 1):
            assert idf(n_docs, n) > 0


@given(st.integers(0, 10**9), st.data())
def test_idf_positive_property(n_docs: int, data: st.DataObject) -> None:
    """M6: idf is positive for every valid (N, n)."""
    n = data.draw(st.integers(0, n_docs))
    assert idf(n_docs, n) > 0


def test_idf_rejects_impossible_counts() -> None:
    """M6: n must lie in [0, N]."""
    with pytest.raises(ValueError, match="n_with_term"):
        idf(2, 3)
    with pytest.raises(ValueError, match="n_with_term"):
        idf(2, -1)


def test_single_document_is_found_by_its_own_words() -> None:
    """M6: with N = n = 1 the idf is still positive, so a lone doc matches its words."""
    index = _index({"only": "Remember the Zürich offsite"})
    results = _combined([index], "zürich offsite", 5)
    assert [doc for _, doc in results] == ["only"]
    assert results[0][0] > 0
    expected = bm25_rescore("zürich offsite", [("only", "Remember the Zürich offsite")], 5)
    _assert_same_ranking(results, expected)


def test_score_matches_hand_computed_values() -> None:
    """M6: exact BM25 scores for a tiny corpus, to 1e-9."""
    docs = {"d1": "cat sat", "d2": "cat cat dog", "d3": "dog ran far away"}
    # N = 3, avgdl = (2 + 3 + 4) / 3 = 3; "cat" and "dog" each occur in 2 docs.
    idf_2_of_3 = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    d1 = idf_2_of_3 * 1 * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 2 / 3))
    d2 = idf_2_of_3 * 2 * 2.2 / (2 + 1.2 * (0.25 + 0.75 * 3 / 3)) + idf_2_of_3 * 1 * 2.2 / (
        1 + 1.2 * (0.25 + 0.75 * 3 / 3)
    )
    d3 = idf_2_of_3 * 1 * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 4 / 3))
    expected = [(d2, "d2"), (d1, "d1"), (d3, "d3")]
    assert d2 == pytest.approx(math.log(1.6) * 2.375, abs=1e-12)
    _assert_same_ranking(_combined([_index(docs)], "cat dog", 10), expected)
    _assert_same_ranking(bm25_rescore("cat dog", list(docs.items()), 10), expected)


def test_ties_are_broken_by_doc_id_ascending() -> None:
    """M6: equal scores come back in ascending doc id order."""
    docs = {"z": "apple", "m": "apple", "a": "apple", "k": "apple pie tart"}
    results = _combined([_index(docs)], "apple", 10)
    assert [doc for _, doc in results] == ["a", "m", "z", "k"]
    assert results[0][0] == results[1][0] == results[2][0] > results[3][0]
    assert [doc for _, doc in _combined([_index(docs)], "apple", 2)] == ["a", "m"]
    assert bm25_rescore("apple", list(docs.items()), 10) == results


def test_documents_without_query_terms_are_not_returned() -> None:
    """M6: docs with score 0 are left out, even when fewer than `limit` docs match."""
    docs = {"hit": "budget review", "miss": "holiday plans", "empty": ""}
    assert [doc for _, doc in _combined([_index(docs)], "budget", 10)] == ["hit"]
    assert _combined([_index(docs)], "absent words", 10) == []
    assert [doc for _, doc in bm25_rescore("budget", list(docs.items()), 10)] == ["hit"]


@pytest.mark.parametrize("query", ["", "   ", "?!...", "___", "-- // --"])
def test_empty_or_punctuation_query_returns_nothing(query: str) -> None:
    """M6: an empty or all-punctuation query returns []."""
    index = _index({"a": "anything at all", "b": "more text"})
    assert query_terms(query) == []
    assert search([index], query, 5) == []
    assert bm25_rescore(query, [("a", "anything at all")], 5) == []


def test_limit_is_respected() -> None:
    """M6: at most `limit` results, and they are the head of the longer ranking."""
    docs = {f"d{i}": "word " * (i + 1) + "filler " * (5 - i) for i in range(6)}
    full = _combined([_index(docs)], "word", 10)
    assert len(full) == 6
    assert _combined([_index(docs)], "word", 3) == full[:3]
    assert _combined([_index(docs)], "word", 0) == []
    assert bm25_rescore("word", list(docs.items()), 3) == full[:3]
    with pytest.raises(ValueError, match="limit"):
        _index(docs).score(["word"], {"word": 1.0}, 3.0, None, -1)


def test_add_replaces_and_remove_keeps_stats_exact() -> None:
    """M6: re-adding an id replaces its text, and N, length and n stay exact."""
    index = _index({"a": "red green", "b": "red blue blue"})
    assert index.stats(["red", "blue"], None) == (2, 5, {"red": 2, "blue": 1})

    index.add("b", "green")
    assert len(index) == 2
    assert index.length("b") == 1
    assert index.stats(["red", "blue", "green"], None) == (2, 3, {"red": 1, "blue": 0, "green": 2})
    assert dict(index.postings("blue")) == {}

    index.remove("a")
    index.remove("a")
    index.remove("never-added")
    assert "a" not in index
    assert "b" in index
    assert 42 not in index
    assert index.stats(["red", "green"], None) == (1, 1, {"red": 0, "green": 1})
    assert dict(index.postings("green")) == {"b": 1}
    with pytest.raises(KeyError):
        index.length("a")

    index.remove("b")
    assert len(index) == 0
    assert index.stats(["green"], None) == (0, 0, {"green": 0})


def test_postings_are_read_only_term_frequencies() -> None:
    """M6: postings map doc id to term frequency and cannot be mutated by callers."""
    index = _index({"a": "x x y", "b": "x"})
    postings = index.postings("x")
    assert dict(postings) == {"a": 2, "b": 1}
    with pytest.raises(TypeError):
        postings["c"] = 1  # type: ignore[index]
    assert dict(index.postings("nothing")) == {}


def test_accept_filter_changes_n_and_big_n() -> None:
    """M6: N, n and avgdl are taken over the filtered candidates only."""
    docs = {"a": "alpha beta", "b": "alpha", "c": "gamma gamma gamma", "d": "beta"}
    index = _index(docs)
    keep = {"a", "c"}
    assert index.stats(["alpha", "beta"], None) == (4, 7, {"alpha": 2, "beta": 2})
    assert index.stats(["alpha", "beta"], keep.__contains__) == (2, 5, {"alpha": 1, "beta": 1})

    filtered = _combined([index], "alpha beta", 10, keep.__contains__)
    unfiltered = _combined([index], "alpha beta", 10)
    expected = bm25_rescore("alpha beta", [(k, v) for k, v in docs.items() if k in keep], 10)
    _assert_same_ranking(filtered, expected)
    assert [doc for _, doc in filtered] == ["a"]
    # The filter moves the score itself, not only the membership of the result.
    assert filtered[0][0] != {doc: s for s, doc in unfiltered}["a"]


def test_universe_narrows_stats_like_a_filter() -> None:
    """M6: stats over a given universe count only indexed, accepted docs inside it."""
    index = _index({"a": "alpha beta", "b": "alpha", "c": "gamma", "d": "beta"})
    universe = ["a", "c", "a", "not-indexed"]
    assert index.stats(["alpha", "beta"], None, universe) == (2, 3, {"alpha": 1, "beta": 1})
    assert index.stats(["alpha"], lambda doc: doc != "a", universe) == (1, 1, {"alpha": 0})
    inside = {"a", "c"}
    assert search([index], "alpha", 5, universe=universe) == _combined(
        [index], "alpha", 5, inside.__contains__, inside
    )


def test_merge_top_orders_by_score_then_id() -> None:
    """M6: merge_top keeps (-score, id) order across per-index lists and cuts at limit."""
    merged = merge_top([[(2.0, "b"), (1.0, "c")], [(2.0, "a"), (0.5, "d")], []], 3)
    assert merged == [(2.0, "a"), (2.0, "b"), (1.0, "c")]
    assert merge_top([], 3) == []
    assert merge_top([[(1.0, "a")]], 0) == []


def test_pruning_skips_weak_postings_without_changing_results() -> None:
    """M6: scoring reads few docs of a common term once a rare term settles the top."""
    docs = {f"c{i:03d}": f"common filler {i}" for i in range(200)}
    docs["rare"] = "rare rare rare common"
    index = _index(docs)
    seen: list[str] = []

    def accept(doc: str) -> bool:
        seen.append(doc)
        return True

    n_docs, total, counts = index.stats(["common", "rare"], accept)
    idfs = {term: idf(n_docs, n) for term, n in counts.items()}
    seen.clear()
    results = index.score(["common", "rare"], idfs, total / n_docs, accept, 1)
    assert results == bm25_rescore("common rare", list(docs.items()), 1)
    assert [doc for _, doc in results] == ["rare"]
    # The 200 docs holding only "common" cannot beat "rare", so they are never visited.
    assert seen == ["rare"]


def test_long_postings_are_read_strongest_bucket_first() -> None:
    """M6: of a long posting, only the buckets that can still reach the top are visited."""
    # 400 docs hold "common" once, padded to lengths 2..401: the shortest score highest.
    docs = {f"d{n:03d}": "common" + " pad" * n for n in range(1, 401)}
    docs["twice"] = "common common" + " pad" * 300
    index = InvertedIndex(impact_min=100)
    for doc_id, text in docs.items():
        index.add(doc_id, text)
    seen: list[str] = []

    def accept(doc: str) -> bool:
        seen.append(doc)
        return True

    n_docs, total, counts = index.stats(["common"], None)
    idfs = {term: idf(n_docs, n) for term, n in counts.items()}
    for _ in range(2):
        seen.clear()
        results = index.score(["common"], idfs, total / n_docs, accept, 3)
        assert results == bm25_rescore("common", list(docs.items()), 3)
        assert [doc for _, doc in results] == ["d001", "d002", "d003"]
        assert len(seen) < 10  # not 401
        index.remove("d002")  # buckets follow the posting
        index.add("d002", "common pad pad")


def test_bucket_order_is_not_reused_after_a_change_that_keeps_avgdl() -> None:
    """M6: a long posting's bucket order, kept between queries, is made again after any change,
    even one that leaves the mean length as it was (the order is keyed by both)."""
    index = InvertedIndex(impact_min=1)
    docs = {"a": "common pad pad", "b": "common pad pad pad pad"}
    for doc_id, text in docs.items():
        index.add(doc_id, text)

    def top() -> list[tuple[float, str]]:
        n_docs, total, counts = index.stats(["common"], None)
        idfs = {term: idf(n_docs, n) for term, n in counts.items()}
        return index.score(["common"], idfs, total / n_docs, None, 1)

    assert top() == bm25_rescore("common", list(docs.items()), 1)
    # Same count, same total length (avgdl 4 before and after), a bucket no query has seen.
    index.remove("b")
    del docs["b"]
    index.add("c", "common common pad pad pad")
    docs["c"] = "common common pad pad pad"
    assert top() == bm25_rescore("common", list(docs.items()), 1)
    assert [doc for _, doc in top()] == ["c"]


def test_bucket_order_follows_the_mean_length_each_query_brings() -> None:
    """M6: the candidates' mean length, which the caller passes, reorders a long posting's
    buckets; a query with another one must not prune by the order made for the last."""
    index = InvertedIndex(impact_min=1)
    index.add("short", "common pad")  # tf 1, length 2
    index.add("long", "common common" + " pad" * 8)  # tf 2, length 10
    idfs = {"common": 1.0}

    def expected(avgdl: float) -> str:
        def bm25(tf: int, dl: int) -> float:
            return tf * (K1 + 1) / (tf + K1 * (1 - B + B * dl / avgdl))

        return "short" if bm25(1, 2) > bm25(2, 10) else "long"

    assert expected(2.0) == "short"
    assert expected(20.0) == "long"
    for avgdl in (2.0, 20.0, 2.0):
        assert [doc for _, doc in index.score(["common"], idfs, avgdl, None, 1)] == [
            expected(avgdl)
        ]


def test_doc_reached_only_through_weaker_term_can_still_win() -> None:
    """M6: pruning never drops a doc whose weaker term alone outscores the rarer term's docs."""
    docs = {f"m{i}": "mid other" for i in range(3)}
    docs["best"] = "mid mid mid"
    docs["r"] = "rare " + "padding " * 12
    docs |= {f"f{i}": "filler" for i in range(10)}
    query = "rare mid"
    expected = bm25_rescore(query, list(docs.items()), 1)
    assert [doc for _, doc in expected] == ["best"]
    _assert_same_ranking(_combined([_index(docs)], query, 1), expected)


def test_score_rejects_non_positive_avgdl() -> None:
    """M6: avgdl must be positive; a caller with no text must not call score."""
    with pytest.raises(ValueError, match="avgdl"):
        _index({"a": "x"}).score(["x"], {"x": 1.0}, 0.0, None, 5)


_VOCAB = ["apple", "berry", "cherry", "date", "zürich", "x1", "y2"]
_SEPARATORS = [" ", ", ", "_", " -- ", "!\n"]


@st.composite
def _texts(draw: st.DrawFn) -> str:
    words = draw(st.lists(st.sampled_from(_VOCAB), max_size=8))
    separator = draw(st.sampled_from(_SEPARATORS))
    return separator.join(words)


_IDS = [f"doc{i:02d}" for i in range(12)]


@settings(max_examples=300, deadline=None)
@given(
    initial=st.dictionaries(st.sampled_from(_IDS), _texts(), max_size=12),
    replacements=st.lists(st.tuples(st.sampled_from(_IDS), _texts()), max_size=6),
    removals=st.sets(st.sampled_from([*_IDS, "ghost"]), max_size=6),
    accepted=st.none() | st.sets(st.sampled_from(_IDS)),
    use_universe=st.booleans(),
    query=st.lists(st.sampled_from([*_VOCAB, "missing", "APPLE"]), max_size=4).map(" ".join),
    limit=st.integers(0, 7),
    n_indexes=st.integers(2, 3),
    data=st.data(),
)
def test_split_indexes_match_rescore_over_accepted_docs(
    initial: dict[str, str],
    replacements: list[tuple[str, str]],
    removals: set[str],
    accepted: set[str] | None,
    use_universe: bool,
    query: str,
    limit: int,
    n_indexes: int,
    data: st.DataObject,
) -> None:
    """M6: stats/score/merge_top over 2-3 indexes equal bm25_rescore over accepted docs."""
    shard = {doc: data.draw(st.integers(0, n_indexes - 1)) for doc in _IDS}
    # Impact buckets for every posting, or for none: both ways of reading must agree.
    impact_min = data.draw(st.sampled_from([1, 2, 10_000]))
    indexes = [InvertedIndex(impact_min) for _ in range(n_indexes)]
    model: dict[str, str] = {}
    for doc, text in initial.items():
        indexes[shard[doc]].add(doc, text)
        model[doc] = text
    _combined(indexes, query, max(limit, 1))  # builds the buckets the query reads, then...
    for doc, text in replacements:  # ...every change below must keep them exact
        indexes[shard[doc]].add(doc, text)
        model[doc] = text
    for doc in removals:
        if doc in shard:
            indexes[shard[doc]].remove(doc)
        model.pop(doc, None)

    accept = None if accepted is None else accepted.__contains__
    universe = None
    if use_universe:
        extra = data.draw(st.sets(st.sampled_from([*_IDS, "ghost"])))
        universe = (set(model) if accepted is None else accepted) | extra
        if accept is None:
            accept = universe.__contains__
    candidates = [(doc, text) for doc, text in model.items() if accept is None or accept(doc)]

    terms = query_terms(query)
    stats = [index.stats(terms, accept, universe) for index in indexes]
    assert sum(n_docs for n_docs, _, _ in stats) == len(candidates)
    assert sum(total for _, total, _ in stats) == sum(len(tokenize(t)) for _, t in candidates)
    for term in terms:
        in_term = sum(1 for _, text in candidates if term in tokenize(text))
        assert sum(counts[term] for _, _, counts in stats) == in_term

    expected = bm25_rescore(query, candidates, limit)
    _assert_same_ranking(_combined(indexes, query, limit, accept, universe), expected)
    _assert_same_ranking(search(indexes, query, limit, accept, universe), expected)
    assert all(score > 0 for score, _ in expected)
    assert len(expected) <= limit
