"""Third attack on reads and remembers in place (ADR 0053, ADR 0054): the live catch-up that
reads a tail outside the scopes' lock and folds it whole, and the long-tail path that marks
memory behind the journal while it folds.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from in_place import two_runtimes, writer_of

import journaled
from journaled.actors import memory as actors_memory
from journaled.actors.memory import MemoryWriter
from journaled.actors.scope import UNSETTLED
from journaled.events.memory import FactRemembered
from journaled.testing import ManualClock


def _live(rt: journaled.Runtime, key: str) -> list[str]:
    return sorted(
        f.text for f in rt.memory.all() if f.conflict_key == key and f.superseded_by is None
    )


def _shrink(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(actors_memory, "_WHOLE_TAIL", 3)
    monkeypatch.setattr(actors_memory, "_FOLD_BATCH", 2)


def _gate_long_fold(
    monkeypatch: pytest.MonkeyPatch, writer: MemoryWriter
) -> tuple[threading.Event, threading.Event]:
    """Hold the writer's long catch-up after its first batch is folded (memory marked behind)."""
    held, release = threading.Event(), threading.Event()
    real = MemoryWriter._fold_batch
    count = [0]

    def fold_batch(self: MemoryWriter, batch: Any, missing: Any, texts: Any = None) -> None:
        real(self, batch, missing, texts)
        if self is writer and self._stale and not held.is_set():
            count[0] += 1
            if count[0] == 1:
                held.set()
                release.wait(30)

    monkeypatch.setattr(MemoryWriter, "_fold_batch", fold_batch)
    return held, release


# -- readers during a long catch-up ---------------------------------------------------------------


