"""``journaled runs list`` and ``journaled runs follow`` (SPEC T2), driven against real runs."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import journaled
from journaled.testing import wait_for

WAIT = 30.0
CLI = [sys.executable, "-m", "journaled.cli"]


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "--url", url, *args], capture_output=True, text=True, timeout=WAIT, check=False
    )


def _boom(_: object) -> str:
    raise RuntimeError("disk full")


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, sqlite_url: str) -> str:
    """A journal another process can follow: a SQLite file or a PostgreSQL database."""
    if request.param == "sqlite":
        return sqlite_url
    pg: str = request.getfixturevalue("pg_url")
    return pg


@pytest.fixture
def gated(url: str) -> Iterator[tuple[journaled.Runtime, threading.Event]]:
    """A runtime whose `gate` tool waits until the test opens the gate."""
    gate = threading.Event()
    rt = journaled.open(url)
    rt.register_tool("gate", lambda _: gate.wait(WAIT) and "through")
    rt.register_tool("ok", lambda _: "done")
    rt.register_tool("boom", _boom)
    try:
        yield rt, gate
    finally:
        gate.set()
        rt.close()


def _start(rt: journaled.Runtime, last: str) -> str:
    plan = journaled.Plan(
        goal="follow me",
        steps=[
            journaled.Step("a", tool="gate"),
            journaled.Step("b", tool="ok", depends_on=["a"]),
            journaled.Step("c", tool=last, depends_on=["b"]),
        ],
    )
    handle = rt.start(plan)
    wait_for(lambda: rt.runs.state(handle.run_id).status.get("a") == "running", WAIT)
    return handle.run_id


def _follow(url: str, run_id: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "--url", url, "runs", "follow", run_id, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_follow_json_streams_changes_until_the_run_completes(
    url: str, gated: tuple[journaled.Runtime, threading.Event]
) -> None:
    """T2: runs follow --json prints a line per change, ends with the completed state, exit 0."""
    rt, gate = gated
    run_id = _start(rt, "ok")
    proc = _follow(url, run_id, "--json")
    assert proc.stdout is not None
    first = json.loads(proc.stdout.readline())  # followed from before the gate opens
    assert (first["status"], first["steps_done"], first["running"]) == ("running", 0, ["a"])
    gate.set()
    out, err = proc.communicate(timeout=WAIT)
    lines = [first, *(json.loads(line) for line in out.splitlines())]
    assert proc.returncode == 0, err
    assert len(lines) >= 2
    assert [line["status"] for line in lines][-1] == "completed"
    assert (lines[-1]["steps_done"], lines[-1]["steps_total"]) == (3, 3)
    done = [line["steps_done"] for line in lines]
    assert done == sorted(done)  # progress only moves forward


def test_follow_shows_the_settled_failure_and_exits_3(
    url: str, gated: tuple[journaled.Runtime, threading.Event]
) -> None:
    """T2: runs follow (human) ends with the failed state, steps and calls; exit status 3."""
    rt, gate = gated
    run_id = _start(rt, "boom")
    proc = _follow(url, run_id)
    gate.set()  # piped, the display prints the settled state once, whenever follow got there
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 3, err
    assert f"run {run_id}  failed" in out
    assert "3/3 steps" in out
    assert "calls used: 0" in out
    assert "step 'c' failed" in out
    assert "pass ended: failed" in out.rstrip().splitlines()[-1]  # the last event shown


def test_follow_a_waiting_run_exits_5(sqlite_url: str) -> None:
    """T2: a run that waits for input is settled: follow exits 5 and says what it waits for."""
    with journaled.open(sqlite_url) as rt:

        def ask(_: journaled.Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
            raise journaled.NeedsInput("which one?")

        rt.register_agent("ask", ask)
        run_id = rt.execute(
            journaled.Plan(goal="g", steps=[journaled.Step("q", agent="ask")])
        ).run_id
    done = _cli(sqlite_url, "runs", "follow", run_id, "--json")
    assert done.returncode == 5, done.stderr
    last = json.loads(done.stdout.splitlines()[-1])
    assert (last["status"], last["waiting"]) == ("waiting_for_input", ["q"])


def test_follow_an_unknown_run_is_a_one_line_error(sqlite_url: str) -> None:
    """T2: following a run the journal does not hold fails with one line, exit status 1."""
    with journaled.open(sqlite_url) as rt:
        rt.memory.remember("a fact")
    done = _cli(sqlite_url, "runs", "follow", "run_nope")
    assert done.returncode == 1
    assert done.stderr.strip() == "Error: no run 'run_nope' in this journal"


def test_runs_list_json_and_table_with_filters(sqlite_url: str) -> None:
    """T2: runs list shows status, goal, steps, calls, lineage; --status/--limit/--since filter."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("ok", lambda _: "done")
        rt.register_tool("boom", _boom)
        rt.register_skill("think", lambda _: "thought")
        good = rt.execute(
            journaled.Plan(goal="good goal", steps=[journaled.Step("s", skill="think")])
        ).run_id
        bad = rt.execute(
            journaled.Plan(goal="bad goal", steps=[journaled.Step("a", tool="boom")])
        ).run_id
        fork = rt.runs.fork(bad)
    listed = json.loads(_cli(sqlite_url, "runs", "list", "--json").stdout)
    assert [r["run_id"] for r in listed] == [good, bad, fork]  # oldest first, as run ids were
    assert [r["kind"] for r in listed] == ["run.started", "run.started", "run.forked"]
    assert listed[0]["at"] == listed[0]["started_at"]
    assert listed[0] | {"started_at": 0, "last_at": 0, "at": 0} == listed[0] | {
        "status": "completed",
        "goal": "good goal",
        "steps_done": 1,
        "steps_total": 1,
        "calls_used": 1,
        "started_at": 0,
        "last_at": 0,
        "at": 0,
    }
    failed = json.loads(_cli(sqlite_url, "runs", "list", "--status", "failed", "--json").stdout)
    assert [r["run_id"] for r in failed] == [bad]
    newest = json.loads(_cli(sqlite_url, "runs", "list", "--limit", "1", "--json").stdout)
    assert [r["run_id"] for r in newest] == [fork]
    later = json.loads(_cli(sqlite_url, "runs", "list", "--since", "2100-01-01", "--json").stdout)
    assert later == []
    table = _cli(sqlite_url, "runs", "list").stdout
    order = [line.split("│")[-2].strip() for line in table.splitlines() if "run_" in line]
    assert order == [fork, bad, good]  # the table shows the newest first
    rows = {line.split("│")[-2].strip(): line for line in table.splitlines() if "run_" in line}
    assert "completed" in rows[good]
    assert "1/1" in rows[good]
    assert "good goal" in rows[good]
    assert "failed" in rows[bad]
    assert f"fork of {bad}" in rows[fork]
    assert "forked" in rows[fork]


