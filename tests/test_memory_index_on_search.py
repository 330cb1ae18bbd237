"""ADR 0091 (M6, M12): a remember is indexed by the next search, not as it is stored.

The oracle is a fold from the journal's start that indexes as it goes (``eager_view``).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from deferred import fill, scope_states, searches, tear_indexing_at
from in_place import eager_view, writer_of

import journaled
from journaled.actors.memory import MemoryWriter
from journaled.events.memory_state import memory_snapshot_key
from journaled.testing import ManualClock


def _indexed(rt: journaled.Runtime) -> int:
    return sum(len(s.index) for s in scope_states(rt))


def test_a_remember_waits_for_the_next_search_to_be_indexed(tmp_path: Path) -> None:
    clock = ManualClock(1_000_000)
    with journaled.open(f"sqlite:///{tmp_path / 'j.sqlite'}", clock=clock, follow=None) as rt:
        fill(rt, clock)
        assert _indexed(rt) == 0  # nothing searched yet: nothing tokenised
        assert sum(s.pending_count for s in scope_states(rt)) >= len(rt.memory.all())
        assert searches(rt.memory) == searches(eager_view(rt))
        settled = _indexed(rt)
        assert settled > 0
        assert not any(s.pending for s in scope_states(rt))
        rt.memory.remember("zeta after the search", scope="user")
        rt.memory.remember("deploy region is us-9", conflict_key="deploy.region")
        assert _indexed(rt) == settled  # stored and readable, not yet indexed
        assert [f.text for f in rt.memory.all() if f.text.startswith("zeta")] == [
            "zeta after the search"
        ]
        assert searches(rt.memory) == searches(eager_view(rt))
        assert _indexed(rt) == settled + 1  # two in, and the deploy fact they supersede out


def test_remembers_without_a_search_still_snapshot_themselves_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A memory only written to is snapshotted as it goes: the export indexes what is pending,
    fewer facts than the snapshot is due for, and the snapshot holds that index (the next open
    is served by it: its facts come back indexed, and searches answer as a full fold)."""
    monkeypatch.setattr(MemoryWriter, "auto_snapshot_events", 20)
    url = f"sqlite:///{tmp_path / 'j.sqlite'}"
    clock = ManualClock(1_000_000)
    with journaled.open(url, clock=clock, follow=None) as rt:
        for i in range(50):
            rt.memory.remember(f"alpha fact {i} beta", scope=("user", "project")[i % 2])
            clock.advance(1)
        rt._actors.catch_up()  # behind the automatic snapshots the folds asked for
        snapshot = rt._journal.snapshot(memory_snapshot_key(None))
        assert snapshot is not None, "no automatic snapshot: pending facts put it off for good"
        assert writer_of(rt)._auto_snapshot_backoff == 0
        expected = searches(eager_view(rt))
        key = memory_snapshot_key(None)
    # The close stores no snapshot of its own for the few events after the last automatic one.
    with journaled.open(url, clock=clock, follow=None) as rt:
        assert rt._journal.snapshot(key) == snapshot
        assert _indexed(rt) >= 20  # what the automatic snapshot covered came back indexed
        assert searches(rt.memory) == expected


def test_searches_and_remembers_from_many_threads_answer_as_an_eager_fold(
    tmp_path: Path,
) -> None:
    """Threads remembering while others search: each search settles what was pending under
    the scopes' lock, and the end state answers as a fold from the start."""
    clock = ManualClock(1_000_000)
    with journaled.open(f"sqlite:///{tmp_path / 'j.sqlite'}", clock=clock, follow=None) as rt:
        fill(rt, clock, 12)
        errors: list[BaseException] = []
        stop = threading.Event()

        def remember(k: int) -> None:
            try:
                for i in range(40):
                    rt.memory.remember(f"alpha thread {k} fact {i}", scope="user")
                    if i % 7 == 0:
                        rt.memory.remember(f"tabs {k} {i}", conflict_key=f"style.{k}")
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        def search() -> None:
            try:
                while not stop.is_set():
                    rt.memory.search("alpha tabs", limit=5)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        writers = [threading.Thread(target=remember, args=(k,)) for k in range(3)]
        readers = [threading.Thread(target=search) for _ in range(2)]
        for t in [*writers, *readers]:
            t.start()
        for t in writers:
            t.join()
        stop.set()
        for t in readers:
            t.join()
        assert errors == []
        assert not any(s.torn for s in scope_states(rt))
        assert searches(rt.memory) == searches(eager_view(rt))


def test_a_search_interrupted_while_it_indexes_remembers_is_healed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error part way through indexing a pending remember leaves the scope torn, never read:
    memory is rebuilt from the journal and the next search answers exactly."""
    clock = ManualClock(1_000_000)
    with journaled.open(f"sqlite:///{tmp_path / 'j.sqlite'}", clock=clock, follow=None) as rt:
        fill(rt, clock, 9)
        rt.memory.search("alpha")
        for i in range(5):
            rt.memory.remember(f"alpha late {i}")
        heal = tear_indexing_at(monkeypatch, 3)
        with pytest.raises(RuntimeError, match="stopped part way"):
            rt.memory.search("alpha")
        heal()
        assert searches(rt.memory) == searches(eager_view(rt))
        assert not any(s.torn for s in scope_states(rt))
