"""Attacks on a leader that gathers the last group's callers before taking its group (ADR 0059).

Most probes drive the desk with a stand-in writer (its store takes a fixed time, and it records
every remember it stores), so what is checked is the desk: every remember stored exactly once and
answered, no wait longer than its bound, no hang when a caller is interrupted, the desk closes or
the writer turns busy. The last probes go through a runtime on SQLite.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import pytest
from in_place import Interrupt, desk_of, writer_of
from test_desk_gather import TimedWriter as Writer

import journaled
from journaled.actors import desk as desk_module
from journaled.actors.desk import Sent, WriterDesk
from journaled.actors.directory import CountingInbox
from journaled.actors.scope import UNSETTLED
from journaled.events.memory import Fact
from journaled.events.messages import Remember
from journaled.testing import wait_for

WAIT = 30.0


def _never_sent(message: Remember) -> object:
    raise AssertionError("the stand-in writer is never busy here")


def _run(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert not any(t.is_alive() for t in threads), "a caller hangs"


def _burst(desk: WriterDesk, callers: int) -> None:
    """Let ``callers`` remember once each, at once, so that the last group is several."""
    barrier = threading.Barrier(callers)

    def one(k: int) -> None:
        barrier.wait(WAIT)
        assert isinstance(desk.remember(Remember(text=f"burst {k}"), _never_sent), Fact)

    _run([threading.Thread(target=one, args=(k,)) for k in range(callers)])


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> Callable[[WriterDesk], list[float]]:
    """Return a function that spies on a desk's gathering waits and lists their bounds."""

    def spy_on(desk: WriterDesk) -> list[float]:
        bounds: list[float] = []
        real = desk._grown.wait_for

        def spy(predicate: Callable[[], bool], timeout: float | None = None) -> bool:
            assert timeout is not None
            bounds.append(timeout)
            return real(predicate, timeout)

        monkeypatch.setattr(desk._grown, "wait_for", spy)
        return bounds

    return spy_on


@pytest.fixture
def sigusr1() -> Iterator[Callable[[Callable[[], None], float], None]]:
    """Yield ``arm(action, delay)``: after ``delay`` s, SIGUSR1 runs ``action`` on the main
    thread."""
    assert threading.current_thread() is threading.main_thread()
    actions: list[Callable[[], None]] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        actions.pop(0)()

    previous = signal.signal(signal.SIGUSR1, handler)
    timers: list[threading.Timer] = []
    main = threading.main_thread().ident
    assert main is not None

    def arm(action: Callable[[], None], delay: float) -> None:
        actions.append(action)
        timer = threading.Timer(delay, signal.pthread_kill, args=(main, signal.SIGUSR1))
        timer.start()
        timers.append(timer)

    try:
        yield arm
    finally:
        for timer in timers:
            timer.cancel()
        signal.signal(signal.SIGUSR1, previous)


def _interrupt() -> None:
    raise Interrupt


# -- exactly once ---------------------------------------------------------------------------------


@pytest.mark.parametrize("keys", [False, True], ids=["keyless", "conflict-keys"])
def test_uneven_callers_each_stored_exactly_once_and_answered(
    monkeypatch: pytest.MonkeyPatch, keys: bool
) -> None:
    """Eight callers, one of them slow (it pauses between remembers), some claiming conflict
    keys: every remember is stored once, answered with its own fact, and no group holds two
    claims of one key."""
    monkeypatch.setattr(desk_module, "GATHER_MAX", 0.05)  # gathering matters, at this pace
    writer = Writer(took=0.003)
    desk = WriterDesk()
    desk.writer = writer
    callers, each = 8, 30
    errors: list[BaseException] = []
    answered: list[str] = []
    lock = threading.Lock()

    def caller(k: int) -> None:
        try:
            for i in range(each):
                if k == 0:
                    time.sleep(0.01)  # the slow one
                key = f"key{i % 3}" if keys and k % 2 else None
                text = f"caller {k} fact {i}"
                fact = desk.remember(Remember(text=text, conflict_key=key), _never_sent)
                assert isinstance(fact, Fact)
                assert fact.text == text
                with lock:
                    answered.append(text)
        except BaseException as exc:  # reported below
            errors.append(exc)

    _run([threading.Thread(target=caller, args=(k,)) for k in range(callers)])
    assert errors == []
    stored = writer.stored()
    assert sorted(stored) == sorted(answered)
    assert len(stored) == len(set(stored)) == callers * each
    for group in writer.groups:
        claimed = [m.conflict_key for m in group if m.conflict_key is not None]
        assert len(claimed) == len(set(claimed)), [m.text for m in group]
    assert not desk._line


