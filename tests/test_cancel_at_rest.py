"""``rt.cancel`` of a run no process executes (E5, R3, ADR 0075): a run waiting for an answer or
for budget, suspended by a close, or left by a crashed process ends ``cancelled`` — its pending
steps skipped as E5 says, nothing re-run — and can no longer be resumed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_run_tenancy import ask

import journaled
from journaled import AgentResult, NeedsInput, Plan, RunNotResumable, Step
from journaled.events.runs import RunFinished, StepStarted
from journaled.testing import wait_for

WAIT = 20.0


def nested(step: Step, ctx: journaled.AgentContext) -> AgentResult:
    """Run a child plan whose own agent step asks; ask on its behalf (E9, E10)."""
    child = ctx.execute(Plan(goal="child", steps=[Step("inner", agent="ask")]))
    if child.waiting:
        raise NeedsInput("the child asks which region")
    return AgentResult(output=child.observations[-1].output, calls_used=0)


ran: list[str] = []


def _echo(x: object) -> object:
    ran.append(str(x))
    return x


def _register(rt: journaled.Runtime) -> None:
    rt.register_agent("ask", ask)
    rt.register_agent("nested", nested)
    rt.register_tool("echo", _echo)
    rt.register_skill("think", lambda x: f"thought about {x}")


@pytest.fixture
def rt(durable_url: str) -> Iterator[journaled.Runtime]:
    ran.clear()
    with journaled.open(durable_url) as runtime:
        _register(runtime)
        yield runtime


def _status(rt: journaled.Runtime, run_id: str) -> str:
    return rt.runs.summary(run_id).status


def test_a_run_waiting_for_an_answer_is_cancelled(rt: journaled.Runtime) -> None:
    """E5/E10: cancel of a waiting run returns True; the waiting step and every pending step are
    skipped as cancelled, the run ends ``cancelled``, and a resume with the answer is refused."""
    plan = Plan(
        goal="g",
        steps=[Step("q", agent="ask"), Step("after", tool="echo", input=1, depends_on=["q"])],
    )
    waiting = rt.execute(plan)
    assert waiting.waiting == ["q"]
    assert rt.cancel(waiting.run_id) is True
    result = rt.runs.current(waiting.run_id)
    assert [s.status for s in result.plan.steps] == ["skipped", "skipped"]
    asked = [o for o in result.observations if o.step_id == "q"][-1]
    assert asked.code == "cancelled"
    assert result.waiting == []
    assert _status(rt, waiting.run_id) == "cancelled"
    finished = [e.data for e in rt.runs.history(waiting.run_id) if isinstance(e.data, RunFinished)]
    assert [f.status for f in finished] == ["waiting", "cancelled"]
    assert "cancel" in rt.runs.why(waiting.run_id)
    with pytest.raises(RunNotResumable, match="already finished"):
        rt.resume(waiting.run_id, answers={"q": "eu"})
    assert ran == []
    assert rt.cancel(waiting.run_id) is False  # ended: nothing left to cancel


def test_a_run_stopped_for_budget_is_cancelled_without_running_more(rt: journaled.Runtime) -> None:
    """E5/E7: a run stopped before a wave for budget is cancelled: its pending steps are skipped,
    none runs, no call is charged."""
    plan = Plan(
        goal="g",
        steps=[
            Step("a", skill="think", input=1),
            Step("b", skill="think", input=2, depends_on=["a"]),
        ],
    )
    stopped = rt.execute(plan, call_budget=1)
    assert stopped.stopped_for_budget
    assert rt.cancel(stopped.run_id) is True
    after = rt.runs.current(stopped.run_id)
    assert after.calls_used == 1
    assert [s.status for s in after.plan.steps] == ["succeeded", "skipped"]
    assert _status(rt, stopped.run_id) == "cancelled"


def test_a_waiting_parent_cancels_its_waiting_child_run_too(rt: journaled.Runtime) -> None:
    """E5/E9: cancelling a run whose agent step waits on a child run's question ends the child
    run cancelled as well, so no question is left open under a cancelled run."""
    parent = rt.execute(Plan(goal="g", steps=[Step("p", agent="nested")]))
    assert parent.waiting == ["p"]
    child = parent.observations[-1].agent_task_id
    assert child is not None
    assert _status(rt, child) == "waiting_for_input"
    assert rt.cancel(parent.run_id) is True
    assert _status(rt, parent.run_id) == "cancelled"
    assert _status(rt, child) == "cancelled"


def test_cancel_of_a_finished_unknown_or_purged_run_is_false_and_appends_nothing(
    rt: journaled.Runtime,
) -> None:
    """E5/R2: a completed run, an unknown id and a purged run are not cancelled: False, and
    nothing is appended."""
    done = rt.execute(Plan(goal="g", steps=[Step("a", tool="echo", input=1)])).run_id
    waiting = rt.execute(Plan(goal="g", steps=[Step("q", agent="ask")])).run_id
    assert rt.cancel(waiting)
    assert rt.runs.purge(waiting, "done with it")
    end = rt.journal.position()
    assert rt.cancel(done) is False
    assert rt.cancel("run_0000000000_000000000000") is False
    assert rt.cancel(waiting) is False
    assert rt.journal.position() == end


def test_a_suspended_run_is_cancelled_and_its_interrupted_step_never_runs(
    durable_url: str,
) -> None:
    """R3/E5: a run suspended by close (its step still in flight) is cancelled by a later
    runtime: the step that was in flight is not run again, and the run ends cancelled."""
    import threading

    release = threading.Event()
    started = threading.Event()

    def slow(x: object) -> object:
        started.set()
        release.wait(WAIT)
        return x

    with journaled.open(durable_url) as first:
        first.register_tool("slow", slow)
        handle = first.start(Plan(goal="g", steps=[Step("s", tool="slow", input=1)]))
        assert started.wait(WAIT)
        first.close(drain=0.1)
        release.set()
    run_id = handle.run_id
    calls: list[object] = []
    with journaled.open(durable_url) as second:
        second.register_tool("slow", calls.append)
        assert second.runs.summary(run_id).status == "suspended"
        assert second.cancel(run_id) is True
        assert second.runs.summary(run_id).status == "cancelled"
        assert calls == []


_CRASH = textwrap.dedent(
    """
    import sys, threading
    import journaled
    from journaled import Plan, Step

    url, marker = sys.argv[1], sys.argv[2]
    rt = journaled.open(url)
    def hang(x):
        open(marker, "w").close()
        threading.Event().wait()
    rt.register_tool("hang", hang)
    rt.execute(Plan(goal="g", steps=[Step("h", tool="hang", input=1)]))
    """
)


def test_a_run_left_by_a_killed_process_is_cancelled_without_rerunning_its_step(
    durable_url: str, tmp_path: Path
) -> None:
    """R4/E5: a run whose process was killed mid-step (SIGKILL) is cancelled by another
    process: the step in flight is not run again (its start was journaled once), and the run
    ends cancelled."""
    marker = tmp_path / "entered"
    proc = subprocess.Popen([sys.executable, "-c", _CRASH, durable_url, str(marker)])
    try:
        wait_for(marker.exists, WAIT)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(WAIT)
    calls: list[object] = []
    with journaled.open(durable_url) as rt:
        rt.register_tool("hang", calls.append)
        (run_id,) = rt.runs.list()
        assert rt.cancel(run_id) is True
        assert rt.runs.summary(run_id).status == "cancelled"
        starts = [e for e in rt.runs.history(run_id) if isinstance(e.data, StepStarted)]
        assert len(starts) == 1
    assert calls == []


def test_a_run_executing_in_another_live_process_is_not_cancelled_from_here(
    durable_url: str, tmp_path: Path
) -> None:
    """R8/E5: a run another live process executes is not taken over by a cancel: False, and
    nothing is appended (that process's own ``rt.cancel`` cancels it)."""
    marker = tmp_path / "entered"
    proc = subprocess.Popen([sys.executable, "-c", _CRASH, durable_url, str(marker)])
    try:
        wait_for(marker.exists, WAIT)
        with journaled.open(durable_url) as rt:
            (run_id,) = rt.runs.list()
            end = rt.journal.position()
            assert rt.cancel(run_id) is False
            assert rt.journal.position() == end
            assert rt.runs.summary(run_id).status == "running"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(WAIT)


def test_a_closed_runtime_cancels_nothing_at_rest(durable_url: str) -> None:
    """R3/E5: after close, ``rt.cancel`` of a waiting run is False and appends nothing; the run
    stays waiting, and a new runtime can still answer it."""
    with journaled.open(durable_url) as rt:
        _register(rt)
        waiting = rt.execute(Plan(goal="g", steps=[Step("q", agent="ask")])).run_id
        rt.close()
        assert rt.cancel(waiting) is False
    with journaled.open(durable_url) as again:
        _register(again)
        assert again.runs.summary(waiting).status == "waiting_for_input"
        assert again.runs.resume(waiting, answers={"q": "eu"}).ok


def test_a_purged_waiting_run_is_not_cancelled(rt: journaled.Runtime) -> None:
    """R2/E5: a waiting run whose content was purged is not taken up by a cancel: False, and
    nothing is appended (it cannot resume either)."""
    waiting = rt.execute(Plan(goal="g", steps=[Step("q", agent="ask")])).run_id
    assert rt.runs.purge(waiting, "no longer needed")
    end = rt.journal.position()
    assert rt.cancel(waiting) is False
    assert rt.journal.position() == end


def test_a_run_another_runtime_of_this_process_executes_is_not_cancelled_from_here(
    durable_url: str,
) -> None:
    """R8/E5: a runtime's cancel of a run a second runtime of the same process executes is False
    and appends nothing; the executing runtime's own cancel then cancels it."""
    import threading

    entered, release = threading.Event(), threading.Event()

    def hold(x: object) -> object:
        entered.set()
        release.wait(WAIT)
        return x

    with journaled.open(durable_url) as first, journaled.open(durable_url) as second:
        first.register_tool("hold", hold)
        handle = first.start(Plan(goal="g", steps=[Step("h", tool="hold", input=1)]))
        assert entered.wait(WAIT)
        end = second.journal.position()
        try:
            assert second.cancel(handle.run_id) is False
            assert second.journal.position() == end
            assert first.cancel(handle.run_id) is True
        finally:
            release.set()
        assert handle.result(WAIT).plan.steps[0].status == "succeeded"  # its work is kept (E5)


def _plan_asking(goal: str, observations: object, clarifications: object) -> Plan:
    return Plan(goal=goal, steps=[Step("q", agent="ask")])


def _plan_echo(goal: str, observations: object, clarifications: object) -> Plan:
    return Plan(goal=goal, steps=[Step("e", tool="echo", input=1)])


def test_an_orchestration_waiting_for_approval_is_cancelled(rt: journaled.Runtime) -> None:
    """E5/O3: cancel of an orchestration waiting for approval ends it ``failed`` with a summary
    naming the cancel; no pass starts, and an approving resume is refused."""
    waiting = rt.orchestrate("g", _plan_echo, require_approval=True)
    assert waiting.status == "waiting_for_approval"
    assert rt.cancel(waiting.run_id) is True
    summary = rt.runs.summary(waiting.run_id)
    assert summary.status == "failed"
    assert summary.pass_no == 0 or summary.pass_no is None
    assert "cancelled while it was waiting_for_approval" in rt.runs.why(waiting.run_id)
    with pytest.raises(RunNotResumable, match="already finished"):
        rt.resume(waiting.run_id, approve=True, planner=_plan_echo)
    assert ran == []
    assert rt.cancel(waiting.run_id) is False


def test_an_orchestration_whose_pass_waits_is_cancelled_with_its_pass(
    rt: journaled.Runtime,
) -> None:
    """E5/E10: cancel of an orchestration whose pass run waits for an answer cancels that pass
    run (its waiting step skipped) and ends the orchestration ``failed``."""
    waiting = rt.orchestrate("g", _plan_asking)
    assert waiting.status == "waiting_for_clarification", waiting
    pass_run = rt.runs.summary(waiting.run_id).current_run
    assert pass_run is not None
    assert rt.cancel(waiting.run_id) is True
    assert rt.runs.summary(pass_run).status == "cancelled"
    assert rt.runs.summary(waiting.run_id).status == "failed"


def test_a_finished_orchestration_is_not_cancelled(rt: journaled.Runtime) -> None:
    """E5: a completed orchestration is not cancelled: False, nothing appended."""
    done = rt.orchestrate("g", _plan_echo)
    assert done.status == "completed", done
    end = rt.journal.position()
    assert rt.cancel(done.run_id) is False
    assert rt.journal.position() == end
