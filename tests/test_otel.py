"""OpenTelemetry spans for runs, waves and steps (SPEC T3, ADR 0038), through the real SDK."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import journaled
import journaled.aio
import journaled.otel
from journaled import AgentContext, AgentResult, NeedsInput, Plan, Step
from journaled.testing import wait_for

ROOT = Path(__file__).resolve().parent.parent
WAIT = 10.0


class Traced:
    """A runtime instrumented with its own SDK provider and in-memory exporter."""

    def __init__(self, rt: journaled.Runtime) -> None:
        self.rt = rt
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("a tool")
        journaled.otel.instrument(rt, tracer_provider=self.provider)

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        """Return the finished spans (of one name), in the order they ended."""
        spans = list(self.exporter.get_finished_spans())
        return [s for s in spans if name is None or s.name == name]

    def one(self, name: str, **attributes: Any) -> ReadableSpan:
        """Return the one finished span of this name whose attributes include these."""
        found = [
            s
            for s in self.spans(name)
            if all((s.attributes or {}).get(k) == v for k, v in attributes.items())
        ]
        assert len(found) == 1, [dict(s.attributes or {}) for s in self.spans(name)]
        return found[0]


@pytest.fixture
def traced(sqlite_url: str) -> Iterator[Traced]:
    with journaled.open(sqlite_url) as rt:
        yield Traced(rt)


def suspend_by_close(
    rt: journaled.Runtime, step_id: str, wait: float = WAIT
) -> tuple[journaled.RunHandle[journaled.ExecuteResult], Callable[[Any], Any]]:
    """Start a run of one step ``step_id`` of a tool ``hold`` registered here, and close ``rt``
    with ``drain=0`` while that step holds; ``rt`` is closed in all cases and the step let go.
    Return the run's handle and the tool (which no longer holds), to register again."""
    started = threading.Event()
    release = threading.Event()

    def hold(x: Any) -> Any:
        started.set()
        release.wait(wait)
        return x

    try:
        rt.register_tool("hold", hold)
        handle = rt.start(Plan(goal="g", steps=[Step(step_id, tool="hold", input=1)]))
        assert started.wait(wait)
        rt.close(drain=0)
    finally:
        release.set()
        rt.close()
    return handle, hold


