"""Orchestration: plan, approve, fit the budget, execute passes, replan (SPEC section 3).

:class:`Orchestrations` checks and journals what a caller asks (start, resume, cancel) and holds
the decisions of the state machine (ADR 0022); an :class:`~journaled.actors.orchestrator_actor.
Orchestrator` actor per orchestration being driven is the single writer of its stream and applies
them, never blocking (ADR 0029): the planner runs in a worker, each pass as a child run on the
executor (``actors.runs``). Planner code is user code: whatever it raises or returns, the
orchestration answers with an :class:`Outcome` — a planning failure is the ``failed`` status with
the reason in the summary and in the journal.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError, wait
from dataclasses import dataclass, field
from typing import Any

import pykka

from journaled.actors.directory import Directory, Inbox
from journaled.actors.errors import (
    RunNotFound,
    RunNotResumable,
    RunOwnedElsewhere,
    RuntimeClosed,
)
from journaled.actors.loop import LoopRunner
from journaled.actors.orchestrator_actor import Orchestrator
from journaled.actors.ownership import owner_alive, this_process
from journaled.actors.run_args import check_budget, find_policy, new_run_id, policy_name
from journaled.actors.run_recorder import Progress
from journaled.actors.runs import RunHandle, Runs, check_callable, running_future
from journaled.events.base import DomainEvent, Event, Pending
from journaled.events.codec import tag_of
from journaled.events.errors import ConcurrencyConflict, JournalClosed
from journaled.events.inputs import short
from journaled.events.journal import Journal
from journaled.events.orchestration import (
    ApprovalRequested,
    Budget,
    BudgetAwaited,
    ClarificationRequested,
    Gap,
    Mode,
    OrchestrationEnded,
    OrchestrationResumed,
    OrchestrationStarted,
    OrchestrationSuspended,
    Outcome,
    OutcomeStatus,
    PassEnded,
    PassStarted,
    PlanningFailed,
    PlanProposed,
    ReplanDecided,
)
from journaled.events.orchestration_messages import (
    BeginOrchestration,
    CancelOrchestration,
    DrainOrchestration,
    OrchestrationStopped,
    PlannerAnswered,
)
from journaled.events.orchestration_state import OrchestrationState, fold_orchestration
from journaled.events.plan_rules import Reserve, fold_calls
from journaled.events.plans import ExecuteResult, Observation, Plan
from journaled.events.redact import redact_data
from journaled.events.run_state import RunFold

Planner = Callable[[str, list[Observation], list[tuple[str, str]]], Any]
"""``planner(goal, observations, clarifications) -> Plan | Clarify | Gaps``."""

OrchestrationTrace = Callable[[int, OrchestrationState], None]
"""``trace(position, state)``: the live state (a copy) right after each appended event."""

MODES: tuple[str, ...] = ("plan", "execute", "orchestrate")


@dataclass
class _Drive:
    state: OrchestrationState
    planner: Planner | None
    reserve: Reserve | None
    on_progress: Progress | None
    answers: dict[str, str] = field(default_factory=dict)
    take_over: bool = False
    trace: OrchestrationTrace | None = None
    context: contextvars.Context = field(default_factory=contextvars.Context)
    """The context of the thread that started or resumed the orchestration: its passes start
    in a copy of it, so a span current there is their runs' parent (T3, ADR 0070)."""


_IN_PROCESS_LOCK = threading.Lock()
_DRIVEN_IN_PROCESS: set[str] = set()
"""Orchestrations an ``orchestrate`` or ``resume`` of any runtime in this process drives now."""


def driven_in_process(run_id: str) -> bool:
    """Tell whether an ``orchestrate`` or ``resume`` of this process drives it now (T2, 0088)."""
    with _IN_PROCESS_LOCK:
        return run_id in _DRIVEN_IN_PROCESS


