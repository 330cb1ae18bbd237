"""The orchestrator actor: one per orchestration being driven, never blocked (SPEC A4, R5).

It decides from the folded phase (``Orchestrations`` holds the decisions), appends, folds and goes
on until it must wait: for the planner, which runs in a :class:`PlannerWorker` and tells its checked
answer back by address and correlation id, or for a pass, a child run whose handle tells
:class:`PassStopped` back the same way. While it waits it hears cancels, drains and its heartbeat
(ADR 0029). It answers its starter with :class:`OrchestrationStopped` (or a failure) from
``on_stop``/``on_failure``, so a crash answers too.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import msgspec
import pykka

from journaled.actors.directory import Directory, failure, rebuild_error
from journaled.actors.loop import LoopGone, LoopRunner, StepCancelled
from journaled.actors.ownership import HEARTBEAT_SECONDS
from journaled.actors.runs import normalised
from journaled.actors.steps import storable_text
from journaled.events.errors import JournalClosed, PlanRejected
from journaled.events.inputs import MAX_TEXT_BYTES, text_problem
from journaled.events.messages import Failure
from journaled.events.orchestration import Clarify, Gap, Gaps, Outcome
from journaled.events.orchestration_messages import (
    AskPlanner,
    BeginOrchestration,
    CancelOrchestration,
    DrainOrchestration,
    OrchestrationStopped,
    OrchestrationTick,
    PassStopped,
    PlannerAnswered,
)
from journaled.events.plans import Plan
from journaled.events.redact import redact
from journaled.events.runs import RunHeartbeat

if TYPE_CHECKING:
    from journaled.actors.orchestrator import Orchestrations, Planner, _Drive


class PlannerWorker(pykka.ThreadingActor):
    """Run one orchestration's planner (user code, maybe slow) off the orchestrator's thread."""

    use_daemon_thread = True

    def __init__(
        self,
        *,
        planner: Planner,
        validate: Callable[[Plan], None],
        directory: Directory,
        context: contextvars.Context | None = None,
        loop: LoopRunner | None = None,
    ) -> None:
        super().__init__()
        self.planner = planner
        self.validate = validate
        self.directory = directory
        self.loop = loop
        """Where an ``async def`` planner's coroutine runs, as an async step's does (A1)."""
        self.context = context if context is not None else contextvars.Context()
        """The context variables of the orchestration's caller (its current span, T3): the
        planner runs in a copy of them, so what it traces nests where the passes do."""

    def on_receive(self, message: object) -> object:
        """Ask the planner; tell its checked answer (or the error that escaped it) back."""
        if not isinstance(message, AskPlanner):
            raise TypeError(f"planner worker got an unknown message {type(message).__name__}")
        reply: object
        try:
            answer = self.context.copy().run(
                self.planner,
                message.goal,
                list(message.observations),
                list(message.clarifications),
            )
            if inspect.isawaitable(answer):
                if self.loop is None:
                    with contextlib.suppress(Exception):
                        answer.close()  # type: ignore[attr-defined]
                    raise RuntimeError("an async planner needs an event loop, and none was given")
                answer = self.loop.run(answer)
        except (LoopGone, StepCancelled) as exc:  # its loop ended or the runtime closed under
            # it: no answer, so the orchestration stops unended (resumable), as a step would
            reply = failure(message.correlation, exc)
        except Exception as exc:  # user code: a planner failure is an outcome, not a crash
            reason = storable_text(f"the planner raised {_describe_error(exc)}")
            reply = PlannerAnswered(correlation=message.correlation, failure=reason)
        except BaseException as exc:  # the orchestration stops unended (resumable), answering
            reply = failure(message.correlation, exc)
        else:
            try:
                reply = self._check(message.correlation, answer)
            except Exception as exc:  # checking user code's answer failed: an outcome too
                reason = storable_text(
                    f"the planner's answer could not be checked: {_describe_error(exc)}"
                )
                reply = PlannerAnswered(correlation=message.correlation, failure=reason)
        self.directory.tell(message.reply_to, reply)
        return None

    def _check(self, correlation: str, answer: object) -> PlannerAnswered:
        """Turn what the planner returned into data: a valid plan, a question, or a failure."""
        if isinstance(answer, Clarify):
            problem = text_problem(answer.question, empty=False)
            if problem:
                return PlannerAnswered(
                    correlation=correlation,
                    failure=f"the planner's clarifying question {problem}",
                )
            return PlannerAnswered(correlation=correlation, question=str(answer.question))
        if isinstance(answer, Gaps):
            if not isinstance(answer.gaps, list | tuple):
                return PlannerAnswered(
                    correlation=correlation,
                    failure=f"the planner's Gaps.gaps is {type(answer.gaps).__name__}, not a list",
                )
            gaps = tuple(
                g if isinstance(g, Gap) else Gap(kind="capability", name=str(g))
                for g in answer.gaps
            )
            problem = _gaps_problem(gaps)
            if problem:
                return PlannerAnswered(correlation=correlation, failure=problem)
            # Quoted from the redacted names: a quote escapes line breaks, and a secret that
            # began a line would no longer be seen as one once quoted (M9). The gaps are
            # journaled whole; the reason (and the summary quoting it) names them at most 4 KiB.
            names = ", ".join(f"{redact(g.kind)} {redact(g.name)!r}" for g in gaps) or "unspecified"
            return PlannerAnswered(
                correlation=correlation,
                failure=storable_text(f"missing capabilities: {names}"),
                gaps=gaps,
            )
        if not isinstance(answer, Plan):
            return PlannerAnswered(
                correlation=correlation,
                failure=(
                    f"the planner returned {type(answer).__name__}, not a Plan, Clarify or Gaps"
                ),
            )
        try:
            self.validate(answer)
        except PlanRejected as exc:
            return PlannerAnswered(
                correlation=correlation, failure=f"the planner's plan is invalid: {exc}"
            )
        try:
            # As execute normalises it: a plan without an id gets its pass run's (None reads
            # as none), and a status its author set is ignored (E1).
            plan = normalised(msgspec.structs.replace(answer, id=answer.id or ""))
        except PlanRejected as exc:
            return PlannerAnswered(
                correlation=correlation, failure=f"the planner's plan is invalid: {exc}"
            )
        return PlannerAnswered(correlation=correlation, plan=_as_stored(plan))


class Orchestrator(pykka.ThreadingActor):
    """Drive one orchestration to its next stop: an ending, a wait, a crash or a close."""

    use_daemon_thread = True
    """A program that ends without ``close()`` must still exit (as the executor's)."""

    heartbeat_seconds: float = HEARTBEAT_SECONDS
    """How long the orchestration may be quiet before the orchestrator appends a heartbeat."""

    worker_stop_seconds: float = 5.0
    """How long an answer waits for an idle planner worker to stop (never for a busy one)."""

    def __init__(
        self,
        *,
        orchestrations: Orchestrations,
        drive: _Drive,
        directory: Directory,
        reply_to: str,
        correlation: str,
    ) -> None:
        super().__init__()
        self.o = orchestrations
        self.d = drive
        self.directory = directory
        self.reply_to = reply_to
        self.correlation = correlation
        self.address = directory.address("orchestrator", correlation)
        self.run_id = drive.state.run_id
        self._count = 0
        self._asked: str | None = None
        """Correlation of the planner call awaited, if any."""
        self._thinking: str | None = None
        """Correlation of the planner call the worker is still in, answered or not: a cancel or
        a drain stops awaiting it (``_asked``), but the worker stays busy until it returns."""
        self._pass: str | None = None
        """Correlation of the pass awaited, if any."""
        self._worker: Any = None
        self._draining = False
        self._heartbeat: threading.Timer | None = None
        self._last_append = time.monotonic()
        self._result: Outcome | None = None
        self._error: BaseException | None = None
        self._answered = False

    # -- lifecycle -------------------------------------------------------------------------------

    def on_start(self) -> None:
        """Take this orchestrator's address, where its worker and its passes answer."""
        self.directory.register(self.address, self.actor_ref)

    def on_stop(self) -> None:
        """Answer whoever waits for the orchestration (see :meth:`_settle`)."""
        self._settle()

    def on_failure(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        """Answer with the error that stopped the orchestrator (pykka calls this, not on_stop)."""
        if isinstance(exc_value, BaseException):
            self._error = exc_value
        self._settle()

    def _settle(self) -> None:
        """Stop the heartbeat and the worker, free the address, answer the starter once."""
        if self._answered:
            return
        self._answered = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        self.directory.unregister(self.address, self.actor_ref)
        if self._worker is not None:
            stopping = self._worker.stop(block=False)
            if self._thinking is None:
                # Idle: it stops at once, so whoever the answer wakes finds no actor left running.
                with contextlib.suppress(pykka.Timeout, pykka.ActorDeadError):
                    stopping.get(timeout=self.worker_stop_seconds)
            # Else a planner still thinking finishes, unheard; the worker stops after it.
        reply: object
        if self._result is not None:
            reply = OrchestrationStopped(correlation=self.correlation, outcome=self._result)
        else:
            error = self._error or RuntimeError(
                f"the orchestrator of {self.run_id} stopped before the orchestration did"
            )
            if isinstance(error, JournalClosed):
                error = self.o.closed_error(self.run_id)
            reply = failure(self.correlation, error)
        self.directory.tell(self.reply_to, reply)

    @property
    def worker(self) -> Any:
        """Return the planner worker's ref, if one was started."""
        return self._worker

    # -- messages --------------------------------------------------------------------------------

    def on_receive(self, message: object) -> object:
        """Dispatch one message."""
        if isinstance(message, PlannerAnswered | Failure) and message.correlation == self._thinking:
            self._thinking = None  # the worker is back, whether or not its answer still matters
        match message:
            case BeginOrchestration():
                self._arm_heartbeat()
                self._advance()
            case PlannerAnswered() if message.correlation == self._asked:
                self._asked = None
                self._append(*self.o.planned(self.d, message))
                self._advance()
            case PassStopped() if message.correlation == self._pass:
                self._pass = None
                self._append(*self.o.pass_ended(self.d, message.run_id))
                self._advance()
            case Failure() if message.correlation in (self._asked, self._pass):
                raise rebuild_error(message)
            case CancelOrchestration():
                if self._asked is not None:
                    # The planner's answer no longer matters: stop now, not when it returns.
                    self._asked = None
                    self._advance()
                # A pass in flight is cancelled as the orchestration's child run (E5).
            case DrainOrchestration():
                self._draining = True
                if self._asked is not None:
                    self._asked = None
                    self._advance()
            case OrchestrationTick():
                self._on_heartbeat()
            case PlannerAnswered() | PassStopped() | Failure():
                pass  # an answer nobody waits for any more (a cancel or a drain came first)
            case _:
                raise TypeError(f"orchestrator got an unknown message {type(message).__name__}")
        return None

    # -- the state machine -----------------------------------------------------------------------

    def _advance(self) -> None:
        """Decide from the phase until the orchestration stops or must wait for an answer."""
        d = self.d
        while d.state.ended is None:
            phase = d.state.phase
            if d.state.suspended is not None:
                # Its pass was suspended (R3): let go, journaled, nothing more is decided.
                raise self.o.closed_error(self.run_id)
            if phase != "reviewing" and self.o.cancel_requested(self.run_id):
                # A pass that ran is still reviewed: how it ended is what happened.
                summary = f"cancelled in pass {d.state.pass_no} ({phase})"
                self._append(self.o.end("failed", summary))
                break
            if phase in ("planning", "running") and (self._draining or self.o.closing):
                # Let go undecided, and say so in its stream (R3, R5, ADR 0087).
                self._append(self.o.suspend(d))
                raise self.o.closed_error(self.run_id)
            if phase == "planning":
                events = self.o.before_planning(d)
                if not events:
                    self._ask_planner()
                    return
                self._append(*events)
            elif phase == "settling":
                self._append(*self.o.settle(d))
            elif phase == "running":
                started = self.o.start_pass(d)
                if started is not None:
                    self._await_pass(*started)
                    return
                self._append(*self.o.pass_ended(d, d.state.pass_runs[d.state.pass_no]))
            else:
                self._append(*self.o.review(d))
        self._result = self.o.finish(d)
        self.stop()

    def _next(self, kind: str) -> str:
        self._count += 1
        return f"{self.correlation}.{kind}{self._count}"

    def _ask_planner(self) -> None:
        st = self.d.state
        started = st.started
        assert started is not None
        assert self.d.planner is not None
        if self._worker is None:
            self._worker = PlannerWorker.start(
                planner=self.d.planner,
                validate=self.o.validate,
                directory=self.directory,
                context=self.d.context,
                loop=self.o.loop,
            )
        self._asked = self._thinking = self._next("plan")
        self._worker.tell(
            AskPlanner(
                goal=started.goal,
                observations=self.o.observations(st),
                clarifications=list(st.clarifications),
                pass_no=st.pass_no,
                reply_to=self.address,
                correlation=self._asked,
            )
        )

    def _await_pass(self, run_id: str, future: Future[Any]) -> None:
        """Have the pass's handle tell this orchestrator, by address, when the run stops."""
        correlation = self._pass = self._next("pass")
        directory, address = self.directory, self.address

        def told(done: Future[Any]) -> None:
            error = done.exception()
            reply: object = (
                failure(correlation, error)
                if error is not None
                else PassStopped(correlation=correlation, run_id=run_id)
            )
            directory.tell(address, reply)

        future.add_done_callback(told)
        if self.o.cancel_requested(self.run_id):
            # A cancel that came between the check before the pass and the pass's start
            # found no child run to cancel: cancel it now (E5).
            self.o.cancel_pass(run_id)

    def _append(self, *events: Any) -> None:
        self.o.append(self.d, *events)
        self._last_append = time.monotonic()

    # -- heartbeat -------------------------------------------------------------------------------

    def _arm_heartbeat(self) -> None:
        ref = self.actor_ref

        def tick() -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(OrchestrationTick())

        self._heartbeat = threading.Timer(self.heartbeat_seconds, tick)
        self._heartbeat.daemon = True
        self._heartbeat.start()

    def _on_heartbeat(self) -> None:
        """Append a heartbeat if quiet, so other hosts see the owner alive (J3, ADR 0011)."""
        if self.d.state.ended is not None:
            return
        if time.monotonic() - self._last_append >= self.heartbeat_seconds:
            st = self.d.state
            self._append(RunHeartbeat(at=self.o.now(), owner=st.owner))
        self._arm_heartbeat()


def _describe_error(exc: Exception) -> str:
    """Name a planner's exception and its message, even when its ``str()`` raises."""
    try:
        text = str(exc)
    except Exception:  # user code again: an unprintable error still fails planning cleanly
        text = "(its message could not be read)"
    return f"{type(exc).__name__}: {text}"


def _gaps_problem(gaps: tuple[Gap, ...]) -> str | None:
    """Return why a planner's gaps cannot be journaled, or None (ADR 0023).

    Each field is a text as a clarifying question is: a string UTF-8 can store, at most
    :data:`MAX_TEXT_BYTES`; so are all of them together, so the gaps cost one question's bound.
    """
    total = 0
    for index, gap in enumerate(gaps):
        for name in ("kind", "name", "reason"):
            value = getattr(gap, name)
            # Journaled as it is, a non-string would make the journal unreadable, and a lone
            # surrogate would fail the append.
            problem = text_problem(value)
            if problem:
                return f"the planner's gap #{index} {name} {problem}"
            total += len(value.encode("utf-8"))
    if total > MAX_TEXT_BYTES:
        return (
            f"the planner's gaps are {total} bytes in UTF-8, over the {MAX_TEXT_BYTES}-byte bound"
        )
    return None


def _as_stored(plan: Plan) -> Plan:
    """Return the plan as the journal gives it back (lists, not tuples): live equals replay."""
    return msgspec.msgpack.decode(msgspec.msgpack.encode(plan), type=Plan)
