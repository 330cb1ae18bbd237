"""The write path stores what an audit needs once (ADR 0035): partitions only when they carry
information, no side row for empty content, and old journals read, verify and resume alike."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest
from old_journals import copy_journal, register_tools

import journaled
from journaled.events.base import PURGED, DomainEvent
from journaled.events.codec import Codec, tag_of
from journaled.events.errors import CorruptEvent
from journaled.events.journal._digest import SEALED, unsealed
from journaled.events.plans import Observation
from journaled.events.run_state import fold_run
from journaled.events.runs import StepStarted, WavePartitioned, implied_partitions
from journaled.runtime import verify
from journaled.testing import ManualClock


def _kinds(rt: journaled.Runtime, run_id: str, kind: str) -> list[Any]:
    return [e.data for e in rt.runs.history(run_id) if e.kind == kind]


def _chain(n: int) -> journaled.Plan:
    return journaled.Plan(
        goal="chain",
        steps=[
            journaled.Step(f"c{i}", tool="noop", depends_on=[f"c{i - 1}"] if i else [])
            for i in range(n)
        ],
    )


def test_a_partition_implied_by_its_starts_is_not_stored(rt: journaled.Runtime) -> None:
    """E2/R4: a wave whose steps all start in its commit is stored as those starts alone."""
    rt.register_tool("noop", lambda data: None)
    result = rt.execute(_chain(4))
    assert result.ok
    assert _kinds(rt, result.run_id, "run.wave-partitioned") == []
    starts = _kinds(rt, result.run_id, "run.step-started")
    assert [(s.wave, s.step_id) for s in starts] == [(i + 1, f"c{i}") for i in range(4)]
    assert rt.runs.state(result.run_id).wave == 4


def test_a_partition_that_holds_steps_back_or_skips_is_stored(rt: journaled.Runtime) -> None:
    """E3/E4: a partition naming steps held back by max_parallel_steps, or skipped, is stored."""
    rt.register_tool("echo", lambda data: data)

    def fail(data: object) -> object:
        raise RuntimeError("no")

    rt.register_tool("fail", fail)
    plan = journaled.Plan(
        goal="wide",
        steps=[
            journaled.Step("a", tool="echo"),
            journaled.Step("b", tool="fail"),
            journaled.Step("c", tool="echo", depends_on=["b"]),
            journaled.Step("d", tool="echo", depends_on=["a"]),
        ],
    )
    result = rt.execute(plan, max_parallel_steps=1)
    parts = _kinds(rt, result.run_id, "run.wave-partitioned")
    assert [(p.wave, p.runnable, [o.step_id for o in p.skipped]) for p in parts] == [
        (1, ("a", "b"), []),
        (2, ("d",), ["c"]),
    ]


def test_implied_partitions_rule() -> None:
    """E2: only a partition whose runnable steps all start after it, in its wave, is implied."""

    def part(wave: int, *runnable: str, skipped: bool = False) -> WavePartitioned:
        skips = (Observation(step_id="z", ok=False, error="skipped"),) if skipped else ()
        return WavePartitioned(at=1, wave=wave, runnable=runnable, skipped=skips)

    def start(step: str, wave: int) -> StepStarted:
        return StepStarted(at=1, step_id=step, attempt=1, wave=wave)

    assert implied_partitions([part(1, "a", "b"), start("a", 1), start("b", 1)]) == {0}
    assert implied_partitions([part(1, "a", "b"), start("a", 1)]) == set()
    assert implied_partitions([part(1, "a"), start("a", 1), part(2, "b")]) == {0}
    assert implied_partitions([part(1, "a", skipped=True), start("a", 1)]) == set()
    assert implied_partitions([part(2, "a"), start("a", 1)]) == set()
    assert implied_partitions([part(1, "a")]) == set()
    assert implied_partitions([part(1), start("a", 1)]) == set()


def test_every_position_rebuilds_the_live_state_without_partitions(clock: ManualClock) -> None:
    """O7/R5: with implied partitions left out, runs.at(position) equals the traced live state."""
    trace: list[tuple[int, journaled.ExecuteResult]] = []
    plan = journaled.Plan(
        goal="mixed",
        steps=[
            journaled.Step("a", tool="t"),
            journaled.Step("b", tool="t"),
            journaled.Step("c", tool="t", depends_on=["a", "b"]),
            journaled.Step("d", tool="t", depends_on=["c"]),
        ],
    )
    with journaled.open("memory://", clock=clock) as rt:
        rt.register_tool("t", lambda data: data)
        result = rt.runs.execute(plan, trace=lambda p, state: trace.append((p, state)))
        assert result.ok
        assert _kinds(rt, result.run_id, "run.wave-partitioned") == []
        assert trace[-1][1] == result
        for position, live in trace:
            assert rt.runs.at(result.run_id, position) == live
        cold = fold_run(rt.runs.history(result.run_id))
        assert cold.wave == rt.runs.state(result.run_id).wave == 3
        assert cold.snapshot() == rt.runs.state(result.run_id).snapshot()


def test_a_step_without_output_writes_no_side_row(sqlite_url: str) -> None:
    """R2/ADR 0018: a content event whose content is empty is stored once, with no payload row."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("noop", lambda data: None)
        rt.register_tool("echo", lambda data: {"out": data})
        quiet = rt.execute(_chain(3))
        loud = rt.execute(journaled.Plan(goal="g", steps=[journaled.Step("x", tool="echo")]))
    conn = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    try:
        keys = {k for (k,) in conn.execute("SELECT stream FROM journaled_payloads")}
    finally:
        conn.close()
    assert {k for k in keys if k.startswith(quiet.run_id)} == {f"{quiet.run_id}@1"}
    assert {k for k in keys if k.startswith(loud.run_id)} == {
        f"{loud.run_id}@1",
        f"{loud.run_id}@3",
    }


