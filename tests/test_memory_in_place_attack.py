"""Attacks on reads in place (ADR 0053) and remembers stored on the caller's thread (ADR 0054).

Rebuilds, catch-ups, interrupts, closes, other processes, the asyncio door, steps, snapshots and
tenants, each against the promise that a reader sees every returned write and each command whole.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pytest
from eventsourcing.persistence import OperationalError
from in_place import fail_fold_once, two_runtimes, writer_of

import journaled
import journaled.aio
from journaled.actors.errors import ActorsError, RuntimeClosed
from journaled.actors.memory import MemoryWriter
from journaled.events.journal import Journal
from journaled.events.memory import FactRemembered, FactSuperseded
from journaled.events.memory_state import ScopeState
from journaled.testing import ManualClock


def _last_remembered(rt: journaled.Runtime) -> str:
    ids = [e.data.fact_id for e in rt.journal.read() if isinstance(e.data, FactRemembered)]
    return ids[-1]


# -- rebuilds ------------------------------------------------


def test_a_rebuild_after_a_failed_fold_never_shows_readers_an_empty_memory(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0053, 0054: while the writer rebuilds memory after a failed fold (scopes restored empty,
    then the journal replayed), a reader is not answered from the empty or partial scopes: it
    waits for the rebuild and reads the whole memory. The pause stands for a long replay."""
    with journaled.open(sqlite_url, clock=clock, follow=None) as rt:
        tea = rt.memory.remember("tea at five")

        emptied, release = threading.Event(), threading.Event()
        real_replay = MemoryWriter._replay

        def replay(self: MemoryWriter, **kwargs: Any) -> None:
            if self._stale:  # the rebuild's replay, after the scopes were restored empty
                emptied.set()
                release.wait(10)
            real_replay(self, **kwargs)

        fail_fold_once(monkeypatch)
        monkeypatch.setattr(MemoryWriter, "_replay", replay)
        writer = threading.Thread(target=lambda: rt.memory.remember("boom"))
        writer.start()
        try:
            assert emptied.wait(10)
            found = [f.id for f in rt.memory.search("tea")]
            got = rt.memory.get(tea.id)
        finally:
            release.set()
            writer.join(10)
        assert (found, got) == ([tea.id], tea), (
            f"a reader during the rebuild saw search={found}, get={got}: an empty memory"
        )


