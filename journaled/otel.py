"""OpenTelemetry spans for runs, waves and steps (SPEC T3, ADR 0038), with ``journaled[otel]``.

Turn it on for a runtime (sync or asyncio) with :func:`instrument`; runs started from then on emit
spans through the given tracer provider, or the global one::

    import journaled, journaled.otel

    with journaled.open() as rt:
        journaled.otel.instrument(rt)            # opentelemetry.trace's global provider
        rt.execute(plan)

Each pass of a run is a ``journaled.run`` span; each wave a ``journaled.wave`` span under it; each
step attempt a ``journaled.step`` span under the run too (SPEC T3: parent = run), linked to its
wave's span (ADR 0089). While a step's function runs, its span is
the current span of the thread (or asyncio task) running it, so a tool's own spans — an HTTP
client's, a model client's — nest under the step. A child run started by ``ctx.execute`` is a
child of its agent step's span, and a run started where a span is current (a request handler's)
is a child of that span. A resumed run opens a new run span, linked to the span of the
run's previous pass when this process traced it. Failed steps and failed runs have status ERROR
with the step's (redacted) error; cancelled, timed out, waiting, interrupted and budget-stopped
are attributes (``journaled.step.outcome``, ``journaled.run.status``) and span events.

The spans are derived from the events the executor journals, once the journal holds them, with the
times the events were staged at; spans are ended on a thread of the tracer's own, where span
processors export, so a collector that does not answer never holds a step's result out of the
journal (ADR 0070). The journal stays the truth, and a runtime without :func:`instrument` neither
imports OpenTelemetry nor emits a span.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
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
from journaled.events.run_state import RunFold
from journaled.events.runs import (
    BudgetRaised,
    BudgetStopped,
    CallsOverrun,
    CancelRequested,
    RunFinished,
    RunResumed,
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
"""Name of the span of one step attempt: a child of its run's span, linked to its wave's (0089)."""

_PASSES_REMEMBERED = 4096
"""Runs whose last pass's span context is kept, to link a resumed pass to it."""

_GEN_AI_OPERATION = {"tool": "execute_tool", "agent": "invoke_agent"}
"""The GenAI semantic-convention operation a step kind honestly is (a skill names no model)."""

SETTLE_WAIT = 1.0
"""Seconds an executor that stops waits, at most, for the spans ended so far to be exported."""

ENDS_QUEUED = 1 << 16
"""Span ends waiting for the tracer's thread, at most; past that, new ones are dropped."""

GATHER = 0.005
"""Seconds the tracer's thread lets span ends gather before it ends them."""

_Ends = list[tuple[trace.Span, int]]
"""Spans to end, each with its end time (epoch nanoseconds)."""


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


