"""Reciprocal rank fusion of several rankings into one (hybrid search, ADR 0047).

A document's fused score is the sum, over the rankings that hold it, of ``1 / (k + rank)``
with ranks counted from 1 (Cormack, Clarke and Büttcher, SIGIR 2009). Only ranks enter, so
BM25 scores and cosines, which live on unrelated scales, need no normalising, and ``k = 60``
damps the weight of the very first places so that agreement between rankings counts more
than one ranking's conviction.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["FUSION_WINDOW", "RRF_K", "reciprocal_rank_fusion"]

RRF_K: int = 60
"""The rank constant k of reciprocal rank fusion (the published default)."""

FUSION_WINDOW: int = 100
"""How deep each ranking is read before fusing: ``max(limit, FUSION_WINDOW)`` places."""


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[str]], k: int = RRF_K
) -> list[tuple[float, str]]:
    """Fuse rankings of ids, best first, into one: fused score desc, then id asc.

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
    return sorted(((s, d) for d, s in scores.items()), key=lambda h: (-h[0], h[1]))
