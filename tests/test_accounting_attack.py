"""Attacks on honest accounting (R6, E6-E8): odd reservations, budgets of 0, cancels, crashes.

Every probe checks the journal as well as the result: the ``charged`` of each step event adds up
to the run's calls used, a step that never ran is charged nothing, and an overrun is an event.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import journaled
from journaled import AgentResult, Plan, Step
from journaled.events.runs import (
    BudgetStopped,
    CallsOverrun,
    StepFailed,
    StepRetrying,
    StepSucceeded,
    StepWaiting,
)
from journaled.testing import ManualClock

WAIT = 10.0
"""Seconds any thread or child process may take before the test fails instead of hanging."""
ROOT = Path(__file__).resolve().parent.parent
CHARGED = (StepSucceeded, StepFailed, StepRetrying, StepWaiting)


@pytest.fixture
def srt(sqlite_url: str, clock: ManualClock) -> Iterator[journaled.Runtime]:
    """Yield a runtime on a real SQLite file."""
    with journaled.open(sqlite_url, clock=clock) as runtime:
        yield runtime


def _charges(rt: journaled.Runtime, run_id: str) -> dict[str, int]:
    """Sum what the journal charged each step, over all its attempts."""
    out: dict[str, int] = {}
    for event in rt.runs.history(run_id):
        if isinstance(event.data, CHARGED):
            out[event.data.step_id] = out.get(event.data.step_id, 0) + event.data.charged
    return out


def _overruns(rt: journaled.Runtime, run_id: str) -> list[tuple[str, int, int]]:
    return [
        (e.data.step_id, e.data.reserved, e.data.reported)
        for e in rt.runs.history(run_id)
        if isinstance(e.data, CallsOverrun)
    ]


def two_calls_each(step: Step, remaining: float) -> float:
    """A reserve policy importable by name (R6): two model calls per agent step."""
    return 2


@pytest.mark.parametrize(
    ("answer", "reservation", "charged"),
    [(-5, 0, 0), (2.9, 2, 2), (-math.inf, 0, 0), (math.inf, 10, 10), (7, 7, 7), (0.4, 0, 0)],
)
def test_odd_reserve_answers_reserve_and_charge_by_the_rule(
    srt: journaled.Runtime, answer: float, reservation: int, charged: int
) -> None:
    """E6/E8/R6: the reservation is max(0, trunc(answer)) (infinity: all that is left); an
    agent reporting nothing is charged exactly that, and the journal's charges add up."""
    seen: list[int | None] = []

    def agent(step: Step, ctx: Any) -> AgentResult:
        seen.append(ctx.reservation)
        return AgentResult(ok=True)

    srt.register_agent("ag", agent)
    result = srt.execute(
        Plan(goal="g", steps=[Step("x", agent="ag")]),
        call_budget=10,
        reserve=lambda s, r: answer,
    )
    assert result.ok, result.observations
    assert seen == [reservation]
    assert result.calls_used == charged
    assert _charges(srt, result.run_id) == {"x": charged}
    assert _overruns(srt, result.run_id) == []


@pytest.mark.parametrize("answer", [True, False, "3", None, math.nan, [1]])
def test_a_reserve_answering_no_number_fails_its_step_uncharged(
    srt: journaled.Runtime, answer: Any
) -> None:
    """E6/E11/R6: a reserve answering a bool, text, None, NaN or a list fails that agent step
    (agent-failed, naming the answer), which never ran and is charged 0; its siblings run."""
    ran: list[str] = []

    def agent(step: Step, ctx: Any) -> AgentResult:
        ran.append(step.id)
        return AgentResult(ok=True, calls_used=1)

    srt.register_agent("ag", agent)
    srt.register_skill("s", lambda x: x)
    plan = Plan(goal="g", steps=[Step("x", agent="ag"), Step("y", skill="s", input=1)])
    result = srt.execute(plan, call_budget=10, reserve=lambda s, r: answer)
    obs = {o.step_id: o for o in result.observations}
    assert obs["x"].code == "agent-failed"
    assert f"it answered {answer!r}, not a number" in (obs["x"].error or "")
    assert ran == []
    assert obs["y"].ok
    assert result.calls_used == 1
    assert _charges(srt, result.run_id) == {"x": 0, "y": 1}


