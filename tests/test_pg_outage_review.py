"""A dropped append's look, as a cold review attacked it (R5, ADR 0095 update).

The call's server process runs on after the client lost its connection: its commit is slowed
by a trigger (a large append, a slow disk, synchronous replication), and the client side of the
socket is shut. A look made before that process ends sees nothing yet; before the fix, the
append was then called again and the caller was told ``JournalBusy`` or ``ConcurrencyConflict``
for an append that was stored. Real PostgreSQL, real sockets.
"""

from __future__ import annotations

import gc
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("psycopg", reason="PostgreSQL tests need the postgres extra (psycopg)")

import msgspec
import psycopg

from journaled.events.base import Pending
from journaled.events.codec import Codec
from journaled.events.errors import ConcurrencyConflict, JournalBusy
from journaled.events.journal import EVENTS_TABLE_POSTGRES, Journal
from journaled.events.memory import MEMORY_EVENTS, FactRemembered
from journaled.events.url import parse_url

pytestmark = pytest.mark.slow

EVENTS = EVENTS_TABLE_POSTGRES
WAIT = 30.0


def _pending(stream: str, at: int = 1) -> list[Pending]:
    return [
        Pending(
            stream=stream, version=1, data=FactRemembered(at=at, fact_id=stream, scope="project")
        )
    ]


def _journal(url: str, lock_wait: float | None = None) -> Journal:
    config = parse_url(url)
    if lock_wait is not None:
        config = msgspec.structs.replace(config, lock_wait=lock_wait)
    return Journal(config, Codec(MEMORY_EVENTS))


@pytest.fixture
def journal(pg_url: str) -> Iterator[Journal]:
    opened = _journal(pg_url, lock_wait=0.5)
    opened.append(_pending("warm"))
    yield opened
    opened.close()


