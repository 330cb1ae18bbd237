"""Attacks on the writer's desk (ADR 0055): interrupts landing in the line's bookkeeping, and
groups that find the writer busy (their order, and a close). Each test names the behaviour it
expects; each failed before the desk finished its bookkeeping whatever interrupted it and sent a
busy group to the actor itself."""

from __future__ import annotations

import signal
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from in_place import (
    Interrupt,
    desk_of,
    interrupting_signal,  # noqa: F401  (the sigusr1_raises fixture)
    sqlite_rt,  # noqa: F401  (the rt fixture: a runtime on SQLite)
    writer_of,
)
from test_group_commit import WAIT, HeldWriter

import journaled
from journaled.actors.directory import CountingInbox
from journaled.actors.memory import MemoryWriter
from journaled.events.messages import Remember
from journaled.memory import Memory
from journaled.testing import wait_for


def _kill_main() -> None:
    main = threading.main_thread().ident
    assert main is not None
    signal.pthread_kill(main, signal.SIGUSR1)


def _remembering(
    rt: journaled.Runtime, outcomes: dict[str, Any], text: str, **kw: Any
) -> threading.Thread:
    def run() -> None:
        try:
            outcomes[text] = rt.memory.remember(text, **kw)
        except BaseException as exc:
            outcomes[text] = exc

    return threading.Thread(target=run, daemon=True, name=f"remember {text}")


def _delay_send(monkeypatch: pytest.MonkeyPatch, text: str, seconds: float) -> None:
    """Delay the moment the caller of ``text`` sends its remember to the actor, as the OS may
    deschedule that thread between the desk handing its remember back and the tell."""
    real = Memory.request_remember

    def request_remember(self: Memory, request: Remember) -> Any:
        if request.text == text:
            time.sleep(seconds)
        return real(self, request)

    monkeypatch.setattr(Memory, "request_remember", request_remember)


def test_an_interrupt_while_the_leader_hands_on_the_lead_does_not_wedge_the_desk(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch, sigusr1_raises: None
) -> None:
    """ADR 0055 ("a leader always answers its group and hands the lead on, wherever the
    interrupt lands"): a leader interrupted after its commit, while it waits for the desk's
    mutex in ``_finish`` (contended by any caller joining the line), must still hand the lead on.
    Otherwise its seat stays at the front of the line for ever and every later remember (the
    one waiting behind it, and all that come after) blocks for ever, with no timeout."""
    held = HeldWriter(monkeypatch)
    desk = desk_of(rt)
    outcomes: dict[str, Any] = {}
    behind = _remembering(rt, outcomes, "behind")

    def orchestrate() -> None:
        assert held.entered.wait(WAIT)  # the main thread leads and is inside its append
        behind.start()
        wait_for(lambda: len(desk._line) == 2, WAIT)
        with desk._mutex:  # as a caller joining the line at that moment
            held.release.set()
            wait_for(lambda: desk._line[0].fact is not None, WAIT)  # the leader's commit is done
            time.sleep(0.3)  # the leader now waits for the mutex in _finish
            _kill_main()
            time.sleep(0.3)

    threading.Thread(target=orchestrate, daemon=True).start()
    with pytest.raises(Interrupt):
        rt.memory.remember("leader")
    behind.join(WAIT)
    assert not behind.is_alive(), "the caller behind the interrupted leader waits for ever"
    later = _remembering(rt, outcomes, "later")
    later.start()
    later.join(WAIT)
    assert not later.is_alive(), "every later remember waits for ever"