def test_a_budget_of_zero_runs_free_waves_and_stops_before_any_call(
    srt: journaled.Runtime,
) -> None:
    """E7/R6: with call_budget=0 a tool-only wave runs; a wave holding a skill stops before it
    (budget-stopped names estimate 3, used 0, budget 0) and nothing is charged; a resume with a
    budget of 1 runs it, and an agent reserved 0 that reports 2 calls is an overrun."""
    ran: list[str] = []
    srt.register_tool("t", lambda x: ran.append(f"t{x}"))
    srt.register_skill("s", lambda x: ran.append(f"s{x}"))
    srt.register_agent("ag", lambda step, ctx: AgentResult(ok=True, calls_used=2))
    plan = Plan(
        goal="g",
        steps=[
            Step("t", tool="t", input=1),
            Step("s", skill="s", input=2, depends_on=["t"]),
            Step("x", agent="ag", depends_on=["t"]),
        ],
    )
    first = srt.execute(plan, call_budget=0, reserve=two_calls_each)
    assert first.stopped_for_budget
    assert ran == ["t1"]
    assert first.calls_used == 0
    assert _charges(srt, first.run_id) == {"t": 0}
    (stop,) = [e.data for e in srt.runs.history(first.run_id) if isinstance(e.data, BudgetStopped)]
    assert (stop.estimate, stop.used, stop.budget, stop.pending) == (3, 0, 0, ("s", "x"))
    again = srt.resume(first.run_id, call_budget=3, reserve=lambda s, r: 0)
    assert isinstance(again, journaled.ExecuteResult)
    assert again.ok, again.observations
    assert sorted(ran) == ["s2", "t1"]
    assert again.calls_used == 3
    assert _charges(srt, first.run_id) == {"t": 0, "s": 1, "x": 2}
    assert _overruns(srt, first.run_id) == [("x", 0, 2)]
    assert "step 'x' overran its reservation" in srt.runs.why(first.run_id)


def test_an_overrun_counts_against_the_gate_of_the_next_wave(srt: journaled.Runtime) -> None:
    """E7/E8/R6: an agent reserved 1 that reports 4 is charged 4 and journaled as an overrun;
    the next wave (reserve 2) is gated against 4 used of 5 and stops, its agent never called."""
    ran: list[str] = []

    def agent(step: Step, ctx: Any) -> AgentResult:
        ran.append(step.id)
        return AgentResult(ok=True, calls_used=4)

    srt.register_agent("ag", agent)
    plan = Plan(goal="g", steps=[Step("x", agent="ag"), Step("y", agent="ag", depends_on=["x"])])
    result = srt.execute(plan, call_budget=5, reserve=lambda s, r: 1 if s.id == "x" else 2)
    assert result.stopped_for_budget
    assert ran == ["x"]
    assert result.calls_used == 4
    assert _overruns(srt, result.run_id) == [("x", 1, 4)]
    (stop,) = [e.data for e in srt.runs.history(result.run_id) if isinstance(e.data, BudgetStopped)]
    assert (stop.estimate, stop.used, stop.budget) == (2, 4, 5)
    assert _charges(srt, result.run_id) == {"x": 4}


def test_steps_a_cancel_kept_from_running_are_never_charged(srt: journaled.Runtime) -> None:
    """E5/R6: cancelled while a tool holds, the skill and agent downstream never run and are
    charged nothing; the skill that ran before is charged its one call."""
    inside, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def hold(_: Any) -> str:
        inside.set()
        release.wait(WAIT)
        return "held"

    srt.register_tool("hold", hold)
    srt.register_skill("s", lambda x: ran.append(f"s{x}"))

    def agent(step: Step, ctx: Any) -> AgentResult:
        ran.append(step.id)
        return AgentResult(ok=True)

    srt.register_agent("ag", agent)
    plan = Plan(
        goal="g",
        steps=[
            Step("s0", skill="s", input=0),
            Step("h", tool="hold", depends_on=["s0"]),
            Step("s1", skill="s", input=1, depends_on=["h"]),
            Step("x", agent="ag", depends_on=["h"]),
        ],
    )
    results: list[journaled.ExecuteResult] = []
    thread = threading.Thread(
        target=lambda: results.append(srt.execute(plan, reserve=two_calls_each))
    )
    thread.start()
    try:
        assert inside.wait(WAIT)
        (run_id,) = srt.runs.active()
        srt.cancel(run_id)
    finally:
        release.set()
        thread.join(WAIT)
    assert not thread.is_alive()
    (result,) = results
    assert ran == ["s0"]
    assert result.calls_used == 1
    assert _charges(srt, result.run_id) == {"s0": 1, "h": 0}
    assert {o.step_id: o.code for o in result.observations}["x"] == "cancelled"


def test_a_timed_out_step_is_charged_as_one_that_ran(srt: journaled.Runtime) -> None:
    """E8/R6: a skill past its deadline made its call (charged 1); an agent past it reported
    nothing and is charged its reservation; both are failed, neither is free."""
    release = threading.Event()

    def slow_skill(_: Any) -> str:
        release.wait(WAIT)
        return "late"

    def slow_agent(step: Step, ctx: Any) -> AgentResult:
        release.wait(WAIT)
        return AgentResult(ok=True, calls_used=0)

    srt.register_skill("slow", slow_skill)
    srt.register_agent("slow", slow_agent)
    plan = Plan(goal="g", steps=[Step("s", skill="slow"), Step("x", agent="slow")])
    try:
        result = srt.execute(plan, call_budget=10, reserve=two_calls_each, step_timeout=0.2)
    finally:
        release.set()
    codes = {o.step_id: (o.ok, o.code) for o in result.observations}
    assert codes == {"s": (False, None), "x": (False, "agent-timeout")}
    assert result.calls_used == 3
    assert _charges(srt, result.run_id) == {"s": 1, "x": 2}


