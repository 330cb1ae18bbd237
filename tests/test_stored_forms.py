"""The stored forms of ADR 0040: positional run events and compressed caches (issue 12, J5, R7)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from old_journals import copy_journal, register_tools

import journaled
from journaled.events.base import DomainEvent
from journaled.events.catalog import codec
from journaled.events.codec import Codec
from journaled.events.compressed import deflate, inflate
from journaled.events.errors import CorruptEvent
from journaled.events.journal import SNAPSHOT_TABLE
from journaled.events.plans import OBSERVATION_CODES, Limits, Observation, Plan, Step
from journaled.events.run_state import RunFold, fold_run
from journaled.events.run_summaries import SUMMARIES_KEY
from journaled.events.runs import (
    POSITIONAL_RUN_EVENTS,
    MemoryRead,
    RunFinished,
    RunStarted,
    StepFailed,
    StepStarted,
    StepSucceeded,
    WavePartitioned,
)
from journaled.runtime import verify
from journaled.testing import ManualClock

CODEC = codec()
MAPS = Codec(CODEC.types)  # this codec without positional forms: the layout before ADR 0040
AT = 1_764_560_000_000

observations = st.builds(
    Observation,
    step_id=st.sampled_from(["s1", "s2"]),
    ok=st.booleans(),
    skill=st.none() | st.text(max_size=5),
    tool=st.none() | st.just("noop"),
    output=st.none()
    | st.text(max_size=5)
    | st.integers(-9, 2**40)
    | st.lists(st.integers(0, 9), max_size=2),
    error=st.none() | st.text(max_size=5),
    code=st.none() | st.sampled_from(sorted(OBSERVATION_CODES)),
    artifacts=st.tuples() | st.tuples(st.text(max_size=3)),
    calls_used=st.none() | st.integers(0, 9),
)
steps = st.builds(
    Step,
    id=st.sampled_from(["a", "b", ""]),
    tool=st.none() | st.just("noop"),
    input=st.none() | st.text(max_size=5) | st.dictionaries(st.text(max_size=2), st.integers(0, 9)),
    depends_on=st.lists(st.sampled_from(["a", "b"]), max_size=2),
    status=st.sampled_from(["pending", "succeeded"]),
)
run_events = st.one_of(
    st.builds(
        StepStarted,
        at=st.integers(0, 2**63 - 1),
        step_id=st.sampled_from(["s1", "s2"]),
        attempt=st.integers(1, 300),
        wave=st.integers(1, 70_000),
    ),
    st.builds(
        StepSucceeded,
        at=st.just(AT),
        step_id=st.sampled_from(["s1", "s2"]),
        attempt=st.integers(1, 3),
        observation=observations,
        charged=st.integers(0, 3),
    ),
    st.builds(
        StepFailed,
        at=st.just(AT),
        step_id=st.just("s1"),
        attempt=st.just(1),
        observation=observations,
    ),
    st.builds(
        WavePartitioned,
        at=st.just(AT),
        wave=st.integers(1, 9),
        runnable=st.tuples() | st.tuples(st.just("s1")),
        skipped=st.lists(observations, max_size=2).map(tuple),
        unobserved=st.tuples() | st.tuples(st.just("s2")),
    ),
    st.builds(
        RunStarted,
        at=st.just(AT),
        run_id=st.just("run_1"),
        plan=st.builds(
            Plan,
            goal=st.text(max_size=5),
            steps=st.lists(steps, max_size=3),
            id=st.text(max_size=3),
        ),
        call_budget=st.none() | st.integers(0, 5),
        max_parallel_steps=st.integers(1, 3),
        limits=st.just(Limits()) | st.just(Limits(per_tool={"noop": 1})),
        owner=st.text(max_size=3),
        reserve=st.none() | st.just("m:f"),
    ),
    st.builds(
        MemoryRead,
        at=st.just(AT),
        step_id=st.just("s1"),
        attempt=st.just(1),
        fact_ids=st.tuples() | st.tuples(st.just("f1")),
    ),
    st.builds(
        RunFinished,
        at=st.just(AT),
        status=st.sampled_from(["completed", "failed"]),
        ok=st.booleans(),
        calls_used=st.integers(0, 3),
        waiting=st.tuples() | st.tuples(st.just("s1")),
    ),
)


@settings(max_examples=300, deadline=None)
@given(run_events)
def test_every_positional_run_event_round_trips(event: DomainEvent) -> None:
    """J5: a hot run event is stored as an array of its values and decodes to the same event."""
    assert type(event) in POSITIONAL_RUN_EVENTS
    payload = CODEC.encode(event)
    assert payload[0] in (*range(0x90, 0xA0), 0xDC), payload  # a msgpack array
    assert CODEC.decode(CODEC.topic(event), payload) == event
    assert CODEC.topic(event) == MAPS.topic(event)  # same topic, same version


def test_a_step_result_stores_no_field_names_and_no_repeated_step_id() -> None:
    """J5 (ADR 0040): a no-op step's events are a few values, the observation's id left out."""
    started = StepStarted(at=AT, step_id="c250", attempt=1, wave=251)
    done = StepSucceeded(
        at=AT,
        step_id="c250",
        attempt=1,
        observation=Observation(step_id="c250", ok=True, tool="noop"),
    )
    for event, size in ((started, 18), (done, 25)):
        payload = CODEC.encode(event)
        assert len(payload) == size, payload
        assert b"step_id" not in payload
        assert CODEC.decode(CODEC.topic(event), payload) == event
    assert CODEC.encode(done).count(b"c250") == 1
    other = msgspec.structs.replace(done, observation=Observation(step_id="c9", ok=False))
    assert CODEC.decode(CODEC.topic(other), CODEC.encode(other)) == other


@settings(max_examples=100, deadline=None)
@given(run_events)
def test_map_payloads_of_earlier_releases_still_decode(event: DomainEvent) -> None:
    """J5: the tagged map of release 2 and the untagged map of ADR 0035 decode as before."""
    topic = CODEC.topic(event)
    assert CODEC.decode(topic, msgspec.msgpack.encode(event)) == event
    assert CODEC.decode(topic, MAPS.encode(event)) == event


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (
            msgspec.msgpack.encode([AT, "s1", "one", 1]),
            r"got `str` - at `\$\[2\]` \(StepStarted.attempt\)",
        ),
        (msgspec.msgpack.encode([AT, "s1"]), "Expected `array` of at least length 4"),
        (
            msgspec.msgpack.encode([AT, None, 1, 1]),
            r"got `None` - at `\$\[1\]` \(StepStarted.step_id\)",
        ),
        (b"\x94\xcf\x00", "malformed"),
    ],
)
def test_a_malformed_positional_payload_is_a_corrupt_event(payload: bytes, why: str) -> None:
    """J5: a positional payload that does not fit its topic's fields is refused, with where."""
    with pytest.raises(CorruptEvent, match=why) as caught:
        CODEC.decode("run.step-started@1", payload, position=7)
    assert "7" in str(caught.value)


