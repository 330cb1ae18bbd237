"""An orchestration killed with SIGKILL during wave 1 resumes against its settled plan (O5).

A child process runs ``rt.orchestrate(goal, planner)`` on a SQLite journal. The planner appends a
line to a "planner-calls" file (fsynced) each time it is asked; the plan is ``slow`` (wave 1) then
``after`` (wave 2). The ``slow`` tool creates a marker file and blocks forever. The test waits for
the marker, SIGKILLs the child, checks what the journal says, then a fresh process calls
``rt.resume(orchestration_id, planner=planner)`` with tools that return at once. The planner must
never be asked again (no re-plan from the bare goal), and ``slow`` runs again as attempt 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from crash import kill_when_in_flight

import journaled
from journaled.events.orchestration import OrchestrationStarted, PassStarted, PlanProposed
from journaled.events.runs import RunResumed, RunStarted, StepStarted

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_SECONDS = 30.0
GOAL = "survive a crash mid-orchestration"

SCRIPT = r"""
import json, os, sys, threading
import msgspec
import journaled

cfg = json.loads(sys.argv[1])


def planner(goal, observations, clarifications):
    with open(cfg["calls"], "a", encoding="utf-8") as f:
        f.write(f"{goal} | {len(observations)} | {len(clarifications)}\n")
        f.flush()
        os.fsync(f.fileno())
    return journaled.Plan(
        goal=goal,
        steps=[
            journaled.Step("slow", tool="slow", input="slow"),
            journaled.Step("after", tool="quick", input="after", depends_on=["slow"]),
        ],
    )


def slow(data):
    if cfg["block"]:
        with open(cfg["marker"], "w", encoding="utf-8") as f:
            f.flush()
            os.fsync(f.fileno())
        threading.Event().wait()
    return data


with journaled.open(cfg["url"]) as rt:
    rt.register_tool("slow", slow)
    rt.register_tool("quick", lambda data: data)
    if cfg["run_id"]:
        outcome = rt.resume(cfg["run_id"], planner=planner)
    else:
        outcome = rt.orchestrate(cfg["goal"], planner, mode=cfg["mode"])
    print(msgspec.json.encode(outcome).decode())
"""


def _config(tmp_path: Path, mode: str, *, block: bool, run_id: str = "") -> str:
    return json.dumps(
        {
            "url": f"sqlite:///{tmp_path / 'journal.sqlite'}",
            "calls": str(tmp_path / "planner-calls.txt"),
            "marker": str(tmp_path / "slow.inflight"),
            "goal": GOAL,
            "mode": mode,
            "block": block,
            "run_id": run_id,
        }
    )


def _orchestrate_until_in_flight(tmp_path: Path, mode: str) -> None:
    """Start the orchestration in a child process, wait for ``slow`` to block, SIGKILL it."""
    config = _config(tmp_path, mode, block=True)
    kill_when_in_flight(SCRIPT, config, [tmp_path / "slow.inflight"], tmp_path)


def _resume_in_fresh_process(tmp_path: Path, mode: str, run_id: str) -> journaled.Outcome:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, _config(tmp_path, mode, block=False, run_id=run_id)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return msgspec.json.decode(done.stdout, type=journaled.Outcome)


def _planner_calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "planner-calls.txt").read_text(encoding="utf-8").splitlines()


def _attempts(rt: journaled.Runtime, run_id: str) -> dict[str, list[int]]:
    started: dict[str, list[int]] = {}
    for event in rt.runs.history(run_id):
        if isinstance(event.data, StepStarted):
            started.setdefault(event.data.step_id, []).append(event.data.attempt)
    return started


@pytest.mark.parametrize("mode", ["execute", "orchestrate"])
def test_sigkill_in_wave_one_resumes_the_settled_plan(tmp_path: Path, mode: str) -> None:
    """O5: after SIGKILL in wave 1, resume runs the journaled plan; the planner is not re-asked."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    _orchestrate_until_in_flight(tmp_path, mode)
    assert _planner_calls(tmp_path) == [f"{GOAL} | 0 | 0"]

    # What the journal holds after the kill: the settled plan, the pass, 'slow' in flight.
    with journaled.open(url) as rt:
        orchestrations = [
            r for r in rt.runs.ids() if isinstance(rt.runs.history(r)[0].data, OrchestrationStarted)
        ]
        [orchestration_id] = orchestrations
        events = rt.runs.history(orchestration_id)
        assert [e.kind for e in events] == [
            "orchestration.started",
            "orchestration.plan-proposed",
            "orchestration.pass-started",
        ]
        proposed = events[1].data
        assert isinstance(proposed, PlanProposed)
        assert [s.id for s in proposed.plan.steps] == ["slow", "after"]
        passed = events[2].data
        assert isinstance(passed, PassStarted)
        child = passed.run
        started = rt.runs.history(child)[0].data
        assert isinstance(started, RunStarted)
        assert (started.parent_run, started.parent_step) == (orchestration_id, "pass-1")
        assert [s.id for s in started.plan.steps] == ["slow", "after"]
        state = rt.runs.state(child)
        assert state.in_flight() == ["slow"]
        assert not state.is_finished
        assert _attempts(rt, child) == {"slow": [1]}

    outcome = _resume_in_fresh_process(tmp_path, mode, orchestration_id)
    assert outcome.run_id == orchestration_id
    assert outcome.status == "completed", outcome.summary
    assert outcome.plan is not None
    assert [(s.id, s.status) for s in outcome.plan.steps] == [
        ("slow", "succeeded"),
        ("after", "succeeded"),
    ]
    assert outcome.pass_run == child
    assert _planner_calls(tmp_path) == [f"{GOAL} | 0 | 0"]  # asked exactly once, in total

    with journaled.open(url) as rt:
        assert _attempts(rt, child) == {"slow": [1, 2], "after": [1]}
        resumed = [e.data for e in rt.runs.history(child) if isinstance(e.data, RunResumed)]
        assert [(r.resumption, list(r.rerun)) for r in resumed] == [(1, ["slow"])]
        kinds = [e.kind for e in rt.runs.history(orchestration_id)]
        assert kinds.count("orchestration.plan-proposed") == 1
        assert kinds.count("orchestration.pass-started") == 1
        assert kinds[-1] == "orchestration.ended"
        assert rt.runs.state(child).run_status == "completed"
