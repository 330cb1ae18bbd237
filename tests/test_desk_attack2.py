"""Second attack on the writer's desk (ADR 0055, after ad242af): interrupts that land at the
edge of the bookkeeping that must run to its end, and many callers against a writer made busy
at random. Each test names the behaviour it expects."""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest
from in_place import (
    Interrupt,
    desk_of,
    interrupting_signal,  # noqa: F401  (the sigusr1_raises fixture)
    sqlite_rt,  # noqa: F401  (the rt fixture: a runtime on SQLite)
)
from test_group_commit import WAIT, HeldWriter

import journaled
from journaled.actors.desk import WriterDesk
from journaled.events.messages import Remember
from journaled.memory import Memory
from journaled.testing import wait_for


@pytest.fixture
def two_signals_raise() -> Iterator[None]:
    """SIGUSR1 and SIGUSR2 both raise Interrupt in the main thread (say Ctrl-C and a
    SIGTERM/SIGALRM handler that raises)."""
    assert threading.current_thread() is threading.main_thread()

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupt(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


class _TwoSignals:
    """Lands SIGUSR1 and SIGUSR2 on the main thread while it runs Python code, as two signals
    arriving close together do: a thread started beforehand sends both while the main thread
    spins in bytecode. CPython runs SIGUSR1's handler at the spin's next check, which raises;
    SIGUSR2's stays pending and runs at the next check after that (the next function call)."""

    def __init__(self) -> None:
        self.main = threading.get_ident()
        self.go: list[bool] = []
        self.sent: list[bool] = []
        threading.Thread(target=self._send_both, daemon=True).start()

    def _send_both(self) -> None:
        deadline = time.monotonic() + WAIT
        while not self.go and time.monotonic() < deadline:
            time.sleep(0.001)
        signal.pthread_kill(self.main, signal.SIGUSR1)
        signal.pthread_kill(self.main, signal.SIGUSR2)
        self.sent.append(True)

    def now(self) -> None:
        self.go.append(True)
        spins = 0
        while not self.sent:  # pure bytecode: the handlers run at the loop's checks
            spins += 1
            if spins > 10**9:
                raise AssertionError("the signals were not sent")


def _remembering(
    rt: journaled.Runtime, outcomes: dict[str, Any], text: str, **kw: Any
) -> threading.Thread:
    def run() -> None:
        try:
            outcomes[text] = rt.memory.remember(text, **kw)
        except BaseException as exc:
            outcomes[text] = exc

    return threading.Thread(target=run, daemon=True, name=f"remember {text}")


def test_two_interrupts_in_a_row_do_not_skip_the_leaders_bookkeeping(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch, two_signals_raise: None
) -> None:
    """ADR 0055 ("the line's bookkeeping ... runs to its end whatever interrupts it"): a leader
    interrupted while it sends its busy group must still answer its group and hand the lead on,
    even when a second interrupt follows the first at once. ``remember``'s ``finally`` reaches
    the protected retry loop only through a call of ``_to_the_end``: CPython runs the pending
    second handler at that call's entry, before its ``try``, so ``_finish`` never runs; the
    leader's seat stays at the front, taken, and every later remember waits for ever."""
    held = HeldWriter(monkeypatch)
    held.delays = {1: 0.5}  # the actor's own commit of "by message" keeps the writer busy
    real = Memory.request_remember
    signals = _TwoSignals()

    def request_remember(self: Memory, request: Remember) -> Any:
        if request.text == "leader" and threading.current_thread() is threading.main_thread():
            signals.now()
        return real(self, request)

    monkeypatch.setattr(Memory, "request_remember", request_remember)
    desk = desk_of(rt)
    outcomes: dict[str, Any] = {}
    first = _remembering(rt, outcomes, "first")
    first.start()
    assert held.entered.wait(WAIT)  # "first" stores in place, holding the writer
    _, by_message = rt.memory.request_remember(Remember(text="by message"))

    def release_when_queued() -> None:
        wait_for(lambda: len(desk._line) == 2, WAIT)  # the main thread waits behind "first"
        held.release.set()

    threading.Thread(target=release_when_queued, daemon=True).start()
    with pytest.raises(Interrupt):
        rt.memory.remember("leader")  # leads a group that finds the writer busy, and sends it
    first.join(WAIT)
    by_message.result(WAIT)
    later = _remembering(rt, outcomes, "later")
    later.start()
    later.join(WAIT)
    assert not later.is_alive(), f"a later remember waits for ever; line: {list(desk._line)}"


@pytest.mark.parametrize("pause", [0.002, 0.03])
def test_many_callers_against_a_writer_busy_at_random_store_each_remember_once_in_order(
    rt: journaled.Runtime, pause: float
) -> None:
    """M2, M3, ADR 0055: callers remembering at once (sync doors, an asyncio door, and a thread
    keeping the writer busy at random with snapshots, reads and remembers by message) must each
    get their fact, stored exactly once; a caller's later claim of its key supersedes its
    earlier one, the last claim is the key's current fact; nothing hangs."""
    import asyncio

    from journaled.aio import AsyncMemory, _Pool

    callers, each = 6, 30
    outcomes: dict[int, list[Any]] = {i: [] for i in range(callers)}
    stop = threading.Event()
    by_message: list[Any] = []
    errors: list[BaseException] = []

    def caller(i: int) -> None:
        rng = random.Random(i)
        for j in range(each):
            try:
                if j % 2:
                    fact = rt.memory.remember(f"c{i} r{j}", conflict_key=f"c{i}-k{j % 3}")
                else:
                    fact = rt.memory.remember(f"c{i} r{j}")
                outcomes[i].append(fact)
            except BaseException as exc:
                errors.append(exc)
                return
            if rng.random() < 0.2:
                time.sleep(rng.random() * 0.003)

    def aio_caller() -> None:
        async def run() -> None:
            pool = _Pool(1, asyncio.get_running_loop())  # remember checks the loop, runs no job
            memory = AsyncMemory(rt.memory, pool)
            try:
                for j in range(each):
                    key = "aio-k" if j % 2 else None
                    outcomes[callers].append(await memory.remember(f"aio r{j}", conflict_key=key))
            finally:
                pool.shutdown()

        try:
            asyncio.run(run())
        except BaseException as exc:
            errors.append(exc)

    def busy() -> None:
        rng = random.Random(99)
        n = 0
        while not stop.is_set():
            choice = rng.random()
            try:
                if choice < 0.3:
                    rt.memory.checkpoint()
                elif choice < 0.6:
                    rt._actors.catch_up()
                else:
                    by_message.append(rt.memory.request_remember(Remember(text=f"busy {n}"))[1])
                    n += 1
            except BaseException as exc:
                errors.append(exc)
                return
            time.sleep(rng.random() * pause)

    outcomes[callers] = []
    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(callers)]
    threads.append(threading.Thread(target=aio_caller, daemon=True))
    busy_thread = threading.Thread(target=busy, daemon=True)
    busy_thread.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stop.set()
    busy_thread.join(30)
    line = list(desk_of(rt)._line)
    assert not any(t.is_alive() for t in threads), f"a caller hangs; line: {line}"
    assert not busy_thread.is_alive()
    assert not errors, errors
    busy_facts = [f.result(WAIT).fact for f in by_message]
    texts = [f.text for f in rt.memory.all()]  # superseded facts included
    assert len(texts) == len(set(texts)), "a remember was stored twice"
    expected = {f.text for f in busy_facts}
    for facts in outcomes.values():
        assert len(facts) == each
        expected |= {f.text for f in facts}
        current: dict[str, Any] = {}
        for fact in facts:
            if fact.conflict_key is not None:
                earlier = current.get(fact.conflict_key)
                if earlier is not None:
                    found = rt.memory.get(earlier.id)
                    assert found is not None
                    assert found.superseded_by == fact.id, (earlier, fact)
                current[fact.conflict_key] = fact
        for fact in current.values():
            found = rt.memory.get(fact.id)
            assert found is not None
            assert found.superseded_by is None, fact
    assert set(texts) == expected


