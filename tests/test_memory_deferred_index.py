"""ADR 0056 (M6, M12): memory folded on open without a snapshot is indexed by its first search.

Every test reopens a journal with its snapshots dropped, so the open folds the whole log, and
compares what memory answers with a fold from the start that indexes as it goes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deferred import (
    cold_fixture,  # noqa: F401  (the cold fixture)
    scope_states,
    searches,
    tear_indexing_at,
)
from in_place import eager_view, writer_of

import journaled
from journaled.actors.memory import MemoryWriter
from journaled.events.memory_state import memory_snapshot_key
from journaled.testing import ManualClock


def test_a_cold_open_indexes_nothing_and_the_first_search_answers_as_an_eager_fold(
    cold: tuple[Path, str, ManualClock],
) -> None:
    _, url, clock = cold
    with journaled.open(url, clock=clock, follow=None) as rt:
        states = scope_states(rt)
        assert any(s.pending for s in states)
        assert sum(len(s.index) for s in states) == 0  # the open tokenised no text
        fact = rt.memory.all()[0]
        assert rt.memory.get(fact.id) == fact  # reads that need no index answer at once
        assert sum(len(s.index) for s in states) == 0
        reference = eager_view(rt)
        assert searches(rt.memory) == searches(reference)
        assert not any(s.pending for s in states)
        assert sum(len(s.index) for s in states) == sum(
            len(s.index) for s in reference._state.scopes.values()
        )


def test_what_comes_after_a_cold_open_is_indexed_by_the_next_search(
    cold: tuple[Path, str, ManualClock],
) -> None:
    """A remember after the open waits for the next search to be indexed, as the open's facts
    do (ADR 0091); one that supersedes a fact the open left unindexed hides it all the same,
    before and after the first search."""
    _, url, clock = cold
    with journaled.open(url, clock=clock, follow=None) as rt:
        states = scope_states(rt)
        pending = sum(s.pending_count for s in states)
        rt.memory.remember("zeta newcomer after the open")
        assert sum(len(s.index) for s in states) == 0
        assert sum(s.pending_count for s in states) == pending + 1
        rt.memory.remember("deploy region is us-1", conflict_key="deploy.region")
        rt.memory.remember("tabs are gone", conflict_key="style.indent")
        assert any(s.pending for s in states)
        assert searches(rt.memory) == searches(eager_view(rt))
        rt.memory.remember("alpha after the first search")
        assert searches(rt.memory) == searches(eager_view(rt))


def test_a_search_stopped_part_way_through_a_fact_leaves_a_scope_that_is_rebuilt(
    cold: tuple[Path, str, ManualClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index holding part of a fact is never read: the scope is rebuilt from the journal."""
    _, url, clock = cold
    with journaled.open(url, clock=clock, follow=None) as rt:
        heal = tear_indexing_at(monkeypatch, 5)
        with pytest.raises(RuntimeError, match="stopped part way"):
            rt.memory.search("alpha")
        heal()
        assert searches(rt.memory) == searches(eager_view(rt))
        assert not any(s.torn for s in scope_states(rt))


def test_no_automatic_snapshot_builds_the_index_the_open_deferred(
    cold: tuple[Path, str, ManualClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The open's fold calls for a snapshot, whose export would build the whole index at once
    holding every scope: it waits for the first search (or the close), and then holds it."""
    _, url, clock = cold
    monkeypatch.setattr(MemoryWriter, "auto_snapshot_events", 10)
    monkeypatch.setattr(journaled.runtime, "SNAPSHOT_MIN_EVENTS", 10)
    with journaled.open(url, clock=clock, follow=None) as rt:
        key = memory_snapshot_key(None)
        rt._actors.catch_up()  # an ask queued behind the snapshot the open's fold called for
        assert writer_of(rt)._auto_snapshot_backoff > 0  # it was asked, and put off
        assert rt._journal.snapshot(key) is None
        assert sum(len(s.index) for s in scope_states(rt)) == 0
        searched = searches(rt.memory)
    with journaled.open(url, clock=clock, follow=None) as rt:
        assert rt._journal.snapshot(memory_snapshot_key(None)) is not None  # the close wrote it
        assert not any(s.pending for s in scope_states(rt))  # restored with its index
        assert searches(rt.memory) == searched == searches(eager_view(rt))
