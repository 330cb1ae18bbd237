"""Two runtimes on one SQLite file never lose each other's writes (J3)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import journaled
from journaled.testing import ManualClock, wait_for


def test_concurrent_key_claims_from_two_runtimes_supersede_properly(tmp_path: Path) -> None:
    """J3/M3: two writers claiming one conflict key collide, retry, and leave one active fact."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    clock = ManualClock(step=1)
    with journaled.open(url, clock=clock) as one, journaled.open(url, clock=clock) as two:
        barrier = threading.Barrier(2)
        made: list[journaled.Fact] = []

        def write(rt: journaled.Runtime, who: str) -> None:
            barrier.wait(timeout=10)
            made.extend(
                rt.memory.remember(f"{who} says the port is {i}", conflict_key="port")
                for i in range(25)
            )

        threads = [
            threading.Thread(target=write, args=(one, "one")),
            threading.Thread(target=write, args=(two, "two")),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        one.refresh()
        two.refresh()
        for rt in (one, two):
            facts = {f.id: f for f in rt.memory.all()}
            assert len(facts) == 50
            active = [f for f in facts.values() if f.superseded_by is None]
            assert len(active) == 1
            claims = [e for e in rt.journal.read() if e.stream == "key:port"]
            assert [e.version for e in claims] == list(range(1, 51))
        assert one.memory.all() == two.memory.all()


def test_writes_from_another_runtime_are_seen_after_refresh(tmp_path: Path) -> None:
    """J3: a fact remembered by one runtime is found by another after it folds the log."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, follow=None) as one, journaled.open(url, follow=None) as two:
        fact = one.memory.remember("written by runtime one")
        assert two.memory.get(fact.id) is None
        assert two.refresh() == one.journal.position()
        assert two.memory.get(fact.id) == fact
        mine = two.memory.remember("written by runtime two")
        one.refresh()
        assert {f.id for f in one.memory.all()} == {fact.id, mine.id}


def test_another_runtime_follows_within_the_bound(tmp_path: Path) -> None:
    """J3: a fact remembered by one runtime is found by a search in another within ~follow s."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, follow=0.05) as one, journaled.open(url, follow=0.05) as two:
        fact = one.memory.remember("the release train leaves on Thursdays")
        started = time.monotonic()
        wait_for(lambda: [f.id for f in two.memory.search("release train")] == [fact.id], 5.0)
        assert time.monotonic() - started < 2.0  # follow=0.05: well inside the documented bound
        mine = two.memory.remember("the release train is frozen in December", conflict_key="train")
        wait_for(lambda: one.memory.get(mine.id) == mine, 5.0)