class _Ender:
    """End spans, in the order given, on a daemon thread of its own (ADR 0070).

    Ending a span is where the SDK's span processors export: the ``SimpleSpanProcessor`` calls
    its exporter inline. An exporter that does not answer holds this thread, never an executor.
    The thread lets ends gather for :data:`GATHER` before it ends them, unless one waits for
    them: one wake-up per few steps, not one per step.
    """

    def __init__(self) -> None:
        lock = threading.Lock()
        self._work = threading.Condition(lock)
        """Where this thread waits for ends to come (or to gather)."""
        self._progress = threading.Condition(lock)
        """Where :meth:`wait` waits for ends to be done."""
        self._queue: _Ends = []
        self._handed = 0
        """Ends queued so far."""
        self._done = 0
        """Ends done so far: only this thread adds to it."""
        self._busy_since: float | None = None
        """When the end this thread is in began (monotonic seconds); None: between ends."""
        self._idle = False
        """This thread waits for ends, with none queued: the next to come wakes it."""
        self._hurry = 0
        """Callers of :meth:`wait` waiting now: no gathering meanwhile."""
        self._thread: threading.Thread | None = None
        self._dropped = 0

    def end(self, ends: _Ends) -> None:
        """Hand spans over to be ended; never waits for an exporter.

        Past :data:`ENDS_QUEUED` ends waiting, the spans are dropped: never ended, never
        exported (as a batch processor drops what overflows its queue).
        """
        with self._work:
            dropped = len(self._queue) + len(ends) > ENDS_QUEUED
            if dropped:
                first = self._dropped == 0
                self._dropped += len(ends)
                total = self._dropped
            else:
                self._queue.extend(ends)
                self._handed += len(ends)
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="journaled-span-ends", daemon=True
                    )
                    self._thread.start()
                elif self._idle:
                    self._idle = False
                    self._work.notify()
        if dropped:
            level = logging.WARNING if first else logging.DEBUG
            _log.log(level, "the span exporter is not keeping up: %d spans dropped", total)

    def wait(self, timeout: float) -> bool:
        """Wait until the ends handed over so far are done; return False if they were not.

        Waits ``timeout`` seconds at most, and not at all once one end has taken that long: an
        exporter that does not answer costs one wait, not one per run.
        """
        deadline = time.monotonic() + timeout
        with self._work:
            target = self._handed
            if self._done >= target:
                return True
            self._hurry += 1
            self._work.notify()  # ends gathering: end them now
            try:
                while self._done < target:
                    busy = self._busy_since
                    limit = deadline if busy is None else min(deadline, busy + timeout)
                    left = limit - time.monotonic()
                    if left <= 0:
                        return False
                    self._progress.wait(left)
            finally:
                self._hurry -= 1
        return True

    def _run(self) -> None:
        while True:
            with self._work:
                while not self._queue:
                    self._idle = True
                    self._work.wait()
                self._idle = False
                if not self._hurry:
                    self._work.wait(GATHER)  # a caller of wait() cuts it short
                ends, self._queue = self._queue, []
            for span, at in ends:
                self._busy_since = time.monotonic()
                try:
                    span.end(end_time=at)
                except Exception:  # a span processor's failure must not stop the other ends
                    _log.debug("ending a span failed", exc_info=True)
                self._done += 1
            with self._work:
                self._busy_since = None
                self._progress.notify_all()


