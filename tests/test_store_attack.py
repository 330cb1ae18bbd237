"""Attacks on the stored forms of ADR 0040, the append connection of ADR 0039 and the read paths
of ADR 0034's update (issue 12): what holds is asserted, what does not is a strict xfail."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pykka
import pytest
from old_journals import copy_journal, register_tools

import journaled
from journaled.actors.directory import quick_inbox
from journaled.events.base import PURGED, DomainEvent, Pending
from journaled.events.catalog import codec
from journaled.events.codec import Codec
from journaled.events.errors import ConcurrencyConflict, CorruptEvent, JournalBusy, JournalClosed
from journaled.events.journal import PAYLOAD_TABLE, SNAPSHOT_TABLE, Journal
from journaled.events.plans import Limits, Observation, Plan, Step
from journaled.events.run_state import fold_run
from journaled.events.runs import (
    MemoryRead,
    RunFinished,
    RunStarted,
    StepFailed,
    StepStarted,
    StepSucceeded,
    WavePartitioned,
)
from journaled.events.url import parse_url
from journaled.runtime import verify
from journaled.testing import ManualClock, wait_for

CODEC = codec()
MAPS = Codec(CODEC.types)  # the same types stored as maps: the layout before ADR 0040
AT = 1_764_560_000_000
SUCCEEDED = "run.step-succeeded@2"
enc = msgspec.msgpack.encode

ODD_ID = "s\x00\u00e9@\U0001f600A"
"""A step id with a NUL, a non-ASCII letter, the key separator '@', an astral character."""

EDGE_EVENTS: list[DomainEvent] = [
    StepStarted(at=2**63 - 1, step_id=ODD_ID, attempt=2**64 - 1, wave=-(2**63)),
    StepSucceeded(
        at=AT,
        step_id=ODD_ID,
        attempt=1,
        observation=Observation(step_id="another step", ok=True, output={"k": [1, {"b": 2}]}),
    ),
    StepSucceeded(
        at=AT,
        step_id="s",
        attempt=3,
        observation=Observation(
            step_id="s",
            ok=False,
            skill="sk",
            tool="t",
            agent="ag",
            agent_task_id="task",
            output=[[[[["deep"]]]], b"\x00\xff", -(2**63), 2**64 - 1, 1.5, None, True],
            error="e\x00",
            code="agent-timeout",
            data={"1": {"2": [b"raw"]}},
            artifacts=("a", {"b": None}),
            calls_used=7,
        ),
        charged=9,
    ),
    StepSucceeded(  # a trailing field explicitly set to its default
        at=AT,
        step_id="s",
        attempt=1,
        observation=Observation(step_id="s", ok=True, calls_used=None),
        charged=0,
    ),
    StepFailed(at=AT, step_id="", attempt=1, observation=Observation(step_id="", ok=False)),
    WavePartitioned(
        at=AT,
        wave=2,
        runnable=("a",),
        skipped=(Observation(step_id="x", ok=False, code="cancelled"),),
        unobserved=("z",),
    ),
    RunStarted(
        at=AT,
        run_id="run_" + ODD_ID,
        plan=Plan(
            goal="g\x00",
            steps=[
                Step("a", tool="t", input={"x": [1, 2]}, depends_on=["b"], status="succeeded"),
                Step("b", skill="s", agent="ag", input=b"bytes"),
            ],
            id="p",
        ),
        call_budget=0,
        max_parallel_steps=1,
        limits=Limits(per_tool={"t": 1}, per_skill={"s": 2}, per_agent={"ag": 3}),
        parent_run="r0",
        parent_step="a",
        step_timeout=0.5,
        owner="host/1/2",
        parent_call=1,
        reserve="m:q",
    ),
    MemoryRead(at=AT, step_id="s", attempt=1, fact_ids=("f@1", "f\x00"), ops=("search",)),
    RunFinished(at=AT, status="waiting", ok=False, calls_used=2**31, waiting=("a", "b")),
]


@pytest.mark.parametrize("event", EDGE_EVENTS, ids=lambda e: type(e).__name__)
def test_edge_values_decode_from_the_positional_form_as_from_the_map_form(
    event: DomainEvent,
) -> None:
    """J5 (ADR 0040): every field non-default, extreme ints, NUL/'@'/astral ids, nested and
    bytes outputs and a differing observation step id decode from the array as from a map."""
    topic = CODEC.topic(event)
    stored = CODEC.encode(event)
    assert stored[0] in {*range(0x90, 0xA0), 0xDC}  # an array
    read = msgspec.json.encode(CODEC.decode(topic, stored, 1))
    assert read == msgspec.json.encode(MAPS.decode(topic, MAPS.encode(event), 1))
    assert read == msgspec.json.encode(event)


def test_an_observation_naming_another_step_is_stored_in_full() -> None:
    """J5 (ADR 0040): only an observation's step id equal to its event's is left implied."""
    same = StepSucceeded(
        at=AT, step_id="s1", attempt=1, observation=Observation(step_id="s1", ok=True)
    )
    other = msgspec.structs.replace(same, observation=Observation(step_id="s2", ok=True))
    assert msgspec.msgpack.decode(CODEC.encode(same))[3][0] is None
    assert msgspec.msgpack.decode(CODEC.encode(other))[3][0] == "s2"
    assert CODEC.decode(SUCCEEDED, CODEC.encode(other)).observation.step_id == "s2"  # type: ignore[attr-defined]


DAMAGED: dict[str, bytes] = {
    "too short": enc([AT, "s"]),
    "empty": enc([]),
    "a value of another type": enc([AT, "s", "one", ["s", True]]),
    "nil for a required id": enc([AT, None, 1, [None, True]]),
    "nil for the observation": enc([AT, "s", 1, None]),
    "a nested value of another type": enc([AT, "s", 1, ["s", "yes"]]),
    "a nested array too short": enc([AT, "s", 1, []]),
    "a nested map": enc([AT, "s", 1, {"step_id": "s", "ok": True}]),
    "a float for an int": enc([AT, "s", 1.5, ["s", True]]),
    "a bool for an int": enc([AT, "s", True, ["s", True]]),
    "truncated": enc([AT, "s", 1, ["s", True]])[:-1],
    "trailing bytes": enc([AT, "s", 1, ["s", True]]) + b"\xc0",
    "an array header claiming 4 GiB": b"\xdd\xff\xff\xff\xff",
    "not msgpack": b"\x9f\xc1\xc1",
    "a map of the wrong fields": enc({"nothing": 1}),
}


@pytest.mark.parametrize("payload", list(DAMAGED.values()), ids=list(DAMAGED))
def test_a_damaged_positional_payload_is_a_corrupt_event_naming_its_position(
    payload: bytes,
) -> None:
    """J5/R7 (ADR 0040): a damaged array (or a map in its place) is a CorruptEvent at its
    position and topic, never another exception."""
    with pytest.raises(CorruptEvent) as caught:
        CODEC.decode(SUCCEEDED, payload, 4242)
    message = str(caught.value)
    assert "4242" in message
    assert SUCCEEDED in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "topic",
    [
        "run.heartbeat@1",
        "memory.fact-remembered@1",
        "run.step-waiting@1",
        "run.step-succeeded@1",  # an older version of a positional event: always a map
        "run.started@1",
    ],
)
def test_an_array_under_a_topic_always_stored_as_a_map_is_a_corrupt_event(topic: str) -> None:
    """J5 (ADR 0040): only the positional topics read arrays; elsewhere an array is corrupt."""
    with pytest.raises(CorruptEvent, match=f"position 9 .*{topic}"):
        CODEC.decode(topic, enc([AT, "s", 1]), 9)


def test_a_positional_payload_with_extra_values_is_a_corrupt_event() -> None:
    """J5/R7 (ADR 0040): values past an event's last field are not dropped unreported."""
    with pytest.raises(CorruptEvent, match="4242"):
        CODEC.decode(SUCCEEDED, enc([AT, "s", 1, ["s", True], 0, "smuggled"]), 4242)


