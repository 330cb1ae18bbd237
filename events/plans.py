"""Plans, steps, observations and results: the value types of execution (SPEC section 2).

``Step`` takes its id positionally (``Step("a", tool="fetch")``) as SPEC section 5 shows; every
other field is a keyword. Outputs, agent data and artifacts are stored in the journal, so they are
kept as msgspec builtins (str, int, float, bool, None, lists and dicts keyed by str, int or
float: what a JSON object can carry as its keys, ADR 0098).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import msgspec

StepStatus = Literal["pending", "running", "succeeded", "failed", "skipped"]
StepKind = Literal["skill", "tool", "agent"]
ObservationCode = Literal[
    "cancelled",
    "agent-failed",
    "agent-timeout",
    "agent-call-budget",
    "agent-tool-budget",
    "finding-contract",
    "agent-not-enabled",
    "agent-waiting",
]
OBSERVATION_CODES: frozenset[str] = frozenset(ObservationCode.__args__)  # type: ignore[attr-defined]

SKIPPED_DEPENDENCY = "skipped: a dependency failed"
CANCELLED_BRANCH = "cancelled: an agent branch was cancelled"
CANCELLED_ABORT = "cancelled: the run was aborted"


class Step(msgspec.Struct, frozen=True):
    """One step of a plan: exactly one of ``skill``, ``tool`` or ``agent``."""

    id: str
    skill: str | None = None
    tool: str | None = None
    agent: str | None = None
    input: Any = None
    """Handed to the skill/tool function; available to an agent as ``step.input``."""
    depends_on: Sequence[str] = ()
    status: StepStatus = "pending"

    @property
    def kind(self) -> StepKind | None:
        """Return which kind of step this is, or None when it names none or several."""
        skill, tool, agent = self.skill, self.tool, self.agent
        if skill is not None:
            return "skill" if tool is None and agent is None else None
        if tool is not None:
            return "tool" if agent is None else None
        return "agent" if agent is not None else None

    @property
    def target(self) -> str:
        """Return the skill, tool or agent name the step uses."""
        return self.skill or self.tool or self.agent or ""


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """A goal and the DAG of steps that reaches it."""

    goal: str
    steps: Sequence[Step]
    id: str = ""
    """Assigned when the plan is executed, if empty."""


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Caps on how many steps using one tool, skill or agent run at once (E3)."""

    per_tool: dict[str, int] = {}
    per_skill: dict[str, int] = {}
    per_agent: dict[str, int] = {}


class Retry(msgspec.Struct, frozen=True, kw_only=True):
    """How often a failed step is tried again, and how long to wait in between (S2).

    Registered with a skill, tool or agent (``register_tool(name, fn, retry=Retry(...))``), it
    applies to every placement. An attempt that fails — its function raised, its deadline passed,
    its worker process was lost — is journaled ``run.step-retrying`` and started again after
    ``backoff * multiplier ** (failures - 1)`` seconds (at most :attr:`cap`), until ``attempts``
    attempts of the step have failed (counted across resumes; an attempt cut short by a crash
    or by the runtime closing is not a failure). A waiting agent, a cancelled run or a missing
    function is never retried.
    """

    attempts: int = 3
    """Failed attempts in all before the step fails, the first included (1: no retry)."""
    backoff: float = 0.0
    """Seconds to wait before the second attempt."""
    multiplier: float = 2.0
    """Factor (at least 1) by which the wait grows at each further attempt."""
    max_backoff: float | None = None
    """The longest wait between two attempts, in seconds, at least ``backoff``; None: 60 s, or
    ``backoff`` when ``backoff`` is larger."""

    @property
    def cap(self) -> float:
        """Return the longest wait between two attempts, in seconds (``max_backoff`` resolved)."""
        if self.max_backoff is None:
            return float(max(_DEFAULT_MAX_BACKOFF, self.backoff))
        return float(self.max_backoff)

    def delay(self, failures: int) -> float:
        """Return the seconds to wait after the step's ``failures``-th failed attempt (from 1).

        The wait grows by ``multiplier`` per failure up to :attr:`cap` and stays there: the
        power is computed only while it is below the cap, so no count of failures overflows.
        """
        cap = self.cap
        backoff = float(self.backoff)
        steps = max(0, failures - 1)
        if backoff <= 0.0 or cap <= 0.0:
            return 0.0
        if backoff >= cap:
            return cap
        if steps == 0 or self.multiplier <= 1.0:
            return backoff
        if steps * math.log(self.multiplier) >= math.log(cap / backoff):
            return cap
        return min(cap, backoff * self.multiplier**steps)


_DEFAULT_MAX_BACKOFF = 60.0
"""Seconds: :attr:`Retry.cap` when ``max_backoff`` is None and ``backoff`` is not larger."""


def retry_problem(retry: object) -> str | None:
    """Say what is wrong with a retry policy, or None when it is usable."""
    if not isinstance(retry, Retry):
        return f"must be a journaled.Retry, got {type(retry).__name__}"
    if isinstance(retry.attempts, bool) or not isinstance(retry.attempts, int):
        return f"attempts must be an int, got {retry.attempts!r}"
    if not 1 <= retry.attempts <= 1000:
        return f"attempts must be between 1 and 1000, got {retry.attempts}"
    for name in ("backoff", "multiplier", "max_backoff"):
        value = getattr(retry, name)
        if name == "max_backoff" and value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0 <= value < float("inf")
        ):
            return f"{name} must be a non-negative finite number, got {value!r}"
    if retry.multiplier < 1:
        return (
            f"multiplier must be at least 1 (below 1 each wait would be shorter than the one "
            f"before), got {retry.multiplier!r}"
        )
    if retry.max_backoff is not None and retry.max_backoff < retry.backoff:
        return (
            f"max_backoff must be at least backoff ({retry.backoff!r}s), got "
            f"{retry.max_backoff!r}: raise it, or leave it None for max(60, backoff)"
        )
    return None


