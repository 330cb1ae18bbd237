"""ADR 0056 (M6, M12): memory folded on open without a snapshot is indexed by its first search.

Every test reopens a journal with its snapshots dropped, so the open folds the whole log, and
compares what memory answers with a fold from the start that indexes as it goes.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from in_place import eager_view, writer_of

import journaled
from journaled.actors.memory import MemoryWriter
from journaled.events.journal import SNAPSHOT_TABLE
from journaled.events.memory_state import ScopeState, memory_snapshot_key
from journaled.memory import MemoryView
from journaled.testing import ManualClock

QUERIES = ["alpha", "beta gamma", "deploy region", "rotate keys weekly", "tabs", "nothing here"]


def _fill(rt: journaled.Runtime, clock: ManualClock) -> None:
    """Facts of every kind a scope classifies: plain, keyed and superseded, expiring, doubtful,
    of a domain, in other scopes, deleted and purged."""
    for i in range(40):
        rt.memory.remember(f"alpha note {i} beta", scope=("project", "user", "session")[i % 3])
        clock.advance(1)
    for i in range(6):
        rt.memory.remember(f"deploy region is eu-{i}", conflict_key="deploy.region")
        clock.advance(1)
    rt.memory.remember("rotate keys weekly", confidence=0.4, domain="ops")
    rt.memory.remember("gamma until soon", valid_until=clock.now + 5)
    rt.memory.remember("beta gamma in the repository", scope="repository")
    doomed = rt.memory.remember("alpha doomed tabs")
    rt.memory.delete(doomed.id)
    erased = rt.memory.remember("alpha erased tabs secret")
    rt.memory.purge(erased.id)
    rt.memory.remember("tabs over spaces", conflict_key="style.indent")


def _drop_snapshots(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(f"DELETE FROM {SNAPSHOT_TABLE}")  # noqa: S608


def _states(rt: journaled.Runtime) -> list[ScopeState]:
    return [shelf.state for shelf in writer_of(rt).shelves.values()]


def _searches(memory: journaled.Memory | MemoryView) -> list[list[journaled.Fact]]:
    found = []
    for query in QUERIES:
        found.append(memory.search(query, limit=50))
        found.append(memory.search(query, limit=3))
        found.append(memory.search(query, scopes=["user", "session"], limit=50))
        found.append(memory.search(query, domains=["ops"], min_confidence=0.1, limit=50))
        found.append(memory.search(query, min_confidence=0.9, limit=50))
    return found


@pytest.fixture
def cold(tmp_path: Path) -> tuple[str, ManualClock]:
    """A journal of :func:`_fill`'s facts whose snapshots were dropped, and its clock (left at
    the last event's time: the eager fold answers as of then)."""
    path = tmp_path / "j.sqlite"
    url = f"sqlite:///{path}"
    clock = ManualClock(1_000_000)
    with journaled.open(url, clock=clock, follow=None) as rt:
        _fill(rt, clock)
    _drop_snapshots(path)
    return url, clock


def test_a_cold_open_indexes_nothing_and_the_first_search_answers_as_an_eager_fold(
    cold: tuple[str, ManualClock],
) -> None:
    url, clock = cold
    with journaled.open(url, clock=clock, follow=None) as rt:
        states = _states(rt)
        assert any(s.pending for s in states)
        assert sum(len(s.index) for s in states) == 0  # the open tokenised no text
        fact = rt.memory.all()[0]
        assert rt.memory.get(fact.id) == fact  # reads that need no index answer at once
        assert sum(len(s.index) for s in states) == 0
        reference = eager_view(rt)
        assert _searches(rt.memory) == _searches(reference)
        assert not any(s.pending for s in states)
        assert sum(len(s.index) for s in states) == sum(
            len(s.index) for s in reference._state.scopes.values()
        )


def test_what_comes_after_a_cold_open_is_indexed_as_it_comes(
    cold: tuple[str, ManualClock],
) -> None:
    """A remember after the open is indexed at once; one that supersedes a fact the open left
    unindexed hides it all the same, before and after the first search."""
    url, clock = cold
    with journaled.open(url, clock=clock, follow=None) as rt:
        states = _states(rt)
        before = sum(len(s.index) for s in states)
        rt.memory.remember("zeta newcomer after the open")
        assert sum(len(s.index) for s in states) == before + 1
        rt.memory.remember("deploy region is us-1", conflict_key="deploy.region")
        rt.memory.remember("tabs are gone", conflict_key="style.indent")
        assert any(s.pending for s in states)
        assert _searches(rt.memory) == _searches(eager_view(rt))
        rt.memory.remember("alpha after the first search")
        assert _searches(rt.memory) == _searches(eager_view(rt))


def test_a_search_stopped_part_way_through_a_fact_leaves_a_scope_that_is_rebuilt(
    cold: tuple[str, ManualClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index holding part of a fact is never read: the scope is rebuilt from the journal."""
    url, clock = cold
    real = ScopeState._classify_now
    calls = [0]

    def tearing(state: ScopeState, fact: journaled.Fact) -> None:
        calls[0] += 1
        if calls[0] == 5:
            state.index.add(fact.id, fact.text)  # the index has it, its class not yet
            raise RuntimeError("stopped part way")
        real(state, fact)

    with journaled.open(url, clock=clock, follow=None) as rt:
        monkeypatch.setattr(ScopeState, "_classify_now", tearing)
        with pytest.raises(RuntimeError, match="stopped part way"):
            rt.memory.search("alpha")
        monkeypatch.setattr(ScopeState, "_classify_now", real)
        assert _searches(rt.memory) == _searches(eager_view(rt))
        assert not any(s.torn for s in _states(rt))


def test_no_automatic_snapshot_builds_the_index_the_open_deferred(
    cold: tuple[str, ManualClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The open's fold calls for a snapshot, whose export would build the whole index at once
    holding every scope: it waits for the first search (or the close), and then holds it."""
    url, clock = cold
    monkeypatch.setattr(MemoryWriter, "auto_snapshot_events", 10)
    monkeypatch.setattr(journaled.runtime, "SNAPSHOT_MIN_EVENTS", 10)
    with journaled.open(url, clock=clock, follow=None) as rt:
        key = memory_snapshot_key(None)
        rt._actors.catch_up()  # an ask queued behind the snapshot the open's fold called for
        assert writer_of(rt)._auto_snapshot_backoff > 0  # it was asked, and put off
        assert rt._journal.snapshot(key) is None
        assert sum(len(s.index) for s in _states(rt)) == 0
        searched = _searches(rt.memory)
    with journaled.open(url, clock=clock, follow=None) as rt:
        assert rt._journal.snapshot(memory_snapshot_key(None)) is not None  # the close wrote it
        assert not any(s.pending for s in _states(rt))  # restored with its index
        assert _searches(rt.memory) == searched == _searches(eager_view(rt))
