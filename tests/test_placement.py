"""The placement seam behind the step worker, without Ray (S1, ADR 0045)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import journaled
from journaled import Plan, Step
from journaled.actors.loop import StepToken
from journaled.actors.steps import run_agent, run_callable
from journaled.events.plans import Observation
from journaled.events.run_messages import RunStep


class Recording:
    """A placement that runs each step in the calling thread and notes what it was given."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Mapping[str, Any] | None, bool]] = []
        self.lock = threading.Lock()

    def run_step(
        self,
        msg: RunStep,
        fn: Callable[..., Any],
        *,
        with_ctx: bool,
        resources: Mapping[str, Any] | None,
        token: StepToken,
    ) -> tuple[Observation, str | None]:
        with self.lock:
            self.seen.append((msg.step.id, resources, with_ctx))
        if msg.step.agent is not None:
            return run_agent(msg.step, fn, msg)
        return run_callable(msg.step.kind or "tool", msg.step, fn), None


class Broken:
    """A placement that fails before running anything."""

    def run_step(self, msg: RunStep, fn: Callable[..., Any], **kwargs: Any) -> Any:
        raise ConnectionError("the cluster went away")


def test_every_step_kind_goes_through_the_placement_with_its_resources(sqlite_url: str) -> None:
    """S1: with steps=<placement>, skills, tools and agents are handed to it with their
    registration's resources; the executor journals their results as for local steps."""
    placement = Recording()
    with journaled.open(sqlite_url, steps=placement) as rt:
        rt.register_tool("t", lambda value: value * 2, resources={"num_cpus": 2})
        rt.register_skill("s", lambda value: "said")
        rt.register_agent(
            "a", lambda step, ctx: journaled.AgentResult(ok=True, output="acted", calls_used=1)
        )
        result = rt.execute(
            Plan(
                goal="g",
                steps=[Step("x", tool="t", input=2), Step("y", skill="s"), Step("z", agent="a")],
            )
        )
    assert result.ok, result.observations
    assert sorted(placement.seen, key=lambda seen: seen[0]) == [
        ("x", {"num_cpus": 2}, False),
        ("y", None, False),
        ("z", None, False),
    ]
    assert {o.step_id: o.output for o in result.observations} == {
        "x": 4,
        "y": "said",
        "z": "acted",
    }
    assert result.calls_used == 2


def test_a_placement_that_raises_fails_the_step_not_the_run(sqlite_url: str) -> None:
    """S1, E11: a placement raising fails that step with an error naming it; the run ends."""
    with journaled.open(sqlite_url, steps=Broken()) as rt:
        rt.register_tool("t", lambda value: value)
        result = rt.execute(Plan(goal="g", steps=[Step("x", tool="t")]), step_timeout=60)
    assert not result.ok
    assert result.observations[0].error == (
        "step 'x' could not be placed: ConnectionError: the cluster went away"
    )
