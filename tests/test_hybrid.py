"""Hybrid search (SPEC M6 + M7, ADR 0047) and the vector cache beside the journal (ADR 0048)."""

from __future__ import annotations

import asyncio
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import journaled
import journaled.aio
from journaled.actors.asking import ask_all
from journaled.embedders import VectorCache, digest
from journaled.events.bm25 import bm25_rescore
from journaled.events.fusion import convex_fusion, reciprocal_rank_fusion
from journaled.events.memory_state import cosine
from journaled.events.runs import MemoryRead
from journaled.semantic import _cosines
from journaled.testing import KeywordEmbedder, ManualClock, ScriptedEmbedder

# -- fusion ----------------------------------------------------------------------------------------


def test_convex_fusion_by_hand() -> None:
    """ADR 0047: fused = 0.5 * bm25 / best bm25 + 0.5 * cosine; absent counts 0; ties by id."""
    fused = convex_fusion([(4.0, "b"), (3.0, "a"), (1.0, "x")], [(0.9, "c"), (0.8, "a")])
    assert [d for _, d in fused] == ["a", "b", "c", "x"]
    assert [s for s, _ in fused] == pytest.approx([0.375 + 0.4, 0.5, 0.45, 0.125])
    assert convex_fusion([(2.0, "z")], [(1.0, "y")]) == [(0.5, "y"), (0.5, "z")]
    assert convex_fusion([], [(0.5, "y")], weight=0.0) == [(0.5, "y")]
    assert convex_fusion([], []) == []
    with pytest.raises(ValueError, match="weight"):
        convex_fusion([], [], weight=1.5)


def test_rrf_sums_reciprocal_ranks_by_hand() -> None:
    """ADR 0047 (the alternative measured): a score is sum 1/(60 + rank); ties by id."""
    fused = reciprocal_rank_fusion([["b", "a", "x"], ["c", "d", "a"]])
    assert fused == [
        (1 / 62 + 1 / 63, "a"),
        (1 / 61, "b"),
        (1 / 61, "c"),
        (1 / 62, "d"),
        (1 / 63, "x"),
    ]
    assert reciprocal_rank_fusion([[], []]) == []
    assert reciprocal_rank_fusion([["z", "y"]], k=0) == [(1.0, "z"), (0.5, "y")]


def test_rrf_refuses_a_negative_k() -> None:
    """ADR 0047: k below 0 would give a rank a negative or infinite weight."""
    with pytest.raises(ValueError, match="k must be >= 0"):
        reciprocal_rank_fusion([["a"]], k=-1)


VECTORS = {
    "alpha": [1.0, 0.0],  # the query
    "alpha beta": [0.6, 0.8],  # cosine 0.6
    "gamma": [1.0, 0.0],  # cosine 1
    "delta": [0.8, 0.6],  # cosine 0.8
    "alpha alpha": [0.0, 1.0],  # cosine 0: dropped from the semantic ranking
}


def test_hybrid_fuses_bm25_and_cosine_ranks(journal_url: str, clock: ManualClock) -> None:
    """ADR 0047: BM25 [B, A] and cosine [C, D, A] fuse to A, then B and C tied by id, then D.

    Every text has two tokens, so one length norm (1.2): BM25 = idf * 2.2 * tf / (tf + 1.2),
    A (tf 1) = idf * 1.0 and B (tf 2) = idf * 1.375; A's normalised BM25 is 1 / 1.375.
    """
    with journaled.open(journal_url, clock=clock, embedder=ScriptedEmbedder(VECTORS)) as rt:
        a = rt.memory.remember("alpha beta")
        b = rt.memory.remember("alpha alpha")
        c = rt.memory.remember("gamma")
        d = rt.memory.remember("delta")
        assert [f.id for f in rt.memory.search("alpha")] == [b.id, a.id]
        assert [f.id for f in rt.memory.search_semantic("alpha")] == [c.id, d.id, a.id]
        # A: 0.5 / 1.375 + 0.5 * 0.6 = 0.664; B: 0.5 * 1 = 0.5; C: 0.5 * 1 = 0.5; D: 0.5 * 0.8.
        expected = [a.id, *sorted([b.id, c.id]), d.id]
        assert [f.id for f in rt.memory.search_hybrid("alpha")] == expected
        assert [f.id for f in rt.memory.search_hybrid("alpha", limit=2)] == expected[:2]
        assert rt.memory.search_hybrid("alpha", limit=0) == []
        view = rt.memory.as_of(position=rt.journal.position())
        assert [f.id for f in view.search_hybrid("alpha")] == expected


