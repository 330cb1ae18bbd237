"""Helpers of the tests of ADR 0056 (memory opened cold indexes on its first search): a journal of
facts of every class with its snapshots dropped, the scopes' states, and the searches compared.

The oracle is a fold from the journal's start that indexes as it goes (``eager_view`` in
``in_place``), asked at the clock's time, which the journal's clock keeps at its last event's
time (a ``ManualClock`` that only moves when a test advances it).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from in_place import writer_of

import journaled
from journaled.events.journal import SNAPSHOT_TABLE
from journaled.events.memory_state import ScopeState
from journaled.memory import MemoryView
from journaled.testing import ManualClock

QUERIES = ["alpha", "beta gamma", "deploy region", "rotate keys weekly", "tabs", "zeta"]


def fill(rt: journaled.Runtime, clock: ManualClock, n: int = 40) -> None:
    """Facts of every class: plain, keyed and superseded, expiring, doubtful, of a domain, in
    other scopes, deleted, purged; plus a chain whose superseder is deleted (restored)."""
    for i in range(n):
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
    rt.memory.remember("tabs are wide", conflict_key="style.width")
    top = rt.memory.remember("tabs are narrow", conflict_key="style.width")
    rt.memory.delete(top.id)  # "tabs are wide" is restored


def drop_snapshots(path: Path) -> None:
    """Delete every snapshot of a SQLite journal, so the next open folds the whole log."""
    with sqlite3.connect(path) as conn:
        conn.execute(f"DELETE FROM {SNAPSHOT_TABLE}")  # noqa: S608


def scope_states(rt: journaled.Runtime) -> list[ScopeState]:
    """Return the states of a runtime's memory scopes."""
    return [shelf.state for shelf in writer_of(rt).shelves.values()]


def searches(memory: journaled.Memory | MemoryView) -> list[list[journaled.Fact]]:
    """Return 30 searches' answers: every query with limits, scopes, domains and confidence."""
    found = []
    for query in QUERIES:
        found.append(memory.search(query, limit=50))
        found.append(memory.search(query, limit=3))
        found.append(memory.search(query, scopes=["user", "session"], limit=50))
        found.append(memory.search(query, domains=["ops"], min_confidence=0.1, limit=50))
        found.append(memory.search(query, min_confidence=0.9, limit=50))
    return found


def cold_journal(tmp_path: Path, n: int = 40) -> tuple[Path, str, ManualClock]:
    """Return a SQLite journal of :func:`fill`'s facts with no snapshot: its path, URL and clock."""
    path = tmp_path / "j.sqlite"
    url = f"sqlite:///{path}"
    clock = ManualClock(1_000_000)
    with journaled.open(url, clock=clock, follow=None) as rt:
        fill(rt, clock, n)
    drop_snapshots(path)
    return path, url, clock


@pytest.fixture(name="cold")
def cold_fixture(tmp_path: Path) -> tuple[Path, str, ManualClock]:
    """A fixture named ``cold``: :func:`cold_journal` in the test's directory."""
    return cold_journal(tmp_path)


def tear_indexing_at(monkeypatch: pytest.MonkeyPatch, n: int) -> Callable[[], None]:
    """Make the ``n``-th fact a settle classifies stop part way, the index holding it and its
    class not yet (``RuntimeError("stopped part way")``); return what puts the real one back."""
    real = ScopeState._classify_now
    calls = [0]

    def tearing(state: ScopeState, fact: journaled.Fact) -> None:
        calls[0] += 1
        if calls[0] == n:
            state.index.add(fact.id, fact.text)  # the index has it, its class not yet
            raise RuntimeError("stopped part way")
        real(state, fact)

    monkeypatch.setattr(ScopeState, "_classify_now", tearing)
    return lambda: monkeypatch.setattr(ScopeState, "_classify_now", real)