class Orchestrations:
    """Start and resume orchestrations over the runs of one runtime."""

    def __init__(
        self, journal: Journal, runs: Runs, clock: Callable[[], int], directory: Directory
    ) -> None:
        self._journal = journal
        self._runs = runs
        self._clock = clock
        self._planners: dict[str, Planner] = {}
        self._lock = threading.Lock()
        self._driving: set[str] = set()
        """Orchestrations an ``orchestrate`` or ``resume`` of this runtime drives now (R8)."""
        self._cancelled: set[str] = set()
        self._actors: dict[str, tuple[Any, Future[Outcome]]] = {}
        """run id -> the orchestrator actor driving it now, and the future its answer completes."""
        self._directory = directory
        self._inbox = Inbox(self._directory, "orchestrations")

    # -- entry points ----------------------------------------------------------------------------

    def orchestrate(self, *args: Any, **options: Any) -> Outcome:
        """Plan toward a goal and run it; wait for it to stop (O1-O5). See :meth:`start`."""
        return self.start(*args, **options).result()

    def start(
        self,
        goal: str,
        planner: Planner,
        mode: str = "execute",
        call_budget: int | None = None,
        partial: bool = False,
        require_approval: bool = False,
        *,
        reserve: Reserve | None = None,
        on_progress: Progress | None = None,
        max_passes: int = 3,
        trace: OrchestrationTrace | None = None,
    ) -> RunHandle[Outcome]:
        """Start planning toward a goal and running it; return its handle at once (O1-O5, A2).

        Everything it refuses is refused here, before anything is appended; the orchestration's
        ``orchestration.started`` is committed when this returns. The planner and the passes run
        on the orchestrator actor and its workers, never in the caller's thread.
        """
        if not isinstance(goal, str) or not goal.strip():
            raise ValueError("goal must be a non-empty string")
        if not callable(planner):
            raise ValueError(f"planner must be callable, got {type(planner).__name__}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        check_budget("call_budget", call_budget)
        if isinstance(max_passes, bool) or not isinstance(max_passes, int) or max_passes < 1:
            raise ValueError(f"max_passes must be an int >= 1, got {max_passes!r}")
        check_callable("reserve", reserve)
        check_callable("on_progress", on_progress)
        if self._runs.closing:
            raise RuntimeClosed("the runtime is closed: open a new one with journaled.open()")
        run_id = new_run_id(self._clock())
        self._hold(run_id)
        try:
            self._planners[run_id] = planner
            drive = _Drive(
                OrchestrationState(),
                planner,
                reserve,
                on_progress,
                trace=trace,
                context=contextvars.copy_context(),
            )
            self.append(
                drive,
                OrchestrationStarted(
                    at=self._clock(),
                    run_id=run_id,
                    goal=goal,
                    mode=_mode(mode),
                    call_budget=call_budget,
                    partial=bool(partial),
                    require_approval=bool(require_approval),
                    max_passes=max_passes,
                    reserve=policy_name(reserve),
                    owner=this_process(),
                    organization=self._runs._organization,
                ),
            )
            self._runs._given_policies.remember(run_id, reserve)
        except JournalClosed as exc:
            self._let_go(run_id)
            raise _closed(run_id) from exc
        except BaseException:
            self._let_go(run_id)
            raise
        return self._spawn(drive)

    def _hold(self, run_id: str) -> None:
        """Claim an orchestration for one caller in this process, or raise RunOwnedElsewhere.

        Taken before its state is read, so a resume never appends beside a drive that is still
        running in this process (R8), from this runtime or another one; another process is kept
        out by the owner check and the stream's versions.
        """
        with _IN_PROCESS_LOCK:
            if run_id in _DRIVEN_IN_PROCESS:
                raise RunOwnedElsewhere(
                    f"orchestration {run_id} is being driven in this process right now; wait "
                    "for that orchestrate or resume to return before resuming it"
                )
            _DRIVEN_IN_PROCESS.add(run_id)
        with self._lock:
            self._driving.add(run_id)

    def _let_go(self, run_id: str) -> None:
        with self._lock:
            self._driving.discard(run_id)
            self._cancelled.discard(run_id)
            self._actors.pop(run_id, None)
        with _IN_PROCESS_LOCK:
            _DRIVEN_IN_PROCESS.discard(run_id)

    def cancel(self, run_id: str) -> bool:
        """Ask an orchestration driven in this runtime to stop before its next step (E5).

        Its pass's run is cancelled by ``Runs.cancel`` (the pass is a child run); this stops the
        orchestration itself: no plan is settled, no pass started, no replan after the call.
        Return False when this runtime is not driving it.
        """
        with self._lock:
            if run_id not in self._driving:
                return False
            self._cancelled.add(run_id)
            driven = self._actors.get(run_id)
        if driven is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                driven[0].tell(CancelOrchestration())  # wakes it while it waits for the planner
        return True

    def cancel_at_rest(self, run_id: str, timeout: float = 30.0) -> bool:
        """End as failed (cancelled) an orchestration no process drives; False if none (E5).

        One waiting for approval, a clarification, an answer or budget, suspended, or left by a
        crash is taken up as a resume takes it (R8: never one a live process drives). Its
        current pass run, when it is not finished, is cancelled first as a run at rest is
        (``Runs.cancel_at_rest``), then ``orchestration.resumed`` and ``orchestration.ended``
        (failed, as a cancel of a driven orchestration ends) are appended together (ADR 0075).
        """
        try:
            state = self.state(run_id)
        except RunNotFound:
            return False
        if state.purged is not None or state.status in ("completed", "failed", "dry_run"):
            return False
        try:
            self._hold(run_id)
        except RunOwnedElsewhere:
            return False
        try:
            pass_state = self._pass_state(state)
            suspended = state.suspended is not None or (
                pass_state is not None and pass_state.suspended is not None
            )
            if state.ended is None and not suspended:
                self._check_not_driven(state, take_over=False)
            unfinished = pass_state is not None and not (
                pass_state.is_finished
                and pass_state.run_status in ("completed", "failed", "cancelled")
            )
            pass_run = pass_state.run_id if pass_state is not None and unfinished else None
            if pass_run is not None and not self._runs.cancel_at_rest(pass_run, timeout):
                return False  # its pass is executing somewhere: that process cancels it
            resumed = OrchestrationResumed(
                at=self._clock(), resumption=state.resumptions + 1, owner=this_process()
            )
            summary = f"cancelled while it was {state.status or 'left unfinished'} (rt.cancel)"
            self.append(_Drive(state, None, None, None), resumed, self.end("failed", summary))
        except RunOwnedElsewhere:
            return False
        finally:
            self._let_go(run_id)
        return True

    def is_orchestration(self, run_id: str) -> bool:
        """Tell whether a run id names an orchestration (rather than a plain run)."""
        head = self._journal.head(run_id)  # the tag alone: no plan decoded
        return head is not None and head[1] == tag_of(OrchestrationStarted)

    def state(self, run_id: str, position: int | None = None) -> OrchestrationState:
        """Fold an orchestration's events (up to a journal position)."""
        events = self._journal.stream(run_id)
        if not events:
            raise RunNotFound(f"no run {short(run_id)} in this journal")
        self._runs._check_here(run_id, events[0])  # another organization's is unknown (ADR 0074)
        if position is not None:
            events = [e for e in events if e.position <= position]
        return fold_orchestration(events)

    def resume(self, run_id: str, *args: Any, **options: Any) -> Outcome:
        """Take an orchestration up again and wait for it to stop. See :meth:`resume_start`."""
        return self.resume_start(run_id, *args, **options).result()

    def resume_start(
        self,
        run_id: str,
        call_budget: int | None = None,
        answers: Mapping[str, str] | None = None,
        approve: bool = False,
        clarification: str | None = None,
        *,
        planner: Planner | None = None,
        reserve: Reserve | None = None,
        on_progress: Progress | None = None,
        take_over: bool = False,
        trace: OrchestrationTrace | None = None,
    ) -> RunHandle[Outcome]:
        """Take an orchestration up again: approve, clarify, answer, raise the budget (O3, O4, A2).

        Everything the resume changes is journaled first, in one ``orchestration.resumed`` event
        (R5), before this returns; the orchestrator actor then carries on from the phase its
        events left it in. An ``orchestrate``-mode orchestration with passes left needs its
        planner (``planner=``, or the one this runtime was given before): a failed pass is
        replanned (O2). Whatever it refuses is refused here, with nothing appended.
        """
        if self._runs.closing:
            raise RuntimeClosed("the runtime is closed: open a new one with journaled.open()")
        self._runs._check_may_resume(run_id)  # the runs own the tenant check (ADR 0074)
        self._hold(run_id)
        try:
            drive = self._resume(
                run_id,
                call_budget,
                answers,
                approve,
                clarification,
                planner=planner,
                reserve=reserve,
                on_progress=on_progress,
                take_over=take_over,
                trace=trace,
            )
        except JournalClosed as exc:
            self._let_go(run_id)
            raise _closed(run_id) from exc
        except BaseException:
            self._let_go(run_id)
            raise
        return self._spawn(drive)

    def _spawn(self, drive: _Drive) -> RunHandle[Outcome]:
        """Start the orchestrator actor of a held orchestration; return its handle (A4)."""
        run_id = drive.state.run_id
        correlation, reply = self._inbox.expect(f"{run_id}.{os.urandom(4).hex()}")
        try:
            actor = Orchestrator.start(
                orchestrations=self,
                drive=drive,
                directory=self._directory,
                reply_to=self._inbox.address,
                correlation=correlation,
            )
        except BaseException:
            self._inbox.forget(correlation)
            self._let_go(run_id)
            raise
        done: Future[Outcome] = running_future()

        def settle(answer: Future[Any]) -> None:
            self._let_go(run_id)
            error = answer.exception()
            if error is not None:
                with contextlib.suppress(InvalidStateError):  # completed by its caller
                    done.set_exception(error)
                return
            stopped: OrchestrationStopped = answer.result()
            if stopped.outcome.status in ("completed", "failed", "dry_run"):
                self._planners.pop(run_id, None)  # finished: nothing will ask it again
            with contextlib.suppress(InvalidStateError):
                done.set_result(stopped.outcome)

        with self._lock:
            self._actors[run_id] = (actor, done)
        reply.add_done_callback(settle)
        actor.tell(BeginOrchestration())
        if self.cancel_requested(run_id):
            actor.tell(CancelOrchestration())
        return RunHandle(
            run_id, done, self.cancel, self._runs.current, started_by=self._runs._started_by
        )

    def close(self, timeout: float) -> list[str]:
        """Tell every orchestrator the runtime is closing; wait for them to stop (R3).

        A pass in flight was suspended by the runs' close; a planner call in flight is not waited
        for (it is asked again on resume). Return the orchestrations still driven after
        ``timeout`` seconds.
        """
        with self._lock:
            driven = dict(self._actors)
        for actor, _ in driven.values():
            with contextlib.suppress(pykka.ActorDeadError):
                actor.tell(DrainOrchestration())
        # Their answers, not their threads: whoever waits on a handle is woken when close returns.
        wait([done for _, done in driven.values()], timeout)
        return sorted(r for r, (_, done) in driven.items() if not done.done())

    def _resume(
        self,
        run_id: str,
        call_budget: int | None,
        answers: Mapping[str, str] | None,
        approve: bool,
        clarification: str | None,
        *,
        planner: Planner | None,
        reserve: Reserve | None,
        on_progress: Progress | None,
        take_over: bool,
        trace: OrchestrationTrace | None,
    ) -> _Drive:
        state = self.state(run_id)
        if state.purged is not None:
            raise RunNotResumable(f"run {run_id} was purged: its goal is gone, it cannot resume")
        status = state.status
        if status is not None and status in ("completed", "failed", "dry_run"):
            raise RunNotResumable(f"run {run_id} already finished ({status}); nothing to resume")
        pass_state = self._pass_state(state)
        # Who drives it first, then what the caller asked (R8, ADR 0011), as a plain run's
        # resume does: one a live process drives is owned elsewhere, whatever phase that process
        # moved it to since it waited. Let go by its driver's closing runtime (R3): nobody drives
        # it; journals before ADR 0087 say so by the pass's suspension alone.
        suspended = state.suspended is not None or (
            pass_state is not None and pass_state.suspended is not None
        )
        if state.ended is None and not suspended:
            self._check_not_driven(state, take_over)
        if state.ended is None and pass_state is not None:
            # Not stopped at a status: either a crash, or another runtime drives it right now.
            # The pass run's owner tells which; a live one keeps it, and nothing is appended.
            self._runs.check_free(pass_state.run_id, take_over)
        check_budget("call_budget", call_budget)
        check_callable("planner", planner)
        check_callable("reserve", reserve)
        check_callable("on_progress", on_progress)
        used = self._calls_used(state)
        if call_budget is not None and call_budget < used:
            raise ValueError(
                f"call_budget must be at least the {used} model call(s) already used, "
                f"got {call_budget}"
            )
        if approve and not state.approval_pending:
            where = (
                status
                if status is not None
                else "suspended by a close"
                if state.suspended is not None
                else state.phase
            )
            raise RunNotResumable(f"run {run_id} is not waiting for approval (it is {where})")
        given = dict(answers or {})
        if clarification is not None:
            if not isinstance(clarification, str) or not clarification.strip():
                raise RunNotResumable("clarification must be a non-empty string")
            if state.question is None:
                waiting = pass_state.waiting if pass_state is not None else []
                if len(waiting) != 1:
                    raise RunNotResumable(
                        f"run {run_id} asked no question: there is nothing to clarify"
                    )
                given.setdefault(waiting[0], clarification)
        if given:
            waiting = pass_state.waiting if pass_state is not None else []
            for step_id in given:
                if step_id not in waiting:
                    raise RunNotResumable(
                        f"run {run_id}: step {step_id!r} is not waiting for an answer "
                        f"(waiting steps: {', '.join(waiting) or 'none'})"
                    )
        answered = clarification if state.question is not None else None
        resumed = OrchestrationResumed(
            at=self._clock(),
            resumption=state.resumptions + 1,
            budget=call_budget if call_budget != state.budget else None,
            previous_budget=state.budget if call_budget not in (None, state.budget) else None,
            approved=state.pass_no if approve else None,
            question=state.question if answered is not None else None,
            answer=answered,
            answered=tuple(given),
            owner=this_process(),
        )
        reserve = self._journaled_policy(state, pass_state, reserve)
        chosen = planner or self._planners.get(run_id)
        started = state.started
        assert started is not None
        if chosen is None and started.mode == "orchestrate" and state.pass_no < started.max_passes:
            # A failed pass must be replanned (O2); without the planner that would end the
            # orchestration failed for good, so refuse now, while nothing is appended.
            raise RunNotResumable(
                f"run {run_id}: pass planner=... to resume: if pass {state.pass_no} fails, the "
                f"planner must plan the next (up to {started.max_passes} passes)"
            )
        after = state.copy()
        after.fold(resumed)
        if chosen is None and after.phase == "planning" and after.question is None:
            raise RunNotResumable(
                f"run {run_id}: pass planner=... to resume, the planner must be asked again"
            )
        drive = _Drive(
            state,
            chosen,
            reserve,
            on_progress,
            given,
            take_over,
            trace,
            context=contextvars.copy_context(),  # the caller's: resume_start runs in its thread
        )
        self.append(drive, resumed)
        if planner is not None:
            self._planners[run_id] = planner  # later resumes in this runtime may omit it
        return drive

    def _journaled_policy(
        self, state: OrchestrationState, pass_state: RunFold | None, reserve: Reserve | None
    ) -> Reserve | None:
        """Return the policy a resume costs agent steps with: the one given, else the journaled.

        Raises:
            RunNotResumable: a policy was journaled but is not loaded here (R6).
        """
        if reserve is not None:
            return reserve
        started = state.started
        name = (started.reserve if started is not None else None) or (
            pass_state.reserve if pass_state is not None else None
        )
        if name is None:
            return None
        found = find_policy(name) or self._runs._given_policies.find(
            [state.run_id, pass_state.run_id if pass_state is not None else None], name
        )
        if found is None:
            raise RunNotResumable(
                f"run {state.run_id} costs its agent steps with reserve={name}, which is not "
                "loaded here: pass reserve= to resume so they cost the same (R6)"
            )
        return found

    # -- the state machine -----------------------------------------------------------------------

    def _check_not_driven(self, state: OrchestrationState, take_over: bool) -> None:
        """Refuse to take up an orchestration that a live process is driving (one driver, R8).

        It is not stopped at a status, so it crashed or someone drives it now: the owner of its
        start or last resume tells which. Journals written before owners name none.
        """
        run_id = state.run_id
        if state.owner == this_process():
            return  # every drive in this process holds it (_hold): none does, so it was let go
        now = self._clock()
        if state.owner and not take_over and owner_alive(state.owner, state.last_at, now):
            raise RunOwnedElsewhere(
                f"run {run_id} is being orchestrated by another process ({state.owner}, last "
                f"event {max(0, now - state.last_at) // 1000}s ago); wait for it, or pass "
                "take_over=True if you know that process is gone"
            )

    def cancel_requested(self, run_id: str) -> bool:
        """Tell whether ``cancel`` was asked for an orchestration driven here."""
        with self._lock:
            return run_id in self._cancelled

    def before_planning(self, d: _Drive) -> list[DomainEvent]:
        """Planning, before the planner: end waiting for a question's answer; else ask it ([])."""
        st = d.state
        if st.question is not None:
            return [
                self.end("waiting_for_clarification", f"waiting for clarification: {st.question}")
            ]
        if d.planner is None:
            raise RunNotResumable(
                f"run {st.run_id}: pass planner=... to resume, the planner must be asked again"
            )
        return []

    def planned(self, d: _Drive, answer: PlannerAnswered) -> list[DomainEvent]:
        """Planning, after the planner: journal its plan, its question or why planning failed."""
        st = d.state
        if answer.failure is not None:
            return self._fail_planning(st, answer.failure, answer.gaps)
        if answer.question is not None:
            return [
                ClarificationRequested(at=self._clock(), question=answer.question),
                self.end(
                    "waiting_for_clarification", f"waiting for clarification: {answer.question}"
                ),
            ]
        if answer.plan is None:
            return self._fail_planning(st, "the planner's answer held no plan")
        return [PlanProposed(at=self._clock(), pass_no=st.pass_no, plan=answer.plan)]

    def _fail_planning(
        self, st: OrchestrationState, reason: str, gaps: tuple[Gap, ...] = ()
    ) -> list[DomainEvent]:
        return [
            PlanningFailed(at=self._clock(), pass_no=st.pass_no, reason=reason, gaps=gaps),
            self.end("failed", f"planning failed: {reason}"),
        ]

    def settle(self, d: _Drive) -> list[DomainEvent]:
        """Settling: end a dry run, wait for approval or budget, else start the pass (O3-O5)."""
        st = d.state
        started = st.started
        assert started is not None
        plan = st.plans[st.pass_no]
        if started.mode == "plan":
            return [self.end("dry_run", f"dry run: planned {len(plan.steps)} step(s); nothing ran")]
        if started.require_approval and st.pass_no not in st.approved:
            asked = st.approval_pending
            return [
                *([] if asked else [ApprovalRequested(at=self._clock(), pass_no=st.pass_no)]),
                self.end(
                    "waiting_for_approval", f"waiting for approval of a {len(plan.steps)}-step plan"
                ),
            ]
        budget = self._pass_budget(st)
        if budget is not None and not started.partial:
            estimate = fold_calls(plan.steps, budget, d.reserve)
            if estimate > budget:
                return self._await_budget(st, plan, None, estimate)
        run = new_run_id(self._clock())
        return [PassStarted(at=self._clock(), pass_no=st.pass_no, run=run)]

    def start_pass(self, d: _Drive) -> tuple[str, Future[ExecuteResult]] | None:
        """Running: start the pass's run, or carry it on; None when it already stopped (E14, O5).

        Returns the run id and the future its handle completes when the run stops executing.
        """
        st = d.state
        run_id = st.pass_runs[st.pass_no]
        answers, d.answers = d.answers, {}  # answers are for the run that waited, never later
        # In the caller's context, not this actor's thread's: the executor notes it (T3).
        handle = d.context.copy().run(self._start_pass_run, d, run_id, answers)
        return None if handle is None else (run_id, handle.future)

    def _start_pass_run(
        self, d: _Drive, run_id: str, answers: dict[str, str]
    ) -> RunHandle[ExecuteResult] | None:
        """Start or resume the pass's run; None when it already stopped."""
        st = d.state
        handle: RunHandle[ExecuteResult] | None = None
        try:
            status = self._runs.state(run_id).run_status
        except RunNotFound:  # a crash came between pass-started and the run's first event
            handle = self._runs.start(
                st.plans[st.pass_no],
                call_budget=self._pass_budget(st),
                reserve=d.reserve,
                on_progress=d.on_progress,
                parent=(st.run_id, f"pass-{st.pass_no}"),
                run_id=run_id,
            )
        else:
            if status not in ("completed", "failed", "cancelled"):
                handle = self._runs._resume_pass(
                    run_id,
                    self._pass_budget(st),
                    answers or None,
                    reserve=d.reserve,
                    on_progress=d.on_progress,
                    take_over=d.take_over,
                )
        return handle

    def cancel_pass(self, run_id: str) -> None:
        """Cancel a pass's run (E5)."""
        self._runs.cancel(run_id)

    def pass_ended(self, d: _Drive, run_id: str) -> list[DomainEvent]:
        """Running, once the pass's run stopped: journal how it ended (E14, R3).

        A pass whose run was suspended (its runtime closes) ended nothing: the orchestration is
        let go with it, journaled as ``orchestration.suspended`` (R5, ADR 0087), and stays
        resumable in its phase.
        """
        st = d.state
        pass_state = self._runs.state(run_id)
        if pass_state.suspended is not None:
            return [self.suspend(d, run=run_id, cause=pass_state.suspended.cause)]
        return [
            PassEnded(
                at=self._clock(),
                pass_no=st.pass_no,
                run=run_id,
                status=pass_state.run_status or "failed",
                calls_used=pass_state.calls_used,
            )
        ]

    def review(self, d: _Drive) -> list[DomainEvent]:
        """Reviewing: wait for budget or an answer, complete, replan, or fail (O1-O4)."""
        st = d.state
        started = st.started
        assert started is not None
        pass_state = self._runs.state(st.pass_runs[st.pass_no])
        if pass_state.stopped_for_budget:
            budget = self._pass_budget(st)
            plan = pass_state.plan()
            rest = [s for s in plan.steps if s.status != "succeeded"]
            remaining = None if budget is None else budget - pass_state.calls_used
            estimate = fold_calls(rest, remaining, d.reserve)
            return self._await_budget(st, plan, pass_state, estimate)
        if pass_state.waiting:
            step_id = pass_state.waiting[0]
            question = pass_state.questions.get(step_id, "")
            return [
                self.end(
                    "waiting_for_clarification",
                    f"waiting for an answer to step {step_id!r}: {question}",
                )
            ]
        if pass_state.run_status == "completed":
            calls = self._calls_before(st) + pass_state.calls_used
            summary = (
                f"completed {len(pass_state.order)} step(s) in {st.pass_no} pass(es) "
                f"using {calls} model call(s)"
            )
            return [self.end("completed", summary)]
        failed = _first_failure(pass_state)
        if pass_state.run_status == "cancelled":
            return [self.end("failed", failed)]  # a cancel stops the orchestration (E5)
        if started.mode == "orchestrate" and st.pass_no < started.max_passes:
            if d.planner is None:
                return [self.end("failed", f"{failed}; not replanned: no planner was given")]
            return [
                ReplanDecided(
                    at=self._clock(),
                    pass_no=st.pass_no + 1,
                    reason=failed,
                    max_passes=started.max_passes,
                )
            ]
        return [self.end("failed", failed)]

    def _await_budget(
        self,
        st: OrchestrationState,
        plan: Plan,
        pass_state: RunFold | None,
        estimate: int,
    ) -> list[DomainEvent]:
        """Wait for a bigger total budget; the numbers are the orchestration's, across passes."""
        total = st.budget or 0
        used = self._calls_before(st) + (pass_state.calls_used if pass_state is not None else 0)
        completed = sum(1 for s in plan.steps if s.status == "succeeded")
        awaited = Budget(
            est_calls=estimate,
            max_calls=total,
            completed_steps=completed,
            total_steps=len(plan.steps),
        )
        return [
            BudgetAwaited(
                at=self._clock(),
                pass_no=st.pass_no,
                budget=awaited,
                partial=pass_state is not None,
                used=used,
            ),
            self.end(
                "waiting_for_budget",
                f"waiting for budget: the remaining steps need {estimate} model call(s); "
                f"{used} of {total} used — resume with a call_budget of at least "
                f"{used + estimate}",
            ),
        ]

    # -- helpers ---------------------------------------------------------------------------------

    def _pass_budget(self, st: OrchestrationState) -> int | None:
        if st.budget is None:
            return None
        return max(0, st.budget - self._calls_before(st))

    def _calls_used(self, st: OrchestrationState) -> int:
        """Return the model calls every pass's run used so far (what a budget cannot undo)."""
        total = 0
        for run in st.pass_runs.values():
            try:
                total += self._runs.state(run).calls_used
            except RunNotFound:  # a crash came between pass-started and the run's first event
                continue
        return total

    def _calls_before(self, st: OrchestrationState) -> int:
        return sum(
            self._runs.state(run).calls_used for n, run in st.pass_runs.items() if n < st.pass_no
        )

    def _pass_state(self, st: OrchestrationState) -> RunFold | None:
        return self._run_state(st.current_run)

    def _run_state(self, run: str | None) -> RunFold | None:
        if run is None:
            return None
        try:
            return self._runs.state(run)
        except RunNotFound:
            return None

    def observations(self, st: OrchestrationState) -> list[Observation]:
        out: list[Observation] = []
        for _, run in sorted(st.pass_runs.items()):
            try:
                out += self._runs.state(run).observations
            except RunNotFound:
                continue
        return out

    def outcome(self, st: OrchestrationState) -> Outcome:
        """Describe an orchestration as an :class:`Outcome` from its state."""
        run = st.current_run
        if run is None and st.pass_no not in st.plans and st.pass_runs:
            # Its planning failed or asks a question before its plan: the plan shown is the
            # last pass's run, as its observations and the run listing have it (O1, E13, T2).
            run = st.pass_runs[max(st.pass_runs)]
        pass_state = self._run_state(run)
        plan = pass_state.plan() if pass_state is not None else st.plan
        ended = st.ended
        return Outcome(
            run_id=st.run_id,
            status=ended.status if ended is not None else "failed",
            plan=plan,
            observations=self.observations(st),
            summary=ended.summary if ended is not None else "running",
            budget=st.waiting_budget
            if ended is not None and ended.status == "waiting_for_budget"
            else None,
            gaps=list(st.gaps) if st.gaps else None,
            pass_run=run,
        )

    def finish(self, d: _Drive) -> Outcome:
        """Return the outcome of an orchestration that stopped at a status."""
        return self.outcome(d.state)

    def validate(self, plan: Plan) -> None:
        """Reject a plan this runtime cannot run (E1), raising PlanRejected."""
        self._runs.validate(plan)

    @property
    def closing(self) -> bool:
        """Tell whether the runtime is closing: nothing more is decided (R3)."""
        return self._runs.closing

    @property
    def loop(self) -> LoopRunner:
        """The event loop an ``async def`` planner runs on, as async steps do (A1)."""
        return self._runs._loop

    def now(self) -> int:
        """Return the runtime clock's time (epoch ms)."""
        return self._clock()

    @staticmethod
    def closed_error(run_id: str) -> RuntimeClosed:
        """Say that the runtime closed under an orchestration, which stays resumable (R3)."""
        return _closed(run_id)

    def suspend(
        self, d: _Drive, *, run: str | None = None, cause: str | None = None
    ) -> OrchestrationSuspended:
        """Return the event that lets the orchestration go, undecided, as its runtime closes (R3).

        ``run``: the pass's run, suspended with it; ``cause``: what suspended it (by default,
        why the runtime closes: ``close`` or ``exit``).
        """
        st = d.state
        return OrchestrationSuspended(
            at=self._clock(),
            pass_no=st.pass_no,
            phase=st.phase,
            run=run,
            cause=cause if cause is not None else self._runs._closed_by,
        )

    def end(self, status: OutcomeStatus, summary: str) -> OrchestrationEnded:
        """Return the event that stops the orchestration at a status."""
        return OrchestrationEnded(at=self._clock(), status=status, summary=summary)

    def append(self, d: _Drive, *events: DomainEvent) -> None:
        """Append one decision's events atomically, then fold each (the only state change)."""
        # M9: redacted before it is applied or journaled
        events = tuple(e.map_content(redact_data) if e.has_content else e for e in events)
        st = d.state
        first = events[0]
        stream = first.run_id if isinstance(first, OrchestrationStarted) else st.run_id
        pending = [
            Pending(stream=stream, version=st.version + n, data=event)
            for n, event in enumerate(events, start=1)
        ]
        try:
            positions = self._journal.append(pending)
        except ConcurrencyConflict as exc:
            raise self._conflict(stream, st.version) from exc
        for position, item in zip(positions, pending, strict=True):
            st.apply(Event(position=position, stream=stream, version=item.version, data=item.data))
            if d.trace is not None:
                d.trace(position, st.copy())

    def _conflict(self, stream: str, version: int) -> RunNotResumable:
        """Say why an append after ``version`` of an orchestration's stream conflicted (R8).

        Another process resumed it (or took it over) since it was read: it drives it, as the
        executor of a plain run that appended first does (ADR 0011), so RunOwnedElsewhere.
        Anything else appended since (a purge) is no owner: RunNotResumable, naming it.
        """
        newer = [e.data for e in self._journal.stream(stream) if e.version > version]
        if any(isinstance(data, OrchestrationResumed | OrchestrationStarted) for data in newer):
            return RunOwnedElsewhere(
                f"run {stream} is being orchestrated by another process; reload and retry"
            )
        kinds = ", ".join(sorted({tag_of(type(data)) for data in newer})) or "nothing it can read"
        return RunNotResumable(
            f"run {stream} changed while this process was deciding its next step (another "
            f"process appended {kinds}); reload and retry"
        )


def _closed(run_id: str) -> RuntimeClosed:
    """Say that the runtime closed under an orchestration, which stays resumable (R3)."""
    return RuntimeClosed(
        f"the runtime closed while orchestration {run_id} was being driven; what it decided is "
        "journaled: resume it in a new runtime"
    )


def _first_failure(state: RunFold) -> str:
    for step_id in state.order:
        if state.status[step_id] == "failed":
            return f"failed at step {step_id!r}: {state.failures.get(step_id, 'failed')}"
    if state.run_status == "cancelled":
        return "cancelled before every step ran"
    return "failed: not every step succeeded"


def _mode(mode: str) -> Mode:
    if mode == "plan":
        return "plan"
    if mode == "orchestrate":
        return "orchestrate"
    return "execute"