def test_a_rebuild_that_fails_leaves_no_empty_memory_answering_reads(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0053: when the rebuild's replay fails (a transient journal error), the emptied scopes
    answer no read as if whole: the read has the writer rebuild again, and answers once it has."""
    with journaled.open(sqlite_url, clock=clock, follow=None) as rt:
        tea = rt.memory.remember("tea at five")
        real_apply = ScopeState.apply
        fold_failures, replay_failures = [1], [1]

        def failing(self: ScopeState, event: Any, text: str | None = None) -> None:
            if text == "boom" and fold_failures:
                fold_failures.pop()
                raise RuntimeError("fold failed")
            real_apply(self, event, text)

        real_replay = MemoryWriter._replay

        def replay(self: MemoryWriter, **kwargs: Any) -> None:
            if self._stale and replay_failures:
                replay_failures.pop()
                raise OperationalError("the journal could not be read just now")
            real_replay(self, **kwargs)

        fail_fold_once(monkeypatch)
        monkeypatch.setattr(MemoryWriter, "_replay", replay)
        rt.memory.remember("boom")  # stored; its fold fails; the rebuild fails
        assert writer_of(rt)._stale
        found = [f.id for f in rt.memory.search("tea")]
        got = rt.memory.get(tea.id)
        assert (found, got) == ([tea.id], tea), (
            f"a stale memory answered search={found}, get={got} from emptied scopes"
        )


def test_a_scope_whose_told_fold_failed_is_rebuilt_without_waiting_for_a_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ADR 0053: a fold told to a busy scope actor that fails there marks its shelf broken; a
    runtime that only reads afterwards (the memory backend never follows) has the writer rebuild
    at its next read, rather than failing every read for good."""
    from journaled.actors.scope import ScopeActor
    from journaled.events.messages import Get

    release = threading.Event()
    real_receive = ScopeActor.on_receive

    def held(self: ScopeActor, message: object) -> object:
        if isinstance(message, Get) and message.fact_id == "hold":
            release.wait(10)
        return real_receive(self, message)

    monkeypatch.setattr(ScopeActor, "on_receive", held)
    clock = ManualClock(start=1_700_000_000_000)
    with journaled.open("memory://", clock=clock) as rt:
        tea = rt.memory.remember("tea at five")
        fail_fold_once(monkeypatch)
        busy = rt.memory._scopes["project"].ask(Get(fact_id="hold"), block=False)
        rt.memory.remember("boom")  # folded by the busy actor, later, and failing there
        release.set()
        busy.get(timeout=10)
        time.sleep(0.5)
        try:
            found = [f.id for f in rt.memory.search("tea")]
        except ActorsError as exc:
            found = [f"ActorsError: {exc}"]
        assert found == [tea.id]


# -- catching up on other processes -----------------------------------


def test_a_follower_catching_up_never_shows_half_of_a_command(sqlite_url: str) -> None:
    """ADR 0053, M3: a reader in place sees each command whole while the writer catches up on
    another process's appends in batches: a superseding remember whose ``FactRemembered`` ends
    one batch and whose ``FactSuperseded`` starts the next never shows two live holders."""
    clock_a, clock_b = ManualClock(start=1_700_000_000_000), ManualClock(start=1_700_000_000_000)
    with (
        journaled.open(sqlite_url, clock=clock_a, follow=None) as reader_rt,
        journaled.open(sqlite_url, clock=clock_b, follow=None) as other,
    ):
        # Two plain facts, then a chain of claims of "k": each claim after the first is
        # (FactRemembered, FactSuperseded, ConflictKeyClaimed), so event 2000 is a claim's
        # FactRemembered and event 2001 its FactSuperseded.
        other.memory.remember("plain one")
        other.memory.remember("plain two")
        for i in range(700):
            other.memory.remember(f"holder {i}", conflict_key="k")
        events = list(other.journal.read())
        assert isinstance(events[1999].data, FactRemembered)
        assert isinstance(events[2000].data, FactSuperseded)
        between, read = threading.Event(), threading.Event()
        writer = writer_of(reader_rt)
        real = MemoryWriter._fold_batch
        batches = [0]

        def fold_batch(self: MemoryWriter, batch: Any, missing: Any, texts: Any = None) -> None:
            real(self, batch, missing, texts)
            if self is writer:
                batches[0] += 1
                if batches[0] == 1:
                    between.set()
                    # The reader's search either waits for the whole catch-up (right) or reads
                    # between the batches; a short pause gives it the chance to.
                    read.wait(0.5)

        holders: list[list[str]] = []

        def look() -> None:
            assert between.wait(10)
            try:
                holders.append(
                    [
                        f.text
                        for f in reader_rt.memory.search("holder", limit=1000)
                        if f.conflict_key == "k"
                    ]
                )
            finally:
                read.set()

        MemoryWriter._fold_batch = fold_batch  # type: ignore[method-assign]
        try:
            looker = threading.Thread(target=look)
            looker.start()
            reader_rt.refresh()
            looker.join(10)
        finally:
            MemoryWriter._fold_batch = real  # type: ignore[method-assign]
        assert len(holders) == 1
        assert len(holders[0]) <= 1, f"live holders of one key seen at once: {holders[0]}"


# -- interrupts on the caller's thread --------------------------------


class _Interrupt:
    """Deliver a KeyboardInterrupt (Ctrl-C) to the main thread while it waits for the scopes'
    lock inside an in-place remember's fold, after the append committed."""

    def __init__(self, rt: journaled.Runtime) -> None:
        self.rt = rt
        self.lock = rt.memory._shelves[0].lock
        self.main = threading.main_thread().ident
        self.before = rt._journal.position()
        self.done = threading.Event()

    def run(self) -> None:
        writer = writer_of(self.rt)
        with self.lock:  # as a search in place, scoring a large store, holds it
            deadline = time.monotonic() + 10
            while writer.position <= self.before and time.monotonic() < deadline:
                time.sleep(0.001)  # the append committed; _fold moved the position on
            time.sleep(0.05)  # the caller now waits for the lock, to fold
            assert self.main is not None
            signal.pthread_kill(self.main, signal.SIGUSR1)
            time.sleep(0.05)
        self.done.set()


def _interrupt_a_remember(rt: journaled.Runtime) -> str:
    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGUSR1, interrupt)
    try:
        attack = _Interrupt(rt)
        helper = threading.Thread(target=attack.run)
        helper.start()
        with pytest.raises(KeyboardInterrupt):
            rt.memory.remember("tea at five")
        helper.join(10)
        assert attack.done.is_set()
    finally:
        signal.signal(signal.SIGUSR1, old)
    return _last_remembered(rt)


