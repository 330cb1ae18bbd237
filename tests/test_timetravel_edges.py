"""Time travel and runs at a glance at their edges (O7, M12, T1, T2, T4; ADR 0064): positions
past any journal's end, times that are no epoch-ms, a memory view inside one append, reading
commands after a writer died, and an orchestration whose pass is running."""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import journaled
from journaled import Plan, Step
from journaled.testing import ManualClock, wait_for

WAIT = 30.0
CLI = [sys.executable, "-m", "journaled.cli"]


def _chain(n: int) -> list[Step]:
    return [
        Step(f"s{i}", tool="fetch", input=i, depends_on=[f"s{i - 1}"] if i else [])
        for i in range(n)
    ]


@pytest.mark.parametrize("position", [2**63, 2**64])
def test_a_huge_position_is_past_the_end_cold_or_warm(sqlite_url: str, position: int) -> None:
    """O7/T1: a position past any journal's end is "past the end", on a first call and after."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("fetch", lambda x: x)
        run_id = rt.execute(Plan(goal="g", steps=_chain(2))).run_id
        first = rt.runs.history(run_id)[0].position
        end = rt.journal.position()
        with pytest.raises(ValueError, match=rf"position {position} is past the end .*\({end}\)"):
            rt.runs.at(run_id, position)  # cold
        with pytest.raises(ValueError, match=rf"position {position} is past the end"):
            rt.runs.diff(run_id, first, position)
        with pytest.raises(ValueError, match=rf"position {position} is past the end"):
            rt.runs.state(run_id, position)
        with pytest.raises(ValueError, match=rf"position {end + 1} is past the end"):
            rt.runs.state(run_id, end + 1)


@pytest.mark.parametrize("at", [float("nan"), "2026-01-01", None, True, 1.5])
def test_position_at_refuses_a_time_that_is_no_epoch_ms(sqlite_url: str, at: object) -> None:
    """O7: position_at and at_time refuse a time that is no epoch-ms int, naming ``at``."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("fetch", lambda x: x)
        run_id = rt.execute(Plan(goal="g", steps=_chain(2))).run_id
        with pytest.raises(ValueError, match=r"at must be epoch milliseconds \(int\)"):
            rt.runs.position_at(run_id, at)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"at must be epoch milliseconds \(int\)"):
            rt.runs.at_time(run_id, at)  # type: ignore[arg-type]


def test_as_of_inside_one_atomic_remember_never_shows_half_of_it(
    sqlite_url: str, clock: ManualClock
) -> None:
    """M12/J2: a view at a position inside one append (a remember that supersedes) shows the
    whole append, as every reader saw it, never half of it."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        old = rt.memory.remember("the release is on monday", conflict_key="release")
        before = rt.journal.position()
        new = rt.memory.remember("the release is on friday", conflict_key="release")
        end = rt.journal.position()
        assert end - before >= 3  # one append of several events
        for position in range(before, end + 1):
            view = rt.memory.as_of(position=position)
            found = {f.id for f in view.search("release")}
            assert found in ({old.id}, {new.id}), f"position {position}: {found}"


_DIES_AFTER_MANY = """
    import os, signal, sys
    import journaled
    rt = journaled.open(sys.argv[1])
    rt.register_tool("fetch", lambda x: x)
    run = rt.execute(journaled.Plan(goal="g", steps=[journaled.Step("a", tool="fetch")]))
    for i in range(600):
        rt.memory.remember("fact number %d" % i)
    print(run.run_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _files(path: Path) -> str:
    """Digest every row of the journal file (what it holds, not its bytes: the last connection
    to close merges a dead writer's WAL into the file, which changes no row)."""
    digest = hashlib.sha256()
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        for line in conn.iterdump():
            digest.update(line.encode())
    return digest.hexdigest()


def test_reading_commands_write_nothing_after_a_writer_died(
    sqlite_url: str, tmp_path: Path
) -> None:
    """T2/T4: reading commands store nothing, not even memory's snapshot that a dead writer
    left owed."""
    script = tmp_path / "dies.py"
    script.write_text(textwrap.dedent(_DIES_AFTER_MANY))
    died = subprocess.run(
        [sys.executable, str(script), sqlite_url],
        capture_output=True,
        text=True,
        timeout=WAIT * 2,
        check=False,
    )
    assert died.returncode < 0, died.stderr
    run_id = died.stdout.split()[0]
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    before = _files(path)
    for args in (["runs", "history", run_id], ["runs", "show", run_id], ["runs", "why", run_id]):
        done = subprocess.run(
            [*CLI, "--url", sqlite_url, *args, "--json"],
            capture_output=True,
            text=True,
            timeout=WAIT,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert _files(path) == before, f"`journaled {' '.join(args)}` wrote to the journal"


def test_since_keeps_an_orchestration_whose_pass_is_running(clock: ManualClock) -> None:
    """T2: ``since`` keeps an orchestration whose pass is still active, as its pass."""
    first_gate, second_gate = threading.Event(), threading.Event()
    with journaled.open("memory://", clock=clock) as rt:
        rt.register_tool("g1", lambda x: first_gate.wait(WAIT) and x)
        rt.register_tool("g2", lambda x: second_gate.wait(WAIT) and x)

        def planner(goal: str, _: object, __: object) -> Plan:
            return Plan(
                goal=goal, steps=[Step("a", tool="g1"), Step("b", tool="g2", depends_on=["a"])]
            )

        driver = threading.Thread(target=lambda: rt.orchestrate("slow", planner))
        driver.start()
        try:
            wait_for(lambda: any(s.running == ("a",) for s in rt.runs.list()), WAIT)
            clock.advance(60_000)
            later = clock.now
            first_gate.set()
            wait_for(lambda: any(s.running == ("b",) for s in rt.runs.list()), WAIT)
            (orchestration,) = [s for s in rt.runs.list() if s.kind == "orchestration.started"]
            assert orchestration.status == "running"
            assert orchestration.running == ("b",)
            assert orchestration.current_run in rt.runs.list(since=later)
            assert orchestration.run_id in rt.runs.list(since=later)
        finally:
            first_gate.set()
            second_gate.set()
            driver.join(WAIT)