# -- the bound ----------------------------------------------------------------------------------


def test_a_lone_caller_after_a_burst_waits_at_most_the_bound_once(
    waits: Callable[[WriterDesk], list[float]],
) -> None:
    """After a group of four whose store took 50 ms, a lone caller waits at most GATHER_MAX
    (2 ms), once: the caller after it does not wait at all."""
    writer = Writer(took=0.05)
    desk = WriterDesk()
    desk.writer = writer
    _burst(desk, 4)
    assert len(writer.groups[-1]) >= 2, [len(g) for g in writer.groups]
    bounds = waits(desk)
    start = time.monotonic()
    assert isinstance(desk.remember(Remember(text="alone"), _never_sent), Fact)
    first = time.monotonic() - start - writer.took
    assert bounds == [desk_module.GATHER_MAX]
    assert first < desk_module.GATHER_MAX + 0.1, first
    start = time.monotonic()
    assert isinstance(desk.remember(Remember(text="alone again"), _never_sent), Fact)
    assert bounds == [desk_module.GATHER_MAX]  # no second wait: the last group was one
    assert time.monotonic() - start - writer.took < 0.1


def test_a_fast_store_bounds_the_wait_by_twice_its_time(
    waits: Callable[[WriterDesk], list[float]],
) -> None:
    """A group that took almost nothing to store bounds the next leader's wait by twice that."""
    writer = Writer(took=0.0)
    desk = WriterDesk()
    desk.writer = writer
    _burst(desk, 4)
    # As after a group of four that took half a millisecond, whatever this burst grouped.
    desk._last_group, desk._last_took = 4, 0.0005
    took = desk._last_took
    bounds = waits(desk)
    assert isinstance(desk.remember(Remember(text="alone"), _never_sent), Fact)
    assert bounds == [min(desk_module.GATHER_MAX, desk_module.GATHER_FACTOR * took)]


# -- interrupts ---------------------------------------------------------------------------------


def _gathering_leader_setup(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Writer, WriterDesk]:
    monkeypatch.setattr(desk_module, "GATHER_MAX", 60.0)
    monkeypatch.setattr(desk_module, "GATHER_FACTOR", 10_000.0)
    writer = Writer(took=0.02)
    desk = WriterDesk()
    desk.writer = writer
    _burst(desk, 3)
    assert len(writer.groups[-1]) >= 2, [len(g) for g in writer.groups]
    desk._last_group = 10  # as after a group of ten: the next leader waits for ten
    return writer, desk


def test_a_leader_interrupted_while_it_gathers_hands_the_lead_on(
    monkeypatch: pytest.MonkeyPatch, sigusr1: Callable[[Callable[[], None], float], None]
) -> None:
    """The main thread leads and waits for the last group's callers; one comes and waits behind
    it; a signal interrupts the leader: its remember is never stored, the caller behind leads and
    is stored, promptly, and the line is empty."""
    writer, desk = _gathering_leader_setup(monkeypatch)
    before = len(writer.stored())
    outcome: list[object] = []

    def behind() -> None:
        wait_for(lambda: len(desk._line) == 1, WAIT)  # the main thread leads, gathering
        thread = threading.Thread(
            target=lambda: outcome.append(desk.remember(Remember(text="behind"), _never_sent))
        )
        thread.start()
        wait_for(lambda: len(desk._line) == 2, WAIT)
        # the next leader gathers as usual (2 ms at most); the main thread still waits 60 s
        monkeypatch.setattr(desk_module, "GATHER_MAX", 0.002)
        sigusr1(_interrupt, 0.0)
        thread.join(WAIT)

    helper = threading.Thread(target=behind)
    helper.start()
    start = time.monotonic()
    with pytest.raises(Interrupt):
        desk.remember(Remember(text="interrupted leader"), _never_sent)
    helper.join(WAIT)
    assert not helper.is_alive()
    # the caller behind gathers too (the last group was ten), for 2 ms: nobody waits 60 s
    assert time.monotonic() - start < 10
    assert len(outcome) == 1
    assert isinstance(outcome[0], Fact)
    assert outcome[0].text == "behind"
    assert writer.stored()[before:] == ["behind"]
    assert not desk._line