def test_an_interrupted_remember_here_leaves_no_stored_fact_unseen(
    sqlite_url: str, clock: ManualClock
) -> None:
    """ADR 0054: an interrupt (Ctrl-C, a SIGTERM handler's SystemExit) landing in a remember on
    the caller's thread, after the journal committed and before the scopes folded it, leaves
    memory marked behind the journal: the next command rebuilds it, and the fact is there."""
    with journaled.open(sqlite_url, clock=clock, follow=None) as rt:
        rt.memory.remember("coffee at nine")
        fact_id = _interrupt_a_remember(rt)
        assert rt.memory.history(fact_id), "the remember was not even stored"
        rt.memory.remember("another fact")  # the next command: a chance to repair
        assert rt.memory.get(fact_id) is not None, "a stored fact is missing from memory"


def test_an_interrupted_remember_here_is_not_snapshotted_away(
    sqlite_url: str, clock: ManualClock
) -> None:
    """ADR 0054: after such an interrupt, no snapshot is taken of the scopes without the fact; a
    checkpoint first rebuilds memory, and a reopen from the snapshot has the fact."""
    with journaled.open(sqlite_url, clock=clock, follow=None) as rt:
        rt.memory.remember("coffee at nine")
        fact_id = _interrupt_a_remember(rt)
        rt.memory.checkpoint()
    with journaled.open(sqlite_url, clock=clock, follow=None) as again:
        assert again.memory.history(fact_id)
        assert again.memory.get(fact_id) is not None, "reopened from a snapshot without it"


# -- errors ---------------------------------


@pytest.mark.parametrize("how", ["by message", "here"])
def test_a_failed_append_raises_the_same_error_either_way(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """ADR 0054: a remember gets the same error whichever way it was stored: a database error that
    is not journaled's own (the library's OperationalError, as for a full disk) is an
    ActorsError naming it, stored on the caller's thread as when sent to the writer."""
    with journaled.open(sqlite_url, clock=clock, follow=None) as rt:
        if how == "by message":
            rt.memory._desk = None

        def full(self: Journal, *args: Any, **kwargs: Any) -> list[int]:
            raise OperationalError("database or disk is full")

        monkeypatch.setattr(Journal, "append", full)
        with pytest.raises(ActorsError, match="disk is full"):
            rt.memory.remember("tea at five")


# -- the rest of the promise ------------------------------------------------------------------


def test_read_your_writes_across_threads_and_the_asyncio_door(
    sqlite_url: str, clock: ManualClock
) -> None:
    """A remember stored on one thread (in place or by message) is seen by a search and
    a get asked on another thread after it returned, and by the asyncio door."""
    import asyncio

    with journaled.open(sqlite_url, clock=clock, follow=None) as rt:
        for i in range(50):
            box: list[Any] = []
            t = threading.Thread(
                target=lambda box=box, i=i: box.append(rt.memory.remember(f"tea {i} x"))
            )
            t.start()
            t.join(10)
            fact = box[0]
            assert rt.memory.get(fact.id) == fact
            assert fact.id in [f.id for f in rt.memory.search(f"tea {i}", limit=100)]

    async def story() -> None:
        async with journaled.aio.open(sqlite_url, clock=clock, follow=None) as art:
            for i in range(20):
                fact = await art.memory.remember(f"coffee {i} y", conflict_key="c")
                assert (await art.memory.get(fact.id)) == fact
                live = [f.id for f in await art.memory.search("coffee", limit=100)]
                assert live == [fact.id]
                mixed = art._sync.memory.remember(f"coffee {i} z", conflict_key="c")
                live = [f.id for f in await art.memory.search("coffee", limit=100)]
                assert live == [mixed.id]

    asyncio.run(story())


def test_in_place_remembers_racing_deletes_keep_one_live_holder(
    sqlite_url: str, clock: ManualClock
) -> None:
    """Remembers of one key from several threads (in place or grouped) racing deletes of
    the current holder from another thread keep M3 and M8: at most one live holder, and the
    journal's fold (a fresh open) agrees with the live projection."""
    with journaled.open(sqlite_url, clock=clock, follow=None) as rt:
        stop = threading.Event()
        errors: list[BaseException] = []

        def remembering(n: int) -> None:
            try:
                for i in range(60):
                    rt.memory.remember(f"holder {n}-{i}", conflict_key="k")
            except BaseException as exc:
                errors.append(exc)

        def deleting() -> None:
            try:
                while not stop.is_set():
                    live = list(rt.memory.search("holder", limit=1000))
                    assert len([f for f in live if f.conflict_key == "k"]) <= 1, live
                    if live:
                        rt.memory.delete(live[0].id)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=remembering, args=(n,)) for n in range(3)]
        deleter = threading.Thread(target=deleting)
        deleter.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        stop.set()
        deleter.join(30)
        assert errors == []
        live_here = sorted(f.id for f in rt.memory.search("holder", limit=1000))
        every = {f.id: f.superseded_by for f in rt.memory.all()}
    with journaled.open(sqlite_url, clock=clock, follow=None) as again:
        assert sorted(f.id for f in again.memory.search("holder", limit=1000)) == live_here
        assert {f.id: f.superseded_by for f in again.memory.all()} == every


