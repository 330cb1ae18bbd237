"""A journal whose write lock another process holds refuses in time (SPEC §6, J2; ADR 0039).

Another process (a backup, a ``sqlite3`` shell in ``BEGIN IMMEDIATE``, a long VACUUM; on
PostgreSQL a session holding ``LOCK TABLE``) keeps the journal's write lock. A write then waits
at most ``lock_wait`` — below the time its caller waits for an answer — and fails with
``JournalBusy``, nothing appended; once the other process lets go, the next write succeeds.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

import journaled
from journaled.actors import asking
from journaled.events.base import Pending
from journaled.events.catalog import codec
from journaled.events.journal import Journal
from journaled.events.journal._common import EVENTS_TABLE_POSTGRES
from journaled.events.memory import ConflictKeyClaimed
from journaled.events.runs import StepSucceeded
from journaled.events.url import parse_url

ASK = 1.5
"""The ask timeout these tests run with (the production one is 30 s)."""

_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
conn.close()
"""


@contextmanager
def sqlite_lock_held(path: str) -> Iterator[None]:
    """Hold the SQLite file's write lock from another process until the block ends."""
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdin is not None
        assert holder.stdout is not None
        try:
            assert holder.stdout.readline().strip() == "held"
            yield
        finally:
            holder.stdin.write("\n")
            holder.stdin.flush()
            assert holder.wait(timeout=10) == 0


@pytest.fixture
def short_asks(monkeypatch: pytest.MonkeyPatch) -> float:
    """Make callers wait :data:`ASK` seconds for an answer, as they wait 30 s in production."""
    monkeypatch.setattr(asking, "ASK_TIMEOUT", ASK)
    return ASK


def _stored_texts(url: str) -> list[str]:
    """Return the texts of the facts a fresh runtime finds in the journal."""
    with journaled.open(url, follow=None) as rt:
        return sorted(f.text for f in rt.memory.all())


def test_a_remember_that_waits_out_the_lock_fails_busy_and_leaves_nothing(
    tmp_path: Path, short_asks: float
) -> None:
    """§6, J2: another process holds the write lock; remember raises JournalBusy before its
    caller gives up, and once the lock is let go the fact is not in the journal."""
    path = str(tmp_path / "journal.sqlite")
    url = f"sqlite:///{path}"
    with journaled.open(url, follow=None) as rt:
        rt.memory.remember("before the backup")
        with sqlite_lock_held(path):
            started = time.monotonic()
            with pytest.raises(journaled.JournalBusy) as caught:
                rt.memory.remember("during the backup")
            waited = time.monotonic() - started
        assert waited < short_asks
        assert str(tmp_path) in str(caught.value)
        assert "lock_wait" in str(caught.value)
        # The lock is let go: a remember now succeeds, and the refused one never lands.
        rt.memory.remember("after the backup")
        assert sorted(f.text for f in rt.memory.all()) == ["after the backup", "before the backup"]
    assert _stored_texts(url) == ["after the backup", "before the backup"]


