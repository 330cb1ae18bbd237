"""A journal's close racing the calls under way on it (ADR 0080 and its update; SPEC R3, R7, A1).

Closes from another thread, from a signal handler on the thread that reads, twice at once,
interrupted by Ctrl-C, and while appends wait for a write lock another session holds; on SQLite
and PostgreSQL.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import threading
import time
from typing import Any

import msgspec
import pytest
from crash import run_script

from journaled.events.base import Pending
from journaled.events.catalog import codec
from journaled.events.errors import JournalBusy, JournalClosed
from journaled.events.journal import Journal
from journaled.events.plans import Observation
from journaled.events.runs import StepSucceeded
from journaled.events.url import parse_url
from journaled.testing import wait_for

WAIT = 20.0
"""Longest a probe waits for anything (never reached when things work)."""
CODEC = codec()


def _child(script: str, *args: str, timeout: float = 90.0) -> subprocess.CompletedProcess[str]:
    return run_script(script, *args, timeout=timeout)


def _last_json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(lines[-1])


def _event(version: int, stream: str = "s") -> Pending:
    return Pending(
        stream=stream,
        version=version,
        data=StepSucceeded(
            at=1_700_000_000_000 + version,
            step_id=f"v{version}",
            attempt=1,
            observation=Observation(step_id=f"v{version}", ok=True, output=version),
        ),
    )


def _appender(
    j: Journal, outcome: list[BaseException | str], event: Pending | None = None
) -> threading.Thread:
    """Return a thread (not started) appending ``event`` (version 2 of stream s) to ``j``; it
    puts "appended" or the error it met in ``outcome``."""

    def append() -> None:
        try:
            j.append([event or _event(2)])
            outcome.append("appended")
        except BaseException as exc:
            outcome.append(exc)

    return threading.Thread(target=append, daemon=True)


def _journal(url: str, lock_wait: float) -> Journal:
    return Journal(msgspec.structs.replace(parse_url(url), lock_wait=lock_wait), CODEC)


_HELPERS = """
import json, os, signal, sqlite3, sys, threading, time
import msgspec
from journaled.events.base import Pending
from journaled.events.catalog import codec
from journaled.events.journal import Journal
from journaled.events.plans import Observation
from journaled.events.runs import StepSucceeded
from journaled.events.url import parse_url


def event(version):
    return Pending(
        stream="s",
        version=version,
        data=StepSucceeded(
            at=1_700_000_000_000 + version,
            step_id=f"v{version}",
            attempt=1,
            observation=Observation(step_id=f"v{version}", ok=True, output=version),
        ),
    )


def journal(url, lock_wait):
    return Journal(msgspec.structs.replace(parse_url(url), lock_wait=lock_wait), codec())
"""

# -- Ctrl-C in the middle of a close -------------------------------------------------------------

CLOSE_INTERRUPTED = (
    _HELPERS
    + """
url, path = sys.argv[1], sys.argv[2]
j = journal(url, 3.0)
j.append([event(1)])
other = sqlite3.connect(path, isolation_level=None)  # another process's open transaction
other.execute("BEGIN IMMEDIATE")
outcome = []


def append():
    try:
        j.append([event(2)])
        outcome.append("appended")
    except Exception as exc:
        outcome.append(type(exc).__name__)


appender = threading.Thread(target=append)
appender.start()
deadline = time.monotonic() + 10
while j._users == 0 and time.monotonic() < deadline:  # the append waits in SQLite's lock
    time.sleep(0.01)
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()  # Ctrl-C, as from a terminal
interrupted = False
try:
    j.close()
except KeyboardInterrupt:
    interrupted = True
other.execute("ROLLBACK")
appender.join(10)
j.close()  # the program closes again once the wait it interrupted is over
pool = j._recorder.datastore.pool
print(json.dumps({"interrupted": interrupted, "outcome": outcome, "pool_closed": pool._closed,
                  "writer_open": pool._writer is not None}))
