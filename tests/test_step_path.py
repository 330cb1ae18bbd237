"""The per-step path: appends on one connection that takes turns with the pool's writers, and
actor inboxes that hand a step over without Python-level locking (issue 12, per-step CPU)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import pytest

import journaled
from journaled.actors.executor import Executor
from journaled.actors.steps import StepWorker, ToolContext
from journaled.events.base import Pending
from journaled.events.codec import Codec
from journaled.events.errors import ConcurrencyConflict, JournalBusy
from journaled.events.journal import Journal
from journaled.events.journal._sqlite import _Pool
from journaled.events.memory import MEMORY_EVENTS, FactRemembered
from journaled.events.run_messages import StepDone
from journaled.events.runs import RunHeartbeat
from journaled.events.url import parse_url
from journaled.testing import wait_for


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
    """J1, §6: an append waits while another writer of the journal's pool holds its write lock,
    at most ``lock_wait`` (ADR 0039)."""
    pool = _pool(journal)
    pool.lock_wait = 0.05
    conn = pool.get_connection(is_writer=True)
    try:
        with pytest.raises(JournalBusy):
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
    assert len(seen) == 1
    assert issubclass(seen[0], queue.SimpleQueue)  # counting its puts (ADR 0043)
    assert type(StepWorker._create_actor_inbox()) is queue.SimpleQueue
    steps_seen = [(k, s) for k, s in kinds if k in ("run.step-started", "run.step-succeeded")]
    assert steps_seen == [
        (kind, f"c{i}") for i in range(5) for kind in ("run.step-started", "run.step-succeeded")
    ]


def _chain(n: int, tool: str = "probe") -> journaled.Plan:
    steps = [
        journaled.Step(f"c{i}", tool=tool, depends_on=[f"c{i - 1}"] if i else []) for i in range(n)
    ]
    return journaled.Plan(goal="chain", steps=steps)


def _appending_threads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, list[str]]]:
    """Record (thread, step ids whose results it holds) of every append of step results."""
    appends: list[tuple[int, list[str]]] = []
    original = Journal.append

    def spy(self: Journal, events: list[Pending], **kwargs: object) -> list[int]:
        done = [
            e.data.step_id  # type: ignore[attr-defined]
            for e in events
            if type(e.data).__name__ == "StepSucceeded"
        ]
        if done:
            appends.append((threading.get_ident(), done))
        return original(self, events, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Journal, "append", spy)
    return appends


def test_chain_result_is_journaled_by_the_thread_that_ran_the_step(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E12/R4: on a chain, the worker that ran a step appends its result and the next start
    itself, and each step still runs only once its start is in the journal."""
    ran: dict[str, int] = {}
    unjournaled: list[str] = []
    appends = _appending_threads(monkeypatch)
    with journaled.open(sqlite_url) as rt:

        def probe(_: object, ctx: ToolContext) -> None:
            ran[ctx.step_id] = threading.get_ident()
            started = {
                getattr(e.data, "step_id", None)
                for e in rt.runs.history(ctx.run_id)
                if e.kind == "run.step-started"
            }
            if ctx.step_id not in started:
                unjournaled.append(ctx.step_id)

        rt.register_tool("probe", probe)
        result = rt.execute(_chain(6))
    assert result.ok
    assert unjournaled == []
    assert [ids for _, ids in appends] == [[f"c{i}"] for i in range(6)]
    # The first result may come while the executor still finishes starting the run: it is told.
    assert all(thread == ran[ids[0]] for thread, ids in appends[1:])


def test_result_told_to_a_busy_executor_is_taken_from_its_inbox(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R4: a step that ends while its executor is busy tells it the result; the executor's own
    thread journals it, and the run carries on."""
    executors: list[Executor] = []
    original = Executor.on_start

    def keep(self: Executor) -> None:
        executors.append(self)
        original(self)

    monkeypatch.setattr(Executor, "on_start", keep)
    taken: list[tuple[str, bool]] = []
    take = Executor.take_result

    def spy(self: Executor, done: StepDone) -> bool:
        taken.append((done.step_id, took := take(self, done)))
        return took

    monkeypatch.setattr(Executor, "take_result", spy)
    appends = _appending_threads(monkeypatch)
    release = threading.Event()
    ran: dict[str, int] = {}

    def probe(_: object, ctx: ToolContext) -> None:
        ran[ctx.step_id] = threading.get_ident()
        if ctx.step_id == "c1":
            assert release.wait(10)

    with journaled.open(sqlite_url) as rt:
        rt.register_tool("probe", probe)
        handle = rt.start(_chain(3))
        wait_for(lambda: "c1" in ran)
        [executor] = executors
        with executor._turn:  # busy: as if it were handling another message
            release.set()
            wait_for(lambda: ("c1", False) in taken)
        result = handle.result(timeout=10)
    assert result.ok
    threads = {ids[0]: thread for thread, ids in appends}
    assert threads["c1"] != ran["c1"]  # the executor's thread, from its inbox
    assert threads["c2"] == ran["c2"]  # free again: the worker's own


def test_failure_taking_a_result_stops_the_run_with_it(sqlite_url: str) -> None:
    """R8: when the append of a result taken in a worker's thread finds the run written by
    another writer, the run stops with RunOwnedElsewhere, and the runtime goes on."""
    with journaled.open(sqlite_url) as rt:

        def intrude(_: object, ctx: ToolContext) -> None:
            if ctx.step_id == "c1":
                version = rt._journal.stream(ctx.run_id)[-1].version
                rt._journal.append(
                    [
                        Pending(
                            stream=ctx.run_id,
                            version=version + 1,
                            data=RunHeartbeat(at=1, owner="elsewhere"),
                        )
                    ]
                )

        rt.register_tool("probe", intrude)
        with pytest.raises(journaled.RunOwnedElsewhere):
            rt.execute(_chain(3))
        rt.register_tool("probe", lambda x: None)
        assert rt.execute(_chain(3)).ok
