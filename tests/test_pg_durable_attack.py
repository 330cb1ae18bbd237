"""Attacks on ADR 0052's claim: a PostgreSQL reader never reports a position whose append is not
yet on disk, and no longer waits on log records that no commit flushes (J1, R5; ADR 0044, 0052).

One durable server for the module. Two tools make "not yet on disk" deterministic:

- the WAL writer is frozen (SIGSTOP): what no commit flushes stays in the server's WAL buffers,
  and the flush position (``pg_current_wal_flush_lsn()``) does not move unless a commit that
  waits for the disk moves it; killing it (SIGKILL) is a crash that loses those buffers;
- a writer is frozen between the append procedure's two transactions: a session holds its row
  of the flush table ``FOR UPDATE``, so the first transaction (the events, committed without
  waiting for the disk) is visible and the second (the flush) waits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pg
import pytest
from required import unavailable

psycopg = pytest.importorskip("psycopg", reason="PostgreSQL tests need the postgres extra")

from journaled.events.base import Pending  # noqa: E402 - after the extra's check
from journaled.events.codec import Codec  # noqa: E402
from journaled.events.errors import JournalBusy  # noqa: E402
from journaled.events.journal import Journal  # noqa: E402
from journaled.events.journal._common import EVENTS_TABLE_POSTGRES  # noqa: E402
from journaled.events.journal._postgres import (  # noqa: E402
    APPEND_PROCEDURE,
    APPEND_PROCEDURE_V1,
    DURABLE_FUNCTION,
    DURABLE_FUNCTION_V1,
    FLUSH_TABLE,
    _PostgresRecorder,
)
from journaled.events.memory import MEMORY_EVENTS, FactRemembered  # noqa: E402
from journaled.events.url import parse_url  # noqa: E402

pytestmark = pytest.mark.slow

OFF_ROLE = "journaled_async"
"""A login role whose sessions do not wait for the disk on commit (``ALTER ROLE ... SET``)."""

EVENTS = EVENTS_TABLE_POSTGRES


@pytest.fixture(scope="module")
def server() -> Iterator[pg.PostgresServer]:
    """A durable server (fsync, synchronous commits) with a slow WAL writer, and a role whose
    sessions run with ``synchronous_commit = off``."""
    try:
        with pg.slow_wal_writer_server() as started:
            with psycopg.connect(started.url("postgres"), autocommit=True) as conn:
                conn.execute(f"CREATE ROLE {OFF_ROLE} LOGIN SUPERUSER")
                conn.execute(f"ALTER ROLE {OFF_ROLE} SET synchronous_commit = off")
            yield started
    except pg.PostgresUnavailable as exc:
        unavailable("POSTGRES", str(exc))


@pytest.fixture
def url(server: pg.PostgresServer) -> str:
    """A fresh database on the module's server."""
    return pg.create_database(server.url("postgres"))


def _as(url: str, user: str) -> str:
    return url.replace("postgresql://postgres@", f"postgresql://{user}@", 1)


def _journal(url: str, *, create: bool = True) -> Journal:
    return Journal(parse_url(url), Codec(MEMORY_EVENTS), create=create)


def _pg(journal: Journal) -> _PostgresRecorder:
    recorder = journal._recorder
    assert isinstance(recorder, _PostgresRecorder)
    return recorder


def _pending(stream: str) -> list[Pending]:
    event = FactRemembered(at=1, fact_id=stream, scope="project")
    return [Pending(stream=stream, version=1, data=event)]


def _append(journal: Journal, stream: str, **kwargs: Any) -> list[int]:
    return journal.append(_pending(stream), **kwargs)


def _one(url: str, query: str, params: list[Any] | None = None) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
        assert row is not None
        return row[0]