"""
)


def test_a_close_cut_by_ctrl_c_is_finished_by_the_next_close(sqlite_url: str) -> None:
    """R3/ADR 0080: Ctrl-C while a close waits for an append stuck on another process's lock
    raises KeyboardInterrupt; the close called again afterwards closes the connections."""
    path = sqlite_url.removeprefix("sqlite:///")
    found = _last_json(_child(CLOSE_INTERRUPTED, sqlite_url, path))
    assert found["interrupted"], found
    assert found["outcome"], found
    assert found["pool_closed"], found
    assert not found["writer_open"], found


# -- a close on the thread whose own call is under way -------------------------------------------

CLOSE_FROM_HANDLER = """
import json, os, signal, sys, threading, time
import journaled
url = sys.argv[1]
errors = {}
with journaled.open(url) as rt:
    for i in range(30):
        rt.memory.remember(f"fact {i} about deploys")
for _ in range(5):
    rt = journaled.open(url)
    closed = []

    def stop(signum, frame):  # a program's SIGTERM handler: close, then let the loop end
        if not closed:
            closed.append(True)
            rt.close()

    signal.signal(signal.SIGTERM, stop)
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            rt.journal.position()
            list(rt.journal.read())
            rt.memory.search("deploys")
        except Exception as exc:
            name = f"{type(exc).__module__}.{type(exc).__name__}"
            errors[name] = errors.get(name, 0) + 1
            break
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    rt.close()
print(json.dumps({"errors": errors}))
"""


def test_a_close_from_a_signal_handler_ends_the_read_it_cut_with_journal_closed(
    sqlite_url: str,
) -> None:
    """R3/ADR 0080: rt.close() from a SIGTERM handler that lands in the main thread's read
    ends that read with JournalClosed or RuntimeClosed, never a driver's or library's error."""
    found = _last_json(_child(CLOSE_FROM_HANDLER, sqlite_url))
    assert sum(found["errors"].values()) == 5, found
    allowed = {"journaled.events.errors.JournalClosed", "journaled.actors.errors.RuntimeClosed"}
    assert set(found["errors"]) <= allowed, found


# -- two closes at once ------------------------------------------------------------------------


def test_a_second_close_returns_only_once_the_journal_is_closed(sqlite_url: str) -> None:
    """R3/ADR 0080: of two closes from two threads, neither returns before the connections
    are closed (the runtime's own close keeps this promise; the journal's does not)."""
    j = _journal(sqlite_url, 2.0)
    j.append([_event(1)])
    path = sqlite_url.removeprefix("sqlite:///")
    other = sqlite3.connect(path, isolation_level=None)  # another process's open transaction
    other.execute("BEGIN IMMEDIATE")
    outcome: list[BaseException | str] = []
    appender = _appender(j, outcome)
    first = threading.Thread(target=j.close)
    try:
        appender.start()
        wait_for(lambda: j._users == 1, timeout=WAIT)  # the append waits in SQLite's lock
        first.start()
        wait_for(lambda: j._closed, timeout=WAIT)
        j.close()  # the second close, on this thread
        pool: Any = j._recorder.datastore.pool  # type: ignore[union-attr]
        closed_when_returned = pool._closed
    finally:
        other.execute("ROLLBACK")
        other.close()
        appender.join(WAIT)
        first.join(WAIT)
    assert not first.is_alive()
    assert not appender.is_alive()
    assert len(outcome) == 1, outcome
    assert isinstance(outcome[0], JournalBusy | str), outcome
    assert closed_when_returned, "the second close returned before the connections closed"


# -- appends waiting for a write lock another session holds ---------------------------------------


def _hold_write_lock(j: Journal) -> Any:
    """Take the journal's write lock from another session (a shell's open transaction, a
    backup); return that session's connection, whose rollback lets the lock go."""
    if j.config.backend == "sqlite":
        assert j.config.path is not None
        lite = sqlite3.connect(j.config.path, isolation_level=None)
        lite.execute("BEGIN IMMEDIATE")
        return lite
    from journaled.events.journal import _postgres

    table = j._recorder.events_table_name  # type: ignore[union-attr]
    conn = _postgres._pg_connect(j.config)
    conn.execute(f"LOCK TABLE public.{table} IN EXCLUSIVE MODE")  # its transaction stays open
    return conn


