"""Attacks on close, drain, child runs and accounting (SPEC 6: R3, R5, R6, R8).

Each test is one defect found by racing close, signals, child runs and odd agent reports against
the executor; see ADR 0020 for the behaviour they pin down.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from threads import in_thread

import journaled
from journaled import Plan, Step
from journaled.testing import wait_for

ROOT = Path(__file__).resolve().parent.parent
WAIT = 20.0
"""Upper bound of every wait: a test that needs it has failed."""


# -- R3: Ctrl-C in the thread that executes -------------------------------------------------------

CTRL_C_SCRIPT = r"""
import json, os, sys, threading
import journaled

cfg = json.loads(sys.argv[1])


def hold(x):
    # In flight when Ctrl-C comes; finishes as soon as the runtime starts closing (within drain).
    open(cfg["marker"], "w").close()
    for _ in range(2000):
        if rt.runs.closing:
            return x
        threading.Event().wait(0.01)
    return x


with journaled.open(cfg["url"], drain=30) as rt:
    rt.register_tool("hold", hold)
    steps = [journaled.Step("b", tool="hold", input="b"),
             journaled.Step("c", tool="hold", input="c", depends_on=["b"])]
    rt.execute(journaled.Plan(goal="g", steps=steps))  # the main thread, as in a script
"""


@pytest.mark.usefixtures("sigint_reaches_children")
def test_ctrl_c_in_execute_still_drains_and_suspends_the_run(tmp_path: Path) -> None:
    """R3: Ctrl-C in execute: the step in flight drains, nothing more starts, the run suspends."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    marker = tmp_path / "b.inflight"
    cfg = json.dumps({"url": url, "marker": str(marker)})
    proc = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_SCRIPT, cfg],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: marker.exists() or proc.poll() is not None, WAIT)
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)  # a hang at exit fails here
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT)
    assert "KeyboardInterrupt" in err
    with journaled.open(url) as rt:
        (run_id,) = rt.runs.ids()
        state = rt.runs.state(run_id)
        kinds = [e.kind for e in rt.runs.history(run_id)]
        assert state.status == {"b": "succeeded", "c": "pending"}, kinds
        assert state.suspended is not None, kinds
        assert state.suspended.in_flight == ()


# -- R3: two closes at once -----------------------------------------------------------------------


def _inside(thread: threading.Thread, function: str) -> bool:
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def test_a_second_close_returns_only_once_the_runtime_is_closed(sqlite_url: str) -> None:
    """R3: close() called while another thread's close() drains returns only once that one has."""
    entered = threading.Event()
    release = threading.Event()

    def hold(_: object) -> str:
        entered.set()
        release.wait(WAIT)
        return "held"

    rt = journaled.open(sqlite_url, drain=WAIT)
    rt.register_tool("hold", hold)
    runner, result = in_thread(rt.execute, Plan(goal="g", steps=[Step("a", tool="hold")]))
    try:
        assert entered.wait(WAIT)
        first, _ = in_thread(rt.close)
        wait_for(lambda: rt.runs.closing, WAIT)
        seen: list[list[str]] = []

        def second_close() -> None:
            rt.close()
            seen.append(rt.runs.active())  # what is still executing when close() returned

        second = threading.Thread(target=second_close)
        second.start()
        # Release the step once the second close is waiting in _close (or already returned).
        wait_for(lambda: not second.is_alive() or _inside(second, "wait"), WAIT)
        release.set()
        second.join(WAIT)
        first.join(WAIT)
        runner.join(WAIT)
    finally:
        release.set()
    assert seen == [[]]
    assert isinstance(result[0], journaled.ExecuteResult)
    assert result[0].ok


# -- R5: child runs -------------------------------------------------------------------------------


