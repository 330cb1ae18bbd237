"""Steps on Ray and spans of runs under faults (SPEC S1, S2, T3): workers lost at each point of
a step, cancel, timeouts and close with steps on Ray, odd resources, retried attempts' charges;
spans on resume, fork, cancel, orchestration, asyncio, child runs, a provider set late, failing
exporters, and no span left open.

The Ray cluster is the session's (the ``ray_address`` fixture of conftest).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import ray
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from test_otel import suspend_by_close
from test_ray import _alive, _pid, pid_then_sleep
from test_tracing_edges import first_pass_fails

import journaled
import journaled.aio
import journaled.otel
from journaled import Limits, Plan, Retry, Step
from journaled.events.runs import StepRetrying
from journaled.ray import RaySteps
from journaled.testing import wait_for

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

WAIT = 60.0


@pytest.fixture
def steps(ray_address: str) -> RaySteps:
    """A placement on the session's cluster (already connected: it never shuts it down)."""
    return RaySteps()


def echo(value: Any) -> Any:
    """Return the input."""
    return value


def _die_now() -> Any:
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(10)


class _KillsWhereLoaded:
    """A step function that kills the process unpickling it: a worker lost loading the step."""

    def __reduce__(self) -> Any:
        return (_die_now, ())

    def __call__(self, value: Any) -> Any:
        return value


def exits(value: Any) -> Any:
    """Leave the worker process at once, as a library calling os._exit would."""
    os._exit(int(value))


# -- Ray: a worker lost at each point of a step ---------------------------------------------------


def test_a_worker_lost_while_loading_the_step_fails_it_naming_the_loss(
    steps: RaySteps, sqlite_url: str
) -> None:
    """S2: a worker that dies while it loads the step's function fails that step, lost."""
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("dies", _KillsWhereLoaded())
        rt.register_tool("echo", echo)
        result = rt.execute(
            Plan(goal="g", steps=[Step("a", tool="dies"), Step("b", tool="echo", input=1)])
        )
        after = rt.execute(Plan(goal="g", steps=[Step("c", tool="echo", input=2)]))
    errors = {o.step_id: o.error or "" for o in result.observations}
    assert errors["a"].startswith("lost: the Ray worker running step 'a' died"), errors
    assert errors["b"] == ""
    assert after.ok


def test_a_worker_leaving_by_os_exit_fails_its_step_naming_the_loss(
    steps: RaySteps, sqlite_url: str
) -> None:
    """S2: user code ending its worker process (os._exit) fails the step, lost."""
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("exits", exits)
        result = rt.execute(Plan(goal="g", steps=[Step("a", tool="exits", input=0)]))
    error = result.observations[0].error or ""
    assert error.startswith("lost: the Ray worker running step 'a' died"), error


def test_a_worker_killed_under_an_agent_is_charged_as_a_local_attempt_that_failed(
    steps: RaySteps, sqlite_url: str, tmp_path: Path
) -> None:
    """S2, E8: a lost agent attempt retried is charged as an agent attempt that failed
    without reporting is locally; the retry's report is charged on top."""
    pid_file = tmp_path / "pid"
    second = tmp_path / "tried"

    def agent(step: Step, ctx: Any) -> journaled.AgentResult:
        if second.exists():
            return journaled.AgentResult(ok=True, output="again", calls_used=1)
        second.write_text("x")
        if step.input == "local":
            raise RuntimeError("first attempt fails")
        pid_file.write_text(str(os.getpid()))
        time.sleep(60)
        return journaled.AgentResult(ok=True, output="slept", calls_used=1)

    def charges(rt: journaled.Runtime, run_id: str) -> list[int]:
        return [e.data.charged for e in rt.runs.history(run_id) if hasattr(e.data, "charged")]

    plan = Plan(goal="g", steps=[Step("s", agent="a")])
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_agent("a", agent, retry=Retry(attempts=2, backoff=0.1))
        handle = rt.start(plan, call_budget=10)
        os.kill(_pid(pid_file), signal.SIGKILL)
        on_ray = handle.result(timeout=WAIT)
        ray_charges = charges(rt, on_ray.run_id)
    second.unlink()
    with journaled.open(f"sqlite:///{tmp_path / 'local.sqlite'}") as rt:
        rt.register_agent("a", agent, retry=Retry(attempts=2, backoff=0.1))
        local = rt.execute(
            Plan(goal="g", steps=[Step("s", agent="a", input="local")]), call_budget=10
        )
        local_charges = charges(rt, local.run_id)
    assert on_ray.ok, on_ray.observations
    assert local.ok, local.observations
    assert ray_charges == local_charges
    assert on_ray.calls_used == local.calls_used