def _wait_for(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _flushed(url: str) -> str:
    return str(_one(url, "SELECT pg_current_wal_flush_lsn()"))


def _rows(url: str) -> dict[int, tuple[str, int]]:
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(
            f"SELECT notification_id, originator_id, originator_version FROM public.{EVENTS}"  # noqa: S608
        ).fetchall()
    return {int(p): (str(s), int(v)) for p, s, v in found}


def _as_previous_release(url: str) -> None:
    """Make a journal look migrated by the previous release: only the ``_v1`` procedure and
    function, and a flush table without ``upto``."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP PROCEDURE public.{APPEND_PROCEDURE}")
        conn.execute(f"DROP FUNCTION public.{DURABLE_FUNCTION}")
        conn.execute(f"ALTER TABLE public.{FLUSH_TABLE} DROP COLUMN upto")


class _WalWriter:
    """The server's WAL writer, frozen while the block runs (thawed after, unless crashed)."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.pid = int(
            _one(admin_url, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'")
        )
        self.crashed = False

    def crash(self) -> None:
        """Kill it: the postmaster resets the server, which recovers from what is on disk."""
        os.kill(self.pid, signal.SIGKILL)
        self.crashed = True

        def back() -> bool:
            try:
                found = _one(
                    self.admin_url,
                    "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'",
                )
            except psycopg.OperationalError:
                return False
            return found is not None and int(found) != self.pid

        _wait_for(back, "the server to recover", timeout=30)


@contextlib.contextmanager
def _wal_writer_frozen(admin_url: str) -> Iterator[_WalWriter]:
    writer = _WalWriter(admin_url)
    os.kill(writer.pid, signal.SIGSTOP)
    try:
        yield writer
    finally:
        if not writer.crashed:
            os.kill(writer.pid, signal.SIGCONT)


class _Freezer:
    """Holds the flush-table rows of every backend connected now, so that an append by one of
    them stops between its two transactions (its first committed, its flush waiting)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(
            f"INSERT INTO public.{FLUSH_TABLE} (pid, appends) "  # noqa: S608
            "SELECT pid, 0 FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() ON CONFLICT (pid) DO NOTHING"
        )
        self.conn.execute("BEGIN")
        self.conn.execute(f"SELECT pid FROM public.{FLUSH_TABLE} FOR UPDATE")  # noqa: S608

    def waiting(self) -> list[int]:
        """Return the pids of appends stopped between their transactions."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE 'CALL public.journaled_append%'"
            ).fetchall()
        return [int(r[0]) for r in rows]

    def release(self) -> None:
        with contextlib.suppress(psycopg.Error):
            self.conn.execute("ROLLBACK")
        self.conn.close()


class _Background:
    """A call run on a thread: its result or its error, whichever it came to."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()

        def run() -> None:
            try:
                self.result = call()
            except BaseException as exc:  # reported by the test, never lost in a thread
                self.error = exc
            finally:
                self.done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)


def _freeze_append(
    url: str, writer: Journal, stream: str
) -> tuple[_Freezer, _Background, int, str]:
    """Start an append by ``writer`` and stop it between its transactions; return the freezer,
    the append's thread, the position its committed first transaction made visible, and the
    log's flush position just before the append began (its commit is past it)."""
    before = int(_one(url, f"SELECT coalesce(max(notification_id), 0) FROM public.{EVENTS}"))  # noqa: S608
    freezer = _Freezer(url)
    flushed = _flushed(url)
    append = _Background(lambda: _append(writer, stream))
    _wait_for(lambda: bool(freezer.waiting()), "the append to stop between its transactions")
    visible = int(_one(url, f"SELECT max(notification_id) FROM public.{EVENTS}"))  # noqa: S608
    assert visible > before, "the frozen append's first transaction is not visible"
    return freezer, append, visible, flushed


class _FrozenRead:
    """What a reader answered while an append was stopped between its transactions (the WAL
    writer frozen), and the calls still waiting once the append was let go."""

    def __init__(self, server: pg.PostgresServer, url: str, writer: Journal, reader: Journal):
        with _wal_writer_frozen(server.url("postgres")):
            freezer, self.append, self.visible, flushed = _freeze_append(url, writer, "b")
            try:
                self.position = _Background(reader.position)
                self.read = _Background(lambda: [e.position for e in reader.read()])
                self.position.join(1.5)
                self.read.join(0.1)
                assert _flushed(url) == flushed, "the premise: nothing flushed the frozen append"
                self.early: list[int] = (
                    [self.position.result] if self.position.done.is_set() else []
                )
                self.early += self.read.result if self.read.done.is_set() else []
            finally:
                freezer.release()
                self.append.join(30)
            for done in (self.position, self.read):
                done.join(30)
        assert (self.append.error, self.position.error, self.read.error) == (None, None, None)