def _busy_group_led_by_main(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch, followers: list[str], send: Any
) -> tuple[dict[str, Any], list[threading.Thread], Any]:
    """Hold the writer in place with "first"; queue the main thread ("leader") and then
    ``followers`` behind it; make the writer busy with a remember by message; release. The main
    thread then leads [leader, *followers] and sends them to the actor through ``send``."""
    held = HeldWriter(monkeypatch)
    held.delays = {1: 0.5}
    real = Memory.request_remember
    monkeypatch.setattr(Memory, "request_remember", lambda self, request: send(real, self, request))
    desk = desk_of(rt)
    outcomes: dict[str, Any] = {}
    first = _remembering(rt, outcomes, "first")
    first.start()
    assert held.entered.wait(WAIT)
    _, by_message = real(rt.memory, Remember(text="by message"))
    threads = [_remembering(rt, outcomes, text) for text in followers]

    def queue_then_release() -> None:
        wait_for(lambda: len(desk._line) == 2, WAIT)
        for n, t in enumerate(threads):
            t.start()
            wait_for(lambda n=n: len(desk._line) == 3 + n, WAIT)  # type: ignore[misc]
        held.release.set()

    threading.Thread(target=queue_then_release, daemon=True).start()
    return outcomes, [first, *threads], by_message