def test_close_racing_in_place_reads_and_writes_raises_runtime_closed(
    sqlite_url: str, clock: ManualClock
) -> None:
    """Threads remembering and searching while the runtime closes either succeed or get
    RuntimeClosed; none hangs or gets another error; every fact answered is stored."""
    rt = journaled.open(sqlite_url, clock=clock, follow=None)
    stored: list[str] = []
    other: list[BaseException] = []
    go = threading.Event()

    def work(n: int) -> None:
        go.wait()
        try:
            for i in range(10_000):
                stored.append(rt.memory.remember(f"tea {n} {i}").id)
                rt.memory.search("tea")
                rt.memory.get(stored[-1])
        except RuntimeClosed:
            return
        except BaseException as exc:
            other.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    go.set()
    time.sleep(0.3)
    rt.close()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert other == []
    with journaled.open(sqlite_url, clock=clock, follow=None) as again:
        assert {f.id for f in again.memory.all()} >= set(stored)


def test_a_held_sqlite_write_lock_gives_journal_busy_and_leaves_reads_free(
    sqlite_url: str, clock: ManualClock
) -> None:
    """Another connection holding the file's write lock: a remember in place waits for
    its lock_wait and raises JournalBusy, holding the writer but not the scopes' lock, so reads
    in place go on meanwhile; afterwards remembers are stored again."""
    import sqlite3

    from journaled.events.errors import JournalBusy

    with journaled.open(sqlite_url, clock=clock, follow=None, lock_wait=0.5) as rt:
        tea = rt.memory.remember("tea at five")
        path = sqlite_url.removeprefix("sqlite:///")
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        outcome: list[BaseException] = []

        def remember() -> None:
            try:
                rt.memory.remember("coffee")
            except BaseException as exc:
                outcome.append(exc)

        t = threading.Thread(target=remember)
        t.start()
        time.sleep(0.1)
        started = time.monotonic()
        assert [f.id for f in rt.memory.search("tea")] == [tea.id]
        assert time.monotonic() - started < 0.1
        t.join(10)
        other.execute("ROLLBACK")
        other.close()
        assert [type(e) for e in outcome] == [JournalBusy]
        assert rt.memory.remember("coffee later").text == "coffee later"


