"""memory.as_of: a lazy index and a start from memory's snapshot answer as a full fold (M12, T1).

The reference is how ``as_of`` folded before: every event from the journal's start into a
:class:`MemoryState` that indexes each text as it comes, with every payload read up front.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading

import msgspec
import pytest
from in_place import eager_view

import journaled
from journaled.events.journal import Journal
from journaled.events.memory_past import PastCheckpoints, past_memory
from journaled.events.memory_state import MemoryState, ScopeState
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


# -- checkpoints of memory's past (T1, ADR 0034's update) -------------------------------------


@pytest.mark.parametrize("order", ["forward", "backward", "shuffled"])
@pytest.mark.parametrize("budget", [10**6, 12])
def test_views_started_from_checkpoints_answer_as_a_full_fold(
    journal_url: str, clock: ManualClock, order: str, budget: int
) -> None:
    """T1, M12: views at every position, taken in any order, start from the checkpoints the
    earlier views left (one every position here; with a budget of 12 facts, thinned and
    refused) and answer get/all/search as a full fold from the journal's start."""
    with journaled.open(journal_url, clock=clock) as rt:
        ids, nows = _story(rt, clock)
        end = rt.journal.position()
        rt.memory._past_checkpoints = PastCheckpoints(budget=budget, least_every=1)
        positions = list(range(end + 1))
        if order == "backward":
            positions.reverse()
        elif order == "shuffled":
            random.Random(7).shuffle(positions)
        for position in positions:
            view = rt.memory.as_of(position=position)
            expected = eager_view(rt, view.position)
            assert _answers(view, ids, nows) == _answers(expected, ids, nows), position
        held = rt.memory._past_checkpoints.positions
        if budget == 12:  # few, or none when a state alone is over it
            assert len(held) < end // 2
        else:
            assert held  # the views left checkpoints


