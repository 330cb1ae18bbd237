"""The count of calls under way on a journal when another signal's handler raises in one (ADR 0080
and its update; SPEC R3, A1).

A program embedding the journal may have handlers of its own that raise on the main thread (a
SIGTERM handler raising SystemExit, a SIGALRM timeout); CPython runs them between bytecodes,
also in the middle of the code that counts a call in and out. A count left one too high made
every later close wait its whole ``close_wait``, and an exception landing inside the count's
lock left that lock held, so a close from another thread hung for good. Closing on the main
thread and from another thread, after storms of real SIGALRMs, and with an exception raised at
each opcode of the counting code in turn.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from crash import run_script
from test_close_race_attack import _event, _journal

import journaled.events.journal as journal_module
from journaled.events import interrupts

LOCK_WAIT = 0.5
"""The journals' lock wait: their close waits at most 10 s (5 s + 5 s) for calls under way."""
PROMPT = 2.0
"""Seconds within which a close with no call under way on another thread returns."""
OWN = {journal_module.__file__, interrupts.__file__}
"""The files of the code that counts a call in and out."""


# -- storms of real signals, in a child process --------------------------------------------------

STORM = """
import json, signal, sys, threading, time
import msgspec
import journaled.events.journal as journal_module
from journaled.events import interrupts
from journaled.events.base import Pending
from journaled.events.catalog import codec
from journaled.events.journal import Journal
from journaled.events.plans import Observation
from journaled.events.runs import StepSucceeded
from journaled.events.url import parse_url

folder, lands, closer = sys.argv[1], sys.argv[2], sys.argv[3]
OWN = {journal_module.__file__, interrupts.__file__}


class Alarm(Exception):
    pass


def ours(frame):
    # The counting code, and what it calls in threading (a Condition's enter and exit).
    name = frame.f_code.co_filename
    caller = frame.f_back
    return name in OWN or (
        name == threading.__file__ and caller is not None and caller.f_code.co_filename in OWN
    )


armed = False


def ring(signum, frame):  # a program's own handler: a timeout raising where it lands
    if not armed or frame is None or frame.f_code.co_name == "<module>":
        return  # never in this loop itself, only in the journal calls it makes
    if lands == "anywhere" or ours(frame):
        raise Alarm


signal.signal(signal.SIGALRM, ring)
rounds = []
for round in range(3):
    j = Journal(
        msgspec.structs.replace(parse_url(f"sqlite:///{folder}/j{round}.sqlite"), lock_wait=0.5),
        codec(),
    )
    j.append([Pending(stream="s", version=1, data=StepSucceeded(
        at=1_700_000_000_000, step_id="v1", attempt=1,
        observation=Observation(step_id="v1", ok=True, output=1)))])
    alarms = done = 0
    errors = {}
    signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
    deadline = time.monotonic() + 1.0
    armed = True
    while armed:
        try:
            while time.monotonic() < deadline:
                j.position()
                j.stream("s")
                done += 1
            armed = False
        except Alarm:
            alarms += 1
        except Exception as exc:  # a library's state cut by the alarm: not what is probed here
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
    signal.setitimer(signal.ITIMER_REAL, 0)
    users = j._users
    began = time.monotonic()
    if closer == "main":
        j.close()
        hung = False
    else:
        thread = threading.Thread(target=j.close, daemon=True)
        thread.start()
        thread.join(15)
        hung = thread.is_alive()
    took = time.monotonic() - began
    rounds.append({"alarms": alarms, "done": done, "errors": errors, "users": users,
                   "close": took, "hung": hung})
    if hung or users or took > 2.0:
        break  # found: the next rounds would only wait as long again
print(json.dumps(rounds))
"""


