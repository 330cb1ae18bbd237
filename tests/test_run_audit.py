"""Time travel and audit of runs: diff between positions, at a time, why (O6, O7)."""

from __future__ import annotations

from typing import Any

import pytest

import journaled
from journaled import Plan, Step
from journaled.events.runs import StepSucceeded
from journaled.testing import ManualClock


def _boom(_: Any) -> Any:
    raise RuntimeError("disk full")


@pytest.fixture
def failed_run(rt: journaled.Runtime) -> str:
    """Run a plan where one step fails and its dependent is skipped."""
    rt.register_tool("ok", lambda x: x)
    rt.register_tool("boom", _boom)
    rt.register_skill("think", lambda x: "idea")
    plan = Plan(
        goal="g",
        steps=[
            Step("a", tool="ok", input=1),
            Step("b", skill="think", depends_on=["a"]),
            Step("c", tool="boom", depends_on=["b"]),
            Step("d", tool="ok", depends_on=["c"]),
        ],
    )
    return rt.execute(plan).run_id


def test_diff_between_positions(rt: journaled.Runtime, failed_run: str) -> None:
    """O7: the diff lists status changes, new observations and calls used from a to b."""
    events = rt.runs.history(failed_run)
    a = events[0].position
    b_success = next(
        e.position for e in events if isinstance(e.data, StepSucceeded) and e.data.step_id == "b"
    )
    diff = rt.runs.diff(failed_run, a, b_success)
    assert [(c.step_id, c.before, c.after) for c in diff.status_changes] == [
        ("a", "pending", "succeeded"),
        ("b", "pending", "succeeded"),
    ]
    assert [o.step_id for o in diff.new_observations] == ["a", "b"]
    assert (diff.calls_used_before, diff.calls_used_after) == (0, 1)
    whole = rt.runs.diff(failed_run, a, events[-1].position)
    assert {c.step_id: c.after for c in whole.status_changes} == {
        "a": "succeeded",
        "b": "succeeded",
        "c": "failed",
        "d": "skipped",
    }
    with pytest.raises(ValueError, match="a <= b"):
        rt.runs.diff(failed_run, 10, 2)


def test_at_time(rt: journaled.Runtime, clock: ManualClock, failed_run: str) -> None:
    """O7: a run at a time is the run after its last event recorded by then."""
    events = rt.runs.history(failed_run)
    middle = events[len(events) // 2]
    assert rt.runs.at_time(failed_run, middle.data.at) == rt.runs.at(failed_run, middle.position)
    with pytest.raises(ValueError, match="had not begun"):
        rt.runs.at_time(failed_run, events[0].data.at - 1)


def test_why_names_the_failure(rt: journaled.Runtime, failed_run: str) -> None:
    """O6: why names the failed step, its error, and the skipped dependent."""
    why = rt.runs.why(failed_run)
    assert "step 'c' failed: disk full" in why
    assert "skipped d" in why
    assert "now: step 'c' failed with 'disk full'" in why
