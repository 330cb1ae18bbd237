"""The command line for people and scripts: audit and time travel of memory and runs (M11, M12,
O6, O7), the journal's global log (J1), and bad input failing in one line with nothing written."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import msgspec
import pytest
from click.testing import CliRunner, Result
from rich.console import Console

import journaled
from journaled import Plan, Step, demo
from journaled.cli import main
from journaled.cli_render import parse_time
from journaled.events.journal import SNAPSHOT_TABLE, Journal
from journaled.events.memory_audit import when
from journaled.events.runs import StepSucceeded, StepWaiting
from journaled.testing import ManualClock

HOUR = 3_600_000
T0 = int(dt.datetime(2100, 1, 1, 6, tzinfo=dt.UTC).timestamp() * 1000)
"""When the test's own facts and run begin: after the demo, which runs on the system clock."""
ANSI = "\x1b["
LINE = re.compile(r"^#(\d+)\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z  \S+\s+\S.*$")


@dataclass(frozen=True)
class World:
    """A journal holding the demo story, two facts with a supersession and a failed run."""

    url: str
    orchestration: str
    pass_run: str
    stop: int
    """Position of the pass run's budget stop."""
    waiting: int
    """Position where the pass run's deploy step started waiting for an answer."""
    old_fact: str
    new_fact: str
    old_position: int
    """Position right after the old fact was remembered (before the new one)."""
    failed_run: str


def _boom(_: Any) -> Any:
    raise RuntimeError("disk full")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    """Build the shared journal once: demo story, then facts and a failed run on a manual clock."""
    url = f"sqlite:///{tmp_path_factory.mktemp('cli') / 'journal.sqlite'}"
    orchestration = demo.run(url, Console(file=io.StringIO()), human_delay=0)
    clock = ManualClock(start=T0, step=1)
    with journaled.open(url, clock=clock) as rt:
        passes = [e.data for e in rt.runs.history(orchestration) if e.kind.endswith("pass-started")]
        pass_run: str = passes[0].run  # type: ignore[attr-defined]
        history = rt.runs.history(pass_run)
        stop = next(e.position for e in history if e.kind == "run.budget-stopped")
        waiting = next(e.position for e in history if isinstance(e.data, StepWaiting))
        old = rt.memory.remember(
            "The build uses Python 3.11", conflict_key="python-version", source="ci.yml"
        )
        old_position = rt.journal.position()
        clock.set(T0 + HOUR)
        new = rt.memory.remember("The build uses Python 3.12", conflict_key="python-version")
        clock.set(T0 + 2 * HOUR)
        rt.register_tool("ok", lambda x: x)
        rt.register_tool("boom", _boom)
        rt.register_skill("think", lambda x: "idea")
        failed = rt.execute(
            Plan(
                goal="ship the release",
                steps=[
                    Step("a", tool="ok", input=1),
                    Step("b", skill="think", depends_on=["a"]),
                    Step("c", tool="boom", depends_on=["b"]),
                    Step("d", tool="ok", depends_on=["c"]),
                ],
            ),
            call_budget=5,
        )
    return World(
        url=url,
        orchestration=orchestration,
        pass_run=pass_run,
        stop=stop,
        waiting=waiting,
        old_fact=old.id,
        new_fact=new.id,
        old_position=old_position,
        failed_run=failed.run_id,
    )


def cli(url: str, *args: str, env: dict[str, str] | None = None) -> Result:
    """Invoke the command line on a journal."""
    return CliRunner().invoke(main, ["--url", url, *args], env=env)


