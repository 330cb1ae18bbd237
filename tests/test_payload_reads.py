"""Many payloads read by key on SQLite: ranges where keys are dense, keys where not (ADR 0058)."""

from __future__ import annotations

import random

import pytest

from journaled.events.base import Pending
from journaled.events.catalog import STORED_EVENTS
from journaled.events.codec import Codec
from journaled.events.journal import Journal
from journaled.events.journal import _sqlite as sqlite_journal
from journaled.events.memory import FactRemembered
from journaled.events.url import parse_url

_KEYS = [f"mem_{i:05d}" for i in range(3000)] + ["mem_é", "mem_\U0001f600", "run-a@1", "a"]
"""Payload keys: dense ones, a few beyond ASCII (text compares bytewise), and strangers."""


def _fill(journal: Journal) -> None:
    for start in range(0, len(_KEYS), 500):
        chunk = _KEYS[start : start + 500]
        journal.append(
            [
                Pending(stream=k, version=1, data=FactRemembered(at=1, fact_id=k, scope="project"))
                for k in chunk
            ],
            payloads={k: f"text of {k}".encode() for k in chunk},
        )


@pytest.fixture
def filled(sqlite_url: str) -> Journal:
    journal = Journal(parse_url(sqlite_url), Codec(STORED_EVENTS))
    _fill(journal)
    return journal


def _expected(wanted: list[str]) -> dict[str, bytes]:
    return {k: f"text of {k}".encode() for k in wanted if k in _KEYS}


@pytest.mark.parametrize(
    "wanted",
    [
        pytest.param(_KEYS[:2000], id="dense"),
        pytest.param(_KEYS[::10], id="one-in-ten"),
        pytest.param([*_KEYS[::3], "mem_missing", "mem_99999", "zz"], id="some-missing"),
        pytest.param(_KEYS[:40] + _KEYS[:40], id="repeated-keys"),
        pytest.param(list(reversed(_KEYS)), id="every-key-reversed"),
        pytest.param(_KEYS[2990:], id="beyond-ascii"),
        pytest.param(_KEYS[:5], id="few"),
        pytest.param([], id="none"),
    ],
)
def test_many_payloads_read_by_key_are_exactly_the_wanted_ones(
    filled: Journal, wanted: list[str]
) -> None:
    """Whatever the keys' order, density and repetition, the answer holds each wanted key that
    has a payload, with its payload, and nothing else."""
    try:
        assert filled.payloads(wanted) == _expected(wanted)
    finally:
        filled.close()


def test_dense_keys_are_read_as_ranges_and_sparse_ones_by_key(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """500 dense keys take one range read; keys spread thinner than the slack allows fall back
    to their keys, so a few wanted keys never cost a scan of everything between them."""
    statements: list[str] = []
    create = sqlite_journal._Pool._create_connection

    def traced(self: sqlite_journal._Pool) -> object:
        conn = create(self)
        conn._sqlite_conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(sqlite_journal._Pool, "_create_connection", traced)
    journal = Journal(parse_url(sqlite_url), Codec(STORED_EVENTS))
    try:
        _fill(journal)

        def reads(wanted: list[str]) -> list[str]:
            statements.clear()
            assert journal.payloads(wanted) == _expected(wanted)
            return [s for s in statements if "journaled_payloads" in s and "SELECT" in s]

        dense = reads(_KEYS[:500])
        assert len(dense) == 1
        assert " IN (" not in dense[0]
        sparse = reads(random.Random(1).sample(_KEYS[:3000:40], 60))
        assert len(sparse) == 2  # the range, cut off at its limit, then the keys
        assert " IN (" in sparse[1]
    finally:
        journal.close()


def test_the_first_events_of_many_streams_on_every_backend(journal_url: str) -> None:
    """Journal.firsts: the first event of each stream asked for that has one, in one read per
    500 streams; streams without events and repeated names are no trouble."""
    journal = Journal(parse_url(journal_url), Codec(STORED_EVENTS))
    try:
        streams = [f"mem_{i:04d}" for i in range(1200)]
        for start in range(0, len(streams), 400):
            chunk = streams[start : start + 400]
            journal.append(
                [
                    Pending(stream=k, version=1, data=FactRemembered(at=1, fact_id=k, scope="user"))
                    for k in chunk
                ]
            )
        journal.append(
            [
                Pending(
                    stream="mem_0000",
                    version=2,
                    data=FactRemembered(at=2, fact_id="x", scope="user"),
                )
            ]
        )
        asked = [*streams[::3], "absent", streams[0], streams[0]]
        found = journal.firsts(asked)
        assert set(found) == set(streams[::3])
        assert all(e.version == 1 and e.data.fact_id == s for s, e in found.items())  # type: ignore[attr-defined]
        assert journal.firsts([]) == {}
    finally:
        journal.close()


def test_the_head_of_a_stream_on_every_backend(journal_url: str) -> None:
    """Journal.head: the first event's position and tag (no version), None for no events."""
    journal = Journal(parse_url(journal_url), Codec(STORED_EVENTS))
    try:
        assert journal.head("mem_a") is None
        [first] = journal.append(
            [
                Pending(
                    stream="mem_a", version=1, data=FactRemembered(at=1, fact_id="a", scope="user")
                )
            ]
        )
        journal.append(
            [
                Pending(
                    stream="mem_a", version=2, data=FactRemembered(at=2, fact_id="a", scope="user")
                )
            ]
        )
        assert journal.head("mem_a") == (first, "memory.fact-remembered")
        assert journal.head("mem_b") is None
    finally:
        journal.close()