# -- Ray: cancel, timeout, close ----------------------------------------------------------------


def test_a_cancel_of_a_step_queued_on_ray_ends_the_run_at_once(
    steps: RaySteps, sqlite_url: str, tmp_path: Path
) -> None:
    """S1, E5: of two steps that each need the one unit of a resource, Ray runs one and queues
    the other (whichever it picks); a cancel ends both, the queued one included, at once."""
    pid_files = {i: tmp_path / f"pid-{i}" for i in ("a", "b")}
    special = {"resources": {"special": 1}}
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("sleep", pid_then_sleep, resources=special)
        handle = rt.start(
            Plan(
                goal="g",
                steps=[
                    Step(i, tool="sleep", input={"pid_file": str(pid_files[i])}) for i in pid_files
                ],
            ),
            max_parallel_steps=2,
        )
        wait_for(lambda: any(f.exists() for f in pid_files.values()), 60)
        time.sleep(0.5)
        running = [i for i, f in pid_files.items() if f.exists()]
        assert len(running) == 1, running  # the other waits for the resource
        pid = _pid(pid_files[running[0]])
        began = time.monotonic()
        rt.cancel(handle.run_id)
        result = handle.result(timeout=WAIT)
        took = time.monotonic() - began
    codes = {o.step_id: o.code for o in result.observations}
    assert codes == {"a": "cancelled", "b": "cancelled"}, result.observations
    assert took < 15
    wait_for(lambda: not _alive(pid), 30)


def test_a_timed_out_ray_step_is_retried_and_its_second_attempt_counts(
    steps: RaySteps, sqlite_url: str, tmp_path: Path
) -> None:
    """S1, S2, E*: a step past its timeout on Ray is retried per its policy; the late end of
    the first task (force-cancelled) does not disturb the second attempt."""
    pid_file = tmp_path / "pid"
    value = {"pid_file": str(pid_file), "second": str(tmp_path / "tried")}
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("sleep", pid_then_sleep, retry=Retry(attempts=2, backoff=0.1))
        result = rt.execute(
            # Long enough for a new Ray worker to start the second attempt on a loaded machine
            # (the first attempt's was killed by the cancel); the first sleeps for a minute.
            Plan(goal="g", steps=[Step("a", tool="sleep", input=value)]),
            step_timeout=10,
        )
        events = [e.data for e in rt.runs.history(result.run_id)]
    assert result.ok, result.observations
    assert result.observations[0].output == "second attempt"
    retrying = [e for e in events if isinstance(e, StepRetrying)]
    assert [r.observation.error for r in retrying] == ["timed out after 10.0s"]
    wait_for(lambda: not _alive(int(pid_file.read_text())), 30)


def test_close_with_a_step_on_ray_suspends_the_run_stops_the_task_and_resume_finishes_it(
    steps: RaySteps, sqlite_url: str, tmp_path: Path
) -> None:
    """S1, R3: closing the runtime while a step runs on Ray suspends the run; the task does not
    run on for nothing, and a new runtime resumes the run to its end."""
    pid_file = tmp_path / "pid"
    value = {"pid_file": str(pid_file), "second": str(tmp_path / "tried")}
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("sleep", pid_then_sleep)
        handle = rt.start(Plan(goal="g", steps=[Step("a", tool="sleep", input=value)]))
        pid = _pid(pid_file)
        began = time.monotonic()
    closing = time.monotonic() - began
    assert closing < 20
    with journaled.open(sqlite_url, steps=steps) as rt:
        assert [r.status for r in rt.runs.list() if r.run_id == handle.run_id] == ["suspended"]
        rt.register_tool("sleep", pid_then_sleep)
        result = rt.resume(handle.run_id)
    assert isinstance(result, journaled.ExecuteResult)
    assert result.ok, result.observations
    assert result.observations[0].output == "second attempt"
    wait_for(lambda: not _alive(pid), 30)