def ok(url: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Invoke the command line, check it succeeded with nothing on stderr; return stdout."""
    result = cli(url, *args, env=env)
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    return result.stdout


def as_json(url: str, *args: str) -> Any:
    """Invoke a command with --json and decode what it printed."""
    return json.loads(ok(url, "--json", *args))


def encoded(value: object) -> Any:
    """Encode a value as the command line does, then decode it for comparison."""
    return json.loads(msgspec.json.encode(value))


def position(url: str) -> int:
    """Return a journal's last position."""
    with journaled.Runtime(url, create=False) as rt:
        return rt.journal.position()


# -- memory ----------------------------------------------------------------------------------------


def test_memory_remember_supersedes(tmp_path: Path) -> None:
    """M2/M3: `memory remember` creates the journal, stores the fact, supersedes by --key."""
    url = f"sqlite:///{tmp_path / 'new' / 'journal.sqlite'}"
    first = as_json(
        url,
        "memory",
        "remember",
        "The API listens on port 8080",
        "--key",
        "api-port",
        "--source",
        "runbook",
        "--domain",
        "ops",
        "--confidence",
        "0.7",
        "--scope",
        "session",
    )
    assert (first["scope"], first["domain"], first["source"]) == ("session", "ops", "runbook")
    assert (first["conflict_key"], first["confidence"]) == ("api-port", 0.7)
    human = ok(url, "memory", "remember", "The API moved to port 9090", "--key", "api-port")
    assert re.fullmatch(
        rf"remembered (mem_\S+) in scope 'project', superseding {first['id']}\n", human
    )
    secret = ok(url, "memory", "remember", "deploy with password=hunter2")
    assert secret.endswith("(secrets were redacted)\n")
    with journaled.open(url) as rt:
        old = rt.memory.get(first["id"])
        assert old is not None
        assert old.superseded_by == human.split()[1]
        assert all("hunter2" not in f.text for f in rt.memory.all())


def test_memory_as_of_position_answers_like_the_library(world: World) -> None:
    """M12: `memory as-of --position` answers exactly what rt.memory.as_of(position=) does."""
    with journaled.open(world.url) as rt:
        end = rt.journal.position()
        views = {p: rt.memory.as_of(position=p) for p in (0, 3, world.old_position, end)}
        expected = {
            p: (encoded(v.all()), encoded(v.search("python build")), v.position)
            for p, v in views.items()
        }
    for p, (every, found, at) in expected.items():
        listing = as_json(world.url, "memory", "as-of", "--position", str(p))
        assert listing == {"position": at, "at": None, "query": None, "facts": every}
        search = as_json(world.url, "memory", "as-of", "--position", str(p), "python build")
        assert search["facts"] == found
    then = as_json(world.url, "memory", "as-of", "--position", str(world.old_position), "python")
    assert [f["id"] for f in then["facts"]] == [world.old_fact]
    now = as_json(world.url, "memory", "as-of", "--position", str(end), "python")
    assert [f["id"] for f in now["facts"]] == [world.new_fact]


@pytest.mark.parametrize(
    ("iso", "current"),
    [
        ("2100-01-01T06:30:00Z", "old"),
        ("2100-01-01T07:30:00+01:00", "old"),
        ("2100-01-01T06:30:00", "old"),
        ("2100-01-01T07:00:00.000Z", "new"),
        ("2100-01-02", "new"),
        ("2100-01-01", None),
    ],
)
def test_memory_as_of_time(world: World, iso: str, current: str | None) -> None:
    """M12: `memory as-of --at-time` takes ISO times (Z, offsets, none, date) like as_of(at=)."""
    at = parse_time(iso)
    with journaled.open(world.url) as rt:
        view = rt.memory.as_of(at=at)
        every, found = encoded(view.all()), encoded(view.search("python"))
    listing = as_json(world.url, "memory", "as-of", "--at-time", iso)
    assert listing["at"] == at
    assert listing["facts"] == every
    search = as_json(world.url, "memory", "as-of", "--at-time", iso, "python")
    assert search["facts"] == found
    ids = {"old": [world.old_fact], "new": [world.new_fact], None: []}[current]
    assert [f["id"] for f in search["facts"]] == ids


def test_memory_as_of_human(world: World) -> None:
    """M12: the human as-of view lists the facts stored then and what superseded them since."""
    then = ok(world.url, "memory", "as-of", "--position", str(world.old_position))
    assert f"memory as of #{world.old_position}" in then
    assert world.old_fact in then
    assert world.new_fact not in then
    now = ok(world.url, "memory", "as-of", "--at-time", "2100-01-01T08:00:00Z", "python")
    assert "search 'python'" in now
    assert world.new_fact in now
    assert world.old_fact not in now
    every = ok(world.url, "memory", "as-of", "--position", str(position(world.url)))
    assert "superseded by" in every
    assert every.count(world.new_fact) == 2  # its own row, and the old fact's superseder


def test_memory_read_commands(world: World) -> None:
    """M11: memory search/show/why/history, each in human and --json form."""
    assert [f["id"] for f in as_json(world.url, "memory", "search", "python")] == [world.new_fact]
    assert world.new_fact in ok(world.url, "memory", "search", "python")
    shown = as_json(world.url, "memory", "show", world.old_fact)
    assert (shown["superseded_by"], shown["source"]) == (world.new_fact, "ci.yml")
    assert json.loads(ok(world.url, "memory", "show", world.old_fact)) == shown
    why = as_json(world.url, "memory", "why", world.old_fact)
    assert why["fact_id"] == world.old_fact
    assert f"by {world.new_fact}" in why["why"]
    assert ok(world.url, "memory", "why", world.old_fact) == why["why"] + "\n"
    history = as_json(world.url, "memory", "history", world.old_fact)
    kinds = [e["data"]["type"] for e in history]
    assert kinds == ["memory.fact-remembered", "memory.fact-superseded"]
    lines = ok(world.url, "memory", "history", world.old_fact).splitlines()
    assert [int(line.split()[0][1:]) for line in lines] == [e["position"] for e in history]
    assert "remembered in scope 'project' from 'ci.yml'" in lines[0]
    assert "2100-01-01T06:00:00.000Z" in lines[0]


# -- runs ------------------------------------------------------------------------------------------


def _step_lines(text: str) -> dict[str, str]:
    return {line.split()[1]: line for line in text.splitlines() if line.startswith("  ")}


def test_runs_show_at_the_budget_stop(world: World) -> None:
    """O7: `runs show --at` the budget stop: deploy pending, stopped_for_budget, DAG by wave."""
    view = as_json(world.url, "runs", "show", world.pass_run, "--at", str(world.stop))
    assert view["stopped_for_budget"] is True
    assert view["position"] == world.stop
    assert {s["id"]: s["status"] for s in view["plan"]["steps"]}["deploy"] == "pending"
    assert view["waves"] == [["incidents"], ["summary"], ["fix"], ["deploy"], ["report"]]
    assert (view["calls_used"], view["budget"], view["status"]) == (2, 2, None)  # ends next
    ended = as_json(world.url, "runs", "show", world.pass_run, "--at", str(world.stop + 1))
    assert ended["status"] == "stopped_for_budget"
    assert view["budget_stop"]["wave"] == 4
    assert view["budget_stop"]["estimate"] == 2
    with journaled.open(world.url) as rt:
        result = rt.runs.at(world.pass_run, world.stop)
    for field in result.__struct_fields__:
        assert view[field] == encoded(getattr(result, field)), field
    human = ok(world.url, "runs", "show", world.pass_run, "--at", str(world.stop))
    lines = human.splitlines()
    assert [line for line in lines if line.startswith("wave")] == [f"wave {n}" for n in range(1, 6)]
    assert "stopped for budget before wave 4: it needs 2 call(s), 2 of 2 used" in human
    assert (
        lines.index("── stopped for budget here: wave 4 needs 2 call(s)")
        == lines.index("wave 4") - 1
    )
    steps = _step_lines(human)
    assert steps["deploy"].split()[0] == "·"
    assert steps["deploy"].rstrip().endswith("pending")
    assert steps["incidents"].split()[0] == "✓"
    assert "calls used: 2 of a budget of 2; waiting: none" in human
    starts = {
        line.index(status)
        for line in steps.values()
        for status in ("pending", "succeeded")
        if status in line
    }
    assert len(starts) == 1, "the status column is aligned"


def test_runs_show_marks_waiting_steps(world: World) -> None:
    """O6/O7: an orchestration shown where its pass waits: the step is marked with its question."""
    args = ("runs", "show", world.orchestration, "--at", str(world.waiting))
    view = as_json(world.url, *args)
    assert (view["run_id"], view["orchestration"]) == (world.pass_run, world.orchestration)
    assert view["waiting"] == ["deploy"]
    assert view["questions"] == {"deploy": demo.QUESTION}
    human = ok(world.url, *args)
    assert f"pass of orchestration {world.orchestration}" in human
    deploy = _step_lines(human)["deploy"]
    assert deploy.split()[0] == "?"
    assert re.search(rf"waiting +waits: {re.escape(demo.QUESTION)}$", deploy)
    assert "waiting: deploy" in human


def test_runs_show_a_failed_run_now(world: World) -> None:
    """O6/O7: `runs show` now: the failed step with its error, its dependent skipped."""
    view = as_json(world.url, "runs", "show", world.failed_run)
    assert view["status"] == "failed"
    assert view["ok"] is False
    assert {s["id"]: s["status"] for s in view["plan"]["steps"]} == {
        "a": "succeeded",
        "b": "succeeded",
        "c": "failed",
        "d": "skipped",
    }
    human = ok(world.url, "runs", "show", world.failed_run)
    steps = _step_lines(human)
    assert steps["c"].split()[:4] == ["✗", "c", "tool", "boom"]
    assert re.search(r"failed +disk full$", steps["c"])
    assert steps["d"].split()[0] == "⊘"
    assert "skipped: a dependency failed" in steps["d"]
    assert re.search(r"succeeded +idea$", steps["b"])
    assert "state: failed" in human
    assert "calls used: 1 of a budget of 5" in human


def test_runs_show_at_time(world: World) -> None:
    """O7: `runs show --at-time` rebuilds the run after its last event recorded by then."""
    with journaled.open(world.url) as rt:
        events = rt.runs.history(world.failed_run)
        pass_events = rt.runs.history(world.pass_run)
    middle = events[len(events) // 2]
    at_time = as_json(
        world.url, "runs", "show", world.failed_run, "--at-time", when(middle.data.at)
    )
    at_position = as_json(world.url, "runs", "show", world.failed_run, "--at", str(middle.position))
    assert at_time == at_position
    deployed = next(
        e for e in pass_events if isinstance(e.data, StepSucceeded) and e.data.step_id == "deploy"
    )
    orchestration = as_json(
        world.url, "runs", "show", world.orchestration, "--at-time", when(deployed.data.at)
    )
    assert {s["id"]: s["status"] for s in orchestration["plan"]["steps"]}["deploy"] == "succeeded"
    assert orchestration["position"] >= deployed.position


def test_runs_diff(world: World) -> None:
    """O7: `runs diff RUN A B` lists status changes, new observations and calls used a→b."""
    with journaled.open(world.url) as rt:
        events = rt.runs.history(world.failed_run)
        a, b = events[0].position, events[-1].position
        expected = encoded(rt.runs.diff(world.failed_run, a, b))
    diff = as_json(world.url, "runs", "diff", world.failed_run, str(a), str(b))
    assert diff == expected
    assert [(c["step_id"], c["before"], c["after"]) for c in diff["status_changes"]] == [
        ("a", "pending", "succeeded"),
        ("b", "pending", "succeeded"),
        ("c", "pending", "failed"),
        ("d", "pending", "skipped"),
    ]
    assert [o["step_id"] for o in diff["new_observations"]] == ["a", "b", "c", "d"]
    assert (diff["calls_used_before"], diff["calls_used_after"]) == (0, 1)
    human = ok(world.url, "runs", "diff", world.failed_run, str(a), str(b))
    assert f"run {world.failed_run}: #{a} → #{b}" in human
    assert "calls used: 0 → 1" in human
    assert re.search(r"^  c  pending → failed$", human, re.MULTILINE)
    assert re.search(r"^  ✗ c  disk full$", human, re.MULTILINE)
    assert re.search(r"^  ⊘ d  skipped: a dependency failed$", human, re.MULTILINE)
    same = ok(world.url, "runs", "diff", world.failed_run, str(b), str(b))
    assert "status changes:\n  none\nnew observations:\n  none" in same


def test_runs_diff_names_a_negative_position_instead_of_an_unknown_option(world: World) -> None:
    """O7: ``runs diff RUN -1 2`` says the position is negative (it read ``-1`` as an option)."""
    for args, named in ((["-1", "2"], "A -1"), (["1", "-2", "--json"], "B -2")):
        result = cli(world.url, "runs", "diff", world.failed_run, *args)
        assert result.exit_code == 1, result.output
        assert f"{named} is negative: give a journal position, 0 or more" in result.stderr
        assert "No such option" not in result.output


def test_runs_read_commands(world: World) -> None:
    """O6: runs list/why/history, each in human and --json form."""
    listed = as_json(world.url, "runs", "list")
    assert [r["run_id"] for r in listed][-1] == world.failed_run  # oldest first
    kinds = {r["kind"] for r in listed}
    assert kinds == {"run.started", "orchestration.started", "run.forked"}  # the demo refreshes
    assert all(r["at"] == r["started_at"] for r in listed)
    human_list = ok(world.url, "runs", "list")
    assert world.failed_run in human_list
    assert "orchestration, 1 pass" in human_list  # what tells the runs apart (T2)
    assert "2100-01-01T08:00:00.000Z" in human_list
    why = as_json(world.url, "runs", "why", world.failed_run)
    assert "now: step 'c' failed with 'disk full'" in why["why"]
    assert ok(world.url, "runs", "why", world.failed_run) == why["why"] + "\n"
    history = as_json(world.url, "runs", "history", world.failed_run)
    assert history[0]["data"]["type"] == "run.started"
    lines = ok(world.url, "runs", "history", world.failed_run).splitlines()
    assert len(lines) == len(history)
    assert "step 'c' failed: disk full" in "\n".join(lines)


# -- journal tail ----------------------------------------------------------------------------------


def test_journal_tail_after_limit(world: World) -> None:
    """J1: `journal tail --after N --limit M` prints exactly M lines, in journal order."""
    lines = ok(world.url, "journal", "tail", "--after", "4", "--limit", "6").splitlines()
    assert len(lines) == 6
    assert all(LINE.match(line) for line in lines), lines
    assert [int(line.split()[0][1:]) for line in lines] == list(range(5, 11))
    records = [
        json.loads(line)
        for line in ok(
            world.url, "--json", "journal", "tail", "--after", "4", "--limit", "6"
        ).splitlines()
    ]
    assert [r["position"] for r in records] == list(range(5, 11))
    with journaled.open(world.url) as rt:
        events = rt.journal.read(after=4, upto=10)
    assert [r["data"] for r in records] == encoded([e.data for e in events])
    assert [r["kind"] for r in records] == [e.kind for e in events]
    assert all(r["time"] == when(r["at"]) for r in records)


def test_journal_tail_default_is_the_end(world: World) -> None:
    """J1: `journal tail` without --after prints the last --limit events, the newest last."""
    end = position(world.url)
    lines = ok(world.url, "journal", "tail", "--limit", "3").splitlines()
    assert [int(line.split()[0][1:]) for line in lines] == [end - 2, end - 1, end]
    assert "step 'c' failed: disk full" in "\n".join(ok(world.url, "journal", "tail").splitlines())
    assert len(ok(world.url, "journal", "tail").splitlines()) == 20


def test_journal_tail_follow_sees_an_append_from_another_thread(tmp_path: Path) -> None:
    """J1: `journal tail --follow` prints an event appended by another runtime while it polls."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url) as rt:
        rt.memory.remember("first")
        end = rt.journal.position()

    def append() -> None:
        time.sleep(0.3)
        with journaled.open(url) as writer:
            writer.memory.remember("second", scope="user")

    writer = threading.Thread(target=append)
    writer.start()
    started = time.monotonic()
    out = ok(
        url, "journal", "tail", "--follow", "--interval", "0.05",
        "--until", str(end + 1), "--max-seconds", "30",
    )  # fmt: skip
    writer.join()
    assert time.monotonic() - started < 30
    lines = out.splitlines()
    assert [int(line.split()[0][1:]) for line in lines] == [end, end + 1]
    assert lines[-1].endswith("remembered in scope 'user'")


def test_journal_tail_follow_stops_after_max_seconds(world: World) -> None:
    """J1: `--follow` with nothing new stops at the deadline having printed only the backlog."""
    started = time.monotonic()
    out = ok(world.url, "journal", "tail", "-f", "--limit", "1", "--interval", "0.05",
             "--max-seconds", "0.3")  # fmt: skip
    assert 0.3 <= time.monotonic() - started < 10
    assert len(out.splitlines()) == 1


@pytest.mark.slow
def test_journal_tail_follow_stops_cleanly_on_sigint(world: World) -> None:
    """J1: Ctrl-C (SIGINT) stops `journal tail --follow` with exit 0 and no traceback."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "journaled.cli", "--url", world.url]
    proc = subprocess.Popen(
        [*command, "journal", "tail", "--follow", "--limit", "1", "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()  # the backlog is printed: the follow loop runs
    assert first.startswith("#")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert out == ""


# -- output contract -------------------------------------------------------------------------------


def _json_commands(world: World) -> list[list[str]]:
    return [
        ["memory", "search", "python"],
        ["memory", "show", world.new_fact],
        ["memory", "why", world.old_fact],
        ["memory", "history", world.old_fact],
        ["memory", "as-of", "--position", "3"],
        ["runs", "list"],
        ["runs", "why", world.pass_run],
        ["runs", "show", world.pass_run, "--at", str(world.stop)],
        ["runs", "diff", world.pass_run, str(world.stop), str(world.waiting)],
        ["runs", "history", world.failed_run],
    ]


def test_json_never_carries_colour(world: World) -> None:
    """O6/O7/M11/M12: --json is plain JSON even when colour is forced; people get colour."""
    forced = {"FORCE_COLOR": "1", "TERM": "xterm-256color"}
    for args in _json_commands(world):
        out = ok(world.url, "--json", *args, env=forced)
        assert ANSI not in out, args
        json.loads(out)
        assert ok(world.url, *args, "--json") == out, "--json after the command is the same"
    tail = ok(world.url, "--json", "journal", "tail", "--limit", "5", env=forced)
    assert ANSI not in tail
    assert len([json.loads(line) for line in tail.splitlines()]) == 5
    show = ("runs", "show", world.failed_run)
    assert "\x1b[31m" in ok(world.url, *show, env=forced)  # red for the failed step
    assert "\x1b[31m" not in ok(world.url, *show, env={**forced, "NO_COLOR": "1"})
    assert ANSI not in ok(world.url, *show)  # not a terminal: no colour


@pytest.mark.parametrize(
    "command",
    [
        ["demo"],
        ["memory", "remember"],
        ["memory", "search"],
        ["memory", "as-of"],
        ["memory", "show"],
        ["memory", "why"],
        ["memory", "history"],
        ["runs", "list"],
        ["runs", "why"],
        ["runs", "show"],
        ["runs", "diff"],
        ["runs", "history"],
        ["journal", "tail"],
    ],
)
def test_every_command_documents_its_json(command: list[str]) -> None:
    """O6/O7/M11/M12: each command's --help gives its JSON shape."""
    out = CliRunner().invoke(main, [*command, "--help"])
    assert out.exit_code == 0
    assert "JSON:" in out.stdout
    assert "--json" in out.stdout


def test_demo_json(tmp_path: Path) -> None:
    """O1/O6: `demo --json` prints the orchestration id on stdout, the story on stderr."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    result = cli(url, "--json", "demo", "--human-delay", "0")
    assert result.exit_code == 0, result.output
    run_id = json.loads(result.stdout)["run_id"]
    assert "Ask the journal why" in result.stderr
    assert ANSI not in result.stdout
    assert run_id in [r["run_id"] for r in as_json(url, "runs", "list")]


# -- bad input -------------------------------------------------------------------------------------


def _fails(url: str, *args: str, message: str) -> None:
    before = position(url)
    result = cli(url, *args)
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("Error: ")
    assert message in result.stderr, result.stderr
    assert position(url) == before


def test_unknown_ids_fail_in_one_line(world: World) -> None:
    """M11/O6/O7: unknown fact and run ids: one line on stderr, exit 1, nothing written."""
    for args in (
        ["memory", "show", "mem_nope"],
        ["memory", "why", "mem_nope"],
        ["memory", "history", "mem_nope"],
        ["runs", "why", "run_nope"],
        ["runs", "show", "run_nope"],
        ["runs", "show", "run_nope", "--at-time", "2100-01-01"],
        ["runs", "diff", "run_nope", "1", "2"],
        ["runs", "history", "run_nope"],
    ):
        _fails(world.url, *args, message="_nope")
        _fails(world.url, "--json", *args, message="_nope")


def test_positions_outside_the_run_or_journal_fail(world: World) -> None:
    """O7/M12: positions before the run began or past the journal's end fail in one line."""
    end = position(world.url)
    run = world.failed_run
    _fails(world.url, "runs", "show", run, "--at", "3", message="before run")
    _fails(world.url, "runs", "show", run, "--at", str(end + 1), message="past the end")
    _fails(world.url, "runs", "show", run, "--at", "-1", message="negative")
    _fails(world.url, "runs", "diff", run, "3", str(end), message="before run")
    _fails(world.url, "runs", "diff", run, str(end), str(end + 5), message="past the end")
    _fails(world.url, "runs", "diff", run, str(end), str(end - 1), message="a <= b")
    _fails(world.url, "memory", "as-of", "--position", str(end + 1), message="past the end")
    _fails(world.url, "journal", "tail", "--after", str(end + 1), message="past the end")
    _fails(world.url, "runs", "show", run, "--at-time", "2099-12-31", message="had not begun")
    _fails(world.url, "journal", "tail", "--limit", "0", message="--limit")


@pytest.mark.parametrize("bad", ["yesterday", "2100-13-01", "07:00", ""])
def test_malformed_times_fail(world: World, bad: str) -> None:
    """O7/M12: a malformed --at-time names the accepted ISO forms; nothing is written."""
    for args in (
        ["runs", "show", world.failed_run, "--at-time", bad],
        ["memory", "as-of", "--at-time", bad],
    ):
        _fails(world.url, *args, message="use ISO 8601, e.g. 2026-11-30T07:00:00Z")


def test_as_of_needs_exactly_one_point(world: World) -> None:
    """M12/O7: as-of needs one of --position/--at-time; runs show takes at most one."""
    _fails(world.url, "memory", "as-of", message="exactly one of")
    _fails(world.url, "memory", "as-of", "--position", "1", "--at-time", "2100-01-01",
           message="exactly one of")  # fmt: skip
    _fails(world.url, "runs", "show", world.failed_run, "--at", "1", "--at-time", "2100-01-01",
           message="at most one of")  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["memory", "remember", ""], "text is empty"),
        (["memory", "remember", "x", "--confidence", "nan"], "NaN"),
        (["memory", "remember", "x", "--scope", "organization"], "JOURNALED_ORGANIZATION"),
    ],
)
def test_remember_rejects_bad_facts(world: World, args: list[str], message: str) -> None:
    """M2: a fact that cannot be stored fails in one line and appends nothing."""
    _fails(world.url, *args, message=message)


@pytest.mark.parametrize(
    "args",
    [
        ["memory", "search", "x"],
        ["memory", "show", "mem_x"],
        ["memory", "why", "mem_x"],
        ["memory", "history", "mem_x"],
        ["memory", "as-of", "--position", "0"],
        ["runs", "list"],
        ["runs", "why", "run_x"],
        ["runs", "show", "run_x"],
        ["runs", "diff", "run_x", "1", "2"],
        ["runs", "history", "run_x"],
        ["journal", "tail"],
        ["journal", "tail", "--follow", "--max-seconds", "1"],
    ],
)
def test_reading_a_missing_journal_creates_nothing(tmp_path: Path, args: list[str]) -> None:
    """M11/O6: reading commands on a journal that does not exist fail and create no file."""
    path = tmp_path / "missing" / "journal.sqlite"
    result = cli(f"sqlite:///{path}", *args)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("Error: no journal at ")
    assert result.stderr.count("\n") == 1
    assert not path.parent.exists()


def test_bad_urls_fail_in_one_line(tmp_path: Path) -> None:
    """J4: an unusable journal URL or a file that is not a journal fails in one line."""
    result = cli("nosuch://x", "memory", "remember", "hello")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: journal URL 'nosuch://x' has unknown scheme")
    assert result.stderr.count("\n") == 1
    text = tmp_path / "notes.sqlite"
    text.write_text("not a database\n")
    for args in (["runs", "list"], ["memory", "remember", "hello"]):
        result = cli(f"sqlite:///{text}", *args)
        assert result.exit_code == 1
        assert result.stderr.startswith(f"Error: cannot open the journal at {text}: ")
        assert "file is not a database" in result.stderr
        assert result.stderr.count("\n") == 1
    assert text.read_text() == "not a database\n"


def test_parse_time_forms() -> None:
    """M12/O7: ISO times with Z, an offset, none (UTC) or a date alone become epoch ms."""
    ms = T0 + 30 * 60_000 + 250
    assert parse_time("2100-01-01T06:30:00.250Z") == ms
    assert parse_time("2100-01-01T08:30:00.250+02:00") == ms
    assert parse_time("2100-01-01T06:30:00.250") == ms
    assert parse_time(" 2100-01-01 ") == T0 - 6 * HOUR
    assert parse_time(when(ms)) == ms
    with pytest.raises(ValueError, match="'yesterday'"):
        parse_time("yesterday")


def test_reading_a_journal_that_cannot_be_written_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An auditor with read-only access reads: a reading command's close does not even try to
    store the snapshot memory owes (ADR 0064)."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url) as rt:
        for i in range(600):
            rt.memory.remember(f"fact {i} about the staging ports")
    tried: list[str] = []

    def read_only(self: Journal, key: str, version: int, state: bytes, **_: object) -> None:
        tried.append(key)
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(Journal, "save_snapshot", read_only)
    drop = sqlite3.connect(tmp_path / "journal.sqlite")
    with drop:
        drop.execute(f"DELETE FROM {SNAPSHOT_TABLE}")  # noqa: S608
    drop.close()
    result = cli(url, "--json", "memory", "search", "staging ports", "--limit", "3")
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)) == 3
    assert tried == []
    assert result.stderr == ""
    assert "memory snapshot not saved" not in caplog.text