def _run(url: str) -> str:
    with journaled.open(url, clock=ManualClock(step=1)) as rt:
        rt.register_tool("echo", lambda data: {"echo": data})
        steps = [
            Step(f"c{i}", tool="echo", input=i, depends_on=[f"c{i - 1}"] if i else [])
            for i in range(5)
        ]
        return rt.execute(Plan(goal="chain", steps=steps)).run_id


def _snapshot(url: str, key: str) -> bytes:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        [(state,)] = conn.execute(f"SELECT state FROM {SNAPSHOT_TABLE} WHERE stream = ?", (key,))  # noqa: S608
        return bytes(state)


def _replace_snapshot(url: str, key: str, state: bytes) -> None:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        conn.execute(f"UPDATE {SNAPSHOT_TABLE} SET state = ? WHERE stream = ?", (state, key))  # noqa: S608


def test_a_compressed_run_snapshot_restores_to_the_fold(sqlite_url: str) -> None:
    """T1/ADR 0009: the stored run snapshot is deflated and restores to the stream's fold."""
    run_id = _run(sqlite_url)
    stored = _snapshot(sqlite_url, run_id)
    assert stored[0] == 0x78  # a zlib stream, not a msgpack map
    with journaled.open(sqlite_url) as rt:
        folded = fold_run(list(rt.runs.history(run_id)))
    restored = RunFold.restore(stored)
    assert restored is not None
    assert restored.result() == folded.result()
    assert inflate(restored.snapshot()) == inflate(folded.snapshot()) == inflate(stored)
    assert len(stored) < len(inflate(stored)) / 2