def _parent(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def _id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def _trace(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.trace_id)


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _tree(t: Traced) -> dict[str, list[str]]:
    """Map each span (by a readable label) to its children's labels, sorted."""
    labels: dict[int, str] = {}
    for s in t.spans():
        a = _attrs(s)
        if s.name == journaled.otel.STEP_SPAN:
            labels[_id(s)] = f"step {a['journaled.step.id']}#{a['journaled.step.attempt']}"
        elif s.name == journaled.otel.WAVE_SPAN:
            labels[_id(s)] = f"wave {a['journaled.wave.number']}"
        else:
            labels[_id(s)] = s.name
    tree: dict[str, list[str]] = {}
    for s in t.spans():
        parent = _parent(s)
        key = "root" if parent is None else labels.get(parent, "elsewhere")
        tree.setdefault(key, []).append(labels[_id(s)])
    return {k: sorted(v) for k, v in tree.items()}


def _linked_waves(t: Traced) -> dict[str, list[str]]:
    """Map each step span (by label) to the waves (by label) it links to."""
    waves = {
        _id(s): f"wave {_attrs(s)['journaled.wave.number']}"
        for s in t.spans()
        if s.name == journaled.otel.WAVE_SPAN
    }
    out: dict[str, list[str]] = {}
    for s in t.spans(journaled.otel.STEP_SPAN):
        a = _attrs(s)
        label = f"step {a['journaled.step.id']}#{a['journaled.step.attempt']}"
        out[label] = sorted(waves[int(link.context.span_id)] for link in s.links)
    return out


def test_a_chain_makes_one_run_span_with_a_wave_and_a_step_span_per_step(
    journal_url: str,
) -> None:
    """T3 ("parent = run"): a chain's run span is the parent of one wave span per step and of
    each step's span; a step span links to its wave's span and names its number."""
    with journaled.open(journal_url) as rt:
        t = Traced(rt)
        rt.register_tool("fetch", lambda x: x)
        rt.register_skill("sum", lambda x: 1)
        plan = Plan(
            goal="chain",
            steps=[
                Step("a", tool="fetch", input=1),
                Step("b", skill="sum", depends_on=["a"]),
                Step("c", tool="fetch", input=3, depends_on=["b"]),
            ],
        )
        result = rt.execute(plan)
    assert result.ok
    assert _tree(t) == {
        "root": ["journaled.run"],
        "journaled.run": ["step a#1", "step b#1", "step c#1", "wave 1", "wave 2", "wave 3"],
    }
    assert _linked_waves(t) == {
        "step a#1": ["wave 1"],
        "step b#1": ["wave 2"],
        "step c#1": ["wave 3"],
    }
    assert len({_trace(s) for s in t.spans()}) == 1
    run = t.one("journaled.run")
    assert _attrs(run) == {
        "journaled.run.id": result.run_id,
        "journaled.run.resumed": False,
        "journaled.run.status": "completed",
        "journaled.run.calls_used": 1,
    }
    assert run.status.status_code is StatusCode.OK
    assert _attrs(t.one("journaled.step", **{"journaled.step.id": "b"})) == {
        "journaled.run.id": result.run_id,
        "journaled.step.id": "b",
        "journaled.step.kind": "skill",
        "journaled.step.name": "sum",
        "journaled.step.attempt": 1,
        "journaled.wave.number": 2,
        "journaled.step.calls": 1,
        "journaled.step.outcome": "succeeded",
    }
    a = _attrs(t.one("journaled.step", **{"journaled.step.id": "a"}))
    assert a["journaled.step.calls"] == 0
    assert (a["gen_ai.operation.name"], a["gen_ai.tool.name"]) == ("execute_tool", "fetch")
    wave = _attrs(t.one("journaled.wave", **{"journaled.wave.number": 3}))
    assert wave == {
        "journaled.run.id": result.run_id,
        "journaled.wave.number": 3,
        "journaled.wave.runnable": 1,
        "journaled.wave.skipped": 0,
    }


def test_a_wave_plan_puts_parallel_steps_under_one_wave_span(traced: Traced) -> None:
    """T3: steps of one wave (run concurrently, E2) are children of the run span, each linked to
    that wave's span."""
    both = threading.Barrier(2, timeout=WAIT)  # a and b really run at the same time

    def meet(x: Any) -> Any:
        both.wait()
        return x

    traced.rt.register_tool("meet", meet)
    traced.rt.register_tool("join", lambda x: x)
    plan = Plan(
        goal="waves",
        steps=[
            Step("a", tool="meet", input=1),
            Step("b", tool="meet", input=2),
            Step("c", tool="join", depends_on=["a", "b"]),
        ],
    )
    result = traced.rt.execute(plan, max_parallel_steps=2)
    assert result.ok
    assert _tree(traced) == {
        "root": ["journaled.run"],
        "journaled.run": ["step a#1", "step b#1", "step c#1", "wave 1", "wave 2"],
    }
    assert _linked_waves(traced) == {
        "step a#1": ["wave 1"],
        "step b#1": ["wave 1"],
        "step c#1": ["wave 2"],
    }
    assert (
        _attrs(traced.one("journaled.wave", **{"journaled.wave.number": 1}))[
            "journaled.wave.runnable"
        ]
        == 2
    )


def test_a_span_opened_inside_a_tool_is_a_child_of_its_step_span(traced: Traced) -> None:
    """T3: the step span is current in the worker thread, so a tool's own spans nest under it."""

    def fetch(x: Any) -> Any:
        with traced.tracer.start_as_current_span("http GET"):
            return x

    traced.rt.register_tool("fetch", fetch)
    assert traced.rt.execute(Plan(goal="g", steps=[Step("a", tool="fetch", input=1)])).ok
    inner = traced.one("http GET")
    step = traced.one("journaled.step")
    assert _parent(inner) == _id(step)
    assert _trace(inner) == _trace(step)


def test_a_span_opened_inside_an_async_tool_is_a_child_of_its_step_span(traced: Traced) -> None:
    """T3, A1: an async step's task runs with its step span current: its spans nest under it."""

    async def fetch(x: Any) -> Any:
        await asyncio.sleep(0)
        with traced.tracer.start_as_current_span("http GET"):
            await asyncio.sleep(0)
            return x

    async def agent(step: Step, ctx: AgentContext) -> AgentResult:
        with traced.tracer.start_as_current_span("model call"):
            await asyncio.sleep(0)
        return AgentResult(output="done", calls_used=2)

    traced.rt.register_tool("fetch", fetch)
    traced.rt.register_agent("think", agent)
    plan = Plan(goal="g", steps=[Step("a", tool="fetch", input=1), Step("b", agent="think")])
    assert traced.rt.execute(plan).ok
    step_a = traced.one("journaled.step", **{"journaled.step.id": "a"})
    step_b = traced.one("journaled.step", **{"journaled.step.id": "b"})
    assert _parent(traced.one("http GET")) == _id(step_a)
    assert _parent(traced.one("model call")) == _id(step_b)
    assert _attrs(step_b)["journaled.step.calls"] == 2  # charged what the agent reported (E8)
    assert _attrs(step_b)["gen_ai.agent.name"] == "think"


def test_a_failed_step_has_status_error_with_its_error_and_fails_the_run_span(
    traced: Traced,
) -> None:
    """T3, E4, E11: a failing step's span is ERROR with its error; its dependent is skipped."""

    def boom(x: Any) -> Any:
        raise RuntimeError("the service said no")

    traced.rt.register_tool("boom", boom)
    traced.rt.register_tool("after", lambda x: x)
    plan = Plan(
        goal="g",
        steps=[Step("a", tool="boom", input=1), Step("b", tool="after", depends_on=["a"])],
    )
    result = traced.rt.execute(plan)
    assert not result.ok
    step = traced.one("journaled.step")  # b never ran: it has no step span
    assert step.status.status_code is StatusCode.ERROR
    assert step.status.description == "the service said no"
    assert _attrs(step)["journaled.step.outcome"] == "failed"
    assert [(e.name, dict(e.attributes or {})) for e in step.events] == [
        ("exception", {"exception.message": "the service said no"})
    ]
    skipped = traced.one("journaled.wave", **{"journaled.wave.number": 2})
    assert _attrs(skipped)["journaled.wave.skipped"] == 1
    assert [dict(e.attributes or {}) for e in skipped.events] == [{"journaled.step.ids": ("b",)}]
    run = traced.one("journaled.run")
    assert run.status.status_code is StatusCode.ERROR
    assert run.status.description == "steps failed: a"
    assert _attrs(run)["journaled.run.status"] == "failed"


def test_a_waiting_step_and_its_resumed_run_make_two_linked_run_spans(traced: Traced) -> None:
    """T3, E10, E14: waiting is an outcome, not an error; the resume is a new, linked run span."""

    def ask(step: Step, ctx: AgentContext) -> AgentResult:
        if ctx.answer is None:
            raise NeedsInput("which city?")
        return AgentResult(output=ctx.answer, calls_used=1)

    traced.rt.register_agent("ask", ask)
    first = traced.rt.execute(Plan(goal="g", steps=[Step("q", agent="ask")]))
    assert first.waiting == ["q"]
    second = traced.rt.resume(first.run_id, answers={"q": "Paris"})
    assert isinstance(second, journaled.ExecuteResult)
    assert second.ok
    waiting = traced.one("journaled.step", **{"journaled.step.attempt": 1})
    assert waiting.status.status_code is StatusCode.UNSET
    assert _attrs(waiting)["journaled.step.outcome"] == "waiting"
    assert [e.name for e in waiting.events] == ["journaled.waiting_for_input"]
    passes = traced.spans("journaled.run")
    assert [_attrs(s)["journaled.run.status"] for s in passes] == ["waiting", "completed"]
    assert [_attrs(s)["journaled.run.resumed"] for s in passes] == [False, True]
    assert _attrs(passes[0])["journaled.run.waiting"] == ("q",)
    assert {_attrs(s)["journaled.run.id"] for s in passes} == {first.run_id}
    assert [link.context for link in passes[1].links] == [passes[0].context]
    again = traced.one("journaled.step", **{"journaled.step.attempt": 2})
    assert _parent(again) is not None
    assert _trace(again) == _trace(passes[1])
    assert _attrs(again)["journaled.step.outcome"] == "succeeded"


def test_a_timed_out_step_says_so(traced: Traced) -> None:
    """T3: a step past its deadline ends its span as ERROR with outcome ``timed_out``."""

    def slow(step: Step, ctx: AgentContext) -> AgentResult:
        wait_for(ctx.cancelled, WAIT)  # the deadline sets the step's token
        return AgentResult()

    traced.rt.register_agent("slow", slow)
    result = traced.rt.execute(Plan(goal="g", steps=[Step("s", agent="slow")]), step_timeout=0.2)
    assert result.observations[0].code == "agent-timeout"
    step = traced.one("journaled.step")
    assert step.status.status_code is StatusCode.ERROR
    assert _attrs(step)["journaled.step.outcome"] == "timed_out"
    assert _attrs(step)["journaled.step.code"] == "agent-timeout"
    wait_for(
        lambda: (
            not [r for r in pykka.ActorRegistry.get_all() if r.actor_class.__name__ == "StepWorker"]
        ),
        WAIT,
    )


def test_a_budget_stop_is_an_event_on_the_wave_and_the_run(traced: Traced) -> None:
    """T3, E7: a budget stop names wave, estimate, used and budget on the spans."""
    traced.rt.register_skill("think", lambda x: x)
    plan = Plan(goal="g", steps=[Step("a", skill="think", input=1), Step("b", skill="think")])
    result = traced.rt.execute(plan, call_budget=1)
    assert result.stopped_for_budget
    assert traced.spans("journaled.step") == []
    stop = {
        "journaled.wave.number": 1,
        "journaled.budget.estimate": 2,
        "journaled.budget.used": 0,
        "journaled.budget.limit": 1,
    }
    wave = traced.one("journaled.wave")
    assert _attrs(wave)["journaled.wave.stopped_for_budget"] is True
    assert [(e.name, dict(e.attributes or {})) for e in wave.events] == [
        ("journaled.budget_stop", stop)
    ]
    run = traced.one("journaled.run")
    assert _attrs(run)["journaled.run.status"] == "stopped_for_budget"
    assert _attrs(run)["journaled.run.budget"] == 1
    assert run.status.status_code is StatusCode.UNSET


def test_a_cancelled_run_says_so_on_its_span(traced: Traced) -> None:
    """T3, E5: a cancel is an event on the run span and its status an attribute, not an error."""
    started = threading.Event()

    def hold(step: Step, ctx: AgentContext) -> AgentResult:
        started.set()
        wait_for(ctx.cancelled, WAIT)
        return AgentResult(ok=False, code="cancelled", error="cancelled: the run was aborted")

    traced.rt.register_agent("hold", hold)
    traced.rt.register_tool("later", lambda x: x)
    plan = Plan(
        goal="g", steps=[Step("h", agent="hold"), Step("l", tool="later", depends_on=["h"])]
    )
    handle = traced.rt.start(plan)
    assert started.wait(WAIT)
    assert traced.rt.cancel(handle.run_id)
    result = handle.result(WAIT)
    assert not result.ok
    run = traced.one("journaled.run")
    assert _attrs(run)["journaled.run.status"] == "cancelled"
    assert "journaled.cancel_requested" in [e.name for e in run.events]
    assert run.status.status_code is StatusCode.UNSET
    step = traced.one("journaled.step")
    assert _attrs(step)["journaled.step.outcome"] == "cancelled"


def test_a_child_run_span_is_a_child_of_its_agent_step_span(traced: Traced) -> None:
    """T3, E9: the run started by ``ctx.execute`` nests under the step that started it."""
    traced.rt.register_tool("echo", lambda x: x)

    def parent(step: Step, ctx: AgentContext) -> AgentResult:
        child = ctx.execute(Plan(goal="sub", steps=[Step("x", tool="echo", input=5)]))
        return AgentResult(output=child.observations[0].output, calls_used=0)

    traced.rt.register_agent("parent", parent)
    result = traced.rt.execute(Plan(goal="g", steps=[Step("p", agent="parent")]))
    assert result.ok
    child_id = result.observations[0].agent_task_id
    assert child_id is not None
    step = traced.one("journaled.step", **{"journaled.step.id": "p"})
    child = traced.one("journaled.run", **{"journaled.run.id": child_id})
    assert _parent(child) == _id(step)
    assert _trace(child) == _trace(step)
    assert _attrs(child)["journaled.run.parent_id"] == result.run_id
    assert _attrs(child)["journaled.run.parent_step"] == "p"
    assert _attrs(step)["journaled.step.child_run"] == child_id
    inner = traced.one("journaled.step", **{"journaled.step.id": "x"})
    assert _trace(inner) == _trace(step)


def test_uninstrumented_runs_emit_no_span(sqlite_url: str) -> None:
    """T3: a runtime no longer instrumented emits nothing, even with a global provider set."""
    with journaled.open(sqlite_url) as rt:
        t = Traced(rt)
        rt.register_tool("fetch", lambda x: x)
        journaled.otel.uninstrument(rt)
        assert rt.execute(Plan(goal="g", steps=[Step("a", tool="fetch", input=1)])).ok
    assert t.spans() == []


def test_instrument_without_a_provider_uses_the_global_one(sqlite_url: str) -> None:
    """T3: ``instrument(rt)`` traces through OpenTelemetry's global tracer provider."""
    probe = (
        "import sys\n"
        "import journaled, journaled.otel\n"
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import "
        "InMemorySpanExporter\n"
        "exporter = InMemorySpanExporter()\n"
        "provider = TracerProvider()\n"
        "provider.add_span_processor(SimpleSpanProcessor(exporter))\n"
        "trace.set_tracer_provider(provider)\n"
        "with journaled.open(sys.argv[1]) as rt:\n"
        "    journaled.otel.instrument(rt)\n"
        "    rt.register_tool('t', lambda x: x)\n"
        "    plan = journaled.Plan(goal='g', steps=[journaled.Step('a', tool='t')])\n"
        "    assert rt.execute(plan).ok\n"
        "print(sorted(s.name for s in exporter.get_finished_spans()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, sqlite_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['journaled.run', 'journaled.step', 'journaled.wave']"


NOTHING_IMPORTED = """
import sys
import journaled
assert not [m for m in sys.modules if m.startswith("opentelemetry")], "import journaled"
with journaled.open(sys.argv[1]) as rt:
    rt.register_tool("t", lambda x: x)
    rt.register_agent("a", lambda step, ctx: journaled.AgentResult(output=1))
    plan = journaled.Plan(goal="g", steps=[journaled.Step("x", tool="t", input=1),
                                           journaled.Step("y", agent="a", depends_on=["x"])])
    assert rt.execute(plan).ok
found = sorted(m for m in sys.modules if m.startswith("opentelemetry") or m == "journaled.otel")
print(found)
"""


def test_tracing_off_imports_no_opentelemetry(sqlite_url: str) -> None:
    """T3: ``import journaled`` and a run with tracing off never import opentelemetry."""
    done = subprocess.run(
        [sys.executable, "-c", NOTHING_IMPORTED, sqlite_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_otel_extra_is_declared_and_dev_installs_it() -> None:
    """T3: ``journaled[otel]`` brings the OpenTelemetry API; ``dev`` pulls it and the SDK in."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert [r.split(">")[0] for r in extras["otel"]] == ["opentelemetry-api"]
    assert "journaled[otel]" in extras["dev"]
    assert any(r.startswith("opentelemetry-sdk") for r in extras["dev"])
    assert not any("opentelemetry" in r for r in project["dependencies"])


def test_the_tracer_ends_what_a_stopped_executor_left_open(traced: Traced) -> None:
    """T3: spans a pass left open when its executor stopped end as ERROR, never leak."""
    tracing = journaled.otel.OtelTracing(traced.provider)
    from journaled.events.plans import Plan as EventPlan
    from journaled.events.run_state import RunFold
    from journaled.events.runs import RunStarted, StepStarted, WavePartitioned

    state = RunFold()
    plan = EventPlan(goal="g", steps=[Step("a", tool="t")])
    for event in (
        RunStarted(at=1, run_id="r1", plan=plan),
        WavePartitioned(at=2, wave=1, runnable=("a",)),
        StepStarted(at=3, step_id="a", attempt=1, wave=1),
    ):
        state.fold(event)
        tracing.staged(state, event)
    assert traced.spans() == []
    tracing.settled("r1")
    assert sorted(s.name for s in traced.spans()) == [
        "journaled.run",
        "journaled.step",
        "journaled.wave",
    ]
    step = traced.one("journaled.step")
    assert _attrs(step)["journaled.step.outcome"] == "abandoned"
    assert traced.one("journaled.run").status.status_code is StatusCode.ERROR
    tracing.settled("r1")  # a second settle finds nothing to end
    assert len(traced.spans()) == 3


def test_no_global_provider_is_touched(traced: Traced) -> None:
    """T3: instrumenting with a given provider leaves OpenTelemetry's global provider alone."""
    traced.rt.register_tool("t", lambda x: x)
    assert traced.rt.execute(Plan(goal="g", steps=[Step("a", tool="t")])).ok
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)
    assert len(traced.spans()) == 3


def test_a_run_suspended_by_close_ends_its_span_with_the_step_interrupted(
    sqlite_url: str,
) -> None:
    """T3, R3: closing under a running step ends the pass span ``suspended``, step interrupted."""
    rt = journaled.open(sqlite_url)
    t = Traced(rt)
    handle, _ = suspend_by_close(rt, "h")
    assert handle.result(WAIT).suspended
    run = t.one("journaled.run")
    assert _attrs(run)["journaled.run.status"] == "suspended"
    assert [dict(e.attributes or {}) for e in run.events] == [{"journaled.run.in_flight": ("h",)}]
    assert _attrs(t.one("journaled.step"))["journaled.step.outcome"] == "interrupted"
    wait_for(
        lambda: (
            not [r for r in pykka.ActorRegistry.get_all() if r.actor_class.__name__ == "StepWorker"]
        ),
        WAIT,
    )


def test_a_run_started_inside_a_span_is_its_child(traced: Traced) -> None:
    """T3: ``rt.execute`` called where a span is current (a request's) nests the run under it."""
    traced.rt.register_tool("t", lambda x: x)
    with traced.tracer.start_as_current_span("request") as request:
        result = traced.rt.execute(Plan(goal="g", steps=[Step("a", tool="t")]))
    assert result.ok
    run = traced.one("journaled.run")
    assert _parent(run) == request.get_span_context().span_id
    assert _trace(run) == request.get_span_context().trace_id
    again = traced.rt.execute(Plan(goal="g", steps=[Step("a", tool="t")]))
    assert _parent(traced.one("journaled.run", **{"journaled.run.id": again.run_id})) is None


def test_an_asyncio_runtime_traces_its_runs_under_the_callers_span(sqlite_url: str) -> None:
    """T3, A1: ``instrument`` takes an asyncio runtime; ``await rt.execute`` keeps the span."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("an app")

    async def main() -> tuple[str, int]:
        async with journaled.aio.open(sqlite_url) as rt:
            journaled.otel.instrument(rt, tracer_provider=provider)
            rt.register_tool("t", lambda x: x)
            with tracer.start_as_current_span("request") as request:
                result = await rt.execute(Plan(goal="g", steps=[Step("a", tool="t")]))
            assert result.ok
            return result.run_id, request.get_span_context().span_id

    run_id, request_id = asyncio.run(main())
    runs = [s for s in exporter.get_finished_spans() if s.name == "journaled.run"]
    assert [_attrs(s)["journaled.run.id"] for s in runs] == [run_id]
    assert _parent(runs[0]) == request_id


def test_each_retried_attempt_has_its_own_failed_step_span(traced: Traced) -> None:
    """T3, S2: a failed attempt retried under its policy ends its own span as ERROR, outcome
    retrying; the next attempt's span succeeds."""
    calls: list[int] = []

    def flaky(x: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("try again")
        return x

    traced.rt.register_tool("flaky", flaky, retry=journaled.Retry(attempts=2))
    result = traced.rt.execute(Plan(goal="g", steps=[Step("a", tool="flaky", input=1)]))
    assert result.ok
    first = traced.one("journaled.step", **{"journaled.step.attempt": 1})
    second = traced.one("journaled.step", **{"journaled.step.attempt": 2})
    assert first.status.status_code is StatusCode.ERROR
    assert first.status.description == "try again"
    assert _attrs(first)["journaled.step.outcome"] == "retrying"
    assert second.status.status_code is StatusCode.OK
