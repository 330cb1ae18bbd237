"""The per-step path: appends on one connection that takes turns with the pool's writers, and
actor inboxes that hand a step over without Python-level locking (issue 12, per-step CPU)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import pytest
from eventsourcing.persistence import ConnectionUnavailableError

import journaled
from journaled.actors.executor import Executor
from journaled.actors.steps import StepWorker
from journaled.events.base import Pending
from journaled.events.codec import Codec
from journaled.events.errors import ConcurrencyConflict
from journaled.events.journal import Journal
from journaled.events.journal._sqlite import _Pool
from journaled.events.memory import MEMORY_EVENTS, FactRemembered
from journaled.events.url import parse_url


@pytest.fixture
def journal(sqlite_url: str) -> Iterator[Journal]:
    """Yield an open SQLite journal."""
    j = Journal(parse_url(sqlite_url), Codec(MEMORY_EVENTS))
    yield j
    j.close()


def _pool(journal: Journal) -> _Pool:
    pool = journal._recorder.datastore.pool  # type: ignore[union-attr]
    assert isinstance(pool, _Pool)
    return pool


def _event(stream: str, version: int = 1) -> Pending:
    return Pending(
        stream=stream, version=version, data=FactRemembered(at=1, fact_id=stream, scope="project")
    )


def test_append_after_a_conflict_from_another_thread(journal: Journal) -> None:
    """J2: a rejected append gives the write lock back; the next append, from any thread, lands."""
    journal.append([_event("a")])
    _pool(journal).pool_timeout = 1.0  # a lock never given back fails here, not after 5 s
    with pytest.raises(ConcurrencyConflict):
        journal.append([_event("b"), _event("a")])
    done: list[list[int]] = []
    thread = threading.Thread(target=lambda: done.append(journal.append([_event("b")])))
    thread.start()
    thread.join(10)
    assert done == [[2]]


def test_append_takes_turns_with_the_pool_writers(journal: Journal) -> None:
    """J1: an append waits while another writer of the journal's pool holds its write lock."""
    pool = _pool(journal)
    pool.pool_timeout = 0.05
    conn = pool.get_connection(is_writer=True)
    try:
        with pytest.raises(ConnectionUnavailableError):
            journal.append([_event("a")])
    finally:
        pool.put_connection(conn)
    assert journal.append([_event("a")]) == [1]
    assert [e.stream for e in journal.read()] == ["a"]


def test_close_closes_the_append_connection(sqlite_url: str) -> None:
    """J1: closing a journal closes the connection its appends used; appending then fails."""
    journal = Journal(parse_url(sqlite_url), Codec(MEMORY_EVENTS))
    journal.append([_event("a")])
    pool = _pool(journal)
    writer = pool._writer
    assert writer is not None
    journal.close()
    assert writer.closed
    assert pool._writer is None
    with pytest.raises(Exception, match="closed"):
        journal.append([_event("b")])


def test_step_path_actors_use_the_c_inbox(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """E12: the executor and its step workers hand steps over through C queues, and a chain
    still journals every step's start before its result."""
    seen: list[type] = []
    original = Executor.on_start

    def spy(self: Executor) -> None:
        seen.append(type(self.actor_inbox))
        original(self)

    monkeypatch.setattr(Executor, "on_start", spy)
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("noop", lambda x: None)
        steps = [
            journaled.Step(f"c{i}", tool="noop", depends_on=[f"c{i - 1}"] if i else [])
            for i in range(5)
        ]
        result = rt.execute(journaled.Plan(goal="chain", steps=steps))
        kinds = [(e.kind, getattr(e.data, "step_id", None)) for e in rt.runs.history(result.run_id)]
    assert result.ok
    assert seen == [queue.SimpleQueue]
    assert type(StepWorker._create_actor_inbox()) is queue.SimpleQueue
    steps_seen = [(k, s) for k, s in kinds if k in ("run.step-started", "run.step-succeeded")]
    assert steps_seen == [
        (kind, f"c{i}") for i in range(5) for kind in ("run.step-started", "run.step-succeeded")
    ]
