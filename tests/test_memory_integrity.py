"""A journal whose fact text vanished without a purge fails loudly on open (J5)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pykka
import pytest

import journaled
from journaled.events.catalog import NOT_MEMORY, STORED_EVENTS
from journaled.events.codec import topic_of
from journaled.events.journal import PAYLOAD_TABLE, SNAPSHOT_TABLE
from journaled.events.memory import MEMORY_EVENTS


def test_missing_payload_is_reported_with_its_position(tmp_path: Path) -> None:
    """J5: open() names the position of the fact whose text is gone, and starts no actors."""
    path = tmp_path / "journal.sqlite"
    url = f"sqlite:///{path}"
    with journaled.open(url) as rt:
        rt.memory.remember("kept")
        lost = rt.memory.remember("this text will be lost")
        position = rt.memory.history(lost.id)[0].position
    with sqlite3.connect(path) as conn:
        conn.execute(f"DELETE FROM {PAYLOAD_TABLE} WHERE stream = ?", [lost.id])  # noqa: S608
    with pytest.raises(journaled.CorruptEvent, match=f"position {position}") as info:
        journaled.open(url)
    assert lost.id in str(info.value)
    assert pykka.ActorRegistry.get_all() == []


def test_corrupt_event_stops_open(tmp_path: Path) -> None:
    """J5: an undecodable event makes open() fail with the position; nothing is skipped."""
    path = tmp_path / "journal.sqlite"
    url = f"sqlite:///{path}"
    with journaled.open(url) as rt:
        rt.memory.remember("one")
        rt.memory.remember("two")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE stored_events SET state = x'00' WHERE rowid = 2")
    with pytest.raises(journaled.CorruptEvent, match="position 2"):
        journaled.open(url)
    assert pykka.ActorRegistry.get_all() == []


def test_memory_leaves_runs_to_the_database_and_still_checks_its_own(tmp_path: Path) -> None:
    """J5: memory's replay does not decode run events; a run's broken event fails its reader."""
    path = tmp_path / "journal.sqlite"
    url = f"sqlite:///{path}"
    with journaled.open(url) as rt:
        fact = rt.memory.remember("the proxy listens on 3128")
        rt.register_tool("echo", lambda x: x)
        plan = journaled.Plan(goal="g", steps=[journaled.Step("s", tool="echo")])
        run_id = rt.execute(plan).run_id
        broken = rt.runs.history(run_id)[-1].position
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE stored_events SET state = x'00' WHERE rowid = ?", [broken])
        conn.execute(f"DELETE FROM {SNAPSHOT_TABLE}")  # noqa: S608 - fold everything again
    with journaled.open(url) as rt:
        assert rt.memory.get(fact.id) == fact
        with pytest.raises(journaled.CorruptEvent, match=f"position {broken}"):
            rt.runs.state(run_id)


def test_an_event_of_an_unknown_topic_still_stops_open(tmp_path: Path) -> None:
    """J5: only runs' and orchestrations' topics are left out; anything else is decoded."""
    path = tmp_path / "journal.sqlite"
    url = f"sqlite:///{path}"
    with journaled.open(url) as rt:
        rt.memory.remember("one")
        rt.memory.remember("two")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE stored_events SET topic = 'runs-from-the-future@1' WHERE rowid = 2")
        conn.execute(f"DELETE FROM {SNAPSHOT_TABLE}")  # noqa: S608
    with pytest.raises(journaled.CorruptEvent, match="position 2"):
        journaled.open(url)


def test_the_left_out_prefixes_cover_exactly_what_memory_does_not_fold() -> None:
    """J5: every stored topic memory does not fold has a left-out prefix; none of memory's has."""
    memory = {topic_of(cls) for cls in MEMORY_EVENTS}
    for cls in STORED_EVENTS:
        topic = topic_of(cls)
        assert topic.startswith(NOT_MEMORY) == (topic not in memory), topic