def _pooled_writer(url: str) -> Journal:
    """A writer with one connection, connected now (so that the freezer finds its backend)."""
    return _journal(url + "?pool_size=1")


def test_a_reader_whose_role_does_not_wait_for_the_disk_sees_only_durable_positions(
    server: pg.PostgresServer, url: str
) -> None:
    """J1, R5 (ADR 0052): a reader whose role sets synchronous_commit = off, on a server where
    appends do wait for the disk, does not report an append that is committed but not flushed
    (its writer stopped between the procedure's two transactions, the WAL writer frozen): its
    position and read wait, and answer once the append's flush is made.
    """
    writer = _pooled_writer(url)
    reader = _journal(_as(url, OFF_ROLE), create=False)
    try:
        durable = _append(writer, "a")[-1]
        assert reader.position() == durable
        frozen = _FrozenRead(server, url, writer, reader)
        assert all(p <= durable for p in frozen.early), (
            f"reported {frozen.early} while {frozen.visible} was not on disk"
        )
        assert frozen.position.result == frozen.visible
        assert frozen.read.result == [durable, frozen.visible]
    finally:
        reader.close()
        writer.close()


def test_a_reader_opened_before_the_journal_had_procedures_sees_only_durable_positions(
    server: pg.PostgresServer, url: str
) -> None:
    """J1, R5 (ADR 0044, 0052): a reader of this release that opened, without migrating, a
    journal migrated before ADR 0044 reads as the library does (no bound); once another process
    migrates the journal and appends through the procedure, that reader does not report an
    append committed but not flushed: it waits, and answers once the flush is made.
    """
    _journal(url).close()
    with psycopg.connect(url, autocommit=True) as conn:
        for kind, name in (
            ("PROCEDURE", APPEND_PROCEDURE),
            ("PROCEDURE", APPEND_PROCEDURE_V1),
            ("FUNCTION", DURABLE_FUNCTION),
            ("FUNCTION", DURABLE_FUNCTION_V1),
        ):
            conn.execute(f"DROP {kind} public.{name}")
        conn.execute(f"DROP TABLE public.{FLUSH_TABLE}")
    reader = _journal(url, create=False)
    try:
        assert _pg(reader).fast is False  # the journal had no procedures when it opened
        writer = _pooled_writer(url)  # migrates: the procedures and the flush table appear
        try:
            durable = _append(writer, "a")[-1]
            frozen = _FrozenRead(server, url, writer, reader)
            assert all(p <= durable for p in frozen.early), (
                f"the reader reported {frozen.early}; {frozen.visible} is not on disk"
            )
            assert reader.position() == frozen.visible
            assert [e.position for e in reader.read()] == [durable, frozen.visible]
        finally:
            writer.close()
    finally:
        reader.close()