# -- the journal: side rows read as a key range, mixed forms, the append connection -------------

NEIGHBOURS = ["s", "s@", "s@1", "s@@", "s@s", "s?", "sA", "s\x7f", "s@\u00e9", "t"]
"""Stream ids around ``s``'s side-row range ``s@`` .. ``sA`` (and one inside it, byte-wise)."""


@pytest.fixture
def journal(sqlite_url: str) -> Iterator[Journal]:
    j = Journal(parse_url(sqlite_url), CODEC)
    yield j
    j.close()


@pytest.fixture
def any_journal(journal_url: str) -> Iterator[Journal]:
    j = Journal(parse_url(journal_url), CODEC)
    yield j
    j.close()


def _result(stream: str, version: int, output: Any) -> Pending:
    return Pending(
        stream=stream,
        version=version,
        data=StepSucceeded(
            at=AT + version,
            step_id=f"v{version}",
            attempt=1,
            observation=Observation(step_id=f"v{version}", ok=True, output=output),
        ),
    )


def test_side_rows_read_as_a_key_range_never_mix_streams_whose_ids_share_a_prefix(
    any_journal: Journal,
) -> None:
    """J5/T1 (ADR 0034): a stream's 32+ side rows read as one key range return its own content
    only, all of it, whatever '@'-bearing or neighbouring ids other streams have."""
    journal = any_journal
    versions = 40
    for name in NEIGHBOURS:
        journal.append([_result(name, v, f"{name}|{v}") for v in range(1, versions + 1)])
    for name in NEIGHBOURS:
        events = journal.stream(name)
        assert [e.data.observation.output for e in events] == [  # type: ignore[attr-defined]
            f"{name}|{v}" for v in range(1, versions + 1)
        ], name
        few = journal.stream(name, after_version=versions - 3)  # fewer: read by key
        assert [e.data.observation.output for e in few] == [  # type: ignore[attr-defined]
            f"{name}|{v}" for v in range(versions - 2, versions + 1)
        ]


def test_two_journals_on_one_file_appending_from_many_threads_keep_one_chain(
    sqlite_url: str,
) -> None:
    """J1/R7 (ADR 0039): two journals on one SQLite file, four threads each, appending through
    their append connections: every event stored once, streams whole, the chain verifies."""
    journals = [Journal(parse_url(sqlite_url), CODEC) for _ in range(2)]
    appends = 25
    start = threading.Barrier(8)
    failures: list[BaseException] = []
    positions: list[int] = []
    lock = threading.Lock()

    def writer(j: Journal, name: str) -> None:
        try:
            start.wait()
            for v in range(1, appends + 1):
                got = j.append([_result(name, v, f"{name}|{v}")])
                with lock:
                    positions.extend(got)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(journals[n % 2], f"w{n}")) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert not [t for t in threads if t.is_alive()]
        assert failures == []
        assert len(set(positions)) == 8 * appends
        for n in range(8):
            outputs = [e.data.observation.output for e in journals[n % 2].stream(f"w{n}")]  # type: ignore[attr-defined]
            assert outputs == [f"w{n}|{v}" for v in range(1, appends + 1)]
    finally:
        for j in journals:
            j.close()
    report = verify(sqlite_url)
    assert report.ok, report.problem
    assert report.events == 8 * appends