def test_a_remember_queued_behind_a_busy_append_fails_before_its_caller_gives_up(
    tmp_path: Path, short_asks: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """§6: a remember that queued while the writer waited for the lock waits only what its own
    caller has left: both callers are told JournalBusy, and neither fact is ever stored."""
    path = str(tmp_path / "journal.sqlite")
    url = f"sqlite:///{path}"
    with journaled.open(url, follow=None) as rt:
        rt.memory.remember("before the backup")
        journal = rt._journal
        appending = threading.Event()
        append = journal.append

        def signalling_append(*args: Any, **kwargs: Any) -> list[int]:
            appending.set()
            return append(*args, **kwargs)

        monkeypatch.setattr(journal, "append", signalling_append)
        told: dict[str, str] = {}

        def remember(text: str) -> None:
            try:
                rt.memory.remember(text)
                told[text] = "stored"
            except Exception as exc:
                told[text] = type(exc).__name__

        with sqlite_lock_held(path):
            first = threading.Thread(target=remember, args=("first",))
            first.start()
            assert appending.wait(timeout=5)  # the writer now waits for the lock
            remember("second")  # queued behind that wait
            first.join(timeout=10)
        assert told == {"first": "JournalBusy", "second": "JournalBusy"}
        rt.memory.remember("after the backup")
    assert _stored_texts(url) == ["after the backup", "before the backup"]


def test_the_default_lock_wait_is_below_the_ask_timeout(tmp_path: Path) -> None:
    """§6: with the production ask timeout, the journal's lock wait is 5/6 of it, never more."""
    with journaled.open(f"sqlite:///{tmp_path / 'j.sqlite'}", follow=None) as rt:
        assert rt._journal.config.lock_wait == pytest.approx(asking.ASK_TIMEOUT * 5 / 6)
        assert rt._journal.config.lock_wait < asking.ASK_TIMEOUT


@pytest.mark.parametrize("bad", [0, -1, 30, 31.5, float("nan"), float("inf"), True, "5"])
def test_a_lock_wait_not_below_the_ask_timeout_is_refused(tmp_path: Path, bad: object) -> None:
    """§6: open() refuses a lock_wait that is not a number of seconds in (0, ask timeout)."""
    with pytest.raises(journaled.ConfigurationError, match="lock_wait must be"):
        journaled.open(f"sqlite:///{tmp_path / 'j.sqlite'}", lock_wait=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "j.sqlite").exists()


def test_a_journal_append_waits_lock_wait_then_raises_busy(tmp_path: Path) -> None:
    """J2: Journal.append waits about lock_wait for another process's lock, then raises
    JournalBusy naming the journal and the wait; the journal is unchanged."""
    path = str(tmp_path / "journal.sqlite")
    config = parse_url(f"sqlite:///{path}")
    journal = Journal(msgspec.structs.replace(config, lock_wait=0.3), codec())
    try:
        before = journal.position()
        with sqlite_lock_held(path):
            started = time.monotonic()
            with pytest.raises(journaled.JournalBusy) as caught:
                journal.append(_one_event())
            waited = time.monotonic() - started
        assert 0.25 <= waited < 1.5
        assert caught.value.journal == config.url
        assert caught.value.waited >= 0.25
        assert journal.position() == before
        journal.append(_one_event())
        assert journal.position() == before + 1
    finally:
        journal.close()


def _one_event() -> list[Pending]:
    return [
        Pending(
            stream=f"k-{time.monotonic_ns()}",
            version=1,
            data=ConflictKeyClaimed(at=1, conflict_key="k", fact_id="f"),
        )
    ]


def test_a_step_result_that_waits_out_the_lock_stops_the_run_and_resume_redoes_it(
    tmp_path: Path, short_asks: float
) -> None:
    """§6, R4, E14: a step's result append that meets another process's lock fails the run's
    handle with JournalBusy, storing no result; after the lock is let go, resume runs the step
    again and the run holds exactly one result for it."""
    path = str(tmp_path / "journal.sqlite")
    url = f"sqlite:///{path}"
    calls: list[str] = []
    with ExitStack() as held, journaled.open(url, follow=None) as rt:

        def fetch(value: str) -> str:
            calls.append(value)
            if len(calls) == 1:  # a backup begins while the step runs
                held.enter_context(sqlite_lock_held(path))
            return f"fetched {value}"

        rt.register_tool("fetch", fetch)
        plan = journaled.Plan(
            goal="fetch and read",
            steps=[
                journaled.Step("a", tool="fetch", input="x"),
                journaled.Step("b", tool="fetch", input="y", depends_on=["a"]),
            ],
        )
        handle = rt.start(plan)
        with pytest.raises(journaled.JournalBusy):
            handle.result(timeout=10)
        held.close()  # the backup ends
        assert not [e for e in rt.runs.history(handle.run_id) if isinstance(e.data, StepSucceeded)]
        result = rt.resume(handle.run_id)
        assert isinstance(result, journaled.ExecuteResult)
        assert result.ok
        assert calls == ["x", "x", "y"]
        succeeded = [
            e.data.step_id
            for e in rt.runs.history(handle.run_id)
            if isinstance(e.data, StepSucceeded)
        ]
        assert succeeded == ["a", "b"]


@contextmanager
def pg_table_locked(url: str) -> Iterator[None]:
    """Hold ACCESS EXCLUSIVE on the journal's events table from another session."""
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute(f"LOCK TABLE {EVENTS_TABLE_POSTGRES} IN ACCESS EXCLUSIVE MODE")
        try:
            yield
        finally:
            conn.rollback()


def test_postgres_writes_that_wait_out_a_table_lock_fail_busy_and_leave_nothing(
    pg_url: str, short_asks: float
) -> None:
    """§6, J2: another session holds LOCK TABLE on the events table; a remember (one-call
    append) and a purge (the library's append) each raise JournalBusy before their caller
    gives up, and once the lock is let go neither is in the journal."""
    with journaled.open(pg_url, follow=None) as rt:
        kept = rt.memory.remember("before the lock")
        position = rt.journal.position()
        with pg_table_locked(pg_url):
            for write in (
                lambda: rt.memory.remember("during the lock"),
                lambda: rt.memory.purge(kept.id),
            ):
                started = time.monotonic()
                with pytest.raises(journaled.JournalBusy, match="lock_wait"):
                    write()
                assert time.monotonic() - started < short_asks
        assert rt.journal.position() == position
        rt.memory.remember("after the lock")
        assert rt.memory.get(kept.id) is not None
    assert _stored_texts(pg_url) == ["after the lock", "before the lock"]


def test_a_postgres_append_with_less_time_left_waits_only_that(pg_url: str) -> None:
    """§6, J2: an append given a lock_wait shorter than the journal's (a caller short of time)
    waits only that behind LOCK TABLE, then raises JournalBusy; unlocked, it appends, and the
    connection goes back to the journal's own wait."""
    journal = Journal(msgspec.structs.replace(parse_url(pg_url), lock_wait=20.0), codec())
    try:
        assert len(journal.append(_one_event(), lock_wait=0.3)) == 1
        with pg_table_locked(pg_url):
            started = time.monotonic()
            with pytest.raises(journaled.JournalBusy):
                journal.append(_one_event(), lock_wait=0.3)
            assert time.monotonic() - started < 5
        assert journal.position() == 1
        assert len(journal.append(_one_event())) == 1
        recorder: Any = journal._recorder
        with recorder.datastore.get_connection() as conn:
            assert conn.execute("SHOW lock_timeout").fetchone() == {"lock_timeout": "20s"}
    finally:
        journal.close()


def test_an_old_journal_that_stays_locked_does_not_open_without_its_chain(tmp_path: Path) -> None:
    """R7, §6: opening a journal that still lacks the digest columns waits lock_wait for the
    lock to add them, then raises JournalBusy instead of going on unchained; once the lock is
    let go it opens with them."""
    path = str(tmp_path / "journal.sqlite")
    config = msgspec.structs.replace(parse_url(f"sqlite:///{path}"), lock_wait=0.3)
    Journal(config, codec()).close()
    old = sqlite3.connect(path)
    for column in ("chain_first", "chain_prev", "chain_hashes", "chain_entries", "chain_digest"):
        old.execute(f"ALTER TABLE stored_events DROP COLUMN {column}")
    old.close()
    with sqlite_lock_held(path):
        started = time.monotonic()
        with pytest.raises(journaled.JournalBusy):
            Journal(config, codec())
        assert time.monotonic() - started < 5
    journal = Journal(config, codec())
    try:
        journal.append(_one_event())
        assert journal.verify().ok
    finally:
        journal.close()
    check = sqlite3.connect(path)
    try:
        columns = {row[1] for row in check.execute("PRAGMA table_info(stored_events)")}
    finally:
        check.close()
    assert "chain_digest" in columns
