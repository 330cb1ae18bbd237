"""Forks of runs: which steps a replacement re-pends, lineage and comparison (SPEC F1-F3).

Pure rules over plans and folded states; the fork itself is decided in ``actors.runs``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from journaled.events.base import Unpackable
from journaled.events.inputs import same_value
from journaled.events.plans import Observation, Step, StepStatus
from journaled.events.run_state import RunFold


class Lineage(Unpackable, frozen=True, kw_only=True):
    """One run of a chain of forks: the run, the run it was forked from and where (F2)."""

    run_id: str
    forked_from: str | None = None
    at: int | None = None
    """The journal position the source was read at; None for the root."""


class StepComparison(msgspec.Struct, frozen=True, kw_only=True):
    """One step id in two runs: its status and output in each (None: not in that run) (F3)."""

    step_id: str
    status_a: StepStatus | None
    status_b: StepStatus | None
    output_a: Any = None
    output_b: Any = None
    error_a: str | None = None
    error_b: str | None = None
    differs: bool = False


class RunComparison(msgspec.Struct, frozen=True, kw_only=True):
    """Two runs side by side, step by step (F3)."""

    run_a: str
    run_b: str
    steps: list[StepComparison]
    calls_used_a: int
    calls_used_b: int
    only_in_a: list[str]
    only_in_b: list[str]

    @property
    def differing(self) -> list[str]:
        """Return the ids of the steps that differ (status, output or error)."""
        return [s.step_id for s in self.steps if s.differs]


def downstream(steps: Sequence[Step], roots: Iterable[str]) -> list[str]:
    """Return ``roots`` and every step depending on one of them, transitively, in plan order."""
    reached = set(roots)
    grew = True
    while grew:
        grew = False
        for step in steps:
            if step.id not in reached and any(d in reached for d in step.depends_on):
                reached.add(step.id)
                grew = True
    return [s.id for s in steps if s.id in reached]


def _last_observations(state: RunFold) -> dict[str, Observation]:
    last: dict[str, Observation] = {}
    for obs in state.observations:
        last[obs.step_id] = obs
    return last


def compare_states(run_a: str, a: RunFold, run_b: str, b: RunFold) -> RunComparison:
    """Compare two runs' latest states step by step: status, output and error (F3)."""
    obs_a, obs_b = _last_observations(a), _last_observations(b)
    order = list(a.order) + [i for i in b.order if i not in a.status]
    rows = []
    for step_id in order:
        sa, sb = a.status.get(step_id), b.status.get(step_id)
        oa, ob = obs_a.get(step_id), obs_b.get(step_id)
        out_a, out_b = (oa.output if oa else None), (ob.output if ob else None)
        err_a, err_b = (oa.error if oa else None), (ob.error if ob else None)
        rows.append(
            StepComparison(
                step_id=step_id,
                status_a=sa,
                status_b=sb,
                output_a=out_a,
                output_b=out_b,
                error_a=err_a,
                error_b=err_b,
                differs=(sa, err_a) != (sb, err_b) or not same_value(out_a, out_b),
            )
        )
    return RunComparison(
        run_a=run_a,
        run_b=run_b,
        steps=rows,
        calls_used_a=a.calls_used,
        calls_used_b=b.calls_used,
        only_in_a=[i for i in a.order if i not in b.status],
        only_in_b=[i for i in b.order if i not in a.status],
    )
