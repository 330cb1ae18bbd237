"""What is committed is reported committed; cleanup after it never fails nor blocks a writer (M10).

A remember, delete or purge has happened once its transaction commits. Folding it into the
projection, and scrubbing erased bytes out of the files, are cleanup: when they fail the callers
still get their results, and a reader holding old data (a backup, a report) delays only the scrub,
which is retried in the background and on demand with ``rt.memory.scrub()``.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from crash import kill_when_in_flight
from test_group_commit import HeldWriter, queue_behind_first
from test_postgres import _files_holding, _pageinspect, _pages_holding

import journaled
from journaled.actors.memory import MemoryWriter
from journaled.cli import main
from journaled.events.base import Event
from journaled.events.journal import PAYLOAD_TABLE
from journaled.events.memory import FactRemembered
from journaled.testing import wait_for

WAIT = 10.0


class FoldFailsOnce:
    """Make the writer's next fold that matches ``when`` raise, once, after its commit."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, when: Callable[[list[Event]], bool]):
        self.armed = True
        real = MemoryWriter._fold

        def fold(writer: MemoryWriter, events: Any, texts: Any) -> None:
            if self.armed and when(list(events)):
                self.armed = False
                raise RuntimeError("the projection broke after the commit")
            real(writer, events, texts)

        monkeypatch.setattr(MemoryWriter, "_fold", fold)


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[journaled.Runtime]:
    """Yield a runtime on a fresh SQLite journal that does not follow other writers."""
    with journaled.open(f"sqlite:///{tmp_path / 'journal.sqlite'}", follow=None) as runtime:
        yield runtime


def _remembered(events: list[Event]) -> int:
    return sum(isinstance(e.data, FactRemembered) for e in events)


