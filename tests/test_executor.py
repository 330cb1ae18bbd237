"""The plan executor, SPEC E1-E14, with real threads (barriers prove concurrency and caps)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pykka
import pytest
from aio_facade import FLAVOURS, open_runtime

import journaled
from journaled import AgentResult, Limits, NeedsInput, Plan, Step
from journaled.actors.steps import StepWorker
from journaled.events.journal import Journal
from journaled.events.plan_rules import fold_calls, step_calls
from journaled.testing import ManualClock, wait_for

WAIT = 10.0


@pytest.fixture(params=FLAVOURS)
def flavour(request: pytest.FixtureRequest) -> str:
    """Run the runtime fixture's tests on the sync and the asyncio runtime (A1)."""
    param: str = request.param
    return param


@pytest.fixture
def runtime(journal_url: str, clock: ManualClock, flavour: str) -> Iterator[journaled.Runtime]:
    """Yield a runtime with a few ready-made tools and skills."""
    with open_runtime(flavour, journal_url, clock=clock) as rt:
        rt.register_tool("echo", lambda x: x)
        rt.register_skill("think", lambda x: f"thought about {x}")
        yield rt


def statuses(result: journaled.ExecuteResult) -> dict[str, str]:
    """Map step id to status."""
    return {s.id: s.status for s in result.plan.steps}


def resumed(rt: journaled.Runtime, run_id: str, **options: Any) -> journaled.ExecuteResult:
    """Resume a run started by execute(), which gives back an ExecuteResult."""
    result = rt.resume(run_id, **options)
    assert isinstance(result, journaled.ExecuteResult)
    return result


def kinds(rt: journaled.Runtime, run_id: str) -> list[str]:
    """Return the run's event kinds in order."""
    return [e.kind for e in rt.runs.history(run_id)]


