"""Pure rules over plans: validation (E1), waves (E2) and step cost (E6).

These are the single source of truth for the executor, the orchestrator's estimate and resume, so
they cannot disagree about what a step costs or which wave it is in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Sequence

from journaled.events.errors import PlanRejected
from journaled.events.inputs import INT64_MAX, text_problem
from journaled.events.plans import Limits, Observation, Plan, Step
from journaled.events.redact import find_secrets

_MAX_NAME_BYTES = 1024
"""Largest step id or skill/tool/agent name: names are shown, compared and journaled often."""

Reserve = Callable[[Step, float], float]
"""What an agent step reserves, given the model calls still available when it is reached."""


def validate(
    plan: Plan,
    *,
    skills: Container[str],
    tools: Container[str],
    agents: Container[str],
    agents_enabled: bool,
) -> None:
    """Reject a malformed plan before anything runs (E1).

    Raises:
        PlanRejected: naming the step and the reason.
    """
    if not isinstance(plan, Plan):
        raise PlanRejected(None, f"expected a journaled.Plan, got {type(plan).__name__}")
    problem = text_problem(plan.goal)
    if problem:
        raise PlanRejected(None, f"the plan's goal {problem}")
    if plan.id is not None and not isinstance(plan.id, str):
        # Journaled as it is, any other type would make the journal unreadable.
        raise PlanRejected(
            None,
            "the plan's id must be a string (empty or None: one is assigned), got "
            f"{type(plan.id).__name__}",
        )
    problem = text_problem(plan.id, limit=_MAX_NAME_BYTES) if plan.id else None
    if problem:
        raise PlanRejected(None, f"the plan's id {problem}")
    if not isinstance(plan.steps, list | tuple) or not plan.steps:
        raise PlanRejected(None, "the plan has no steps")
    seen: set[str] = set()
    for index, step in enumerate(plan.steps):
        if not isinstance(step, Step):
            raise PlanRejected(None, f"step #{index} is a {type(step).__name__}, not a Step")
        if not isinstance(step.id, str) or not step.id:
            raise PlanRejected(None, f"step #{index} has no id")
        problem = text_problem(step.id, limit=_MAX_NAME_BYTES)
        if problem:
            raise PlanRejected(None, f"the id of step #{index} {problem}")
        if step.id in seen:
            raise PlanRejected(step.id, "the id is used by more than one step")
        seen.add(step.id)
        problem = step_problem(step)
        if problem:
            raise PlanRejected(step.id, problem)
    for step in plan.steps:
        for dep in step.depends_on:
            if dep not in seen:
                raise PlanRejected(step.id, f"it depends on unknown step {dep!r}")
            if dep == step.id:
                raise PlanRejected(step.id, "it depends on itself")
    _refuse_secret_ids(plan)
    cycle = find_cycle(plan.steps)
    if cycle:
        raise PlanRejected(cycle[0], f"dependency cycle {' -> '.join(cycle)}")
    for step in plan.steps:
        if step.skill is not None and step.skill not in skills:
            raise PlanRejected(step.id, f"skill {step.skill!r} is not registered")
        if step.tool is not None and step.tool not in tools:
            raise PlanRejected(step.id, f"tool {step.tool!r} is not registered")
        if step.agent is not None:
            if not agents_enabled:
                raise PlanRejected(
                    step.id,
                    f"agent steps are disabled (agent {step.agent!r}); "
                    "open the runtime with agents=True",
                )
            if step.agent not in agents:
                raise PlanRejected(step.id, f"agent {step.agent!r} is not registered")


def step_problem(step: Step) -> str | None:
    """Return why a step's kind, name or dependencies cannot be journaled, or None (E1).

    The skill, tool or agent name must be one non-empty text (any other value would make the
    event that holds the plan undecodable); ``depends_on`` a list of step ids. Whether those
    ids name steps of the plan is the plan's to check.
    """
    named = [k for k in ("skill", "tool", "agent") if getattr(step, k) is not None]
    if len(named) != 1:
        what = "names none of" if not named else f"names {' and '.join(named)}; pick one of"
        return f"the step {what} skill, tool, agent"
    name = step.target
    if not isinstance(name, str) or not name:
        return f"the {named[0]} name must be a non-empty string"
    problem = text_problem(name, limit=_MAX_NAME_BYTES)
    if problem:
        return f"the {named[0]} name {problem}"
    if not isinstance(step.depends_on, list | tuple) or not all(
        isinstance(d, str) for d in step.depends_on
    ):
        return "depends_on must be a list of step ids"
    return None


def _refuse_secret_ids(plan: Plan) -> None:
    """Refuse a plan or step id that holds a secret (M9), without quoting it.

    Ids are names: journaled as given in every step's events, shown and compared, so they are
    never redacted (as a fact's conflict key is not). All ids are scanned as one text first,
    a line each, which costs about what one id does; only then one by one, to name the step.
    """
    if not find_secrets("\n".join([plan.id or "", *(s.id for s in plan.steps)])):
        return
    kinds = find_secrets(plan.id or "")
    if kinds:
        raise PlanRejected(None, f"the plan's id holds a secret ({', '.join(kinds)}): {_NAMES}")
    for index, step in enumerate(plan.steps):
        kinds = find_secrets(step.id)
        if kinds:
            raise PlanRejected(
                None, f"the id of step #{index} holds a secret ({', '.join(kinds)}): {_NAMES}"
            )


_NAMES = "ids are journaled as they are, never redacted; name steps after what they do"


def find_cycle(steps: Sequence[Step]) -> list[str]:
    """Return one dependency cycle as a list of ids (first repeated at the end), or [].

    Iterative, so a plan of thousands of steps listed in any order cannot exhaust the stack.
    """
    deps = {s.id: list(s.depends_on) for s in steps}
    colour: dict[str, int] = {}
    for root in list(deps):
        if root in colour:
            continue
        colour[root] = 1
        path = [root]
        stack = [iter(deps[root])]
        while stack:
            dep = next(stack[-1], None)
            if dep is None:
                colour[path.pop()] = 2
                stack.pop()
                continue
            if colour.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in colour and dep in deps:
                colour[dep] = 1
                path.append(dep)
                stack.append(iter(deps[dep]))
    return []


def waves(steps: Sequence[Step]) -> list[list[Step]]:
    """Split a validated plan into dependency waves (topological layers), in plan order (E2).

    Linear in steps plus dependencies whatever the order steps are listed in (Kahn's algorithm):
    each dependency list is read once, and each edge is followed once.
    """
    dependents: dict[str, list[str]] = {s.id: [] for s in steps}
    unmet: dict[str, int] = {}
    for step in steps:
        deps = set(step.depends_on)
        for dep in deps:
            if dep not in dependents:
                raise ValueError("waves() needs an acyclic plan with known dependencies")
            dependents[dep].append(step.id)
        unmet[step.id] = len(deps)
    level = {sid: 0 for sid, n in unmet.items() if n == 0}
    ready = list(level)
    for sid in ready:  # grows while it is walked: a queue in one list
        for child in dependents[sid]:
            level[child] = max(level.get(child, 0), level[sid] + 1)
            unmet[child] -= 1
            if not unmet[child]:
                ready.append(child)
    if len(ready) != len(unmet):
        raise ValueError("waves() needs an acyclic plan with known dependencies")
    out: list[list[Step]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for step in steps:
        out[level[step.id]].append(step)
    return out


class ReserveFailed(ValueError):
    """A ``reserve`` policy raised, or answered something that is not a number (E6, R6)."""


def reservation(step: Step, remaining: float, reserve: Reserve | None) -> int | None:
    """Return an agent step's reservation: ``max(0, trunc(reserve(step, remaining)))`` (E6).

    An answer of infinity reserves all that remains — and with no call budget (``remaining`` is
    infinite) the reservation is unbounded: None. An agent with an unbounded reservation is
    charged what it reports (R6).

    Raises:
        ReserveFailed: the policy raised, or answered NaN, a non-number or a finite number
            above what a journal holds (2**63 - 1).
    """
    if reserve is None:
        return 0
    try:
        answer = reserve(step, remaining)
    except Exception as exc:  # user code: the caller fails the step, never the run
        raise ReserveFailed(
            f"reserve failed for agent {step.agent!r}: {type(exc).__name__}: {exc}"
        ) from exc
    if isinstance(answer, bool) or not isinstance(answer, int | float) or math.isnan(answer):
        raise ReserveFailed(
            f"reserve failed for agent {step.agent!r}: it answered {answer!r}, not a number"
        )
    if math.isinf(answer):
        if answer < 0:
            return 0
        if math.isinf(remaining):
            return None
        return max(0, int(remaining))
    reserved = max(0, int(answer))
    if reserved > INT64_MAX:
        raise ReserveFailed(
            f"reserve failed for agent {step.agent!r}: it answered {answer!r}, more calls than "
            f"a journal holds (at most {INT64_MAX})"
        )
    return reserved


def step_calls(step: Step, remaining: float, reserve: Reserve | None) -> int:
    """Return the model calls one step needs: skill 1, tool 0, agent its reservation (E6).

    An unbounded reservation (no budget) costs 0 here: nothing gates it.

    Raises:
        ReserveFailed: the reserve policy raised or answered a non-number.
    """
    if step.skill is not None:
        return 1
    if step.agent is not None:
        return reservation(step, remaining, reserve) or 0
    return 0


def fold_calls(
    steps: Sequence[Step], budget_remaining: float | None, reserve: Reserve | None
) -> int:
    """Cost a list of steps sequentially against a declining remainder, in list order (E6).

    A step whose ``reserve`` fails costs 0 here: the executor fails that step when it reaches
    it (E11), so an estimate never raises out of an orchestration.
    """
    used = 0
    for step in steps:
        remaining = float("inf") if budget_remaining is None else budget_remaining - used
        try:
            used += step_calls(step, remaining, reserve)
        except ReserveFailed:
            continue
    return used


def cap_key(step: Step) -> tuple[str, str]:
    """Return what a per-tool, per-skill or per-agent cap counts a step under (E4)."""
    return (step.kind or "tool", step.target)


def step_cap(limits: Limits, step: Step) -> int | None:
    """Return the cap on concurrent calls of the step's tool, skill or agent, if any (E4)."""
    if step.tool is not None:
        return limits.per_tool.get(step.tool)
    if step.skill is not None:
        return limits.per_skill.get(step.skill)
    if step.agent is not None:
        return limits.per_agent.get(step.agent)
    return None


def cancelled_observation(step: Step, reason: str, *, agent: bool) -> Observation:
    """Return the observation of a step a cancel kept from running or finishing (E5)."""
    if agent:
        return Observation(
            step_id=step.id, agent=step.agent, ok=False, code="cancelled", error=reason
        )
    return Observation(step_id=step.id, ok=False, code="cancelled", error=reason)
