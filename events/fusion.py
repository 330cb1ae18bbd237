"""Fusing a BM25 ranking with a cosine ranking into one (hybrid search, ADR 0047).

:func:`convex_fusion` is what ``search_hybrid`` uses: a convex combination of the two scores, each
normalised by its theoretical range (Bruch, Gai and Ingber, "An Analysis of Fusion Functions for
Hybrid Retrieval", ACM TOIS 2023, "TM2C2"). BM25 is bounded below by 0 and is divided by the best
BM25 score of the query; cosine is used as is, since hits of cosine <= 0 are dropped (M7) and
what is left lies in (0, 1]. Every fact with a score in either ranking is fused, however far
down the other it sits (ADR 0047's update); a fact with none in one ranking scores 0 there.

:func:`reciprocal_rank_fusion` (Cormack, Clarke and Büttcher, SIGIR 2009) is the alternative ADR
0047 measured and did not choose: it throws the scores away and keeps only ranks, so a weak
ranking's top places weigh as much as a strong one's; ``bench/recall.py`` prints both.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "LEXICAL_WEIGHT",
    "RRF_K",
    "convex_fusion",
    "reciprocal_rank_fusion",
]

LEXICAL_WEIGHT: float = 0.5
"""The weight of normalised BM25 in the convex combination; cosine gets the rest (untuned)."""

RRF_K: int = 60
"""The rank constant k of reciprocal rank fusion (the published default)."""


def _best_first(scores: dict[str, float]) -> list[tuple[float, str]]:
    return sorted(((s, d) for d, s in scores.items()), key=lambda h: (-h[0], h[1]))


def convex_fusion(
    lexical: Sequence[tuple[float, str]],
    semantic: Sequence[tuple[float, str]],
    weight: float = LEXICAL_WEIGHT,
) -> list[tuple[float, str]]:
    """Fuse ``(bm25, id)`` and ``(cosine, id)`` hits: fused score desc, then id asc.

    The fused score is ``weight * bm25 / max(bm25) + (1 - weight) * cosine``.

    Args:
        lexical: BM25 hits, scores > 0, ids distinct.
        semantic: Cosine hits, scores in (0, 1], ids distinct.
        weight: The share of BM25, in [0, 1].

    Returns:
        ``(score, id)`` for every id in either list.
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight must be in [0, 1], got {weight}")
    top = max((s for s, _ in lexical), default=0.0)
    scores: dict[str, float] = {}
    if top > 0:
        for score, doc in lexical:
            scores[doc] = weight * (score / top)
    for score, doc in semantic:
        scores[doc] = scores.get(doc, 0.0) + (1.0 - weight) * score
    return _best_first(scores)


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[str]], k: int = RRF_K
) -> list[tuple[float, str]]:
    """Fuse rankings of ids, best first, into one: fused score desc, then id asc.

    A document's score is the sum, over the rankings that hold it, of ``1 / (k + rank)``, ranks
    counted from 1.

    Args:
        rankings: Each a list of distinct ids, best first. A ranking may be empty.
        k: The rank constant; must be >= 0.

    Returns:
        ``(score, id)`` for every id found in any ranking.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, doc in enumerate(ranking, start=1):
            scores[doc] = scores.get(doc, 0.0) + 1.0 / (k + rank)
    return _best_first(scores)