class Concurrency:
    """Counts how many calls run at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0

    def wrap(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """Return fn instrumented to count concurrent calls."""

        def run(x: Any) -> Any:
            with self.lock:
                self.now += 1
                self.peak = max(self.peak, self.now)
            try:
                return fn(x)
            finally:
                with self.lock:
                    self.now -= 1

        return run


# -- E1 validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "step_id", "words"),
    [
        ([Step("a", tool="echo"), Step("a", tool="echo")], "a", "more than one step"),
        ([Step("a")], "a", "names none"),
        ([Step("a", tool="echo", skill="think")], "a", "names skill and tool"),
        ([Step("a", tool="echo", depends_on=["zz"])], "a", "unknown step 'zz'"),
        (
            [Step("a", tool="echo", depends_on=["b"]), Step("b", tool="echo", depends_on=["a"])],
            "a",
            "cycle",
        ),
        ([Step("a", tool="echo", depends_on=["a"])], "a", "itself"),
        ([Step("a", tool="nope")], "a", "tool 'nope' is not registered"),
        ([Step("a", skill="nope")], "a", "skill 'nope' is not registered"),
        ([Step("a", agent="nope")], "a", "agent 'nope' is not registered"),
        ([Step("a", tool="echo", input=object())], "a", "cannot be journaled"),
    ],
)
def test_malformed_plans_are_rejected_before_anything_runs(
    runtime: journaled.Runtime, steps: list[Step], step_id: str, words: str
) -> None:
    """E1: PlanRejected (a ValueError) names the step and the reason; nothing is appended."""
    before = runtime.journal.position()
    with pytest.raises(journaled.PlanRejected, match=words) as info:
        runtime.execute(Plan(goal="g", steps=steps))
    assert info.value.step_id == step_id
    assert isinstance(info.value, ValueError)
    assert f"step {step_id!r}" in str(info.value)
    assert runtime.journal.position() == before


def test_agent_steps_rejected_when_agents_disabled(journal_url: str) -> None:
    """E1: with agents=False, a plan with an agent step is rejected."""
    with journaled.open(journal_url, agents=False) as rt:
        rt.register_agent("coder", lambda step, ctx: AgentResult())
        with pytest.raises(journaled.PlanRejected, match="agents=True"):
            rt.execute(Plan(goal="g", steps=[Step("a", agent="coder")]))
        assert rt.journal.position() == 0


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"call_budget": -1}, "call_budget"),
        ({"call_budget": 1.5}, "call_budget"),
        ({"max_parallel_steps": 0}, "max_parallel_steps"),
        ({"limits": {"per_tool": {}}}, "journaled.Limits"),
        ({"limits": Limits(per_tool={"echo": 0})}, "per_tool"),
        ({"step_timeout": 0}, "step_timeout"),
        ({"on_progress": 3}, "on_progress"),
    ],
)
def test_bad_options_are_rejected(
    runtime: journaled.Runtime, kwargs: dict[str, Any], words: str
) -> None:
    """E1: a bad budget, parallelism, limit, timeout or callback is a clear error; nothing runs."""
    with pytest.raises(ValueError, match=words):
        runtime.execute(Plan(goal="g", steps=[Step("a", tool="echo")]), **kwargs)
    assert runtime.journal.position() == 0


# -- E2 waves and parallelism ----------------------------------------------------------------------


def test_steps_of_a_wave_run_concurrently(runtime: journaled.Runtime) -> None:
    """E2: two steps of one wave run at the same time on step actors (a barrier proves it)."""
    barrier = threading.Barrier(2, timeout=WAIT)
    runtime.register_tool("meet", lambda x: barrier.wait())
    plan = Plan(goal="g", steps=[Step("a", tool="meet"), Step("b", tool="meet")])
    result = runtime.execute(plan)
    assert result.ok, result.observations


def test_max_parallel_bounds_batches(runtime: journaled.Runtime) -> None:
    """E2: no more than max_parallel_steps steps run at once; batches run one after another."""
    seen = Concurrency()
    runtime.register_tool("work", seen.wrap(lambda x: x))
    plan = Plan(goal="g", steps=[Step(f"s{i}", tool="work") for i in range(7)])
    assert runtime.execute(plan, max_parallel_steps=1).ok
    assert seen.peak == 1
    events = runtime.runs.history(runtime.runs.ids()[-1])
    started = [e for e in events if e.kind == "run.step-started"]
    finished = [e for e in events if e.kind == "run.step-succeeded"]
    assert all(s.position < f.position for s, f in zip(started, finished, strict=True))


def test_batch_waits_for_all_its_steps(runtime: journaled.Runtime) -> None:
    """E2: the third step of a wave starts only after the whole first batch of two finished."""
    release = threading.Event()
    order: list[str] = []
    lock = threading.Lock()

    def slow(x: str) -> str:
        with lock:
            order.append(f"start {x}")
        if x == "a":
            release.wait(WAIT)
        with lock:
            order.append(f"end {x}")
        return x

    def fast(x: str) -> str:
        release.set()
        return slow(x)

    runtime.register_tool("slow", slow)
    runtime.register_tool("fast", fast)
    plan = Plan(
        goal="g",
        steps=[
            Step("a", tool="slow", input="a"),
            Step("b", tool="fast", input="b"),
            Step("c", tool="slow", input="c"),
        ],
    )
    assert runtime.execute(plan, max_parallel_steps=2).ok
    assert order.index("start c") > order.index("end a")
    assert order.index("start c") > order.index("end b")


def test_dependencies_order_waves(runtime: journaled.Runtime) -> None:
    """E2: a step runs only after the steps it depends on, in dependency waves numbered from 1."""
    plan = Plan(
        goal="g",
        steps=[
            Step("c", tool="echo", depends_on=["a", "b"]),
            Step("a", tool="echo"),
            Step("b", tool="echo", depends_on=["a"]),
        ],
    )
    result = runtime.execute(plan)
    assert result.ok
    # Each start names its wave; the partitions say nothing more here, so none is stored.
    starts = [e.data for e in runtime.runs.history(result.run_id) if e.kind == "run.step-started"]
    assert [(s.wave, s.step_id) for s in starts] == [(1, "a"), (2, "b"), (3, "c")]  # type: ignore[attr-defined]


# -- E3 limits -------------------------------------------------------------------------------------


def test_per_tool_cap_inside_the_batch(runtime: journaled.Runtime) -> None:
    """E3: a per-tool cap of 1 serialises that tool while other steps of the batch run alongside."""
    capped = Concurrency()
    inside = threading.Event()
    free_running = threading.Event()

    def capped_fn(x: Any) -> Any:
        inside.set()
        # A free step is running at the same time: capped steps overlap other tools.
        assert free_running.wait(WAIT)
        return x

    def free_fn(x: Any) -> Any:
        free_running.set()
        return inside.wait(WAIT)

    runtime.register_tool("capped", capped.wrap(capped_fn))
    runtime.register_tool("free", free_fn)
    steps = [
        Step("c1", tool="capped"),
        Step("c2", tool="capped"),
        Step("f1", tool="free"),
        Step("f2", tool="free"),
    ]
    result = runtime.execute(
        Plan(goal="g", steps=steps), max_parallel_steps=4, limits=Limits(per_tool={"capped": 1})
    )
    assert result.ok, result.observations
    assert capped.peak == 1
    assert all(o.output is True for o in result.observations if o.tool == "free")


def test_per_skill_and_per_agent_caps(runtime: journaled.Runtime) -> None:
    """E3: per-skill and per-agent caps bound concurrency of steps using that skill or agent."""
    skills = Concurrency()
    agents = Concurrency()
    runtime.register_skill("s", skills.wrap(lambda x: x))
    agent_fn = agents.wrap(lambda pair: AgentResult(calls_used=0))
    runtime.register_agent("ag", lambda step, ctx: agent_fn((step, ctx)))
    steps = [Step(f"s{i}", skill="s") for i in range(4)] + [
        Step(f"a{i}", agent="ag") for i in range(4)
    ]
    result = runtime.execute(
        Plan(goal="g", steps=steps),
        max_parallel_steps=8,
        limits=Limits(per_skill={"s": 2}, per_agent={"ag": 1}),
    )
    assert result.ok
    assert skills.peak <= 2
    assert agents.peak == 1


# -- E4 / E5 dependencies and cancellation ---------------------------------------------------------


def test_failed_dependency_skips_dependents(runtime: journaled.Runtime) -> None:
    """E4: a step whose dependency failed, or was skipped, is skipped with the observation."""

    def boom(x: Any) -> Any:
        raise RuntimeError("no route to host")

    runtime.register_tool("boom", boom)
    plan = Plan(
        goal="g",
        steps=[
            Step("a", tool="boom"),
            Step("b", tool="echo", depends_on=["a"]),
            Step("c", tool="echo", depends_on=["b"]),
            Step("d", tool="echo"),
        ],
    )
    result = runtime.execute(plan)
    assert not result.ok
    assert statuses(result) == {"a": "failed", "b": "skipped", "c": "skipped", "d": "succeeded"}
    by_step = {o.step_id: o for o in result.observations}
    assert by_step["b"].error == "skipped: a dependency failed"
    assert by_step["c"].error == "skipped: a dependency failed"
    assert by_step["a"].error == "no route to host"


def test_cancelled_agent_cancels_its_branch(runtime: journaled.Runtime) -> None:
    """E4: a dependent of a cancelled agent step is cancelled (code cancelled), not skipped."""
    runtime.register_agent(
        "quitter", lambda step, ctx: AgentResult(ok=False, code="cancelled", error="stopped")
    )
    plan = Plan(
        goal="g", steps=[Step("a", agent="quitter"), Step("b", tool="echo", depends_on=["a"])]
    )
    result = runtime.execute(plan)
    obs = {o.step_id: o for o in result.observations}
    assert obs["b"].code == "cancelled"
    assert obs["b"].error == "cancelled: an agent branch was cancelled"
    assert statuses(result)["b"] == "skipped"


def test_cancel_from_another_thread(runtime: journaled.Runtime) -> None:
    """E5: cancel stops scheduling; unstarted agents record code cancelled; done work stands."""
    started = threading.Event()
    release = threading.Event()

    def hold(x: Any) -> str:
        started.set()
        release.wait(WAIT)
        return "done"

    runtime.register_tool("hold", hold)
    runtime.register_agent("helper", lambda step, ctx: AgentResult(output="never"))
    plan = Plan(
        goal="g",
        steps=[
            Step("a", tool="hold"),
            Step("b", tool="echo", depends_on=["a"]),
            Step("c", agent="helper", depends_on=["a"]),
        ],
    )
    results: list[journaled.ExecuteResult] = []
    thread = threading.Thread(target=lambda: results.append(runtime.execute(plan)))
    thread.start()
    assert started.wait(WAIT)
    [run_id] = runtime.runs.active()
    canceller = threading.Thread(target=runtime.cancel, args=(run_id,))
    canceller.start()
    canceller.join(WAIT)
    release.set()
    thread.join(WAIT)
    [result] = results
    assert statuses(result) == {"a": "succeeded", "b": "skipped", "c": "skipped"}
    obs = {o.step_id: o for o in result.observations}
    assert obs["c"].code == "cancelled"
    assert obs["c"].error == "cancelled: the run was aborted"
    assert "b" not in obs
    assert "run.cancel-requested" in kinds(runtime, run_id)
    assert runtime.runs.state(run_id).run_status == "cancelled"
    assert runtime.cancel(run_id) is False


def test_active_lists_a_run_only_once_it_can_be_read(
    runtime: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E12: every id runs.active() returns has its opening in the journal, readable at once."""
    holding, go, release = threading.Event(), threading.Event(), threading.Event()
    real_append = Journal.append

    def slow_opening(self: Journal, pending: list[Any], **kw: Any) -> list[int]:
        if pending and pending[0].stream.startswith("run_") and pending[0].version == 1:
            holding.set()
            assert go.wait(WAIT)
        return real_append(self, pending, **kw)

    monkeypatch.setattr(Journal, "append", slow_opening)
    runtime.register_tool("hold", lambda x: release.wait(WAIT))
    results: list[journaled.ExecuteResult] = []
    thread = threading.Thread(
        target=lambda: results.append(
            runtime.execute(Plan(goal="g", steps=[Step("a", tool="hold")]))
        )
    )
    thread.start()
    try:
        assert holding.wait(WAIT)
        assert runtime.runs.active() == []  # executing, but nothing of it is stored yet
        go.set()
        wait_for(lambda: bool(runtime.runs.active()), WAIT)
        [run_id] = runtime.runs.active()
        assert kinds(runtime, run_id)[0] == "run.started"
    finally:
        go.set()
        release.set()
        thread.join(WAIT)
    assert results[0].ok