def test_a_caller_interrupted_behind_a_gathering_leader_leaves_the_line(
    monkeypatch: pytest.MonkeyPatch, sigusr1: Callable[[Callable[[], None], float], None]
) -> None:
    """A leader (another thread) gathers; the main thread lines up behind it and is interrupted:
    it steps out, and the leader, once the desk closes, stores only its own remember."""
    writer, desk = _gathering_leader_setup(monkeypatch)
    before = len(writer.stored())
    outcome: list[object] = []
    leader = threading.Thread(
        target=lambda: outcome.append(desk.remember(Remember(text="leader"), _never_sent))
    )
    leader.start()
    wait_for(lambda: len(desk._line) == 1, WAIT)
    sigusr1(_interrupt, 0.2)
    with pytest.raises(Interrupt):
        desk.remember(Remember(text="interrupted follower"), _never_sent)
    assert len(desk._line) == 1  # the leader still gathers
    assert desk.close(WAIT)
    leader.join(WAIT)
    assert not leader.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], Fact)
    assert writer.stored()[before:] == ["leader"]


def test_a_signal_handler_that_remembers_while_its_thread_gathers_is_sent_to_the_actor(
    monkeypatch: pytest.MonkeyPatch, sigusr1: Callable[[Callable[[], None], float], None]
) -> None:
    """The main thread gathers as leader; a signal handler on it remembers: the desk does not
    deadlock on its own lock, answers UNSETTLED (the actor stores it), and the leader goes on."""
    monkeypatch.setattr(desk_module, "GATHER_MAX", 0.5)
    monkeypatch.setattr(desk_module, "GATHER_FACTOR", 10_000.0)
    writer = Writer(took=0.02)
    desk = WriterDesk()
    desk.writer = writer
    _burst(desk, 3)
    assert len(writer.groups[-1]) >= 2
    inner: list[object] = []
    sigusr1(lambda: inner.append(desk.remember(Remember(text="handler"), _never_sent)), 0.1)
    fact = desk.remember(Remember(text="leader"), _never_sent)
    assert isinstance(fact, Fact)
    assert inner == [UNSETTLED]
    assert "handler" not in writer.stored()
    assert not desk._line


# -- the writer turns busy, the desk closes -------------------------------------------------------


def test_a_group_gathered_while_the_writer_turns_busy_is_sent_in_line_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The leader gathers, the writer turns busy meanwhile: the whole group is sent to the actor,
    each remember once, in line order, and each caller gets its own handle."""
    writer, desk = _gathering_leader_setup(monkeypatch)
    monkeypatch.setattr(desk_module, "GATHER_MAX", 0.5)
    sent: list[str] = []
    lock = threading.Lock()

    def send(message: Remember) -> str:
        with lock:
            sent.append(message.text)
        return f"handle of {message.text}"

    outcomes: dict[str, object] = {}

    def caller(text: str) -> None:
        outcomes[text] = desk.remember(Remember(text=text), send)

    first = threading.Thread(target=caller, args=("a",))
    first.start()
    wait_for(lambda: len(desk._line) == 1, WAIT)
    second = threading.Thread(target=caller, args=("b",))
    second.start()
    wait_for(lambda: len(desk._line) == 2, WAIT)
    writer.busy.set()  # while the leader still waits for the third
    third = threading.Thread(target=caller, args=("c",))
    third.start()
    for thread in (first, second, third):
        thread.join(WAIT)
    assert sent == ["a", "b", "c"]
    for text in "abc":
        outcome = outcomes[text]
        assert isinstance(outcome, Sent)
        assert outcome.handle == f"handle of {text}"
    assert not desk._line


def test_close_while_a_leader_gathers_stores_every_caller_in_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A leader gathers with one caller behind it; the desk closes: the wait ends, both are
    stored once, the close sees the line empty, and a remember after it is the actor's."""
    writer, desk = _gathering_leader_setup(monkeypatch)
    before = len(writer.stored())
    outcomes: list[object] = []
    threads = [
        threading.Thread(
            target=lambda t=t: outcomes.append(desk.remember(Remember(text=t), _never_sent))
        )
        for t in ("one", "two")
    ]
    threads[0].start()
    wait_for(lambda: len(desk._line) == 1, WAIT)
    threads[1].start()
    wait_for(lambda: len(desk._line) == 2, WAIT)
    start = time.monotonic()
    assert desk.close(WAIT)
    for thread in threads:
        thread.join(WAIT)
    assert time.monotonic() - start < 10
    assert sorted(writer.stored()[before:]) == ["one", "two"]
    assert all(isinstance(o, Fact) for o in outcomes)
    assert desk.remember(Remember(text="late"), _never_sent) is UNSETTLED


