"""Random plans: every journaled position folds back to the executor's live state (E12-E14, O7).

Hypothesis draws a DAG of 3-10 skill, tool and agent steps (dependencies only on earlier steps),
what each step does (succeed, raise, fail, wait for an answer, report calls used), a call budget,
a parallelism bound and per-name limits. The step functions read their behaviour from
``step.input`` alone, so a run is deterministic up to the order in which concurrent steps finish.
The run is executed with ``trace=``, then resumed (answers, a larger budget) until it ends, and each
pass is checked against what ``rt.runs.at`` rebuilds from the journal.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pykka
from hypothesis import event, given, settings
from hypothesis import strategies as st

import journaled
from journaled.events.run_checkpoints import RunCheckpoints
from journaled.events.runs import (
    BudgetRaised,
    BudgetStopped,
    StepFailed,
    StepSucceeded,
    StepWaiting,
    WavePartitioned,
)
from journaled.testing import ManualClock

KINDS = ("skill", "tool", "agent")
NAMES = tuple(f"{kind}-{n}" for kind in KINDS for n in (0, 1))
NOTES = {"wave-partition", "batch", "budget-stop", "plan-end"}
RAISED_BUDGET = 1000
ACTOR_STOP_SECONDS = 10.0
CLOSE_SECONDS = 3.0
CALLABLE_OUTCOMES = ("ok", "raise")
AGENT_OUTCOMES = ("ok", "raise", "fail", "wait")

Trace = list[tuple[int, journaled.ExecuteResult]]
Note = tuple[str, list[journaled.Observation], int, list[str]]


@dataclass(frozen=True)
class StepSpec:
    """One generated step: its kind, name, dependencies (earlier step indices) and behaviour."""

    kind: str
    target: str
    """Two names of each kind, so per-name limits matter (E3)."""
    deps: tuple[int, ...]
    outcome: str
    """``ok`` or ``raise`` for every kind; agents also ``fail`` (ok=False) and ``wait``."""
    calls: int | None
    """Agents: the ``calls_used`` they report (None: they are charged their reservation)."""
    reserve: int
    """Agents: their reservation (E6)."""


@dataclass(frozen=True)
class Case:
    """A generated plan with its execution options."""

    steps: tuple[StepSpec, ...]
    call_budget: int | None
    max_parallel_steps: int
    limits: journaled.Limits | None


@st.composite
def step_specs(draw: st.DrawFn, index: int) -> StepSpec:
    """Draw step number ``index``: it depends only on earlier steps, so the plan is a DAG."""
    kind = draw(st.sampled_from(KINDS))
    target = f"{kind}-{draw(st.integers(0, 1))}"
    deps = draw(st.sets(st.integers(0, index - 1), max_size=3)) if index else set()
    is_agent = kind == "agent"
    outcome = draw(st.sampled_from(AGENT_OUTCOMES if is_agent else CALLABLE_OUTCOMES))
    calls = draw(st.none() | st.integers(0, 3)) if is_agent else None
    reserve = draw(st.integers(0, 2)) if is_agent else 0
    return StepSpec(kind, target, tuple(sorted(deps)), outcome, calls, reserve)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """Draw 3-10 steps, a budget (None or small), max_parallel_steps (1-3) and maybe limits."""
    size = draw(st.integers(3, 10))
    steps = tuple(draw(step_specs(i)) for i in range(size))
    budget = draw(st.none() | st.integers(0, 6))
    parallel = draw(st.integers(1, 3))
    limits = None
    if draw(st.booleans()):
        caps = draw(st.dictionaries(st.sampled_from(NAMES), st.integers(1, 2), min_size=2))
        limits = journaled.Limits(
            per_skill={n: c for n, c in caps.items() if n.startswith("skill")},
            per_tool={n: c for n, c in caps.items() if n.startswith("tool")},
            per_agent={n: c for n, c in caps.items() if n.startswith("agent")},
        )
    return Case(steps, budget, parallel, limits)


def _sid(i: int) -> str:
    return f"s{i}"


def _index(step_id: str) -> int:
    return int(step_id[1:])


def _answer(step_id: str) -> str:
    return f"answer for {step_id}"


def _plan(case: Case) -> journaled.Plan:
    steps = []
    for i, spec in enumerate(case.steps):
        data = {
            "id": _sid(i),
            "target": spec.target,
            "outcome": spec.outcome,
            "calls": spec.calls,
            "reserve": spec.reserve,
        }
        steps.append(
            journaled.Step(
                _sid(i),
                skill=spec.target if spec.kind == "skill" else None,
                tool=spec.target if spec.kind == "tool" else None,
                agent=spec.target if spec.kind == "agent" else None,
                input=data,
                depends_on=[_sid(d) for d in spec.deps],
            )
        )
    return journaled.Plan(goal="random plan", steps=steps)


def _reserve(step: journaled.Step, remaining: float) -> float:
    reservation: int = step.input["reserve"]
    return reservation


@dataclass
class Recorder:
    """The step functions, driven by ``step.input``; they log each execution and concurrency."""

    executions: list[tuple[str, int]] = field(default_factory=list)
    """(step id, attempt) per execution; attempt 0 for skills and tools, which cannot see it."""
    running: Counter[str] = field(default_factory=Counter)
    peak: Counter[str] = field(default_factory=Counter)
    """Most executions at once, per name and (key ``*``) in all."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _enter(self, step_id: str, attempt: int, target: str) -> None:
        with self.lock:
            self.executions.append((step_id, attempt))
            for key in (target, "*"):
                self.running[key] += 1
                self.peak[key] = max(self.peak[key], self.running[key])

    def _leave(self, target: str) -> None:
        with self.lock:
            for key in (target, "*"):
                self.running[key] -= 1

    def callable_step(self, data: Any) -> Any:
        """A skill or tool: return or raise as told."""
        self._enter(data["id"], 0, data["target"])
        try:
            if data["outcome"] == "raise":
                raise RuntimeError(f"{data['id']} broke")
            return {"done": data["id"]}
        finally:
            self._leave(data["target"])

    def agent(self, step: journaled.Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        """An agent: succeed, raise, fail or wait for an answer as told."""
        data = step.input
        self._enter(ctx.step_id, ctx.attempt, data["target"])
        try:
            match data["outcome"]:
                case "raise":
                    raise RuntimeError(f"{step.id} broke")
                case "fail":
                    return journaled.AgentResult(
                        ok=False, error="gave up", calls_used=data["calls"]
                    )
                case "wait" if ctx.answer is None:
                    raise journaled.NeedsInput(f"what should {step.id} do?")
                case _:
                    output = {"done": step.id, "answer": ctx.answer}
                    return journaled.AgentResult(output=output, calls_used=data["calls"])
        finally:
            self._leave(data["target"])


def _depths(case: Case) -> list[int]:
    """The wave (from 1) of each step (E2)."""
    depth: list[int] = []
    for spec in case.steps:
        depth.append(1 + max((depth[d] for d in spec.deps), default=0))
    return depth


def _expected_status(case: Case) -> list[str]:
    """The reference model of a run driven to its end with every answer given (E4, E10, E11)."""
    status: list[str] = []
    for spec in case.steps:
        if any(status[d] != "succeeded" for d in spec.deps):
            status.append("skipped")
        elif spec.outcome in ("raise", "fail"):
            status.append("failed")
        else:
            status.append("succeeded")
    return status


def _statuses(result: journaled.ExecuteResult) -> list[tuple[str, str]]:
    return [(s.id, s.status) for s in result.plan.steps]


def _canonical(result: journaled.ExecuteResult) -> journaled.ExecuteResult:
    """Return the result with each ``depends_on`` as a tuple.

    The live state holds tuples and the journal gives back lists; that difference is pinned by
    :func:`test_rebuilt_state_equals_the_live_state_exactly`, so the property checks the rest.
    """
    steps = [msgspec.structs.replace(s, depends_on=tuple(s.depends_on)) for s in result.plan.steps]
    plan = msgspec.structs.replace(result.plan, steps=steps)
    return msgspec.structs.replace(result, plan=plan)


def _await_actors_stopped() -> None:
    """Wait, bounded, until every actor of the closed runtime has stopped.

    ``rt.close()`` can return while executor and step actors are still stopping (pinned by
    :func:`test_close_stops_every_actor`); waiting here keeps that race out of this property
    and out of the leaked-actor check that runs when the test ends.
    """
    deadline = time.monotonic() + ACTOR_STOP_SECONDS
    while pykka.ActorRegistry.get_all():
        assert time.monotonic() < deadline, "actors still running long after rt.close()"
        time.sleep(0.001)


def _check_pass(
    rt: journaled.Runtime, result: journaled.ExecuteResult, trace: Trace, notes: list[Note]
) -> None:
    """O7, E12 and E13 for one execute or resume pass."""
    assert trace, "every pass appends events"
    positions = [p for p, _ in trace]
    assert positions == sorted(set(positions))
    for position, live in trace:
        rebuilt = rt.runs.at(result.run_id, position)
        assert _statuses(rebuilt) == _statuses(live)
        assert rebuilt.observations == live.observations
        assert rebuilt.calls_used == live.calls_used
        assert rebuilt.stopped_for_budget == live.stopped_for_budget
        assert rebuilt.waiting == live.waiting
        assert rebuilt.ok == live.ok
        assert _canonical(rebuilt) == _canonical(live)
    assert _canonical(trace[-1][1]) == _canonical(result)
    # E12: progress at quiescent points, calls cumulative, the last one at the plan's end.
    assert notes
    assert {at for at, _, _, _ in notes} <= NOTES
    assert notes[-1][0] == "plan-end"
    used = [calls for _, _, calls, _ in notes]
    assert used == sorted(used)
    assert notes[-1][2] == result.calls_used
    assert notes[-1][3] == result.waiting
    # E13
    every_step_succeeded = all(s.status == "succeeded" for s in result.plan.steps)
    assert result.ok == (
        every_step_succeeded and not result.stopped_for_budget and not result.waiting
    )


def _check_bounds(case: Case, recorder: Recorder, traces: list[Trace]) -> None:
    """E2/E3: never more than max_parallel_steps at once, nor more than a name's cap."""
    limits = case.limits or journaled.Limits()
    caps = {**limits.per_skill, **limits.per_tool, **limits.per_agent}
    assert recorder.peak["*"] <= case.max_parallel_steps
    for name, cap in caps.items():
        assert recorder.peak[name] <= cap
    targets = {_sid(i): spec.target for i, spec in enumerate(case.steps)}
    for trace in traces:
        for _, live in trace:
            running = [s.id for s in live.plan.steps if s.status == "running"]
            assert len(running) <= case.max_parallel_steps
            per_name = Counter(targets[s] for s in running)
            assert all(per_name[name] <= cap for name, cap in caps.items())


def _check_budget_gate(case: Case, history: list[journaled.Event]) -> None:
    """E6/E7: a budget stop comes right after a partition exactly when its wave does not fit."""
    budget = case.call_budget
    used = 0
    for item, after in zip(history, [*history[1:], None], strict=True):
        data = item.data
        if isinstance(data, BudgetRaised):
            budget = data.budget
        elif isinstance(data, StepSucceeded | StepFailed | StepWaiting):
            used += data.charged
        elif isinstance(data, WavePartitioned):
            runnable = [case.steps[_index(s)] for s in data.runnable]
            estimate = sum(1 if s.kind == "skill" else s.reserve for s in runnable)
            over = budget is not None and estimate > 0 and used + estimate > budget
            stop = after.data if after is not None else None
            if not isinstance(stop, BudgetStopped):
                assert not over, (data.wave, estimate, used, budget)
                continue
            assert over, (data.wave, estimate, used, budget)
            assert (stop.wave, stop.estimate, stop.used) == (data.wave, estimate, used)
            assert (stop.budget, stop.pending) == (budget, data.runnable)


def _check_final(case: Case, recorder: Recorder, result: journaled.ExecuteResult) -> None:
    """The run driven to its end against the reference model (E4, E8, E10, E11, E14)."""
    expected = _expected_status(case)
    assert [s.status for s in result.plan.steps] == expected
    assert result.ok == all(s == "succeeded" for s in expected)
    # Succeeded steps never ran again; a waiting agent ran twice, attempts 1 then 2.
    for i, spec in enumerate(case.steps):
        attempts = [a for step_id, a in recorder.executions if step_id == _sid(i)]
        if expected[i] == "skipped":
            assert attempts == []
        elif spec.kind != "agent":
            assert attempts == [0]
        elif spec.outcome == "wait":
            assert attempts == [1, 2]
            last = [o for o in result.observations if o.step_id == _sid(i)][-1]
            assert last.output == {"done": _sid(i), "answer": _answer(_sid(i))}
        else:
            assert attempts == [1]
    # E8: a skill costs 1 per execution, an agent what it reports, else its reservation; an
    # agent that waits and reports nothing is charged when it runs again (ADR 0013).
    charged = 0
    for step_id, attempt in recorder.executions:
        spec = case.steps[_index(step_id)]
        if spec.kind == "skill":
            charged += 1
        elif spec.kind == "agent":
            waited = spec.outcome == "wait" and attempt == 1
            reports = spec.outcome in ("ok", "fail") or (spec.outcome == "wait" and attempt > 1)
            reported = spec.calls if reports else None
            if not waited:
                charged += spec.reserve if reported is None else reported
    assert result.calls_used == charged


@settings(max_examples=40, deadline=None)
@given(case=cases())
def test_every_journaled_position_rebuilds_the_live_state(case: Case) -> None:
    """O7/E14/T1 (E12, E13): runs.at(position) equals the live state after every appended event."""
    recorder = Recorder()
    notes: list[Note] = []
    traces: list[Trace] = []

    def tracer() -> Callable[[int, journaled.ExecuteResult], None]:
        trace: Trace = []
        traces.append(trace)
        return lambda position, state: trace.append((position, state))

    rt = journaled.open("memory://", clock=ManualClock(step=1))
    # T1: runs.at below is served by checkpoints; a spacing of 2 events crosses many of them.
    rt.runs.checkpoints = RunCheckpoints(every=2)
    lagging: list[str] = []

    def progress(at: str, delta: list[journaled.Observation], used: int, w: list[str]) -> None:
        notes.append((at, delta, used, w))
        # E12: what on_progress reports is already in the journal (a crash cannot lose it).
        # The executor swallows what on_progress raises, so problems are collected instead.
        try:
            (run_id,) = rt.runs.ids()
            stored = rt.runs.state(run_id)
        except Exception as exc:
            lagging.append(f"{at}: {exc!r}")
            return
        reported = [o for _, d, _, _ in notes for o in d]
        if stored.observations[: len(reported)] != reported or stored.calls_used < used:
            lagging.append(at)

    with rt:
        for n in (0, 1):
            rt.register_skill(f"skill-{n}", recorder.callable_step)
            rt.register_tool(f"tool-{n}", recorder.callable_step)
            rt.register_agent(f"agent-{n}", recorder.agent)
        result = rt.runs.execute(
            _plan(case),
            case.call_budget,
            case.max_parallel_steps,
            case.limits,
            reserve=_reserve,
            on_progress=progress,
            trace=tracer(),
        )
        run_id = result.run_id
        event(f"first pass: waiting={bool(result.waiting)}, budget={result.stopped_for_budget}")
        _check_pass(rt, result, traces[-1], notes)
        assert [o for _, delta, _, _ in notes for o in delta] == result.observations

        # E10: a waiting run started no wave after the waiting steps' waves.
        depth = _depths(case)
        if result.waiting:
            last_wave = max(depth[_index(s)] for s in result.waiting)
            later = [s for s, d in zip(result.plan.steps, depth, strict=True) if d > last_wave]
            assert all(s.status == "pending" for s in later)

        passes = 0
        while result.waiting or result.stopped_for_budget:
            passes += 1
            assert passes <= len(case.steps), "each resume must make progress"
            answers = {s: _answer(s) for s in result.waiting}
            budget = None if case.call_budget is None else RAISED_BUDGET
            seen = len(notes)
            result = rt.runs.resume(
                run_id, budget, answers, reserve=_reserve, on_progress=progress, trace=tracer()
            )
            assert result.run_id == run_id
            _check_pass(rt, result, traces[-1], notes[seen:])
            # E12 across passes: all the deltas so far are exactly the run's observations.
            assert [o for _, delta, _, _ in notes for o in delta] == result.observations
        event(f"resumed {passes} time(s)")

        # Every event of the run was traced once, in journal order, across all passes.
        history = rt.runs.history(run_id)
        assert [p for trace in traces for p, _ in trace] == [e.position for e in history]

    _await_actors_stopped()
    assert lagging == []
    _check_budget_gate(case, history)
    _check_bounds(case, recorder, traces)
    _check_final(case, recorder, result)


def test_rebuilt_state_equals_the_live_state_exactly(clock: ManualClock) -> None:
    """O7/E14: runs.at(position) is equal to the traced live state, depends_on included."""
    trace: Trace = []
    plan = journaled.Plan(
        goal="two steps",
        steps=[journaled.Step("a", tool="t"), journaled.Step("b", tool="t", depends_on=["a"])],
    )
    with journaled.open("memory://", clock=clock) as rt:
        rt.register_tool("t", lambda data: data)
        result = rt.runs.execute(plan, trace=lambda p, state: trace.append((p, state)))
        assert result.ok
        assert trace[-1][1] == result
        for position, live in trace:
            assert rt.runs.at(result.run_id, position) == live
        assert rt.runs.at(result.run_id, rt.journal.position()) == result


def test_close_stops_every_actor(clock: ManualClock) -> None:
    """SPEC 5 (close): once rt.close() returns, no executor or step actor is still running."""
    plan = journaled.Plan(
        goal="one of each kind",
        steps=[
            journaled.Step("t", tool="t"),
            journaled.Step("s", skill="s"),
            journaled.Step("g", agent="g", depends_on=["t"]),
        ],
    )
    # A race: repeat (time-boxed) until a close leaves an actor behind, or none ever does.
    rounds = 0
    survivors: list[str] = []
    deadline = time.monotonic() + CLOSE_SECONDS
    while not survivors and time.monotonic() < deadline:
        rounds += 1
        with journaled.open("memory://", clock=clock) as rt:
            rt.register_tool("t", lambda data: data)
            rt.register_skill("s", lambda data: data)
            rt.register_agent("g", lambda step, ctx: journaled.AgentResult())
            assert rt.execute(plan, max_parallel_steps=3).ok
        survivors = sorted(ref.actor_class.__name__ for ref in pykka.ActorRegistry.get_all())
    _await_actors_stopped()
    assert survivors == [], f"close() #{rounds} returned with these actors running"