# -- Ray: resources of odd shapes ---------------------------------------------------------------


@pytest.mark.parametrize(
    "resources",
    [
        {"num_cpus": 1e300},
        {"num_cpus": 10**30},
        {"memory": 10**30},
        {"num_gpus": 1.5},
        {"num_cpus": 0.00001},
        {"resources": {"": 1}},
        {"resources": {"no such thing": 2**70}},
        {"resources": {"special": 0.5, "CPU": 1}},
    ],
)
def test_odd_resources_end_the_step_never_hang_it(
    steps: RaySteps, sqlite_url: str, resources: dict[str, Any]
) -> None:
    """S1, E11: odd amounts or names end the step (run or fail, named) in bounded time."""
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("odd", echo, resources=resources)
        handle = rt.start(Plan(goal="g", steps=[Step("a", tool="odd", input=1)]))
        result = handle.result(timeout=30)
    obs = result.observations[0]
    assert obs.ok or "step 'a'" in (obs.error or ""), obs


@pytest.mark.parametrize(
    "resources",
    [{"num_cpus": -1}, {"resources": {"x": -1}}, {"num_gpus": float("nan")}, {"memory": True}],
)
def test_negative_or_non_numbers_are_refused_at_registration(
    steps: RaySteps, sqlite_url: str, resources: dict[str, Any]
) -> None:
    """S1: a registration asking a negative or non-number amount is refused, named."""
    with journaled.open(sqlite_url, steps=steps) as rt, pytest.raises(ValueError, match="odd"):
        rt.register_tool("odd", echo, resources=resources)


def test_budget_charges_each_retried_skill_attempt_on_ray_as_locally(
    steps: RaySteps, sqlite_url: str, tmp_path: Path
) -> None:
    """E8, S2: a skill failing then succeeding under Retry is charged per attempt, the same on
    Ray as locally, and the budget stops what does not fit."""
    marks = tmp_path / "marks"
    marks.mkdir()

    def flaky(value: Any) -> Any:
        mark = marks / str(value)
        if not mark.exists():
            mark.write_text("x")
            raise RuntimeError("first attempt fails")
        return value

    plan = Plan(goal="g", steps=[Step("a", skill="s", input="ray")])
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_skill("s", flaky, retry=Retry(attempts=2, backoff=0.05))
        on_ray = rt.execute(plan, call_budget=5)
    with journaled.open(f"sqlite:///{tmp_path / 'local.sqlite'}") as rt:
        rt.register_skill("s", flaky, retry=Retry(attempts=2, backoff=0.05))
        local = rt.execute(
            Plan(goal="g", steps=[Step("a", skill="s", input="local")]), call_budget=5
        )
    assert on_ray.ok
    assert local.ok
    assert on_ray.calls_used == local.calls_used == 2


