"""Attacks on ADR 0056: memory opened cold defers its search index to the first search.

The oracle and the journal are ``deferred``'s (a fold from the start that indexes as it goes).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from deferred import (
    QUERIES,
    cold_fixture,  # noqa: F401  (the cold fixture)
    cold_journal,
    fill,
    scope_states,
    searches,
)
from in_place import (
    Interrupt,
    eager_view,
    interrupting_signal,  # noqa: F401  (the sigusr1_raises fixture)
    writer_of,
)

import journaled
from journaled.actors.scope import ScopeShelf
from journaled.events.memory_state import ScopeState, memory_snapshot_key
from journaled.memory import Memory
from journaled.runtime import verify
from journaled.testing import ManualClock

WAIT = 10.0


def _shelves(rt: journaled.Runtime) -> list[ScopeShelf]:
    return list(writer_of(rt).shelves.values())


def _interrupt_here() -> None:
    """Send SIGUSR1 to this (the main) thread and spin until its handler raises."""
    signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
    spins = 0
    while True:  # pure bytecode: the handler runs at the loop's next check
        spins += 1
        if spins > 10**8:
            raise AssertionError("the signal was not handled")


class _Deleting(dict[str, None]):
    """A scope's pending facts; the ``at``-th one settled (deleted from it) lands an interrupt
    right after: between two facts, where ``settle`` promises to go on from."""

    def __init__(self, pending: dict[str, None], counter: list[int], at: int) -> None:
        super().__init__(pending)
        self.counter = counter
        self.at = at

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self.counter[0] += 1
        if self.counter[0] == self.at and threading.current_thread() is threading.main_thread():
            _interrupt_here()


def _interrupt_between_facts(states: list[ScopeState], at: int) -> None:
    counter = [0]
    for state in states:
        state._touched = _Deleting(state._touched, counter, at)


class _SecondInterrupt(list[ScopeShelf]):
    """The door's shelves; once armed, iterating them lands a second interrupt after the first
    shelf (a second Ctrl-C, while the door looks at the scopes)."""

    armed = False

    def __iter__(self) -> Iterator[ScopeShelf]:
        items = list(super().__iter__())
        for n, item in enumerate(items):
            if n == 1 and self.armed:
                self.armed = False
                _interrupt_here()
            yield item


# -- interrupts ----------------------------------------------------------------------------------


def test_a_torn_scope_is_broken_at_once_and_a_second_interrupt_cannot_leave_it_readable(
    cold: tuple[Path, str, ManualClock], monkeypatch: pytest.MonkeyPatch, sigusr1_raises: None
) -> None:
    """ADR 0056: a first search interrupted part way through a fact leaves that scope broken the
    moment its state is torn, with no handler to run: a second interrupt (Ctrl-C twice), landing
    in the next read before it heals, cannot leave it readable, and the read after that is
    rebuilt and exact. (Found by an attack pass: the shelf was marked broken in an ``except``
    handler that the second interrupt cut short, and the next search raised.)"""
    _, url, clock = cold
    real = ScopeState._classify_now
    with journaled.open(url, clock=clock, follow=None) as rt:
        shelves = _SecondInterrupt(rt.memory._shelves)
        monkeypatch.setattr(rt.memory, "_shelves", shelves)

        def tearing(state: ScopeState, fact: journaled.Fact) -> None:
            if (
                state.physical == "project"
                and threading.current_thread() is threading.main_thread()
            ):
                monkeypatch.setattr(ScopeState, "_classify_now", real)
                state.index.add(fact.id, fact.text)  # the index has part of the fact
                shelves.armed = True
                _interrupt_here()
            real(state, fact)

        monkeypatch.setattr(ScopeState, "_classify_now", tearing)
        with pytest.raises(Interrupt):
            rt.memory.search("alpha")
        torn = [shelf for shelf in writer_of(rt).shelves.values() if shelf.state.torn]
        assert torn
        assert all(shelf.broken for shelf in torn)
        with pytest.raises(Interrupt):  # the second, in the next read's look at the scopes
            rt.memory.search("alpha")
        assert not shelves.armed
        reference = eager_view(rt)
        assert rt.memory.search("alpha", limit=50) == reference.search("alpha", limit=50)


@pytest.mark.parametrize("after", [False, True], ids=["inside-a-fact", "end-of-a-fact"])
@pytest.mark.parametrize("call", [1, 7, 30, 45])
def test_an_interrupt_anywhere_in_the_first_search_leaves_memory_exact(
    cold: tuple[Path, str, ManualClock],
    monkeypatch: pytest.MonkeyPatch,
    sigusr1_raises: None,
    call: int,
    after: bool,
) -> None:
    """One real signal during the first search's settle, delivered inside a fact's indexing
    (torn: rebuilt) or just after it (between facts: the next search goes on); then remembers,
    gets and searches answer as the eager fold, and the close's snapshot serves a reopen."""
    _, url, clock = cold
    real = ScopeState._classify_now
    calls = [0]

    def interrupting(state: ScopeState, fact: journaled.Fact) -> None:
        calls[0] += 1
        if calls[0] == call and threading.current_thread() is threading.main_thread():
            if after:
                real(state, fact)
            signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
            if not after:
                real(state, fact)
            return
        real(state, fact)

    with journaled.open(url, clock=clock, follow=None) as rt:
        monkeypatch.setattr(ScopeState, "_classify_now", interrupting)
        with pytest.raises(Interrupt):
            rt.memory.search("alpha")
        monkeypatch.setattr(ScopeState, "_classify_now", real)
        some = rt.memory.all()[3]
        assert rt.memory.get(some.id) == some
        rt.memory.remember("zeta after the interrupt")
        rt.memory.remember("deploy region is us-9", conflict_key="deploy.region")
        assert searches(rt.memory) == searches(eager_view(rt))
        assert not any(s.torn or s.pending for s in scope_states(rt))
        assert rt.memory.checkpoint()
        searched = searches(rt.memory)
    with journaled.open(url, clock=clock, follow=None) as rt:
        assert rt._journal.snapshot(memory_snapshot_key(None)) is not None
        assert searches(rt.memory) == searched == searches(eager_view(rt))
        assert verify(url).ok


