"""Erasure is final: no later write of any runtime puts a purged text back into storage (R2).

Runtime B purges a fact while runtime A, on the same journal, has not caught up yet (it does not
follow, so its fold still holds the text and its index tokens). Whatever A then writes — an asked
checkpoint, the automatic snapshot, the snapshot on close — must not carry the text.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

import journaled
from journaled.actors.asking import ask
from journaled.actors.memory import MemoryWriter
from journaled.events.base import Pending
from journaled.events.journal import SNAPSHOT_TABLE
from journaled.events.memory import FactPurged
from journaled.events.messages import SaveSnapshot
from journaled.testing import ManualClock

MARKER = "quokkazanzibar"
"""One word: it is both in the fact's text and, as an index token, in a scope's snapshot."""


def _stored_anywhere(url: str, marker: bytes) -> list[str]:
    """Return where the marker is stored: snapshot rows, payload rows, and (SQLite) any file."""
    where: list[str] = []
    if url.startswith("postgresql"):
        with psycopg.connect(url) as conn:
            for table, column in ((SNAPSHOT_TABLE, "state"), ("journaled_payloads", "payload")):
                row = conn.execute(
                    f"SELECT count(*) FROM {table} WHERE position(%s::bytea IN {column}) > 0",  # noqa: S608
                    [marker],
                ).fetchone()
                assert row is not None
                if row[0]:
                    where.append(table)
        return where
    directory = Path(url.removeprefix("sqlite:///")).parent
    return [p.name for p in sorted(directory.iterdir()) if p.is_file() and marker in p.read_bytes()]


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Return a journal URL two runtimes can share (a file, or a PostgreSQL database)."""
    if request.param == "postgresql":
        url: str = request.getfixturevalue("pg_url")
        return url
    return f"sqlite:///{tmp_path / 'journal.sqlite'}"


@pytest.mark.parametrize("write", ["checkpoint", "automatic snapshot", "close"])
def test_a_runtime_behind_a_purge_never_writes_the_text_back(
    shared_url: str, write: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2: after B's purge, A's checkpoint, automatic snapshot or close stores no purged text."""
    monkeypatch.setattr(MemoryWriter, "auto_snapshot_events", 1_000_000)
    monkeypatch.setattr(journaled.runtime, "SNAPSHOT_MIN_EVENTS", 1)
    clock = ManualClock(step=1)
    marker = MARKER.encode()
    a = journaled.open(shared_url, clock=clock, follow=None)
    try:
        fact = a.memory.remember(f"the vault opens with {MARKER} twice")
        kept = a.memory.remember("the office plant wants water on mondays")
        with journaled.open(shared_url, clock=clock, follow=None) as b:
            assert b.memory.purge(fact.id, reason="erasure request")
        assert _stored_anywhere(shared_url, marker) == []
        assert a.memory.get(fact.id) is not None  # A has not caught up: its fold holds the text
        if write == "checkpoint":
            assert a.memory.checkpoint()
        elif write == "automatic snapshot":
            monkeypatch.setattr(MemoryWriter, "auto_snapshot_events", 1)
            ask(a._actors.writer, SaveSnapshot(auto=True))
        else:
            a.close()
        assert _stored_anywhere(shared_url, marker) == []
    finally:
        a.close()
    with journaled.open(shared_url, clock=clock) as c:
        assert c.memory.get(fact.id) is None
        assert c.memory.get(kept.id) is not None
        assert c.memory.search(MARKER) == []
    assert _stored_anywhere(shared_url, marker) == []


def test_a_snapshot_folded_before_a_purge_is_refused_by_the_journal(
    journal_url: str,
) -> None:
    """R2: the journal refuses, in the write's transaction, a snapshot older than a purge."""
    with journaled.open(journal_url, clock=ManualClock(step=1)) as rt:
        journal: Any = rt._journal
        fact = rt.memory.remember("words")
        before = journal.position()
        assert journal.save_snapshot(
            "probe", before, b"state", unless_after=("memory.fact-purged@",)
        )
        journal.append(
            [Pending(stream=fact.id, version=2, data=FactPurged(at=2, fact_id=fact.id))],
            forget=[fact.id],
        )
        assert not journal.save_snapshot(
            "probe", before, b"later", unless_after=("memory.fact-purged@",)
        )
        assert journal.snapshot("probe") == (before, b"state")
        assert journal.save_snapshot(
            "probe", journal.position(), b"after", unless_after=("memory.fact-purged@",)
        )


def test_purges_racing_snapshots_of_another_runtime_leave_no_text(shared_url: str) -> None:
    """R2: purges racing another runtime's snapshots fail none of them and leave no text stored."""
    clock = ManualClock(step=1)
    markers = [f"zanzibar{chr(97 + i)}quokka" for i in range(12)]
    a = journaled.open(shared_url, clock=clock, follow=None)
    try:
        facts = [a.memory.remember(f"secret number {m}") for m in markers]
        stop = threading.Event()
        errors: list[BaseException] = []

        def snapshots() -> None:
            i = 0
            while not stop.is_set():
                try:
                    a.memory.remember(f"filler {i}")
                    a.memory.checkpoint()
                except BaseException as exc:  # reported below, not lost in the thread
                    errors.append(exc)
                    return
                i += 1

        thread = threading.Thread(target=snapshots)
        thread.start()
        try:
            with journaled.open(shared_url, clock=clock, follow=None) as b:
                for fact in facts:
                    assert b.memory.purge(fact.id)
        finally:
            stop.set()
            thread.join(30)
        assert errors == []
        a.memory.checkpoint()
    finally:
        a.close()
    for marker in markers:
        assert _stored_anywhere(shared_url, marker.encode()) == []