def test_a_remember_here_that_must_catch_up_supersedes_another_processs_claim(
    sqlite_url: str,
) -> None:
    """Another runtime on the same file claimed the key since this one last folded: the
    in-place remember conflicts, catches up on the caller's thread, and supersedes that claim;
    reads in place then show one live holder, as a fresh open does."""
    with two_runtimes(sqlite_url) as (here, other):
        here.memory.remember("port 80", conflict_key="port")
        other.refresh()
        theirs = other.memory.remember("port 81", conflict_key="port")
        before = here.memory._writer.actor_inbox.puts
        mine = here.memory.remember("port 82", conflict_key="port")
        assert here.memory._writer.actor_inbox.puts == before  # stored here, not sent
        assert mine.supersedes == (theirs.id,)
        assert [f.id for f in here.memory.search("port")] == [mine.id]
    with journaled.open(sqlite_url, follow=None) as again:
        assert [f.id for f in again.memory.search("port")] == [mine.id]


def test_organization_boundaries_and_time_travel_are_unchanged_by_in_place(sqlite_url: str) -> None:
    """Two organizations' runtimes on one journal, remembering in place: neither reads
    the other's organization facts in place (search, get), both read the shared scopes after a
    refresh, and ``as_of`` views match the live answers at each position."""
    with (
        journaled.open(sqlite_url, organization="acme", follow=None) as acme,
        journaled.open(sqlite_url, organization="beta", follow=None) as beta,
    ):
        a = acme.memory.remember("secret plan alpha", scope="organization")
        b = beta.memory.remember("secret plan beta", scope="organization")
        shared = beta.memory.remember("secret plan shared", scope="project")
        position = acme.journal.position()
        acme.refresh()
        beta.refresh()
        assert {f.id for f in acme.memory.search("secret plan")} == {a.id, shared.id}
        assert {f.id for f in beta.memory.search("secret plan")} == {b.id, shared.id}
        assert acme.memory.get(b.id) is None
        assert beta.memory.get(a.id) is None
        view = acme.memory.as_of(position=position)
        assert {f.id for f in view.search("secret plan")} == {a.id, shared.id}
        acme.memory.remember("secret plan later", scope="organization")
        assert {f.id for f in acme.memory.as_of(position=position).search("secret plan")} == {
            a.id,
            shared.id,
        }


def test_a_checkpoint_after_in_place_remembers_reopens_equal(
    sqlite_url: str, clock: ManualClock
) -> None:
    """Remembers, supersessions and a delete stored in place, then a memory snapshot:
    a reopen from the snapshot answers exactly as the live runtime did."""
    with journaled.open(sqlite_url, clock=clock, follow=None) as rt:
        for i in range(30):
            rt.memory.remember(f"fact {i} tea", conflict_key=f"k{i % 7}", scope="user")
        rt.memory.delete(rt.memory.search("tea", limit=1)[0].id)
        assert rt.memory.checkpoint()
        live = [f.id for f in rt.memory.search("tea", limit=100)]
        every = [(f.id, f.superseded_by) for f in rt.memory.all()]
    with journaled.open(sqlite_url, clock=clock, follow=None) as again:
        assert [f.id for f in again.memory.search("tea", limit=100)] == live
        assert [(f.id, f.superseded_by) for f in again.memory.all()] == every


def test_steps_read_their_own_and_each_others_writes_through_ctx_memory(
    sqlite_url: str, clock: ManualClock
) -> None:
    """Parallel steps remember through ctx.memory (in place or grouped, on executor
    threads) and a later step searches: it sees every earlier step's fact, and only the last
    claim of the key is live."""
    from journaled import Plan, Step

    def note(text: str, ctx: Any) -> str:
        fact = ctx.memory.remember(text, conflict_key=text.split(maxsplit=1)[0])
        assert ctx.memory.get(fact.id) == fact
        fact_id: str = fact.id
        return fact_id

    seen: list[list[str]] = []

    def look(_: Any, ctx: Any) -> str:
        seen.append(sorted(f.text for f in ctx.memory.search("region", limit=100)))
        return "looked"

    with journaled.open(sqlite_url, clock=clock, follow=None) as rt:
        rt.register_tool("note", note)
        rt.register_tool("look", look)
        steps = [Step(f"n{i}", tool="note", input=f"k{i} region {i}") for i in range(6)]
        steps.append(Step("look", tool="look", input="", depends_on=[s.id for s in steps]))
        result = rt.runs.execute(Plan(goal="g", steps=steps))
        assert result.ok, result
        assert seen == [sorted(f"k{i} region {i}" for i in range(6))]