_CRASH_SCRIPT = r"""
import json, os, sys, threading
import journaled
from journaled import AgentResult, Plan, Step

cfg = json.loads(sys.argv[1])


def policy_in_child(step, remaining):
    return 2


def agent(step, ctx):
    with open(cfg["record"], "a", encoding="utf-8") as f:
        f.write("%s:%s\n" % (step.id, ctx.reservation))
    if step.id == "y":
        with open(cfg["marker"], "w", encoding="utf-8"):
            pass
        threading.Event().wait()
    return AgentResult(ok=True)


with journaled.open(cfg["url"]) as rt:
    rt.register_agent("ag", agent)
    plan = Plan(goal="g", steps=[Step("x", agent="ag"), Step("y", agent="ag")])
    print(rt.execute(plan, call_budget=4, reserve=policy_in_child).ok)
"""


def _succeeded_once(sqlite_url: str) -> bool:
    """Whether a step-succeeded event is in the SQLite journal (read beside its writer)."""
    path = sqlite_url.removeprefix("sqlite:///").partition("?")[0]
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        try:
            row = conn.execute(
                "SELECT 1 FROM stored_events WHERE topic LIKE 'run.step-succeeded%' LIMIT 1"
            ).fetchone()
        except sqlite3.OperationalError:  # not created yet, or busy for a moment
            return False
    return row is not None


def test_a_wave_killed_mid_flight_is_costed_again_and_charged_once(
    sqlite_url: str, tmp_path: Path
) -> None:
    """E14/R4/R6: SIGKILLed while agent y runs (x done and charged 2), the run resumed by another
    process is refused without the policy it cannot import, then, given one, costs y against
    what is left: y runs again reserved 2, x never re-runs, and 4 calls are charged in all."""
    script = tmp_path / "child.py"
    script.write_text(_CRASH_SCRIPT, encoding="utf-8")
    record, marker, log = tmp_path / "record", tmp_path / "y.inflight", tmp_path / "child.log"
    config = json.dumps({"url": sqlite_url, "record": str(record), "marker": str(marker)})
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(script), config], cwd=ROOT, stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "y never started"
            time.sleep(0.01)  # polling for the marker the step writes, not synchronisation
        # x runs beside y: its success may still be on its way to the journal when y starts.
        while not _succeeded_once(sqlite_url):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "x never succeeded"
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=WAIT)
    assert proc.returncode == -signal.SIGKILL
    assert sorted(record.read_text().split()) == ["x:2", "y:2"]
    with journaled.open(sqlite_url) as rt:
        (run_id,) = rt.runs.ids()
        seen: list[str] = []

        def again(step: Step, ctx: Any) -> AgentResult:
            seen.append(f"{step.id}:{ctx.reservation}")
            return AgentResult(ok=True)

        rt.register_agent("ag", again)
        assert rt.runs.state(run_id).in_flight() == ["y"]
        with pytest.raises(journaled.RunNotResumable, match="pass reserve= to resume"):
            rt.resume(run_id)
        result = rt.resume(run_id, reserve=two_calls_each)
        assert isinstance(result, journaled.ExecuteResult)
        assert result.ok, result.observations
        assert seen == ["y:2"]
        assert result.calls_used == 4
        assert _charges(rt, run_id) == {"x": 2, "y": 2}
        assert _overruns(rt, run_id) == []


def test_a_refreshed_fork_keeps_the_policy_and_only_the_charges_of_what_it_kept(
    srt: journaled.Runtime,
) -> None:
    """R6/P4/F1: refresh of a run whose agent read a changed fact makes a fork that starts with
    the calls of the steps it kept (not of the one it re-runs) and costs that agent with the
    source's journaled reserve policy, without reserve= on resume."""
    srt.memory.remember("colour red", conflict_key="colour")
    seen: list[int | None] = []

    def agent(step: Step, ctx: Any) -> AgentResult:
        seen.append(ctx.reservation)
        return AgentResult(ok=True, output=[f.id for f in ctx.memory.search("colour")])

    srt.register_skill("s", lambda x: x)
    srt.register_agent("ag", agent)
    plan = Plan(
        goal="g",
        steps=[
            Step("a", skill="s", input=1),
            Step("b", agent="ag", depends_on=["a"]),
            Step("c", skill="s", input=2),
        ],
    )
    source = srt.execute(plan, call_budget=5, reserve=two_calls_each)
    assert source.calls_used == 4
    srt.memory.remember("colour blue", conflict_key="colour")
    fork = srt.runs.refresh(source.run_id)
    state = srt.runs.state(fork)
    assert (state.calls_used, state.budget) == (2, 5)
    result = srt.resume(fork)
    assert isinstance(result, journaled.ExecuteResult)
    assert result.ok, result.observations
    assert seen == [2, 2]
    assert result.calls_used == 4
    assert _charges(srt, fork) == {"b": 2}
    assert srt.runs.state(source.run_id).calls_used == 4  # the source is untouched