def test_what_a_reader_saw_before_a_crash_is_there_after_recovery(
    server: pg.PostgresServer, url: str
) -> None:
    """J1, R5 (ADR 0052), a regression test: with one writer stopped between its transactions
    and another whose role does not wait for the disk appending after it, a reader (waiting for
    the disk) reports neither; the server then crashes (the WAL writer killed, its buffers lost),
    and every position the reader reported is there after recovery, holding the same event.
    """
    writer = _pooled_writer(url)
    reader = _journal(url, create=False)
    careless: Journal | None = None
    seen: dict[int, tuple[str, int]] = {}
    try:
        for stream in ("a", "b"):
            _append(writer, stream)
        durable = reader.position()
        seen.update({e.position: (e.stream, e.version) for e in reader.read()})
        with _wal_writer_frozen(server.url("postgres")) as walwriter:
            freezer, append, frozen, _ = _freeze_append(url, writer, "c")
            careless = _journal(_as(url, OFF_ROLE))  # opened after the freeze: not frozen
            lost = _append(careless, "d")[-1]  # returns at once: its flush does not wait
            assert lost > frozen
            position = _Background(reader.position)
            read = _Background(lambda: [(e.position, e.stream, e.version) for e in reader.read()])
            position.join(1.5)
            read.join(0.1)
            reported = [b.result for b in (position, read) if b.done.is_set() and not b.error]
            assert not position.done.is_set() or position.result == durable, reported
            walwriter.crash()
            freezer.release()
            for done in (position, read, append):
                done.join(30)
        if position.error is None and position.result is not None:
            assert position.result in {0, *seen, *_rows(url)}
        if read.error is None and read.result is not None:
            seen.update({p: (s, v) for p, s, v in read.result})
        after = _rows(url)
        assert lost not in after or after[lost] != ("d", 1), "the premise: the crash lost 'd'"
        missing = {p: e for p, e in seen.items() if after.get(p) != e}
        assert not missing, f"reported before the crash, gone after it: {missing}"
    finally:
        for journal in (reader, careless, writer):
            with contextlib.suppress(Exception):
                if journal is not None:
                    journal.close()


def test_a_writer_terminated_between_its_transactions_is_not_told_another_writer_won(
    url: str,
) -> None:
    """R5 (ADR 0044): a writer whose server process is terminated after the procedure's first
    transaction committed must not be told ConcurrencyConflict (another writer won the
    versions): its own events hold them. Readers see them once the log is flushed."""
    writer = _pooled_writer(url)
    try:
        _append(writer, "a")
        freezer, append, visible, _ = _freeze_append(url, writer, "b")
        try:
            (pid,) = freezer.waiting()
            assert _one(url, "SELECT pg_terminate_backend(%s)", [pid]) is True
        finally:
            freezer.release()
        append.join(30)
        assert _rows(url)[visible] == ("b", 1)  # committed by the terminated call
        assert append.error is None, (
            f"the append whose events are at position {visible} raised {append.error!r}"
        )
        assert append.result == [visible]
        assert writer.position() == visible
        assert writer.verify().ok
    finally:
        writer.close()


def test_writers_and_readers_of_both_releases_share_a_journal(url: str) -> None:
    """J1, J6, R5 (ADR 0052), a regression test: a journal of the previous release (``_v1``
    only, no ``upto``, the column dropped as an ALTER would leave it), appended to by a process
    that opened it without migrating, then migrated by another: both append side by side, each
    through its own procedure, and readers opened before and after the migration see every
    position, at once, and the same events; the chain verifies."""
    _journal(url).close()
    _as_previous_release(url)
    old = _journal(url, create=False)
    old_reader = _journal(url, create=False)
    try:
        assert (_pg(old).fast, _pg(old).proves) == (True, False)
        appended = _append(old, "o1")
        new = _journal(url)
        new_reader = _journal(url, create=False)
        try:
            assert _pg(new).proves
            assert _pg(new_reader).proves
            for i in range(3):
                appended += _append(new, f"n{i}") + _append(old, f"o{i + 2}")
            appended += _append(new, "s", snapshots={"n0": (1, b"state")})  # the library's path
            appended += _append(old, "s2", snapshots={"o1": (1, b"state")})
            appended += _append(new, "last")  # proves every position: new readers answer at once
            for reader in (new_reader, new, old_reader, old):
                started = time.monotonic()
                assert reader.position() == appended[-1]
                assert [e.position for e in reader.read()] == appended
                if _pg(reader).proves:
                    assert time.monotonic() - started < 3.0
            assert new.verify().ok
            assert int(_one(url, f"SELECT max(upto) FROM public.{FLUSH_TABLE}")) == appended[-1]  # noqa: S608
        finally:
            new_reader.close()
            new.close()
    finally:
        old_reader.close()
        old.close()


