"""OpenTelemetry spans for runs, waves and steps (SPEC T3, ADR 0038), with ``journaled[otel]``.

Turn it on for a runtime (sync or asyncio) with :func:`instrument`; runs started from then on emit
spans through the given tracer provider, or the global one::

    import journaled, journaled.otel

    with journaled.open() as rt:
        journaled.otel.instrument(rt)            # opentelemetry.trace's global provider
        rt.execute(plan)

Each pass of a run is a ``journaled.run`` span; each wave a ``journaled.wave`` span under it; each
step attempt a ``journaled.step`` span under its wave. While a step's function runs, its span is
the current span of the thread (or asyncio task) running it, so a tool's own spans — an HTTP
client's, a model client's — nest under the step. A child run started by ``ctx.execute`` is a
child of its agent step's span, and a run started where a span is current (a request handler's)
is a child of that span. A resumed run opens a new run span, linked to the span of the
run's previous pass when this process traced it. Failed steps and failed runs have status ERROR
with the step's (redacted) error; cancelled, timed out, waiting, interrupted and budget-stopped
are attributes (``journaled.step.outcome``, ``journaled.run.status``) and span events.

The spans are derived from the events the executor journals, as it stages them: the journal stays
the truth, and a runtime without :func:`instrument` neither imports OpenTelemetry nor emits a span.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "journaled.otel needs OpenTelemetry: install the extra with pip install 'journaled[otel]'"
    ) from exc

from journaled.actors.tracing import Tracing
from journaled.events.base import DomainEvent
from journaled.events.plans import Observation
from journaled.events.run_state import RunState
from journaled.events.runs import (
    BudgetStopped,
    CallsOverrun,
    CancelRequested,
    RunFinished,
    RunStarted,
    RunSuspended,
    StepFailed,
    StepRetrying,
    StepsSkipped,
    StepStarted,
    StepSucceeded,
    StepWaiting,
    WavePartitioned,
)

_log = logging.getLogger(__name__)

__all__ = ["RUN_SPAN", "STEP_SPAN", "WAVE_SPAN", "OtelTracing", "instrument", "uninstrument"]

RUN_SPAN = "journaled.run"
"""Name of the span of one pass of a run."""
WAVE_SPAN = "journaled.wave"
"""Name of the span of one wave of a pass, child of the run span."""
STEP_SPAN = "journaled.step"
"""Name of the span of one step attempt, child of its wave span."""

_PASSES_REMEMBERED = 4096
"""Runs whose last pass's span context is kept, to link a resumed pass to it."""

_GEN_AI_OPERATION = {"tool": "execute_tool", "agent": "invoke_agent"}
"""The GenAI semantic-convention operation a step kind honestly is (a skill names no model)."""


@dataclass
class _Pass:
    """The open spans of one pass of one run."""

    span: trace.Span
    wave: trace.Span | None = None
    steps: dict[str, tuple[int, trace.Span]] = field(default_factory=dict)
    """Each step in flight: (attempt, span)."""