def test_concurrent_first_searches_in_place_and_by_message_while_remembering(
    tmp_path: Path,
) -> None:
    """Several threads make the first search at once, some reading in place and some through
    a door without shelves (by message), while others remember: no error, each search finds
    every alpha fact, and memory ends as the eager fold."""
    _, url, clock = cold_journal(tmp_path, n=600)
    with journaled.open(url, clock=clock, follow=None) as rt:
        assert any(s.pending for s in scope_states(rt))
        by_message = Memory(rt._journal, rt._actors.writer, rt._actors.scopes, clock, None, None)
        expected = {f.id for f in eager_view(rt).search("alpha", limit=10_000)}
        errors: list[BaseException] = []
        found: list[set[str]] = []
        start = threading.Barrier(8)

        def search(door: Memory) -> None:
            try:
                start.wait(WAIT)
                found.append({f.id for f in door.search("alpha", limit=10_000)})
            except BaseException as exc:
                errors.append(exc)

        def remember(i: int) -> None:
            try:
                start.wait(WAIT)
                for j in range(5):
                    rt.memory.remember(f"zeta {i} {j}", conflict_key=f"k{j % 2}")
            except BaseException as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=search, args=(rt.memory if i % 2 else by_message,))
            for i in range(5)
        ] + [threading.Thread(target=remember, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT * 3)
        assert not errors, errors
        assert found == [expected] * 5
        assert searches(rt.memory) == searches(eager_view(rt))
        assert searches(by_message) == searches(eager_view(rt))


# -- changes to facts still pending -------------------------------------------------------------


def test_deletes_purges_and_restores_of_pending_facts_before_and_after_the_first_search(
    cold: tuple[Path, str, ManualClock],
) -> None:
    """Facts the open left unindexed are deleted, purged, superseded, restored (their
    superseder deleted) and re-linked, before the first search and after it."""
    _, url, clock = cold
    with journaled.open(url, clock=clock, follow=None) as rt:
        facts = {f.text: f for f in rt.memory.all()}
        rt.memory.delete(facts["alpha note 0 beta"].id)
        rt.memory.purge(facts["alpha note 1 beta"].id)
        rt.memory.delete(facts["deploy region is eu-5"].id)  # eu-4 is restored
        rt.memory.delete(facts["tabs are wide"].id)
        clock.advance(1)
        gone = rt.memory.remember("tabs temporary", conflict_key="style.indent")
        assert any(s.pending for s in scope_states(rt))
        assert searches(rt.memory) == searches(eager_view(rt))
        rt.memory.delete(gone.id)  # "tabs over spaces", indexed by the search, comes back
        rt.memory.delete(facts["deploy region is eu-4"].id)
        rt.memory.purge(facts["alpha note 2 beta"].id)
        assert searches(rt.memory) == searches(eager_view(rt))
        view = rt.memory.as_of(position=rt.journal.position() - 3)
        assert searches(view) == searches(eager_view(rt, view.position))  # ADR 0064


def test_a_rebuild_while_facts_are_pending_answers_exactly(
    cold: tuple[Path, str, ManualClock],
) -> None:
    """A scope marked broken before any search: the writer rebuilds every scope from the
    journal (deferring the index to the next search, ADR 0091), and searches then answer as
    the eager fold."""
    _, url, clock = cold
    with journaled.open(url, clock=clock, follow=None) as rt:
        with _shelves(rt)[0].lock:
            _shelves(rt)[0].broken = True
        rt.memory.remember("zeta during the rebuild")
        assert not any(s.broken for s in _shelves(rt))
        assert sum(len(s.index) for s in scope_states(rt)) == 0
        # every fact waits (and the ones deleted or purged since, which settling skips)
        assert sum(s.pending_count for s in scope_states(rt)) >= len(rt.memory.all())
        assert searches(rt.memory) == searches(eager_view(rt))


# -- two runtimes ------------------------------------------------------------------------------


def test_a_catch_up_onto_pending_facts_of_another_runtimes_changes(
    cold: tuple[Path, str, ManualClock],
) -> None:
    """Two runtimes open the same cold journal; one supersedes, deletes and purges facts both
    left unindexed; the other folds that while its facts are pending, then searches."""
    _, url, clock = cold
    with (
        journaled.open(url, clock=clock, follow=None) as here,
        journaled.open(url, clock=clock, follow=None) as other,
    ):
        facts = {f.text: f for f in here.memory.all()}
        here.memory.remember("deploy region is us-1", conflict_key="deploy.region")
        here.memory.delete(facts["tabs are wide"].id)
        here.memory.purge(facts["alpha note 3 beta"].id)
        here.memory.remember("zeta from here")
        other._actors.catch_up()
        assert any(s.pending for s in scope_states(other))
        assert searches(other.memory) == searches(eager_view(other))
        here.memory.delete(facts["deploy region is eu-5"].id)
        other._actors.catch_up()
        assert searches(other.memory) == searches(eager_view(other))
        assert searches(here.memory) == searches(eager_view(here))


def test_a_follower_folding_while_the_first_search_settles(tmp_path: Path) -> None:
    """A following runtime folds another's remembers while its first search builds the index
    (the fold waits for the scopes' lock): its answers then equal the eager fold."""
    _, url, clock = cold_journal(tmp_path, n=1500)
    with (
        journaled.open(url, clock=clock, follow=0.01) as other,
        journaled.open(url, clock=clock, follow=None) as here,
    ):
        done = threading.Event()

        def write() -> None:
            for i in range(30):
                here.memory.remember(f"alpha zeta {i}", conflict_key=f"z{i % 3}")
            done.set()

        writer = threading.Thread(target=write)
        writer.start()
        first = other.memory.search("alpha", limit=10_000)
        assert first
        writer.join(WAIT)
        assert done.is_set()
        deadline = time.monotonic() + WAIT
        while other._actors.catch_up() < here.journal.position():
            assert time.monotonic() < deadline
        assert searches(other.memory) == searches(eager_view(other))


# -- snapshots -----------------------------------------------------------------------------------


def test_the_close_snapshot_after_a_cold_open_and_a_partial_settle_passes_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sigusr1_raises: None
) -> None:
    """The first search is interrupted between facts; the close's snapshot settles the rest.
    ``journal verify`` compares it with an eager fold (index content included), and the
    reopen restored from it answers exactly."""
    _, url, clock = cold_journal(tmp_path, n=520)
    with journaled.open(url, clock=clock, follow=None) as rt:
        _interrupt_between_facts(scope_states(rt), 100)
        with pytest.raises(Interrupt):
            rt.memory.search("alpha")
        assert any(s.pending for s in scope_states(rt))
        assert not any(s.torn for s in scope_states(rt))
    with journaled.open(url, clock=clock, follow=None) as rt:
        assert rt._journal.snapshot(memory_snapshot_key(None)) is not None
        assert not any(s.pending for s in scope_states(rt))
        assert searches(rt.memory) == searches(eager_view(rt))
    report = verify(url)
    assert report.ok, report
    assert report.snapshots >= 1, report


