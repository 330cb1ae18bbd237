"""Reads in place (ADR 0053): the memory door reads idle scope actors' state on its own thread.

M4, M6 and M7 answers must not change by it: a read in place equals a rescore, a read asked after
a write returned sees the write even while its fold is still queued, a reader sees each command's
changes to several scopes whole or not at all, and a scope whose fold failed is read by message.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest

import journaled
import journaled.memory as door
from journaled.actors.asking import ask_all
from journaled.actors.errors import RuntimeClosed
from journaled.actors.scope import ScopeActor, ScopeShelf
from journaled.events.bm25 import bm25_rescore
from journaled.events.memory_state import ScopeState
from journaled.events.messages import Apply
from journaled.testing import KeywordEmbedder, ManualClock


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'journal.sqlite'}"


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
    """Hold every scope actor at each Apply it takes from its inbox, before it folds it (and
    before it takes the scopes' lock), until the test sets the event."""
    release = threading.Event()
    real = ScopeActor.on_receive

    def held(self: ScopeActor, message: object) -> object:
        if isinstance(message, Apply):
            release.wait(30)
        return real(self, message)

    monkeypatch.setattr(ScopeActor, "on_receive", held)
    release.set()  # the runtime opens and folds freely; a test clears it where it wants a hold
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
    url: str, clock: ManualClock, rounds: list[str]
) -> None:
    """M4, M6, M7: with every scope actor idle, get, search and semantic search ask no actor,
    and BM25 still equals a from-scratch rescore over every scope."""
    texts = ["tea at five", "tea and biscuits", "coffee at nine", "tea tea tea", "green tea"]
    with journaled.open(url, clock=clock, embedder=KeywordEmbedder(["tea", "coffee"])) as rt:
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
    url: str, clock: ManualClock, gate: threading.Event, rounds: list[str]
) -> None:
    """ADR 0053: a remember answers before its scope folds it; a search asked then must not
    answer from the scope's state without it, but wait for the fold (by message)."""
    with journaled.open(url, clock=clock) as rt:
        rt.memory.remember("coffee at nine")
        rounds.clear()
        gate.clear()
        fact = rt.memory.remember("tea at five")  # stored and answered; its fold is held
        found: list[list[str]] = []
        reader = threading.Thread(
            target=lambda: found.append([f.id for f in rt.memory.search("tea")])
        )
        reader.start()
        reader.join(0.3)
        assert reader.is_alive(), "the search answered from a scope that had not folded the write"
        gate.set()
        reader.join(10)
        assert found == [[fact.id]]
        assert "SearchStats" in rounds
        rounds.clear()
        assert [f.id for f in rt.memory.search("tea")] == [fact.id]
        assert rounds == []  # folded and idle again: in place


def test_a_command_reaches_every_scope_at_once_for_a_reader_in_place(
    url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
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
    with journaled.open(url, clock=clock) as rt:
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
                if not isinstance(rt.memory._in_place(check), door._Unsettled):
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


def test_a_scope_whose_fold_failed_is_read_by_message(
    url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, rounds: list[str]
) -> None:
    """ADR 0053: a fold that raised part way may have left half a change in the state; that
    scope is never read in place again, and reads go to its actor as without shelves."""
    real_apply = ScopeState.apply

    def failing(self: ScopeState, event: Any, text: str | None = None) -> None:
        if text == "boom":
            raise RuntimeError("fold failed")
        real_apply(self, event, text)

    with journaled.open(url, clock=clock) as rt:
        rt.memory.remember("tea at five")
        monkeypatch.setattr(ScopeState, "apply", failing)
        rt.memory.remember("boom")
        deadline = time.monotonic() + 10
        project = shelves(rt)[list(rt.memory._scopes).index("project")]
        while not project.broken and time.monotonic() < deadline:
            time.sleep(0.01)
        assert project.broken
        assert not project.settled
        assert project.inbox is not None
        assert project.inbox.puts == project.done  # idle, yet...
        read = rt.memory._in_place(lambda states: [f for s in states for f in s.all()])
        assert isinstance(read, door._Unsettled)  # ... not read in place
        rounds.clear()
        with pytest.raises(pykka.ActorDeadError):  # the stopped actor answers nothing
            rt.memory.search("tea")
        assert rounds == ["SearchStats"]


def test_a_closed_runtime_is_not_read_in_place(url: str, clock: ManualClock) -> None:
    """A closed runtime says so (RuntimeClosed), rather than answering from stopped actors."""
    rt = journaled.open(url, clock=clock)
    rt.memory.remember("tea at five")
    rt.close()
    assert not any(shelf.settled for shelf in shelves(rt))
    with pytest.raises(RuntimeClosed):
        rt.memory.search("tea")
