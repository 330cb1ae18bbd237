"""Remembers that wait in line at the writer's desk are stored by the caller at its front, in
groups, on its own thread (ADR 0055; J2, M2, M3).

The tests hold the first remember inside its append (``HeldWriter``), let the other callers line
up behind it, then release it, so what the line did is decided by the desk, not by the timing
of the threads. Interrupts are real signals delivered to the main thread while it waits.
"""

from __future__ import annotations

import functools
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from in_place import (
    Interrupt,
    desk_of,
    sqlite_rt,  # noqa: F401  (the rt fixture: a runtime on SQLite)
    writer_of,
)
from test_group_commit import WAIT, HeldWriter, queue_behind_first

import journaled
from journaled.actors.directory import CountingInbox
from journaled.actors.errors import RememberInterrupted
from journaled.events.journal import Journal
from journaled.testing import wait_for


def test_many_callers_at_once_store_every_remember_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """J2: eight threads remembering at once at durability=full each get their own fact, every
    fact is stored once (and found again after a reopen), and commits carry several remembers."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}?durability=full"
    per_caller, callers = 40, 8
    answers: dict[str, str] = {}
    errors: list[BaseException] = []
    with journaled.open(url, follow=None) as rt:
        held = HeldWriter(monkeypatch)  # counts the appends, holds none
        held.release.set()

        def remember(k: int) -> None:
            try:
                for i in range(per_caller):
                    text = f"caller {k} fact {i}"
                    fact = rt.memory.remember(text)
                    assert fact.text == text
                    answers[fact.id] = text
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=remember, args=(k,)) for k in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors
        assert len(answers) == per_caller * callers
        assert {f.id: f.text for f in rt.memory.all()} == answers
        assert not desk_of(rt)._line
    with journaled.open(url, follow=None) as again:
        assert {f.id: f.text for f in again.memory.all()} == answers
    assert sum(held.appends) == per_caller * callers  # one event a keyless remember
    assert len(held.appends) < per_caller * callers  # some commits carried several


def test_two_claims_of_one_key_in_line_are_stored_one_after_the_other(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """M3: a second claim of a conflict key waiting in the same line is not decided in the same
    group as the first: it is stored after it and supersedes it."""
    held = HeldWriter(monkeypatch)
    calls = [
        functools.partial(rt.memory.remember, "first"),
        functools.partial(rt.memory.remember, "port is 80", conflict_key="port"),
        functools.partial(rt.memory.remember, "other"),
        functools.partial(rt.memory.remember, "port is 81", conflict_key="port"),
        functools.partial(rt.memory.remember, "last"),
    ]
    facts = queue_behind_first(rt, held, calls)
    # Events per append: the second claim starts the next group. "port is 80" and "other" are
    # three events (fact, claim; fact); "port is 81" and "last" four (fact, claim, supersession;
    # fact).
    assert held.appends == [1, 3, 4]
    old, new = facts[1], facts[3]
    assert rt.memory.get(old.id).superseded_by == new.id  # type: ignore[union-attr]
    assert [f.text for f in rt.memory.search("port")] == ["port is 81"]


def test_a_key_that_is_no_string_in_line_fails_alone(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """M2: a conflict key that cannot even be hashed fails its own caller with InvalidFact; the
    line goes on and the rest of its group is stored."""
    held = HeldWriter(monkeypatch)
    calls = [
        functools.partial(rt.memory.remember, "first"),
        functools.partial(rt.memory.remember, "a"),
        functools.partial(rt.memory.remember, "bad", conflict_key=["port"]),  # type: ignore[arg-type]
        functools.partial(rt.memory.remember, "b"),
    ]
    outcomes = queue_behind_first(rt, held, calls)
    assert isinstance(outcomes[2], journaled.InvalidFact)
    assert held.appends == [1, 2]
    assert sorted(f.text for f in rt.memory.all()) == ["a", "b", "first"]
    assert rt.memory.remember("after").text == "after"


def test_a_line_that_finds_the_writer_busy_is_sent_to_it_and_stored(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0055: when the writer actor has a message in hand, the group at the front of the line
    is not stored beside it: each caller sends its remember to the actor, which stores them."""
    writer = writer_of(rt)
    inbox = writer.actor_inbox
    assert isinstance(inbox, CountingInbox)
    before = inbox.puts
    outcomes: list[Any] = []
    with writer.command_lock:  # as while the actor handles a message
        threads = [
            threading.Thread(target=lambda i=i: outcomes.append(rt.memory.remember(f"f{i}")))
            for i in range(3)
        ]
        for thread in threads:
            thread.start()
        wait_for(lambda: inbox.puts == before + 3, WAIT)  # all three sent to the actor
        assert not outcomes
        assert not desk_of(rt)._line
    for thread in threads:
        thread.join(WAIT)
    assert sorted(f.text for f in outcomes) == ["f0", "f1", "f2"]
    assert sorted(f.text for f in rt.memory.all()) == ["f0", "f1", "f2"]


