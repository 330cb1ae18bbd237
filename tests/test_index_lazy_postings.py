"""An index restored from a snapshot decodes each term's posting on first use (ADR 0060, M6).

Every check compares the restored index, changed after its restore, with an index built from
scratch out of the same documents: the same postings, the same BM25 rankings (exact scores),
the same statistics, and the same again after a second snapshot of the restored one.
"""

from __future__ import annotations

import random

import msgspec
import pytest

from journaled.events.inverted_index import IndexSnapshot, InvertedIndex, search

_WORDS = [f"w{i}" for i in range(40)]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS[: rng.randint(3, 40)]) for _ in range(rng.randint(1, 12)))


def _snapshotted(index: InvertedIndex) -> InvertedIndex:
    """Encode an index's export and restore it, as memory's snapshot does."""
    data = msgspec.msgpack.encode(index.export())
    return InvertedIndex.restore(msgspec.msgpack.decode(data, type=IndexSnapshot), impact_min=4)


def _same(restored: InvertedIndex, docs: dict[str, str]) -> None:
    fresh = InvertedIndex(impact_min=4)
    for doc_id, text in docs.items():
        fresh.add(doc_id, text)
    assert len(restored) == len(fresh)
    for word in [*_WORDS, "absent"]:
        assert dict(restored.postings(word)) == dict(fresh.postings(word)), word
        assert restored.count(word) == fresh.count(word), word
    for query in ["w1", "w2 w3", "w0 w5 w39", "w7 w7 w8", "absent w4", " ".join(_WORDS)]:
        for limit in (1, 3, 50):
            assert search([restored], query, limit) == search([fresh], query, limit), query


@pytest.mark.parametrize("seed", range(8))
def test_a_restored_index_changed_afterwards_equals_one_built_from_scratch(seed: int) -> None:
    """Adds of terms not yet decoded, removals that empty a posting, re-adds of a removed
    document and a second snapshot all leave the index as a fresh build of the documents."""
    rng = random.Random(seed)
    docs = {f"d{i}": _text(rng) for i in range(60)}
    built = InvertedIndex(impact_min=4)
    for doc_id, text in docs.items():
        built.add(doc_id, text)
    restored = _snapshotted(built)
    _same(restored, docs)
    for step in range(120):
        doc_id = f"d{rng.randrange(90)}"
        if doc_id in docs and rng.random() < 0.5:
            restored.remove(doc_id)
            del docs[doc_id]
        else:
            docs[doc_id] = _text(rng)
            restored.add(doc_id, docs[doc_id])
        if step % 40 == 39:
            _same(restored, docs)
            restored = _snapshotted(restored)
    _same(restored, docs)


def test_a_term_whose_last_document_goes_does_not_come_back() -> None:
    """A posting emptied by a removal is gone with its encoding: a later use finds nothing,
    and a later add starts it afresh."""
    built = InvertedIndex()
    built.add("a", "rare common")
    built.add("b", "common")
    restored = _snapshotted(built)
    restored.remove("a")
    assert dict(restored.postings("rare")) == {}
    assert search([restored], "rare", 5) == []
    restored.add("c", "rare")
    assert dict(restored.postings("rare")) == {"c": 1}
    assert [doc for _, doc in search([restored], "rare", 5)] == ["c"]


def test_an_add_of_a_term_not_yet_decoded_keeps_its_restored_documents() -> None:
    """A document added under a term nobody has used since the restore joins the posting the
    snapshot held; it does not start the posting over."""
    built = InvertedIndex()
    built.add("a", "deploy region")
    restored = _snapshotted(built)
    restored.add("b", "deploy")
    assert dict(restored.postings("deploy")) == {"a": 1, "b": 1}


def test_a_restore_decodes_no_posting_until_a_term_is_used() -> None:
    """What a restore saves: the postings stay encoded; a search decodes only its terms."""
    built = InvertedIndex()
    for i in range(30):
        built.add(f"d{i}", f"w{i % 7} w{i % 5} common")
    restored = _snapshotted(built)
    assert restored._postings == {}
    assert len(restored._packed) == len({f"w{i}" for i in range(7)} | {"common"})
    search([restored], "w3", 5)
    assert set(restored._postings) == {"w3"}