def test_closing_a_journal_while_threads_append_loses_no_acknowledged_event(
    sqlite_url: str,
) -> None:
    """J1/R7 (ADR 0039): appends racing a close either return (and are stored) or fail as
    closed; nobody hangs, the chain verifies after reopening (the error's type: see the next)."""
    j = Journal(parse_url(sqlite_url), CODEC)
    acknowledged: dict[str, int] = {}
    others: list[BaseException] = []
    started = threading.Barrier(5)

    def writer(name: str) -> None:
        started.wait()
        v = 0
        try:
            while True:
                j.append([_result(name, v + 1, f"{name}|{v + 1}")])
                v += 1
                acknowledged[name] = v
        except JournalClosed:
            pass
        except BaseException as exc:
            others.append(exc)

    threads = [threading.Thread(target=writer, args=(f"w{n}",)) for n in range(4)]
    for t in threads:
        t.start()
    started.wait()
    wait_for(lambda: len(acknowledged) == 4 and min(acknowledged.values()) > 3)
    j.close()
    for t in threads:
        t.join(30)
    assert not [t for t in threads if t.is_alive()]
    # Which closed-error escapes is the defect of the next test; here: no other failure.
    assert [e for e in others if type(e).__name__ != "ConnectionPoolClosedError"] == []
    again = Journal(parse_url(sqlite_url), CODEC)
    try:
        for name, last in acknowledged.items():
            stored = again.stream(name)
            assert len(stored) >= last
            assert [e.version for e in stored] == list(range(1, len(stored) + 1))
    finally:
        again.close()
    report = verify(sqlite_url)
    assert report.ok, report.problem


def test_a_conflicting_append_stores_nothing_and_appends_go_on(journal: Journal) -> None:
    """J3/R7 (ADR 0039): a version conflict on the append connection rolls back its event and
    side row; later appends from this and other threads chain on and verify."""
    journal.append([_result("c", 1, "first")])
    before = journal.position()
    with pytest.raises(ConcurrencyConflict):
        journal.append([_result("other", 1, "kept?"), _result("c", 1, "loser")])
    assert journal.position() == before
    assert journal.stream("other") == []
    assert [e.data.observation.output for e in journal.stream("c")] == ["first"]  # type: ignore[attr-defined]
    worker = threading.Thread(target=lambda: journal.append([_result("c", 2, "second")]))
    worker.start()
    worker.join(30)
    journal.append([_result("other", 1, "now")])
    assert [e.data.observation.output for e in journal.stream("c")] == ["first", "second"]  # type: ignore[attr-defined]
    report = verify(journal.config.url)
    assert report.ok, report.problem
    assert report.events == 3


def test_an_append_caught_by_a_close_raises_journal_closed(sqlite_url: str) -> None:
    """J1 (ADR 0039): an append waiting for the write lock while the journal closes fails with
    JournalClosed, the journal's own one-line error, never the library's."""
    j = Journal(parse_url(sqlite_url), CODEC)
    j.append([_result("a", 1, "first")])
    pool: Any = j._recorder.datastore.pool  # type: ignore[union-attr]
    entered = threading.Event()
    original = pool.writer

    def writer(timeout: float | None = None) -> Any:
        entered.set()
        return original(timeout)

    pool.writer = writer
    failures: list[BaseException] = []

    def append() -> None:
        try:
            j.append([_result("a", 2, "second")])
        except BaseException as exc:
            failures.append(exc)

    pool._writer_lock.acquire()  # the append waits for the lock: another append in flight
    appender = threading.Thread(target=append)
    closer = threading.Thread(target=j.close)
    try:
        appender.start()
        assert entered.wait(30)
        closer.start()
        wait_for(lambda: pool.closed)
    finally:
        pool._writer_lock.release()
    appender.join(30)
    closer.join(30)
    assert not appender.is_alive()
    assert not closer.is_alive()
    assert len(failures) == 1
    assert isinstance(failures[0], JournalClosed), repr(failures[0])


# -- verify and the runtime over positional rows ----------------------------------------------


def _chain(url: str, steps: int = 5) -> str:
    with journaled.open(url, clock=ManualClock(step=1)) as rt:
        rt.register_tool("echo", lambda data: {"echo": data})
        plan = [
            Step(f"c{i}", tool="echo", input=i, depends_on=[f"c{i - 1}"] if i else [])
            for i in range(steps)
        ]
        return rt.execute(Plan(goal="chain", steps=plan)).run_id


TAMPERS: dict[str, Any] = {
    "an extra value": lambda row: [*row, "smuggled"],
    "a value dropped": lambda row: row[:-1],
    "a map in place": lambda row: dict(enumerate(row)),
    "a value retyped": lambda row: [row[0], row[1], str(row[2]), *row[3:]],
    "another observation id": lambda row: [*row[:3], ["c9", *row[3][1:]], *row[4:]],
}


