"""A run killed with SIGKILL mid-step resumes in a fresh process from the journal alone (E14).

The plan is the chain ``a -> b -> c`` plus ``d``, independent, in wave 1. A child process executes
it on a SQLite journal with step functions that append ``"<step_id> <attempt>"`` to a record file
(fsynced) and, for the chosen steps, create a marker file and then block forever. The test waits
for the markers, kills the child with SIGKILL, checks what the journal says was in flight, and
resumes the run in a second, fresh process whose step functions record and return at once.

Tools cannot see their attempt number, so the tool recorder counts its own earlier lines for the
step (a counter kept in the record file); agents record ``ctx.attempt`` as the runtime gives it.
Either way the record must agree with the journal's ``run.step-started`` attempts.
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
from journaled.events.runs import RunResumed, StepStarted

ROOT = Path(__file__).resolve().parent.parent
PLAN_ORDER = ("a", "b", "c", "d")
DEADLINE_SECONDS = 30.0

SCRIPT = r"""
import json, os, sys, threading
import msgspec
import journaled

cfg = json.loads(sys.argv[1])
record = cfg["record"]
lock = threading.Lock()


def note(step_id, attempt):
    with open(record, "a", encoding="utf-8") as f:
        f.write(f"{step_id} {attempt}\n")
        f.flush()
        os.fsync(f.fileno())


def earlier(step_id):
    if not os.path.exists(record):
        return 0
    with open(record, encoding="utf-8") as f:
        return sum(1 for line in f if line.split()[:1] == [step_id])


def maybe_block(step_id):
    if step_id in cfg["block"]:
        marker = os.path.join(cfg["markers"], step_id + ".inflight")
        with open(marker, "w", encoding="utf-8") as f:
            f.flush()
            os.fsync(f.fileno())
        threading.Event().wait()


def tool(data):
    step_id = data["id"]
    with lock:
        note(step_id, earlier(step_id) + 1)
    maybe_block(step_id)
    return step_id


def agent(step, ctx):
    note(ctx.step_id, ctx.attempt)
    maybe_block(ctx.step_id)
    return journaled.AgentResult(output=ctx.step_id)


def step(step_id, deps=()):
    if step_id in cfg["agents"]:
        return journaled.Step(step_id, agent="recorder", input={"id": step_id}, depends_on=deps)
    return journaled.Step(step_id, tool="record", input={"id": step_id}, depends_on=deps)


with journaled.open(cfg["url"]) as rt:
    rt.register_tool("record", tool)
    rt.register_agent("recorder", agent)
    if cfg["mode"] == "execute":
        plan = journaled.Plan(
            goal="survive a crash",
            steps=[step("a"), step("b", ["a"]), step("c", ["b"]), step("d")],
        )
        result = rt.execute(plan, max_parallel_steps=cfg["parallel"])
    else:
        result = rt.resume(cfg["run_id"])
    print(msgspec.json.encode(result).decode())
"""


def _config(tmp_path: Path, mode: str, agents: list[str], **extra: object) -> str:
    cfg: dict[str, object] = {
        "url": f"sqlite:///{tmp_path / 'journal.sqlite'}",
        "record": str(tmp_path / "record.txt"),
        "markers": str(tmp_path),
        "mode": mode,
        "agents": agents,
        "block": [],
        "parallel": 2,
        "run_id": "",
    }
    cfg.update(extra)
    return json.dumps(cfg)


def _run_until_in_flight(tmp_path: Path, agents: list[str], block: list[str]) -> None:
    """Execute the plan in a child process, wait until ``block`` are all in flight, SIGKILL it."""
    cfg = _config(tmp_path, "execute", agents, block=block)
    markers = [tmp_path / f"{step_id}.inflight" for step_id in block]
    kill_when_in_flight(SCRIPT, cfg, markers, tmp_path)


def _resume_in_fresh_process(tmp_path: Path, agents: list[str], run_id: str) -> str:
    cfg = _config(tmp_path, "resume", agents, run_id=run_id)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, cfg],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _recorded(tmp_path: Path) -> dict[str, list[int]]:
    runs: dict[str, list[int]] = {}
    for line in (tmp_path / "record.txt").read_text().splitlines():
        step_id, attempt = line.split()
        runs.setdefault(step_id, []).append(int(attempt))
    return runs


def _crash_and_resume(tmp_path: Path, agents: list[str], block: list[str]) -> None:
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    _run_until_in_flight(tmp_path, agents, block)
    finished_before = [i for i in ("a", "d") if i not in block]  # wave 1, not blocked

    # What the journal knows after the kill: the finished steps and the steps in flight.
    with journaled.open(url) as rt:
        (run_id,) = rt.runs.ids()
        state = rt.runs.state(run_id)
        assert state.in_flight() == block
        assert not state.is_finished
        assert sorted(i for i in PLAN_ORDER if state.status[i] == "succeeded") == finished_before
        assert all(state.status[i] == "pending" for i in ("b", "c") if i not in block)
    assert _recorded(tmp_path) == {i: [1] for i in [*finished_before, *block]}

    stdout = _resume_in_fresh_process(tmp_path, agents, run_id)
    result = msgspec.json.decode(stdout, type=journaled.ExecuteResult)
    assert result.run_id == run_id
    assert result.ok
    assert not result.waiting
    assert not result.stopped_for_budget
    assert [s.status for s in result.plan.steps] == ["succeeded"] * 4
    assert sorted(o.step_id for o in result.observations) == sorted(PLAN_ORDER)
    assert all(o.ok for o in result.observations)

    # Succeeded before the kill: ran once. In flight: ran again, attempt 2. The rest: once.
    expected = {i: ([1, 2] if i in block else [1]) for i in PLAN_ORDER}
    assert _recorded(tmp_path) == expected
    with journaled.open(url) as rt:
        history = rt.runs.history(run_id)
        started: dict[str, list[int]] = {}
        for event in history:
            if isinstance(event.data, StepStarted):
                started.setdefault(event.data.step_id, []).append(event.data.attempt)
        assert started == expected
        resumed = [e.data for e in history if isinstance(e.data, RunResumed)]
        assert len(resumed) == 1
        assert resumed[0].resumption == 1
        assert list(resumed[0].rerun) == block
        assert rt.runs.state(run_id).run_status == "completed"


@pytest.mark.parametrize("kind", ["tool", "agent"])
def test_step_in_flight_at_sigkill_runs_again_on_resume(tmp_path: Path, kind: str) -> None:
    """E14: after SIGKILL mid-step, resume skips finished steps and re-runs b with attempt 2."""
    _crash_and_resume(tmp_path, agents=["b"] if kind == "agent" else [], block=["b"])


def test_both_steps_of_a_parallel_batch_run_again_after_sigkill(tmp_path: Path) -> None:
    """E14/E2: SIGKILL with two wave-1 steps in flight (max_parallel_steps=2) re-runs both."""
    _crash_and_resume(tmp_path, agents=["d"], block=["a", "d"])
