"""The main job, `journaled demo`, end to end on the embedded default; and the CLI reading it."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

import journaled
from journaled import demo
from journaled.cli import main


@pytest.fixture
def story(tmp_path: Path) -> tuple[str, str]:
    """Run the demo story once on a SQLite journal; return (url, orchestration id)."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    run_id = demo.run(url, Console(file=io.StringIO(), width=100), human_delay=0.05)
    return url, run_id


def test_demo_story_is_in_the_journal(story: tuple[str, str]) -> None:
    """O1/O3/O4/E10/M3: the supersession, budget pause, question and completion are events."""
    url, run_id = story
    with journaled.open(url) as rt:
        kinds = [e.kind for e in rt.journal.read()]
        assert kinds.count("memory.fact-superseded") == 2  # the port, then the deploy region
        orchestration = [e.kind for e in rt.runs.history(run_id)]
        assert orchestration[0] == "orchestration.started"
        assert "orchestration.budget-awaited" in orchestration
        assert "orchestration.resumed" in orchestration  # with the larger budget (R5)
        assert orchestration[-1] == "orchestration.ended"
        state = rt._orchestrations.state(run_id)
        assert state.status == "completed"
        pass_run = state.current_run
        assert pass_run is not None
        run_kinds = [e.kind for e in rt.runs.history(pass_run)]
        for kind in ("run.budget-stopped", "run.step-waiting", "run.answers-given", "run.finished"):
            assert kind in run_kinds
        result = rt.runs.at(pass_run, rt.journal.position())
        assert result.ok
        assert result.calls_used == 4  # the agent is charged once, when it finishes
        why = rt.runs.why(run_id)
        assert "paused before wave 4" in why
        assert "Which region" in why
        children = [
            e
            for e in rt.journal.read()
            if e.kind == "run.started" and e.data.parent_run == pass_run  # type: ignore[attr-defined]
        ]
        assert [c.data.parent_step for c in children] == ["deploy"]  # type: ignore[attr-defined]


def test_demo_runs_twice_in_one_directory(story: tuple[str, str]) -> None:
    """A second demo on the same journal starts a new run instead of failing."""
    url, first = story
    second = demo.run(url, Console(file=io.StringIO(), width=100), human_delay=0)
    assert second != first
    with journaled.open(url) as rt:
        assert rt._orchestrations.state(second).status == "completed"


def _tell(url: str) -> str:
    """Run the demo on ``url`` and return what it printed."""
    console = Console(file=io.StringIO(), width=100)
    demo.run(url, console, human_delay=0)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


@pytest.mark.parametrize("times", [1, 2])
def test_demo_provenance_act(tmp_path: Path, times: int) -> None:
    """P3/P4/F3: demo names the stale step, refresh re-runs it and dependents, compare differs."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    for _ in range(times):
        out = _tell(url)
    source = re.findall(r"journaled runs stale (\S+)", out)[-1]
    fork = re.findall(r"runs refresh → (\S+)", out)[-1]
    with journaled.open(url) as rt:
        stale = rt.runs.stale(source)
        assert [(s.step_id, s.change) for s in stale] == [("region", "superseded")]
        replacement = stale[0].replacement
        assert replacement is not None
        assert re.search(rf"step region read {stale[0].fact_id}\s+superseded by {replacement}", out)
        assert rt.memory.get(replacement).text == "The deploy region is us-east"  # type: ignore[union-attr]
        ran = [
            e.data.step_id  # type: ignore[attr-defined]
            for e in rt.runs.history(fork)
            if e.kind == "run.step-succeeded"
        ]
        assert sorted(ran) == ["region", "release"]  # notes was carried over, not re-run
        assert rt.runs.lineage(fork)[-1].forked_from == source
        comparison = rt.runs.compare(source, fork)
        assert comparison.differing == ["region"]
        assert rt.runs.stale(fork) == []
    assert "re-ran region, release; kept notes" in out
    assert re.search(r"≠ region\s+│ 'eu-west'\s+│ 'us-east'", out), out


def test_cli_reads_the_story(story: tuple[str, str]) -> None:
    """CLI: runs list/why/show/history and memory search/why/history, human and --json."""
    url, run_id = story
    cli = CliRunner()
    listed = cli.invoke(main, ["--url", url, "--json", "runs", "list"])
    assert listed.exit_code == 0, listed.output
    assert run_id in [r["run_id"] for r in json.loads(listed.output)]
    why = cli.invoke(main, ["--url", url, "runs", "why", run_id])
    assert why.exit_code == 0
    assert "waiting for budget" in why.output
    history = cli.invoke(main, ["--url", url, "--json", "runs", "history", run_id])
    assert json.loads(history.output)[0]["data"]["goal"] == "stop the staging incidents"
    with journaled.open(url) as rt:
        pass_run = rt._orchestrations.state(run_id).current_run
        stop = next(e for e in rt.runs.history(str(pass_run)) if e.kind == "run.budget-stopped")
        facts = rt.memory.all()
    shown = cli.invoke(
        main, ["--url", url, "--json", "runs", "show", str(pass_run), "--at", str(stop.position)]
    )
    assert shown.exit_code == 0, shown.output
    snapshot = json.loads(shown.output)
    assert snapshot["stopped_for_budget"] is True
    assert {s["id"]: s["status"] for s in snapshot["plan"]["steps"]}["deploy"] == "pending"
    human = cli.invoke(main, ["--url", url, "runs", "show", str(pass_run)])
    assert "succeeded" in human.output
    search = cli.invoke(main, ["--url", url, "--json", "memory", "search", "staging port"])
    assert json.loads(search.output)[0]["text"].startswith("The staging API moved")
    superseded = next(f for f in facts if f.superseded_by)
    assert "superseded" in cli.invoke(main, ["--url", url, "memory", "why", superseded.id]).output
    assert cli.invoke(main, ["--url", url, "memory", "history", superseded.id]).exit_code == 0


@pytest.mark.parametrize(
    "args",
    [["runs", "why", "run_nope"], ["runs", "history", "run_nope"], ["memory", "why", "mem_nope"]],
)
def test_cli_unknown_ids_fail_clearly(story: tuple[str, str], args: list[str]) -> None:
    """CLI: unknown ids print a clear error and exit non-zero."""
    url, _ = story
    out = CliRunner().invoke(main, ["--url", url, *args])
    assert out.exit_code != 0
    assert "no " in out.output


def test_cli_never_creates_a_journal_it_reads(tmp_path: Path) -> None:
    """CLI: reading a journal that does not exist is an error and creates nothing."""
    path = tmp_path / "missing.sqlite"
    out = CliRunner().invoke(main, ["--url", f"sqlite:///{path}", "runs", "list"])
    assert out.exit_code != 0
    assert "no journal" in out.output
    assert not path.exists()
