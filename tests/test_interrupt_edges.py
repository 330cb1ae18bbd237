"""An append interrupted inside its transaction (R4, J; a KeyboardInterrupt lands between any
two bytecodes of the main thread: Ctrl-C, a notebook's interrupt): the library's transaction
leaves its connection in an open transaction when the interrupt lands in its enter (after the
BEGIN) or in its exit (before the commit). Every later append of the runtime then failed with
"cannot start a transaction within a transaction", and the file's write lock could stay held."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import pytest
from eventsourcing.sqlite import SQLiteTransaction

import journaled
from journaled.events.journal import _sqlite


class _InterruptedOnce(SQLiteTransaction):
    """The library's transaction, interrupted once where it cannot roll back."""

    where = "enter"
    armed = False

    def __enter__(self) -> Any:
        cursor = super().__enter__()
        if _InterruptedOnce.armed and _InterruptedOnce.where == "enter":
            _InterruptedOnce.armed = False
            raise KeyboardInterrupt  # after the BEGIN, before the with body
        return cursor

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        if exc_val is None and _InterruptedOnce.armed and _InterruptedOnce.where == "exit":
            _InterruptedOnce.armed = False
            raise KeyboardInterrupt  # the rows are inserted, the commit never comes
        super().__exit__(exc_type, exc_val, exc_tb)


@pytest.fixture
def interrupted(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_InterruptedOnce]]:
    """Make the journal's appends use the interruptible transaction."""
    monkeypatch.setattr(_sqlite, "SQLiteTransaction", _InterruptedOnce)
    yield _InterruptedOnce
    _InterruptedOnce.armed = False


@pytest.mark.parametrize("where", ["enter", "exit"])
def test_an_append_interrupted_in_its_transaction_leaves_the_journal_writable(
    sqlite_url: str, interrupted: type[_InterruptedOnce], where: str
) -> None:
    """R4, J: after an interrupted remember, this runtime's next writes succeed, another
    connection can write at once (the lock is not held), nothing of the interrupted append
    is stored, and a fresh open folds what this runtime shows."""
    with journaled.open(sqlite_url) as rt:
        rt.memory.remember("before the interrupt")
        interrupted.where, interrupted.armed = where, True
        with pytest.raises(KeyboardInterrupt):
            rt.memory.remember("interrupted")
        assert not interrupted.armed
        other = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), timeout=0.5)
        try:
            other.execute("BEGIN IMMEDIATE")  # the file's write lock is free
            other.execute("ROLLBACK")
        finally:
            other.close()
        rt.memory.remember("after the interrupt")
        rt.register_tool("echo", lambda x: x)
        assert rt.execute(journaled.Plan(goal="g", steps=[journaled.Step("a", tool="echo")])).ok
        live = sorted(f.text for f in rt.memory.all())
        assert "after the interrupt" in live
        assert "before the interrupt" in live
    with journaled.open(sqlite_url) as fresh:
        assert sorted(f.text for f in fresh.memory.all()) == live
        assert fresh.journal.verify().ok


# -- Ctrl-C while a lock is held on the main thread (ADR 0076) -------------------------------------

_STORMED = r"""
import signal, sys, time, journaled
armed = False


def interrupt(signum, frame):
    if armed:  # only inside the library's calls: the probe's own loop stays whole
        raise KeyboardInterrupt


rt = journaled.open(sys.argv[1])
signal.signal(signal.SIGINT, interrupt)
stored = 0
print("READY", flush=True)
deadline = time.monotonic() + 2.5
while time.monotonic() < deadline:
    try:
        armed = True
        rt.memory.remember(f"fact {stored}")
        armed = False
        stored += 1
    except KeyboardInterrupt:
        armed = False
signal.signal(signal.SIGINT, signal.SIG_IGN)
rt.memory.remember("after the storm")
rt.register_tool("echo", lambda x: x)
assert rt.execute(journaled.Plan(goal="g", steps=[journaled.Step("a", tool="echo")])).ok
rt.close()
print("DONE", stored, flush=True)
"""