def test_a_cold_open_with_no_search_writes_an_exact_snapshot_at_close(tmp_path: Path) -> None:
    _, url, clock = cold_journal(tmp_path, n=520)
    with journaled.open(url, clock=clock, follow=None) as rt:
        assert any(s.pending for s in scope_states(rt))
        rt.memory.remember("zeta never searched")
    report = verify(url)
    assert report.ok, report
    assert report.snapshots >= 1, report
    with journaled.open(url, clock=clock, follow=None) as rt:
        assert searches(rt.memory) == searches(eager_view(rt))


# -- semantic and hybrid ------------------------------------------------------------------------


class _Letters:
    """A deterministic embedder: counts of a few letters."""

    def embed(self, texts: list[str]) -> list[list[float]]:
        return [[float(t.count(c)) + 0.1 for c in "aeiotz"] for t in texts]


def test_hybrid_and_semantic_first_searches_after_a_cold_open(
    cold: tuple[Path, str, ManualClock],
) -> None:
    _, url, clock = cold
    with journaled.open(url, clock=clock, follow=None, embedder=_Letters()) as rt:
        reference = eager_view(rt)
        for query in QUERIES:
            assert rt.memory.search_hybrid(query, limit=20) == reference.search_hybrid(
                query, limit=20
            )
            assert rt.memory.search_semantic(query, limit=20) == reference.search_semantic(
                query, limit=20
            )
        assert searches(rt.memory) == searches(reference)