def _admin(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def _slow_commit(url: str, seconds: float, *, deferred: bool) -> None:
    """Make the next insert into the events table sleep: in the statement, or at its COMMIT."""
    with _admin(url) as conn:
        conn.execute("CREATE TABLE slow (x int)")
        conn.execute(
            "CREATE FUNCTION slow_f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "  # noqa: S608
            "IF EXISTS (SELECT 1 FROM slow) THEN DELETE FROM slow; "
            f"PERFORM pg_sleep({float(seconds)}); END IF; RETURN NULL; END $$"
        )
        if deferred:
            conn.execute(
                f"CREATE CONSTRAINT TRIGGER slow_t AFTER INSERT ON public.{EVENTS} "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_f()"
            )
        else:
            conn.execute(
                f"CREATE TRIGGER slow_t BEFORE INSERT ON public.{EVENTS} "
                "FOR EACH STATEMENT EXECUTE FUNCTION slow_f()"
            )
        conn.execute("INSERT INTO slow VALUES (1)")


def _wait_for(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT
    while not (found := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return found


def _cut_client_side(url: str, pid: int) -> None:
    """Shut this process's socket to server process ``pid`` (a cut the client sees first)."""
    with warnings.catch_warnings():
        # The scan meets every object of the process: a module's deprecated attribute warns.
        warnings.simplefilter("ignore")
        found = [
            held
            for held in gc.get_objects()
            if isinstance(held, psycopg.Connection)
            and not held.closed
            and held.info.backend_pid == pid
        ]
    if not found:
        raise AssertionError(f"no connection of this process to server process {pid}")
    cut = socket.socket(fileno=os.dup(found[0].fileno()))
    cut.shutdown(socket.SHUT_RDWR)
    cut.close()


class _Append:
    def __init__(self, call: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.result = call()
            except BaseException as exc:  # reported by the test
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()


_CALL_WAITING_FOR_LOCK = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
    "AND wait_event_type = 'Lock' AND query LIKE 'CALL%%'"
)
_CALL_ASLEEP = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep'"
)


def _waiting(admin: psycopg.Connection[Any], query: str) -> int:
    """Return the server process a query finds, once it finds one."""

    def found() -> int | None:
        row = admin.execute(query).fetchone()
        return None if row is None else int(row[0])

    pid: int = _wait_for(found, query)
    return pid


def _count(url: str, stream: str) -> int:
    with _admin(url) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM public.{EVENTS} WHERE originator_id = %s",  # noqa: S608
            [stream],
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("path", ["procedure", "library"])
def test_a_stored_append_whose_process_outlived_the_cut_is_reported_stored(
    pg_url: str, journal: Journal, path: str
) -> None:
    """The call's process sleeps 2 s (in the insert on the procedure's path, in the COMMIT on
    the library's, an append with a snapshot); the client's socket is shut at once. The append
    returns the positions it was stored at, once."""
    _slow_commit(pg_url, 2.0, deferred=path == "library")
    snapshots = {"snap-victim": (1, b"state")} if path == "library" else None
    append = _Append(lambda: journal.append(_pending("victim"), snapshots=snapshots))
    with _admin(pg_url) as admin:
        pid = _waiting(admin, _CALL_ASLEEP)
    time.sleep(0.2)
    _cut_client_side(pg_url, pid)
    append.thread.join(WAIT)
    assert append.error is None, repr(append.error)
    assert _count(pg_url, "victim") == 1
    assert [e.position for e in journal.read() if e.stream == "victim"] == append.result


def test_a_conflict_met_on_a_retry_is_still_a_concurrency_conflict(
    pg_url: str, journal: Journal
) -> None:
    """The call is dropped while it waits for the table's lock; another writer then takes the
    stream's version: the retry says ConcurrencyConflict, as a first call would, not the
    driver's UniqueViolation."""
    other = _journal(pg_url)
    try:
        with psycopg.connect(pg_url) as holder:
            holder.execute(f"LOCK TABLE public.{EVENTS} IN EXCLUSIVE MODE")
            append = _Append(lambda: journal.append(_pending("contested")))
            with _admin(pg_url) as admin:
                pid = _waiting(admin, _CALL_WAITING_FOR_LOCK)
                admin.execute("SELECT pg_terminate_backend(%s)", [pid])
            holder.rollback()
        other.append(_pending("contested", at=99))
        append.thread.join(WAIT)
        assert isinstance(append.error, ConcurrencyConflict), repr(append.error)
    finally:
        other.close()


def test_a_retry_waits_for_the_lock_only_what_the_caller_had_left(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lock_wait=1: the call is dropped while it waits for a lock held throughout. The retry is
    given only what is left of the second (before, a whole second again: an append could be
    stored after its caller's wait had run out), and JournalBusy gives the whole wait."""
    journal = _journal(pg_url, lock_wait=1.0)
    recorder: Any = journal._recorder
    calls: list[tuple[float, float | None]] = []
    real = recorder._call_append

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append((time.monotonic(), args[3]))  # (when, the lock_wait it was given)
        return real(*args, **kwargs)

    monkeypatch.setattr(recorder, "_call_append", recording)
    try:
        journal.append(_pending("warm"))
        calls.clear()
        with psycopg.connect(pg_url) as holder:
            holder.execute(f"LOCK TABLE public.{EVENTS} IN EXCLUSIVE MODE")
            started = time.monotonic()
            append = _Append(lambda: journal.append(_pending("late")))
            with _admin(pg_url) as admin:
                pid = _waiting(admin, _CALL_WAITING_FOR_LOCK)
                admin.execute("SELECT pg_terminate_backend(%s)", [pid])
            append.thread.join(WAIT)
            told = append.error
            holder.rollback()
        assert isinstance(told, JournalBusy), repr(told)
        assert told.waited >= 1.0
        assert len(calls) >= 2
        for when, given in calls[1:]:
            assert given is not None
            assert given <= 1.0 - (when - started) + 0.01, calls
        assert _count(pg_url, "late") == 0
    finally:
        journal.close()


@pytest.mark.parametrize("path", ["procedure", "library"])
def test_an_error_the_server_answered_is_retried_at_once(
    pg_url: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A serialization failure (SQLSTATE 40001, as a deadlock with a scrub's VACUUM FULL gives):
    the server rolled the call back and its connection sits idle, so the look is sure at once
    and the append is made again. Before, the look waited for that live process to end, for
    the whole window, and reported the append's outcome unknown (seen in CI: two processes
    purging one fact)."""
    from journaled.events.journal import _postgres

    monkeypatch.setattr(_postgres, "OUTAGE_WAIT", 5.0)
    journal = _journal(pg_url)  # the default lock_wait; its tables made
    with _admin(pg_url) as conn:
        conn.execute("CREATE SEQUENCE fail_once")  # not rolled back with the failed call
        conn.execute(
            "CREATE FUNCTION fail_f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF nextval('fail_once') = 1 THEN "
            "RAISE EXCEPTION 'serialization failure' USING ERRCODE = '40001'; END IF; "
            "RETURN NULL; END $$"
        )
        conn.execute(
            f"CREATE TRIGGER fail_t BEFORE INSERT ON public.{EVENTS} "
            "FOR EACH STATEMENT EXECUTE FUNCTION fail_f()"
        )
    snapshots = {"snap-victim": (1, b"state")} if path == "library" else None
    try:
        positions = journal.append(_pending("victim"), snapshots=snapshots)
        assert _count(pg_url, "victim") == 1
        assert [e.position for e in journal.read() if e.stream == "victim"] == positions
    finally:
        journal.close()


@pytest.mark.parametrize("lock_wait", [1.0, 2 * WAIT], ids=["short-lock-wait", "long-lock-wait"])
@pytest.mark.parametrize("path", ["procedure", "library"])
def test_a_look_held_off_by_a_lock_leaves_a_stored_append_unknown_never_busy(
    pg_url: str, path: str, lock_wait: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call is cut while its COMMIT runs (the commit completes); a maintenance session then
    holds ACCESS EXCLUSIVE on the events table, so every look meets a lock timeout. Before, the
    look's timeout was taken for the call's: JournalBusy ("nothing was appended") for a stored
    append. Now: the positions once a look gets through, else AppendOutcomeUnknown. A look
    waits for the lock only what is left of the window: with a lock_wait longer than the test
    waits, one that waited lock_wait would leave the append unanswered."""
    from journaled.errors import AppendOutcomeUnknown
    from journaled.events.journal import _postgres

    monkeypatch.setattr(_postgres, "OUTAGE_WAIT", 4.0)
    journal = _journal(pg_url, lock_wait=lock_wait)
    try:
        journal.append(_pending("warm"))
        _slow_commit(pg_url, 1.0, deferred=True)
        snapshots = {"snap-x": (1, b"state")} if path == "library" else None
        append = _Append(lambda: journal.append(_pending("x"), snapshots=snapshots))
        with _admin(pg_url) as admin:
            pid = _waiting(admin, _CALL_ASLEEP)
            release = threading.Event()

            def maintenance() -> None:
                with _admin(pg_url) as held, held.transaction():
                    held.execute(f"LOCK TABLE public.{EVENTS} IN ACCESS EXCLUSIVE MODE")
                    release.wait(WAIT)

            holder = threading.Thread(target=maintenance, daemon=True)
            holder.start()
            try:
                _wait_for(
                    lambda: admin.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock'"
                    ).fetchone(),
                    "the maintenance session to queue for its lock",
                )
                _cut_client_side(pg_url, pid)
                append.thread.join(WAIT)
                in_time = not append.thread.is_alive()
            finally:
                release.set()  # never left holding its lock into the next test
                holder.join(WAIT)
            assert in_time, "the append waited past the window"
        assert _count(pg_url, "x") == 1  # the premise: the cut call's commit completed
        if append.error is not None:
            assert isinstance(append.error, AppendOutcomeUnknown), repr(append.error)
        else:
            assert append.result == [e.position for e in journal.read() if e.stream == "x"]
    finally:
        journal.close()


@pytest.mark.parametrize("path", ["procedure", "library"])
def test_a_statement_timeout_the_server_answers_is_the_callers_error(
    pg_url: str, path: str
) -> None:
    """Every call is answered with a statement timeout (57014) and rolled back: the caller
    gets that error after a few calls, nothing stored. Before, it was retried for the whole
    window and reported as an outage whose outcome was unknown."""
    from psycopg import errors as pg_errors

    from journaled.errors import JournalUnavailable

    _journal(pg_url).close()  # the tables
    with _admin(pg_url) as conn:
        conn.execute(
            "CREATE FUNCTION slow_f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "PERFORM pg_sleep(2); RETURN NULL; END $$"
        )
        conn.execute(
            f"CREATE TRIGGER slow_t BEFORE INSERT ON public.{EVENTS} "
            "FOR EACH STATEMENT EXECUTE FUNCTION slow_f()"
        )
        name = pg_url.rpartition("/")[2]
        conn.execute(f"ALTER DATABASE \"{name}\" SET statement_timeout = '300ms'")
    journal = _journal(pg_url)
    try:
        snapshots = {"snap-y": (1, b"state")} if path == "library" else None
        with pytest.raises(Exception, match="statement timeout") as caught:
            journal.append(_pending("y"), snapshots=snapshots)
        assert not isinstance(caught.value, JournalUnavailable), repr(caught.value)
        seen: BaseException | None = caught.value
        while seen is not None and not isinstance(seen, pg_errors.QueryCanceled):
            seen = seen.__cause__ or seen.__context__
        assert seen is not None, repr(caught.value)
        assert _count(pg_url, "y") == 0
    finally:
        journal.close()