def test_runs_list_rejects_a_bad_status_in_one_line(sqlite_url: str) -> None:
    """T2: an unknown --status is a one-line error naming it; exit status 1."""
    with journaled.open(sqlite_url) as rt:
        rt.memory.remember("a fact")
    done = _cli(sqlite_url, "runs", "list", "--status", "done")
    assert done.returncode == 1
    assert done.stderr.startswith("Error: status: 'done' is no run status")
    assert len(done.stderr.strip().splitlines()) == 1


def test_runs_list_opens_no_journal_that_is_missing(tmp_path: Path) -> None:
    """T2: runs list on a path with no journal fails and creates nothing."""
    url = f"sqlite:///{tmp_path / 'none.sqlite'}"
    done = _cli(url, "runs", "list")
    assert done.returncode == 1
    assert "no journal at" in done.stderr
    assert not (tmp_path / "none.sqlite").exists()


def test_follow_an_orchestration_through_its_pass(
    url: str, gated: tuple[journaled.Runtime, threading.Event]
) -> None:
    """T2: following an orchestration shows its pass's steps and ends completed, exit 0."""
    rt, gate = gated

    def planner(goal: str, _obs: object, _clarifications: object) -> journaled.Plan:
        steps = [journaled.Step("a", tool="gate"), journaled.Step("b", tool="ok", depends_on=["a"])]
        return journaled.Plan(goal=goal, steps=steps)

    outcome: list[journaled.Outcome] = []
    thread = threading.Thread(target=lambda: outcome.append(rt.orchestrate("orch", planner)))
    thread.start()
    try:
        wait_for(lambda: any(s.running == ("a",) for s in rt.runs.list(status="running")), WAIT)
        (orchestration,) = [s for s in rt.runs.list() if s.kind == "orchestration.started"]
        proc = _follow(url, orchestration.run_id, "--json")
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert (first["status"], first["running"], first["pass_no"]) == ("running", ["a"], 1)
    finally:
        gate.set()
        thread.join(WAIT)
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    last = json.loads(out.splitlines()[-1])
    assert (last["status"], last["steps_done"], last["steps_total"]) == ("completed", 2, 2)
    assert outcome[0].status == "completed"