def test_a_run_without_side_rows_purges_and_verifies(journal_url: str) -> None:
    """R2/R7: a run whose steps returned nothing purges, keeps its shape and verifies."""
    with journaled.open(journal_url) as rt:
        rt.register_tool("noop", lambda data: None)
        result = rt.execute(_chain(3))
        rt.runs.purge(result.run_id, "test")
        after = rt.runs.current(result.run_id)
        assert [s.status for s in after.plan.steps] == ["succeeded"] * 3
        assert after.plan.goal == PURGED
    report = verify(journal_url)
    assert report.ok, report


def test_tampering_with_a_step_event_without_side_row_is_reported(sqlite_url: str) -> None:
    """R7: a changed byte in a step event stored without a side row is reported as altered."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("noop", lambda data: None)
        result = rt.execute(_chain(3))
        succeeded = [e for e in rt.runs.history(result.run_id) if e.kind == "run.step-succeeded"]
    position = succeeded[1].position
    conn = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    try:
        [(state,)] = conn.execute("SELECT state FROM stored_events WHERE rowid = ?", (position,))
        changed = bytes(state).replace(b"c1", b"c9")
        assert changed != state
        conn.execute("UPDATE stored_events SET state = ? WHERE rowid = ?", (changed, position))
        conn.commit()
    finally:
        conn.close()
    report = verify(sqlite_url)
    assert not report.ok
    assert report.problem is not None
    assert (report.problem.position, report.problem.kind) == (position, "altered")


@pytest.fixture
def release2(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """Copy the journal release 2 wrote (make_release2_runs.py) and load its expected results."""
    return copy_journal(tmp_path, "release2-runs")


def test_a_release2_journal_reads_and_verifies_identically(
    release2: tuple[str, dict[str, Any]],
) -> None:
    """J5/R7: runs written with every partition and empty side rows fold and verify as before."""
    url, expected = release2
    with journaled.open(url) as rt:
        for name, run_id in expected["runs"].items():
            assert msgspec.to_builtins(rt.runs.current(run_id)) == expected["results"][name]
            assert _kinds(rt, run_id, "run.wave-partitioned") != []
    report = verify(url)
    assert report.ok, report


def test_a_release2_run_cut_off_by_a_crash_resumes_identically(
    release2: tuple[str, dict[str, Any]],
) -> None:
    """E14/J5: the run a crash cut off in release 2's layout resumes to release 2's result."""
    url, expected = release2
    with journaled.open(url, clock=ManualClock(start=1_800_000_000_000)) as rt:
        register_tools(rt)
        resumed = rt.runs.resume(expected["runs"]["wide"], take_over=True)
        assert msgspec.to_builtins(resumed) == expected["resumed"]
    report = verify(url)
    assert report.ok, report


def test_tampering_with_a_release2_side_row_is_still_reported(
    release2: tuple[str, dict[str, Any]],
) -> None:
    """R7: in release 2's layout, a changed side row is reported as payload-altered."""
    url, expected = release2
    chain = expected["runs"]["chain"]
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        # A step-succeeded of release 2 kept a side row even for an output of None.
        [(key,)] = conn.execute(
            "SELECT stream FROM journaled_payloads WHERE stream LIKE ? AND stream != ? LIMIT 1",
            (f"{chain}@%", f"{chain}@1"),
        )
        [(payload,)] = conn.execute(
            "SELECT payload FROM journaled_payloads WHERE stream = ?", (key,)
        )
        conn.execute(
            "UPDATE journaled_payloads SET payload = ? WHERE stream = ?",
            (bytes(payload).replace(b"noop", b"nooq"), key),
        )
        conn.commit()
    finally:
        conn.close()
    report = verify(url)
    assert not report.ok
    assert report.problem is not None
    assert report.problem.kind == "payload-altered"