def test_a_close_behind_another_sessions_write_lock_ends_within_lock_wait(durable_url: str) -> None:
    """R3/ADR 0080 update: while another session holds the journal's write lock, a close ends
    the appends of this process waiting for it with JournalBusy or JournalClosed (never a
    driver's error) and returns within their lock_wait. On SQLite the append queued behind
    this process's own writer gives up at once (JournalClosed); an append already waiting on
    the database's own lock (SQLite's file lock, PostgreSQL's table lock) is not cut short."""
    lock_wait = 6.0
    j = _journal(durable_url, lock_wait)
    j.append([_event(1)])
    other = _hold_write_lock(j)
    outcome: list[BaseException | str] = []
    appenders = [_appender(j, outcome, _event(1, stream=s)) for s in ("q1", "q2")]
    closer = threading.Thread(target=j.close)
    took = first_end = WAIT + 1
    try:
        for t in appenders:
            t.start()
        wait_for(lambda: j._users == 2 or bool(outcome), timeout=WAIT)
        assert not outcome, outcome
        began = time.monotonic()
        closer.start()
        wait_for(lambda: bool(outcome), timeout=WAIT)
        first_end = time.monotonic() - began
        closer.join(WAIT)
        took = time.monotonic() - began
    finally:
        other.rollback()
        other.close()
        for t in appenders:
            t.join(WAIT)
        closer.join(WAIT)
    assert not closer.is_alive()
    kinds = [type(o).__name__ for o in outcome]
    if j.config.backend == "sqlite":
        assert kinds == ["JournalClosed", "JournalBusy"], kinds
        assert first_end < lock_wait / 2, f"the queued append ended after {first_end:.1f}s"
    else:
        assert kinds == ["JournalBusy", "JournalBusy"], kinds
    assert took < lock_wait + 3.0, f"the close waited {took:.1f}s, past the appends' lock_wait"


def test_a_close_ends_an_acknowledgement_waiting_for_the_write_lock(sqlite_url: str) -> None:
    """A3/ADR 0080 update: a named subscription's ack queued for the write lock behind an append
    is ended by the close with JournalClosed, as a queued append is; the close waits for the
    append holding the lock alone, not for a second lock_wait."""
    lock_wait = 3.0
    j = _journal(sqlite_url, lock_wait)
    j.append([_event(1)])
    j.acknowledge("consumer", 1)
    other = _hold_write_lock(j)
    outcome: dict[str, BaseException | str] = {}

    def call(name: str, fn: Any) -> None:
        try:
            fn()
            outcome[name] = "done"
        except BaseException as exc:
            outcome[name] = exc

    appender = threading.Thread(target=call, args=("append", lambda: j.append([_event(2)])))
    acker = threading.Thread(target=call, args=("ack", lambda: j.acknowledge("consumer", 2)))
    took = WAIT + 1
    try:
        appender.start()
        pool: Any = j._recorder.datastore.pool  # type: ignore[union-attr]
        # The append holds the pool's lock, waiting for the file's: only then the ack queues.
        wait_for(lambda: pool._writer_lock._lock.locked() or bool(outcome), timeout=WAIT)
        acker.start()
        wait_for(lambda: j._users == 2 or bool(outcome), timeout=WAIT)
        assert not outcome, outcome
        time.sleep(0.1)  # the ack waits for the pool's lock
        began = time.monotonic()
        j.close()
        took = time.monotonic() - began
    finally:
        other.rollback()
        other.close()
        appender.join(WAIT)
        acker.join(WAIT)
    assert isinstance(outcome["append"], JournalBusy), outcome
    assert isinstance(outcome["ack"], JournalClosed), outcome
    assert took < lock_wait + 1.5, f"the close took {took:.1f}s: it waited for the ack too"