@pytest.mark.parametrize("tamper", list(TAMPERS.values()), ids=list(TAMPERS))
def test_verify_reports_every_tamper_of_a_positional_row(sqlite_url: str, tamper: Any) -> None:
    """R7 (ADR 0040): any rewrite of a positional step row, decodable or not, is reported at its
    position, and nothing else in the journal is reported."""
    run_id = _chain(sqlite_url)
    path = sqlite_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        [(position, state)] = conn.execute(
            "SELECT rowid, state FROM stored_events WHERE originator_id = ? AND topic = ? "
            "ORDER BY rowid LIMIT 1 OFFSET 2",
            (run_id, SUCCEEDED),
        ).fetchall()
        forged = msgspec.msgpack.encode(tamper(msgspec.msgpack.decode(bytes(state))))
        assert forged != bytes(state)
        conn.execute("UPDATE stored_events SET state = ? WHERE rowid = ?", (forged, position))
    report = verify(sqlite_url)
    assert report.problem is not None
    assert report.problem.position == position
    assert report.problem.kind in {"altered", "undecodable"}, report.problem


def test_a_journal_mixing_maps_and_arrays_forks_purges_and_verifies(tmp_path: Path) -> None:
    """J5/F1/R2/R7 (ADR 0040): an earlier release's map rows, resumed into arrays in the same
    stream, fold alike, fork, purge and still verify as one chain."""
    url, expected = copy_journal(tmp_path, "map-payloads-runs")
    wide = expected["runs"]["wide"]
    old_head = verify(url).head
    assert old_head is not None
    assert len(old_head) == 64  # the earlier release's 32-byte digest
    with journaled.open(url, clock=ManualClock(start=1_800_000_000_000)) as rt:
        register_tools(rt)
        resumed = rt.runs.resume(wide, take_over=True)
        end = rt.journal.position()
        assert rt.runs.at(wide, end) == rt.runs.current(wide) == resumed
        forked = rt.runs.fork(wide)
        assert rt.runs.current(forked).plan.goal == resumed.plan.goal
        again = rt.runs.resume(forked)
        assert {o.step_id: o.output for o in again.observations} == {
            o.step_id: o.output for o in resumed.observations
        }
        assert rt.runs.purge(wide, reason="erasure request") > 0
        assert all(o.output in {None, PURGED} for o in rt.runs.current(wide).observations), (
            rt.runs.current(wide).observations
        )
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        heads = {bytes(s)[:1][0] for (s,) in conn.execute("SELECT state FROM stored_events")}
    assert heads & {*range(0x80, 0x90)}  # maps of the earlier release
    assert heads & {*range(0x90, 0xA0)}  # arrays of this one
    report = verify(url, head=old_head)
    assert report.ok, report.problem
    assert report.head is not None
    assert len(report.head) == 32


