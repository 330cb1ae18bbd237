"""The plan executor: one actor per active run, the single writer of that run's stream.

It never blocks. It tells each step to a step actor and is told the outcome back; the bounds
(``max_parallel_steps`` batches, per-tool/skill/agent caps, the call budget, waiting) are plain
counters in its own thread. Every decision is an event folded into the run's :class:`RunFold`
first and appended before any step it starts is dispatched — so the journal always knows which
steps were in flight (E12, E14) — and a step's result is appended as soon as it comes (R4). When
the runtime closes, the executor starts nothing more, drains, and suspends (R3, ADR 0020).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pykka

from journaled.actors.directory import CountingInbox, failure
from journaled.actors.ownership import HEARTBEAT_SECONDS
from journaled.actors.run_recorder import Progress, RunRecorder, Trace
from journaled.actors.steps import Services, StepWorker, missing
from journaled.events.base import DomainEvent
from journaled.events.inputs import INT64_MAX
from journaled.events.journal import Journal
from journaled.events.plan_rules import (
    Reserve,
    ReserveFailed,
    cancelled_observation,
    cap_key,
    reservation,
    step_cap,
    waves,
)
from journaled.events.plans import (
    CANCELLED_ABORT,
    CANCELLED_BRANCH,
    SKIPPED_DEPENDENCY,
    ExecuteResult,
    Observation,
    Step,
)
from journaled.events.run_messages import (
    Begin,
    CancelRun,
    Drain,
    Heartbeat,
    RunEnded,
    RunStep,
    StepDeadline,
    StepDone,
    StepRetryDue,
    Suspend,
)
from journaled.events.run_state import RunFold
from journaled.events.runs import (
    BudgetStopped,
    CallsOverrun,
    CancelRequested,
    MemoryRead,
    RunFinished,
    RunHeartbeat,
    RunStatus,
    RunSuspended,
    StepFailed,
    StepRetrying,
    StepsSkipped,
    StepStarted,
    StepSucceeded,
    StepWaiting,
    WavePartitioned,
)

log = logging.getLogger("journaled.executor")
_STOP_TIMEOUT = 5.0


class Executor(pykka.ThreadingActor):
    """Execute one run to its next stop: completion, failure, a budget stop, a wait or a cancel."""

    use_daemon_thread = True
    """A program that ends without ``close()`` must still exit; the runtime's exit hook drains
    and closes first (R3)."""

    _create_actor_inbox = staticmethod(CountingInbox)

    heartbeat_seconds: float = HEARTBEAT_SECONDS
    """How long the run may be quiet before the executor appends a heartbeat."""

    def __init__(
        self,
        *,
        journal: Journal,
        services: Services,
        state: RunFold,
        opening: list[DomainEvent],
        reply_to: str,
        correlation: str,
        clock: Callable[[], int],
        cancel: threading.Event,
        reserve: Reserve | None = None,
        on_progress: Progress | None = None,
        trace: Trace | None = None,
        opened: threading.Event | None = None,
    ) -> None:
        super().__init__()
        self.journal = journal
        self.services = services
        self.registry = services.registry
        self.state = state
        self.clock = clock
        self.reply_to = reply_to
        self.correlation = correlation
        self.address = services.directory.address("executor", correlation)
        self._result: ExecuteResult | None = None
        self._error: BaseException | None = None
        self._answered = False
        self.cancel_token = cancel
        self.reserve = reserve
        self._opening = opening
        if services.tracing is not None:  # pykka builds actors in the starting thread (T3)
            services.tracing.starting(state)
        self.recorder = RunRecorder(
            journal,
            state,
            on_progress=on_progress,
            trace=trace,
            opened=opened,
            tracing=services.tracing,
        )
        self._to_dispatch: list[RunStep] = []
        self._in_flight: dict[str, tuple[int, Any, threading.Timer | None]] = {}
        self._batch_queue: list[Step] = []
        self._wave_rest: list[Step] = []
        self._in_batch = False
        self._wave_index = 0
        self._waves: list[list[Step]] = []
        self._idle: list[Any] = []
        self._workers: list[Any] = []
        self._running_per_key: dict[tuple[str, str], int] = {}
        self._abandoned: dict[tuple[str, int], Step] = {}
        """Attempts that timed out while their call ran on, by (step, attempt): each keeps its
        place under its cap until its late answer comes (E3)."""
        self._finished = False
        self._heartbeat: threading.Timer | None = None
        self._begun = False
        self._cancel_early = False
        self._reservations: dict[str, int | None] = {}
        """Each runnable agent's reservation, fixed when its wave was costed; None: unbounded."""
        self._step_tokens: dict[str, Any] = {}
        """Each step in flight's :class:`StepToken` (kept in ``services.cancellations``)."""
        self._reserve_errors: dict[str, str] = {}
        self._draining = False
        """The runtime is closing: start nothing more, suspend once nothing is in flight (R3)."""
        self._drain: tuple[float, str] = (0.0, "close")
        """(seconds the runtime drains, why) as told by :class:`Drain`."""
        self._interrupted: list[str] = []
        """Steps that came back without a result because the runtime is closing (R3)."""
        self._turn = threading.Lock()
        """Held while the run's state changes: by this actor's thread for each message, or by a
        worker's thread taking its own result (:meth:`take_result`, ADR 0043)."""
        self._handled = 0
        """Messages taken from the inbox so far: fewer than were put means one waits (its turn
        comes before a result a worker would take, so a cancel or drain told first acts first)."""
        self._failed = False
        """Handling a message or taking a result raised: the executor stops with that error."""
        self._mailbox = _Mailbox(self)

    # -- messages --------------------------------------------------------------------------------

    def on_receive(self, message: object) -> object:
        """Dispatch one message, holding the run's turn."""
        with self._turn:
            self._handled += 1
            if self._failed:
                return None
            try:
                self._receive(message)
            except BaseException:
                # Failed before the turn is given back: no worker may take a result into the
                # broken run meanwhile; pykka stops the actor and on_failure answers.
                self._failed = True
                raise
        return None

    def take_result(self, done: StepDone) -> bool:
        """Fold and append a step's result in the calling (worker's) thread, if the run is free.

        Returns False, having done nothing, when the executor is busy with a message or has one
        waiting in its inbox (told before this result, it is handled first: a cancel stops
        scheduling, E5, and a drain starts nothing more, R3), has not begun or has ended, or
        spans are derived (T3 derives them in the executor's thread): the caller then tells the
        result to the executor's address. An error stops the executor with that error, as it
        would in the executor's own thread.
        """
        if self.recorder.tracing is not None or not self._turn.acquire(blocking=False):
            return False
        try:
            inbox = self.actor_inbox
            waiting = not isinstance(inbox, CountingInbox) or inbox.puts != self._handled
            if waiting or self._failed or self._finished or not self._begun:
                return False
            try:
                self._on_done(done)
            except BaseException as exc:
                self._failed = True
                self._error = exc
                log.debug("taking the result of step %s failed", done.step_id, exc_info=True)
                self.stop()  # on_stop answers whoever waits with the error (see _settle)
            return True
        finally:
            self._turn.release()

    def _receive(self, message: object) -> None:
        match message:
            case Begin():
                for event in self._opening:
                    self.recorder.stage(event)
                self._begun = True
                self._waves = waves([self.state.steps[i] for i in self.state.order])
                if self._cancel_early:
                    self._on_cancel()
                else:
                    self._advance()
                self._arm_heartbeat()
            case Heartbeat():
                self._on_heartbeat()
            case StepDone():
                self._on_done(message)
            case StepDeadline(step_id=step_id, attempt=attempt):
                self._on_deadline(step_id, attempt)
            case CancelRun():
                self._on_cancel()
            case Drain(drain=drain, cause=cause):
                self._on_drain(drain, cause)
            case Suspend():
                self._on_suspend()
            case StepRetryDue(step_id=step_id, attempt=attempt):
                self._on_retry_due(step_id, attempt)
            case _:
                raise TypeError(f"executor got an unknown message {type(message).__name__}")

    def _arm_heartbeat(self) -> None:
        if self._finished:
            return
        ref = self.actor_ref

        def tick() -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(Heartbeat())

        self._heartbeat = threading.Timer(self.heartbeat_seconds, tick)
        self._heartbeat.daemon = True
        self._heartbeat.start()

    def _on_heartbeat(self) -> None:
        """Append a heartbeat if the run was quiet, so other hosts see its owner alive."""
        if self._finished:
            return
        if time.monotonic() - self.recorder.last_append >= self.heartbeat_seconds:
            self.recorder.stage(RunHeartbeat(at=self.clock(), owner=self.state.owner))
            self.recorder.flush()
        self._arm_heartbeat()

    def on_start(self) -> None:
        """Take this executor's address, where step workers tell it how their steps went."""
        self.services.directory.register(self.address, self._mailbox)

    def on_stop(self) -> None:
        """Answer whoever waits for the run (see :meth:`_settle`)."""
        with self._turn:  # a worker that ended the run may still be on its way out
            self._settle()

    def on_failure(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        """Answer whoever waits for the run with the error that stopped the executor.

        pykka calls this instead of ``on_stop`` when a told message raised; the actor is
        already unregistered and marked stopped.
        """
        if isinstance(exc_value, BaseException):
            self._error = exc_value
        with self._turn:
            self._settle()

    def _settle(self) -> None:
        """Stop the heartbeat and the workers, free the address, answer the run's starter once.

        Runs when pykka has already unregistered the actor, so whoever the answer wakes finds it
        stopped; an executor that stops without a result (it crashed, or was stopped from
        outside) answers with the error.
        """
        if self._answered:
            return
        self._answered = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        self.services.directory.unregister(self.address, self._mailbox)
        for undispatched in self._to_dispatch:  # their workers, which would close them, never ran
            self.services.cancellations.close(
                undispatched.run_id, undispatched.step.id, undispatched.attempt
            )
        self._to_dispatch = []
        self._stop_workers()
        if self.recorder.tracing is not None:  # spans the run left open end here (T3)
            self.recorder.tracing.settled(self.state.run_id)
        reply: object
        if self._result is not None:
            reply = RunEnded(correlation=self.correlation, result=self._result)
        else:
            error = self._error or RuntimeError(
                f"the executor of run {self.state.run_id} stopped before the run did"
            )
            reply = failure(self.correlation, error)
        self.services.directory.tell(self.reply_to, reply)

    # -- scheduling ------------------------------------------------------------------------------

    def _advance(self) -> None:
        """Run the state machine until it must wait for a step or the run ends."""
        while not self._finished:
            if self._in_flight or self._to_dispatch:
                self._flush_and_dispatch()
                return
            if self._in_batch:
                self._in_batch = False
                self.recorder.note("batch")
            if self.state.cancel_requested and self._wave_rest:
                self._skip_for_cancel(self._wave_rest)
                self._wave_rest = []
            if self._draining and not self.state.cancel_requested and self._work_left():
                self._suspend()
                return
            if self._wave_rest:
                self._start_batch()
                continue
            if self.state.waiting:
                if self.state.cancel_requested:
                    # Cancelled while its step ran, a step that then asked is skipped: its
                    # answer would never be used, and the run ends cancelled (E5, E10).
                    self._skip_for_cancel([self.state.steps[i] for i in self.state.waiting])
                    continue
                self._finish("waiting")
                return
            if not self._partition_next_wave():
                self._finish(self._final_status())
                return

    def _work_left(self) -> bool:
        """Tell whether the run has steps still to start (or to start again) in this pass."""
        if self._wave_rest or self._batch_queue or self._interrupted:
            return True
        if self.state.waiting:
            return False  # the pass ends waiting after this wave anyway
        return any(self.state.status[i] == "pending" for i in self.state.order)

    def _partition_next_wave(self) -> bool:
        """Partition the next wave with pending steps; False when there is none or a stop."""
        state = self.state
        while self._wave_index < len(self._waves):
            number = self._wave_index + 1
            wave = [s for s in self._waves[self._wave_index] if state.status[s.id] == "pending"]
            self._wave_index += 1
            if not wave:
                continue
            runnable: list[Step] = []
            skipped: list[Observation] = []
            unobserved: list[str] = []
            for step in wave:
                deps = [state.status[d] for d in step.depends_on]
                if state.cancel_requested:
                    if step.agent is not None:
                        skipped.append(cancelled_observation(step, CANCELLED_ABORT, agent=True))
                    else:
                        unobserved.append(step.id)
                elif any(d in ("failed", "skipped") for d in deps):
                    if any(d in state.cancelled for d in step.depends_on):
                        skipped.append(cancelled_observation(step, CANCELLED_BRANCH, agent=False))
                    else:
                        skipped.append(
                            Observation(step_id=step.id, ok=False, error=SKIPPED_DEPENDENCY)
                        )
                elif all(d == "succeeded" for d in deps):
                    runnable.append(step)
            self.recorder.stage(
                WavePartitioned(
                    at=self.clock(),
                    wave=number,
                    runnable=tuple(s.id for s in runnable),
                    skipped=tuple(skipped),
                    unobserved=tuple(unobserved),
                )
            )
            self.recorder.note("wave-partition")
            budget = state.budget
            estimate = self._reserve_wave(runnable, budget)
            if (
                budget is not None
                and runnable
                and estimate > 0
                and state.calls_used + estimate > budget
            ):
                self.recorder.stage(
                    BudgetStopped(
                        at=self.clock(),
                        wave=number,
                        estimate=estimate,
                        used=state.calls_used,
                        budget=budget,
                        pending=tuple(s.id for s in runnable),
                    )
                )
                self.recorder.note("budget-stop")
                return False
            self._wave_rest = runnable
            return True
        return False

    def _reserve_wave(self, runnable: list[Step], budget: int | None) -> int:
        """Cost a wave's steps in order against the declining remainder (E6), keeping each
        agent's reservation: the gate, ``ctx.reservation`` and the charge all use that number."""
        remaining = math.inf if budget is None else float(budget - self.state.calls_used)
        total = 0
        for step in runnable:
            if step.skill is not None:
                cost = 1
            elif step.agent is None:
                cost = 0
            else:
                try:
                    reserved = reservation(step, remaining, self.reserve)
                except ReserveFailed as exc:  # a failing reserve fails its step, not the run
                    self._reserve_errors[step.id] = str(exc)
                    reserved = 0
                if reserved is not None and total + reserved > INT64_MAX:
                    # The wave's estimate is journaled (E6): one a journal cannot hold fails
                    # the step that would carry it over, as any answer it cannot store.
                    self._reserve_errors[step.id] = (
                        f"reserve failed for agent {step.agent!r}: its answer {reserved} takes "
                        f"the wave's estimate past what a journal holds ({INT64_MAX})"
                    )
                    reserved = 0
                self._reservations[step.id] = reserved
                cost = reserved or 0  # unbounded only without a budget: nothing to gate
            total += cost
            remaining -= cost
        return total

    def _start_batch(self) -> None:
        size = max(1, self._started().max_parallel_steps)
        batch, self._wave_rest = self._wave_rest[:size], self._wave_rest[size:]
        self._batch_queue = list(batch)
        self._in_batch = True
        self._start_what_fits()

    def _start_what_fits(self) -> None:
        """Start the queued steps of the batch whose per-key cap has room (E3)."""
        if self._draining:
            return  # the runtime is closing: the queued steps stay pending (R3)
        waiting: list[Step] = []
        for step in self._batch_queue:
            key = cap_key(step)
            cap = step_cap(self._started().limits, step)
            if cap is not None and self._running_per_key.get(key, 0) >= max(1, cap):
                waiting.append(step)
                continue
            self._start(step)
        self._batch_queue = waiting

    def _start(self, step: Step) -> None:
        attempt = self.state.attempts.get(step.id, 0) + 1
        self.recorder.stage(
            StepStarted(at=self.clock(), step_id=step.id, attempt=attempt, wave=self.state.wave)
        )
        if self.registry.lookup(step) is None:
            self._record(step, attempt, missing(step), None, ran=False)
            return
        problem = self._reserve_errors.pop(step.id, None)
        if problem is not None:
            obs = Observation(
                step_id=step.id, agent=step.agent, ok=False, code="agent-failed", error=problem
            )
            self._record(step, attempt, obs, None, ran=False)
            return
        key = cap_key(step)
        self._running_per_key[key] = self._running_per_key.get(key, 0) + 1
        reserved = self._reservations.get(step.id, 0)
        # This attempt's token: set by a cancel of the run or by its deadline; the worker finds
        # it by (run, step, attempt), so the message holds no live object (A4).
        token = self.services.cancellations.open(self.state.run_id, step.id, attempt)
        if self.cancel_token.is_set():
            token.set()
        self._step_tokens[step.id] = token
        self._to_dispatch.append(
            RunStep(
                run_id=self.state.run_id,
                step=step,
                attempt=attempt,
                reservation=reserved,
                answer=self.state.answers.get(step.id),
                reply_to=self.address,
            )
        )

    def _flush_and_dispatch(self) -> None:
        self.recorder.flush()
        dispatch, self._to_dispatch = self._to_dispatch, []
        timeout = self._started().step_timeout
        for msg in dispatch:
            worker = self._worker()
            timer = None
            if timeout is not None:
                timer = threading.Timer(
                    timeout,
                    self.actor_ref.tell,
                    args=(StepDeadline(step_id=msg.step.id, attempt=msg.attempt),),
                )
                timer.daemon = True
                timer.start()
            self._in_flight[msg.step.id] = (msg.attempt, worker, timer)
            worker.tell(msg)

    def _on_done(self, msg: StepDone) -> None:
        flight = self._in_flight.get(msg.step_id)
        if flight is None or flight[0] != msg.attempt or flight[1] is None:
            # An attempt that already timed out: its late answer is not journaled, nor is it
            # taken for the attempt waiting out its backoff (no worker) when it was retried.
            # Its call has ended, though: its place under the cap is free (E3).
            held = self._abandoned.pop((msg.step_id, msg.attempt), None)
            if held is not None:
                self._release(held)
                if self._begun and not self._finished and self._batch_queue:
                    self._after_a_step_ended()
            return
        _, worker, timer = self._in_flight.pop(msg.step_id)
        if timer is not None:
            timer.cancel()
        step = self.state.steps[msg.step_id]
        self._step_tokens.pop(msg.step_id, None)
        self._idle.append(worker)
        self._release(step)
        if msg.interrupted:
            # The runtime is closing under it (a child run was suspended): no result; the step
            # stays in flight in the journal and runs again on resume (R3).
            self._interrupted.append(step.id)
            self._draining = True
        else:
            if msg.reads or msg.read_ops or (msg.memory and msg.attempt > 1):
                # Ids only, once per attempt, in the commit of its result (P1, ADR 0033); a
                # re-run that read nothing says so, and an earlier attempt's reads no longer
                # stand for the result (ADR 0062).
                self.recorder.stage(
                    MemoryRead(
                        at=self.clock(),
                        step_id=step.id,
                        attempt=msg.attempt,
                        fact_ids=msg.reads,
                        ops=msg.read_ops,
                        read_position=msg.read_position,
                        read_at=msg.read_at,
                    )
                )
            # A step its placement refused before it ran is neither charged nor retried (R6).
            if not (
                msg.ran
                and self.registry.retries
                and self._retry_later(step, msg.attempt, msg.observation, msg.question)
            ):
                self._record(step, msg.attempt, msg.observation, msg.question, ran=msg.ran)
        self._after_a_step_ended()

    def _on_deadline(self, step_id: str, attempt: int) -> None:
        flight = self._in_flight.get(step_id)
        if flight is None or flight[0] != attempt or flight[1] is None:
            return  # it answered, or it waits to be retried (S2)
        _, worker, _ = self._in_flight.pop(step_id)
        token = self._step_tokens.pop(step_id, None)
        if token is not None:
            token.set("deadline")  # tell the code still running its result is no longer wanted
        worker.stop(block=False)  # it is stuck in user code: abandon it, it ends when that returns
        self._workers.remove(worker)
        step = self.state.steps[step_id]
        # Its call still runs: it keeps its place under the step's cap until it returns (E3).
        self._abandoned[(step_id, attempt)] = step
        timeout = self._started().step_timeout
        error = f"timed out after {timeout}s"
        obs = Observation(
            step_id=step.id,
            ok=False,
            error=error,
            code="agent-timeout" if step.agent is not None else None,
            skill=step.skill,
            tool=step.tool,
            agent=step.agent,
            # The child its agent started goes on; the step names it (E9, ADR 0020).
            agent_task_id=token.child if token is not None and step.agent is not None else None,
        )
        if not (self.registry.retries and self._retry_later(step, attempt, obs, None)):
            self._record(step, attempt, obs, None)
        self._after_a_step_ended()

    def _after_a_step_ended(self) -> None:
        """After a step ended: start what now fits, then wait, dispatch, or move on."""
        self._start_what_fits()
        if (
            not self._in_flight
            and not self._to_dispatch
            and (not self._batch_queue or self._draining)
        ):
            self._advance()
        else:
            # The result is appended now, whatever its siblings are doing, so a crash re-runs
            # only the steps still in flight (R4; ADR 0020 amends ADR 0008).
            self._flush_and_dispatch()

    def _on_cancel(self) -> None:
        if not self._begun:
            self._cancel_early = True  # a cancel that overtook Begin applies right after it
            return
        if self._finished or self.state.cancel_requested:
            return
        self.cancel_token.set()
        for token in self._step_tokens.values():
            token.set()
        if self.registry.retries:
            self._retries_due_now()
        self.recorder.stage(CancelRequested(at=self.clock()))
        if self._batch_queue:
            self._skip_for_cancel(self._batch_queue)
            self._batch_queue = []
        if not self._in_flight:
            self._advance()
        else:
            self.recorder.flush()

    def _on_drain(self, drain: float, cause: str) -> None:
        """Stop taking work; suspend at once if nothing is in flight (R3)."""
        self._draining = True
        self._drain = (drain, cause)
        if self.registry.retries:
            self._retries_due_now()
        if self._begun and not self._finished and not self._in_flight:
            self._advance()

    def _on_suspend(self) -> None:
        """The drain time is up: suspend with the steps still in flight (R3)."""
        self._draining = True
        if self._begun and not self._finished:
            self._suspend()

    def _suspend(self) -> None:
        """Journal ``run.suspended`` and stop; steps still in flight run again on resume (R3)."""
        abandoned = list(self._in_flight.items())
        self._in_flight.clear()
        for step_id, (_, worker, timer) in abandoned:
            if timer is not None:
                timer.cancel()
            token = self._step_tokens.get(step_id)
            if token is not None:
                token.set("suspended")  # its result is no longer wanted: it runs again on resume
            if worker is not None:  # None: it waited to be retried (S2)
                worker.stop(block=False)  # busy in user code: abandoned, it ends when that returns
                self._workers.remove(worker)
        # A retry queued for room under its cap is in flight too: started, with no result yet.
        queued = {s.id for s in self._batch_queue if self.state.status.get(s.id) == "running"}
        pending = {i for i, _ in abandoned} | set(self._interrupted) | queued
        drain, cause = self._drain
        self.recorder.stage(
            RunSuspended(
                at=self.clock(),
                in_flight=tuple(i for i in self.state.order if i in pending),
                drain=drain,
                cause=cause,
            )
        )
        self.recorder.note("suspended")
        self._end()

    def _skip_for_cancel(self, steps: list[Step]) -> None:
        observations = tuple(
            cancelled_observation(s, CANCELLED_ABORT, agent=True) for s in steps if s.agent
        )
        unobserved = tuple(s.id for s in steps if s.agent is None)
        self.recorder.stage(
            StepsSkipped(at=self.clock(), observations=observations, unobserved=unobserved)
        )

    def _record(
        self,
        step: Step,
        attempt: int,
        obs: Observation,
        question: str | None,
        *,
        ran: bool = True,
    ) -> None:
        """Turn a step's observation into its event, charging calls (E8, R6).

        A step that did not run (its skill, tool or agent is missing, its reserve failed, its
        placement refused it before sending it: ``StepDone.ran``) is charged nothing; an agent
        reporting more calls than its reservation is charged what it reported and the overrun is
        journaled next to its result.
        """
        if not ran:
            charged, overrun = 0, None
        elif question is not None and step.agent is not None and obs.calls_used is None:
            # It waits and runs again: the reservation is charged when it finishes.
            charged, overrun = 0, None
        else:
            charged, overrun = self._charge(step, attempt, obs)
        room = INT64_MAX - self.state.calls_used
        if charged > room:
            # Each report fits a journal, their sum need not: the run's total would be one it
            # cannot hold, and every resume would fail the same way. The step fails instead,
            # charged its reservation as far as the total allows (E8, R6).
            charged, overrun, question = min(self._reservations.get(step.id) or 0, room), None, None
            obs = msgspec.structs.replace(
                obs,
                ok=False,
                output=None,
                code="agent-failed",
                error=f"calls_used {obs.calls_used} takes the run's calls past what a journal "
                f"holds ({INT64_MAX}); charged its reservation",
            )
        at = self.clock()
        event: DomainEvent
        if question is not None:
            event = StepWaiting(
                at=at,
                step_id=step.id,
                attempt=attempt,
                question=question,
                observation=obs,
                charged=charged,
            )
        elif obs.ok:
            event = StepSucceeded(
                at=at, step_id=step.id, attempt=attempt, observation=obs, charged=charged
            )
        else:
            policy = self.registry.retry_of(step) if self.registry.retries else None
            event = StepFailed(
                at=at,
                step_id=step.id,
                attempt=attempt,
                observation=obs,
                charged=charged,
                attempts=0 if policy is None else policy.attempts,
            )
        self.recorder.stage(event)
        if overrun is not None:
            self.recorder.stage(overrun)

    def _charge(
        self, step: Step, attempt: int, obs: Observation
    ) -> tuple[int, CallsOverrun | None]:
        """Return what an attempt that ran is charged (E8) and its overrun, if it had one (R6).

        A skill made its model call; a tool is free; an agent is charged what it reported,
        else its reservation (an unbounded one, with no budget, charges nothing unreported).
        """
        if step.skill is not None:
            return 1, None
        if step.agent is None or obs.code == "agent-not-enabled":
            return 0, None
        reserved = self._reservations.get(step.id, 0)
        if obs.calls_used is None:
            return reserved or 0, None
        charged = obs.calls_used
        if reserved is None or charged <= reserved:
            return charged, None
        overrun = CallsOverrun(
            at=self.clock(), step_id=step.id, attempt=attempt, reserved=reserved, reported=charged
        )
        return charged, overrun

    # -- retries (S2, ADR 0046): none of this runs unless a registration has a retry policy -----

    def _retry_later(
        self, step: Step, attempt: int, obs: Observation, question: str | None
    ) -> bool:
        """Journal a failed attempt as ``run.step-retrying`` and arm its backoff, if its policy
        allows another attempt; False when the failure is the step's result.

        The policy's ``attempts`` bounds failed attempts (``run.step-retrying`` folded into
        ``RunFold.retried``), not started ones: an attempt a crash cut short and resume started
        again (E14) costs nothing. An attempt failing while the runtime closes is journaled as
        retrying but not started again here: it is left in flight for resume (R3).
        """
        policy = self.registry.retry_of(step)
        failures = self.state.retried.get(step.id, 0) + 1
        if (
            policy is None
            or obs.ok
            or question is not None
            or failures >= policy.attempts
            or obs.code in ("cancelled", "agent-not-enabled")
            or self.state.cancel_requested
        ):
            return False
        charged, overrun = self._charge(step, attempt, obs)
        delay = policy.delay(failures)
        self.recorder.stage(
            StepRetrying(
                at=self.clock(),
                step_id=step.id,
                attempt=attempt,
                observation=obs,
                charged=charged,
                delay=delay,
                attempts=policy.attempts,
            )
        )
        if overrun is not None:  # each attempt's overrun is told, not only the last one's (R6)
            self.recorder.stage(overrun)
        if self._draining:
            self._interrupted.append(step.id)  # no new attempt now: resume runs it (R3)
            return True
        timer = threading.Timer(
            delay, self.actor_ref.tell, args=(StepRetryDue(step_id=step.id, attempt=attempt),)
        )
        timer.daemon = True
        timer.start()
        # In flight with no worker while it waits: the batch does not move on without it.
        self._in_flight[step.id] = (attempt, None, timer)
        return True

    def _retries_due_now(self) -> None:
        """End every backoff at once: a cancel or a drain does not wait for them."""
        for step_id, (attempt, worker, timer) in list(self._in_flight.items()):
            if worker is None and timer is not None:
                timer.cancel()
                self.actor_ref.tell(StepRetryDue(step_id=step_id, attempt=attempt))

    def _on_retry_due(self, step_id: str, attempt: int) -> None:
        """Start the step's next attempt — or, once the run is cancelled or the runtime closes,
        skip it (E5) or leave it to run again on resume (R3)."""
        flight = self._in_flight.get(step_id)
        if flight is None or flight[0] != attempt or flight[1] is not None:
            return
        del self._in_flight[step_id]
        step = self.state.steps[step_id]
        if self.state.cancel_requested:
            self._skip_for_cancel([step])
        elif self._draining:
            self._interrupted.append(step_id)
        else:
            self._batch_queue.insert(0, step)  # first in line, when its cap has room (E3)
        self._after_a_step_ended()

    def _release(self, step: Step) -> None:
        key = cap_key(step)
        self._running_per_key[key] = self._running_per_key.get(key, 1) - 1

    def _final_status(self) -> RunStatus:
        state = self.state
        if state.stopped_for_budget:
            return "stopped_for_budget"
        if all(state.status[i] == "succeeded" for i in state.order):
            # Also after a cancel that came too late to stop anything: every step ran and
            # succeeded, so the run's work is complete and is not reported otherwise (E5).
            return "completed"
        if state.cancel_requested:
            return "cancelled"
        return "failed"

    def _finish(self, status: RunStatus) -> None:
        state = self.state
        ok = status == "completed"
        self.recorder.stage(
            RunFinished(
                at=self.clock(),
                status=status,
                ok=ok,
                calls_used=state.calls_used,
                waiting=tuple(state.waiting),
            )
        )
        self.recorder.note("plan-end")
        self._end()

    def _end(self) -> None:
        """Append what is staged with a snapshot, answer whoever waits, and stop."""
        state = self.state
        self.recorder.flush(snapshot=True)
        self._finished = True
        self._result = state.result()
        self.stop()  # on_stop stops the workers and answers

    # -- workers ---------------------------------------------------------------------------------

    def _worker(self) -> Any:
        if self._idle:
            return self._idle.pop()
        worker = StepWorker.start(self.services)
        self._workers.append(worker)
        return worker

    def _stop_workers(self) -> None:
        """Stop the step actors (all idle by now): fire every stop, then wait on each."""
        workers, self._workers = self._workers, []
        self._idle.clear()
        futures = [worker.stop(block=False) for worker in workers]
        for future in futures:
            with contextlib.suppress(pykka.Timeout, pykka.ActorDeadError):
                future.get(timeout=_STOP_TIMEOUT)

    def _started(self) -> Any:
        started = self.state.started
        assert started is not None
        return started


class _Mailbox:
    """An executor's address: messages go to its inbox; a worker may take its result itself."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor
        self._ref = executor.actor_ref

    def tell(self, message: Any) -> None:
        """Put a message in the executor's inbox."""
        self._ref.tell(message)

    def take_result(self, done: StepDone) -> bool:
        """Fold and append a step's result in this thread if the executor is free (ADR 0043)."""
        return self._executor.take_result(done)
