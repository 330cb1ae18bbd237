"""Attacks on the recovery paths of reads and remembers in place (ADR 0053, ADR 0054).

A reader waiting for busy scopes while a rebuild begins, a catch-up reading the journal while
readers read, and interrupts on the caller's thread (twice, or in the catch-up after a conflict);
also the repair of a failed fold by reads alone, and a tenant's rebuild.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pytest
from in_place import fail_fold_once, two_runtimes, writer_of

import journaled
import journaled.memory as door
from journaled.actors import memory as actors_memory
from journaled.actors.errors import MemoryBehind
from journaled.actors.memory import MemoryWriter
from journaled.actors.scope import ScopeActor
from journaled.events.memory import FactRemembered
from journaled.events.messages import Get, RestoreScope, SearchStats
from journaled.events.tenancy import home_scope as real_home_scope
from journaled.testing import ManualClock, wait_for

# -- a rebuild begun while a reader waits ---------------------------------------------------------


def test_a_reader_waiting_for_busy_scopes_does_not_read_them_emptied_by_a_rebuild(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0053 (*A rebuild*): a reader already waiting for busy scopes when a rebuild begins is
    not answered from the scopes the rebuild restored empty (they settle once restored): it sees
    memory behind the journal after its wait, and reads it once rebuilt. The replay is held (as a
    long one would be) only so that the check does not race it."""
    with journaled.open(sqlite_url, clock=clock, follow=None) as rt:
        tea = rt.memory.remember("tea at five")  # project scope
        lock = rt.memory._shelves[0].lock

        held, release_scope = threading.Event(), threading.Event()
        real_receive = ScopeActor.on_receive

        def gated(self: ScopeActor, message: object) -> object:
            if isinstance(message, Get) and message.fact_id == "hold":
                held.set()
                release_scope.wait(20)
            return real_receive(self, message)

        emptied, release_replay = threading.Event(), threading.Event()
        real_replay = MemoryWriter._replay

        def replay(self: MemoryWriter, **kwargs: Any) -> None:
            if self._stale:  # the rebuild's replay, after the scopes were restored empty
                emptied.set()
                release_replay.wait(20)
            real_replay(self, **kwargs)

        waiting = threading.Event()
        real_wait_for = lock.wait_for

        def wait_for(predicate: Any, timeout: float | None = None) -> bool:
            waiting.set()
            return bool(real_wait_for(predicate, timeout))

        monkeypatch.setattr(ScopeActor, "on_receive", gated)
        monkeypatch.setattr(MemoryWriter, "_replay", replay)
        monkeypatch.setattr(door, "SETTLE_WAIT", 20.0)
        monkeypatch.setattr(lock, "wait_for", wait_for, raising=False)
        fail_fold_once(monkeypatch)

        busy = rt.memory._scopes["project"].ask(Get(fact_id="hold"), block=False)
        assert held.wait(10)  # the project scope is busy: a reader waits for it
        found: list[list[str]] = []
        reader = threading.Thread(
            target=lambda: found.append([f.id for f in rt.memory.search("tea")])
        )
        reader.start()
        assert waiting.wait(10)
        # A fold in place fails (user scope): the writer rebuilds, restoring every scope empty.
        boom = threading.Thread(target=lambda: rt.memory.remember("boom", scope="user"))
        boom.start()
        deadline = time.monotonic() + 10
        while not writer_of(rt)._stale and time.monotonic() < deadline:
            time.sleep(0.001)
        release_scope.set()  # the busy scope finishes, then takes its RestoreScope
        try:
            assert emptied.wait(10)
            reader.join(5)  # on the code as it is, the reader reads the emptied scopes now
        finally:
            release_replay.set()
            reader.join(10)
            boom.join(10)
        with pytest.raises(MemoryBehind):
            busy.get(timeout=10)  # the held Get was answered during the rebuild
        assert found == [[tea.id]], (
            f"a reader that waited for busy scopes read them emptied by a rebuild: {found}"
        )


# -- a catch-up's journal reads -------------------------------------------------------------------


