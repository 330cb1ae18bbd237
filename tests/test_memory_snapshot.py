"""Memory snapshots: a cache of the projection that never changes an answer (M4, M6, M10, J5)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec

import journaled
from events.journal import SNAPSHOT_TABLE
from journaled.testing import ManualClock


def _answers(rt: journaled.Runtime, now: int) -> object:
    return msgspec.to_builtins(
        {
            "all": rt.memory.all(),
            "search": [f.id for f in rt.memory.search("deploy api port", now=now)],
            "scoped": [f.id for f in rt.memory.search("api", scopes=["user"], now=now)],
        }
    )


def _populate(rt: journaled.Runtime, clock: ManualClock) -> None:
    for i in range(30):
        rt.memory.remember(
            f"deploy api number {i} on port {8000 + i}",
            conflict_key=f"k{i % 4}",
            scope=["project", "user", "session"][i % 3],
            valid_until=clock.now + 10_000 if i % 5 == 0 else None,
            confidence=0.5 if i % 7 == 0 else None,
        )
    rt.memory.delete(rt.memory.all()[3].id)


def test_reopen_from_snapshot_answers_identically(tmp_path: Path) -> None:
    """M4/M6: a runtime restored from a snapshot plus the tail answers exactly like a full fold."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    clock = ManualClock(step=3)
    with journaled.open(url, clock=clock) as rt:
        _populate(rt, clock)
        assert rt.memory.checkpoint()
        assert not rt.memory.checkpoint()  # nothing new since
        rt.memory.remember("deploy api after the snapshot", conflict_key="k1")
        now = clock.now
        expected = _answers(rt, now)
    with sqlite3.connect(tmp_path / "journal.sqlite") as conn:
        rows = conn.execute(f"SELECT stream, version FROM {SNAPSHOT_TABLE}").fetchall()  # noqa: S608
    assert [r[0] for r in rows] == ["memory:"]
    with journaled.open(url, clock=clock) as rt:
        assert _answers(rt, now) == expected
    with sqlite3.connect(tmp_path / "journal.sqlite") as conn:
        conn.execute(f"DELETE FROM {SNAPSHOT_TABLE}")  # noqa: S608
    with journaled.open(url, clock=clock) as rt:
        assert _answers(rt, now) == expected


def test_unreadable_snapshot_is_ignored(tmp_path: Path) -> None:
    """J5: a damaged snapshot is only a cache miss: the journal is folded from the start."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    clock = ManualClock(step=3)
    with journaled.open(url, clock=clock) as rt:
        _populate(rt, clock)
        rt.memory.checkpoint()
        now = clock.now
        expected = _answers(rt, now)
    with sqlite3.connect(tmp_path / "journal.sqlite") as conn:
        conn.execute(f"UPDATE {SNAPSHOT_TABLE} SET state = x'c1c1c1'")  # noqa: S608
    with journaled.open(url, clock=clock) as rt:
        assert _answers(rt, now) == expected


def test_purge_drops_memory_snapshots(tmp_path: Path) -> None:
    """M10: snapshots hold fact texts, so a purge deletes them in the same transaction."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url) as rt:
        fact = rt.memory.remember("the escrow code is 777-888-999")
        rt.memory.checkpoint()
        rt.memory.purge(fact.id)
    with sqlite3.connect(tmp_path / "journal.sqlite") as conn:
        count = conn.execute(f"SELECT count(*) FROM {SNAPSHOT_TABLE}").fetchone()[0]  # noqa: S608
    assert count == 0
    data = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert b"777-888-999" not in data


def test_close_snapshots_a_busy_memory(tmp_path: Path) -> None:
    """Closing a file runtime after many memory events leaves a snapshot for the next open."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url) as rt:
        for i in range(520):
            rt.memory.remember(f"fact {i}")
    with sqlite3.connect(tmp_path / "journal.sqlite") as conn:
        version = conn.execute(f"SELECT version FROM {SNAPSHOT_TABLE}").fetchone()[0]  # noqa: S608
    assert version == 520


def test_open_reads_only_the_tail_after_a_snapshot(tmp_path: Path) -> None:
    """The snapshot is really used: events before it are not even decoded on open."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url) as rt:
        first = rt.memory.remember("first fact")
        rt.memory.checkpoint()
        later = rt.memory.remember("later fact")
    with sqlite3.connect(tmp_path / "journal.sqlite") as conn:
        conn.execute("UPDATE stored_events SET state = x'c1' WHERE rowid = 1")
    with journaled.open(url) as rt:
        assert {f.id for f in rt.memory.all()} == {first.id, later.id}