def test_an_uncompressed_snapshot_of_an_earlier_release_restores() -> None:
    """J5: a run snapshot stored as plain msgpack (before ADR 0040) restores as before."""
    written = RunStarted(at=AT, run_id="run_1", plan=Plan(goal="g", steps=[Step("a", tool="t")]))
    started = CODEC.decode(CODEC.topic(written), CODEC.encode(written))  # as a journal reads it
    state = fold_run(
        [journaled.events.base.Event(position=1, stream="run_1", version=1, data=started)]
    )
    plain = inflate(state.snapshot())
    assert plain[0] in (*range(0x80, 0x90), 0xDE)
    restored = RunFold.restore(plain)
    assert restored is not None
    assert inflate(restored.snapshot()) == plain
    assert [s.id for s in restored.plan().steps] == ["a"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_a_corrupt_compressed_snapshot_is_a_cache_miss(sqlite_url: str, damage: str) -> None:
    """T1/ADR 0009: a damaged deflated snapshot is ignored; the run is folded from its events."""
    run_id = _run(sqlite_url)
    with journaled.open(sqlite_url) as rt:
        expected = rt.runs.current(run_id)
        assert rt.runs.summaries.save()
    for key in (run_id, SUMMARIES_KEY):
        stored = _snapshot(sqlite_url, key)
        broken = {
            "flip": stored[:10] + bytes([stored[10] ^ 0xFF]) + stored[11:],
            "truncate": stored[: len(stored) // 2],
            "garbage": b"\x78\x9c-not-deflate",
        }[damage]
        _replace_snapshot(sqlite_url, key, broken)
        assert RunFold.restore(broken) is None or key != run_id
        with pytest.raises(msgspec.DecodeError):
            inflate(broken)
    with journaled.open(sqlite_url) as rt:
        assert rt.runs.current(run_id) == expected
        assert rt.runs.list()[0].steps_done == len(expected.plan.steps)


def test_the_stored_run_summaries_are_compressed_and_read_back(sqlite_url: str) -> None:
    """T2/ADR 0040: the stored run-summary projection is deflated and restores on open."""
    run_id = _run(sqlite_url)
    with journaled.open(sqlite_url) as rt:
        assert rt.runs.summaries.save()
        expected = rt.runs.list()
    stored = _snapshot(sqlite_url, SUMMARIES_KEY)
    assert stored[0] == 0x78
    assert run_id.encode() in inflate(stored)
    assert inflate(deflate(b"\x80")) == b"\x80"
    with journaled.open(sqlite_url) as rt:
        assert rt.runs.list() == expected


@pytest.fixture
def map_payloads(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """Copy the journal written before ADR 0040 (every payload a map, caches uncompressed)."""
    return copy_journal(tmp_path, "map-payloads-runs")


def test_a_journal_of_map_payloads_reads_and_verifies_identically(
    map_payloads: tuple[str, dict[str, Any]],
) -> None:
    """J5/R7: runs stored as maps with an uncompressed snapshot fold and verify as before."""
    url, expected = map_payloads
    chain = expected["runs"]["chain"]
    assert _snapshot(url, chain)[0] == 0xDE  # its snapshot is plain msgpack
    with journaled.open(url) as rt:
        for name, run_id in expected["runs"].items():
            assert msgspec.to_builtins(rt.runs.current(run_id)) == expected["results"][name]
            assert (
                msgspec.to_builtins(fold_run(list(rt.runs.history(run_id))).result())
                == (expected["results"][name])
            )
    report = verify(url)
    assert report.ok, report


def test_a_run_of_map_payloads_cut_off_by_a_crash_resumes_identically(
    map_payloads: tuple[str, dict[str, Any]],
) -> None:
    """E14/J5: a run cut off in the map layout resumes to the same result, appending arrays."""
    url, expected = map_payloads
    with journaled.open(url, clock=ManualClock(start=1_800_000_000_000)) as rt:
        register_tools(rt)
        resumed = rt.runs.resume(expected["runs"]["wide"], take_over=True)
        assert msgspec.to_builtins(resumed) == expected["resumed"]
    report = verify(url)
    assert report.ok, report
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        heads = {bytes(s)[:1] for (s,) in conn.execute("SELECT state FROM stored_events")}
    assert heads & {bytes([0x94]), bytes([0x95])}, heads  # the resume appended arrays
    assert heads & {bytes([0x83]), bytes([0x84])}, heads  # beside the earlier maps
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        sizes = {n for (n,) in conn.execute("SELECT length(chain_digest) FROM stored_events")}
    assert sizes == {None, 16, 32}  # one chain across both digest sizes


@pytest.mark.parametrize("size", [16, 31, 0])
def test_a_shortened_digest_of_an_earlier_release_is_reported(
    map_payloads: tuple[str, dict[str, Any]], size: int
) -> None:
    """R7: cutting a 32-byte chained digest of an earlier release to any size is caught."""
    url, _ = map_payloads
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        [(position, digest)] = conn.execute(
            "SELECT rowid, chain_digest FROM stored_events WHERE chain_digest IS NOT NULL "
            "ORDER BY rowid LIMIT 1"
        )
        assert len(digest) == 32
        conn.execute(
            "UPDATE stored_events SET chain_digest = ? WHERE rowid = ?",
            (bytes(digest)[:size], position),
        )
    report = verify(url)
    assert report.problem is not None
    assert report.problem.kind == "altered"


def test_new_commits_keep_a_16_byte_chained_digest(sqlite_url: str) -> None:
    """R7 (ADR 0040): each commit of this release stores a 16-byte chained digest that verifies."""
    _run(sqlite_url)
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as conn:
        sizes = {n for (n,) in conn.execute("SELECT length(chain_digest) FROM stored_events")}
    assert sizes <= {None, 16}
    assert 16 in sizes
    report = verify(sqlite_url)
    assert report.ok, report
    assert report.head is not None
    assert len(report.head) == 32


def test_a_changed_byte_in_a_positional_row_is_reported(sqlite_url: str) -> None:
    """R7: altering a value inside a positional step row is caught by verify as altered."""
    run_id = _run(sqlite_url)
    path = sqlite_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        [(position, state)] = conn.execute(
            "SELECT rowid, state FROM stored_events WHERE originator_id = ? AND topic = ?",
            (run_id, "run.step-started@1"),
        ).fetchall()[2:3]
        changed = CODEC.encode(
            msgspec.structs.replace(CODEC.decode("run.step-started@1", bytes(state)), attempt=2)
        )
        assert changed != bytes(state)
        conn.execute("UPDATE stored_events SET state = ? WHERE rowid = ?", (changed, position))
    report = verify(sqlite_url)
    assert report.problem is not None
    assert (report.problem.position, report.problem.kind) == (position, "altered")