# -- views -----------------------------------------------------------------------------------


def test_an_as_of_view_interrupted_between_facts_goes_on_exactly(
    cold: tuple[Path, str, ManualClock], monkeypatch: pytest.MonkeyPatch, sigusr1_raises: None
) -> None:
    _, url, clock = cold
    with journaled.open(url, clock=clock, follow=None) as rt:
        position = rt.journal.position() - 5
        view = rt.memory.as_of(position=position)
        _interrupt_between_facts(list(view._state.scopes.values()), 10)
        with pytest.raises(Interrupt):
            view.search("alpha")
        assert not any(s.torn for s in view._state.scopes.values())
        assert searches(view) == searches(eager_view(rt, view.position))


# -- PostgreSQL ----------------------------------------------------------------------------------


def test_a_cold_open_on_postgresql_and_a_catch_up_onto_pending_facts(pg_url: str) -> None:
    """On PostgreSQL (fewer events than any snapshot waits for, so every open folds the log):
    the first search after a cold open, and a second runtime's changes folded onto pending
    facts, answer as the eager fold."""
    clock = ManualClock(1_000_000)
    with journaled.open(pg_url, clock=clock, follow=None) as rt:
        fill(rt, clock)
    with (
        journaled.open(pg_url, clock=clock, follow=None) as here,
        journaled.open(pg_url, clock=clock, follow=None) as other,
    ):
        assert here._journal.snapshot(memory_snapshot_key(None)) is None
        assert any(s.pending for s in scope_states(other))
        facts = {f.text: f for f in here.memory.all()}
        here.memory.remember("deploy region is us-1", conflict_key="deploy.region")
        here.memory.delete(facts["tabs are wide"].id)
        here.memory.purge(facts["alpha note 3 beta"].id)
        other._actors.catch_up()
        assert searches(other.memory) == searches(eager_view(other))
        assert searches(here.memory) == searches(eager_view(here))


def test_an_as_of_view_interrupted_part_way_through_a_fact_says_to_take_a_new_one(
    cold: tuple[Path, str, ManualClock], monkeypatch: pytest.MonkeyPatch, sigusr1_raises: None
) -> None:
    """ADR 0056: a view of the past has no owner to rebuild it. Interrupted part way through a
    fact, its later searches raise ``IndexTorn``, which says to take a new view, and never
    answer from half an index; a new view answers exactly. (Found by an attack pass: it raised
    a bare RuntimeError that said nothing of what to do.)"""
    _, url, clock = cold
    real = ScopeState._classify_now
    calls = [0]

    def interrupting(state: ScopeState, fact: journaled.Fact) -> None:
        calls[0] += 1
        if calls[0] == 10:
            signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
        real(state, fact)

    with journaled.open(url, clock=clock, follow=None) as rt:
        position = rt.journal.position() - 5
        view = rt.memory.as_of(position=position)
        monkeypatch.setattr(ScopeState, "_classify_now", interrupting)
        with pytest.raises(Interrupt):
            view.search("alpha")
        monkeypatch.setattr(ScopeState, "_classify_now", real)
        assert any(s.torn for s in view._state.scopes.values())
        with pytest.raises(journaled.IndexTorn, match=r"take a new one with memory\.as_of"):
            view.search("alpha")
        again = rt.memory.as_of(position=position)
        assert searches(again) == searches(eager_view(rt, again.position))


def test_a_close_during_the_first_search(tmp_path: Path) -> None:
    """The runtime is closed while another thread's first search builds the index: the search
    answers (or says the runtime is closed), and the close's snapshot is exact."""
    _, url, clock = cold_journal(tmp_path, n=1500)
    outcome: list[object] = []
    rt = journaled.open(url, clock=clock, follow=None)
    expected = eager_view(rt).search("alpha", limit=20)
    started = threading.Event()
    real = ScopeState._classify_now

    def slow_start(state: ScopeState, fact: journaled.Fact) -> None:
        started.set()
        real(state, fact)

    def search() -> None:
        try:
            outcome.append(rt.memory.search("alpha", limit=20))
        except BaseException as exc:
            outcome.append(exc)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ScopeState, "_classify_now", slow_start)
        thread = threading.Thread(target=search)
        thread.start()
        assert started.wait(WAIT)
        rt.close()
        thread.join(WAIT)
    assert outcome, "the search never returned"
    assert outcome[0] == expected or isinstance(outcome[0], journaled.RuntimeClosed), outcome
    report = verify(url)
    assert report.ok, report
    assert report.snapshots >= 1, report