def test_hybrid_keeps_the_bm25_score_of_a_fact_far_down_its_ranking(
    sqlite_url: str, clock: ManualClock
) -> None:
    """ADR 0047 (update): every candidate is fused with both of its scores. A fact 121st by
    BM25 but second by cosine wins; read to a depth of 100 places, it lost its BM25 part
    (fused 0.45) and fell below 120 facts that only BM25 finds (0.5) and one that only
    cosine finds (0.475).

    "alpha" x 3 facts all have two tokens; the target has tf 1 in three tokens, so its BM25 is
    idf * 2.2 / (1 + 1.2 * 1.5 / avgdl) > 0.35 of the best, and its fused score > 0.6.
    """
    vectors = {"alpha": [1.0, 0.0], "alpha beta gamma": [0.9, math.sqrt(0.19)]}
    vectors["zeta"] = [0.95, math.sqrt(1 - 0.95**2)]
    embedder = ScriptedEmbedder(vectors, default=[0.0, 1.0])  # cosine 0 for the rest
    with journaled.open(sqlite_url, clock=clock, embedder=embedder) as rt:
        for i in range(120):
            rt.memory.remember("alpha alpha", domain=f"d{i}")
        target = rt.memory.remember("alpha beta gamma")
        zeta = rt.memory.remember("zeta")
        by_bm25 = [f.id for f in rt.memory.search("alpha", limit=200)]
        assert by_bm25.index(target.id) == 120  # 121st: below a depth of 100
        assert [f.id for f in rt.memory.search_semantic("alpha", limit=2)] == [zeta.id, target.id]
        found = rt.memory.search_hybrid("alpha", limit=3)
        assert found[0].id == target.id
        assert zeta.id not in [f.id for f in found]  # 0.475 < 0.5 of the "alpha alpha" facts