def _storm(script: str, url: str, timeout: float) -> None:
    """Run ``script`` on ``url`` in a process, send it SIGINTs every 1-30 ms for 1.5 s once it
    says READY, and assert it then ends well, saying DONE."""
    import random
    import signal as signals
    import subprocess
    import sys
    import time

    proc = subprocess.Popen(
        [sys.executable, "-c", script, url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("READY")
        end = time.monotonic() + 1.5
        while time.monotonic() < end and proc.poll() is None:
            time.sleep(random.uniform(0.001, 0.03))
            proc.send_signal(signals.SIGINT)
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    assert "DONE" in out, err[-2000:]


def test_remembers_interrupted_at_random_never_leave_a_lock_held(durable_url: str) -> None:
    """R4/ADR 0076: a main thread remembering in a loop under a storm of SIGINTs (each caught)
    still remembers, runs a plan and closes afterwards, and a fresh open verifies. A Ctrl-C
    landing right after a lock's acquire, before its ``try``, left the lock held: the writer's
    command lock, the SQLite pool's writer lock, the journal's wake-up condition or the psycopg
    pool's connection, and the next remember hung (11 of 16 runs on SQLite, 4 of 16 on
    PostgreSQL)."""

    for _ in range(3):
        _storm(_STORMED, durable_url, timeout=40)
    with journaled.open(durable_url) as fresh:
        assert fresh.journal.verify().ok
        assert "after the storm" in {f.text for f in fresh.memory.all()}


def test_a_sigint_in_a_deferred_section_is_raised_when_it_ends() -> None:
    """R4/ADR 0076: SIGINT inside ``interrupts_deferred`` on the main thread raises nothing there;
    KeyboardInterrupt comes once the section ends, and a nested section hands it outwards."""
    import signal as signals

    from journaled.events.interrupts import interrupts_deferred

    reached: list[str] = []

    def sections() -> None:
        with interrupts_deferred():
            with interrupts_deferred():
                signals.raise_signal(signals.SIGINT)
                reached.append("inner")
            reached.append("outer")

    with pytest.raises(KeyboardInterrupt):
        sections()
    assert reached == ["inner", "outer"]
    assert signals.getsignal(signals.SIGINT) is signals.default_int_handler


def test_a_programs_own_sigint_handler_runs_after_the_section() -> None:
    """R4/ADR 0076: a program's own SIGINT handler is called once the section ends, not inside
    it (where a handler that remembers would wait on a lock its own thread holds)."""
    import signal as signals

    from journaled.events.interrupts import interrupts_deferred

    calls: list[str] = []
    previous = signals.signal(signals.SIGINT, lambda *_: calls.append("handler"))
    try:
        with interrupts_deferred():
            signals.raise_signal(signals.SIGINT)
            calls.append("body")
        assert calls == ["body", "handler"]
    finally:
        signals.signal(signals.SIGINT, previous)


def test_off_the_main_thread_a_deferred_section_changes_nothing() -> None:
    """ADR 0076: on another thread the section runs as it is (signals reach the main one only)."""
    import signal as signals
    import threading

    from journaled.events.interrupts import interrupts_deferred

    seen: list[object] = []

    def body() -> None:
        with interrupts_deferred():
            seen.append(signals.getsignal(signals.SIGINT))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(10)
    assert seen == [signals.default_int_handler]


_READS_STORMED = r"""
import signal, sys, time, journaled
armed = False


def interrupt(signum, frame):
    if armed:
        raise KeyboardInterrupt


rt = journaled.open(sys.argv[1])
rt.register_tool("echo", lambda x: x)
for i in range(50):
    rt.memory.remember(f"fact {i} about deploys")
run = rt.execute(journaled.Plan(goal="g", steps=[journaled.Step("a", tool="echo", input=1)])).run_id
signal.signal(signal.SIGINT, interrupt)
print("READY", flush=True)
done = 0
deadline = time.monotonic() + 2.5
while time.monotonic() < deadline:
    try:
        armed = True
        kind = done % 5
        if kind == 0:
            rt.journal.read()
        elif kind == 1:
            rt.runs.at(run, rt.journal.position())
        elif kind == 2:
            rt.runs.list()
        elif kind == 3:
            rt.memory.search("deploys")
        else:
            rt.runs.history(run)
        armed = False
        done += 1
    except KeyboardInterrupt:
        armed = False
signal.signal(signal.SIGINT, signal.SIG_IGN)
for _ in range(20):
    rt.journal.read(); rt.runs.list(); rt.runs.history(run); rt.memory.search("deploys")
rt.memory.remember("after the storm")
rt.close()
print("DONE", done, flush=True)
"""


def test_reads_interrupted_at_random_never_leave_a_connection_checked_out(
    durable_url: str,
) -> None:
    """R4/ADR 0076: a main thread reading in a loop (the log, time travel, the run list, a
    search, a run's history) under a storm of SIGINTs (each caught) still reads and writes
    afterwards. A Ctrl-C landing in a pool's checkout left a connection checked out for good:
    "Timed out waiting for connection pool semaphore" (7 of 8 runs on SQLite)."""

    for _ in range(3):
        _storm(_READS_STORMED, durable_url, timeout=60)


def test_a_section_whose_exit_was_cut_short_heals_at_the_next_sigint() -> None:
    """R4/ADR 0076: a section left without its exit (another signal's raising handler cut it
    short) does not swallow Ctrl-C: the next SIGINT puts the program's handler back and
    raises KeyboardInterrupt at once; a section opened after it holds SIGINT again."""
    import signal as signals

    from journaled.events.interrupts import interrupts_deferred

    def cut_short() -> None:
        interrupts_deferred().__enter__()  # its __exit__ never runs

    cut_short()
    assert signals.getsignal(signals.SIGINT) is not signals.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        signals.raise_signal(signals.SIGINT)
    assert signals.getsignal(signals.SIGINT) is signals.default_int_handler
    cut_short()
    reached: list[str] = []

    def section() -> None:
        with interrupts_deferred():
            signals.raise_signal(signals.SIGINT)
            reached.append("body")

    with pytest.raises(KeyboardInterrupt):
        section()
    assert reached == ["body"]
    assert signals.getsignal(signals.SIGINT) is signals.default_int_handler