def test_sqlite_connections_keep_prepared_statements(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """J4: the journal's SQLite connections cache statements (BEGIN and INSERT both stay
    prepared) and keep WAL, secure_delete and the chosen synchronous level."""
    seen: list[dict[str, Any]] = []
    connect = sqlite3.connect

    def spy(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        seen.append(kwargs)
        conn: sqlite3.Connection = connect(*args, **kwargs)
        return conn

    monkeypatch.setattr(sqlite3, "connect", spy)
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("noop", lambda data: None)
        assert rt.execute(_chain(2)).ok
    pooled = [k for k in seen if k.get("check_same_thread") is False]
    assert pooled
    assert all(k["cached_statements"] >= 8 for k in pooled)
    monkeypatch.undo()
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


class _Wide(DomainEvent, frozen=True, kw_only=True, tag="test.wide"):
    """An event of more than 15 fields: msgpack writes its map with a 16-bit count."""

    f1: int = 1
    f2: int = 2
    f3: int = 3
    f4: int = 4
    f5: int = 5
    f6: int = 6
    f7: int = 7
    f8: int = 8
    f9: int = 9
    f10: int = 10
    f11: int = 11
    f12: int = 12
    f13: int = 13
    f14: int = 14
    f15: int = 15


def test_payloads_are_stored_without_their_tag_and_decode_either_way() -> None:
    """J5: a payload omits the tag its topic names; tagged (older) and untagged payloads decode
    to the same event, also through a plain typed decoder as an older release has."""
    events: list[DomainEvent] = [
        StepStarted(at=1, step_id="a", attempt=1, wave=1),
        WavePartitioned(at=2, wave=1, runnable=("a", "b")),
        _Wide(at=3, **{f"f{i}": 0 for i in range(1, 15)}),  # 16 entries with the tag
        _Wide(at=4, **{f"f{i}": 0 for i in range(1, 16)}),  # 17
    ]
    assert [msgspec.msgpack.encode(e)[0] for e in events[2:]] == [0xDE, 0xDE]
    own = Codec([StepStarted, WavePartitioned, _Wide])
    for event in events:
        stored = own.encode(event)
        tagged = msgspec.msgpack.encode(event)
        assert msgspec.msgpack.decode(tagged)["type"] == tag_of(type(event))
        assert "type" not in msgspec.msgpack.decode(stored)
        assert len(stored) == len(tagged) - 2 - len("type") - len(tag_of(type(event)))
        topic = own.topic(event)
        assert own.decode(topic, stored) == own.decode(topic, tagged) == event
        assert msgspec.msgpack.Decoder(type(event)).decode(stored) == event


def test_a_side_row_holds_only_the_content(sqlite_url: str) -> None:
    """R2/ADR 0035: a content event's side row holds its content values, not the whole event;
    read back, the event is whole again, and a side row with a value too few is refused."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("echo", lambda data: {"out": data})
        result = rt.execute(
            journaled.Plan(goal="the goal", steps=[journaled.Step("x", tool="echo", input="in")])
        )
        history = rt.runs.history(result.run_id)
        started, succeeded = history[0].data, history[-2].data
    assert started.plan.goal == "the goal"  # type: ignore[attr-defined]
    assert succeeded.observation.output == {"out": "in"}  # type: ignore[attr-defined]
    path = sqlite_url.removeprefix("sqlite:///")
    conn = sqlite3.connect(path)
    try:
        rows = dict(conn.execute("SELECT stream, payload FROM journaled_payloads"))
        [key] = [k for k in rows if k == f"{result.run_id}@{history[-2].version}"]
        assert rows[key][:1] == SEALED  # salted (ADR 0096)
        assert msgspec.msgpack.decode(unsealed(rows[key])) == [{"out": "in"}, None, None]
        assert msgspec.msgpack.decode(unsealed(rows[f"{result.run_id}@1"])) == [
            "in",
            "the goal",
        ]  # steps' inputs, then the goal
        conn.execute(
            "UPDATE journaled_payloads SET payload = ? WHERE stream = ?",
            (msgspec.msgpack.encode([{"out": "in"}, None]), key),
        )
        conn.commit()
    finally:
        conn.close()
    with journaled.open(sqlite_url) as rt, pytest.raises(CorruptEvent, match="fewer values"):
        rt.runs.history(result.run_id)
