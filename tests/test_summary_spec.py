"""Run summaries tell the truth (SPEC R3, R5; ADR 0087): suspended orchestrations, in
``rt.runs.list``, ``runs.why`` and their own streams, on real SQLite files and real child
processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import journaled
from journaled import Plan, Step
from journaled.events.orchestration import OrchestrationSuspended
from journaled.events.orchestration_state import OrchestrationState, fold_orchestration

ROOT = Path(__file__).resolve().parent.parent
WAIT = 30.0


# -- 3. an orchestration let go by a close is suspended, in its own stream --------------------


def _one_slow_step(goal: str, observations: object, clarifications: object) -> Plan:
    return Plan(goal=goal, steps=[Step("slow", tool="slow", input=1)])


def test_a_close_during_a_pass_journals_the_orchestrations_suspension(sqlite_url: str) -> None:
    """R3, R5, ADR 0087: closed mid-pass, the orchestration's own stream records
    `orchestration.suspended` (its pass's run named), folded at every position as it was live;
    runs.list and runs.why's head both say suspended; a new runtime resumes it to completed."""
    inside, release = threading.Event(), threading.Event()

    def slow(_: object) -> str:
        inside.set()
        release.wait(WAIT)
        return "done"

    traced: list[tuple[int, OrchestrationState]] = []
    rt = journaled.open(sqlite_url)
    rt.register_tool("slow", slow)
    handle = rt._orchestrations.start(
        "survive a close", _one_slow_step, trace=lambda p, s: traced.append((p, s))
    )
    assert inside.wait(WAIT)
    rt.close(drain=0.1)
    release.set()
    with pytest.raises(journaled.RuntimeClosed):
        handle.result(WAIT)
    with journaled.open(sqlite_url) as rt2:
        orch = handle.run_id
        events = rt2.runs.history(orch)
        assert [e.kind for e in events][-1] == "orchestration.suspended"
        suspended = events[-1].data
        assert isinstance(suspended, OrchestrationSuspended)
        pass_run = rt2.runs.summary(orch).current_run
        assert (suspended.phase, suspended.run, suspended.pass_no, suspended.cause) == (
            "running",
            pass_run,
            1,
            "close",
        )
        for position, live in traced:
            assert fold_orchestration([e for e in events if e.position <= position]) == live
        assert traced[-1][1].suspended == suspended
        assert rt2.runs.summary(orch).status == "suspended"
        assert rt2.runs.list(status="suspended") == [orch, pass_run]
        why = rt2.runs.why(orch).splitlines()
        assert why[0] == f"orchestration {orch} — suspended:"
        assert any("suspended when its runtime closed (pass 1 was running" in w for w in why)
        rt2.register_tool("slow", lambda _: "done")
        outcome = rt2.resume(orch, planner=_one_slow_step)
        assert isinstance(outcome, journaled.Outcome)
        assert outcome.status == "completed"
        assert rt2.runs.summary(orch).status == "completed"
        assert rt2.runs.why(orch).splitlines()[0] == f"orchestration {orch} — completed:"


CLOSE_WHILE_PLANNING = r"""
import sys, threading
import journaled
from journaled import Plan, Step

thinking, release = threading.Event(), threading.Event()


def planner(goal, observations, clarifications):
    thinking.set()
    release.wait(60)
    return Plan(goal=goal, steps=[Step("a", tool="ok")])


rt = journaled.open(sys.argv[1])
handle = rt.orchestrate_start("let go while planning", planner)
assert thinking.wait(30)
rt.close(drain=0)
try:
    handle.result(30)
except journaled.RuntimeClosed:
    pass
print(handle.run_id, flush=True)
threading.Event().wait()  # stays alive: its runtime let the orchestration go
"""


def test_an_orchestration_let_go_while_planning_is_suspended_and_resumable_elsewhere(
    sqlite_url: str,
) -> None:
    """R3, R5, ADR 0022, ADR 0087: a close while the planner thinks journals the suspension
    (phase planning), so runs.list and why say suspended, not running, and another process
    resumes it at once though the closing process still lives (no RunOwnedElsewhere)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CLOSE_WHILE_PLANNING, sqlite_url],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        orch = proc.stdout.readline().strip()
        assert orch, proc.stderr.read() if proc.stderr is not None else ""
        assert proc.poll() is None
        with journaled.open(sqlite_url) as rt:
            kinds = [e.kind for e in rt.runs.history(orch)]
            assert kinds == ["orchestration.started", "orchestration.suspended"]
            assert rt.runs.summary(orch).status == "suspended"
            assert rt.runs.why(orch).splitlines()[0] == f"orchestration {orch} — suspended:"
            rt.register_tool("ok", lambda x: x)
            outcome = rt.resume(
                orch, planner=lambda g, o, c: Plan(goal=g, steps=[Step("a", tool="ok")])
            )
            assert isinstance(outcome, journaled.Outcome)
            assert outcome.status == "completed"
            assert rt.runs.summary(orch).status == "completed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(WAIT)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
