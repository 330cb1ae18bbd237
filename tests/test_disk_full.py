"""A journal whose disk fills up (ADR 0081; SPEC J2, R4, E14, M2).

The SQLite journal lives on a small tmpfs of the test's own, filled with a file until the kernel
answers ENOSPC: the database meets a real full disk, not a stand-in. Mounting needs root, which
CI and these machines have.
"""

from __future__ import annotations

import itertools
import os
import pwd
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pg
import pytest
from eventsourcing.persistence import OperationalError
from full_disk import FillingEcho, fill, mounted, needs_mount

import journaled
from journaled import JournalFull, Plan, Step
from journaled.events.journal import disk_full


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """Mount a 4 MiB tmpfs for one test; unmount it after."""
    with mounted(tmp_path / "disk") as where:
        yield where


@pytest.fixture
def server_disk() -> Iterator[Path]:
    """Mount a 4 MiB tmpfs the PostgreSQL server's user owns, where that user can reach it."""
    where = Path(tempfile.mkdtemp(prefix="journaled-full-", dir="/tmp"))
    try:
        with mounted(where):
            service = pwd.getpwnam(pg.SERVICE_USER)
            os.chown(where, service.pw_uid, service.pw_gid)
            where.chmod(0o700)
            yield where
    finally:
        where.rmdir()


def chain(n: int) -> Plan:
    return Plan(
        goal="chain",
        steps=[
            Step(f"s{i}", tool="echo", input=i, depends_on=[f"s{i - 1}"] if i else [])
            for i in range(n)
        ],
    )


@needs_mount
def test_a_remember_on_a_full_disk_raises_journal_full_and_stores_nothing(disk: Path) -> None:
    """M2, J2: a remember meeting a full disk raises JournalFull naming the journal and what to
    do; nothing of it is stored, memory is as it was, and once space is freed the same remember
    is stored and the journal verifies."""
    url = f"sqlite:///{disk / 'journal.sqlite'}"
    with journaled.open(url) as rt:
        kept = [rt.memory.remember(f"fact {i}", conflict_key=f"k{i % 3}") for i in range(20)]
        position = rt.journal.position()
        filler = fill(disk)
        with pytest.raises(JournalFull) as caught:
            rt.memory.remember("the deploy key rotates on Fridays", conflict_key="k0")
        assert url in str(caught.value)
        assert "nothing was stored" in str(caught.value)
        assert "disk is full" in caught.value.detail
        assert rt.journal.position() == position
        assert {f.id for f in rt.memory.all()} == {f.id for f in kept}
        active = next(f for f in reversed(kept) if f.conflict_key == "k0")
        assert rt.memory.get(active.id) == active  # the failed remember superseded nothing
        filler.unlink()
        fact = rt.memory.remember("the deploy key rotates on Fridays", conflict_key="k0")
        assert fact.supersedes == (active.id,)
        assert rt.memory.get(active.id).superseded_by == fact.id  # type: ignore[union-attr]
    with journaled.open(url) as rt:
        assert rt.journal.verify().ok
        assert len(rt.memory.all()) == len(kept) + 1


@needs_mount
def test_a_run_whose_disk_fills_stops_with_journal_full_and_resumes_once_freed(
    disk: Path,
) -> None:
    """R4, E14: a run whose disk fills mid-chain fails its caller with JournalFull; what was
    journaled before stays, the step whose result could not be stored runs again on resume in
    the same runtime once space is freed, and no step that succeeded runs twice."""
    url = f"sqlite:///{disk / 'journal.sqlite'}"
    echo = FillingEcho(disk, at=5)
    calls, filled = echo.calls, echo.filled

    with journaled.open(url) as rt:
        rt.register_tool("echo", echo)
        handle = rt.start(chain(12))
        with pytest.raises(JournalFull):
            handle.result(timeout=60)
        done = [s.id for s in handle.state().plan.steps if s.status == "succeeded"]
        assert done == [f"s{i}" for i in range(5)]
        assert calls == [0, 1, 2, 3, 4, 5]
        filled[0].unlink()
        calls.clear()
        result = rt.resume(handle.run_id)
        assert isinstance(result, journaled.ExecuteResult)
        assert result.ok
        assert calls == list(range(5, 12))
    with journaled.open(url) as rt:
        assert rt.journal.verify().ok
        assert rt.runs.list()[0].status == "completed"


_TABLESPACES = itertools.count()


@needs_mount
def test_a_postgresql_tablespace_that_fills_raises_journal_full(
    postgres_databases: pg.Databases, server_disk: Path
) -> None:
    """J2, M2 on PostgreSQL: a journal whose tables live in a tablespace on a full disk raises
    JournalFull (SQLSTATE 53100) for a remember and stores nothing of it; once space is freed
    the remember is stored and the journal verifies."""
    import psycopg

    disk = server_disk
    url = postgres_databases.take()
    database = url.rsplit("/", 1)[-1]
    tablespace = f"full_{os.getpid()}_{next(_TABLESPACES)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLESPACE {tablespace} LOCATION '{disk}'")
        conn.execute(f"ALTER DATABASE {database} SET default_tablespace = {tablespace}")
    try:
        with journaled.open(url) as rt:
            kept = [rt.memory.remember(f"fact {i}", conflict_key=f"k{i % 3}") for i in range(20)]
            position = rt.journal.position()
            filler = fill(disk)
            began = time.monotonic()
            with pytest.raises(JournalFull) as caught:
                # Incompressible and longer than the tables' free pages: they must grow.
                rt.memory.remember(os.urandom(200_000).hex(), conflict_key="k0")
            # At once: a full disk is not retried as a dropped connection (lock_wait each).
            assert time.monotonic() - began < 5.0
            assert "No space left on device" in caught.value.detail
            assert rt.journal.position() == position
            assert {f.id for f in rt.memory.all()} == {f.id for f in kept}
            filler.unlink()
            rt.memory.remember("the deploy key rotates on Fridays", conflict_key="k0")
            assert rt.journal.verify().ok
            assert len(rt.memory.all()) == len(kept) + 1
    finally:
        pg.drop_database(url)
        with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            conn.execute(f"DROP TABLESPACE IF EXISTS {tablespace}")


def test_disk_full_is_read_from_either_database_and_from_what_caused_an_error() -> None:
    """ADR 0081: SQLite's SQLITE_FULL and PostgreSQL's SQLSTATE 53100, as the library wraps
    them, are a full disk; a lock or another database error is not."""
    lite = sqlite3.OperationalError("database or disk is full")
    lite.sqlite_errorcode = sqlite3.SQLITE_FULL
    assert disk_full(_raised(OperationalError(lite), lite)) == "database or disk is full"

    class DiskFull(Exception):
        sqlstate = "53100"

    pg = DiskFull('could not extend file "base/16384/16385": No space left on device\nHINT: …')
    said = disk_full(_raised(OperationalError(pg), pg))
    assert said == 'could not extend file "base/16384/16385": No space left on device'

    locked = sqlite3.OperationalError("database is locked")
    locked.sqlite_errorcode = sqlite3.SQLITE_BUSY
    assert disk_full(OperationalError(locked)) is None
    assert disk_full(ValueError("disk is full")) is None
    assert disk_full(None) is None


def _raised(error: BaseException, cause: BaseException) -> BaseException:
    """Return ``error`` as raised ``from cause``, as the library raises what it wraps."""
    with pytest.raises(type(error)) as caught:
        raise error from cause
    return caught.value