@pytest.fixture
def interrupt_main_after() -> Iterator[Any]:
    """Yield a function that delivers SIGUSR1 to the main thread after ``delay`` seconds; its
    handler raises :class:`Interrupt` there, wherever it waits."""
    assert threading.current_thread() is threading.main_thread()

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupt

    previous = signal.signal(signal.SIGUSR1, handler)
    timers: list[threading.Timer] = []

    def arm(delay: float) -> None:
        main = threading.main_thread().ident
        assert main is not None
        timer = threading.Timer(delay, signal.pthread_kill, args=(main, signal.SIGUSR1))
        timer.start()
        timers.append(timer)

    try:
        yield arm
    finally:
        for timer in timers:
            timer.cancel()
        signal.signal(signal.SIGUSR1, previous)


def test_a_caller_interrupted_while_waiting_in_line_leaves_it_and_stores_nothing(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch, interrupt_main_after: Any
) -> None:
    """ADR 0055: a caller interrupted while it waits behind another's commit leaves the line (its
    remember is never stored), and the caller behind it still gets its turn."""
    held = HeldWriter(monkeypatch)
    desk = desk_of(rt)
    outcomes: dict[str, Any] = {}

    def remember(text: str) -> None:
        outcomes[text] = rt.memory.remember(text)

    first = threading.Thread(target=remember, args=("first",))
    first.start()
    assert held.entered.wait(WAIT)
    behind = threading.Thread(target=remember, args=("behind",))

    def queue_behind() -> None:
        wait_for(lambda: len(desk._line) == 2, WAIT)  # the first and the main thread
        behind.start()
        wait_for(lambda: len(desk._line) == 3, WAIT)
        interrupt_main_after(0.0)

    threading.Thread(target=queue_behind).start()
    with pytest.raises(Interrupt):
        rt.memory.remember("interrupted")  # waits in line, on the main thread
    assert len(desk._line) == 2
    held.release.set()
    first.join(WAIT)
    behind.join(WAIT)
    assert sorted(outcomes) == ["behind", "first"]
    assert sorted(f.text for f in rt.memory.all()) == ["behind", "first"]
    assert not desk._line


