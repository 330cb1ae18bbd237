"""Spans never hold an append (SPEC T3, R4; ADR 0070), and their edges: orchestrations inside a
span, resumed passes' numbers and budgets, a run under way when tracing is turned off."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import journaled
import journaled.otel
from journaled import AgentContext, AgentResult, NeedsInput, Plan, Step
from journaled.events.base import Pending
from journaled.events.catalog import codec
from journaled.events.journal import Journal
from journaled.events.runs import RunHeartbeat, RunResumed
from journaled.events.url import parse_url
from journaled.testing import wait_for

WAIT = 10.0


class Traced:
    """A runtime's spans, through a real SDK provider and an in-memory exporter."""

    def __init__(self, rt: journaled.Runtime) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("the application")
        journaled.otel.instrument(rt, tracer_provider=self.provider)

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]


def first_pass_fails() -> tuple[Callable[[object], str], Callable[..., Plan]]:
    """A tool ``flaky`` failing its first call only, and a planner of one step of it: an
    orchestration of two passes."""
    calls: list[int] = []

    def flaky(_: object) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the first pass fails")
        return "ok"

    def planner(goal: str, observations: object, clarifications: object) -> Plan:
        return Plan(goal=goal, steps=[Step("a", tool="flaky")])

    return flaky, planner


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _ids(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return int(span.context.trace_id), int(span.context.span_id)


class _Hanging(SpanExporter):
    """A synchronous exporter whose collector does not answer until the test lets it go; then
    it keeps what it was given."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0
        self.kept = InMemorySpanExporter()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        self.release.wait(WAIT)
        return self.kept.export(spans)

    def shutdown(self) -> None:
        self.release.set()


def _times(span: ReadableSpan) -> tuple[int, int]:
    start, end = span.start_time, span.end_time
    assert start is not None
    assert end is not None
    return start, end


def _kinds(url: str, run_id: str) -> list[str]:
    reader = Journal(parse_url(url), codec(), create=False)
    try:
        return [e.kind for e in reader.stream(run_id)]
    finally:
        reader.close()


def test_a_hanging_span_exporter_never_holds_a_step_result_out_of_the_journal(
    sqlite_url: str,
) -> None:
    """T3/R4/ADR 0070: a finished step's result is in the journal while a synchronous span
    exporter hangs.

    Spans used to be derived as events were staged, before their append, and a step's span was
    ended there: the SDK's ``SimpleSpanProcessor`` exports inline when a span ends, so while the
    collector did not answer the step's ``run.step-succeeded`` was never appended. Spans are now
    derived once the append commits, and ended on the tracer's own thread.
    """
    exporter = _Hanging()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    returned = threading.Event()

    def tool(_: object) -> str:
        returned.set()
        return "the result"

    rt = journaled.open(sqlite_url)
    try:
        journaled.otel.instrument(rt, tracer_provider=provider)
        rt.register_tool("t", tool)
        handle = rt.start(Plan(goal="g", steps=[Step("a", tool="t")]))
        assert returned.wait(WAIT)
        deadline = time.monotonic() + 2.0
        kinds: list[str] = []
        while time.monotonic() < deadline:
            kinds = _kinds(sqlite_url, handle.run_id)
            if "run.step-succeeded" in kinds:
                break
            time.sleep(0.02)
        exporter.release.set()
        assert handle.result(WAIT).ok
        assert "run.step-succeeded" in kinds, kinds
    finally:
        exporter.release.set()
        rt.close()


def test_an_exporter_that_never_answers_costs_one_bounded_wait(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T3/R4/ADR 0070: behind a collector that never answers, every run completes with all of
    its events journaled; the first run's end waits for its spans a bounded time, later runs
    not at all, and the runtime closes promptly.

    An executor used to sit in the exporter until it answered: the run never completed and the
    close never returned.
    """
    monkeypatch.setattr(journaled.otel, "SETTLE_WAIT", 3.0)
    exporter = _Hanging()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rt = journaled.open(sqlite_url)
    try:
        journaled.otel.instrument(rt, tracer_provider=provider)
        rt.register_tool("ok", lambda x: x)
        plan = Plan(goal="g", steps=[Step("a", tool="ok"), Step("b", tool="ok", depends_on=["a"])])
        began = time.monotonic()
        first = rt.execute(plan)
        first_took = time.monotonic() - began
        began = time.monotonic()
        second = rt.execute(plan)
        second_took = time.monotonic() - began
        assert first.ok
        assert second.ok
        for result in (first, second):
            kinds = [e.kind for e in rt.runs.history(result.run_id)]
            assert kinds.count("run.step-succeeded") == 2
            assert kinds[-1] == "run.finished"
        assert exporter.calls == 1  # the first span's export hangs; nothing else got through
        assert 2.5 < first_took < 3.0 + 5.0
        assert second_took < 1.5
        began = time.monotonic()
        rt.close()
        assert time.monotonic() - began < 1.5
    finally:
        exporter.release.set()
        rt.close()
        provider.shutdown()


def test_span_ends_past_the_bound_are_dropped_and_the_run_goes_on(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T3/ADR 0070: span ends waiting for a collector that does not answer are bounded; the
    ones past the bound are dropped (never exported), the run is not held."""
    monkeypatch.setattr(journaled.otel, "ENDS_QUEUED", 4)
    monkeypatch.setattr(journaled.otel, "SETTLE_WAIT", 0.2)
    exporter = _Hanging()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    steps = [Step(f"s{i}", tool="ok", depends_on=[f"s{i - 1}"] if i else []) for i in range(20)]
    with journaled.open(sqlite_url) as rt:
        journaled.otel.instrument(rt, tracer_provider=provider)
        rt.register_tool("ok", lambda x: x)
        result = rt.execute(Plan(goal="g", steps=steps))
        assert result.ok
        assert [e.kind for e in rt.runs.history(result.run_id)].count("run.step-succeeded") == 20
        exporter.release.set()
        # a run's end waits for the ends handed over before: the first run's are all done
        assert rt.execute(Plan(goal="g", steps=[Step("a", tool="ok")])).ok

    def kept() -> list[Any]:
        return [
            s
            for s in exporter.kept.get_finished_spans()
            if _attrs(s)["journaled.run.id"] == result.run_id
        ]

    # 1 run span + 20 waves + 20 steps: the ends in the thread's hands when the export hung,
    # and those queued behind them, are exported (on a loaded machine, after the run's end
    # stopped waiting for them); the rest were dropped. The queue takes whole hand-overs (a
    # step's end with its wave's, 2 or 3 ends), so it holds 2 to 4 when the next overflows it.
    wait_for(lambda: len(kept()) >= 1 + 2, WAIT)
    provider.shutdown()
    assert 1 + 2 <= len(kept()) <= 4 + 4


def test_span_times_are_the_events_times_not_when_the_spans_were_exported(
    sqlite_url: str,
) -> None:
    """T3/ADR 0070: a span starts and ends at the times its events were staged, though it is
    derived after their append and ended on another thread, later: spans ended while the
    exporter hung end before it was let go; a tool's own span lies within its step's."""
    exporter = _Hanging()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tools = InMemorySpanExporter()  # the tool's provider: its span is exported in its thread
    tools_provider = TracerProvider()
    tools_provider.add_span_processor(SimpleSpanProcessor(tools))
    tracer = tools_provider.get_tracer("a tool")
    returned = threading.Event()

    def tool(_: object) -> str:
        with tracer.start_as_current_span("http GET"):
            time.sleep(0.01)
        returned.set()
        return "the result"

    with journaled.open(sqlite_url) as rt:
        journaled.otel.instrument(rt, tracer_provider=provider)
        rt.register_tool("t", tool)
        handle = rt.start(Plan(goal="g", steps=[Step("a", tool="t")]))
        assert returned.wait(WAIT)
        deadline = time.monotonic() + 2.0
        while "run.finished" not in _kinds(sqlite_url, handle.run_id):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.05)
        released_at = time.time_ns()
        exporter.release.set()
        assert handle.result(WAIT).ok
    spans = {s.name: s for s in exporter.kept.get_finished_spans()}
    [client] = tools.get_finished_spans()
    step = spans[journaled.otel.STEP_SPAN]
    wave, run = spans[journaled.otel.WAVE_SPAN], spans[journaled.otel.RUN_SPAN]
    for span in (step, wave, run):  # ended by the tracer's thread after the release
        assert _times(span)[1] < released_at
    assert _times(run)[0] <= _times(step)[0] < _times(client)[0]
    assert _times(client)[1] < _times(step)[1] <= _times(run)[1]


def test_a_span_says_only_what_the_journal_holds(sqlite_url: str) -> None:
    """T3/R5/ADR 0070: a step whose result the journal refused (another writer took the run's
    next version) has no succeeded span: it ends abandoned, as an ERROR, and so does its run.

    Spans used to be derived as events were staged: the step's span ended succeeded and the
    run's completed, for events that were never appended.
    """
    inside = threading.Event()
    gate = threading.Event()

    def hold(_: object) -> int:
        inside.set()
        gate.wait(WAIT)
        return 1

    with journaled.open(sqlite_url) as rt:
        t = Traced(rt)
        rt.register_tool("hold", hold)
        handle = rt.start(Plan(goal="g", steps=[Step("a", tool="hold")]))
        assert inside.wait(WAIT)
        other = Journal(parse_url(sqlite_url), codec(), create=False)
        try:
            version = other.stream(handle.run_id)[-1].version
            other.append(
                [
                    Pending(
                        stream=handle.run_id,
                        version=version + 1,
                        data=RunHeartbeat(at=1, owner="another process"),
                    )
                ]
            )
        finally:
            other.close()
        gate.set()
        with pytest.raises(journaled.RunOwnedElsewhere):
            handle.result(WAIT)
        assert "run.step-succeeded" not in [e.kind for e in rt.runs.history(handle.run_id)]
    [step] = t.spans(journaled.otel.STEP_SPAN)
    [run] = t.spans(journaled.otel.RUN_SPAN)
    assert _attrs(step)["journaled.step.outcome"] == "abandoned"
    assert step.status.status_code is StatusCode.ERROR
    assert run.status.status_code is StatusCode.ERROR
    assert "journaled.run.status" not in _attrs(run)


def test_an_orchestration_started_inside_a_span_nests_every_pass_under_it() -> None:
    """T3/ADR 0038/ADR 0070: every pass of ``rt.orchestrate`` called where a span is current is
    a run span in that span's trace, its child.

    The passes used to be started from the orchestrator actor's thread, whose context held no
    span, and each pass's run span was the root of a trace of its own. The caller's context is
    now copied where the orchestration is started (or resumed), and its passes start in it.
    """
    flaky, planner = first_pass_fails()
    with journaled.open("memory://") as rt:
        t = Traced(rt)
        rt.register_tool("flaky", flaky)
        with t.tracer.start_as_current_span("request") as request:
            out = rt.orchestrate("g", planner, mode="orchestrate")
        assert out.status == "completed"
    runs = t.spans(journaled.otel.RUN_SPAN)
    assert len(runs) == 2  # one per pass
    trace_id = request.get_span_context().trace_id
    assert [_ids(s)[0] for s in runs] == [trace_id, trace_id]
    assert [s.parent.span_id if s.parent else None for s in runs] == [
        request.get_span_context().span_id
    ] * 2


def test_an_orchestration_resumed_inside_a_span_nests_its_pass_under_that_span() -> None:
    """T3/O3/ADR 0070: the pass an orchestration's resume starts is a child of the span current
    where ``resume`` was called, not of the one it was started under."""

    def planner(goal: str, observations: object, clarifications: object) -> Plan:
        return Plan(
            goal=goal,
            steps=[Step("a", skill="think"), Step("b", skill="think", depends_on=["a"])],
        )

    with journaled.open("memory://") as rt:
        t = Traced(rt)
        rt.register_skill("think", lambda _: "thought")
        with t.tracer.start_as_current_span("first request"):
            out = rt.orchestrate("g", planner, call_budget=1)
        assert out.status == "waiting_for_budget"
        with t.tracer.start_as_current_span("second request") as second:
            resumed = rt.resume(out.run_id, call_budget=5)
        assert isinstance(resumed, journaled.Outcome)
        assert resumed.status == "completed"
    [run] = t.spans(journaled.otel.RUN_SPAN)
    assert run.parent is not None
    assert run.parent.span_id == second.get_span_context().span_id
    assert _ids(run)[0] == second.get_span_context().trace_id


def test_a_planners_own_spans_nest_under_the_span_the_orchestration_was_called_in() -> None:
    """T3/O4/ADR 0070: a span the planner opens (a model call, say) is a child of the span
    current where ``rt.orchestrate`` was called, and once a resume asks it again, of the one
    current where ``resume`` was called.

    The planner ran in its worker's thread with an empty context, so each of its spans was the
    root of a trace of its own.
    """
    t: Traced | None = None
    planned: list[tuple[int, int | None]] = []

    def planner(goal: str, observations: object, clarifications: list[Any]) -> object:
        assert t is not None
        with t.tracer.start_as_current_span("planner's model call") as span:
            parent = span.parent  # type: ignore[attr-defined]
            planned.append((span.get_span_context().trace_id, parent.span_id if parent else None))
        if not clarifications:
            return journaled.Clarify("which region?")
        return Plan(goal=goal, steps=[Step("a", skill="think")])

    with journaled.open("memory://") as rt:
        t = Traced(rt)
        rt.register_skill("think", lambda _: "thought")
        with t.tracer.start_as_current_span("first request") as first:
            out = rt.orchestrate("g", planner)
        assert out.status == "waiting_for_clarification"
        with t.tracer.start_as_current_span("second request") as second:
            resumed = rt.resume(out.run_id, clarification="eu", planner=planner)
        assert isinstance(resumed, journaled.Outcome)
        assert resumed.status == "completed"

    def where(span: Any) -> tuple[int, int]:
        return span.get_span_context().trace_id, span.get_span_context().span_id

    assert planned == [where(first), where(second)]


def test_each_resumed_pass_span_counts_its_own_resumption() -> None:
    """T3/E14/ADR 0070: ``journaled.run.resumptions`` on a resumed pass's run span is that
    pass's ``run.resumed`` number, whether the resume gave answers, a budget or neither.

    It used to be read from the run's state when the pass's first event was seen; a resume
    stages its answers and its budget before ``run.resumed``, so those passes said one less
    (the first resume with answers said 0, like no resume at all).
    """

    def ask(_: Step, ctx: AgentContext) -> AgentResult:
        if ctx.answer is None:
            raise NeedsInput("which one?")
        return AgentResult(output=ctx.answer, calls_used=0)

    with journaled.open("memory://") as rt:
        t = Traced(rt)
        rt.register_agent("ask", ask)
        rt.register_skill("think", lambda _: "thought")
        first = rt.execute(
            Plan(
                goal="g",
                steps=[
                    Step("q", agent="ask"),
                    Step("t1", skill="think", depends_on=["q"]),
                    Step("t2", skill="think", depends_on=["t1"]),
                ],
            ),
            call_budget=1,
        )
        assert first.waiting == ["q"]
        rt.resume(first.run_id, answers={"q": "that one"})  # resumption 1: stops for budget
        rt.resume(first.run_id)  # resumption 2: still no budget
        rt.resume(first.run_id, call_budget=5)  # resumption 3: completes
        resumed = [
            e.data.resumption
            for e in rt.runs.history(first.run_id)
            if isinstance(e.data, RunResumed)
        ]
    assert resumed == [1, 2, 3]
    passes = t.spans(journaled.otel.RUN_SPAN)
    assert [_attrs(s).get("journaled.run.resumptions") for s in passes] == [None, 1, 2, 3]


def test_a_resumed_pass_span_names_the_budget_its_resume_raised_to() -> None:
    """T3/E14/ADR 0070: ``journaled.run.budget`` on each pass's run span is the budget that
    pass runs under: the one a resume's ``call_budget`` raised it to.

    Every pass used to name the budget the run started with, so a run resumed with 5 after a
    budget stop at 1 showed budget 1 and 3 calls used: over budget by the trace, within it by
    the journal.
    """
    with journaled.open("memory://") as rt:
        t = Traced(rt)
        rt.register_skill("think", lambda _: "thought")
        plan = Plan(
            goal="g",
            steps=[
                Step("a", skill="think"),
                Step("b", skill="think", depends_on=["a"]),
                Step("c", skill="think", depends_on=["b"]),
            ],
        )
        first = rt.execute(plan, call_budget=1)
        assert first.stopped_for_budget
        second = rt.resume(first.run_id, call_budget=5)
        assert isinstance(second, journaled.ExecuteResult)
        assert second.ok
        assert rt.runs.state(first.run_id).budget == 5
    passes = t.spans(journaled.otel.RUN_SPAN)
    assert [_attrs(s).get("journaled.run.budget") for s in passes] == [1, 5]


def _two_steps(rt: journaled.Runtime, t: Traced, between: Any) -> ReadableSpan:
    """Run a: hold, then b: a tool opening its own span; call ``between`` while a holds.
    Return b's tool's span, checked to be a child of b's step span."""
    inside = threading.Event()
    gate = threading.Event()

    def hold(_: object) -> int:
        inside.set()
        gate.wait(WAIT)
        return 1

    def http(_: object) -> int:
        with t.tracer.start_as_current_span("http GET"):
            return 2

    rt.register_tool("hold", hold)
    rt.register_tool("http", http)
    handle = rt.start(
        Plan(goal="g", steps=[Step("a", tool="hold"), Step("b", tool="http", depends_on=["a"])])
    )
    assert inside.wait(WAIT)
    between()
    gate.set()
    assert handle.result(WAIT).ok
    [step_b] = [
        s for s in t.spans(journaled.otel.STEP_SPAN) if _attrs(s)["journaled.step.id"] == "b"
    ]
    [client] = t.spans("http GET")
    assert client.parent is not None
    assert client.parent.span_id == _ids(step_b)[1]
    return client


def test_a_run_under_way_when_uninstrumented_keeps_nesting_its_tools_spans() -> None:
    """T3/ADR 0070: after ``journaled.otel.uninstrument(rt)``, a run under way keeps its step
    spans and its tools' own spans still nest under them.

    The step worker used to look ``services.tracing`` up afresh for every step, which
    ``uninstrument`` had set to None: the run's later steps had spans (its executor kept its
    tracer) but none was current while they ran, and a tool's span was a root of its own. A
    worker now uses the tracer that traces the step's run.
    """
    with journaled.open("memory://") as rt:
        t = Traced(rt)
        _two_steps(rt, t, lambda: journaled.otel.uninstrument(rt))
        rt.register_tool("t", lambda x: x)
        assert rt.execute(Plan(goal="g", steps=[Step("c", tool="t")])).ok
    assert [_attrs(s)["journaled.step.id"] for s in t.spans(journaled.otel.STEP_SPAN)] == [
        "a",
        "b",
    ]  # a run started after uninstrument has none


def test_a_run_under_way_when_instrumented_again_keeps_its_tracer() -> None:
    """T3/ADR 0070: instrumenting a runtime again, with another provider, while a run is under
    way leaves that run's steps in the spans of the tracer it started with."""
    with journaled.open("memory://") as rt:
        t = Traced(rt)
        other = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(other))
        _two_steps(rt, t, lambda: journaled.otel.instrument(rt, tracer_provider=provider))
    assert other.get_finished_spans() == ()
