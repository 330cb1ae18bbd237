"""Attacks on ADR 0091 (M6, M12): a remember is indexed by the next search, not as it is stored.

The oracle for search answers is a fold from the journal's start that indexes as it goes
(``eager_view`` in ``in_place``; ``searches`` in ``deferred`` asks the same 30 searches of both).
"""

from __future__ import annotations

import functools
import signal
import threading
from pathlib import Path

import pytest
from deferred import QUERIES, fill, scope_states, searches
from in_place import eager_view, writer_of

import journaled
from journaled.actors.memory import MemoryWriter
from journaled.events.memory_state import ScopeState, memory_snapshot_key
from journaled.testing import KeywordEmbedder, ManualClock, wait_for


def _assert_classes_as_eager(rt: journaled.Runtime) -> None:
    """Settle every live scope and compare its classes, group totals and indexed facts with a
    scope folded from the journal's start indexing as it goes: a fact counted twice in a
    group, or left in (or out of) the index, shows here even where no search ranks it."""
    rt.memory.search("alpha")  # settles every scope, in place or by message
    eager = eager_view(rt)._state.scopes
    for state in scope_states(rt):
        assert not state.pending
        assert not state.torn
        other = eager[state.physical]
        assert other.facts == state.facts
        assert state._group_count == other._group_count, state.physical
        assert state._group_length == other._group_length, state.physical
        assert state._conditional == other._conditional, state.physical
        assert state._plain_group == other._plain_group, state.physical
        assert {f for f in state.facts if f in state.index} == {
            f for f in other.facts if f in other.index
        }, state.physical
        assert len(state.index) == len(other.index), state.physical