def test_a_timed_out_step_answering_late_is_still_retried_locally(sqlite_url: str) -> None:
    """S2, E*: a step past its timeout whose code answers the cancel before the backoff ends
    is retried per its policy; that late answer of the first attempt is not its result."""
    attempts: list[int] = []

    def slow_first(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        attempts.append(1)
        if len(attempts) == 1:
            wait_for(ctx.cancelled, WAIT)
            return journaled.AgentResult(ok=False, code="cancelled", error="late", calls_used=0)
        return journaled.AgentResult(output="second attempt", calls_used=0)

    with journaled.open(sqlite_url) as rt:
        rt.register_agent("t", slow_first, retry=Retry(attempts=2, backoff=0.5))
        result = rt.execute(Plan(goal="g", steps=[Step("a", agent="t")]), step_timeout=0.3)
    assert result.ok, result.observations
    assert result.observations[0].output == "second attempt"


# -- tracing (T3) -------------------------------------------------------------------------------


class _Open(SpanProcessor):
    """Count the spans started and not yet ended."""

    def __init__(self) -> None:
        self.open: dict[int, str] = {}
        self._lock = threading.Lock()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        with self._lock:
            self.open[span.context.span_id] = span.name

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            assert span.context is not None
            self.open.pop(span.context.span_id, None)


class _Raising(SpanExporter):
    """An exporter that fails every export with an exception."""

    def export(self, spans: Any) -> SpanExportResult:
        raise RuntimeError("the collector is down")

    def shutdown(self) -> None:
        return None


class _RaisingProcessor(SpanProcessor):
    """A span processor failing where it is told to."""

    def __init__(self, where: str) -> None:
        self.where = where

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.where == "start":
            raise RuntimeError("on_start failed")

    def on_end(self, span: ReadableSpan) -> None:
        if self.where == "end":
            raise RuntimeError("on_end failed")


class Traced:
    """An SDK provider with an in-memory exporter and a count of open spans."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.opened = _Open()
        self.provider = TracerProvider()
        self.provider.add_span_processor(self.opened)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def no_span_left_open(self) -> None:
        try:
            wait_for(lambda: not self.opened.open, 5)
        except TimeoutError:
            raise AssertionError(f"spans left open: {self.opened.open}") from None


def _a(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _sid(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def test_a_cancelled_step_span_is_not_an_error(sqlite_url: str) -> None:
    """T3, ADR 0038: "waiting, cancelled, budget stop and suspended are not errors": a step
    cancelled with its run has outcome ``cancelled`` and no ERROR status."""
    t = Traced()
    started = threading.Event()

    def hold(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        started.set()
        wait_for(ctx.cancelled, WAIT)
        return journaled.AgentResult(ok=False, code="cancelled", error="cancelled: aborted")

    with journaled.open(sqlite_url) as rt:
        journaled.otel.instrument(rt, tracer_provider=t.provider)
        rt.register_agent("hold", hold)
        handle = rt.start(Plan(goal="g", steps=[Step("h", agent="hold")]))
        assert started.wait(WAIT)
        rt.cancel(handle.run_id)
        handle.result(WAIT)
    t.no_span_left_open()
    (step,) = t.spans(journaled.otel.STEP_SPAN)
    assert _a(step)["journaled.step.outcome"] == "cancelled"
    assert step.status.status_code is not StatusCode.ERROR


def test_a_run_cancelled_mid_wave_on_ray_ends_every_span(
    steps: RaySteps, sqlite_url: str, tmp_path: Path
) -> None:
    """T3, S1, E5: a run cancelled while one step runs on Ray and another waits for its cap
    ends its run, wave and step spans; the step's span says cancelled."""
    t = Traced()
    pid_file = tmp_path / "pid"
    with journaled.open(sqlite_url, steps=steps) as rt:
        journaled.otel.instrument(rt, tracer_provider=t.provider)
        rt.register_tool("sleep", pid_then_sleep)
        handle = rt.start(
            Plan(
                goal="g",
                steps=[
                    Step("a", tool="sleep", input={"pid_file": str(pid_file)}),
                    Step("b", tool="sleep", input={"pid_file": str(tmp_path / "b")}),
                ],
            ),
            limits=Limits(per_tool={"sleep": 1}),
        )
        _pid(pid_file)
        rt.cancel(handle.run_id)
        result = handle.result(WAIT)
    assert not result.ok
    t.no_span_left_open()
    (run,) = t.spans(journaled.otel.RUN_SPAN)
    assert _a(run)["journaled.run.status"] == "cancelled"
    steps_ = t.spans(journaled.otel.STEP_SPAN)
    assert [_a(s)["journaled.step.outcome"] for s in steps_] == ["cancelled"]
    assert [s.status.status_code for s in steps_] == [StatusCode.UNSET]
    assert all(s.parent is not None and s.parent.span_id == _sid(run) for s in steps_)


def test_a_lost_ray_worker_makes_a_failed_step_span_and_a_retried_one(
    steps: RaySteps, sqlite_url: str, tmp_path: Path
) -> None:
    """T3, S2: the attempt whose worker was killed ends its span ERROR naming the loss, outcome
    retrying; the second attempt's span succeeds; both are children of the run span."""
    t = Traced()
    pid_file = tmp_path / "pid"
    value = {"pid_file": str(pid_file), "second": str(tmp_path / "tried")}
    with journaled.open(sqlite_url, steps=steps) as rt:
        journaled.otel.instrument(rt, tracer_provider=t.provider)
        rt.register_tool("sleep", pid_then_sleep, retry=Retry(attempts=2, backoff=0.1))
        handle = rt.start(Plan(goal="g", steps=[Step("a", tool="sleep", input=value)]))
        os.kill(_pid(pid_file), signal.SIGKILL)
        assert handle.result(WAIT).ok
    t.no_span_left_open()
    (run,) = t.spans(journaled.otel.RUN_SPAN)
    first, second = sorted(
        t.spans(journaled.otel.STEP_SPAN), key=lambda s: _a(s)["journaled.step.attempt"]
    )
    assert _a(first)["journaled.step.outcome"] == "retrying"
    assert first.status.status_code is StatusCode.ERROR
    assert "lost: the Ray worker" in (first.status.description or "")
    assert _a(second)["journaled.step.outcome"] == "succeeded"
    assert {s.parent.span_id for s in (first, second) if s.parent} == {_sid(run)}


def test_a_step_timing_out_then_retried_ends_both_attempt_spans(sqlite_url: str) -> None:
    """T3, S2: a timed-out attempt's span ends (retrying) and the next one's succeeds."""
    t = Traced()
    calls: list[int] = []

    def slow_first(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        calls.append(1)
        if len(calls) == 1:
            wait_for(ctx.cancelled, WAIT)
        return journaled.AgentResult(output=len(calls), calls_used=0)

    with journaled.open(sqlite_url) as rt:
        journaled.otel.instrument(rt, tracer_provider=t.provider)
        rt.register_agent("t", slow_first, retry=Retry(attempts=2, backoff=0.3))
        result = rt.execute(Plan(goal="g", steps=[Step("a", agent="t")]), step_timeout=0.2)
    assert result.ok, result.observations
    t.no_span_left_open()
    outcomes = sorted(
        (_a(s)["journaled.step.attempt"], _a(s)["journaled.step.outcome"])
        for s in t.spans(journaled.otel.STEP_SPAN)
    )
    assert outcomes == [(1, "retrying"), (2, "succeeded")]


def test_a_fork_resumed_is_a_new_run_span_with_every_span_ended(sqlite_url: str) -> None:
    """T3, F1: a fork's pass is a run span of the fork's id; no span is left open."""
    t = Traced()
    with journaled.open(sqlite_url) as rt:
        journaled.otel.instrument(rt, tracer_provider=t.provider)
        rt.register_tool("echo", echo)
        source = rt.execute(
            Plan(goal="g", steps=[Step("a", tool="echo", input=1), Step("b", tool="echo")])
        )
        fork = rt.runs.fork(source.run_id, replace={"b": Step("b", tool="echo", input=2)})
        forked = rt.resume(fork)
    assert isinstance(forked, journaled.ExecuteResult)
    assert forked.ok
    t.no_span_left_open()
    runs = {_a(s)["journaled.run.id"]: s for s in t.spans(journaled.otel.RUN_SPAN)}
    assert set(runs) == {source.run_id, fork}
    fork_steps = [
        _a(s)["journaled.step.id"]
        for s in t.spans(journaled.otel.STEP_SPAN)
        if _a(s)["journaled.run.id"] == fork
    ]
    assert fork_steps == ["b"]


def test_an_asyncio_runtime_nests_child_runs_and_leaves_no_span_open(sqlite_url: str) -> None:
    """T3, A1, E9: on the asyncio runtime a child run's span is a child of its agent step's."""
    t = Traced()

    async def parent(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        child = await ctx.execute_async(Plan(goal="sub", steps=[Step("x", tool="echo", input=5)]))
        return journaled.AgentResult(output=child.observations[0].output, calls_used=0)

    async def main() -> journaled.ExecuteResult:
        async with journaled.aio.open(sqlite_url) as rt:
            journaled.otel.instrument(rt, tracer_provider=t.provider)
            rt.register_tool("echo", echo)
            rt.register_agent("parent", parent)
            return await rt.execute(Plan(goal="g", steps=[Step("p", agent="parent")]))

    result = asyncio.run(main())
    assert result.ok, result.observations
    t.no_span_left_open()
    child_id = result.observations[0].agent_task_id
    (step,) = [s for s in t.spans(journaled.otel.STEP_SPAN) if _a(s)["journaled.step.id"] == "p"]
    (child,) = [
        s for s in t.spans(journaled.otel.RUN_SPAN) if _a(s)["journaled.run.id"] == child_id
    ]
    assert child.parent is not None
    assert child.parent.span_id == _sid(step)


def test_an_orchestration_leaves_no_span_open(sqlite_url: str) -> None:
    """T3, O*: every pass of an orchestration ends its spans."""
    t = Traced()
    flaky, planner = first_pass_fails()
    with journaled.open(sqlite_url) as rt:
        journaled.otel.instrument(rt, tracer_provider=t.provider)
        rt.register_tool("flaky", flaky)
        out = rt.orchestrate("g", planner, mode="orchestrate")
    assert out.status == "completed"
    t.no_span_left_open()
    assert len(t.spans(journaled.otel.RUN_SPAN)) == 2


@pytest.mark.parametrize("where", ["start", "end", "export"])
def test_a_failing_span_processor_or_exporter_never_fails_a_run(
    sqlite_url: str, where: str
) -> None:
    """T3, ADR 0070: a processor raising in on_start or on_end, or an exporter raising, changes
    nothing of the run: same result, same events."""
    provider = TracerProvider()
    if where == "export":
        provider.add_span_processor(SimpleSpanProcessor(_Raising()))
    else:
        provider.add_span_processor(_RaisingProcessor(where))
    with journaled.open(sqlite_url) as rt:
        journaled.otel.instrument(rt, tracer_provider=provider)
        rt.register_tool("echo", echo)
        rt.register_skill("think", echo)
        plan = Plan(
            goal="g",
            steps=[Step("a", tool="echo", input=1), Step("b", skill="think", depends_on=["a"])],
        )
        result = rt.execute(plan, call_budget=5)
        again = rt.execute(plan, call_budget=5)
    assert result.ok, result.observations
    assert again.ok
    assert result.calls_used == 1


PROVIDER_LATE = """
import journaled, journaled.otel
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from journaled import Plan, Step

with journaled.open("memory://") as rt:
    journaled.otel.instrument(rt)  # no provider yet: the global proxy
    rt.register_tool("echo", lambda x: x)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    assert rt.execute(Plan(goal="g", steps=[Step("a", tool="echo", input=1)])).ok
print(sorted(s.name for s in exporter.get_finished_spans()))
"""


def test_a_global_provider_set_after_instrument_gets_the_spans() -> None:
    """T3: instrument(rt) before the application sets its global provider still traces."""
    done = subprocess.run(
        [sys.executable, "-c", PROVIDER_LATE],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == str(
        ["journaled.run", "journaled.step", "journaled.wave"]
    )


def test_a_run_resumed_in_a_new_runtime_after_close_ends_every_span(sqlite_url: str) -> None:
    """T3, R3: a run suspended by close and resumed by another runtime: two run spans, the
    interrupted attempt's and the re-run's step spans, none left open."""
    t = Traced()
    rt = journaled.open(sqlite_url)
    journaled.otel.instrument(rt, tracer_provider=t.provider)
    handle, hold = suspend_by_close(rt, "a", WAIT)
    with journaled.open(sqlite_url) as rt:
        journaled.otel.instrument(rt, tracer_provider=t.provider)
        rt.register_tool("hold", hold)
        result = rt.resume(handle.run_id)
    assert isinstance(result, journaled.ExecuteResult)
    assert result.ok, result.observations
    t.no_span_left_open()
    runs = t.spans(journaled.otel.RUN_SPAN)
    assert [_a(s)["journaled.run.resumed"] for s in runs] == [False, True]
    assert [_a(s).get("journaled.run.status") for s in runs] == ["suspended", "completed"]
    for s in t.spans(journaled.otel.STEP_SPAN):
        assert s.parent is not None
        assert s.parent.span_id in {_sid(r) for r in runs}