# -- waits for appends ---------------------------------------------------------------------------


def test_a_close_wakes_a_wait_for_appends_at_once_while_a_call_is_stuck(sqlite_url: str) -> None:
    """A3/ADR 0080: a wait for appends (what a subscription waits in) returns as soon as the
    close begins, even while an append of another thread waits out another session's lock."""
    lock_wait = 3.0
    j = _journal(sqlite_url, lock_wait)
    j.append([_event(1)])
    other = _hold_write_lock(j)
    woke: list[float] = []
    outcome: list[BaseException | str] = []
    rounds: list[int] = []

    def waiter() -> None:  # as a subscription follows: mark, read, wait
        try:
            while True:
                mark = j.append_mark()
                j.position()
                rounds.append(mark)
                j.wait_for_appends(WAIT, since=mark)
        except JournalClosed:
            woke.append(time.monotonic())

    appender = _appender(j, outcome)
    sleeper = threading.Thread(target=waiter)
    closer = threading.Thread(target=j.close)
    began = time.monotonic()
    try:
        appender.start()
        wait_for(lambda: j._users == 1 or bool(outcome), timeout=WAIT)
        sleeper.start()
        # Past the watcher's first look (which wakes it once): it now waits for a real append.
        wait_for(lambda: len(rounds) >= 2 and j._waiters == 1, timeout=WAIT)
        time.sleep(0.3)
        assert j._waiters == 1
        assert len(rounds) == 2, rounds
        began = time.monotonic()
        closer.start()
        sleeper.join(WAIT)
    finally:
        other.rollback()
        other.close()
        appender.join(WAIT)
        closer.join(WAIT)
        sleeper.join(WAIT)
    assert woke, "the waiter never saw the close"
    assert woke[0] - began < 1.0, f"the waiter saw the close {woke[0] - began:.1f}s after it began"


# -- behaviours that hold --------------------------------------------------------------------------


def test_a_verify_racing_a_close_reports_no_problem_it_did_not_find(durable_url: str) -> None:
    """R7/ADR 0080: a verify of a journal of several pages cut by a close from another thread
    raises JournalClosed or reports the journal sound; it never reports a false problem."""
    j = _journal(durable_url, 2.0)
    for batch in range(5):
        j.append([_event(v, stream=f"b{batch}") for v in range(1, 501)])
    assert j.verify().ok
    j.close()
    seen: list[str] = []
    for delay in (0.0, 0.02, 0.05, 0.1):
        j = _journal(durable_url, 2.0)
        outcome: list[Any] = []

        def check(journal: Journal = j, into: list[Any] = outcome) -> None:
            try:
                while True:
                    into.append(journal.verify())
            except BaseException as exc:
                into.append(exc)

        checker = threading.Thread(target=check)
        checker.start()
        time.sleep(delay)
        j.close()
        checker.join(WAIT)
        assert not checker.is_alive()
        assert isinstance(outcome[-1], JournalClosed), outcome[-1]
        for report in outcome[:-1]:
            assert report.ok, report
            assert report.events == 2500, report
        seen.append(type(outcome[-1]).__name__)
    assert seen == ["JournalClosed"] * 4


def test_a_sigint_in_nested_journal_calls_waits_for_the_outer_one_and_leaves_none_counted(
    sqlite_url: str,
) -> None:
    """R4/ADR 0080 update: Ctrl-C inside a journal call nested in another, each entered from its
    own frame, is raised once the outer call ends; the count of calls under way is back to zero,
    so a close after it does not wait."""
    j = _journal(sqlite_url, 2.0)
    reached: list[str] = []

    def inner() -> None:
        with j._using():
            signal.raise_signal(signal.SIGINT)
            reached.append(f"inner {j._users}")

    def outer() -> None:
        with j._using():
            inner()
            reached.append(f"outer {j._users}")

    with pytest.raises(KeyboardInterrupt):
        outer()
    assert reached == ["inner 2", "outer 1"]
    assert j._users == 0
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    began = time.monotonic()
    j.close()
    assert time.monotonic() - began < 1.0
    with pytest.raises(JournalClosed):
        j.position()


