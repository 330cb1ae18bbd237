"""Reads in place (ADR 0053): the memory door reads idle scope actors' state on its own thread.

M4, M6 and M7 answers must not change by it: a read in place equals a rescore, a read asked after
a write returned sees the write even while its fold is still queued, a reader sees each command's
changes to several scopes whole or not at all, and a scope whose fold failed is read by message.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pykka
import pytest
from in_place import fail_fold_once

import journaled
import journaled.memory as door
from journaled.actors.asking import ask_all
from journaled.actors.errors import MemoryBehind, RuntimeClosed
from journaled.actors.memory import MemoryWriter
from journaled.actors.scope import ScopeActor, ScopeShelf, Unsettled
from journaled.events.bm25 import bm25_rescore
from journaled.events.journal import Journal
from journaled.events.memory import FactRemembered
from journaled.events.memory_state import ScopeState
from journaled.events.messages import Apply, Get, Remember
from journaled.testing import KeywordEmbedder, ManualClock


@pytest.fixture
def rounds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every ask the memory door sends to its scope actors, by message name."""
    seen: list[str] = []

    def counting(refs: Any, message: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(type(message).__name__)
        return ask_all(refs, message, *args, **kwargs)

    monkeypatch.setattr(door, "ask_all", counting)
    return seen


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Hold a scope actor at each ``Get`` it takes from its inbox, before it answers (and before
    it takes the scopes' lock), until the test sets the event: the scope is busy meanwhile, so
    what the writer folds for it is queued behind, not folded in place."""
    release = threading.Event()
    real = ScopeActor.on_receive

    def held(self: ScopeActor, message: object) -> object:
        if isinstance(message, Get):
            release.wait(30)
        return real(self, message)

    monkeypatch.setattr(ScopeActor, "on_receive", held)
    yield release
    release.set()


def shelves(rt: journaled.Runtime) -> list[ScopeShelf]:
    found: list[ScopeShelf] = rt.memory._shelves
    assert found, "the runtime's memory has no shelves to read in place"
    return found


def settle(rt: journaled.Runtime) -> None:
    """Wait until every scope actor has folded what it was told."""
    deadline = time.monotonic() + 10
    while not all(shelf.settled for shelf in shelves(rt)):
        assert time.monotonic() < deadline, "the scope actors never went idle"
        time.sleep(0.001)


def test_idle_scopes_are_read_in_place_and_equal_a_rescore(
    sqlite_url: str, clock: ManualClock, rounds: list[str]
) -> None:
    """M4, M6, M7: with every scope actor idle, get, search and semantic search ask no actor,
    and BM25 still equals a from-scratch rescore over every scope."""
    texts = ["tea at five", "tea and biscuits", "coffee at nine", "tea tea tea", "green tea"]
    with journaled.open(sqlite_url, clock=clock, embedder=KeywordEmbedder(["tea", "coffee"])) as rt:
        facts = [
            rt.memory.remember(t, scope=("project", "user", "repository")[i % 3])
            for i, t in enumerate(texts)
        ]
        settle(rt)
        rounds.clear()
        expected = bm25_rescore("tea five", [(f.id, f.text) for f in facts], 3)
        assert [f.id for f in rt.memory.search("tea five", limit=3)] == [i for _, i in expected]
        only_user = [f for f in facts if f.scope == "user"]
        assert [f.id for f in rt.memory.search("tea", scopes=["user"])] == [
            i for _, i in bm25_rescore("tea", [(f.id, f.text) for f in only_user], 10)
        ]
        assert rt.memory.get(facts[2].id) == facts[2]
        assert rt.memory.get("no-such-fact") is None
        assert {f.id for f in rt.memory.search_semantic("coffee")} >= {facts[2].id}
        assert rounds == []


def test_a_read_after_a_write_sees_it_while_its_fold_is_still_queued(
    sqlite_url: str, clock: ManualClock, gate: threading.Event, rounds: list[str]
) -> None:
    """ADR 0053: a remember answers once its folds are done or queued; a search asked then must
    not answer from a scope that has not folded it yet, but wait for the fold (by message)."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.memory.remember("coffee at nine")
        project = rt.memory._scopes["project"]
        busy = project.ask(Get(fact_id="none"), block=False)  # held by the gate: busy
        fact = rt.memory.remember("tea at five")  # stored and answered; its fold is queued
        assert not shelves(rt)[list(rt.memory._scopes).index("project")].settled
        rounds.clear()
        found: list[list[str]] = []
        reader = threading.Thread(
            target=lambda: found.append([f.id for f in rt.memory.search("tea")])
        )
        reader.start()
        reader.join(0.3)
        assert reader.is_alive(), "the search answered from a scope that had not folded the write"
        gate.set()
        reader.join(10)
        assert busy.get(timeout=10) is None
        assert found == [[fact.id]]
        assert "SearchStats" in rounds
        rounds.clear()
        assert [f.id for f in rt.memory.search("tea")] == [fact.id]
        assert rounds == []  # folded and idle again: in place


def test_a_command_reaches_every_scope_at_once_for_a_reader_in_place(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0053: a remember that supersedes a fact of another scope changes two scope actors; a
    reader in place sees both changes or neither, never one live holder too many or a
    superseder that does not exist yet. A pause after each fold is queued widens the window a
    writer without the send lock would leave open."""
    real_tell = pykka.ActorRef.tell

    def slow_tell(self: Any, message: Any) -> None:
        real_tell(self, message)
        if isinstance(message, Apply):
            time.sleep(0.002)

    monkeypatch.setattr(pykka.ActorRef, "tell", slow_tell)
    problems: list[str] = []
    stop = threading.Event()
    reads = 0
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.memory.remember("holder 0", scope="user", conflict_key="k")

        def check(states: list[ScopeState]) -> None:
            facts = {f.id: f for s in states for f in s.all()}
            live = [f for f in facts.values() if f.superseded_by is None]
            if len(live) != 1:
                problems.append(f"{len(live)} live holders of the key")
            problems.extend(
                f"{f.id} superseded by {f.superseded_by}, not yet there"
                for f in facts.values()
                if f.superseded_by is not None and f.superseded_by not in facts
            )

        def read() -> None:
            nonlocal reads
            while not stop.is_set():
                if not isinstance(rt.memory._in_place(check), Unsettled):
                    reads += 1

        reader = threading.Thread(target=read)
        reader.start()
        try:
            for i in range(1, 41):
                scope = ("project", "user")[i % 2]
                rt.memory.remember(f"holder {i}", scope=scope, conflict_key="k")
        finally:
            stop.set()
            reader.join(10)
    assert reads > 0, "no read in place happened: the check proved nothing"
    assert problems == []


@pytest.mark.parametrize("where", ["in place", "by its actor"])
def test_a_scope_whose_fold_failed_answers_nothing_until_rebuilt(
    sqlite_url: str,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    gate: threading.Event,
    where: str,
) -> None:
    """ADR 0053: a fold that raised part way may have left half a change in a scope's state;
    the scope answers no read (in place or by message) until the writer rebuilds memory from the
    journal, which it does at once, or before its next command or the door's next read."""

    real_rebuild = MemoryWriter._rebuild
    broken_at_rebuild: list[bool] = []

    def rebuild(self: MemoryWriter) -> None:
        # Until the restore, no reader may take the half-folded state in place.
        broken_at_rebuild.append(self.shelves["project"].broken)
        real_rebuild(self)

    monkeypatch.setattr(MemoryWriter, "_rebuild", rebuild)
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.memory.remember("tea at five")
        fail_fold_once(monkeypatch)
        project = shelves(rt)[list(rt.memory._scopes).index("project")]
        busy = None
        if where == "by its actor":  # a busy scope: the fold is told, and fails on its thread
            gate.clear()
            busy = rt.memory._scopes["project"].ask(Get(fact_id="none"), block=False)
        boom = rt.memory.remember("boom")  # stored: the journal holds it whatever the fold did
        if busy is not None:
            gate.set()
            busy.get(timeout=10)
            deadline = time.monotonic() + 10
            while not project.broken and time.monotonic() < deadline:
                time.sleep(0.01)
        if where == "by its actor":
            assert project.broken
            assert not project.settled
            with pytest.raises(MemoryBehind, match="failed to fold a change"):
                rt.memory._scopes["project"].ask(Get(fact_id=boom.id))  # half a change: no
            # The door's read has the writer rebuild first, then reads the whole memory.
            assert [f.text for f in rt.memory.search("tea")] == ["tea at five"]
            assert not project.broken
        # The writer rebuilds (at once after a fold of its own failed, else before its next
        # command or a read); the failure does not recur, and memory reads as stored.
        later = rt.memory.remember("tea later")
        assert broken_at_rebuild == [True]
        assert not project.broken
        assert {f.id for f in rt.memory.all()} >= {boom.id, later.id}
        assert sorted(f.text for f in rt.memory.search("tea")) == ["tea at five", "tea later"]


def test_a_closed_runtime_is_not_read_in_place(sqlite_url: str, clock: ManualClock) -> None:
    """A closed runtime says so (RuntimeClosed), rather than answering from stopped actors."""
    rt = journaled.open(sqlite_url, clock=clock)
    rt.memory.remember("tea at five")
    rt.close()
    assert not any(shelf.settled for shelf in shelves(rt))
    with pytest.raises(RuntimeClosed):
        rt.memory.search("tea")


# -- remembers stored on the caller's thread (ADR 0054) --------------------------------------------


def writer_puts(rt: journaled.Runtime) -> int:
    puts: int = rt.memory._writer.actor_inbox.puts
    return puts


def test_a_lone_remember_is_stored_on_the_callers_thread(
    sqlite_url: str, clock: ManualClock
) -> None:
    """ADR 0054, M2, M3: with the writer idle, a remember sends it nothing, and stores what the
    writer would: the same events, a supersession included, as by message."""

    def story(rt: journaled.Runtime) -> list[str]:
        rt.memory.remember("api on 8080", conflict_key="api-port")
        rt.memory.remember("tea at five", scope="user")
        rt.memory.remember("api on 8081", conflict_key="api-port")
        return [e.kind for e in rt.journal.read()]

    with journaled.open(sqlite_url, clock=clock, follow=None) as rt:
        before = writer_puts(rt)
        here = story(rt)
        assert writer_puts(rt) == before
        live = [f.text for f in rt.memory.all() if f.superseded_by is None]
        assert sorted(live) == ["api on 8081", "tea at five"]
    other = sqlite_url.replace("journal.sqlite", "by-message.sqlite")
    with journaled.open(other, clock=ManualClock(start=1_700_000_000_000), follow=None) as rt:
        rt.memory._desk = None
        before = writer_puts(rt)
        assert story(rt) == here
        assert writer_puts(rt) == before + 3


def test_a_remember_that_finds_the_writer_busy_is_sent_to_it(
    sqlite_url: str, clock: ManualClock
) -> None:
    """ADR 0054: while the writer handles a message, a remember is queued for it, not stored on
    the caller's thread beside it, and is answered once the writer is free."""
    with journaled.open(sqlite_url, clock=clock, follow=None) as rt:
        writer = rt._actors.desk.writer
        assert isinstance(writer, MemoryWriter)
        before = writer_puts(rt)
        found: list[str] = []
        with writer.command_lock:  # as while the actor handles a message
            caller = threading.Thread(
                target=lambda: found.append(rt.memory.remember("tea at five").text)
            )
            caller.start()
            deadline = time.monotonic() + 10
            while writer_puts(rt) == before and time.monotonic() < deadline:
                time.sleep(0.001)
            assert writer_puts(rt) == before + 1
            assert found == []
        caller.join(10)
        assert found == ["tea at five"]
        assert [f.text for f in rt.memory.all()] == ["tea at five"]


@pytest.mark.parametrize("stop", ["runtime", "memory actors"])
def test_closing_waits_for_a_remember_being_stored_here(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    """ADR 0054, R3: a close that comes while a caller stores a remember itself waits for it; the
    caller gets its fact, and the journal holds it. ``memory actors`` stops only the writer and
    the scopes, as the runtime's close ends with: no earlier message waits for the writer."""
    entered, release = threading.Event(), threading.Event()
    real = Journal.append

    def held(journal: Journal, events: Any, **kwargs: Any) -> list[int]:
        if any(isinstance(p.data, FactRemembered) for p in events) and not entered.is_set():
            entered.set()
            assert release.wait(10)
        return real(journal, events, **kwargs)

    rt = journaled.open(sqlite_url, clock=clock, follow=None)
    monkeypatch.setattr(Journal, "append", held)
    outcome: list[object] = []

    def remember() -> None:
        try:
            outcome.append(rt.memory.remember("tea at five"))
        except Exception as exc:
            outcome.append(exc)

    caller = threading.Thread(target=remember)
    caller.start()
    assert entered.wait(10)
    closing = threading.Thread(target=rt.close if stop == "runtime" else rt._actors.stop)
    closing.start()
    closing.join(0.3)
    assert closing.is_alive(), "close went on while a remember was being stored"
    release.set()
    caller.join(10)
    closing.join(10)
    assert not closing.is_alive()
    assert [type(o).__name__ for o in outcome] == ["Fact"]
    rt.close()
    monkeypatch.setattr(Journal, "append", real)
    with journaled.open(sqlite_url, clock=clock) as again:
        assert [f.text for f in again.memory.all()] == ["tea at five"]
    with pytest.raises(RuntimeClosed):
        rt.memory.remember("after the close")


def test_a_remember_never_overtakes_one_sent_before_it(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0054, M3: a remember sent to the writer (the asyncio door's way) and not yet handled
    keeps its place: a later remember from the same caller is queued behind it instead of being
    stored first, so the later claim of a key supersedes the earlier one."""
    taken, release = threading.Event(), threading.Event()
    real = MemoryWriter.on_receive

    def held(self: MemoryWriter, message: object) -> object:
        if isinstance(message, Remember) and not release.is_set():
            taken.set()
            assert release.wait(10)  # taken from the inbox, not yet handled
        return real(self, message)

    monkeypatch.setattr(MemoryWriter, "on_receive", held)
    with journaled.open(sqlite_url, clock=clock, follow=None) as rt:
        _, first = rt.memory.request_remember(Remember(text="port is 80", conflict_key="port"))
        assert taken.wait(10)
        later: list[str] = []
        caller = threading.Thread(
            target=lambda: later.append(rt.memory.remember("port is 81", conflict_key="port").id)
        )
        caller.start()
        caller.join(0.3)
        assert caller.is_alive(), "the later remember was stored before the earlier one"
        release.set()
        caller.join(10)
        earlier = first.result(timeout=10).fact
        facts = {f.id: f for f in rt.memory.all()}
        assert facts[earlier.id].superseded_by == later[0]
        assert facts[later[0]].superseded_by is None