def test_reads_of_folded_memory_do_not_wait_for_a_catch_ups_journal_reads(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0053 (*Catching up*): a catch-up reads the journal (events, facts' texts) before it
    takes the scopes' lock to fold, so a read of memory already folded does not wait for the
    journal's I/O (a slow PostgreSQL, a table rewritten by the scrubber). The stall of
    ``_texts`` (its ``journal.payloads``) stands for it."""
    with (
        journaled.open(sqlite_url, clock=ManualClock(start=1_700_000_000_000), follow=None) as here,
        journaled.open(
            sqlite_url, clock=ManualClock(start=1_700_000_000_000), follow=None
        ) as other,
    ):
        tea = here.memory.remember("tea at five")
        for i in range(5):
            other.memory.remember(f"coffee {i}")
        stalled, release = threading.Event(), threading.Event()
        writer = writer_of(here)
        real_texts = MemoryWriter._texts

        def texts(self: MemoryWriter, events: Any) -> dict[str, str]:
            if self is writer and not stalled.is_set():  # the catch-up reads the facts' texts
                stalled.set()
                release.wait(30)
            return real_texts(self, events)

        monkeypatch.setattr(MemoryWriter, "_texts", texts)
        refresher = threading.Thread(target=here.refresh)
        refresher.start()
        try:
            assert stalled.wait(10)
            got: list[object] = []
            reader = threading.Thread(target=lambda: got.append(here.memory.get(tea.id)))
            reader.start()
            reader.join(5)
            answered = not reader.is_alive()
        finally:
            release.set()
            refresher.join(10)
        reader.join(10)
        assert answered, (
            "a read of a fact folded long ago waited for another process's catch-up to read "
            "the journal"
        )
        assert got == [tea]


# -- interrupts on the caller's thread -----------------


def _remembered_ids(rt: journaled.Runtime) -> list[str]:
    return [e.data.fact_id for e in rt.journal.read() if isinstance(e.data, FactRemembered)]


def test_a_second_interrupt_while_marking_memory_stale_leaves_no_fact_unseen(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0054 (*Interrupts*): memory is marked behind the journal before the scopes' lock is
    taken, so a second Ctrl-C while the interrupted remember waits for that lock (a read in
    place holds it) cannot leave the stored fact unfolded and memory unmarked."""
    with journaled.open(sqlite_url, clock=clock, follow=None) as rt:
        rt.memory.remember("coffee at nine")
        writer = writer_of(rt)
        lock = rt.memory._shelves[0].lock
        main = threading.main_thread().ident
        assert main is not None
        before = rt._journal.position()
        in_handler = threading.Event()
        real_set_stale = MemoryWriter._set_stale

        def set_stale(self: MemoryWriter, stale: bool) -> None:
            if stale:
                in_handler.set()
            real_set_stale(self, stale)

        monkeypatch.setattr(MemoryWriter, "_set_stale", set_stale)
        done = threading.Event()

        def attack() -> None:
            with lock:  # as a search in place holds it
                deadline = time.monotonic() + 10
                while writer.position <= before and time.monotonic() < deadline:
                    time.sleep(0.001)  # committed; _fold moved the position, waits for the lock
                time.sleep(0.05)
                signal.pthread_kill(main, signal.SIGUSR1)  # Ctrl-C
                if in_handler.wait(10):  # the handler waits for the lock too
                    time.sleep(0.05)
                    signal.pthread_kill(main, signal.SIGUSR1)  # Ctrl-C again
                    time.sleep(0.05)
            done.set()

        def interrupt(*_: Any) -> None:
            raise KeyboardInterrupt

        old = signal.signal(signal.SIGUSR1, interrupt)
        try:
            helper = threading.Thread(target=attack)
            helper.start()
            with pytest.raises(KeyboardInterrupt):
                rt.memory.remember("tea at five")
            helper.join(10)
            assert done.is_set()
            assert in_handler.is_set()
        finally:
            signal.signal(signal.SIGUSR1, old)
        fact_id = _remembered_ids(rt)[-1]
        rt.memory.remember("another fact")  # the next command: a chance to repair
        assert rt.memory.get(fact_id) is not None, "a stored fact is missing from memory"


def test_an_interrupt_in_the_catch_up_after_a_conflict_leaves_no_fact_unseen(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0054 (*Interrupts*): an interrupt in the catch-up that follows a version conflict
    (another process claimed the key first) marks memory behind the journal: the other
    process's fact is folded at the next command, and the key keeps its live holder."""
    with two_runtimes(sqlite_url) as (here, other):
        here.memory.remember("port 80", conflict_key="port")
        other.refresh()
        theirs = other.memory.remember("port 81", conflict_key="port")
        real = real_home_scope
        fired: list[bool] = []

        def home_scope(data: Any, scopes: Any, organization: str | None) -> str | None:
            if (
                getattr(data, "fact_id", None) == theirs.id
                and threading.current_thread() is threading.main_thread()
                and not fired
            ):
                fired.append(True)
                raise KeyboardInterrupt  # Ctrl-C landing in _fold, on the caller's thread
            return real(data, scopes, organization)

        monkeypatch.setattr(actors_memory, "home_scope", home_scope)
        with pytest.raises(KeyboardInterrupt):
            here.memory.remember("port 82", conflict_key="port")
        assert fired
        here.memory.remember("another fact")  # the next command: a chance to repair
        assert here.memory.get(theirs.id) is not None, "another process's fact is missing"
        assert [f.id for f in here.memory.search("port")] == [theirs.id]


# -- repairs and tenants --------------------------------------------------------------------------


def test_a_read_during_a_rebuild_on_the_writers_thread_waits_and_reads_it_whole(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A told fold failing on a busy scope's thread (memory backend: no follower) makes the next
    read heal through the writer's CatchUp; a second reader that comes while that rebuild is
    held reads the whole memory too (in place it blocks on the catch-up; by message it heals),
    and a checkpoint made afterwards reopens equal."""
    with journaled.open(sqlite_url, clock=clock, follow=None) as rt:
        tea = rt.memory.remember("tea at five")
        release = threading.Event()
        real_receive = ScopeActor.on_receive

        def gated(self: ScopeActor, message: object) -> object:
            if isinstance(message, Get) and message.fact_id == "hold":
                release.wait(20)
            return real_receive(self, message)

        monkeypatch.setattr(ScopeActor, "on_receive", gated)
        fail_fold_once(monkeypatch)
        busy = rt.memory._scopes["project"].ask(Get(fact_id="hold"), block=False)
        boom = rt.memory.remember("boom")  # told to the busy project scope; fails there
        release.set()
        busy.get(timeout=10)
        deadline = time.monotonic() + 10
        while not rt.memory._shelves[1].broken and time.monotonic() < deadline:
            time.sleep(0.001)
        results: list[list[str]] = []
        readers = [
            threading.Thread(
                target=lambda: results.append(sorted(f.id for f in rt.memory.search("tea boom")))
            )
            for _ in range(3)
        ]
        for r in readers:
            r.start()
        for r in readers:
            r.join(20)
        assert results == [sorted([tea.id, boom.id])] * 3
        assert rt.memory.checkpoint()
        live = sorted(f.id for f in rt.memory.all())
    with journaled.open(sqlite_url, clock=clock, follow=None) as again:
        assert sorted(f.id for f in again.memory.all()) == live


def test_an_organizations_rebuild_keeps_its_boundary(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An org-scoped runtime whose fold fails rebuilds from the journal holding every tenant's
    events: after it, reads in place still hide the other organization's facts (R1)."""
    with (
        journaled.open(sqlite_url, organization="acme", follow=None) as acme,
        journaled.open(sqlite_url, organization="beta", follow=None) as beta,
    ):
        a = acme.memory.remember("secret plan alpha", scope="organization")
        beta.memory.remember("secret plan beta", scope="organization")
        shared = beta.memory.remember("secret plan shared", scope="project")
        acme.refresh()
        fail_fold_once(monkeypatch)
        boom = acme.memory.remember("boom", scope="organization")
        assert not writer_of(acme)._stale
        assert {f.id for f in acme.memory.search("secret plan")} == {a.id, shared.id}
        assert acme.memory.get(boom.id) is not None


def test_a_long_catch_up_marks_memory_behind_until_it_is_folded(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0053 (*Catching up*): a tail too long to fold whole marks memory behind the journal
    while it is folded, so that no reader takes a part of it for the whole; once folded,
    memory is whole again and equals a fresh open. Sizes are shrunk to make 20 facts long."""
    monkeypatch.setattr(actors_memory, "_WHOLE_TAIL", 3)
    monkeypatch.setattr(actors_memory, "_FOLD_BATCH", 2)
    with two_runtimes(sqlite_url) as (here, other):
        here.memory.remember("tea at five")
        for i in range(20):
            other.memory.remember(f"holder {i}", conflict_key="k")
        writer = writer_of(here)
        seen: list[bool] = []
        real = MemoryWriter._fold_batch

        def fold_batch(self: MemoryWriter, batch: Any, missing: Any, texts: Any = None) -> None:
            if self is writer:
                seen.append(all(shelf.stale for shelf in self.shelves.values()))
            real(self, batch, missing, texts)

        monkeypatch.setattr(MemoryWriter, "_fold_batch", fold_batch)
        here.refresh()
        assert seen
        assert all(seen), f"batches folded while readers could read: {seen}"
        assert not writer._stale
        assert not any(shelf.stale for shelf in writer.shelves.values())
        live = sorted(f.text for f in here.memory.all() if f.superseded_by is None)
        assert live == ["holder 19", "tea at five"]
        folded = here.memory.all()
    with journaled.open(sqlite_url, follow=None) as fresh:
        assert fresh.memory.all() == folded


def test_a_read_queued_during_a_rebuild_is_refused_even_if_answered_after_it(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0053: a read by message queued at a scope while memory is being rebuilt, behind the
    rebuild's restore and ahead of the folds that make the scope whole, must not be answered
    from the empty restored state, even when the scope gets to it after the writer finished
    the rebuild: it is refused (MemoryBehind, and the door heals and reads again) or answered
    whole, never empty."""
    with journaled.open(sqlite_url, clock=clock, follow=None) as rt:
        tea = rt.memory.remember("tea at five")
        writer = writer_of(rt)
        project = rt.memory._scopes["project"]
        release = threading.Event()
        restored, queued = threading.Event(), threading.Event()
        real_receive = ScopeActor.on_receive

        def gated(self: ScopeActor, message: object) -> object:
            if isinstance(message, Get) and message.fact_id == "hold":
                release.wait(20)
            if isinstance(message, SearchStats):
                # Every scope answers only once the writer says memory is whole (or after 2 s).
                deadline = time.monotonic() + 2
                while writer._stale and time.monotonic() < deadline:
                    time.sleep(0.001)
            answer = real_receive(self, message)
            if self.shelf.state.physical == "project" and isinstance(message, RestoreScope):
                restored.set()
                queued.wait(10)  # the reader's ask is queued behind the restore
            return answer

        monkeypatch.setattr(ScopeActor, "on_receive", gated)
        fail_fold_once(monkeypatch)
        busy = project.ask(Get(fact_id="hold"), block=False)
        boom = rt.memory.remember("boom")  # told to the busy project scope; fails there
        release.set()
        busy.get(timeout=10)
        wait_for(lambda: rt.memory._shelves[1].broken, 10)
        healing = threading.Thread(target=rt.memory._heal)  # the writer rebuilds memory
        healing.start()
        assert restored.wait(10)
        q = door._query("tea boom", clock(), None, None, 0.0, 10)
        answers: list[Any] = []

        def read() -> None:
            try:
                answers.append(sorted(f.id for _, f in rt.memory._bm25_asked(q)))
            except MemoryBehind as exc:
                answers.append(exc)

        shelf = rt.memory._shelves[1]
        assert shelf.inbox is not None
        inbox = shelf.inbox
        reader = threading.Thread(target=read)
        reader.start()
        wait_for(lambda: inbox.puts > shelf.done, 10)  # its ask waits behind the restore
        queued.set()
        reader.join(20)
        healing.join(20)
        assert len(answers) == 1
        assert isinstance(answers[0], MemoryBehind) or answers[0] == sorted([tea.id, boom.id])
        assert sorted(f.id for f in rt.memory.search("tea boom")) == sorted([tea.id, boom.id])