# -- through a runtime --------------------------------------------------------------------------


def test_a_runtime_with_uneven_callers_stores_each_remember_once(sqlite_url: str) -> None:
    """J2, M3: eight threads, one slow, some claiming conflict keys, remember through a runtime
    on SQLite: each caller gets its own fact, every fact is stored once, each key has one live
    fact in the end, and a reopen finds the same."""
    url = f"{sqlite_url}?durability=full"
    callers, each = 8, 15
    answers: dict[str, str] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    with journaled.open(url, follow=None) as rt:

        def caller(k: int) -> None:
            try:
                for i in range(each):
                    if k == 0:
                        time.sleep(0.005)
                    key = f"key{k}" if k % 2 else None
                    text = f"caller {k} fact {i}"
                    fact = rt.memory.remember(text, conflict_key=key)
                    assert fact.text == text
                    with lock:
                        answers[fact.id] = text
            except BaseException as exc:  # reported below
                errors.append(exc)

        _run([threading.Thread(target=caller, args=(k,)) for k in range(callers)])
        assert errors == []
        assert len(answers) == callers * each
        every = {f.id: f.text for f in rt.memory.all() if f.superseded_by is None}
        # keyless facts are all live; of each key's 15 claims only the last is
        keyless = {i: t for i, t in answers.items() if int(t.split()[1]) % 2 == 0}
        assert keyless.items() <= every.items()
        for k in range(1, callers, 2):
            live = [t for t in every.values() if t.startswith(f"caller {k} ")]
            assert live == [f"caller {k} fact {each - 1}"], live
        assert not desk_of(rt)._line
        live_now = every
    with journaled.open(url, follow=None) as again:
        assert {f.id: f.text for f in again.memory.all() if f.superseded_by is None} == live_now
        for fact_id, text in answers.items():
            got = again.memory.get(fact_id)
            assert got is not None
            assert got.text == text


def test_a_lone_remember_after_a_burst_through_a_runtime_is_prompt(sqlite_url: str) -> None:
    """After a burst through a runtime, a lone remember is stored without waiting for callers
    that never come (at most 2 ms of gathering; generous margin for a loaded machine)."""
    with journaled.open(sqlite_url, follow=None) as rt:
        barrier = threading.Barrier(6)

        def one(k: int) -> None:
            barrier.wait(WAIT)
            rt.memory.remember(f"burst {k}")

        _run([threading.Thread(target=one, args=(k,)) for k in range(6)])
        rt.memory.remember("warm")  # one lone remember, to measure a store alone
        start = time.monotonic()
        rt.memory.remember("alone")
        alone = time.monotonic() - start
        _run([threading.Thread(target=one, args=(k,)) for k in range(6)])
        start = time.monotonic()
        rt.memory.remember("after the burst")
        after = time.monotonic() - start
        assert after < alone + desk_module.GATHER_MAX + 0.25, (after, alone)
        assert len(rt.memory.all()) == 15


def test_after_a_burst_a_busy_writer_gets_the_gathered_group_by_its_inbox(
    sqlite_url: str,
) -> None:
    """ADR 0055, 0059: after a burst, the writer actor turns busy (it handles a message): the next
    leader gathers, finds it busy, and sends its group to the actor: each remember is stored once,
    each caller answered, by the actor path."""
    with journaled.open(sqlite_url, follow=None) as rt:
        barrier = threading.Barrier(4)

        def one(text: str) -> None:
            barrier.wait(WAIT)
            assert rt.memory.remember(text).text == text

        _run([threading.Thread(target=one, args=(f"burst {k}",)) for k in range(4)])
        writer = writer_of(rt)
        inbox = writer.actor_inbox
        assert isinstance(inbox, CountingInbox)
        before = inbox.puts
        outcomes: list[Any] = []
        with writer.command_lock:  # as while the actor handles a message
            threads = [
                threading.Thread(target=lambda k=k: outcomes.append(rt.memory.remember(f"f{k}")))
                for k in range(3)
            ]
            for thread in threads:
                thread.start()
            wait_for(lambda: inbox.puts == before + 3, WAIT)
            assert outcomes == []
        for thread in threads:
            thread.join(WAIT)
        assert sorted(f.text for f in outcomes) == ["f0", "f1", "f2"]
        texts = sorted(f.text for f in rt.memory.all())
        assert texts == sorted([*(f"burst {k}" for k in range(4)), "f0", "f1", "f2"])
        assert not desk_of(rt)._line