def test_two_concurrent_child_runs_of_one_step_both_run(journal_url: str) -> None:
    """R5/E9: an agent starting two child plans from two threads gets two distinct children."""
    barrier = threading.Barrier(2)

    def agent(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        def child(n: int) -> journaled.ExecuteResult:
            barrier.wait(WAIT)
            return ctx.execute(Plan(goal=f"child {n}", steps=[Step("w", tool="t", input=n)]))

        with ThreadPoolExecutor(2) as pool:
            children = list(pool.map(child, [1, 2]))
        return journaled.AgentResult(output=[c.ok for c in children])

    with journaled.open(journal_url) as rt:
        rt.register_tool("t", lambda x: x)
        rt.register_agent("boss", agent)
        result = rt.execute(Plan(goal="g", steps=[Step("s", agent="boss")]))
        assert result.ok, result.observations
        assert result.observations[-1].output == [True, True]
        assert len(rt.runs.ids()) == 3


def test_a_rerun_step_with_another_child_plan_never_gets_the_first_plans_result(
    sqlite_url: str,
) -> None:
    """R5: on a re-run, ctx.execute with a different plan never answers with the old child."""

    def agent(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        # The first attempt plans "alpha"; the answer changes the agent's mind: "beta".
        name = "alpha" if ctx.answer is None else "beta"
        child = ctx.execute(Plan(goal=name, steps=[Step(name, tool="t", input=name)]))
        if ctx.answer is None:
            raise journaled.NeedsInput("go on?")
        return journaled.AgentResult(output=[s.id for s in child.plan.steps])

    with journaled.open(sqlite_url) as rt:
        rt.register_tool("t", lambda x: x)
        rt.register_agent("boss", agent)
        first = rt.execute(Plan(goal="g", steps=[Step("s", agent="boss")]))
        assert first.waiting == ["s"]
        done = rt.resume(first.run_id, answers={"s": "yes"})
        assert isinstance(done, journaled.ExecuteResult)
        assert done.observations[-1].output != ["alpha"]
        assert not done.observations[-1].ok
        assert "passed another plan than on its first attempt" in (
            done.observations[-1].error or ""
        )
        assert len(rt.runs.ids()) == 2  # the parent and the one child: none started twice


# -- R6: accounting -------------------------------------------------------------------------------


def test_an_agent_reporting_negative_calls_is_not_made_free(rt: journaled.Runtime) -> None:
    """R6/E8: calls_used=-5 is refused naming the field and charged the reservation, not 0."""
    rt.register_agent("liar", lambda step, ctx: journaled.AgentResult(calls_used=-5))
    plan = Plan(goal="g", steps=[Step("x", agent="liar")])
    result = rt.execute(plan, call_budget=10, reserve=lambda s, r: 3)
    assert result.calls_used == 3
    obs = result.observations[-1]
    assert not obs.ok
    assert obs.code == "agent-failed"
    assert "calls_used is -5, outside [0, " in (obs.error or "")


def reserve_three(step: Step, remaining: float) -> float:
    """A reserve policy importable by name (R6): three model calls per agent step."""
    return 3


def test_a_resumed_orchestration_costs_agent_steps_with_its_policy(sqlite_url: str) -> None:
    """R6: approving an orchestration without reserve= still costs its agent steps as journaled."""
    ran: list[int | None] = []

    def agent(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        ran.append(ctx.reservation)
        return journaled.AgentResult()

    def planner(goal: str, observations: Any, clarifications: Any) -> Plan:
        return Plan(goal=goal, steps=[Step("x", agent="a")])

    with journaled.open(sqlite_url) as rt:
        rt.register_agent("a", agent)
        asked = rt.orchestrate(
            "g", planner, call_budget=2, require_approval=True, reserve=reserve_three
        )
        assert asked.status == "waiting_for_approval"
    with journaled.open(sqlite_url) as again:
        again.register_agent("a", agent)
        outcome = again.resume(asked.run_id, approve=True, planner=planner)
        assert isinstance(outcome, journaled.Outcome)
        assert outcome.status == "waiting_for_budget"  # x reserves 3 > 2, as before
        assert ran == []


# -- R8: one driver per orchestration in one process --------------------------------------------


def test_resuming_an_orchestration_that_runs_here_is_refused_untouched(sqlite_url: str) -> None:
    """R8: resuming an orchestration driven in this process: RunOwnedElsewhere, nothing appended."""
    entered = threading.Event()
    release = threading.Event()

    def hold(x: str) -> str:
        entered.set()
        release.wait(WAIT)
        return x

    def planner(goal: str, observations: Any, clarifications: Any) -> Plan:
        return Plan(goal=goal, steps=[Step("h", tool="hold", input="h")])

    with journaled.open(sqlite_url) as rt:
        rt.register_tool("hold", hold)
        thread, out = in_thread(rt.orchestrate, "g", planner)
        try:
            assert entered.wait(WAIT)
            orchestration = next(r for r in rt.runs.ids() if "orchestration" in rt.runs.why(r))
            before = len(rt.runs.history(orchestration))
            with pytest.raises(journaled.RunOwnedElsewhere):
                rt.resume(orchestration, planner=planner)
            assert len(rt.runs.history(orchestration)) == before
        finally:
            release.set()
            thread.join(WAIT)
        assert isinstance(out[0], journaled.Outcome), out
        assert out[0].status == "completed"


# -- R3: close racing a run that is starting or ending ---------------------------------------------


def _waiting_under(thread: threading.Thread, outer: str) -> bool:
    """Tell whether ``thread`` blocks in a ``wait`` called (at any depth) from ``outer``."""
    frame = sys._current_frames().get(thread.ident or -1)
    names: list[str] = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return any(name == "wait" and outer in names[i + 1 :] for i, name in enumerate(names))


def test_close_waits_for_a_run_claimed_just_before_it(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R3: a run whose executor starts while close() begins is drained and suspended, not lost."""
    from journaled.actors.executor import Executor

    entered = threading.Event()
    go = threading.Event()
    start = Executor.start

    def slow_start(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        go.wait(WAIT)  # the caller thread is between its claim and its executor
        return start(*args, **kwargs)

    monkeypatch.setattr(Executor, "start", slow_start)
    rt = journaled.open(sqlite_url, drain=WAIT)
    rt.register_tool("t", lambda x: x)
    runner, out = in_thread(rt.execute, Plan(goal="g", steps=[Step("a", tool="t")]))
    try:
        assert entered.wait(WAIT)
        closer, closed = in_thread(rt.close)
        wait_for(lambda: not closer.is_alive() or _waiting_under(closer, "wait_idle"), WAIT)
    finally:
        go.set()
        runner.join(WAIT)
    closer.join(WAIT)
    assert closed == [None]
    assert isinstance(out[0], journaled.ExecuteResult), out
    assert out[0].suspended
    with journaled.open(sqlite_url) as again:
        state = again.runs.state(out[0].run_id)
        assert state.suspended is not None
        assert state.status == {"a": "pending"}


def test_close_and_cancel_while_an_ended_run_is_being_let_go(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R3/E5: close and cancel right after a run's executor stopped neither raise nor half-close."""
    import pykka

    from journaled.actors import runs

    letting_go = threading.Event()
    go = threading.Event()
    forget = runs.Runs._forget

    def slow_forget(self: runs.Runs, *args: Any) -> None:
        letting_go.set()
        go.wait(WAIT)  # the caller thread has its result; the claim is still held
        forget(self, *args)

    monkeypatch.setattr(runs.Runs, "_forget", slow_forget)
    rt = journaled.open(sqlite_url, drain=WAIT)
    rt.register_tool("t", lambda x: x)
    runner, out = in_thread(rt.execute, Plan(goal="g", steps=[Step("a", tool="t")]))
    try:
        assert letting_go.wait(WAIT)
        alive = [r.actor_class.__name__ for r in pykka.ActorRegistry.get_all()]
        assert "Executor" not in alive  # it has stopped; its claim is not dropped yet
        (run_id,) = rt.runs.active()
        rt.cancel(run_id)
        closer, closed = in_thread(rt.close)
        wait_for(lambda: not closer.is_alive() or _waiting_under(closer, "wait_idle"), WAIT)
    finally:
        go.set()
        runner.join(WAIT)
    closer.join(WAIT)
    assert closed == [None]
    assert isinstance(out[0], journaled.ExecuteResult)
    assert out[0].ok


def test_orchestrate_whose_runtime_closed_while_planning_raises_runtime_closed(
    sqlite_url: str,
) -> None:
    """R3/O5: close() ending while the planner runs: orchestrate raises RuntimeClosed, resumable."""
    entered = threading.Event()
    release = threading.Event()

    def planner(goal: str, observations: Any, clarifications: Any) -> Plan:
        if not release.is_set():
            entered.set()
            release.wait(WAIT)
        return Plan(goal=goal, steps=[Step("a", tool="t", input="a")])

    rt = journaled.open(sqlite_url)
    rt.register_tool("t", lambda x: x)
    thread, out = in_thread(rt.orchestrate, "g", planner)
    try:
        assert entered.wait(WAIT)
        rt.close()  # nothing executes: it returns at once, closing the journal
    finally:
        release.set()
        thread.join(WAIT)
    assert isinstance(out[0], journaled.RuntimeClosed), out
    with journaled.open(sqlite_url) as again:
        again.register_tool("t", lambda x: x)
        (orchestration,) = again.runs.ids()
        outcome = again.resume(orchestration, planner=planner)
        assert isinstance(outcome, journaled.Outcome)
        assert outcome.status == "completed"