class _Scope:
    """Make a span current while a step's user code runs; detach it afterwards."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: trace.Span | None) -> None:
        self._span = span
        self._token: object | None = None

    def __enter__(self) -> None:
        if self._span is not None:
            self._token = otel_context.attach(trace.set_span_in_context(self._span))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]  # the token attach gave
            self._token = None


class OtelTracing(Tracing):
    """Derive OpenTelemetry spans from the events a runtime's executors stage. Thread-safe."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        """Trace through ``tracer_provider``, or OpenTelemetry's global provider when None."""
        if tracer_provider is not None and not callable(
            getattr(tracer_provider, "get_tracer", None)
        ):
            raise TypeError(
                "tracer_provider: give an opentelemetry.trace.TracerProvider (or None for the "
                f"global one), got {type(tracer_provider).__name__}"
            )
        self._tracer = trace.get_tracer("journaled", tracer_provider=tracer_provider)
        self._warned = False
        self._lock = threading.Lock()
        """Guards :attr:`_last` and :attr:`_callers`, which many threads update."""
        self._passes: dict[str, _Pass] = {}
        """Each run's open pass: changed by that run's executor thread only."""
        self._callers: weakref.WeakKeyDictionary[RunState, otel_context.Context] = (
            weakref.WeakKeyDictionary()
        )
        """The context of the thread that started a pass, when it held a span, by run state."""
        self._last: OrderedDict[str, trace.SpanContext] = OrderedDict()
        """Each run's last traced pass, so a resumed pass links to it (bounded)."""

    # -- the hooks -------------------------------------------------------------------------------

    def _failed(self, hook: str) -> None:
        """Log a tracing failure (once at warning level): a span is never worth a run."""
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = True
        _log.log(level, "tracing failed in %s; the run goes on untraced there", hook, exc_info=True)

    def starting(self, state: RunState) -> None:
        """Keep the starting thread's context when it holds a span: the pass's parent."""
        try:
            self._starting(state)
        except Exception:  # a span processor's or the SDK's failure must not stop the run
            self._failed("starting")

    def staged(self, state: RunState, event: DomainEvent) -> None:
        """Open, annotate or end the spans this event of the run implies."""
        try:
            self._staged(state, event)
        except Exception:  # a span processor's or the SDK's failure must not stop the run
            self._failed("staged")

    def settled(self, run_id: str) -> None:
        """End the spans a run left open when its executor stopped without ending its pass."""
        try:
            self._settled(run_id)
        except Exception:  # a span processor's or the SDK's failure must not stop the run
            self._failed("settled")

    def _starting(self, state: RunState) -> None:
        caller = otel_context.get_current()
        if trace.get_current_span(caller).get_span_context().is_valid:
            with self._lock:
                self._callers[state] = caller

    def _staged(self, state: RunState, event: DomainEvent) -> None:
        run_id = state.run_id
        # Only this run's executor thread changes its pass; the SDK is called outside any lock
        # (a synchronous exporter must not hold up the other runs' executors).
        current = self._passes.get(run_id)
        if current is None:
            current = self._open_pass(state, event)
        match event:
            case WavePartitioned():
                self._on_wave(run_id, current, event)
            case StepStarted():
                self._on_step_started(state, current, event)
            case StepSucceeded() | StepFailed() | StepWaiting() | StepRetrying():
                self._on_step_ended(state, current, event)
            case BudgetStopped():
                attributes = {
                    "journaled.wave.number": event.wave,
                    "journaled.budget.estimate": event.estimate,
                    "journaled.budget.used": event.used,
                    "journaled.budget.limit": event.budget,
                }
                if current.wave is not None:
                    current.wave.set_attribute("journaled.wave.stopped_for_budget", True)
                    current.wave.add_event("journaled.budget_stop", attributes)
                current.span.add_event("journaled.budget_stop", attributes)
            case CancelRequested():
                current.span.add_event("journaled.cancel_requested")
            case StepsSkipped():
                skipped = [o.step_id for o in event.observations] + list(event.unobserved)
                current.span.add_event("journaled.steps_skipped", {"journaled.step.ids": skipped})
            case CallsOverrun():
                current.span.add_event(
                    "journaled.calls_overrun",
                    {
                        "journaled.step.id": event.step_id,
                        "journaled.step.attempt": event.attempt,
                        "journaled.calls.reserved": event.reserved,
                        "journaled.calls.reported": event.reported,
                    },
                )
            case RunFinished():
                self._end_pass(state, current, event.status, failed=event.status == "failed")
            case RunSuspended():
                current.span.add_event(
                    "journaled.suspended",
                    {"journaled.run.in_flight": list(event.in_flight)},
                )
                self._end_pass(state, current, "suspended", failed=False)
            case _:
                pass

    def step_scope(self, run_id: str, step_id: str, attempt: int) -> AbstractContextManager[None]:
        """Make the step attempt's span current while its user code runs."""
        current = self._passes.get(run_id)  # dict reads are atomic: no lock on the hot path
        flight = None if current is None else current.steps.get(step_id)
        span = flight[1] if flight is not None and flight[0] == attempt else None
        return _Scope(span)

    def _settled(self, run_id: str) -> None:
        current = self._passes.pop(run_id, None)
        if current is None:
            return
        error = trace.Status(
            trace.StatusCode.ERROR, "the executor stopped before the pass of the run ended"
        )
        for _, span in current.steps.values():
            span.set_attribute("journaled.step.outcome", "abandoned")
            span.set_status(error)
            span.end()
        if current.wave is not None:
            current.wave.end()
        current.span.set_status(error)
        current.span.end()

    # -- spans -----------------------------------------------------------------------------------

    def _open_pass(self, state: RunState, first: DomainEvent) -> _Pass:
        """Start the span of a pass: a new run, or a resumed (or forked) one."""
        started = state.started
        attributes: dict[str, Any] = {"journaled.run.id": state.run_id}
        with self._lock:
            parent = self._callers.pop(state, None)
        if started is not None:
            if started.call_budget is not None:
                attributes["journaled.run.budget"] = started.call_budget
            if started.parent_run is not None and started.parent_step is not None:
                attributes["journaled.run.parent_id"] = started.parent_run
                attributes["journaled.run.parent_step"] = started.parent_step
                above = self._passes.get(started.parent_run)
                flight = None if above is None else above.steps.get(started.parent_step)
                if flight is not None and parent is None:
                    parent = trace.set_span_in_context(flight[1])
        resumed = not isinstance(first, RunStarted)
        attributes["journaled.run.resumed"] = resumed
        if resumed:
            attributes["journaled.run.resumptions"] = state.resumptions
        with self._lock:
            previous = self._last.get(state.run_id)
        links = [trace.Link(previous)] if previous is not None else None
        span = self._tracer.start_span(
            RUN_SPAN,
            context=parent if parent is not None else otel_context.Context(),
            kind=trace.SpanKind.INTERNAL,
            attributes=attributes,
            links=links,
        )
        with self._lock:
            self._last[state.run_id] = span.get_span_context()
            self._last.move_to_end(state.run_id)
            while len(self._last) > _PASSES_REMEMBERED:
                self._last.popitem(last=False)
        opened = _Pass(span=span)
        self._passes[state.run_id] = opened
        return opened

    def _on_wave(self, run_id: str, current: _Pass, event: WavePartitioned) -> None:
        if current.wave is not None:
            current.wave.end()
        skipped = [o.step_id for o in event.skipped] + list(event.unobserved)
        current.wave = self._tracer.start_span(
            WAVE_SPAN,
            context=trace.set_span_in_context(current.span),
            attributes={
                "journaled.run.id": run_id,
                "journaled.wave.number": event.wave,
                "journaled.wave.runnable": len(event.runnable),
                "journaled.wave.skipped": len(skipped),
            },
        )
        if skipped:
            current.wave.add_event("journaled.steps_skipped", {"journaled.step.ids": skipped})

    def _on_step_started(self, state: RunState, current: _Pass, event: StepStarted) -> None:
        step = state.steps[event.step_id]
        kind = step.kind or "tool"
        attributes: dict[str, Any] = {
            "journaled.run.id": state.run_id,
            "journaled.step.id": step.id,
            "journaled.step.kind": kind,
            "journaled.step.name": step.target,
            "journaled.step.attempt": event.attempt,
            "journaled.wave.number": event.wave,
        }
        operation = _GEN_AI_OPERATION.get(kind)
        if operation is not None:
            attributes["gen_ai.operation.name"] = operation
            attributes["gen_ai.tool.name" if kind == "tool" else "gen_ai.agent.name"] = step.target
        above = current.wave if current.wave is not None else current.span
        span = self._tracer.start_span(
            STEP_SPAN, context=trace.set_span_in_context(above), attributes=attributes
        )
        stale = current.steps.get(step.id)
        if stale is not None:  # an attempt that never reported (it timed out and re-ran)
            stale[1].end()
        current.steps[step.id] = (event.attempt, span)

    def _on_step_ended(
        self,
        state: RunState,
        current: _Pass,
        event: StepSucceeded | StepFailed | StepWaiting | StepRetrying,
    ) -> None:
        flight = current.steps.get(event.step_id)
        if flight is None or flight[0] != event.attempt:
            return
        del current.steps[event.step_id]
        span = flight[1]
        obs = event.observation
        attributes: dict[str, Any] = {"journaled.step.calls": event.charged}
        if obs.code is not None:
            attributes["journaled.step.code"] = obs.code
        if obs.agent_task_id is not None:
            attributes["journaled.step.child_run"] = obs.agent_task_id
        if isinstance(event, StepWaiting):
            attributes["journaled.step.outcome"] = "waiting"
            span.add_event("journaled.waiting_for_input")
        elif isinstance(event, StepSucceeded):
            attributes["journaled.step.outcome"] = "succeeded"
            span.set_status(trace.StatusCode.OK)
        else:  # failed, or failed and tried again (S2)
            attributes["journaled.step.outcome"] = (
                "retrying" if isinstance(event, StepRetrying) else _failure(state, obs)
            )
            attributes["error.type"] = obs.code or "_OTHER"
            error = obs.error or "failed"
            span.add_event("exception", {"exception.message": error})
            span.set_status(trace.Status(trace.StatusCode.ERROR, error))
        span.set_attributes(attributes)  # one call: the SDK locks and checks per call
        span.end()

    def _end_pass(self, state: RunState, current: _Pass, status: str, *, failed: bool) -> None:
        for _, span in current.steps.values():  # in flight when the runtime closed (R3)
            span.set_attribute("journaled.step.outcome", "interrupted")
            span.end()
        current.steps.clear()
        if current.wave is not None:
            current.wave.end()
            current.wave = None
        span = current.span
        span.set_attribute("journaled.run.status", status)
        span.set_attribute("journaled.run.calls_used", state.calls_used)
        if state.waiting:
            span.set_attribute("journaled.run.waiting", list(state.waiting))
        if failed:
            failures = [i for i in state.order if state.status[i] == "failed"]
            span.set_status(
                trace.Status(trace.StatusCode.ERROR, f"steps failed: {', '.join(failures)}")
            )
        elif status == "completed":
            span.set_status(trace.StatusCode.OK)
        span.end()
        del self._passes[state.run_id]


