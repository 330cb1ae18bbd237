"""A purged text leaves no way to test a guess of it (M10, R2, ADR 0096).

The digest chain keeps, in the commit that wrote a payload, the hash of its row, so the chain
still verifies after a purge (R7). Rows are salted: the salt is erased with the row, so the
hash left behind confirms no guess, however few the possible texts.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import msgspec
import pytest

import journaled
from journaled.events.journal._digest import SALT_SIZE, SEALED, sealed, unsealed


def _everything_stored(path: Path) -> bytes:
    """Every value of every table of the file, joined."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        out: list[bytes] = []
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):  # noqa: S608
                out += [v if isinstance(v, bytes) else str(v).encode() for v in row if v]
        return b"\x00".join(out)
    finally:
        conn.close()


def _unsalted_hash(key: str, value: bytes) -> bytes:
    """What a row's hash would be without its salt: the test a reader of the file could make."""
    return hashlib.sha256(msgspec.msgpack.encode((key, value))).digest()[:16]


def test_a_purged_pin_cannot_be_found_by_guessing_it_against_the_file(tmp_path: Path) -> None:
    """A fact of 10,000 possible texts is purged: none of the 10,000 guesses matches anything
    the file holds (before the salt, the right one matched its hash in the chain), and the
    chain still verifies."""
    db = tmp_path / "journal.sqlite"
    with journaled.open(f"sqlite:///{db}") as rt:
        fact = rt.memory.remember("Alice's door PIN is 4711")
        rt.memory.remember("a fact that stays")
        assert rt.memory.purge(fact.id, reason="erasure request")
        rt.memory.scrub()
        assert rt.journal.verify().ok
    stored = _everything_stored(db)
    assert b"4711" not in stored
    matches = [
        pin
        for pin in range(10_000)
        if _unsalted_hash(fact.id, f"Alice's door PIN is {pin:04d}".encode()) in stored
    ]
    assert matches == []


def test_a_purged_runs_short_answers_cannot_be_guessed(tmp_path: Path) -> None:
    """R2: a run's content rows are salted too: a step's yes-or-no output, once the run is
    purged, matches no guess."""
    db = tmp_path / "journal.sqlite"
    with journaled.open(f"sqlite:///{db}") as rt:
        rt.register_tool("decide", lambda x: "yes")
        done = rt.execute(journaled.Plan(goal="g", steps=[journaled.Step("d", tool="decide")]))
        assert done.ok
        history = rt.runs.history(done.run_id)
        assert rt.runs.purge(done.run_id, "erasure request") > 0
        rt.memory.scrub()
        assert rt.journal.verify().ok
    stored = _everything_stored(db)
    for event in history:
        key = f"{done.run_id}@{event.version}"
        for guess in ("yes", "no"):
            for values in ([guess, None, None], [guess]):
                assert _unsalted_hash(key, msgspec.msgpack.encode(values)) not in stored


def test_every_row_gets_a_salt_of_its_own() -> None:
    """ADR 0096: the same value under one key is stored differently each time, reads back
    whole, and a row of an earlier release (no mark) reads as stored."""
    first, second = sealed({"k": b"same"}), sealed({"k": b"same"})
    assert first["k"] != second["k"]
    assert first["k"][:1] == SEALED
    assert len(first["k"]) == 1 + SALT_SIZE + len(b"same")
    assert unsealed(first["k"]) == unsealed(second["k"]) == b"same"
    assert unsealed(b"\x93\x01\x02\x03") == b"\x93\x01\x02\x03"  # msgpack, as stored before
    assert unsealed(b"plain text") == b"plain text"
    assert sealed({}) == {}


@pytest.mark.parametrize("text", ["é", "a\x00b", "\u00c1 begins as the mark's byte", "x" * 100_000])
def test_odd_texts_read_back_exactly(tmp_path: Path, text: str) -> None:
    """A text of any shape the memory takes reads back exactly through the salt, after a
    reopen too (Á's UTF-8 begins with 0xC3, never the mark's 0xC1)."""
    with journaled.open(f"sqlite:///{tmp_path / 'journal.sqlite'}") as rt:
        fact = rt.memory.remember(text)
    with journaled.open(f"sqlite:///{tmp_path / 'journal.sqlite'}") as rt:
        kept = rt.memory.get(fact.id)
        assert kept is not None
        assert kept.text == text