def test_a_burst_of_folds_does_not_put_off_automatic_snapshots_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A memory only written to snapshots itself (ADR 0091) even when more remembers than the
    snapshot is due for were folded at once (another process's, caught up in one batch): they
    are no cold open's backlog, and each later remember must not put the snapshot off again."""
    monkeypatch.setattr(MemoryWriter, "auto_snapshot_events", 20)
    url = f"sqlite:///{tmp_path / 'j.sqlite'}"
    with (
        journaled.open(url, clock=ManualClock(1_000_000), follow=None) as here,
        journaled.open(url, clock=ManualClock(2_000_000), follow=None) as other,
    ):
        for i in range(30):
            other.memory.remember(f"alpha other {i}")
        here._actors.catch_up()  # 30 remembers folded in one batch: more than the 20 due
        writer = writer_of(here)
        for i in range(200):
            here.memory.remember(f"alpha here {i}")
        here._actors.catch_up()
        assert writer._snapshot_position > 0, (
            f"no automatic snapshot after {writer._since_snapshot} folds, "
            f"{sum(s.pending_count for s in scope_states(here))} facts pending"
        )
        assert writer._since_snapshot < writer._auto_snapshot_due()
        assert searches(here.memory) == searches(eager_view(here))


def test_pending_facts_changed_before_any_search_answer_as_an_eager_fold(tmp_path: Path) -> None:
    """Facts remembered, then superseded, re-linked, restored, deleted and purged before any
    search are indexed by it as a fold indexing as it went (M3, M5, M6, M8, M10); every past
    position answers as then (M12), and the purged text is in no index and no snapshot."""
    clock = ManualClock(1_000_000)
    path = tmp_path / "j.sqlite"
    with journaled.open(f"sqlite:///{path}", clock=clock, follow=None) as rt:
        rt.memory.search("alpha")  # settled once: from here on, only remembers are pending
        start = rt._journal.position()
        fill(rt, clock, 12)
        a = rt.memory.remember("alpha chain first", conflict_key="chain")
        b = rt.memory.remember(
            "alpha chain second", conflict_key="chain", valid_until=clock.now + 3
        )
        c = rt.memory.remember("alpha chain third", conflict_key="chain")
        rt.memory.delete(b.id)  # a is re-linked to c
        rt.memory.delete(c.id)  # a is active again
        secret = rt.memory.remember("alpha purgeme zebra tabs", conflict_key="chain")
        assert rt.memory.get(a.id) is not None
        rt.memory.purge(secret.id)  # a is restored once more
        doubtful = rt.memory.remember("alpha doubtful beta", confidence=0.3)
        rt.memory.delete(doubtful.id)
        assert any(s.pending for s in scope_states(rt))
        for position in range(start, rt._journal.position() + 1, 3):
            view = rt.memory.as_of(position=position)  # at the end of the append holding it
            assert searches(view) == searches(eager_view(rt, position=view.position))
        assert searches(rt.memory) == searches(eager_view(rt))
        _assert_classes_as_eager(rt)
        assert rt.memory.search("purgeme zebra") == []
        assert all(s.index.count("purgeme") == 0 for s in scope_states(rt))
        assert rt.memory.checkpoint()
        snapshot = rt._journal.snapshot(memory_snapshot_key(None))
        assert snapshot is not None
        assert b"purgeme" not in snapshot[1]
    assert b"purgeme" not in path.read_bytes()


def test_semantic_and_hybrid_searches_right_after_remembers_see_them(tmp_path: Path) -> None:
    """Semantic and hybrid searches asked right after remembers rank them, BM25 part included
    (M7, ADR 0047), as the same searches of a fold indexing as it went."""
    clock = ManualClock(1_000_000)
    embedder = KeywordEmbedder(["alpha", "beta", "gamma", "deploy", "region", "tabs", "zeta"])
    url = f"sqlite:///{tmp_path / 'j.sqlite'}"
    with journaled.open(url, clock=clock, follow=None, embedder=embedder) as rt:
        fill(rt, clock, 9)
        rt.memory.search("alpha")
        for i in range(5):
            rt.memory.remember(f"zeta gamma late {i}", scope=("user", "project")[i % 2])
            rt.memory.remember(f"deploy region is ap-{i}", conflict_key="deploy.region")
            view = eager_view(rt)
            for query in QUERIES:
                assert rt.memory.search_hybrid(query, limit=7) == view.search_hybrid(query, limit=7)
                assert rt.memory.search_semantic(query, limit=7) == view.search_semantic(
                    query, limit=7
                )
                assert rt.memory.search(query, limit=50) == view.search(query, limit=50)


def test_searches_in_place_racing_remembers_deletes_and_supersessions_stay_whole(
    tmp_path: Path,
) -> None:
    """Searches in place on several threads while others remember (through the desk, in
    groups), supersede and delete: no answer holds a fact twice or a deleted one, and the end
    state's classes and group totals are a fold's that indexed as it went (ADR 0053, 0091)."""
    clock = ManualClock(1_000_000)
    with journaled.open(f"sqlite:///{tmp_path / 'j.sqlite'}", clock=clock, follow=None) as rt:
        fill(rt, clock, 9)
        errors: list[BaseException] = []
        stop = threading.Event()
        deleted: set[str] = set()

        def write(k: int) -> None:
            try:
                for i in range(60):
                    fact = rt.memory.remember(
                        f"alpha racer {k} {i} tabs",
                        scope=("user", "project", "session")[i % 3],
                        conflict_key=f"race.{k % 2}" if i % 4 == 0 else None,
                        confidence=0.5 if i % 5 == 0 else 1.0,
                    )
                    if i % 6 == 0:
                        deleted.add(fact.id)
                        rt.memory.delete(fact.id)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        def search() -> None:
            try:
                while not stop.is_set():
                    for query in ("alpha tabs", "racer", "alpha"):
                        found = rt.memory.search(query, limit=40)
                        ids = [f.id for f in found]
                        assert len(ids) == len(set(ids)), "a fact twice in one answer"
                        assert len(ids) <= 40
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        writers = [threading.Thread(target=write, args=(k,)) for k in range(4)]
        readers = [threading.Thread(target=search) for _ in range(3)]
        for t in [*writers, *readers]:
            t.start()
        for t in writers:
            t.join(60)
        stop.set()
        for t in readers:
            t.join(60)
        assert errors == []
        assert not any(f.id in deleted for f in rt.memory.search("alpha racer", limit=1000))
        assert searches(rt.memory) == searches(eager_view(rt))
        _assert_classes_as_eager(rt)


def test_ctrl_c_while_a_search_indexes_remembers_on_the_main_thread_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C that comes while a search in place indexes pending remembers on the main thread
    is held until the scopes' lock is let go (ADR 0076): the index is whole, nothing is torn,
    and the next search answers as an eager fold."""
    assert threading.current_thread() is threading.main_thread()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    clock = ManualClock(1_000_000)
    with journaled.open(f"sqlite:///{tmp_path / 'j.sqlite'}", clock=clock, follow=None) as rt:
        fill(rt, clock, 9)
        rt.memory.search("alpha")
        for i in range(6):
            rt.memory.remember(f"alpha late {i}")
        real = ScopeState._classify_now
        calls = [0]

        def interrupting(state: ScopeState, fact: journaled.Fact) -> None:
            calls[0] += 1
            if calls[0] == 2:
                signal.raise_signal(signal.SIGINT)
            real(state, fact)

        monkeypatch.setattr(ScopeState, "_classify_now", interrupting)
        with pytest.raises(KeyboardInterrupt):
            rt.memory.search("alpha")
        monkeypatch.setattr(ScopeState, "_classify_now", real)
        assert calls[0] >= 6
        assert not any(s.torn or s.pending for s in scope_states(rt))
        assert searches(rt.memory) == searches(eager_view(rt))


def _holds(rt: journaled.Runtime, fact_id: str) -> bool:
    return rt.memory.get(fact_id) is not None


def test_two_runtimes_following_each_other_search_what_the_other_remembered(
    tmp_path: Path,
) -> None:
    """Two runtimes on one SQLite file, each following the other (J, ADR 0062): what one
    remembers is folded by the other's poll, pending there, and its next search ranks it as a
    fold from the journal's start does."""
    url = f"sqlite:///{tmp_path / 'j.sqlite'}"
    with (
        journaled.open(url, clock=ManualClock(1_000_000), follow=0.02) as a,
        journaled.open(url, clock=ManualClock(1_000_000), follow=0.02) as b,
    ):
        a.memory.search("alpha")
        b.memory.search("alpha")
        for i in range(10):
            mine = a.memory.remember(f"alpha from a {i}", conflict_key="shared" if i % 3 else None)
            theirs = b.memory.remember(f"alpha from b {i} beta")
            wait_for(functools.partial(_holds, b, mine.id))
            wait_for(functools.partial(_holds, a, theirs.id))
            assert a.memory.search("alpha from", limit=100) == eager_view(a).search(
                "alpha from", limit=100
            )
            assert b.memory.search("alpha beta", limit=100) == eager_view(b).search(
                "alpha beta", limit=100
            )
        wait_for(lambda: a._journal.position() == writer_of(a).position == writer_of(b).position)
        assert searches(a.memory) == searches(eager_view(a))
        assert searches(b.memory) == searches(eager_view(b))


def test_remembers_in_groups_from_many_threads_still_snapshot_themselves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Callers remembering at once are stored in groups (ADR 0055), so one fold may carry more
    remembers than the automatic snapshot was due for: memory only written to snapshots itself
    all the same (ADR 0091), and the next open is served a snapshot with its index."""
    monkeypatch.setattr(MemoryWriter, "auto_snapshot_events", 20)
    url = f"sqlite:///{tmp_path / 'j.sqlite'}"
    clock = ManualClock(1_000_000)
    with journaled.open(url, clock=clock, follow=None) as rt:
        start = threading.Barrier(8)

        def remember(k: int) -> None:
            start.wait(10)
            for i in range(60):
                rt.memory.remember(f"alpha group {k} {i}", scope=("user", "project")[i % 2])

        threads = [threading.Thread(target=remember, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        rt._actors.catch_up()
        writer = writer_of(rt)
        assert writer._snapshot_position > 0
        assert writer._since_snapshot < writer._auto_snapshot_due()
        expected = searches(eager_view(rt))
    with journaled.open(url, clock=clock, follow=None) as rt:
        assert sum(len(s.index) for s in scope_states(rt)) > 0  # served a snapshot's index
        assert searches(rt.memory) == expected


# -- the remember path's small caches (M2, M9) ----------------------------------------------------

_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


class _EqualToAll(str):
    """A name that claims to equal (and hash as) any clean name a memory saw before."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return hash("project")


def test_a_secret_in_a_name_is_refused_every_time_whatever_was_scanned_before(
    tmp_path: Path,
) -> None:
    """A scope, domain or conflict key holding a secret is refused each time it is given,
    also after a clean name was scanned, as a str subclass equal to anything, or past the
    cached length; nothing is written (M2, M9)."""
    with journaled.open(f"sqlite:///{tmp_path / 'j.sqlite'}", follow=None) as rt:
        rt.memory.remember("clean", scope="project", domain="ops", conflict_key="project")
        before = rt._journal.position()
        for _ in range(2):
            for name in (_TOKEN, "k" * 200 + _TOKEN, _EqualToAll(_TOKEN)):
                with pytest.raises(journaled.InvalidFact, match="domain"):
                    rt.memory.remember("x", domain=name)
                with pytest.raises(journaled.InvalidFact, match="conflict_key"):
                    rt.memory.remember("x", conflict_key=name)
            with pytest.raises(journaled.InvalidFact, match="scope"):
                rt.memory.remember("x", scope=f"session-{_TOKEN}")
        assert rt._journal.position() == before
        assert _TOKEN.encode() not in (tmp_path / "j.sqlite").read_bytes()


def test_the_names_scanned_once_are_only_clean_ones_and_a_bounded_few() -> None:
    """The names kept as scanned are the clean ones: a name refused for a secret is not kept,
    even in memory; and they are at most ``_CLEAN_NAMES_KEPT``, the oldest going first (M9)."""
    from journaled.actors import remember_rules

    assert remember_rules._names_a_secret(_TOKEN)
    assert _TOKEN not in remember_rules._CLEAN_NAMES
    assert not remember_rules._names_a_secret("project")
    assert "project" in remember_rules._CLEAN_NAMES
    for i in range(remember_rules._CLEAN_NAMES_KEPT + 50):
        assert not remember_rules._names_a_secret(f"domain-{i}")
    assert len(remember_rules._CLEAN_NAMES) == remember_rules._CLEAN_NAMES_KEPT
    assert "project" not in remember_rules._CLEAN_NAMES
    assert f"domain-{remember_rules._CLEAN_NAMES_KEPT + 49}" in remember_rules._CLEAN_NAMES


def test_fact_ids_keep_their_form_order_and_uniqueness_with_the_cached_prefix() -> None:
    """A fact id is ``mem_`` + the time in base 36 (9 wide) + 64 random bits, whatever times
    came before: a clock going back, 0 or below (read as 0), the same millisecond many times
    (M2: collision-safe, time-ordered)."""
    from journaled.actors.clock import _base36, new_fact_id

    times = [5, 4, 0, -1, -(10**12), 36, 35, 1_700_000_000_000, 1_699_999_999_999, 5, *range(40)]
    for now in times:
        fact_id = new_fact_id(now)
        assert fact_id.startswith(f"mem_{_base36(max(0, now)):>09}_"), (now, fact_id)
        assert len(fact_id) == len("mem_") + 9 + 1 + 16
    ids = [new_fact_id(1_700_000_000_000) for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    ordered = [new_fact_id(now) for now in range(1_700_000_000_000, 1_700_000_000_050)]
    assert ordered == sorted(ordered)


def test_the_desks_shared_leading_event_is_never_cleared_nor_waited_on(tmp_path: Path) -> None:
    """Callers that lead at once share one pre-set event; callers in line get their own
    (ADR 0055). After many threads remember at once, the shared one is still set, and every
    remember was stored once."""
    from journaled.actors import desk

    with journaled.open(f"sqlite:///{tmp_path / 'j.sqlite'}", follow=None) as rt:
        start = threading.Barrier(8)
        stored: list[str] = []

        def remember(k: int) -> None:
            start.wait(10)
            stored.extend(rt.memory.remember(f"alpha lead {k} {i}").id for i in range(40))

        threads = [threading.Thread(target=remember, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert desk._LEADING.is_set()
        assert len(stored) == len(set(stored)) == 320
        assert {f.id for f in rt.memory.all()} == set(stored)
        assert len(rt.memory.search("alpha lead", limit=1000)) == 320