def test_sigkill_mid_append_leaves_a_journal_that_reopens_and_verifies(tmp_path: Path) -> None:
    """J1/R7 (ADR 0039): a process killed with SIGKILL while appending on its append connection
    leaves whole commits only: streams have no gaps and the chain verifies."""
    db = tmp_path / "killed.db"
    script = (
        "import sys\n"
        "from journaled.events.catalog import codec\n"
        "from journaled.events.journal import Journal\n"
        "from journaled.events.url import parse_url\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "from test_store_attack import _result\n"
        "j = Journal(parse_url(sys.argv[1]), codec())\n"
        "v = 0\n"
        "while True:\n"
        "    v += 1\n"
        "    j.append([_result('k', v, 'x' * 3000), _result('q', v, v)])\n"
        "    if v == 40:\n"
        "        print('ready', flush=True)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, f"sqlite:///{db}", str(Path(__file__).parent)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
        if child.stdout is not None:
            child.stdout.close()
    j = Journal(parse_url(f"sqlite:///{db}"), CODEC)
    try:
        k, q = j.stream("k"), j.stream("q")
        assert len(k) >= 40
        assert len(k) == len(q)
        assert [e.version for e in q] == list(range(1, len(q) + 1))
        assert [e.data.observation.output for e in q] == list(range(1, len(q) + 1))  # type: ignore[attr-defined]
        j.append([_result("k", len(k) + 1, "after the crash")])
    finally:
        j.close()
    report = verify(f"sqlite:///{db}")
    assert report.ok, report.problem


# -- the C inboxes ------------------------------------------------------------------------------


class _Recorder(pykka.ThreadingActor):
    """An actor with the executor's inbox that notes what it receives."""

    _create_actor_inbox = staticmethod(quick_inbox)

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate
        self.seen: list[tuple[int, int]] = []

    def on_receive(self, message: Any) -> Any:
        if message == "hold":
            self.gate.wait(30)
            return "held"
        if message == "seen":
            return list(self.seen)
        self.seen.append(message)
        return message


def test_tells_from_many_threads_arrive_in_each_senders_order() -> None:
    """E12 (ADR 0039): a C inbox keeps each sender's tells in order, none lost."""
    ref = _Recorder.start(threading.Event())
    try:
        barrier = threading.Barrier(6)

        def send(sender: int) -> None:
            barrier.wait()
            for n in range(300):
                ref.tell((sender, n))

        threads = [threading.Thread(target=send, args=(s,)) for s in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        seen: list[tuple[int, int]] = ref.ask("seen", timeout=30)  # type: ignore[assignment]
        assert len(seen) == 6 * 300
        for sender in range(6):
            assert [n for s, n in seen if s == sender] == list(range(300))
    finally:
        ref.stop()


def test_stopping_an_actor_with_queued_asks_answers_every_waiter() -> None:
    """E12 (ADR 0039): asks queued in a C inbox when the actor stops are each answered or fail
    with ActorDeadError; no waiter hangs."""
    gate = threading.Event()
    ref = _Recorder.start(gate)
    busy = ref.ask("hold", block=False)
    before = [ref.ask((0, n), block=False) for n in range(50)]
    stopped = ref.stop(block=False)
    after: list[Any] = []
    for n in range(50):
        with contextlib.suppress(pykka.ActorDeadError):  # refused at once: fine too
            after.append(ref.ask((1, n), block=False))
    gate.set()
    assert busy.get(timeout=30) == "held"
    assert [f.get(timeout=30) for f in before] == [(0, n) for n in range(50)]
    stopped.get(timeout=30)
    for future in after:
        with pytest.raises(pykka.ActorDeadError):
            future.get(timeout=30)


def _cancel_as_the_step_ends(url: str) -> None:
    ending = threading.Event()

    def last(data: Any) -> str:
        ending.set()
        return "done"

    with journaled.open(url) as rt:
        rt.register_tool("last", last)
        rt.register_tool("echo", lambda data: data)
        handle = rt.start(
            Plan(
                goal="race",
                steps=[Step("a", tool="last"), Step("b", tool="echo", depends_on=["a"])],
            )
        )
        assert ending.wait(30)
        rt.cancel(handle.run_id)
        result = handle.result(30)
        assert result.ok or any(o.code == "cancelled" for o in result.observations), result
        assert rt.runs.current(handle.run_id) == result
        assert rt.runs.at(handle.run_id, rt.journal.position()) == result


def test_cancelling_as_a_step_ends_settles_the_run_once(sqlite_url: str) -> None:
    """E5/E12 (ADR 0039): a cancel racing a step's end leaves a run that completed or was
    cancelled, whose journal folds to the answer given and verifies."""
    for _ in range(5):
        _cancel_as_the_step_ends(sqlite_url)
    report = verify(sqlite_url)
    assert report.ok, report.problem


# -- memory.as_of: the lazy index, the snapshot start ------------------------------------------


def _memory_story(rt: journaled.Runtime, clock: ManualClock) -> list[str]:
    ids = [rt.memory.remember("deploy region is eu-west", conflict_key="region").id]
    clock.advance(10)
    ids.append(rt.memory.remember("deploy region is us-east", conflict_key="region").id)
    ids.append(rt.memory.remember("rotate keys weekly", domain="ops").id)
    assert rt.memory.checkpoint()
    clock.advance(10)
    ids.append(rt.memory.remember("deploy region is ap-south", conflict_key="region").id)
    rt.memory.delete(ids[2])
    return ids


def _view_answers(view: Any, ids: list[str]) -> bytes:
    return msgspec.json.encode(
        [
            [view.get(i) for i in ids],
            view.all(),
            [view.search(q) for q in ["deploy region", "rotate keys", "eu-west", "nothing"]],
        ]
    )


def test_as_of_from_the_snapshot_answers_as_without_it_at_every_position(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """M12/T1 (ADR 0034): at every position, inside supersession commits and around the
    snapshot, as_of starting from memory's snapshot answers as a fold without it."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        ids = _memory_story(rt, clock)
        end = rt.journal.position()
        served = [_view_answers(rt.memory.as_of(position=p), ids) for p in range(end + 1)]
        journal = rt.memory._journal
        assert journal.snapshot(next(k for k in _snapshot_keys(sqlite_url))) is not None
        monkeypatch.setattr(journal, "snapshot", lambda key: None)
        folded = [_view_answers(rt.memory.as_of(position=p), ids) for p in range(end + 1)]
    assert served == folded


def _snapshot_keys(url: str) -> list[str]:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        return [
            str(k)
            for (k,) in conn.execute(
                f"SELECT stream FROM {SNAPSHOT_TABLE} WHERE stream LIKE 'memory:%'"  # noqa: S608
            )
        ]


def _race_first_searches(view: Any, ids: list[str]) -> list[bytes]:
    barrier = threading.Barrier(8)
    answers: list[bytes] = []
    failures: list[BaseException] = []

    def search() -> None:
        try:
            barrier.wait()
            answers.append(_view_answers(view, ids))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=search) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert failures == []
    return answers


def test_first_searches_of_one_view_racing_from_many_threads_agree(
    sqlite_url: str, clock: ManualClock
) -> None:
    """M12/T1 (ADR 0034): the lazy index of a past view, built by whichever of eight racing
    first searches wins, answers each of them as a view searched from one thread."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        ids = _memory_story(rt, clock)
        for p in range(1, rt.journal.position() + 1):
            expected = _view_answers(rt.memory.as_of(position=p), ids)
            answers = _race_first_searches(rt.memory.as_of(position=p), ids)
            assert answers == [expected] * 8, p


def test_a_purge_racing_a_lazy_index_build_leaves_no_view_with_the_text(
    sqlite_url: str, clock: ManualClock
) -> None:
    """R2/M12 (ADR 0034): a purge while past views build their index fails nothing, and every
    view made after it returns, at any position, lacks the text; the chain verifies."""
    secret = "purge-this-token-7"
    with journaled.open(sqlite_url, clock=clock) as rt:
        fact = rt.memory.remember(f"the {secret} opens the vault")
        _memory_story(rt, clock)
        end = rt.journal.position()
        failures: list[BaseException] = []
        go = threading.Barrier(5)

        def search(position: int) -> None:
            try:
                go.wait()
                for _ in range(5):
                    rt.memory.as_of(position=position).search("vault")
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=search, args=(p,)) for p in (1, 3, end - 1, end)]
        for t in threads:
            t.start()
        go.wait()
        assert rt.memory.purge(fact.id)
        for t in threads:
            t.join(60)
        assert failures == []
        for p in range(rt.journal.position() + 1):
            view = rt.memory.as_of(position=p)
            assert secret not in msgspec.json.encode(view.all()).decode(), p
            assert view.search("vault") == [] or all(
                secret not in f.text for f in view.search("vault")
            )
    report = verify(sqlite_url)
    assert report.ok, report.problem


def test_as_of_never_answers_an_altered_snapshot_text(sqlite_url: str, clock: ManualClock) -> None:
    """M12/R7 (ADR 0034): a memory snapshot whose fact text was altered is not served: as_of
    answers the journal's texts."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        ids = _memory_story(rt, clock)
    [key] = _snapshot_keys(sqlite_url)
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as conn:
        [(state,)] = conn.execute(
            f"SELECT state FROM {SNAPSHOT_TABLE} WHERE stream = ?",  # noqa: S608
            (key,),
        )
        snapshot = msgspec.msgpack.decode(bytes(state))
        scope = snapshot["scopes"]["project"]  # embedded as encoded (ADR 0058)
        scope["facts"][ids[0]]["text"] = "wire the funds to account 666"
        conn.execute(
            f"UPDATE {SNAPSHOT_TABLE} SET state = ? WHERE stream = ?",  # noqa: S608
            (msgspec.msgpack.encode(snapshot), key),
        )
    with journaled.open(sqlite_url, clock=clock) as rt:
        for p in range(rt.journal.position() + 1):
            view = rt.memory.as_of(position=p)
            assert "account 666" not in msgspec.json.encode(view.all()).decode(), p
            assert view.search("funds account") == []
        assert rt.memory.as_of(position=rt.journal.position()).get(ids[0]).text == (  # type: ignore[union-attr]
            "deploy region is eu-west"
        )


def test_as_of_never_answers_an_altered_snapshot_field(sqlite_url: str, clock: ManualClock) -> None:
    """M12/R7 (ADR 0034): as_of answers a fact as the journal's events have it, whatever a
    forged memory snapshot says of it."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        ids = _memory_story(rt, clock)
        end = rt.journal.position()
        before = rt.memory.as_of(position=end).get(ids[1])
    assert before is not None
    [key] = _snapshot_keys(sqlite_url)
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as conn:
        [(state,)] = conn.execute(
            f"SELECT state FROM {SNAPSHOT_TABLE} WHERE stream = ?",  # noqa: S608
            (key,),
        )
        snapshot = msgspec.msgpack.decode(bytes(state))
        scope = snapshot["scopes"]["project"]  # embedded as encoded (ADR 0058)
        scope["facts"][ids[1]]["confidence"] = 0.01
        conn.execute(
            f"UPDATE {SNAPSHOT_TABLE} SET state = ? WHERE stream = ?",  # noqa: S608
            (msgspec.msgpack.encode(snapshot), key),
        )
    report = verify(sqlite_url)
    assert report.problem is not None
    assert report.problem.kind == "snapshot-altered"
    with journaled.open(sqlite_url, clock=clock) as rt:
        after = rt.memory.as_of(position=end).get(ids[1])
    assert after is not None
    assert after.confidence == before.confidence == 1.0


def test_a_purged_run_with_many_side_rows_reads_hollow_by_the_key_range(sqlite_url: str) -> None:
    """R2/T1 (ADR 0034): a run of 40 steps, purged, reads its outputs as erased through the
    one-range side-row read, cold and warm, and still verifies."""
    run_id = _chain(sqlite_url, steps=40)
    with journaled.open(sqlite_url) as rt:
        assert rt.runs.purge(run_id, reason="erasure request") > 0
    with journaled.open(sqlite_url) as rt:
        end = rt.journal.position()
        cold = rt.runs.at(run_id, end)
        assert len(cold.observations) == 40
        assert {msgspec.json.encode(o.output) for o in cold.observations} == {
            msgspec.json.encode(PURGED)
        }
        assert rt.runs.current(run_id) == cold
        history = list(rt.runs.history(run_id))
        assert '{"echo":' not in msgspec.json.encode([e.data for e in history]).decode()
    report = verify(sqlite_url)
    assert report.ok, report.problem


def test_a_nul_in_a_conflict_key_is_stored_or_refused_naming_the_field(pg_url: str) -> None:
    """J1/M3: a conflict key holding a NUL (its stream id holds it) is remembered on PostgreSQL
    as on SQLite, or refused with a one-line error naming conflict_key; nothing is appended."""
    with journaled.open(pg_url) as rt:
        before = rt.journal.position()
        refused: Exception | None = None
        try:
            fact = rt.memory.remember("the key has a NUL", conflict_key="a\x00b")
        except Exception as exc:  # which one is the question
            refused = exc
        if refused is None:
            assert rt.memory.get(fact.id) == fact
        else:
            assert "conflict_key" in str(refused), repr(refused)
            assert "\n" not in str(refused)
            assert rt.journal.position() == before


def test_closing_with_steps_queued_answers_every_waiter_and_resumes(sqlite_url: str) -> None:
    """R3/E12 (ADR 0039): closing while steps are in flight and queued in C inboxes answers
    every run's waiter (suspended, none hangs); each run resumes to its end and verifies."""
    gate = threading.Event()
    entered: list[int] = []

    def block(data: Any) -> Any:
        entered.append(data)
        gate.wait(30)
        return data

    rt = journaled.open(sqlite_url)
    try:
        rt.register_tool("block", block)
        rt.register_tool("echo", lambda data: data)
        plan = Plan(
            goal="queued",
            steps=[
                *[Step(f"s{j}", tool="block", input=j) for j in range(4)],
                Step("z", tool="echo", input="end", depends_on=["s0"]),
            ],
        )
        handles = [rt.start(plan, max_parallel_steps=4) for _ in range(3)]
        wait_for(lambda: len(entered) >= 3)
    finally:
        rt.close(drain=0.2)
    results = [h.result(10) for h in handles]
    assert all(r.suspended for r in results), results
    gate.set()
    with journaled.open(sqlite_url) as again:
        again.register_tool("block", lambda data: data)
        again.register_tool("echo", lambda data: data)
        for h in handles:
            resumed = again.runs.resume(h.run_id)
            assert resumed.ok
            outputs = {o.step_id: o.output for o in resumed.observations}
            assert outputs == {"s0": 0, "s1": 1, "s2": 2, "s3": 3, "z": "end"}
    report = verify(sqlite_url)
    assert report.ok, report.problem


def test_two_runtimes_on_one_file_run_and_remember_from_many_threads(sqlite_url: str) -> None:
    """J1/J3/R7 (ADR 0039): two runtimes on one SQLite file, three threads each executing
    chains and claiming one conflict key: every run succeeds, one fact wins, the chain verifies."""
    runtimes = [journaled.open(sqlite_url) for _ in range(2)]
    failures: list[BaseException] = []
    results: list[Any] = []

    def work(rt: journaled.Runtime, n: int) -> None:
        try:
            for k in range(4):
                steps = [
                    Step(f"s{j}", tool="echo", input=j, depends_on=[f"s{j - 1}"] if j else [])
                    for j in range(8)
                ]
                results.append(rt.execute(Plan(goal=f"g{n}-{k}", steps=steps)))
                rt.memory.remember(f"fact {n} {k}", conflict_key="shared")
        except BaseException as exc:
            failures.append(exc)

    try:
        for rt in runtimes:
            rt.register_tool("echo", lambda data: {"v": data})
        threads = [threading.Thread(target=work, args=(runtimes[i % 2], i)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert failures == []
        assert len(results) == 24
        assert all(r.ok for r in results)
        for rt in runtimes:
            rt.refresh()
            live = [
                f for f in rt.memory.all() if f.conflict_key == "shared" and not f.superseded_by
            ]
            assert len(live) == 1
    finally:
        for rt in runtimes:
            rt.close()
    report = verify(sqlite_url)
    assert report.ok, report.problem


def test_an_append_refused_by_a_locked_file_stores_nothing_and_the_next_chains(
    sqlite_url: str,
) -> None:
    """J1/R7 (ADR 0039): when another connection holds the file's write lock past the lock
    timeout, the append fails whole; once the lock is free the append connection chains on."""
    j = Journal(msgspec.structs.replace(parse_url(sqlite_url), lock_wait=0.2), CODEC)
    try:
        j.append([_result("a", 1, "one")])
        holder = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            started = time.monotonic()
            with pytest.raises(JournalBusy, match="is busy: another connection held its write"):
                j.append([_result("a", 2, "refused"), _result("b", 1, "refused")])
            assert time.monotonic() - started < 10, "the append waited past its lock_wait"
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert j.stream("b") == []
        j.append([_result("a", 2, "two")])
        assert [e.data.observation.output for e in j.stream("a")] == ["one", "two"]  # type: ignore[attr-defined]
    finally:
        j.close()
    report = verify(sqlite_url)
    assert report.ok, report.problem
    assert report.events == 2


def test_organizations_whose_ids_share_a_prefix_and_hold_at_signs_keep_their_own_memory(
    sqlite_url: str,
) -> None:
    """R1/M12 (ADR 0034): organizations "acme", "acme@corp.example", "acme@" and "acmeA", each
    with its memory snapshot in one file, each see only their organization facts, live and
    as_of from their own snapshot."""
    orgs = ["acme", "acme@corp.example", "acme@", "acmeA"]
    for org in orgs:
        with journaled.open(sqlite_url, organization=org) as rt:
            rt.memory.remember(f"{org} ships on Fridays", scope="organization")
            assert rt.memory.checkpoint()
    assert len(_snapshot_keys(sqlite_url)) == len(orgs)
    for org in orgs:
        with journaled.open(sqlite_url, organization=org) as rt:
            live = sorted(f.text for f in rt.memory.all())
            past = sorted(f.text for f in rt.memory.as_of(position=rt.journal.position()).all())
            assert live == past == [f"{org} ships on Fridays"]
            assert [f.text for f in rt.memory.search("ships Fridays")] == live
    report = verify(sqlite_url)
    assert report.ok, report.problem
    assert report.snapshots == len(orgs)


def test_runs_at_on_a_mixed_stream_answers_a_plain_fold_at_every_position(
    tmp_path: Path,
) -> None:
    """T1/J5 (ADR 0034, 0040): on a stream of maps then arrays, cold and warm runs.at at
    every position (inside commits too) equal a plain fold of the events up to it."""
    url, expected = copy_journal(tmp_path, "map-payloads-runs")
    wide = expected["runs"]["wide"]
    with journaled.open(url, clock=ManualClock(start=1_800_000_000_000)) as rt:
        for name in ("noop", "echo", "crash"):
            rt.register_tool(name, lambda data: data)
        rt.runs.resume(wide, take_over=True)
    with journaled.open(url) as rt:
        history = list(rt.runs.history(wide))
        positions = [e.position for e in history]
        cold = [rt.runs.at(wide, p) for p in reversed(positions)][::-1]
        warm = [rt.runs.at(wide, p) for p in positions]
    plain = [fold_run([e for e in history if e.position <= p]).result() for p in positions]
    assert msgspec.json.encode(cold) == msgspec.json.encode(plain)
    assert msgspec.json.encode(warm) == msgspec.json.encode(plain)


@pytest.mark.parametrize("event", EDGE_EVENTS, ids=lambda e: type(e).__name__)
def test_every_truncation_and_byte_change_of_a_positional_row_decodes_or_is_corrupt(
    event: DomainEvent,
) -> None:
    """J5/R7 (ADR 0040): each prefix of a positional row, and each byte of it set to msgpack's
    type markers, decodes to an event or is a CorruptEvent: no other exception escapes."""
    topic, stored = CODEC.topic(event), CODEC.encode(event)
    markers = (0x00, 0x7F, 0x90, 0x9F, 0xA0, 0xC0, 0xC1, 0xC2, 0xCC, 0xDC, 0xDD, 0xDE, 0xFF)
    damaged = [stored[:i] for i in range(len(stored))]
    damaged += [
        stored[:i] + bytes((marker,)) + stored[i + 1 :]
        for i in range(len(stored))
        for marker in markers
    ]
    corrupt = 0
    for payload in damaged:
        try:
            assert isinstance(CODEC.decode(topic, payload, 3), DomainEvent)
        except CorruptEvent:
            corrupt += 1
    assert corrupt >= len(stored)  # at least every truncation was refused


def test_closing_a_runtime_while_threads_remember_fails_them_as_closed_and_loses_nothing(
    sqlite_url: str,
) -> None:
    """R3/J1 (ADR 0039): remembers racing rt.close() return (and are stored) or raise
    RuntimeClosed; no thread hangs; every acknowledged fact is there after reopening."""
    acknowledged: list[str] = []
    errors: list[BaseException] = []
    rt = journaled.open(sqlite_url)
    go = threading.Barrier(5)

    def remember(n: int) -> None:
        go.wait()
        k = 0
        while True:
            try:
                acknowledged.append(rt.memory.remember(f"fact {n} {k}").text)
            except BaseException as exc:
                errors.append(exc)
                return
            k += 1

    threads = [threading.Thread(target=remember, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    go.wait()
    wait_for(lambda: len(acknowledged) >= 20)
    rt.close()
    for t in threads:
        t.join(30)
    assert not [t for t in threads if t.is_alive()]
    assert len(errors) == 4
    assert all(isinstance(e, journaled.RuntimeClosed) for e in errors), errors
    with journaled.open(sqlite_url) as again:
        stored = {f.text for f in again.memory.all()}
    assert set(acknowledged) <= stored
    report = verify(sqlite_url)
    assert report.ok, report.problem


@pytest.mark.parametrize("forgery", ["deleted", "inserted"])
def test_verify_reports_a_side_row_deleted_or_slipped_into_a_key_range(
    sqlite_url: str, forgery: str
) -> None:
    """R7 (ADR 0034): a side row of a 40-step run deleted, or one slipped into its key range
    under a key the range read also accepts (``<run>@07``), is reported by verify."""
    run_id = _chain(sqlite_url, steps=40)
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as conn:
        if forgery == "deleted":
            [(key,)] = conn.execute(
                f"SELECT stream FROM {PAYLOAD_TABLE} WHERE stream = ?",  # noqa: S608
                (f"{run_id}@19",),
            )
            conn.execute(f"DELETE FROM {PAYLOAD_TABLE} WHERE stream = ?", (key,))  # noqa: S608
        else:
            conn.execute(
                f"INSERT INTO {PAYLOAD_TABLE} VALUES (?, ?)",  # noqa: S608
                (f"{run_id}@07", msgspec.msgpack.encode(["forged"])),
            )
    report = verify(sqlite_url)
    assert report.problem is not None
    assert report.problem.kind == f"payload-{'removed' if forgery == 'deleted' else 'inserted'}"


@pytest.mark.parametrize("field", ["scope", "domain", "conflict_key"])
def test_a_nul_in_a_name_is_refused_on_every_backend(journal_url: str, field: str) -> None:
    """M2: a NUL in a scope, domain or conflict key is one error naming the field, anywhere."""
    with journaled.open(journal_url) as rt:
        before = rt.journal.position()
        kwargs = {"scope": "user:al\x00ice"} if field == "scope" else {field: "a\x00b"}
        with pytest.raises(journaled.InvalidFact, match=f"{field}.*NUL"):
            rt.memory.remember("a fact", **kwargs)  # type: ignore[arg-type]
        assert rt.journal.position() == before