def _backup(url: str) -> Any:
    """Begin what pg_dump does: a REPEATABLE READ transaction holding ACCESS SHARE on every
    table of the journal's schema."""
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    tables = conn.execute(
        "SELECT string_agg(format('public.%I', tablename), ', ') FROM pg_tables "
        "WHERE schemaname = 'public'"
    ).fetchone()
    assert tables is not None
    conn.execute(f"LOCK TABLE {tables[0]} IN ACCESS SHARE MODE")
    return conn


def test_a_migrating_open_of_a_current_journal_does_not_wait_for_a_backup(url: str) -> None:
    """J6 (ADR 0052), a regression test: while a backup holds its snapshot and its locks, a
    migrating open of a journal that already has this release's schema opens at once, and
    appends and reads go on."""
    first = _journal(url)
    try:
        _append(first, "a")
        backup = _backup(url)
        try:
            started = time.monotonic()
            opening = _Background(lambda: _journal(url))
            opening.join(10)
            assert opening.done.is_set(), "the migrating open waited for the backup"
            assert opening.error is None, opening.error
            assert time.monotonic() - started < 5.0
            second: Journal = opening.result
            try:
                last = _append(second, "b", lock_wait=2.0)[-1]
                assert first.position() == last
            finally:
                second.close()
        finally:
            backup.close()
    finally:
        first.close()


def test_the_upgrading_open_during_a_backup_does_not_stop_every_writer(url: str) -> None:
    """J6 (ADR 0052): the first migrating open of this release on a previous release's journal
    (which adds ``upto``) while a backup holds its locks may wait for the backup, but the
    writers already appending (through the ``_v1`` procedure) must go on meanwhile: a one-second
    append does not time out."""
    _journal(url).close()
    _as_previous_release(url)
    old = _journal(url, create=False)
    try:
        _append(old, "a")
        backup = _backup(url)
        opening = _Background(lambda: _journal(url))
        try:

            def queued() -> bool:
                return bool(
                    _one(
                        url,
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock' AND query LIKE '%ALTER TABLE%'",
                    )
                )

            _wait_for(queued, "the upgrading open to wait for the backup")
            held = _one(
                url,
                "SELECT string_agg(l.mode, ',') FROM pg_locks l JOIN pg_stat_activity a "
                "USING (pid) WHERE l.relation = %s::regclass AND a.query LIKE '%%ALTER TABLE%%'",
                [f"public.{EVENTS}"],
            )
            try:
                _append(old, "b", lock_wait=1.0)
            except JournalBusy as exc:
                pytest.fail(
                    f"an append timed out while the upgrading open waited for the backup "
                    f"(it holds {held} on the events table): {exc}"
                )
        finally:
            backup.close()
            opening.join(30)
            if opening.result is not None:
                opening.result.close()
        assert opening.error is None
    finally:
        old.close()


def test_a_writer_terminated_before_its_events_committed_appends_them_once(url: str) -> None:
    """J2, R5 (ADR 0052): a writer whose server process is terminated while its call waits for
    the events table's lock (nothing committed) calls again on a new connection: its events are
    appended once, at the positions it returns."""
    writer = _pooled_writer(url)
    try:
        _append(writer, "a")
        holder = psycopg.connect(url)
        try:
            holder.execute(f"LOCK TABLE public.{EVENTS} IN EXCLUSIVE MODE")
            append = _Background(lambda: _append(writer, "b"))

            def waiting() -> list[int]:
                rows = _one(
                    url,
                    "SELECT array_agg(pid) FROM pg_stat_activity WHERE datname = "
                    "current_database() AND wait_event_type = 'Lock' "
                    "AND query LIKE 'CALL public.journaled_append%'",
                )
                return list(rows or [])

            _wait_for(lambda: bool(waiting()), "the append to wait for the table's lock")
            (pid,) = waiting()
            assert _one(url, "SELECT pg_terminate_backend(%s)", [pid]) is True
        finally:
            holder.rollback()
            holder.close()
        append.join(30)
        assert append.error is None, append.error
        rows = _rows(url)
        assert [p for p, event in rows.items() if event == ("b", 1)] == append.result
        assert writer.verify().ok
    finally:
        writer.close()
