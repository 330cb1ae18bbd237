"""The placement seam behind the step worker, without Ray (S1, ADR 0045)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import journaled
from journaled import Plan, Retry, Step
from journaled.actors.loop import StepToken
from journaled.actors.placement import Placed
from journaled.actors.steps import run_agent, run_callable
from journaled.events.plans import Observation
from journaled.events.run_messages import RunStep
from journaled.events.runs import StepFailed, StepRetrying


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


class Refusing:
    """A placement that refuses every step before running any of its code."""

    def __init__(self) -> None:
        self.calls = 0

    def run_step(self, msg: RunStep, fn: Callable[..., Any], **kwargs: Any) -> Placed:
        self.calls += 1
        obs = Observation(step_id=msg.step.id, skill=msg.step.skill, ok=False, error="refused")
        return Placed(obs, ran=False)


def test_a_step_its_placement_refused_is_charged_nothing_and_not_retried(sqlite_url: str) -> None:
    """R6, E8, S1: a skill step its placement says did not run (``Placed(ran=False)``) is
    journaled failed, charged 0 and not retried under its policy; a placement answering a plain
    ``(observation, question)`` is taken as having run, and its skill is charged its call."""
    refusing = Refusing()
    with journaled.open(sqlite_url, steps=refusing) as rt:
        rt.register_skill("s", lambda value: "said", retry=Retry(attempts=3, backoff=0.01))
        result = rt.execute(Plan(goal="g", steps=[Step("x", skill="s")]), call_budget=5)
        events = [e.data for e in rt.runs.history(result.run_id)]
    assert result.observations[0].error == "refused"
    assert result.calls_used == 0
    assert refusing.calls == 1
    assert not [e for e in events if isinstance(e, StepRetrying)]
    assert [e.charged for e in events if isinstance(e, StepFailed)] == [0]
    with journaled.open("memory://", steps=Recording()) as rt:
        rt.register_skill("s", lambda value: "said")
        ran = rt.execute(Plan(goal="g", steps=[Step("y", skill="s")]), call_budget=5)
    assert ran.ok
    assert ran.calls_used == 1