def test_a_later_claim_in_line_supersedes_an_earlier_one_whose_group_went_to_the_actor(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """M3, ADR 0055: two claims of one conflict key in line are decided in line order (that is
    why a group stops before a second claim): the later one supersedes the earlier. When the
    earlier one's group finds the writer busy, it is handed back unsettled and the lead passes
    on at once, before that caller has sent it to the actor: the later claim is stored (in
    place or sent) first, and the earlier claim then supersedes it."""
    held = HeldWriter(monkeypatch)
    held.delays = {1: 0.5}  # the actor's own commit (of the message below) takes a while
    _delay_send(monkeypatch, "port is 80", 0.3)
    desk = desk_of(rt)
    outcomes: dict[str, Any] = {}
    first = _remembering(rt, outcomes, "first")
    first.start()
    assert held.entered.wait(WAIT)
    # A remember by message (the asyncio door): the writer is busy when the line moves on.
    _, by_message = rt.memory.request_remember(Remember(text="by message"))
    earlier = _remembering(rt, outcomes, "port is 80", conflict_key="port")
    later = _remembering(rt, outcomes, "port is 81", conflict_key="port")
    earlier.start()
    wait_for(lambda: len(desk._line) == 2, WAIT)
    later.start()
    wait_for(lambda: len(desk._line) == 3, WAIT)
    held.release.set()
    for thread in (first, earlier, later):
        thread.join(WAIT)
    by_message.result(WAIT)
    old, new = outcomes["port is 80"], outcomes["port is 81"]
    assert rt.memory.get(old.id).superseded_by == new.id  # type: ignore[union-attr]
    assert [f.text for f in rt.memory.search("port")] == ["port is 81"]


def test_a_remember_in_line_when_close_begins_is_stored_even_if_its_group_goes_to_the_actor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R3, ADR 0055 ("the close waits for the remembers already in line, so one that came
    before the close is stored either way"): a remember in line when rt.close() begins must be
    stored. The close first asks the writer for a snapshot (made slow here, as for a large
    memory), so the group at the front finds the writer busy and is handed back unsettled; the
    line is then empty, the close stops the writer, and the caller's own send (delayed here, as
    a descheduled thread's) comes after the stop: the remember is refused with RuntimeClosed
    and never stored, although it was in line before the close began."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    rt = journaled.open(url, follow=None)
    held = HeldWriter(monkeypatch)
    real_save = MemoryWriter._save_snapshot

    def slow_save(self: MemoryWriter, min_events: int) -> bool:
        time.sleep(0.3)  # a snapshot of a large memory takes a while
        return real_save(self, min_events)

    monkeypatch.setattr(MemoryWriter, "_save_snapshot", slow_save)
    _delay_send(monkeypatch, "in line", 0.6)
    desk = desk_of(rt)
    inbox = writer_of(rt).actor_inbox
    assert isinstance(inbox, CountingInbox)
    outcomes: dict[str, Any] = {}
    first = _remembering(rt, outcomes, "first")
    first.start()
    assert held.entered.wait(WAIT)
    in_line = _remembering(rt, outcomes, "in line")
    in_line.start()
    wait_for(lambda: len(desk._line) == 2, WAIT)
    before = inbox.puts
    closing = threading.Thread(target=rt.close, daemon=True)
    closing.start()
    wait_for(lambda: inbox.puts > before, WAIT)  # the close's snapshot, queued
    held.release.set()
    for thread in (first, in_line, closing):
        thread.join(WAIT + 30)
    assert not closing.is_alive()
    assert not isinstance(outcomes["in line"], BaseException), repr(outcomes["in line"])
    with journaled.open(url, follow=None) as again:
        assert sorted(f.text for f in again.memory.all()) == ["first", "in line"]


def test_an_interrupt_right_after_joining_the_line_does_not_leave_a_seat_in_it(
    rt: journaled.Runtime, sigusr1_raises: None
) -> None:
    """ADR 0055 ("a caller interrupted while waiting leaves the line"): ``WriterDesk.remember``
    appends the seat under the mutex and only then enters the ``try`` whose ``finally`` takes it
    out again. An interrupt that lands in between (CPython runs a pending signal handler at the
    next call after ``deque.append``; the test widens that window with a sleep inside the
    append) leaves the seat in line with nobody behind it: at the front, it never leads and
    never leaves, and every later remember waits for ever."""
    desk = desk_of(rt)

    class WideWindow(deque):  # type: ignore[type-arg]
        def append(self, seat: Any) -> None:
            super().append(seat)
            if threading.current_thread() is threading.main_thread():
                time.sleep(1.0)  # the signal lands here, right after the seat is in line

    desk._line = WideWindow(desk._line)
    main = threading.main_thread().ident
    assert main is not None
    threading.Timer(0.2, signal.pthread_kill, args=(main, signal.SIGUSR1)).start()
    with pytest.raises(Interrupt):
        rt.memory.remember("interrupted")
    outcomes: dict[str, Any] = {}
    later = _remembering(rt, outcomes, "later")
    later.start()
    later.join(WAIT)
    assert not later.is_alive(), "a remember after the interrupted one waits for ever"
    assert not desk._line