def _storm(tmp_path: Path, lands: str, closer: str) -> list[dict[str, Any]]:
    proc = run_script(STORM, str(tmp_path), lands, closer, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rounds: list[dict[str, Any]] = json.loads(proc.stdout.splitlines()[-1])
    return rounds


def test_a_storm_of_raising_signals_leaves_no_call_counted_and_the_close_prompt(
    tmp_path: Path,
) -> None:
    """R3, A1/ADR 0080: reads on the main thread under a SIGALRM every 0.2 ms whose handler
    raises wherever it lands leave no call counted, and the close after each storm returns at
    once instead of waiting out its close_wait (with the old count: 6 runs of 6 failed)."""
    rounds = _storm(tmp_path, "anywhere", "main")
    for found in rounds:
        assert found["users"] == 0, found
        assert found["close"] < PROMPT, found
        assert found["alarms"] > 200, found  # the storm did land in the reads
    assert len(rounds) == 3, rounds


def test_raising_signals_in_the_counting_code_leave_a_close_from_another_thread_prompt(
    tmp_path: Path,
) -> None:
    """R3/ADR 0080: a SIGALRM handler raising whenever it lands in the code counting the main
    thread's reads in and out leaves no call counted and no lock held: a close from another
    thread returns at once (with the old count it hung on the count's lock, 6 runs of 6)."""
    rounds = _storm(tmp_path, "counting", "thread")
    for found in rounds:
        assert found["users"] == 0, found
        assert not found["hung"], found
        assert found["close"] < PROMPT, found
        assert found["alarms"] > 20, found  # the storm did land in the counting code
    assert len(rounds) == 3, rounds


# -- an exception at each opcode of the counting code in turn -------------------------------------


class _Landed(Exception):
    """Raised by the tracer where a signal's raising handler could have run."""


def _ours(frame: FrameType) -> bool:
    name = frame.f_code.co_filename
    caller = frame.f_back
    return name in OWN or (
        name == threading.__file__ and caller is not None and caller.f_code.co_filename in OWN
    )


def _raise_at(k: int, call: Any) -> str | None:
    """Run ``call`` raising _Landed at the ``k``-th function entry or opcode of the counting
    code; return where it landed, or None if the call has fewer than ``k``."""
    seen = 0
    landed: list[str] = []

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal seen
        if not _ours(frame):
            return None
        frame.f_trace_opcodes = True
        if event in ("call", "opcode"):
            seen += 1
            if seen == k:
                landed.append(f"{frame.f_code.co_name}:{frame.f_lineno} ({event})")
                raise _Landed
        return tracer

    sys.settrace(tracer)
    try:
        call()
    except _Landed:
        pass
    finally:
        sys.settrace(None)
        interrupts.heal()  # a section whose exit was cut puts Ctrl-C's handler back (ADR 0076)
    return landed[0] if landed else None


def test_an_exception_at_any_opcode_of_the_count_leaves_no_call_counted(sqlite_url: str) -> None:
    """R3/ADR 0080: an exception raised at each opcode and function entry of the code that
    counts a read in and out, in turn, leaves no call counted after it, and a close from
    another thread then returns at once (a handler cut the count's lock or its sums)."""
    j = _journal(sqlite_url, LOCK_WAIT)
    j.append([_event(1)])
    wrong: list[str] = []
    k = 0
    while True:
        k += 1
        where = _raise_at(k, j.position)
        if where is None:
            break
        if j._users != 0:
            wrong.append(f"{where}: {j._users} counted")
            j = _journal(sqlite_url, LOCK_WAIT)  # a fresh count for the next landing
    assert k > 100, k  # every opcode was reached
    assert wrong == [], wrong
    closer = threading.Thread(target=j.close, daemon=True)
    began = time.monotonic()
    closer.start()
    closer.join(15)
    assert not closer.is_alive(), "the close hangs on a lock the exception left held"
    assert time.monotonic() - began < PROMPT


def test_a_call_whose_exit_was_cut_is_not_waited_for_but_another_threads_call_is(
    sqlite_url: str,
) -> None:
    """R3/ADR 0080: after an exception landed as a read's ``__exit__`` was entered (where a
    signal's handler runs before its first line), a close from another thread still waits for
    a call under way on a third thread, and returns as soon as that one ends."""
    j = _journal(sqlite_url, LOCK_WAIT)
    j.append([_event(1)])

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if event == "call" and code.co_name == "__exit__" and code.co_filename in OWN:
            sys.settrace(None)
            raise _Landed
        return None

    sys.settrace(tracer)
    try:
        j.position()
    except _Landed:
        pass
    finally:
        sys.settrace(None)
        interrupts.heal()
    assert j._users == 0

    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with j._using():
            entered.set()
            release.wait(15)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert entered.wait(15)
    closer = threading.Thread(target=j.close, daemon=True)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive(), "the close did not wait for the call under way"
    released = time.monotonic()
    release.set()
    closer.join(15)
    assert not closer.is_alive()
    assert time.monotonic() - released < PROMPT
    holder.join(15)
