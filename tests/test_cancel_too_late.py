"""E5: a cancel that stops nothing does not turn a complete run into a cancelled one.

A cancel requested while the last steps run, when those steps ignore it and succeed, leaves no
step skipped or cancelled: the run's result, its ``run.finished`` event, its summary and ``why``
must all say it completed — and the request itself stays in the record.
"""

from __future__ import annotations

import threading
from typing import Any

import journaled
from journaled import Plan, Step
from journaled.events.runs import RunFinished
from journaled.testing import wait_for

WAIT = 20.0


def _held_run(rt: journaled.Runtime, plan: Plan) -> tuple[str, journaled.ExecuteResult]:
    """Start ``plan``, cancel it while its ``hold`` step runs, then let the step succeed."""
    started = threading.Event()
    release = threading.Event()

    def hold(_: Any) -> str:
        started.set()
        release.wait(WAIT)
        return "held"

    rt.register_tool("hold", hold)
    rt.register_tool("echo", lambda x: x)
    handle = rt.start(plan)
    assert started.wait(WAIT)
    assert rt.cancel(handle.run_id)
    wait_for(lambda: "run.cancel-requested" in _kinds(rt, handle.run_id), WAIT)
    release.set()
    return handle.run_id, handle.result(WAIT)


def _finished(rt: journaled.Runtime, run_id: str) -> RunFinished:
    return [e.data for e in rt.runs.history(run_id) if isinstance(e.data, RunFinished)][-1]


def _kinds(rt: journaled.Runtime, run_id: str) -> list[str]:
    return [e.kind for e in rt.runs.history(run_id)]


def test_a_cancel_that_stopped_nothing_leaves_the_run_completed(
    journal_url: str,
) -> None:
    """E5: the last step ignored the cancel and succeeded: completed everywhere it is read."""
    with journaled.open(journal_url) as rt:
        plan = Plan(goal="g", steps=[Step("a", tool="echo", input=1), Step("b", tool="hold")])
        run_id, result = _held_run(rt, plan)
        assert result.ok
        assert {o.step_id: o.ok for o in result.observations} == {"a": True, "b": True}
        state = rt.runs.state(run_id)
        assert state.run_status == "completed"
        finished = _finished(rt, run_id)
        assert finished.status == "completed"
        assert finished.ok is True
        assert rt.runs.summary(run_id).status == "completed"
        assert "cancel" not in rt.runs.why(run_id).lower().split("\n")[0]
        # The request is still in the record, for the audit.
        assert "run.cancel-requested" in _kinds(rt, run_id)
    if journal_url == "memory://":
        return  # nothing outlives the runtime
    with journaled.open(journal_url) as again:  # rebuilt from the journal alone
        assert again.runs.state(run_id).run_status == "completed"
        assert again.runs.summary(run_id).status == "completed"


def test_a_cancel_that_skipped_a_step_still_cancels(journal_url: str) -> None:
    """E5: when the cancel did stop work (a pending step skipped), the run is cancelled."""
    with journaled.open(journal_url) as rt:
        plan = Plan(
            goal="g", steps=[Step("a", tool="hold"), Step("b", tool="echo", depends_on=["a"])]
        )
        run_id, result = _held_run(rt, plan)
        assert not result.ok
        assert rt.runs.state(run_id).run_status == "cancelled"
        assert rt.runs.summary(run_id).status == "cancelled"
        finished = _finished(rt, run_id)
        assert finished.status == "cancelled"


def test_a_cancel_with_a_failed_step_is_not_completed(journal_url: str) -> None:
    """E5: a run whose other branch failed after the cancel is not called completed."""
    with journaled.open(journal_url) as rt:

        def boom(_: Any) -> str:
            raise RuntimeError("boom")

        rt.register_tool("boom", boom)
        steps = [Step("a", tool="hold"), Step("z", tool="boom")]
        run_id, result = _held_run(rt, Plan(goal="g", steps=steps))
        assert not result.ok
        assert rt.runs.state(run_id).run_status != "completed"