def _leaves(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            out += _leaves(command, (*prefix, name))
        else:
            out.append((*prefix, name))
    return out


def test_every_command_takes_url_and_json_after_its_name() -> None:
    """Section 11, README: every command takes --url and --json after its name as well as before
    it (``journaled journal migrate --url ...``)."""
    for path in _leaves(main):
        command: click.Command = main
        for name in path:
            assert isinstance(command, click.Group)
            command = command.commands[name]
        opts = {opt for param in command.params for opt in getattr(param, "opts", ())}
        assert {"--url", "--json"} <= opts, (path, sorted(opts))


def test_url_after_the_command_names_the_journal(tmp_path: Path) -> None:
    """Section 11, README: ``journaled journal verify --url U``, ``runs list --url U --json`` and
    ``memory search Q --url U`` read the journal at U, as ``--url U`` before them does."""
    url = f"sqlite:///{tmp_path / 'j.sqlite'}"
    wrote = CliRunner().invoke(
        main, ["memory", "remember", "deploys go through staging", "--url", url]
    )
    assert wrote.exit_code == 0, wrote.output
    verified = CliRunner().invoke(main, ["journal", "verify", "--url", url])
    assert verified.exit_code == 0, verified.output
    assert "1 events read" in verified.output
    listed = CliRunner().invoke(main, ["runs", "list", "--url", url, "--json"])
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.output) == []
    found = CliRunner().invoke(main, ["memory", "search", "staging", "--url", url, "--json"])
    assert found.exit_code == 0, found.output
    assert [f["text"] for f in json.loads(found.output)] == ["deploys go through staging"]