def _failure(state: RunState, obs: Observation) -> str:
    """Name how a step failed: timed out, cancelled, or failed."""
    started = state.started
    timeout = None if started is None else started.step_timeout
    if obs.code == "agent-timeout" or (
        timeout is not None and obs.error == f"timed out after {timeout}s"
    ):
        return "timed_out"
    if obs.code == "cancelled":
        return "cancelled"
    return "failed"


def _services(rt: Any) -> Any:
    """Find the step services of a runtime, sync or asyncio."""
    runtime = getattr(rt, "_sync", rt)
    services = getattr(runtime, "_services", None)
    if services is None or not hasattr(services, "tracing"):
        raise TypeError(
            f"instrument() takes a runtime from journaled.open() or journaled.aio.open(), "
            f"got {type(rt).__name__}"
        )
    return services


def instrument(rt: Any, tracer_provider: trace.TracerProvider | None = None) -> OtelTracing:
    """Trace the runs a runtime starts from now on (T3); return the tracer it uses.

    Args:
        rt: a runtime from ``journaled.open()`` or ``journaled.aio.open()``.
        tracer_provider: where spans go; None uses OpenTelemetry's global provider.
    """
    tracing = OtelTracing(tracer_provider)
    _services(rt).tracing = tracing
    return tracing


def uninstrument(rt: Any) -> None:
    """Stop tracing the runs a runtime starts from now on (runs under way stay traced)."""
    _services(rt).tracing = None