class OtelTracing(Tracing):
    """Derive OpenTelemetry spans from the events a runtime's executors append. Thread-safe."""

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
        self._callers: weakref.WeakKeyDictionary[RunFold, otel_context.Context] = (
            weakref.WeakKeyDictionary()
        )
        """The context of the thread that started a pass, when it held a span, by run state."""
        self._last: OrderedDict[str, trace.SpanContext] = OrderedDict()
        """Each run's last traced pass, so a resumed pass links to it (bounded)."""
        self._ender = _Ender()
        self._runs: dict[str, Tracing] | None = None
        """The runtime's ``Services.traced_runs`` (set by :func:`instrument`): this tracer puts
        each run in while its pass is open, so that run's steps keep this tracer's spans."""

    # -- the hooks -------------------------------------------------------------------------------

    def _failed(self, hook: str) -> None:
        """Log a tracing failure (once at warning level): a span is never worth a run."""
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = True
        _log.log(level, "tracing failed in %s; the run goes on untraced there", hook, exc_info=True)

    def starting(self, state: RunFold) -> None:
        """Keep the starting thread's context when it holds a span: the pass's parent."""
        try:
            self._starting(state)
        except Exception:  # a span processor's or the SDK's failure must not stop the run
            self._failed("starting")

    def appended(self, state: RunFold, events: Sequence[DomainEvent], times: Sequence[int]) -> None:
        """Open, annotate or end the spans these appended events of the run imply.

        Spans are started and annotated here; their ends go to the tracer's own thread.
        """
        ends: _Ends = []
        for event, at in zip(events, times, strict=True):
            try:
                self._staged(state, event, at, ends)
            except Exception:  # a span processor's or the SDK's failure must not stop the run
                self._failed("appended")
        if ends:
            self._ender.end(ends)

    def staged(self, state: RunFold, event: DomainEvent, at: int | None = None) -> None:
        """Derive the spans of one event of the run, staged at ``at`` (epoch ns; None: now)."""
        self.appended(state, (event,), (time.time_ns() if at is None else at,))

    def settled(self, run_id: str) -> None:
        """End the spans a run left open when its executor stopped without ending its pass;
        wait up to :data:`SETTLE_WAIT` for the run's spans to be exported."""
        ends: _Ends = []
        try:
            self._settled(run_id, ends)
        except Exception:  # a span processor's or the SDK's failure must not stop the run
            self._failed("settled")
        if ends:
            self._ender.end(ends)
        self._ender.wait(SETTLE_WAIT)

    def _starting(self, state: RunFold) -> None:
        caller = otel_context.get_current()
        if trace.get_current_span(caller).get_span_context().is_valid:
            with self._lock:
                self._callers[state] = caller

    def _staged(self, state: RunFold, event: DomainEvent, at: int, ends: _Ends) -> None:
        run_id = state.run_id
        # Only this run's executor thread changes its pass; the SDK is called outside any lock,
        # and no span is ended here (an exporter must hold up no executor, ADR 0070).
        current = self._passes.get(run_id)
        if current is None:
            current = self._open_pass(state, event, at)
        match event:
            case WavePartitioned():
                self._on_wave(run_id, current, event, at, ends)
            case StepStarted():
                self._on_step_started(state, current, event, at, ends)
            case StepSucceeded() | StepFailed() | StepWaiting() | StepRetrying():
                self._on_step_ended(state, current, event, at, ends)
            case RunResumed():  # the pass's number, whatever the resume staged before it
                current.span.set_attribute("journaled.run.resumptions", event.resumption)
            case BudgetRaised():
                if event.budget is not None:
                    current.span.set_attribute("journaled.run.budget", event.budget)
            case BudgetStopped():
                attributes = {
                    "journaled.wave.number": event.wave,
                    "journaled.budget.estimate": event.estimate,
                    "journaled.budget.used": event.used,
                    "journaled.budget.limit": event.budget,
                }
                if current.wave is not None:
                    current.wave.set_attribute("journaled.wave.stopped_for_budget", True)
                    current.wave.add_event("journaled.budget_stop", attributes, at)
                current.span.add_event("journaled.budget_stop", attributes, at)
            case CancelRequested():
                current.span.add_event("journaled.cancel_requested", timestamp=at)
            case StepsSkipped():
                skipped = [o.step_id for o in event.observations] + list(event.unobserved)
                current.span.add_event(
                    "journaled.steps_skipped", {"journaled.step.ids": skipped}, at
                )
            case CallsOverrun():
                current.span.add_event(
                    "journaled.calls_overrun",
                    {
                        "journaled.step.id": event.step_id,
                        "journaled.step.attempt": event.attempt,
                        "journaled.calls.reserved": event.reserved,
                        "journaled.calls.reported": event.reported,
                    },
                    at,
                )
            case RunFinished():
                failed = event.status == "failed"
                self._end_pass(state, current, event.status, at, ends, failed=failed)
            case RunSuspended():
                current.span.add_event(
                    "journaled.suspended",
                    {"journaled.run.in_flight": list(event.in_flight)},
                    at,
                )
                self._end_pass(state, current, "suspended", at, ends, failed=False)
            case _:
                pass

    def step_scope(self, run_id: str, step_id: str, attempt: int) -> AbstractContextManager[None]:
        """Make the step attempt's span current while its user code runs."""
        current = self._passes.get(run_id)  # dict reads are atomic: no lock on the hot path
        flight = None if current is None else current.steps.get(step_id)
        span = flight[1] if flight is not None and flight[0] == attempt else None
        return _Scope(span)

    def _settled(self, run_id: str, ends: _Ends) -> None:
        current = self._passes.pop(run_id, None)
        if current is None:
            return
        self._let_go(run_id)
        now = time.time_ns()
        error = trace.Status(
            trace.StatusCode.ERROR, "the executor stopped before the pass of the run ended"
        )
        for _, span in current.steps.values():
            span.set_attribute("journaled.step.outcome", "abandoned")
            span.set_status(error)
            ends.append((span, now))
        if current.wave is not None:
            ends.append((current.wave, now))
        current.span.set_status(error)
        ends.append((current.span, now))

    def _let_go(self, run_id: str) -> None:
        """Take the run out of the runtime's traced runs, if this tracer put it there."""
        runs = self._runs
        if runs is not None and runs.get(run_id) is self:
            del runs[run_id]

    # -- spans -----------------------------------------------------------------------------------

    def _open_pass(self, state: RunFold, first: DomainEvent, at: int) -> _Pass:
        """Start the span of a pass: a new run, or a resumed (or forked) one.

        ``state`` has the pass's opening events folded (they are appended together): the
        budget is the one the pass runs under, raised by a resume (E14).
        """
        started = state.started
        attributes: dict[str, Any] = {"journaled.run.id": state.run_id}
        with self._lock:
            parent = self._callers.pop(state, None)
        if state.budget is not None:
            attributes["journaled.run.budget"] = state.budget
        parent_step = None if started is None else started.parent_step
        if started is not None and started.parent_run is not None and parent_step is not None:
            attributes["journaled.run.parent_id"] = started.parent_run
            attributes["journaled.run.parent_step"] = parent_step
            above = self._passes.get(started.parent_run)
            flight = None if above is None else above.steps.get(parent_step)
            if flight is not None and parent is None:
                parent = trace.set_span_in_context(flight[1])
        attributes["journaled.run.resumed"] = not isinstance(first, RunStarted)
        with self._lock:
            previous = self._last.get(state.run_id)
        links = [trace.Link(previous)] if previous is not None else None
        span = self._tracer.start_span(
            RUN_SPAN,
            context=parent if parent is not None else otel_context.Context(),
            kind=trace.SpanKind.INTERNAL,
            attributes=attributes,
            links=links,
            start_time=at,
        )
        with self._lock:
            self._last[state.run_id] = span.get_span_context()
            self._last.move_to_end(state.run_id)
            while len(self._last) > _PASSES_REMEMBERED:
                self._last.popitem(last=False)
        opened = _Pass(span=span)
        self._passes[state.run_id] = opened
        if self._runs is not None:
            self._runs[state.run_id] = self
        return opened

    def _on_wave(
        self, run_id: str, current: _Pass, event: WavePartitioned, at: int, ends: _Ends
    ) -> None:
        if current.wave is not None:
            ends.append((current.wave, at))
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
            start_time=at,
        )
        if skipped:
            current.wave.add_event("journaled.steps_skipped", {"journaled.step.ids": skipped}, at)

    def _on_step_started(
        self, state: RunFold, current: _Pass, event: StepStarted, at: int, ends: _Ends
    ) -> None:
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
        # SPEC T3: "parent = run". The step's wave is named by its number and linked.
        links = [] if current.wave is None else [trace.Link(current.wave.get_span_context())]
        span = self._tracer.start_span(
            STEP_SPAN,
            context=trace.set_span_in_context(current.span),
            attributes=attributes,
            links=links,
            start_time=at,
        )
        stale = current.steps.get(step.id)
        if stale is not None:  # an attempt that never reported (it timed out and re-ran)
            ends.append((stale[1], at))
        current.steps[step.id] = (event.attempt, span)

    def _on_step_ended(
        self,
        state: RunFold,
        current: _Pass,
        event: StepSucceeded | StepFailed | StepWaiting | StepRetrying,
        at: int,
        ends: _Ends,
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
            span.add_event("journaled.waiting_for_input", timestamp=at)
        elif isinstance(event, StepSucceeded):
            attributes["journaled.step.outcome"] = "succeeded"
            span.set_status(trace.StatusCode.OK)
        elif not isinstance(event, StepRetrying) and _failure(state, obs) == "cancelled":
            # Cancelled with its run: not an error (ADR 0038), the outcome says it.
            attributes["journaled.step.outcome"] = "cancelled"
        else:  # failed, or failed and tried again (S2)
            attributes["journaled.step.outcome"] = (
                "retrying" if isinstance(event, StepRetrying) else _failure(state, obs)
            )
            attributes["error.type"] = obs.code or "_OTHER"
            error = obs.error or "failed"
            span.add_event("exception", {"exception.message": error}, at)
            span.set_status(trace.Status(trace.StatusCode.ERROR, error))
        span.set_attributes(attributes)  # one call: the SDK locks and checks per call
        ends.append((span, at))

    def _end_pass(
        self, state: RunFold, current: _Pass, status: str, at: int, ends: _Ends, *, failed: bool
    ) -> None:
        for _, span in current.steps.values():  # in flight when the runtime closed (R3)
            span.set_attribute("journaled.step.outcome", "interrupted")
            ends.append((span, at))
        current.steps.clear()
        if current.wave is not None:
            ends.append((current.wave, at))
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
        ends.append((span, at))
        del self._passes[state.run_id]
        self._let_go(state.run_id)


def _failure(state: RunFold, obs: Observation) -> str:
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
    services = _services(rt)
    tracing._runs = services.traced_runs
    services.tracing = tracing
    return tracing


def uninstrument(rt: Any) -> None:
    """Stop tracing the runs a runtime starts from now on (runs under way stay traced, their
    steps' own spans nested under theirs)."""
    _services(rt).tracing = None