def test_agent_sees_cancel_token(runtime: journaled.Runtime) -> None:
    """E5: running agent code can check ctx.cancelled() after a cancel request."""
    inside = threading.Event()
    saw: list[bool] = []

    def agent(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        inside.set()
        for _ in range(1000):
            if ctx.cancelled():
                saw.append(True)
                return AgentResult(ok=False, code="cancelled", error="stopped by request")
            threading.Event().wait(0.01)
        return AgentResult()

    runtime.register_agent("looper", agent)
    results: list[journaled.ExecuteResult] = []
    thread = threading.Thread(
        target=lambda: results.append(
            runtime.execute(Plan(goal="g", steps=[Step("a", agent="looper")]))
        )
    )
    thread.start()
    assert inside.wait(WAIT)
    runtime.cancel(runtime.runs.active()[0])
    thread.join(WAIT)
    assert saw == [True]
    assert results[0].observations[0].code == "cancelled"


# -- E6 / E7 / E8 budget ---------------------------------------------------------------------------


def test_step_cost_fold() -> None:
    """E6: skill 1, tool 0, agent trunc(reserve) >= 0, folded in order against the remainder."""
    seen: list[float] = []

    def reserve(step: Step, remaining: float) -> float:
        seen.append(remaining)
        return 2.9 if step.id != "neg" else -4

    steps = [
        Step("s", skill="x"),
        Step("t", tool="y"),
        Step("a", agent="z"),
        Step("neg", agent="z"),
    ]
    assert fold_calls(steps, 10, reserve) == 3
    assert seen == [9, 7]
    assert step_calls(Step("a", agent="z"), 5, None) == 0
    assert fold_calls(steps, None, reserve) == 3


def test_budget_gate_stops_before_the_wave(runtime: journaled.Runtime) -> None:
    """E7: a wave that would exceed the budget does not start; the stop records its numbers."""
    plan = Plan(
        goal="g",
        steps=[
            Step("a", skill="think"),
            Step("b", skill="think", depends_on=["a"]),
            Step("c", skill="think", depends_on=["a"]),
        ],
    )
    result = runtime.execute(plan, call_budget=2)
    assert result.stopped_for_budget
    assert not result.ok
    assert statuses(result) == {"a": "succeeded", "b": "pending", "c": "pending"}
    assert result.calls_used == 1
    stop = next(
        e.data for e in runtime.runs.history(result.run_id) if e.kind == "run.budget-stopped"
    )
    assert (stop.wave, stop.estimate, stop.used, stop.budget) == (2, 2, 1, 2)  # type: ignore[attr-defined]


def test_tool_only_waves_always_run(runtime: journaled.Runtime) -> None:
    """E7: a wave of tool steps costs 0 and runs even with a budget of 0."""
    plan = Plan(goal="g", steps=[Step("a", tool="echo"), Step("b", tool="echo", depends_on=["a"])])
    result = runtime.execute(plan, call_budget=0)
    assert result.ok
    assert not result.stopped_for_budget


def test_charging(runtime: journaled.Runtime) -> None:
    """E8: +1 per skill (failed or not); agents calls_used else the reservation; tools free."""

    def fails(x: Any) -> Any:
        raise ValueError("bad")

    runtime.register_skill("fails", fails)
    runtime.register_agent("frugal", lambda step, ctx: AgentResult(calls_used=1))
    runtime.register_agent("silent", lambda step, ctx: AgentResult())
    plan = Plan(
        goal="g",
        steps=[
            Step("s1", skill="think"),
            Step("s2", skill="fails"),
            Step("t", tool="echo"),
            Step("a1", agent="frugal"),
            Step("a2", agent="silent"),
        ],
    )
    result = runtime.execute(plan, max_parallel_steps=5, reserve=lambda step, remaining: 4)
    assert result.calls_used == 1 + 1 + 0 + 1 + 4


def test_agent_gets_its_reservation(runtime: journaled.Runtime) -> None:
    """E9: an agent step runs with ctx.reservation = trunc(reserve(step, remaining))."""
    seen: list[int | None] = []

    def agent(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        seen.append(ctx.reservation)
        return AgentResult(calls_used=0)

    runtime.register_agent("a", agent)
    runtime.execute(Plan(goal="g", steps=[Step("x", agent="a")]), reserve=lambda s, r: 3.7)
    assert seen == [3]


# -- E9 agents and child runs ----------------------------------------------------------------------


def test_child_run_is_linked_both_ways(runtime: journaled.Runtime) -> None:
    """E9: ctx.execute runs a journaled child run whose parent is (run, step), and vice versa."""

    def planner(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        child = ctx.execute(Plan(goal="sub", steps=[Step("x", tool="echo", input=5)]))
        return AgentResult(output=child.observations[0].output, calls_used=0)

    runtime.register_agent("planner", planner)
    result = runtime.execute(Plan(goal="g", steps=[Step("p", agent="planner")]))
    assert result.ok
    obs = result.observations[0]
    assert obs.output == 5
    assert obs.agent_task_id is not None
    child = runtime.runs.history(obs.agent_task_id)[0].data
    assert (child.parent_run, child.parent_step) == (result.run_id, "p")  # type: ignore[attr-defined]


def test_missing_agent_on_resume_fails_with_code(journal_url: str, clock: ManualClock) -> None:
    """E9: resuming where the agent is no longer registered fails the step agent-not-enabled."""
    with journaled.open(journal_url, clock=clock) as rt:
        rt.register_skill("think", lambda x: x)
        rt.register_agent("helper", lambda step, ctx: AgentResult())
        plan = Plan(
            goal="g", steps=[Step("s", skill="think"), Step("a", agent="helper", depends_on=["s"])]
        )
        stopped = rt.execute(plan, call_budget=0)
        assert stopped.stopped_for_budget
        rt.runs._registry.agents.clear()
        rt.runs._registry.skills.clear()
        result = resumed(rt, stopped.run_id, call_budget=5)
        obs = {o.step_id: o for o in result.observations}
        assert obs["s"].error == "skill 'think' is not registered in this runtime"
        assert statuses(result)["a"] == "skipped"


def test_agent_not_enabled_code(runtime: journaled.Runtime) -> None:
    """E9: an agent step whose agent vanished before dispatch fails with code agent-not-enabled."""
    runtime.register_agent("flaky", lambda step, ctx: AgentResult())
    plan = Plan(
        goal="g", steps=[Step("t", tool="echo"), Step("a", agent="flaky", depends_on=["t"])]
    )

    def drop_agent(
        at: str, delta: list[journaled.Observation], calls: int, waiting: list[str]
    ) -> None:
        if at == "batch":
            runtime.runs._registry.agents.pop("flaky", None)

    result = runtime.execute(plan, on_progress=drop_agent)
    obs = {o.step_id: o for o in result.observations}
    assert obs["a"].code == "agent-not-enabled"


# -- E10 waiting -----------------------------------------------------------------------------------


def ask_once(step: Step, ctx: journaled.AgentContext) -> AgentResult:
    """An agent that waits for an answer, then uses it."""
    if ctx.answer is None:
        raise NeedsInput(f"which branch for {step.id}?")
    return AgentResult(output=f"{step.id} on {ctx.answer}", calls_used=0)


def test_waiting_pauses_after_the_wave(runtime: journaled.Runtime) -> None:
    """E10: a waiting step stays pending; its wave finishes; no later wave starts; resumable."""
    runtime.register_agent("asker", ask_once)
    plan = Plan(
        goal="g",
        steps=[
            Step("w", agent="asker"),
            Step("x", tool="echo"),
            Step("y", tool="echo"),
            Step("dep", tool="echo", depends_on=["w"]),
            Step("later", tool="echo", depends_on=["x"]),
        ],
    )
    result = runtime.execute(plan, max_parallel_steps=1)
    assert not result.ok
    assert result.waiting == ["w"]
    assert statuses(result) == {
        "w": "pending",
        "x": "succeeded",
        "y": "succeeded",
        "dep": "pending",
        "later": "pending",
    }
    assert runtime.runs.state(result.run_id).questions == {"w": "which branch for w?"}
    again = resumed(runtime, result.run_id, answers={"w": "main"})
    assert again.ok
    assert again.waiting == []
    outputs = {o.step_id: o.output for o in again.observations if o.ok}
    assert outputs["w"] == "w on main"
    assert [e.kind for e in runtime.runs.history(result.run_id)].count("run.answers-given") == 1


def test_answers_for_steps_not_waiting_are_rejected(runtime: journaled.Runtime) -> None:
    """E10/E14: answers for a step that is not waiting are an error naming it; nothing appended."""
    runtime.register_agent("asker", ask_once)
    result = runtime.execute(
        Plan(goal="g", steps=[Step("w", agent="asker"), Step("x", tool="echo")])
    )
    before = runtime.journal.position()
    with pytest.raises(journaled.RunNotResumable, match="'x' is not waiting"):
        runtime.resume(result.run_id, answers={"x": "?"})
    assert runtime.journal.position() == before


# -- E11 errors ------------------------------------------------------------------------------------


def test_errors_become_failed_observations(runtime: journaled.Runtime) -> None:
    """E11: exceptions, unjournalable or oversized outputs, garbage agent results fail one step."""

    def raises(x: Any) -> Any:
        raise KeyError("missing key")

    runtime.register_tool("raises", raises)
    runtime.register_tool("socket", lambda x: threading.Lock())
    runtime.register_tool("huge", lambda x: "x" * (2 << 20))
    runtime.register_agent("garbage", lambda step, ctx: 42)  # type: ignore[arg-type]
    plan = Plan(
        goal="g",
        steps=[
            Step("r", tool="raises"),
            Step("s", tool="socket"),
            Step("h", tool="huge"),
            Step("g", agent="garbage"),
            Step("ok", tool="echo", input="fine"),
        ],
    )
    result = runtime.execute(plan, max_parallel_steps=5)
    obs = {o.step_id: o for o in result.observations}
    assert "missing key" in (obs["r"].error or "")
    assert "cannot be journaled" in (obs["s"].error or "")
    assert "over the" in (obs["h"].error or "")
    assert obs["g"].code == "agent-failed"
    assert "not journaled.AgentResult" in (obs["g"].error or "")
    assert obs["ok"].output == "fine"
    assert statuses(result)["ok"] == "succeeded"


def test_an_output_keyed_by_anything_but_text_or_a_number_fails_naming_its_path(
    runtime: journaled.Runtime,
) -> None:
    """E11, ADR 0098: a tool's or agent's output holding a dict keyed by a tuple, None or a
    bool fails its step, naming the output and the key's path; an int key is kept. Stored, such
    a key broke every JSON door on the run (CLI, why, a JSON wire client) for good."""
    runtime.register_tool("tuple", lambda x: {(1, 2): "x"})
    runtime.register_tool("deep", lambda x: {"rows": [{"a": 1}, {None: 2}]})
    runtime.register_tool("flag", lambda x: {True: 1})
    runtime.register_tool("frame", lambda x: {"col": {0: 1.5, 1: 2.5}})  # pandas' to_dict()
    runtime.register_agent("odd", lambda step, ctx: AgentResult(output={"k": {(1,): 2}}))
    plan = Plan(
        goal="g",
        steps=[
            Step("t", tool="tuple"),
            Step("d", tool="deep"),
            Step("f", tool="flag"),
            Step("i", tool="frame"),
            Step("g", agent="odd"),
        ],
    )
    result = runtime.execute(plan, max_parallel_steps=5)
    obs = {o.step_id: o for o in result.observations}
    assert obs["t"].error == (
        "the output of tool 'tuple' cannot be journaled: a key at $ is a tuple, not a str: a "
        "stored dict is keyed by text (or a number, which JSON reads as its text)"
    )
    assert "the output of tool 'deep' cannot be journaled: a key at $['rows'][1] is None" in (
        obs["d"].error or ""
    )
    assert "a key at $ is True, not a str" in (obs["f"].error or "")
    assert "the output of agent 'odd'" in (obs["g"].error or "")
    assert "a key at $['k'] is a tuple" in (obs["g"].error or "")
    assert obs["g"].code == "agent-failed"
    assert obs["i"].ok
    assert obs["i"].output == {"col": {0: 1.5, 1: 2.5}}
    assert runtime.runs.why(result.run_id)


def test_a_step_input_keyed_by_a_tuple_is_rejected_naming_step_and_path(
    runtime: journaled.Runtime,
) -> None:
    """E1, ADR 0098: a step input holding a dict keyed by a tuple or None is rejected before
    anything is stored, naming the step and the key's path."""
    before = runtime.journal.position()
    for data, where in (({(1,): 2}, "$"), ({"a": {None: 1}}, "$['a']")):
        plan = Plan(goal="g", steps=[Step("ok", tool="echo"), Step("s", tool="echo", input=data)])
        with pytest.raises(journaled.PlanRejected, match="step 's'") as info:
            runtime.execute(plan)
        assert info.value.step_id == "s"
        assert f"its input cannot be journaled: a key at {where} is" in str(info.value)
    assert runtime.journal.position() == before


@dataclasses.dataclass
class _Unloaded:
    """A dataclass whose field raises when read, as a lazy ORM row's does."""

    value: int = 0

    def __getattribute__(self, name: str) -> Any:
        if name == "value":
            raise RuntimeError("not loaded")
        return object.__getattribute__(self, name)

    def __iter__(self) -> Iterator[int]:
        raise RuntimeError("the cursor is closed")


@pytest.mark.parametrize(
    ("result", "error"),
    [
        (
            AgentResult(artifacts=None),  # type: ignore[arg-type]
            "the agent's artifacts must be a list or tuple, got NoneType",
        ),
        (AgentResult(artifacts=3), "the agent's artifacts must be a list or tuple, got int"),  # type: ignore[arg-type]
        (
            AgentResult(artifacts=_Unloaded()),  # type: ignore[arg-type]
            "the agent's artifacts could not be read: RuntimeError: the cursor is closed",
        ),
        (AgentResult(data=_Unloaded()), "the agent's data could not be read: RuntimeError"),
        (AgentResult(ok="false"), "the agent's ok must be True or False, got str"),  # type: ignore[arg-type]
        (AgentResult(ok=0), "the agent's ok must be True or False, got int"),  # type: ignore[arg-type]
    ],
    ids=["artifacts-None", "artifacts-int", "artifacts-raise", "data-raises", "ok-str", "ok-int"],
)
def test_an_agent_result_with_a_bad_field_fails_its_step_naming_the_field(
    runtime: journaled.Runtime, result: AgentResult, error: str
) -> None:
    """E11: an AgentResult whose artifacts are no list, whose data raises when read, or whose
    ok is not a bool fails its step naming the field; the run ends failed, its other steps
    run. Before, the step actor died without an answer and the run waited for ever; an
    ``ok="false"`` was read by truth and journaled as a success."""
    runtime.register_agent("odd", lambda step, ctx: result)
    plan = Plan(goal="g", steps=[Step("a", agent="odd"), Step("b", tool="echo", input=1)])
    done = runtime.execute(plan, step_timeout=WAIT / 2)
    obs = {o.step_id: o for o in done.observations}
    assert not obs["a"].ok
    assert obs["a"].code == "agent-failed"
    assert (obs["a"].error or "").startswith(error), obs["a"].error
    assert obs["b"].ok
    assert statuses(done) == {"a": "failed", "b": "succeeded"}
    assert {r.run_id: r.status for r in runtime.runs.list()}[done.run_id] == "failed"


def test_an_error_escaping_a_steps_observation_still_fails_the_step(
    runtime: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E11: whatever escapes the code that observes a step fails that step, naming the error's
    type, and the run ends: a step actor never dies leaving its run without an answer."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise LookupError("an unforeseen gap")

    monkeypatch.setattr("journaled.actors.steps.run_callable", broken)
    plan = Plan(goal="g", steps=[Step("a", tool="echo", input=1)])
    done = runtime.execute(plan, step_timeout=WAIT / 2)
    (obs,) = done.observations
    assert not obs.ok
    assert obs.error == "step 'a' could not be observed: LookupError: an unforeseen gap"
    assert statuses(done) == {"a": "failed"}


def test_hanging_tool_times_out_alone(runtime: journaled.Runtime) -> None:
    """E11: a tool hanging past step_timeout fails only its own step; the run goes on."""
    release = threading.Event()
    runtime.register_tool("hang", lambda x: release.wait(WAIT))
    plan = Plan(
        goal="g",
        steps=[
            Step("h", tool="hang"),
            Step("e", tool="echo", input=1),
            Step("n", tool="echo", depends_on=["e"]),
        ],
    )
    try:
        result = runtime.execute(plan, step_timeout=0.2)
    finally:
        release.set()
    wait_for(lambda: not pykka.ActorRegistry.get_by_class(StepWorker))  # the abandoned worker ends
    obs = {o.step_id: o for o in result.observations}
    assert obs["h"].error == "timed out after 0.2s"
    assert statuses(result) == {"h": "failed", "e": "succeeded", "n": "succeeded"}


# -- E12 progress ----------------------------------------------------------------------------------


def test_progress_deltas_concatenate_to_the_observations(runtime: journaled.Runtime) -> None:
    """E12: on_progress fires at partitions, batches, budget stop and end; deltas sum to the run."""
    calls: list[tuple[str, list[journaled.Observation], int, list[str]]] = []
    plan = Plan(
        goal="g",
        steps=[
            Step("a", skill="think"),
            Step("b", tool="echo"),
            Step("c", tool="echo"),
            Step("d", skill="think", depends_on=["a"]),
            Step("e", skill="think", depends_on=["d"]),
        ],
    )
    result = runtime.execute(plan, call_budget=2, on_progress=lambda *args: calls.append(args))
    points = [c[0] for c in calls]
    assert points == [
        "wave-partition",
        "batch",
        "batch",
        "wave-partition",
        "batch",
        "wave-partition",
        "budget-stop",
        "plan-end",
    ]
    assert [o for c in calls for o in c[1]] == result.observations
    assert [c[2] for c in calls] == sorted(c[2] for c in calls)
    assert calls[-1][2] == result.calls_used == 2


def test_progress_callback_errors_do_not_stop_the_run(runtime: journaled.Runtime) -> None:
    """E12: an on_progress that raises is logged; the run goes on."""

    def bad(*args: Any) -> None:
        raise RuntimeError("sink down")

    result = runtime.execute(Plan(goal="g", steps=[Step("a", tool="echo")]), on_progress=bad)
    assert result.ok


# -- E13 / E14 result and resume -------------------------------------------------------------------


def test_result_fields(runtime: journaled.Runtime) -> None:
    """E13: ok only when all succeeded; the result carries plan statuses, observations, calls."""
    result = runtime.execute(Plan(goal="g", steps=[Step("a", skill="think", input="x")]))
    assert result.ok
    assert result.calls_used == 1
    assert result.observations[0].output == "thought about x"
    assert result.plan.goal == "g"
    assert result.plan.id
    assert result.run_id in runtime.runs.ids()


def test_resume_in_a_new_runtime_never_reruns_succeeded_steps(sqlite_url: str) -> None:
    """E14: resume rebuilds from the journal alone; succeeded steps are never executed again."""
    ran: list[str] = []
    plan = Plan(
        goal="g",
        steps=[
            Step("a", tool="rec", input="a"),
            Step("b", skill="think", input="b", depends_on=["a"]),
        ],
    )
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("rec", ran.append)
        rt.register_skill("think", ran.append)
        stopped = rt.execute(plan, call_budget=0)
    assert stopped.stopped_for_budget
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("rec", ran.append)
        rt.register_skill("think", ran.append)
        result = resumed(rt, stopped.run_id, call_budget=1)
        assert result.ok
        assert result.calls_used == 1
        assert ran == ["a", "b"]
        assert [o.step_id for o in result.observations] == ["a", "b"]


def test_resume_budget_is_the_new_total(runtime: journaled.Runtime) -> None:
    """E14: call_budget on resume is the run's total budget, calls already used included."""
    plan = Plan(
        goal="g",
        steps=[
            Step("a", skill="think"),
            Step("b", skill="think", depends_on=["a"]),
            Step("c", skill="think", depends_on=["b"]),
        ],
    )
    first = runtime.execute(plan, call_budget=1)
    assert first.calls_used == 1
    second = resumed(runtime, first.run_id, call_budget=2)
    assert second.stopped_for_budget
    assert statuses(second) == {"a": "succeeded", "b": "succeeded", "c": "pending"}
    third = resumed(runtime, first.run_id, call_budget=3)
    assert third.ok
    raised = [e.data for e in runtime.runs.history(first.run_id) if e.kind == "run.budget-raised"]
    assert [(r.previous, r.budget) for r in raised] == [(1, 2), (2, 3)]  # type: ignore[attr-defined]


def test_resume_errors(runtime: journaled.Runtime) -> None:
    """E14: unknown runs, finished runs and negative budgets are clear errors; nothing appended."""
    done = runtime.execute(Plan(goal="g", steps=[Step("a", tool="echo")]))
    before = runtime.journal.position()
    with pytest.raises(journaled.RunNotFound, match="no run 'run_nope'"):
        runtime.resume("run_nope")
    with pytest.raises(journaled.RunNotResumable, match="already finished"):
        runtime.resume(done.run_id)
    plan = Plan(goal="g", steps=[Step("a", skill="think")])
    stopped = runtime.execute(plan, call_budget=0)
    before = runtime.journal.position()
    with pytest.raises(ValueError, match="call_budget"):
        runtime.resume(stopped.run_id, call_budget=-2)
    assert runtime.journal.position() == before


def test_runs_at_rebuilds_the_past(runtime: journaled.Runtime) -> None:
    """O7/E14: a run rebuilt at a position shows the statuses and calls it had then."""
    plan = Plan(
        goal="g", steps=[Step("a", skill="think"), Step("b", skill="think", depends_on=["a"])]
    )
    result = runtime.execute(plan)
    events = runtime.runs.history(result.run_id)
    first_success = next(e.position for e in events if e.kind == "run.step-succeeded")
    then = runtime.runs.at(result.run_id, first_success)
    assert statuses(then) == {"a": "succeeded", "b": "pending"}
    assert then.calls_used == 1
    with pytest.raises(ValueError, match="before run"):
        runtime.runs.at(result.run_id, events[0].position - 1)


def test_an_output_whose_keys_json_writes_alike_fails_naming_them(
    runtime: journaled.Runtime,
) -> None:
    """E11, A4, ADR 0098: keys 1 and "1", 1.5 and "1.5", or two NaNs are both written as one
    name in JSON, whose readers keep one of the two values: such an output fails its step,
    naming the keys and their path; a step input so keyed is rejected. Keys JSON tells apart
    (1 and "2") are kept."""
    runtime.register_tool("mixed", lambda x: {1: "int", "1": "str"})
    runtime.register_tool("deep", lambda x: {"rows": [{1.5: "f", "1.5": "s"}]})
    runtime.register_tool("nans", lambda x: {float("nan"): 1, float("nan"): 2})
    runtime.register_tool("apart", lambda x: {1: "int", "2": "str"})
    plan = Plan(
        goal="g",
        steps=[
            Step("m", tool="mixed"),
            Step("d", tool="deep"),
            Step("n", tool="nans"),
            Step("a", tool="apart"),
        ],
    )
    result = runtime.execute(plan, max_parallel_steps=4)
    obs = {o.step_id: o for o in result.observations}
    assert obs["m"].error == (
        "the output of tool 'mixed' cannot be journaled: the keys 1 and '1' at $ are both "
        "written '1' in JSON, which would keep one of their values: key the dict by one of them"
    )
    assert "the keys 1.5 and '1.5' at $['rows'][0] are both written '1.5'" in (obs["d"].error or "")
    assert "the keys nan and nan at $ are both written 'nan'" in (obs["n"].error or "")
    assert obs["a"].ok
    assert obs["a"].output == {1: "int", "2": "str"}
    with pytest.raises(journaled.PlanRejected, match=r"the keys 2 and '2' at \$\['x'\]"):
        runtime.execute(
            Plan(goal="g", steps=[Step("s", tool="apart", input={"x": {2: 0, "2": 1}})])
        )
