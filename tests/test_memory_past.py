"""memory.as_of: a lazy index and a start from memory's snapshot answer as a full fold (M12, T1).

The reference is how ``as_of`` folded before: every event from the journal's start into a
:class:`MemoryState` that indexes each text as it comes, with every payload read up front.
"""

from __future__ import annotations

import threading

import msgspec
import pytest
from in_place import eager_view

import journaled
from journaled.events.journal import Journal
from journaled.events.memory_state import ScopeState
from journaled.memory import MemoryView
from journaled.testing import ManualClock

QUERIES = ["alpha", "beta gamma", "deploy region", "secret", "rotate keys weekly", "nothing"]
SECRET = "purge-me-secret-token"


def _answers(view: MemoryView, ids: list[str], nows: list[int]) -> object:
    """Every answer a view gives: its position, get of each id, all, and searches then."""
    return msgspec.json.encode(
        [
            view.position,
            [view.get(i) for i in ids],
            view.all(),
            [view.search(q) for q in QUERIES],
            [[view.search(q, now=n, limit=3) for q in QUERIES] for n in nows],
            [view.search(q, domains=["ops"], min_confidence=0.6) for q in QUERIES],
            [view.search_semantic(q) for q in QUERIES],
        ]
    )


def _story(rt: journaled.Runtime, clock: ManualClock) -> tuple[list[str], list[int]]:
    """Remember, supersede, expire, delete and purge facts; snapshot memory twice on the way.

    Returns every fact id and a few times to search at (around the expiries).
    """
    m = rt.memory
    ids: list[str] = []
    t0 = clock.now
    ids.append(m.remember("alpha beta facts about the deploy region", domain="ops").id)
    ids.append(m.remember("deploy region is eu-west", conflict_key="region", domain="ops").id)
    ids.append(m.remember("gamma rays and beta decay", confidence=0.5).id)
    ids.append(m.remember("rotate keys weekly", valid_until=t0 + 40, domain="ops").id)
    ids.append(m.remember(f"{SECRET} alpha", domain="ops").id)
    assert m.checkpoint()  # a snapshot before the supersessions and the purge
    ids.append(m.remember("deploy region is us-east", conflict_key="region", domain="ops").id)
    ids.append(
        m.remember(
            "deploy region is ap-south", conflict_key="region", valid_until=t0 + 60, domain="ops"
        ).id
    )
    ids.append(m.remember("beta gamma delta", valid_from=t0 + 30).id)
    m.delete(ids[5])  # heals the chain: the region fact it superseded is current again
    m.delete(ids[0])
    assert m.purge(ids[4])
    ids.append(m.remember("rotate keys weekly and monthly", domain="ops", confidence=0.8).id)
    assert m.checkpoint()  # a snapshot after the purge
    ids.append(m.remember("alpha after the last snapshot").id)
    m.delete(ids[2])
    return ids, [t0 + 10, t0 + 50, t0 + 100]


def test_as_of_answers_as_a_full_fold_at_every_position(
    journal_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """M12/T1: at every position, as_of answers get/all/search as a full fold, never reading
    memory's snapshot (a cache the past is not answered from, ADR 0034)."""
    with journaled.open(journal_url, clock=clock) as rt:
        ids, nows = _story(rt, clock)
        end = rt.journal.position()
        read_snapshot = Journal.snapshot

        def no_snapshot(self: object, stream: str) -> object:
            if stream.startswith("memory:"):
                raise AssertionError(f"as_of read the snapshot {stream}")
            return read_snapshot(self, stream)  # type: ignore[arg-type]

        monkeypatch.setattr(Journal, "snapshot", no_snapshot)
        for position in range(end + 1):
            view = rt.memory.as_of(position=position)
            # Inside one append, the view is taken at its end (J2, ADR 0064).
            assert view.position == rt._journal.commit_end(position) >= position
            expected = eager_view(rt, view.position)
            assert _answers(view, ids, nows) == _answers(expected, ids, nows), position
        for at in [0, *nows, clock.now]:
            view = rt.memory.as_of(at=at)
            assert _answers(view, ids, nows) == _answers(eager_view(rt, at=at), ids, nows), at


def test_a_purged_text_reaches_every_past_view(sqlite_url: str, clock: ManualClock) -> None:
    """T1/R2: after a purge no view of any position holds the text, snapshot or not."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        fact = rt.memory.remember(f"{SECRET} in a fact")
        rt.memory.remember("another fact")
        assert rt.memory.checkpoint()
        before = rt.journal.position()
        assert SECRET in msgspec.json.encode(rt.memory.as_of(position=before).all()).decode()
        assert rt.memory.purge(fact.id)
        rt.memory.remember("a fact after the purge")
        assert rt.memory.checkpoint()
        end = rt.journal.position()
        for position in range(end + 1):
            view = rt.memory.as_of(position=position)
            assert SECRET not in msgspec.json.encode(view.all()).decode(), position
            assert view.search("secret token") == []  # its words were never indexed again


def test_a_past_view_indexes_only_when_searched(sqlite_url: str, clock: ManualClock) -> None:
    """T1: get and all on a past view build no search index; the first search builds it once."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        fact = rt.memory.remember("alpha beta gamma")
        view = rt.memory.as_of(position=rt.journal.position())
        scopes = list(view._state.scopes.values())
        assert view.get(fact.id) == fact
        assert [f.id for f in view.all()] == [fact.id]
        assert all(len(s.index) == 0 for s in scopes)
        assert view.search("beta") == [fact]
        assert sum(len(s.index) for s in scopes) == 1


def test_concurrent_first_searches_wait_for_the_whole_index(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T1/M12: a search racing a view's first one waits for its whole index, never a part."""
    with journaled.open(sqlite_url) as rt:
        for i in range(5):
            rt.memory.remember(f"alpha note {i}")
        view = rt.memory.as_of(position=rt.journal.position())
        expected = eager_view(rt, view.position).search("alpha")
        assert len(expected) == 5
        started, release = threading.Event(), threading.Event()
        original = ScopeState._classify_now

        def slow(state: ScopeState, fact: journaled.Fact) -> None:
            if not started.is_set():
                started.set()
                release.wait(5.0)
            original(state, fact)

        monkeypatch.setattr(ScopeState, "_classify_now", slow)
        found: dict[str, list[journaled.Fact]] = {}

        def search(name: str) -> None:
            found[name] = view.search("alpha")

        first = threading.Thread(target=search, args=("first",))
        first.start()
        assert started.wait(5.0)
        second = threading.Thread(target=search, args=("second",))
        second.start()
        second.join(0.2)  # it waits on the index being built (without the lock: it answers [])
        release.set()
        first.join(5.0)
        second.join(5.0)
        assert found == {"first": expected, "second": expected}