def test_a_view_folds_only_the_events_after_the_nearest_checkpoint(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T1: once a view left checkpoints, a view at any position reads the journal from the
    nearest one at or before it, at most ``every`` positions, never from the start."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        for i in range(300):
            rt.memory.remember(f"fact {i} about topic {i % 7}", conflict_key=f"k{i % 40}")
        end = rt.journal.position()
        rt.memory._past_checkpoints = PastCheckpoints(least_every=16)
        rt.memory.as_of(position=end)  # the first view: a full fold, checkpoints on the way
        checkpoints = rt.memory._past_checkpoints
        assert len(checkpoints.positions) >= 8
        read = Journal.read
        starts: list[int] = []
        me = threading.get_ident()

        def counted(self: Journal, after: int = 0, **kwargs: object) -> object:
            if threading.get_ident() == me:  # the view's own reads, not the writer's catch-ups
                starts.append(after)
            return read(self, after, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(Journal, "read", counted)
        for position in range(checkpoints.positions[0], end + 1, 17):
            view = rt.memory.as_of(position=position)
            assert 0 <= view.position - starts[-1] < checkpoints.every + 64, position
            expected = eager_view(rt, view.position)
            assert msgspec.json.encode(view.all()) == msgspec.json.encode(expected.all())


def test_a_purge_drops_the_checkpoints_in_this_process_and_from_another(
    sqlite_url: str, clock: ManualClock
) -> None:
    """T1, R2: checkpoints hold texts; after a purge (by this runtime, or by another process on
    the same file) no view of any position holds the purged text, checkpoints or not."""
    secret_two = "second-purged-secret"
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.memory._past_checkpoints = PastCheckpoints(least_every=1)
        fact = rt.memory.remember(f"{SECRET} in a fact")
        other = rt.memory.remember(f"{secret_two} in another")
        for i in range(20):
            rt.memory.remember(f"filler {i}")
        end = rt.journal.position()
        for position in range(end + 1):  # checkpoints everywhere, holding both texts
            rt.memory.as_of(position=position)
        assert SECRET in msgspec.json.encode(rt.memory.as_of(position=end).all()).decode()
        assert rt.memory.purge(fact.id)
        for position in range(end + 1):
            assert (
                SECRET not in msgspec.json.encode(rt.memory.as_of(position=position).all()).decode()
            )
        code = (
            "import sys, journaled\n"
            "with journaled.open(sys.argv[1]) as rt:\n"
            "    assert rt.memory.purge(sys.argv[2])\n"
        )
        subprocess.run([sys.executable, "-c", code, sqlite_url, other.id], check=True, timeout=60)
        for position in range(end + 1):
            shown = msgspec.json.encode(rt.memory.as_of(position=position).all()).decode()
            assert secret_two not in shown, position


def _internals(state: MemoryState) -> object:
    """Everything a past state holds, in a comparable form."""
    return [
        state.position,
        [
            (
                physical,
                scope.facts,
                list(scope._touched),
                scope._superseder_until,
                {k: sorted(v) for k, v in scope._listed_by.items()},
                {k: sorted(v) for k, v in scope._by_key.items()},
                sorted(scope._erased),
            )
            for physical, scope in sorted(state.scopes.items())
        ],
    ]


def test_a_checkpoint_never_changes_once_kept(journal_url: str, clock: ManualClock) -> None:
    """T1: views folded on from a checkpoint (superseding, relinking, deleting past it) and
    searched leave it as it was kept: each checkpoint equals a fresh fold to its position."""
    with journaled.open(journal_url, clock=clock) as rt:
        _story(rt, clock)
        end = rt.journal.position()
        checkpoints = PastCheckpoints(least_every=1)
        rt.memory._past_checkpoints = checkpoints
        positions = list(range(end + 1))
        random.Random(3).shuffle(positions)
        for position in positions:
            rt.memory.as_of(position=position).search("deploy region")
        assert checkpoints.positions
        journal = rt.memory._journal
        texts = journal.payloads()
        for held, state, _ in checkpoints._held:
            plain = past_memory(list(rt.memory._scopes), rt.memory._organization)
            for event in journal.read(upto=held):  # to the very position, inside an append too
                plain.apply(event, texts)
            assert _internals(state) == _internals(plain), held
            # The route is shared and only grows: it holds the plain fold's, as it was.
            assert {k: state.route[k] for k in plain.route} == plain.route, held


def test_views_from_several_threads_share_the_checkpoints(
    sqlite_url: str, clock: ManualClock
) -> None:
    """T1: four threads taking views at random positions at once each get a full fold's
    answers, while they leave and start from the same checkpoints."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        ids, nows = _story(rt, clock)
        for i in range(60):
            rt.memory.remember(f"filler {i} alpha", conflict_key=f"f{i % 9}")
        end = rt.journal.position()
        rt.memory._past_checkpoints = PastCheckpoints(least_every=4)
        expected = {p: _answers(eager_view(rt, p), ids, nows) for p in range(end + 1)}
        wrong: list[int] = []

        def views(seed: int) -> None:
            for position in random.Random(seed).sample(range(end + 1), 40):
                view = rt.memory.as_of(position=position)
                if _answers(view, ids, nows) != expected[view.position]:
                    wrong.append(position)

        threads = [threading.Thread(target=views, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert wrong == []
        assert rt.memory._past_checkpoints.positions


def test_the_budget_counts_the_ids_a_fold_touched_and_a_state_over_it_is_not_kept(
    sqlite_url: str, clock: ManualClock
) -> None:
    """T1: a checkpoint holds its facts and the ids its fold touched (a deleted fact's too):
    both count against the budget, so churned facts do not pile up checkpoints; and a first
    view whose state alone is over the budget keeps none."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        for i in range(600):
            rt.memory.delete(rt.memory.remember(f"scratch note {i}").id)
        end = rt.journal.position()
        checkpoints = PastCheckpoints(budget=100, least_every=64)
        rt.memory._past_checkpoints = checkpoints
        for position in range(0, end + 1, 37):
            rt.memory.as_of(position=position)
        held = [state for _, state, _ in checkpoints._held]
        assert sum(len(s.facts) + s.pending_count for h in held for s in h.scopes.values()) <= 100
        for i in range(300):
            rt.memory.remember(f"live note {i}")
        alone = PastCheckpoints(budget=100)
        rt.memory._past_checkpoints = alone
        view = rt.memory.as_of(position=rt.journal.position())
        assert len(view.all()) == 300
        assert alone.positions == []


def _as_an_older_release(pg_url: str) -> None:
    """Leave a PostgreSQL journal as an older release did: no scrub table."""
    import psycopg

    from journaled.events.journal import SCRUB_TABLE

    with journaled.open(pg_url):
        pass
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {SCRUB_TABLE}")


@pytest.mark.parametrize("purger", ["this runtime", "another process that migrates"])
def test_a_journal_read_without_migrating_keeps_no_text_a_purge_erased(
    pg_url: str, clock: ManualClock, purger: str
) -> None:
    """R2, T1: a PostgreSQL journal of an older release opened without migrating counts no
    erasure; views of it keep no checkpoint a purge could not drop, so after a purge here, or
    by another process (which migrates the journal and counts from then on), no view shows the
    erased text."""
    _as_an_older_release(pg_url)
    with journaled.Runtime(pg_url, clock=clock, create=False) as rt:
        rt.memory._past_checkpoints = PastCheckpoints(least_every=1)
        fact = rt.memory.remember(f"{SECRET} in a fact")
        for i in range(10):
            rt.memory.remember(f"filler {i}")
        end = rt.journal.position()
        for position in range(end + 1):
            rt.memory.as_of(position=position)
        if purger == "this runtime":
            assert rt.memory.purge(fact.id)
        else:
            code = (
                "import sys, journaled\n"
                "with journaled.open(sys.argv[1]) as rt:\n"
                "    assert rt.memory.purge(sys.argv[2])\n"
            )
            subprocess.run([sys.executable, "-c", code, pg_url, fact.id], check=True, timeout=120)
            for position in range(end + 1):  # the table exists now: checkpoints again
                rt.memory.as_of(position=position)
        for position in range(end + 1):
            shown = msgspec.json.encode(rt.memory.as_of(position=position).all()).decode()
            assert SECRET not in shown, position
