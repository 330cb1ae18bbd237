"""Where a step's user code runs: the seam that lets another engine run it (S1, ADR 0045).

By default a step worker calls user code in its own thread. A runtime opened with
``steps=<a placement>`` hands each step to that placement instead: the worker still owns the
step attempt (its token, its span, its reply to the executor), the placement only runs the
function somewhere else and brings its observation back. The executor never knows the
difference, so it stays the run's single writer and every bound (batches, caps, budget, waiting,
deadlines, cancel) applies unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from journaled.actors.loop import StepToken
from journaled.events.plans import Observation
from journaled.events.run_messages import RunStep

RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory", "resources", "accelerator_type")
"""What a registration may ask of the engine that places its steps."""


class Placed(NamedTuple):
    """A step attempt's outcome as a placement tells it, and whether its code ran at all."""

    observation: Observation
    question: str | None = None
    """Set when an agent asked for input."""
    ran: bool = True
    """False: the placement refused the step before any of its code was sent to run (its
    resources no node has, a function that cannot be sent, a placement shut down): it made no
    call, so it is charged nothing and not retried, as a missing skill is (E8, R6)."""


class Placement(Protocol):
    """Runs one step attempt's user code somewhere other than the worker's thread."""

    def run_step(
        self,
        msg: RunStep,
        fn: Callable[..., Any],
        *,
        with_ctx: bool,
        resources: Mapping[str, Any] | None,
        token: StepToken,
    ) -> tuple[Observation, str | None] | Placed:
        """Run the step's function and return its observation and, if it waits, its question.

        Called from the step worker's thread; returns once the step ended, failed, was lost or
        was cancelled (``token`` is set by a cancel of the run or by the step's deadline).
        Never raises for anything user code or the engine did: that is the observation. A step
        refused before it ran is returned as ``Placed(observation, ran=False)`` (R6).
        """
        ...


def resources_problem(resources: object) -> str | None:
    """Say what is wrong with a registration's ``resources``, or None when they are usable."""
    if not isinstance(resources, Mapping):
        return f"must be a dict such as {{'num_cpus': 1}}, got {type(resources).__name__}"
    for key, value in resources.items():
        if key not in RESOURCE_KEYS:
            return f"has an unknown key {key!r}: use {', '.join(RESOURCE_KEYS)}"
        if key == "accelerator_type":
            if not isinstance(value, str) or not value:
                return f"accelerator_type must be a non-empty string, got {value!r}"
        elif key == "resources":
            if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
                return f"resources must map custom resource names to amounts, got {value!r}"
            for name, amount in value.items():
                if not _amount(amount):
                    return f"resources[{name!r}] must be a non-negative number, got {amount!r}"
        elif not _amount(value):
            return f"{key} must be a non-negative number, got {value!r}"
    return None


def _amount(value: object) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value >= 0
    )


def run_placed(
    placement: Placement,
    msg: RunStep,
    fn: Callable[..., Any],
    *,
    with_ctx: bool,
    resources: Mapping[str, Any] | None,
    token: StepToken,
) -> Placed:
    """Run a step attempt on ``placement``; a placement that raises fails the step (E11).

    The worker must answer the executor whatever happens, or the run would wait forever. A
    placement that raises may have run the step: it is charged as one that ran.
    """
    try:
        got = placement.run_step(msg, fn, with_ctx=with_ctx, resources=resources, token=token)
        if isinstance(got, Placed):
            return got
        obs, question = got
        return Placed(obs, question)
    except (Exception, SystemExit) as exc:  # SystemExit: an engine ending the waiting thread
        step = msg.step
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        error = f"step {step.id!r} could not be placed: {type(exc).__name__}: {text}"
        obs = Observation(
            step_id=step.id,
            ok=False,
            error=error[:4096],
            skill=step.skill,
            tool=step.tool,
            agent=step.agent,
            code="agent-failed" if step.agent is not None else None,
        )
        return Placed(obs)
