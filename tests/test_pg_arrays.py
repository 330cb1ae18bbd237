"""The append procedure's arrays, packed in the binary wire format (ADR 0051, J2, R7).

Each packed array is sent to a real PostgreSQL server and read back: the server's own
``array_recv`` is the judge of the format.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need the postgres extra")

from journaled.events.journal import _pg_arrays  # noqa: E402 - after the extra's check
from journaled.events.journal import _postgres as _  # noqa: E402, F401 - registers the dumpers

TEXTS = [
    [],
    [""],
    ["run_1", "run_2"],
    ["é", "日本語", "🙂 emoji", "x" * 70_000],
    ["a,b", '{"c"}', "NULL", "\\", " spaced "],
]
INTEGERS = [[], [0], [1, -1], [2**63 - 1, -(2**63)], list(range(300))]
BYTES = [[], [b""], [b"\x00\x01\xff"], [b"\x00" * 5, b"q" * 100_000], [bytes(range(256))]]


@pytest.fixture
def conn(pg_url: str) -> Iterator[Any]:
    """A connection to a fresh database of the session's server."""
    with psycopg.connect(pg_url, autocommit=True) as connection:
        yield connection


@pytest.mark.parametrize("values", TEXTS)
def test_a_text_array_reads_back_as_sent(conn: Any, values: list[str]) -> None:
    """J2: strings of every shape arrive element for element, in order."""
    row = conn.execute("SELECT %s::text[]", [_pg_arrays.text_array(values)]).fetchone()
    assert row[0] == values


@pytest.mark.parametrize("values", INTEGERS)
def test_a_bigint_array_reads_back_as_sent(conn: Any, values: list[int]) -> None:
    """J2: versions up to the signed 64-bit bounds arrive exactly."""
    row = conn.execute("SELECT %s::bigint[]", [_pg_arrays.int8_array(values)]).fetchone()
    assert row[0] == values


@pytest.mark.parametrize("values", BYTES)
def test_a_bytea_array_reads_back_as_sent(conn: Any, values: list[bytes]) -> None:
    """J2, R7: payloads with NUL bytes and every byte value arrive byte for byte."""
    row = conn.execute("SELECT %s::bytea[]", [_pg_arrays.bytea_array(values)]).fetchone()
    assert [bytes(v) for v in row[0]] == values


def test_the_arrays_have_the_element_types_the_procedure_declares(conn: Any) -> None:
    """J2: without a cast the server sees text[], bigint[] and bytea[] (the wrappers' oids)."""
    row = conn.execute(
        "SELECT pg_typeof(%s)::text, pg_typeof(%s)::text, pg_typeof(%s)::text",
        [
            _pg_arrays.text_array(["a"]),
            _pg_arrays.int8_array([1]),
            _pg_arrays.bytea_array([b"a"]),
        ],
    ).fetchone()
    assert row == ("text[]", "bigint[]", "bytea[]")


def test_a_lone_surrogate_is_refused_before_anything_is_sent() -> None:
    """J2: text UTF-8 cannot hold fails in the client, naming the character."""
    with pytest.raises(UnicodeEncodeError, match="surrogate"):
        _pg_arrays.text_array(["ok", "\ud800"])


def test_an_integer_past_64_bits_is_refused_before_anything_is_sent() -> None:
    """J2: a version beyond bigint fails in the client instead of wrapping around."""
    with pytest.raises(struct.error):
        _pg_arrays.int8_array([2**63])


def test_a_nul_in_text_is_refused_by_the_server(conn: Any) -> None:
    """J2: PostgreSQL text cannot hold NUL: the server refuses the array, whole."""
    with pytest.raises(psycopg.errors.CharacterNotInRepertoire):
        conn.execute("SELECT %s::text[]", [_pg_arrays.text_array(["a\x00b"])])


def test_bytes_whose_element_type_is_not_the_arrays_are_refused_by_the_server(conn: Any) -> None:
    """J2: the server checks the packed element type: bytea elements never pass for text."""
    forged = _pg_arrays.TextArray(_pg_arrays.bytea_array([b"a"]))
    expected = re.escape("element type 17 (bytea) instead of expected 25 (text)")
    with pytest.raises(psycopg.errors.DatatypeMismatch, match=expected):
        conn.execute("SELECT %s", [forged])


def test_any_bytes_like_payload_is_packed_as_its_bytes(conn: Any) -> None:
    """J2: a bytearray or memoryview payload arrives as the same bytes, as psycopg's lists did."""
    values: list[bytes | bytearray | memoryview] = [
        bytearray(b"ab\x00"),
        memoryview(b"cd\xff"),
        b"ef",
    ]
    row = conn.execute("SELECT %s::bytea[]", [_pg_arrays.bytea_array(values)]).fetchone()
    assert [bytes(v) for v in row[0]] == [b"ab\x00", b"cd\xff", b"ef"]


def test_the_dumpers_leave_psycopgs_own_arrays_alone_elsewhere(conn: Any) -> None:
    """J2 (ADR 0051): lists, and a binary COPY of text[] by oid, still use psycopg's dumpers."""
    conn.execute("CREATE TABLE copied (a text[], b bigint[])")
    with conn.cursor() as cur, cur.copy("COPY copied (a, b) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(["text[]", "int8[]"])
        copy.write_row([["x", "é"], [1, -2]])
    assert conn.execute("SELECT a, b FROM copied").fetchone() == (["x", "é"], [1, -2])
    assert conn.execute("SELECT %s::text[]", [["y", "z"]]).fetchone()[0] == ["y", "z"]


def test_text_reaches_the_journal_as_utf8_whatever_the_client_encoding(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """J2, R7: with PGCLIENTENCODING=LATIN1 in the environment, a stream id holding non-ASCII
    letters is stored as the same characters (the journal's connections speak UTF-8)."""
    from journaled.events.base import Pending
    from journaled.events.catalog import codec
    from journaled.events.journal import Journal
    from journaled.events.runs import StepStarted
    from journaled.events.url import parse_url

    monkeypatch.setenv("PGCLIENTENCODING", "LATIN1")
    stream = "run_é日本"
    journal = Journal(parse_url(pg_url), codec())
    try:
        event = StepStarted(at=1, step_id="a", attempt=1, wave=1)
        journal.append([Pending(stream=stream, version=1, data=event)])
        assert [e.data for e in journal.stream(stream)] == [event]
        assert journal.verify().ok
    finally:
        journal.close()
    with psycopg.connect(pg_url, autocommit=True, client_encoding="UTF8") as check:
        stored = check.execute(
            "SELECT encode(convert_to(originator_id, 'UTF8'), 'hex') FROM journaled_events"
        ).fetchall()
    assert stored == [(stream.encode("utf-8").hex(),)]
