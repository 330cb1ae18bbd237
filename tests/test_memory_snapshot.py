"""Memory snapshots: a cache of the projection that never changes an answer (M4, M6, M10, J5)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest
from crash import kill_when_in_flight

import journaled
from journaled.actors.memory import MemoryWriter
from journaled.events.journal import SNAPSHOT_TABLE, Journal
from journaled.testing import ManualClock, wait_for


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


def _snapshotted(tmp_path: Path) -> tuple[str, ManualClock, int, object]:
    """Populate a journal, snapshot memory, close; return the URL, clock, time and answers."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    clock = ManualClock(step=3)
    with journaled.open(url, clock=clock) as rt:
        _populate(rt, clock)
        rt.memory.checkpoint()
        now = clock.now
        return url, clock, now, _answers(rt, now)


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
    url, clock, now, expected = _snapshotted(tmp_path)
    with sqlite3.connect(tmp_path / "journal.sqlite") as conn:
        conn.execute(f"UPDATE {SNAPSHOT_TABLE} SET state = x'c1c1c1'")  # noqa: S608
    with journaled.open(url, clock=clock) as rt:
        assert _answers(rt, now) == expected


def _edit_snapshot(path: Path, edit: object) -> None:
    """Rewrite memory's stored snapshot, decoded as plain maps, through ``edit``."""
    with sqlite3.connect(path) as conn:
        key, state = conn.execute(f"SELECT stream, state FROM {SNAPSHOT_TABLE}").fetchone()  # noqa: S608
        snapshot = msgspec.msgpack.decode(state)
        assert callable(edit)
        edit(snapshot)
        conn.execute(
            f"UPDATE {SNAPSHOT_TABLE} SET state = ? WHERE stream = ?",  # noqa: S608
            (msgspec.msgpack.encode(snapshot), key),
        )


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda s: s["scopes"].__setitem__("user", 7), id="a-scope-part-not-a-map"),
        pytest.param(
            lambda s: s["scopes"]["project"].__setitem__("facts", [1, 2]), id="facts-not-a-map"
        ),
        pytest.param(lambda s: s["scopes"]["repository"].pop("index"), id="a-scope-without-index"),
    ],
)
def test_a_snapshot_with_a_scope_part_of_the_wrong_shape_is_folded_instead(
    tmp_path: Path, damage: object, caplog: pytest.LogCaptureFixture
) -> None:
    """J5, ADR 0058: a scope's part is embedded undecoded, so the snapshot as a whole decodes;
    the check that decodes each part refuses it, names the scope, and the open folds the log."""
    url, clock, now, expected = _snapshotted(tmp_path)
    _edit_snapshot(tmp_path / "journal.sqlite", damage)
    with caplog.at_level("WARNING"), journaled.open(url, clock=clock) as rt:
        assert _answers(rt, now) == expected
    assert any("cannot be read" in r.getMessage() for r in caplog.records), caplog.records


def test_a_snapshot_of_the_previous_layout_is_ignored(tmp_path: Path) -> None:
    """ADR 0058: a schema-3 snapshot (each scope's part wrapped in bytes) is not served; the
    open folds the log and answers the same."""
    url, clock, now, expected = _snapshotted(tmp_path)

    def to_previous_layout(snapshot: dict[str, object]) -> None:
        scopes = snapshot["scopes"]
        assert isinstance(scopes, dict)
        snapshot["schema"] = 3
        snapshot["scopes"] = {k: msgspec.msgpack.encode(v) for k, v in scopes.items()}

    _edit_snapshot(tmp_path / "journal.sqlite", to_previous_layout)
    served: list[int] = []
    restore = MemoryWriter._restore_snapshot

    def spy(self: MemoryWriter) -> None:
        restore(self)
        served.append(self.position)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(MemoryWriter, "_restore_snapshot", spy)
        with journaled.open(url, clock=clock) as rt:
            assert _answers(rt, now) == expected
    assert served == [0]  # nothing restored: the fold started from the journal's beginning


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