def test_a_leader_interrupted_midway_through_sending_its_busy_group(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch, sigusr1_raises: None
) -> None:
    """ADR 0055: a leader interrupted while it sends its busy group: the followers it sent
    get their facts (stored once), the ones it did not send get RememberInterrupted and are
    not stored, the line moves on."""

    def send(real: Any, self: Memory, request: Remember) -> Any:
        if request.text == "f2" and threading.current_thread() is threading.main_thread():
            signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
        return real(self, request)

    outcomes, threads, by_message = _busy_group_led_by_main(
        rt, monkeypatch, ["f1", "f2", "f3"], send
    )
    with pytest.raises(Interrupt):
        rt.memory.remember("leader")
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()
    by_message.result(WAIT)
    assert not isinstance(outcomes["f1"], BaseException), outcomes["f1"]
    assert isinstance(outcomes["f2"], journaled.RememberInterrupted), outcomes["f2"]
    assert isinstance(outcomes["f3"], journaled.RememberInterrupted), outcomes["f3"]
    later = _remembering(rt, outcomes, "later")
    later.start()
    later.join(WAIT)
    assert not later.is_alive()
    texts = sorted(f.text for f in rt.memory.all())
    assert texts == sorted(["first", "by message", "leader", "f1", "later"])


def test_a_busy_group_whose_send_fails_for_one_seat_still_sends_the_others(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0055: a send that fails for one remember of a busy group (the actor refuses it)
    fails that caller with the send's error; the others of the group are stored, in order."""
    from journaled.actors.errors import RuntimeClosed

    def send(real: Any, self: Memory, request: Remember) -> Any:
        if request.text == "f2":
            raise RuntimeClosed("closed")
        return real(self, request)

    outcomes, threads, by_message = _busy_group_led_by_main(
        rt, monkeypatch, ["f1", "f2", "f3"], send
    )
    rt.memory.remember("leader")
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()
    by_message.result(WAIT)
    assert isinstance(outcomes["f2"], RuntimeClosed), outcomes["f2"]
    texts = sorted(f.text for f in rt.memory.all())
    assert texts == sorted(["first", "by message", "leader", "f1", "f3"])


def _rescue_after(desk: WriterDesk, seconds: float, wedged: list[bool]) -> threading.Thread:
    """After ``seconds``, if the line still holds seats, note it and answer every seat with an
    error so that a wedged test ends (only a test harness does this)."""

    def rescue() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if wedged and wedged[0] is False:
                return
            time.sleep(0.05)
        with desk._mutex:
            seats = list(desk._line)
        if seats:
            wedged.append(True)
            for s in seats:
                s.error = RuntimeError("rescued by the test")
                s.done = True
                s.turn.set()

    t = threading.Thread(target=rescue, daemon=True)
    t.start()
    return t


def test_a_signal_handler_that_remembers_while_the_main_thread_waits_in_line(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0055 / ADR 0054: a remember made from a signal handler (a SIGTERM handler noting
    "shutting down") while the main thread itself waits in the desk's line must not wait for
    ever. Its seat stands behind the main thread's own, whose caller is the handler's frame:
    the main thread's seat can never lead, so neither can the handler's, and followers wait
    without a timeout. Before the desk the same remember went to the actor and waited for its
    reply (bounded by ASK_TIMEOUT)."""
    held = HeldWriter(monkeypatch)
    desk = desk_of(rt)
    outcomes: dict[str, Any] = {}
    handled: list[Any] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        try:
            handled.append(rt.memory.remember("from the handler"))
        except BaseException as exc:
            handled.append(exc)

    previous = signal.signal(signal.SIGUSR1, handler)
    wedged: list[bool] = []
    try:
        first = _remembering(rt, outcomes, "first")
        first.start()
        assert held.entered.wait(WAIT)
        main = threading.get_ident()

        def orchestrate() -> None:
            wait_for(lambda: len(desk._line) == 2, WAIT)  # main waits behind "first"
            signal.pthread_kill(main, signal.SIGUSR1)
            # the handler's seat, behind main's (or its remember, sent to the actor)
            with contextlib.suppress(TimeoutError):
                wait_for(lambda: len(desk._line) == 3, 1.0)
            held.release.set()

        threading.Thread(target=orchestrate, daemon=True).start()
        _rescue_after(desk, WAIT, wedged)
        try:
            outcomes["main"] = rt.memory.remember("main")
        except BaseException as exc:
            outcomes["main"] = exc
        wedged.append(False)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    first.join(WAIT)
    assert wedged[0] is False, f"the main thread and its handler wait for ever: {handled}"
    assert not isinstance(handled[0], BaseException), handled
