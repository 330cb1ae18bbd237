"""A journal whose fact text vanished without a purge fails loudly on open (J5)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pykka
import pytest

import journaled
from events.journal import PAYLOAD_TABLE


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
