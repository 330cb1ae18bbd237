"""Purge erases a fact's text from the SQLite file itself: main file, WAL and free pages (M10)."""

from __future__ import annotations

from pathlib import Path

import journaled
from journaled.testing import ManualClock


def _bytes_on_disk(directory: Path) -> bytes:
    """Return every byte of every file the journal left in its directory."""
    return b"".join(p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file())


def test_purged_text_leaves_the_files(tmp_path: Path) -> None:
    """M10: after purge the text is in no file of the journal (db, -wal, -shm), live or freed."""
    secret = "the vault combination is 31-41-59-26"
    marker = b"31-41-59-26"
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    clock = ManualClock(step=1)
    with journaled.open(url, clock=clock) as rt:
        fact = rt.memory.remember(secret, conflict_key="vault")
        for i in range(50):  # enough rows that pages split and the text moves around
            rt.memory.remember(f"filler fact number {i} " + "x" * 200)
        rt.memory.remember("the vault combination changed", conflict_key="vault")
        assert marker in _bytes_on_disk(tmp_path)
        assert rt.memory.purge(fact.id, reason="compliance request")
        assert marker not in _bytes_on_disk(tmp_path)
        assert "compliance request" in rt.memory.why(fact.id)
    assert marker not in _bytes_on_disk(tmp_path)
    with journaled.open(url, clock=clock) as rt:
        assert rt.memory.get(fact.id) is None
        history = [e.kind for e in rt.memory.history(fact.id)]
        assert history[0] == "memory.fact-remembered"
        assert history[-1] == "memory.fact-purged"
        assert all(b"31-41" not in repr(e).encode() for e in rt.journal.read())