@given(
    st.lists(
        st.tuples(
            st.lists(
                st.sampled_from(["tea", "cup", "pot", "leaf", "milk"]), min_size=1, max_size=4
            ),
            st.floats(-1.0, 1.0),
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(0, 45),
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_hybrid_equals_fusion_over_every_candidate_rescored(
    docs: list[tuple[list[str], float]], limit: int
) -> None:
    """ADR 0047: hybrid's answer is the best ``limit`` of the convex fusion of a from-scratch
    BM25 rescore and M7's cosine over every candidate, at any limit and store size."""
    texts = [f"{' '.join(words)} n{i}" for i, (words, _) in enumerate(docs)]
    vectors = {t: [x, math.sqrt(1 - x * x)] for t, (_, x) in zip(texts, docs, strict=True)}
    vectors["tea pot"] = [1.0, 0.0]
    with journaled.open("memory://", clock=ManualClock(), embedder=ScriptedEmbedder(vectors)) as rt:
        facts = [rt.memory.remember(t) for t in texts]
        lexical = bm25_rescore("tea pot", [(f.id, f.text) for f in facts], len(facts))
        semantic = [(s, f.id) for f in facts if (s := cosine([1.0, 0.0], vectors[f.text])) > 0]
        expected = [i for _, i in convex_fusion(lexical, semantic)[:limit]]
        assert [f.id for f in rt.memory.search_hybrid("tea pot", limit=limit)] == expected


def test_hybrid_applies_the_search_filters(sqlite_url: str, clock: ManualClock) -> None:
    """ADR 0047: scopes, domains and min_confidence keep out a fact however well it ranks."""
    with journaled.open(sqlite_url, clock=clock, embedder=ScriptedEmbedder(VECTORS)) as rt:
        kept = rt.memory.remember("alpha beta", domain="kept")
        rt.memory.remember("gamma", domain="other")
        rt.memory.remember("delta", domain="kept", confidence=0.2)
        rt.memory.remember("alpha alpha", scope="user", domain="kept")
        found = rt.memory.search_hybrid(
            "alpha", scopes=["project"], domains=["kept"], min_confidence=0.5
        )
        assert [f.id for f in found] == [kept.id]


def test_hybrid_answers_a_punctuation_query_by_meaning(sqlite_url: str, clock: ManualClock) -> None:
    """ADR 0047: a query without BM25 terms is ranked by cosine alone, not returned empty."""
    embedder = ScriptedEmbedder({"?!": [1.0, 0.0], "gamma": [1.0, 0.0]}, default=[0.0, 1.0])
    with journaled.open(sqlite_url, clock=clock, embedder=embedder) as rt:
        gamma = rt.memory.remember("gamma")
        rt.memory.remember("delta")
        assert rt.memory.search("?!") == []
        assert [f.id for f in rt.memory.search_hybrid("?!")] == [gamma.id]


@pytest.mark.parametrize(
    "embedder",
    [
        None,
        ScriptedEmbedder({}, fail=RuntimeError("model server down")),
        ScriptedEmbedder({"ports ship": [1.0, 0.0]}, default=[]),
        ScriptedEmbedder({"ship ports": [math.nan, 1.0]}, default=[1.0, 0.0]),
        ScriptedEmbedder({"ship ports": [1.0, 0.0]}, default=[math.inf, 0.0]),
    ],
    ids=["no-embedder", "embedder-raises", "unusable-query", "nan-query", "no-usable-candidate"],
)
def test_hybrid_falls_back_to_exactly_bm25(
    journal_url: str, clock: ManualClock, embedder: ScriptedEmbedder | None
) -> None:
    """ADR 0047, M7: when the embedder cannot help, hybrid answers exactly what search does."""
    with journaled.open(journal_url, clock=clock, embedder=embedder) as rt:
        for text in ["ports ship", "ports", "the ports ports", "nothing here"]:
            rt.memory.remember(text)
        expected = rt.memory.search("ship ports", limit=2)
        assert len(expected) == 2
        assert rt.memory.search_hybrid("ship ports", limit=2) == expected


def test_hybrid_with_no_candidates_is_empty(rt: journaled.Runtime) -> None:
    """ADR 0047: nothing passes the filters, so nothing is returned (BM25's answer)."""
    rt.memory.remember("alpha", domain="a")
    assert rt.memory.search_hybrid("alpha", domains=["b"]) == []


def test_hybrid_refuses_bad_arguments_naming_them(rt: journaled.Runtime) -> None:
    """ADR 0047: the same argument checks as search, one line naming the field."""
    with pytest.raises(journaled.InvalidArgument, match="limit"):
        rt.memory.search_hybrid("alpha", limit=-1)
    with pytest.raises(journaled.InvalidArgument, match="scopes"):
        rt.memory.search_hybrid("alpha", scopes="project")


# -- the vector cache (ADR 0048) -------------------------------------------------------------------


class NamedEmbedder(KeywordEmbedder):
    """A keyword embedder that names its model, so its vectors may be kept across restarts."""

    model = "keywords-v1"


WORDS = ["cat", "dog", "fish", "token"]


def test_cache_hit_embeds_each_fact_text_once(sqlite_url: str, clock: ManualClock) -> None:
    """ADR 0048: a second search embeds only the query; the fact texts come from the cache."""
    embedder = NamedEmbedder(WORDS)
    with journaled.open(sqlite_url, clock=clock, embedder=embedder) as rt:
        rt.memory.remember("cat dog")
        rt.memory.remember("dog fish")
        rt.memory.search_hybrid("dog")
        rt.memory.search_semantic("cat")
        assert embedder.calls == [["cat dog", "dog fish"], ["dog"], ["cat"]]


def test_cache_survives_a_restart(sqlite_url: str, clock: ManualClock) -> None:
    """ADR 0048: a reopened runtime ranks the same without embedding any fact text again."""
    with journaled.open(sqlite_url, clock=clock, embedder=NamedEmbedder(WORDS)) as rt:
        rt.memory.remember("cat dog")
        rt.memory.remember("dog fish")
        before = [f.id for f in rt.memory.search_hybrid("dog fish")]
    again = NamedEmbedder(WORDS)
    with journaled.open(sqlite_url, clock=clock, embedder=again) as rt:
        assert [f.id for f in rt.memory.search_hybrid("dog fish")] == before
    assert again.calls == [["dog fish"]]
    renamed = NamedEmbedder(WORDS)
    renamed.model = "keywords-v2"
    with journaled.open(sqlite_url, clock=clock, embedder=renamed) as rt:
        rt.memory.search_semantic("dog")
    assert renamed.calls[0] == ["cat dog", "dog fish"]  # another model: its own vectors


def _cached_digests(path: Path) -> set[bytes]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT digest FROM vectors").fetchall()
    db.close()
    return {row[0] for row in rows}


def test_purge_reaches_the_cache(tmp_path: Path, clock: ManualClock) -> None:
    """ADR 0048, M10: a purge drops the fact's vector from the file beside the journal."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, clock=clock, embedder=NamedEmbedder(WORDS)) as rt:
        gone = rt.memory.remember("cat fish")
        rt.memory.remember("dog")
        rt.memory.search_semantic("cat")
        cache = tmp_path / "journal.sqlite.vectors"
        assert _cached_digests(cache) == {digest("cat fish"), digest("dog")}
        assert rt.memory.purge(gone.id)
        assert _cached_digests(cache) == {digest("dog")}
        assert rt.memory.search_hybrid("cat") == []


def test_purge_while_closed_reaches_the_cache(tmp_path: Path, clock: ManualClock) -> None:
    """ADR 0048, M10: a purge by a runtime without the embedder is applied before any use."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, clock=clock, embedder=NamedEmbedder(WORDS)) as rt:
        gone = rt.memory.remember("cat fish")
        kept = rt.memory.remember("dog")
        rt.memory.search_semantic("cat")
    with journaled.open(url, clock=clock) as rt:
        assert rt.memory.purge(gone.id)
    cache = tmp_path / "journal.sqlite.vectors"
    assert digest("cat fish") in _cached_digests(cache)  # nobody with the cache saw it yet
    again = NamedEmbedder(WORDS)
    with journaled.open(url, clock=clock, embedder=again) as rt:
        assert [f.id for f in rt.memory.search_semantic("dog")] == [kept.id]
    assert _cached_digests(cache) == {digest("dog")}
    assert b"cat fish" not in cache.read_bytes()


def test_cache_holds_only_redacted_texts(tmp_path: Path, clock: ManualClock) -> None:
    """ADR 0048, M9: the embedder and the cache see a fact's redacted text, never the secret."""
    secret = "sk-" + "a" * 40
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    embedder = NamedEmbedder(WORDS)
    with journaled.open(url, clock=clock, embedder=embedder) as rt:
        fact = rt.memory.remember(f"the token is {secret}")
        rt.memory.search_semantic("token")
    assert secret not in fact.text
    assert embedder.calls[0] == [fact.text]
    assert _cached_digests(tmp_path / "journal.sqlite.vectors") == {digest(fact.text)}


def test_embedder_without_a_model_keeps_no_file(tmp_path: Path, clock: ManualClock) -> None:
    """ADR 0048: vectors of an embedder naming no model are cached for the open runtime only."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, clock=clock, embedder=KeywordEmbedder(WORDS)) as rt:
        rt.memory.remember("cat")
        rt.memory.search_semantic("cat")
    assert not (tmp_path / "journal.sqlite.vectors").exists()


def test_memory_cache_forgets_unlinked_vectors() -> None:
    """ADR 0048: the in-process cache drops a purged fact's vector unless another fact holds it."""
    cache = VectorCache(None)
    cache.put("m", [("f1", b"d1", [1.0]), ("f2", b"d1", [1.0]), ("f3", b"d3", [2.0])])
    assert cache.forget_facts(["f1", "f3"]) == 1
    assert cache.get("m", [b"d1", b"d3"]) == {b"d1": [1.0]}
    cache.put("m", [("f3", b"d3", [2.0])])  # a late put for a purged fact is refused
    assert len(cache) == 1


# -- the other doors -------------------------------------------------------------------------------


def test_hybrid_through_asyncio(sqlite_url: str, clock: ManualClock) -> None:
    """ADR 0047, A1: rt.memory.search_hybrid and a view's search_hybrid await on the aio runtime."""

    async def main() -> None:
        embedder = ScriptedEmbedder(VECTORS)
        async with journaled.aio.open(sqlite_url, clock=clock, embedder=embedder) as rt:
            a = await rt.memory.remember("alpha beta")
            b = await rt.memory.remember("alpha alpha")
            c = await rt.memory.remember("gamma")
            expected = [a.id, *sorted([b.id, c.id])]
            assert [f.id for f in await rt.memory.search_hybrid("alpha")] == expected
            view = await rt.memory.as_of(position=await rt.journal.position())
            assert [f.id for f in await view.search_hybrid("alpha")] == expected

    asyncio.run(main())


def test_hybrid_through_ctx_memory_is_journaled(sqlite_url: str, clock: ManualClock) -> None:
    """ADR 0047, P2: a step's ctx.memory.search_hybrid reads are journaled with their ids."""
    with journaled.open(sqlite_url, clock=clock, embedder=ScriptedEmbedder(VECTORS)) as rt:
        gamma = rt.memory.remember("gamma")
        rt.register_tool("recall", lambda q, ctx: [f.id for f in ctx.memory.search_hybrid(q)])
        plan = journaled.Plan(goal="g", steps=[journaled.Step("r", tool="recall", input="alpha")])
        result = rt.runs.execute(plan)
        assert result.ok, result
        assert result.observations[0].output == [gamma.id]
        reads = [e.data for e in rt.journal.read() if isinstance(e.data, MemoryRead)]
        assert [(r.fact_ids, r.ops) for r in reads] == [((gamma.id,), ("search_hybrid",))]


@given(
    st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=6),
    st.lists(st.lists(st.floats(-1e3, 1e3), min_size=0, max_size=7), max_size=5),
)
def test_fast_cosines_equal_m7_cosine_bit_for_bit(
    query: list[float], docs: list[list[float]]
) -> None:
    """M7: the ranker's cosine (query norm taken once) equals memory_state.cosine exactly."""
    facts = [(f"f{i}", v) for i, v in enumerate(docs)]
    assert [s for s, _ in _cosines(query, facts)] == [cosine(query, v) for v in docs]  # type: ignore[arg-type]


def test_unwritable_cache_keeps_vectors_in_memory(tmp_path: Path, clock: ManualClock) -> None:
    """ADR 0048: where no cache file can be made, search works with a per-runtime cache."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, clock=clock) as rt:
        cat = rt.memory.remember("cat")
    (tmp_path / "journal.sqlite.vectors").mkdir()  # a directory where the file would go
    embedder = NamedEmbedder(WORDS)
    with journaled.open(url, clock=clock, embedder=embedder) as rt:
        assert [f.id for f in rt.memory.search_semantic("cat")] == [cat.id]
        assert [f.id for f in rt.memory.search_semantic("cat")] == [cat.id]
    assert embedder.calls == [["cat"], ["cat"], ["cat"]]  # the fact once, the query twice


# -- one round of asks when one scope holds every candidate (M6) -----------------------------------


def test_search_in_one_scope_takes_one_round_and_stays_exact(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """M6: candidates in one scope are answered by one round of asks, equal to a rescore.

    This is the path by message, taken when a scope actor is busy: the door's reads in place
    (ADR 0053) are switched off here, and tested in test_memory_in_place.py.
    """
    import journaled.memory as door

    texts = ["tea at five", "tea and biscuits", "coffee at nine", "tea tea tea", "green tea"]
    facts = [rt.memory.remember(t) for t in texts]
    rt.memory.remember("tea in the user scope", scope="user")
    monkeypatch.setattr(rt.memory, "_shelves", [])
    rounds: list[str] = []
    real = ask_all

    def counting(refs: Any, message: Any, *args: Any, **kwargs: Any) -> Any:
        rounds.append(type(message).__name__)
        return real(refs, message, *args, **kwargs)

    monkeypatch.setattr(door, "ask_all", counting)
    expected = bm25_rescore("tea five", [(f.id, f.text) for f in facts], 3)
    found = rt.memory.search("tea five", scopes=["project"], limit=3)
    assert [f.id for f in found] == [i for _, i in expected]
    assert rounds == ["SearchStats"]
    rounds.clear()
    both = rt.memory.search("tea", limit=10)  # two scopes hold candidates: two rounds, exact
    assert rounds == ["SearchStats", "SearchScore"]
    every = [*facts, *[f for f in rt.memory.all() if f.scope == "user"]]
    assert [f.id for f in both] == [
        i for _, i in bm25_rescore("tea", [(f.id, f.text) for f in every], 10)
    ]
    rounds.clear()
    rt.memory.search("tea five", scopes=["project"], limit=3)  # not asked alone after a spread
    rt.memory.search("tea five", scopes=["project"], limit=3)  # ... then asked alone again
    assert rounds == ["SearchStats", "SearchScore", "SearchStats"]