def test_a_leader_interrupted_in_its_commit_tells_the_others_their_outcome_is_unknown(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0055: if the caller storing a group is interrupted inside it, each other caller of the
    group gets RememberInterrupted (never a hang, never a silent success), and the desk and the
    writer serve the next remember."""
    held = HeldWriter(monkeypatch)
    outcomes: dict[str, Any] = {}
    raised: list[BaseException] = []

    def remember(text: str) -> None:
        try:
            outcomes[text] = rt.memory.remember(text)
        except BaseException as exc:
            raised.append(exc)
            outcomes[text] = exc

    first = threading.Thread(target=remember, args=("first",))
    first.start()
    assert held.entered.wait(WAIT)
    desk = desk_of(rt)
    names = ["leader", "follower 1", "follower 2"]
    threads = [threading.Thread(target=remember, args=(name,)) for name in names]
    for k, thread in enumerate(threads):
        thread.start()
        wait_for(lambda k=k: len(desk._line) == 2 + k, WAIT)  # type: ignore[misc]
    held_append = Journal.append

    def append(journal: Journal, events: Any, **kwargs: Any) -> list[int]:
        if b"leader" in kwargs.get("payloads", {}).values():
            raise Interrupt  # inside the group's append, on the leader's thread
        return held_append(journal, events, **kwargs)

    monkeypatch.setattr(Journal, "append", append)
    held.release.set()
    for thread in [first, *threads]:
        thread.join(WAIT)
    assert isinstance(outcomes["leader"], Interrupt)
    assert isinstance(outcomes["follower 1"], RememberInterrupted)
    assert isinstance(outcomes["follower 2"], RememberInterrupted)
    assert "outcome is unknown" in str(outcomes["follower 1"])
    assert not desk._line
    assert rt.memory.remember("next").text == "next"
    assert sorted(f.text for f in rt.memory.all()) == ["first", "next"]


def test_a_remember_after_close_is_refused_not_lost(tmp_path: Path) -> None:
    """R3: once memory is closing, the desk sends remembers to the actor, which refuses them
    with RuntimeClosed once stopped; nothing waits in line for ever."""
    rt = journaled.open(f"sqlite:///{tmp_path / 'journal.sqlite'}", follow=None)
    rt.memory.remember("before")
    rt.close()
    started = time.monotonic()
    with pytest.raises(journaled.RuntimeClosed):
        rt.memory.remember("after")
    assert time.monotonic() - started < WAIT
    assert not desk_of(rt)._line


def test_closing_while_callers_keep_remembering_ends_promptly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R3: a close waits only for the remembers already in line: callers that keep remembering
    are sent to the actor from then on (answered RuntimeClosed once it stops), so the line
    empties and the close returns, and every remember answered with a fact is stored."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    held = HeldWriter(monkeypatch)
    held.release.set()
    held.delays = dict.fromkeys(range(100000), 0.002)  # each commit takes a while: a line forms
    stored: list[str] = []
    ended: list[BaseException] = []
    rt = journaled.open(url, follow=None)

    def remember(k: int) -> None:
        i = 0
        try:
            while True:
                stored.append(rt.memory.remember(f"caller {k} fact {i}").text)
                i += 1
        except BaseException as exc:
            ended.append(exc)

    threads = [threading.Thread(target=remember, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(stored) >= 20, WAIT)
    started = time.monotonic()
    rt.close()
    took = time.monotonic() - started
    for thread in threads:
        thread.join(WAIT)
    assert took < 3.0, f"close took {took:.1f} s"
    assert len(ended) == 4
    assert all(isinstance(exc, journaled.RuntimeClosed) for exc in ended), ended
    with journaled.open(url, follow=None) as again:
        assert sorted(f.text for f in again.memory.all()) == sorted(stored)


def test_a_remember_that_comes_while_memory_closes_does_not_join_the_line(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R3, ADR 0055: once the close waits for the line, a new remember is sent to the actor
    instead of joining it, so the wait is bounded by what was in line when the close began;
    the actor, stopped after the line, stores it first."""
    held = HeldWriter(monkeypatch)
    desk = desk_of(rt)
    writer = writer_of(rt)
    inbox = writer.actor_inbox
    assert isinstance(inbox, CountingInbox)
    outcomes: list[Any] = []

    def remember(text: str) -> None:
        try:
            outcomes.append(rt.memory.remember(text).text)
        except BaseException as exc:
            outcomes.append(exc)

    first = threading.Thread(target=remember, args=("first",))
    first.start()
    assert held.entered.wait(WAIT)
    closing = threading.Thread(target=rt._actors.stop)
    closing.start()
    wait_for(lambda: desk._closed, WAIT)
    before = inbox.puts
    late = threading.Thread(target=remember, args=("late",))
    late.start()
    wait_for(lambda: inbox.puts > before, WAIT)  # sent to the actor, not in line
    assert len(desk._line) == 1
    held.release.set()
    for thread in (first, late, closing):
        thread.join(WAIT)
    assert sorted(map(str, outcomes)) == ["first", "late"]
