"""A journal backed up with ``pg_dump`` while it is written, and restored elsewhere (J1, R7).

An operator backs up a live journal with the stock tools, and restores it into a new database:
the restore must be a journal ``verify`` passes whole, holding exactly the events up to one
position of the source's, in the same order, with the same bytes, and a runtime on it must go on
where the backup left off: read memory, resume a run, and append after the last position.
Real PostgreSQL, the real ``pg_dump`` and ``pg_restore``, appends from a thread throughout.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from typing import Any

import pg
import pytest
from required import unavailable

pytest.importorskip("psycopg", reason="PostgreSQL tests need the postgres extra (psycopg)")

import psycopg

import journaled
from journaled import Plan, Step
from journaled.events.journal import EVENTS_TABLE_POSTGRES

pytestmark = pytest.mark.slow


def _tool(name: str) -> str:
    path = pg.PG_BIN / name
    if not path.exists():  # CI requires PostgreSQL's tools: a missing one fails there
        unavailable("POSTGRES", f"{path} is not installed (install postgresql-15)")
    return str(path)


def _events(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT notification_id, originator_id, originator_version, topic, state "  # noqa: S608
            f"FROM public.{EVENTS_TABLE_POSTGRES} ORDER BY notification_id"
        ).fetchall()


def test_a_dump_taken_during_appends_restores_into_a_journal_that_goes_on(
    pg_url: str, postgres_databases: pg.Databases, tmp_path: Path
) -> None:
    gate = threading.Event()
    with journaled.open(pg_url) as rt:
        rt.register_tool("echo", lambda x: x)
        rt.register_tool("wait", lambda x: gate.wait(30) and x)
        first = rt.memory.remember("the deploy window is Tuesday", conflict_key="window")
        rt.memory.remember("the deploy window is Thursday", conflict_key="window")
        done = rt.execute(Plan(goal="done", steps=[Step("a", tool="echo", input=1)]))
        rt.memory.purge(first.id, reason="a test of erasure in a backup")
        # A run waiting in its second step while the dump is taken: restored, it resumes.
        handle = rt.start(
            Plan(
                goal="in flight",
                steps=[
                    Step("a", tool="echo", input=1),
                    Step("b", tool="wait", input=2, depends_on=["a"]),
                ],
            )
        )
        stop = threading.Event()
        written: list[str] = []

        def write() -> None:
            n = 0
            while not stop.is_set():
                written.append(rt.memory.remember(f"note {n} during the backup").id)
                n += 1

        writer = threading.Thread(target=write)
        writer.start()
        try:
            dump = tmp_path / "journal.dump"
            subprocess.run(
                [_tool("pg_dump"), "--format=custom", "--file", str(dump), pg_url],
                check=True,
                capture_output=True,
                timeout=120,
            )
        finally:
            stop.set()
            writer.join(30)
            gate.set()
        assert handle.result(30).ok
        assert len(written) > 1, "the premise: appends went on while the dump ran"
        source = _events(pg_url)

    restored_url = postgres_databases.take()
    try:
        subprocess.run(
            [_tool("pg_restore"), "--no-owner", "--dbname", restored_url, str(dump)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        restored = _events(restored_url)
        # Exactly a prefix of the source's log: the same events at the same positions.
        assert restored, "the restore holds no events"
        assert restored == source[: len(restored)]
        with journaled.open(restored_url) as again:
            report = again.journal.verify()
            assert report.ok, report
            assert report.events == len(restored)
            texts = {f.text for f in again.memory.all()}
            assert "the deploy window is Thursday" in texts
            assert "the deploy window is Tuesday" not in texts  # purged before the dump
            assert again.runs.current(done.run_id).ok
            again.register_tool("echo", lambda x: x)
            again.register_tool("wait", lambda x: x)
            resumed = again.resume(handle.run_id, take_over=True)
            assert isinstance(resumed, journaled.ExecuteResult)
            assert resumed.ok
            after = again.memory.remember("written after the restore")
            assert again.memory.get(after.id) is not None
            last = _events(restored_url)[-1]
            assert last[0] > restored[-1][0]
            assert again.journal.verify().ok
    finally:
        postgres_databases.give_back(restored_url)