def test_a_reader_during_a_long_catch_up_on_the_writer_reads_it_whole(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read made while a long catch-up (writer's thread, refresh) is half folded neither
    answers partial memory nor fails: it heals through the writer and reads it whole."""
    _shrink(monkeypatch)
    with two_runtimes(sqlite_url) as (here, other):
        tea = here.memory.remember("tea at five")
        for i in range(20):
            other.memory.remember(f"holder {i}", conflict_key="k")
        held, release = _gate_long_fold(monkeypatch, writer_of(here))
        refresher = threading.Thread(target=here.refresh)
        refresher.start()
        got: list[Any] = []
        try:
            assert held.wait(10)
            reader = threading.Thread(
                target=lambda: got.append([(f.text, f.superseded_by) for f in here.memory.all()])
            )
            reader.start()
            reader.join(0.3)  # it may only answer once the catch-up is whole
        finally:
            release.set()
            refresher.join(20)
        reader.join(20)
        assert len(got) == 1
        texts = sorted(t for t, _ in got[0])
        live = [t for t, by in got[0] if by is None and t.startswith("holder")]
        assert live == ["holder 19"], f"a reader saw a long catch-up half folded: {got[0]}"
        assert len(texts) == 21
        assert "tea at five" in texts
        assert here.memory.get(tea.id) is not None


def test_a_reader_during_a_long_catch_up_on_a_callers_thread_reads_it_whole(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The long catch-up run by a remember stored here (others appended before it) holds
    command_lock on the caller's thread; a reader meanwhile heals by asking the writer, which
    waits for that lock, and reads memory whole."""
    _shrink(monkeypatch)
    with two_runtimes(sqlite_url) as (here, other):
        here.memory.remember("tea at five")
        for i in range(20):
            other.memory.remember(f"coffee {i}")
        held, release = _gate_long_fold(monkeypatch, writer_of(here))
        mine: list[Any] = []
        rememberer = threading.Thread(target=lambda: mine.append(here.memory.remember("milk")))
        got: list[list[str]] = []
        rememberer.start()
        try:
            assert held.wait(10)
            reader = threading.Thread(
                target=lambda: got.append(sorted(f.text for f in here.memory.all()))
            )
            reader.start()
            reader.join(0.3)
        finally:
            release.set()
            rememberer.join(20)
        reader.join(20)
        assert len(mine) == 1
        assert len(got) == 1
        coffees = [t for t in got[0] if t.startswith("coffee")]
        assert len(coffees) == 20, f"a reader saw a long catch-up half folded: {got[0]}"
        assert sorted(f.text for f in here.memory.all()) == sorted(
            ["tea at five", "milk", *(f"coffee {i}" for i in range(20))]
        )


# -- failures and interrupts in the long path -----------------------------------------------------


def test_a_failure_in_the_long_paths_second_phase_leaves_memory_behind_then_heals(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal read failing while the long catch-up reads its rest lazily (after some of it is
    folded) leaves memory marked behind; the next read rebuilds it and reads it whole."""
    _shrink(monkeypatch)
    with two_runtimes(sqlite_url) as (here, other):
        here.memory.remember("tea at five")
        for i in range(20):
            other.memory.remember(f"holder {i}", conflict_key="k")
        writer = writer_of(here)
        real = MemoryWriter._texts
        fired: list[bool] = []

        def texts(self: MemoryWriter, events: Any) -> dict[str, str]:
            if self is writer and self._stale and not fired:  # the second phase, unheld
                fired.append(True)
                raise RuntimeError("database went away")
            return real(self, events)

        monkeypatch.setattr(MemoryWriter, "_texts", texts)
        with pytest.raises(RuntimeError):
            here.refresh()
        assert fired
        assert writer._stale
        assert all(shelf.stale for shelf in writer.shelves.values())
        assert _live(here, "k") == ["holder 19"]
        assert len(here.memory.all()) == 21
        assert not writer._stale
        folded = here.memory.all()
    with journaled.open(sqlite_url, follow=None) as fresh:
        assert fresh.memory.all() == folded


def test_an_interrupt_in_a_long_catch_up_on_the_callers_thread_leaves_no_fact_unseen(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C in the long catch-up that a remember stored here runs (after its append commits)
    leaves memory marked behind; the next read shows both the others' facts and this one."""
    _shrink(monkeypatch)
    with two_runtimes(sqlite_url) as (here, other):
        here.memory.remember("tea at five")
        for i in range(20):
            other.memory.remember(f"coffee {i}")
        writer = writer_of(here)
        real = MemoryWriter._fold_batch
        fired: list[bool] = []

        def fold_batch(self: MemoryWriter, batch: Any, missing: Any, texts: Any = None) -> None:
            if (
                self is writer
                and self._stale
                and texts is None  # the unheld rest of a long tail
                and threading.current_thread() is threading.main_thread()
                and not fired
            ):
                fired.append(True)
                raise KeyboardInterrupt
            real(self, batch, missing, texts)

        monkeypatch.setattr(MemoryWriter, "_fold_batch", fold_batch)
        with pytest.raises(KeyboardInterrupt):
            here.memory.remember("milk")
        assert fired
        assert writer._stale
        texts_now = sorted(f.text for f in here.memory.all())
        assert texts_now == sorted(["tea at five", "milk", *(f"coffee {i}" for i in range(20))])
        assert not writer._stale


def test_a_conflict_whose_catch_up_is_long_keeps_one_live_holder(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """commit_remembers' conflict path catches up through the long path, then decides again:
    the key ends with one live holder, this runtime's, in both runtimes and on reopen."""
    _shrink(monkeypatch)
    with two_runtimes(sqlite_url) as (here, other):
        here.memory.remember("port 80", conflict_key="port")
        other.refresh()
        for i in range(15):
            other.memory.remember(f"port {81 + i}", conflict_key="port")
        mine = here.memory.remember("port 99", conflict_key="port")
        assert _live(here, "port") == ["port 99"]
        assert not writer_of(here)._stale
        other.refresh()
        assert _live(other, "port") == ["port 99"]
        assert here.memory.get(mine.id) is not None
        folded = here.memory.all()
    with journaled.open(sqlite_url, follow=None) as fresh:
        assert fresh.memory.all() == folded


# -- a purge elsewhere between the live catch-up's read and its fold ------------------------------


def test_a_purge_elsewhere_between_the_read_and_the_fold_is_not_resurrected(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live catch-up read a fact's text; another process purges it before the fold. The
    text may show until the next catch-up, but a checkpoint folds the purge first, and neither
    this runtime nor a reopen from its snapshot ever holds the text afterwards (R2)."""
    with two_runtimes(sqlite_url) as (here, other):
        here.memory.remember("tea at five")
        secret = other.memory.remember("the secret is swordfish")
        writer = writer_of(here)
        real = MemoryWriter._texts
        read, release = threading.Event(), threading.Event()

        def texts(self: MemoryWriter, events: Any) -> dict[str, str]:
            found = real(self, events)
            if self is writer and secret.id in found and not read.is_set():
                read.set()
                release.wait(30)  # read, not yet folded
            return found

        monkeypatch.setattr(MemoryWriter, "_texts", texts)
        refresher = threading.Thread(target=here.refresh)
        refresher.start()
        try:
            assert read.wait(10)
            assert other.memory.purge(secret.id)
        finally:
            release.set()
            refresher.join(20)
        assert here.memory.checkpoint() in (True, False)
        assert all("swordfish" not in f.text for f in here.memory.all())
        assert here.memory.search("swordfish") == []
        assert here.memory.get(secret.id) is None
    with journaled.open(sqlite_url, follow=None) as fresh:
        assert all("swordfish" not in f.text for f in fresh.memory.all())
        assert fresh.memory.search("swordfish") == []


# -- two runtimes, one following, concurrent writers on shared keys --------------------------------


def test_two_runtimes_one_following_keep_one_live_holder_and_show_every_fact(
    sqlite_url: str,
) -> None:
    """Two runtimes on one SQLite file, one following every 0.05 s, writers in both claiming
    shared keys, readers in both checking at most one live holder per key; every fact a writer
    got back is visible in both runtimes eventually (after a refresh at the latest)."""
    keys = ["a", "b", "c"]
    with (
        journaled.open(sqlite_url, clock=ManualClock(start=1_700_000_000_000), follow=0.05) as left,
        journaled.open(
            sqlite_url, clock=ManualClock(start=1_700_000_000_000), follow=None
        ) as right,
    ):
        stored: list[str] = []
        errors: list[BaseException] = []
        violations: list[Any] = []
        stop = threading.Event()
        lock = threading.Lock()

        def write(rt: journaled.Runtime, who: str, seed: int) -> None:
            rng = random.Random(seed)
            try:
                for i in range(25):
                    key = rng.choice(keys)
                    fact = rt.memory.remember(f"{who} {i} holds {key}", conflict_key=key)
                    with lock:
                        stored.append(fact.id)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        def read(rt: journaled.Runtime) -> None:
            try:
                while not stop.is_set():
                    facts = rt.memory.search("holds", limit=1000)
                    for key in keys:
                        live = [
                            f.id for f in facts if f.conflict_key == key and f.superseded_by is None
                        ]
                        if len(live) > 1:
                            violations.append((key, live))
                    time.sleep(0.002)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        writers = [
            threading.Thread(target=write, args=(left, "L0", 1)),
            threading.Thread(target=write, args=(left, "L1", 2)),
            threading.Thread(target=write, args=(right, "R0", 3)),
            threading.Thread(target=write, args=(right, "R1", 4)),
        ]
        readers = [threading.Thread(target=read, args=(rt,)) for rt in (left, right)]
        for t in readers + writers:
            t.start()
        for t in writers:
            t.join(120)
        stop.set()
        for t in readers:
            t.join(30)
        assert not errors, errors
        assert not violations, f"two live holders of one key seen at once: {violations[:3]}"
        assert len(stored) == 100
        # The follower shows the other runtime's facts without being asked.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if {f.id for f in left.memory.all()} >= set(stored):
                break
            time.sleep(0.05)
        assert {f.id for f in left.memory.all()} >= set(stored)
        right.refresh()
        assert {f.id for f in right.memory.all()} >= set(stored)
        for key in keys:
            assert _live(left, key) == _live(right, key)
            assert len(_live(left, key)) == 1
        remembered = {
            e.data.fact_id for e in left.journal.read() if isinstance(e.data, FactRemembered)
        }
        assert remembered == set(stored)


# -- a read by message (scopes busy past the settle wait) -----------------------------------------


class _AfterAsk:
    """A scope actor's ref that runs ``then`` right after the read's message is queued to it."""

    def __init__(self, ref: Any, then: Any) -> None:
        self._ref, self._then = ref, then

    def ask(self, message: Any, block: bool = True, timeout: float | None = None) -> Any:
        future = self._ref.ask(message, block=False)
        then, self._then = self._then, None
        if then is not None:
            then()
        return future if not block else future.get(timeout=timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ref, name)


def test_a_read_by_message_never_sees_half_a_command_across_scopes(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0053 (*Each command whole*), M3: when the scopes stay busy past SETTLE_WAIT a read
    asks the actors instead. A remember in the project scope superseding the user scope's holder
    of a key is one command; the read's asks are queued holding the scopes' lock, so the command
    cannot land between them: never the old holder live in one scope and the new one in the
    other. (Forcing the read by message stands for busy scopes; the remember is started between
    the two sends, where a thread switch can put it.)"""
    with journaled.open(sqlite_url, clock=clock, follow=None) as rt:
        old = rt.memory.remember("port 80", scope="user", conflict_key="port")
        refs = list(rt.memory._refs)
        assert refs[0] is rt.memory._scopes["user"]

        started: list[threading.Thread] = []

        def remember_between() -> None:
            done = threading.Thread(
                target=lambda: rt.memory.remember("port 81", scope="project", conflict_key="port")
            )
            started.append(done)
            done.start()
            done.join(0.5)  # lands between the two sends unless the read's sending keeps it out

        monkeypatch.setattr(rt.memory, "_refs", [_AfterAsk(refs[0], remember_between), *refs[1:]])
        real_in_place = rt.memory._in_place
        monkeypatch.setattr(rt.memory, "_in_place", lambda read: UNSETTLED)
        facts = rt.memory.all()
        monkeypatch.setattr(rt.memory, "_in_place", real_in_place)
        started[0].join(20)
        live = sorted(f.text for f in facts if f.conflict_key == "port" and f.superseded_by is None)
        was = rt.memory.get(old.id)
        assert was is not None
        assert was.superseded_by is not None  # the command did happen
        assert len(live) <= 1, f"a read by message saw half a command: live holders {live}"