def test_a_group_whose_fold_fails_after_its_commit_gets_its_facts(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """J2/M2: every caller of a committed group gets its fact though folding it then raised."""
    held = HeldWriter(monkeypatch)
    broken = FoldFailsOnce(monkeypatch, lambda events: _remembered(events) == 7)
    texts = [f"fact number {i} about the proxy" for i in range(8)]
    outcomes = queue_behind_first(
        rt, held, [functools.partial(rt.memory.remember, t) for t in texts]
    )
    assert held.appends == [1, 7]
    assert not broken.armed
    assert [getattr(f, "text", f) for f in outcomes] == texts  # no caller was told it failed
    for fact in outcomes:
        assert rt.memory.get(fact.id) == fact  # the projection was rebuilt from the journal
        assert [e.kind for e in rt.memory.history(fact.id)] == ["memory.fact-remembered"]
    assert len(rt.memory.search("proxy", limit=20)) == 8
    later = rt.memory.remember("one more fact about the proxy", conflict_key="proxy")
    assert rt.memory.get(later.id) == later
    with journaled.open(f"sqlite:///{tmp_path / 'journal.sqlite'}") as again:
        assert len(again.memory.all()) == 9


def test_a_delete_whose_fold_fails_after_its_commit_reports_it(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """M8: a committed delete is reported done, and reads agree, though its fold raised."""
    old = rt.memory.remember("the proxy is on port 8080", conflict_key="proxy")
    new = rt.memory.remember("the proxy is on port 3128", conflict_key="proxy")
    FoldFailsOnce(monkeypatch, lambda events: any(e.kind == "memory.fact-deleted" for e in events))
    assert rt.memory.delete(new.id) == journaled.Deletion(primary=True, relationships=1)
    assert rt.memory.get(new.id) is None
    restored = rt.memory.get(old.id)
    assert restored is not None
    assert restored.superseded_by is None


def _purge_then_remember(rt: journaled.Runtime, fact_id: str) -> tuple[threading.Event, list[Any]]:
    """Purge and then remember on a thread; return (done, [purged, remembered or error])."""
    done = threading.Event()
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(rt.memory.purge(fact_id, reason="erasure request"))
            out.append(rt.memory.remember("a fact remembered while a reader holds old data"))
        except Exception as exc:
            out.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    return done, out


def test_a_reader_holding_sqlite_delays_only_the_scrub(tmp_path: Path) -> None:
    """M10: with a read transaction open, purge and remember return; the scrub follows it."""
    path = tmp_path / "journal.sqlite"
    marker = b"quokka-vault-2718"
    with journaled.open(f"sqlite:///{path}", follow=None) as rt:
        fact = rt.memory.remember(f"the vault code is {marker.decode()}")
        reader = sqlite3.connect(path, isolation_level=None)
        try:
            reader.execute("BEGIN")
            reader.execute(f"SELECT count(*) FROM {PAYLOAD_TABLE}").fetchone()  # noqa: S608
            done, out = _purge_then_remember(rt, fact.id)
            assert done.wait(WAIT), "purge or remember waited for the reader"
            assert out[0] is True
            assert isinstance(out[1], journaled.Fact)
            assert rt.memory.get(fact.id) is None
            assert rt.memory.scrub_pending
            with pytest.raises(journaled.ScrubPending, match=r"rt\.memory\.scrub\(\)"):
                rt.memory.scrub(timeout=0.1)
        finally:
            reader.rollback()
            reader.close()
        wait_for(lambda: not rt.memory.scrub_pending, WAIT)  # the background retry did it
        files = b"".join(p.read_bytes() for p in sorted(tmp_path.iterdir()) if p.is_file())
        assert marker not in files
        rt.memory.scrub(timeout=0)  # nothing left to do: succeeds at once


@pytest.mark.parametrize("holds", ["an old snapshot", "a table lock"])
def test_a_reader_holding_postgresql_delays_only_the_scrub(pg_url: str, holds: str) -> None:
    """M10: with a reader in PostgreSQL, purge and remember return; the scrub follows it."""
    marker = b"quokka-vault-3141"
    with journaled.open(pg_url, follow=None) as rt:
        fact = rt.memory.remember(f"the vault code is {marker.decode()}")
        with psycopg.connect(pg_url) as reader:
            if holds == "an old snapshot":
                reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            # READ COMMITTED keeps no snapshot between statements, but keeps the table's lock.
            reader.execute(f"SELECT count(*) FROM {PAYLOAD_TABLE}").fetchone()  # noqa: S608
            try:
                done, out = _purge_then_remember(rt, fact.id)
                assert done.wait(WAIT), "purge or remember waited for the reader"
                assert out[0] is True
                assert isinstance(out[1], journaled.Fact)
                assert rt.memory.get(fact.id) is None
                assert rt.memory.scrub_pending
                with pytest.raises(journaled.ScrubPending, match=r"rt\.memory\.scrub\(\)"):
                    rt.memory.scrub(timeout=0.1)
            finally:
                reader.rollback()
        wait_for(lambda: not rt.memory.scrub_pending, WAIT)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            row = conn.execute(
                f"SELECT count(*) FROM {PAYLOAD_TABLE} WHERE position(%s::bytea IN payload) > 0",  # noqa: S608
                [marker],
            ).fetchone()
            assert row == (0,)
            if _pageinspect(conn):  # no dead row left on any page either
                assert _pages_holding(conn, marker) == []


def test_the_command_line_scrubs_again_once_the_reader_is_done(tmp_path: Path) -> None:
    """M10: `journaled memory scrub` fails in one line while a reader holds old data, then works."""
    path = tmp_path / "journal.sqlite"
    url = f"sqlite:///{path}"
    marker = b"quokka-vault-1618"
    runner = CliRunner()
    with journaled.open(url, follow=None) as rt:
        fact = rt.memory.remember(f"the vault code is {marker.decode()}")
        reader = sqlite3.connect(path, isolation_level=None)
        reader.execute("BEGIN")
        reader.execute(f"SELECT count(*) FROM {PAYLOAD_TABLE}").fetchone()  # noqa: S608
        try:
            assert rt.memory.purge(fact.id)
            result = runner.invoke(main, ["--url", url, "memory", "scrub", "--timeout", "0.1"])
            assert result.exit_code == 1
            assert "journaled memory scrub" in result.stderr
            assert len(result.stderr.strip().splitlines()) == 1
        finally:
            reader.rollback()
            reader.close()
    result = runner.invoke(main, ["--url", url, "memory", "scrub"])
    assert result.exit_code == 0, result.output
    files = b"".join(p.read_bytes() for p in sorted(tmp_path.iterdir()) if p.is_file())
    assert marker not in files


_PURGE_THEN_HANG = """
import json, sys, time
from pathlib import Path
import journaled
cfg = json.loads(sys.argv[1])
with journaled.open(cfg["url"], follow=None) as rt:
    assert rt.memory.purge(cfg["fact_id"], reason="erasure request")
    Path(cfg["purged"]).touch()
    time.sleep(60)
"""
"""A child that purges a fact, says so, and hangs until it is killed (its scrub being held)."""


class KilledAfterPurge:
    """A journal whose purging process was SIGKILLed while a reader held its scrub back."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.url = url
        self.marker = b"quokka-vault-5772"
        with journaled.open(url, follow=None) as rt:
            fact_id = rt.memory.remember(f"the vault code is {self.marker.decode()}").id
        # A reader (a backup, a report) whose snapshot predates the purge: no scrub can finish.
        self._sqlite: sqlite3.Connection | None = None
        self._pg: psycopg.Connection[Any] | None = None
        if url.startswith("sqlite:///"):
            self._sqlite = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
            self._sqlite.execute("BEGIN")
            self._sqlite.execute(f"SELECT count(*) FROM {PAYLOAD_TABLE}").fetchone()  # noqa: S608
        else:
            self._pg = psycopg.connect(url)
            self._pg.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            self._pg.execute(f"SELECT count(*) FROM {PAYLOAD_TABLE}").fetchone()  # noqa: S608
        try:
            purged = tmp_path / "purged"
            config = json.dumps({"url": url, "fact_id": fact_id, "purged": str(purged)})
            (tmp_path / "child").mkdir()
            kill_when_in_flight(_PURGE_THEN_HANG, config, [purged], tmp_path / "child")
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """End the reader's transaction and close it (idempotent)."""
        if self._sqlite is not None:
            self._sqlite.rollback()
            self._sqlite.close()
            self._sqlite = None
        if self._pg is not None:
            self._pg.rollback()
            self._pg.close()
            self._pg = None

    def text_stored(self) -> bool | None:
        """Tell whether the purged text's bytes are in the journal's files (None: unreadable)."""
        if self.url.startswith("sqlite:///"):
            path = Path(self.url.removeprefix("sqlite:///"))
            return any(self.marker in p.read_bytes() for p in path.parent.glob(path.name + "*"))
        with psycopg.connect(self.url, autocommit=True) as conn:
            files = _files_holding(conn, self.marker)
            if files is not None:
                return bool(files)
            return bool(_pages_holding(conn, self.marker)) if _pageinspect(conn) else None


@pytest.fixture
def killed(tmp_path: Path) -> Iterator[KilledAfterPurge]:
    """Yield a SQLite journal whose purging process was killed before its scrub."""
    (tmp_path / "journal").mkdir()
    journal = KilledAfterPurge(f"sqlite:///{tmp_path / 'journal' / 'journal.sqlite'}", tmp_path)
    try:
        yield journal
    finally:
        journal.release()


def test_purge_killed_before_its_scrub_leaves_no_text_on_sqlite(killed: KilledAfterPurge) -> None:
    """R2/M10: SIGKILL between a purge's commit and its scrub; the next runtime scrubs (SQLite)."""
    assert killed.text_stored(), "the kill landed after the scrub: nothing to test"
    with journaled.open(killed.url, follow=None) as rt:  # opens while the reader still holds
        assert rt.memory.remember("a fact remembered while the scrub is owed").text
        killed.release()
        # Paid in the background while the runtime is open (closing the last connection would
        # checkpoint too, so only an open runtime shows who scrubbed).
        wait_for(lambda: not killed.text_stored(), WAIT)
        wait_for(lambda: not rt.memory.scrub_pending, WAIT)  # recorded just after the scrub


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_scrub_a_killed_process_owed_is_reported(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """M10/R2: scrub_pending and `journaled memory scrub` report a purge a killed process owed."""
    if backend == "sqlite":
        (tmp_path / "journal").mkdir()
        url = f"sqlite:///{tmp_path / 'journal' / 'journal.sqlite'}"
    else:
        url = request.getfixturevalue("pg_url")
    killed = KilledAfterPurge(url, tmp_path)
    runner = CliRunner()
    try:
        result = runner.invoke(main, ["--url", url, "memory", "scrub", "--timeout", "0.1"])
        assert result.exit_code == 1
        assert "1 purge not yet scrubbed" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        with journaled.open(url, follow=None) as rt:
            assert rt.memory.scrub_pending
            assert killed.text_stored() in (True, None)
    finally:
        killed.release()
    result = runner.invoke(main, ["--url", url, "memory", "scrub"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("scrubbed: no erased text remains")
    assert killed.text_stored() in (False, None)
    with journaled.open(url, follow=None) as rt:
        assert not rt.memory.scrub_pending