def _snapshot_version(path: Path) -> int | None:
    with sqlite3.connect(path) as conn:
        row = conn.execute(f"SELECT version FROM {SNAPSHOT_TABLE}").fetchone()  # noqa: S608
    return None if row is None else int(row[0])


def test_memory_snapshots_itself_while_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy memory snapshots itself, spaced geometrically, with no close or checkpoint."""
    monkeypatch.setattr(MemoryWriter, "auto_snapshot_events", 40)
    path = tmp_path / "journal.sqlite"
    with journaled.open(f"sqlite:///{path}") as rt:
        count = 0

        def remember(n: int) -> None:
            nonlocal count
            for _ in range(n):
                rt.memory.remember(f"fact {count}")
                count += 1
            assert rt.memory.get("mem_absent") is None  # the writer handled every message

        # Due after max(40 events, half the log the last snapshot covered).
        for quiet, snapshot in [(39, 40), (39, 80), (39, 120), (59, 180)]:
            remember(quiet)
            assert _snapshot_version(path) == (None if snapshot == 40 else snapshot - quiet - 1)
            remember(1)
            wait_for(lambda: _snapshot_version(path) == snapshot, 5)  # noqa: B023


def test_a_failed_automatic_snapshot_is_logged_and_memory_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A snapshot is a cache: failing to write one never fails or stops memory."""
    monkeypatch.setattr(MemoryWriter, "auto_snapshot_events", 5)

    attempts: list[int] = []

    def broken(self: Journal, key: str, version: int, state: bytes, **_: object) -> None:
        attempts.append(version)
        raise OSError("disk full")

    monkeypatch.setattr(Journal, "save_snapshot", broken)
    with journaled.open(f"sqlite:///{tmp_path / 'journal.sqlite'}") as rt:
        facts = [rt.memory.remember(f"fact {i}") for i in range(12)]
        assert sorted(f.id for f in rt.memory.all()) == sorted(f.id for f in facts)
    assert "memory snapshot not saved (only a cache): disk full" in caplog.text
    assert attempts == [5, 10]  # after a failure, retried once as many events again have folded


def test_in_memory_journal_takes_no_snapshots(monkeypatch: pytest.MonkeyPatch) -> None:
    """memory:// lives and dies with the process: snapshotting it would only cost time."""
    monkeypatch.setattr(MemoryWriter, "auto_snapshot_events", 5)
    saved: list[str] = []
    monkeypatch.setattr(Journal, "save_snapshot", lambda self, key, *a: saved.append(key))
    with journaled.open("memory://") as rt:
        for i in range(12):
            rt.memory.remember(f"fact {i}")
        assert rt.memory.get("mem_absent") is None
    assert saved == []


_KILLED_WRITER = r"""
import sys
from pathlib import Path
import journaled
from journaled.actors.memory import MemoryWriter
MemoryWriter.auto_snapshot_events = 100
path = Path(sys.argv[1])
rt = journaled.open(f"sqlite:///{path}")
for i in range(150):
    rt.memory.remember(f"fact number {i}")
rt.memory.get("mem_absent")  # every remember handled; the snapshot was queued at 100
(path.parent / "remembered").write_text("")
threading_event = __import__("threading").Event()
threading_event.wait()
"""


def test_a_killed_process_reopens_from_its_automatic_snapshot(tmp_path: Path) -> None:
    """J5: after SIGKILL (no close) the next open starts from the automatic snapshot."""
    path = tmp_path / "journal.sqlite"
    marker = tmp_path / "remembered"
    kill_when_in_flight(_KILLED_WRITER, str(path), [marker], tmp_path)
    assert _snapshot_version(path) == 100
    with sqlite3.connect(path) as conn:  # events the snapshot covers are never decoded again
        conn.execute("UPDATE stored_events SET state = x'c1' WHERE rowid <= 100")
    with journaled.open(f"sqlite:///{path}") as rt:
        texts = sorted(f.text for f in rt.memory.all())
    assert texts == sorted(f"fact number {i}" for i in range(150))