class Observation(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What one execution of a step produced (or why it did not run)."""

    step_id: str
    ok: bool
    skill: str | None = None
    tool: str | None = None
    agent: str | None = None
    agent_task_id: str | None = None
    """For an agent step that ran a child plan: the child run's id."""
    output: Any = None
    error: str | None = None
    code: ObservationCode | None = None
    data: Any = None
    """Agent steps only, bounded."""
    artifacts: tuple[Any, ...] = ()
    """Agent steps only."""
    calls_used: int | None = None
    """Agent steps only: model calls the agent reports it spent."""


class AgentResult(msgspec.Struct, frozen=True, kw_only=True):
    """What an agent function returns; it becomes the step's observation."""

    ok: bool = True
    output: Any = None
    error: str | None = None
    code: ObservationCode | None = None
    calls_used: int | None = None
    data: Any = None
    artifacts: Sequence[Any] = ()


class ExecuteResult(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of executing (or resuming) a plan (E13)."""

    run_id: str
    ok: bool
    """True only when every step succeeded and the run neither stopped for budget nor waits."""
    plan: Plan
    """The plan with each step's status."""
    observations: list[Observation]
    calls_used: int
    stopped_for_budget: bool = False
    waiting: list[str] = []
    """Steps waiting for an answer; non-empty means the run is resumable, not failed."""
    suspended: bool = False
    """True when the runtime closed under the run: it stopped and can be resumed (R3)."""


RunState = ExecuteResult
"""What ``rt.runs.at(run_id, position)`` returns (SPEC section 5, O7): a run as it was at a
position, in the shape of an :class:`ExecuteResult` (``.plan .observations .calls_used
.waiting``). One type under two names, so a state and a result compare and print alike
(ADR 0099)."""


class StatusChange(msgspec.Struct, frozen=True, kw_only=True):
    """One step whose status differs between two positions."""

    step_id: str
    before: StepStatus
    after: StepStatus


class RunDiff(msgspec.Struct, frozen=True, kw_only=True):
    """What changed in a run between two journal positions (O7)."""

    run_id: str
    a: int
    b: int
    status_changes: list[StatusChange]
    new_observations: list[Observation]
    calls_used_before: int
    calls_used_after: int
    waiting_before: list[str]
    waiting_after: list[str]


_SLICE = 256
"""Steps compared at once by :func:`_unequal_places` before looking at each one."""


def _unequal_places(a: Sequence[Step], b: Sequence[Step]) -> list[int]:
    """Return the places where two equally long step lists hold unequal steps."""
    places: list[int] = []
    for low in range(0, len(a), _SLICE):
        high = min(low + _SLICE, len(a))
        if a[low:high] != b[low:high]:
            places += [n for n in range(low, high) if a[n] != b[n]]
    return places


def diff_results(
    run_id: str, a: int, b: int, before: ExecuteResult, after: ExecuteResult
) -> RunDiff:
    """Compare a run's states at positions a and b.

    Within one run observations only grow between them; across an orchestration's passes
    (``before`` and ``after`` of two pass runs) every observation of ``after`` is new, and the
    statuses compared are those of ``after``'s steps (the new pass's plan).
    """
    steps_a, steps_b = before.plan.steps, after.plan.steps
    candidates: Iterable[Step]
    if before.run_id == after.run_id and len(steps_a) == len(steps_b):
        # One run's plan: the same steps in the same order, mostly the very same objects (ADR
        # 0034). Equal slices are skipped whole (list equality is done in C, identity first).
        places = _unequal_places(steps_a, steps_b)
        old = {steps_a[n].id: steps_a[n].status for n in places}
        candidates = [steps_b[n] for n in places]
    else:
        old = {s.id: s.status for s in steps_a}
        candidates = steps_b
    changes = [
        StatusChange(step_id=s.id, before=old.get(s.id, "pending"), after=s.status)
        for s in candidates
        if old.get(s.id, "pending") != s.status
    ]
    return RunDiff(
        run_id=run_id,
        a=a,
        b=b,
        status_changes=changes,
        new_observations=list(
            after.observations[len(before.observations) :]
            if before.run_id == after.run_id
            else after.observations
        ),
        calls_used_before=before.calls_used,
        calls_used_after=after.calls_used,
        waiting_before=list(before.waiting),
        waiting_after=list(after.waiting),
    )


def map_plan(plan: Plan, f: Callable[[Any], Any]) -> Plan:
    """Return the plan with ``f`` applied to its goal and each step's input (ADR 0018)."""
    # A step kept as it is when its input comes back the same object (None, mostly): a cold
    # read of a thousand-step run's start copied every step for nothing.
    steps = [
        s if (value := f(s.input)) is s.input else msgspec.structs.replace(s, input=value)
        for s in plan.steps
    ]
    return Plan(goal=f(plan.goal), steps=steps, id=plan.id)


def map_observation(obs: Observation, f: Callable[[Any], Any]) -> Observation:
    """Return the observation with ``f`` applied to its output, error, data and artifacts."""
    return msgspec.structs.replace(
        obs,
        output=f(obs.output),
        error=f(obs.error),
        data=f(obs.data),
        artifacts=tuple(f(a) for a in obs.artifacts),
    )