ASYNC_READS_RACING_CLOSE = """
import asyncio, json, sys
import journaled, journaled.aio
url = sys.argv[1]
errors = {}
results = 0


async def main():
    global results
    async with journaled.aio.open(url) as rt:
        for i in range(20):
            await rt.memory.remember(f"fact {i} about deploys")
    for _ in range(8):
        rt = await journaled.aio.open(url, workers=4)

        async def reader():
            global results
            while True:
                try:
                    await rt.journal.position()
                    await rt.journal.read()
                    await rt.memory.search("deploys")
                    results += 1
                except BaseException as exc:
                    name = f"{type(exc).__module__}.{type(exc).__name__}"
                    errors[name] = errors.get(name, 0) + 1
                    return

        readers = [asyncio.ensure_future(reader()) for _ in range(6)]
        await asyncio.sleep(0.05)
        await asyncio.wait_for(rt.close(drain=1.0), 30)
        await asyncio.wait_for(asyncio.gather(*readers), 30)


asyncio.run(main())
print(json.dumps({"errors": errors, "results": results}))
"""


def test_async_reads_racing_the_async_close_end_with_a_closed_error(durable_url: str) -> None:
    """A1/R3 (ADR 0080): six tasks reading through the asyncio runtime while it closes (eight
    times) each end with JournalClosed or RuntimeClosed, never a driver's error, a crash or
    a hang."""
    found = _last_json(_child(ASYNC_READS_RACING_CLOSE, durable_url))
    assert sum(found["errors"].values()) == 48, found
    allowed = {"journaled.events.errors.JournalClosed", "journaled.actors.errors.RuntimeClosed"}
    assert set(found["errors"]) <= allowed, found


# -- a close on the thread of the call it cuts, and a call failing on its own -------------------


def test_a_close_inside_its_own_threads_append_ends_that_append_with_journal_closed(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R3/ADR 0080: a close run on the thread whose append holds the write lock (a signal
    handler's, landing there) closes the journal and that append ends with JournalClosed; it
    never waits for the lock its own thread holds."""
    j = _journal(sqlite_url, 2.0)
    j.append([_event(1)])
    recorder: Any = j._recorder
    insert = recorder._insert_events

    def landing(c: Any, stored: Any, **kwargs: Any) -> Any:
        j.close()  # what the handler does when the signal lands in the append
        return insert(c, stored, **kwargs)

    monkeypatch.setattr(recorder, "_insert_events", landing)
    outcome: list[BaseException | str] = []
    appender = _appender(j, outcome)
    appender.start()
    appender.join(WAIT)
    assert not appender.is_alive(), "the close waited for its own thread's write lock"
    assert [type(o).__name__ for o in outcome] == ["JournalClosed"], outcome
    assert j._shut


def test_a_call_failing_on_its_own_while_a_close_waits_keeps_its_error(sqlite_url: str) -> None:
    """R3, J5/ADR 0080: a read that fails for its own reason (a damaged page) while a close
    waits for it raises that error, not JournalClosed: the close closed nothing under it."""
    j = _journal(sqlite_url, 4.0)
    j.append([_event(1)])
    started = threading.Event()

    def damaged(*_: Any, **__: Any) -> Any:
        started.set()
        time.sleep(0.5)  # the close begins meanwhile, and waits for this call
        raise sqlite3.DatabaseError("database disk image is malformed")

    recorder: Any = j._recorder
    recorder.max_notification_id = damaged
    recorder.select_notifications = damaged
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            j.position()
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    assert started.wait(WAIT)
    j.close()
    reader.join(WAIT)
    assert [type(o).__name__ for o in outcome] == ["DatabaseError"], outcome
