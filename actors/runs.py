"""Plans in execution: ``rt.execute``, ``rt.resume``, ``rt.cancel``, ``rt.runs`` (SPEC 2)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import msgspec
import pykka

from journaled.actors.directory import Directory, Inbox
from journaled.actors.errors import (
    ActorTimeout,
    RunNotFound,
    RunNotResumable,
    RunOwnedElsewhere,
    RuntimeClosed,
)
from journaled.actors.executor import Executor
from journaled.actors.loop import LoopRunner
from journaled.actors.ownership import owner_alive, this_process
from journaled.actors.run_args import (
    RUN_PREFIX,
    GivenPolicies,
    argument_error,
    check_budget,
    child_run_id,
    find_policy,
    new_run_id,
    policy_name,
)
from journaled.actors.run_erasure import check_reason, purge_run
from journaled.actors.run_forks import RunForks
from journaled.actors.run_recorder import (
    REPORTING_TASK,
    Progress,
    Trace,
    on_progress_wait,
    reporting,
)
from journaled.actors.scrubber import Scrubber
from journaled.actors.steps import Registry, Services, journalable
from journaled.events.base import DomainEvent
from journaled.events.codec import tag_of
from journaled.events.errors import PlanRejected
from journaled.events.inputs import (
    int_problem,
    number_problem,
    short,
    text_problem,
    timeout_problem,
)
from journaled.events.journal import Journal
from journaled.events.orchestration import OrchestrationStarted
from journaled.events.plan_rules import Reserve, validate
from journaled.events.plans import ExecuteResult, Limits, Plan
from journaled.events.redact import find_secrets, redact_data
from journaled.events.run_messages import Begin, CancelRun, Drain, RunEnded, Suspend
from journaled.events.run_state import RunFold
from journaled.events.runs import (
    AnswersGiven,
    BudgetRaised,
    RunResumed,
    RunStarted,
)

log = logging.getLogger("journaled")
MAX_PARALLEL = 1 << 16
"""Most steps a batch may run at once: each holds a worker actor (one thread)."""
_STOP_TIMEOUT = 5.0


def _child_plan_change(plan: Plan, first: Plan) -> str | None:
    """Say how a re-run's child plan differs from the one its first attempt started, or None.

    Compared as the journal holds them: step ids, targets, dependencies and inputs (normalised
    and redacted as they were when stored); the goal's wording may vary between attempts.
    """
    try:
        steps = [
            (
                s.id,
                s.kind,
                s.target,
                sorted(s.depends_on),
                redact_data(journalable(s.input, "input")),
            )
            for s in plan.steps
        ]
    except (ValueError, AttributeError, TypeError) as exc:
        return f"its steps cannot be stored: {exc}"
    before = [(s.id, s.kind, s.target, sorted(s.depends_on), s.input) for s in first.steps]
    if [s[:4] for s in steps] != [s[:4] for s in before]:
        return f"steps {[s[0] for s in before]} then, {[s[0] for s in steps]} now"
    for now, then in zip(steps, before, strict=True):
        if msgspec.json.encode(now[4]) != msgspec.json.encode(then[4]):
            return f"step {now[0]!r} has another input"
    return None


def _normalise(plan: Plan, run_id: str) -> Plan:
    return normalised(plan, run_id.replace(RUN_PREFIX, "plan_", 1))


def normalised(plan: Plan, plan_id: str = "") -> Plan:
    """Return a validated plan as it is journaled: inputs made journalable, every step pending
    (a status set by its author is ignored) and ``plan_id`` as its id when it has none (E1).

    Raises:
        PlanRejected: a step's input cannot be journaled.
    """
    steps = []
    for step in plan.steps:
        try:
            data = journalable(step.input, "its input")
        except ValueError as exc:
            raise PlanRejected(step.id, str(exc)) from exc
        steps.append(
            msgspec.structs.replace(
                step, input=data, depends_on=list(step.depends_on), status="pending"
            )
        )
    return Plan(goal=plan.goal, steps=steps, id=plan.id or plan_id)


class _Opened(threading.Event):
    """Set by the run's recorder at its first commit; setting it also wakes ``start``."""

    def __init__(self, woken: threading.Event) -> None:
        super().__init__()
        self._woken = woken

    def set(self) -> None:
        """Mark the opening committed and wake whoever waits for it."""
        super().set()
        self._woken.set()


_IN_PROCESS_LOCK = threading.Lock()
_EXECUTING_IN_PROCESS: dict[str, int] = {}
"""Run id -> how many claims runtimes of this process hold on it now: one, unless a resume
with ``take_over`` forced a second (R8, also across runtimes)."""


def _hold_in_process(run_id: str, take_over: bool) -> None:
    with _IN_PROCESS_LOCK:
        if _EXECUTING_IN_PROCESS.get(run_id) and not take_over:
            raise RunOwnedElsewhere(
                f"run {run_id} is being executed in this process right now (by another "
                "runtime); wait for that execution to end before resuming it"
            )
        _EXECUTING_IN_PROCESS[run_id] = _EXECUTING_IN_PROCESS.get(run_id, 0) + 1


def _let_go_in_process(run_id: str) -> None:
    with _IN_PROCESS_LOCK:
        left = _EXECUTING_IN_PROCESS.get(run_id, 1) - 1
        if left > 0:
            _EXECUTING_IN_PROCESS[run_id] = left
        else:
            _EXECUTING_IN_PROCESS.pop(run_id, None)


def _holds_in_process(run_id: str) -> int:
    with _IN_PROCESS_LOCK:
        return _EXECUTING_IN_PROCESS.get(run_id, 0)


def executing_in_process(run_id: str) -> bool:
    """Tell whether a runtime of this process executes the run now (R8; T2, ADR 0088)."""
    return _holds_in_process(run_id) > 0


@dataclass
class _Claim:
    """This runtime's hold on one run id, taken before the run's state is read (R8)."""

    executor: Any = None
    """The run's executor actor, once started."""
    token: threading.Event = field(default_factory=threading.Event)
    """The run's cancel token."""
    woken: threading.Event = field(default_factory=threading.Event)
    """Set at the opening commit or when the run stopped, whichever comes first."""
    opened: threading.Event = field(init=False)
    """Set once the run's opening events are committed."""
    ready: threading.Event = field(default_factory=threading.Event)
    """Set once the executor exists (or the claim is dropped): what close() waits for first."""
    done: Future[Any] | None = None
    """What the run's execution here completes, once its executor exists: a parent step's
    next attempt waits on it for the child its timed-out attempt left running (R5)."""
    settled: threading.Event = field(default_factory=threading.Event)
    """Set once the run's end was answered here (or the claim is dropped): what close() waits
    for then. An executor is stopped before its answer arrives (it answers from ``on_stop``), so
    waiting for the actor alone let close() fail a drained run's caller (R3)."""

    def __post_init__(self) -> None:
        self.opened = _Opened(self.woken)

    def tell(self, message: object) -> None:
        """Tell the executor, if it exists and has not stopped (it may just have ended)."""
        if self.executor is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                self.executor.tell(message)


R = TypeVar("R")


def running_future() -> Future[Any]:
    """Return the future a run's handle hands out: running already, so it cannot be cancelled.

    A caller cancelling it (directly, or as asyncio does when a wait for it times out) would
    leave a run that goes on with a future saying it was cancelled, and whatever completes it
    later failing (A2).
    """
    future: Future[Any] = Future()
    future.set_running_or_notify_cancel()
    return future


class RunHandle(Generic[R]):
    """A run that was started and not waited for: its id at once, its result when it stops (A2).

    The result is an :class:`ExecuteResult` for a run of ``execute`` and an ``Outcome`` for an
    orchestration. Waiting is never polling: the executor's answer completes :attr:`future`.
    """

    def __init__(
        self,
        run_id: str,
        future: Future[R],
        cancel: Callable[[str], bool],
        state: Callable[[str], Any],
        may_wait: Callable[[], None] | None = None,
        started_by: Callable[[str], Iterable[str]] | None = None,
    ) -> None:
        self.run_id = run_id
        self.future = future
        """Completed with the result (or the error) when the run stops executing.

        The caller's to wait on (``asyncio.wrap_future`` takes it), not to stop the run: it is
        running while the run executes, so its ``cancel()`` returns False and changes nothing
        (a timed-out ``asyncio.wait_for`` of it leaves it, the run and :meth:`result` as they
        were). Cancel the run with :meth:`cancel`.
        """
        self._cancel = cancel
        self._state = state
        self._may_wait = may_wait
        self._started_by = started_by

    def _waits_on_caller(self) -> str | None:
        """Return the run whose ``on_progress`` the caller is in when this run waits for it.

        That is the reporting run itself, or a run it was started by (a step's child run, an
        orchestration's pass), however far up: each waits for the runs it started, and a run
        waits for its ``on_progress`` to return. None when waiting here cannot deadlock so.
        """
        reporter = reporting()
        if reporter is None:
            return None
        line = self._started_by(reporter) if self._started_by is not None else (reporter,)
        return reporter if self.run_id in line else None

    def result(self, timeout: float | None = None) -> R:
        """Wait for the run to stop (completed, failed, waiting, suspended, ...); return its result.

        Raises:
            TimeoutError: it did not stop within ``timeout`` seconds (it goes on executing).
            ValueError: ``timeout`` is not None nor a non-negative number.
            RuntimeError: called from the event loop async steps run on, which it would block,
                or from the run's own ``on_progress``, which the run waits for.
        """
        check_timeout(timeout)
        if not self.future.done():
            reporter = self._waits_on_caller()
            if reporter is not None:
                raise RuntimeError(on_progress_wait(reporter, self.run_id))
            if self._may_wait is not None:
                self._may_wait()
        return self.future.result(timeout)

    def done(self) -> bool:
        """Tell whether the run stopped executing."""
        return self.future.done()

    def cancel(self) -> bool:
        """Ask the run to stop scheduling (E5); False when it is not executing any more."""
        return self._cancel(self.run_id)

    def state(self) -> ExecuteResult:
        """Return the run as the journal holds it now (for an orchestration: its current pass)."""
        state: ExecuteResult = self._state(self.run_id)
        return state

    def __repr__(self) -> str:
        status = "done" if self.future.done() else "executing"
        return f"<RunHandle {self.run_id} {status}>"


class Runs(RunForks):
    """``rt.runs`` and the run operations of a runtime. Safe to use from any thread."""

    def __init__(
        self,
        journal: Journal,
        registry: Registry,
        clock: Callable[[], int],
        agents_enabled: bool,
        scrubber: Scrubber | None = None,
        services: Services | None = None,
    ) -> None:
        self._services = services if services is not None else Services(registry, Directory())
        self._services.child_runner = self._child_runner
        self._services.child_starter = self._child_starter
        self._inbox = Inbox(self._services.directory, "runs")
        super().__init__(journal, clock)
        self._scrubber = scrubber if scrubber is not None else Scrubber(journal)
        self._registry = registry
        self._agents = agents_enabled
        self._lock = threading.Lock()
        self._given_policies = GivenPolicies()
        """The reserve policies this runtime was handed, by run: its resumes find them (R6)."""
        self._active: dict[str, _Claim] = {}
        """run id -> this runtime's claim on it; only the claim's owner removes it (R8)."""
        self._children: dict[str, list[str]] = {}
        self._parents: dict[str, str] = {}
        """run id -> the run that started it (a step's child, an orchestration's pass), while
        it executes here: a wait from its on_progress for any run up that line never ends."""
        self._closing = False
        """Set by :meth:`close`: no run starts from then on (R3)."""
        self._drain: tuple[float, str] = (0.0, "close")

    # -- execution -------------------------------------------------------------------------------

    def execute(
        self,
        plan: Plan,
        call_budget: int | None = None,
        max_parallel_steps: int = 2,
        limits: Limits | None = None,
        reserve: Reserve | None = None,
        on_progress: Progress | None = None,
        *,
        step_timeout: float | None = None,
        parent: tuple[str, str] | None = None,
        trace: Trace | None = None,
        run_id: str | None = None,
        call: int | None = None,
    ) -> ExecuteResult:
        """Validate and execute a plan as a new journaled run (E1-E13); wait for it to stop."""
        return self.start(
            plan,
            call_budget,
            max_parallel_steps,
            limits,
            reserve,
            on_progress,
            step_timeout=step_timeout,
            parent=parent,
            trace=trace,
            run_id=run_id,
            call=call,
        ).result()

    def start(
        self,
        plan: Plan,
        call_budget: int | None = None,
        max_parallel_steps: int = 2,
        limits: Limits | None = None,
        reserve: Reserve | None = None,
        on_progress: Progress | None = None,
        *,
        step_timeout: float | None = None,
        parent: tuple[str, str] | None = None,
        trace: Trace | None = None,
        run_id: str | None = None,
        call: int | None = None,
    ) -> RunHandle[ExecuteResult]:
        """Validate a plan and start executing it as a new journaled run (E1-E13, A2).

        Returns once the run's opening events are committed, so its id can be read at once.
        """
        self.validate(plan)
        budget = check_budget("call_budget", call_budget)
        problem = int_problem(max_parallel_steps, low=1, high=MAX_PARALLEL)
        if problem:
            raise argument_error("max_parallel_steps", f"max_parallel_steps {problem}")
        limits = _check_limits(limits)
        check_callable("reserve", reserve)
        check_callable("on_progress", on_progress)
        if step_timeout is not None and (
            number_problem(step_timeout) or not 0 < step_timeout <= threading.TIMEOUT_MAX
        ):
            raise argument_error(
                "step_timeout",
                "step_timeout must be a positive, finite number of seconds (at most "
                f"{threading.TIMEOUT_MAX:.0f}), got {step_timeout!r}",
            )
        now = self._clock()
        run_id = run_id or new_run_id(now)
        settled = _normalise(plan, run_id)
        claim = self._claim(run_id)
        started = RunStarted(
            at=now,
            run_id=run_id,
            plan=settled,
            call_budget=budget,
            max_parallel_steps=max_parallel_steps,
            limits=limits,
            parent_run=parent[0] if parent else None,
            parent_step=parent[1] if parent else None,
            step_timeout=float(step_timeout) if step_timeout is not None else None,
            owner=this_process(),
            parent_call=call if parent else None,
            reserve=policy_name(reserve),
            organization=self._organization,
        )
        return self._start(run_id, claim, RunFold(), [started], reserve, on_progress, trace, parent)

    def validate(self, plan: Plan) -> None:
        """Reject a plan this runtime cannot run (E1), raising PlanRejected."""
        validate(
            plan,
            skills=self._registry.skills,
            tools=self._registry.tools,
            agents=self._registry.agents,
            agents_enabled=self._agents,
        )
        for step in plan.steps:
            try:
                journalable(step.input, "its input")
            except ValueError as exc:
                raise PlanRejected(step.id, str(exc)) from exc

    def resume(
        self,
        run_id: str,
        call_budget: int | None = None,
        answers: Mapping[str, str] | None = None,
        *,
        reserve: Reserve | None = None,
        on_progress: Progress | None = None,
        trace: Trace | None = None,
        take_over: bool = False,
    ) -> ExecuteResult:
        """Rebuild a run from the journal alone and carry on (E14); wait for it to stop."""
        return self.resume_start(
            run_id,
            call_budget,
            answers,
            reserve=reserve,
            on_progress=on_progress,
            trace=trace,
            take_over=take_over,
        ).result()

    def resume_start(
        self,
        run_id: str,
        call_budget: int | None = None,
        answers: Mapping[str, str] | None = None,
        *,
        reserve: Reserve | None = None,
        on_progress: Progress | None = None,
        trace: Trace | None = None,
        take_over: bool = False,
    ) -> RunHandle[ExecuteResult]:
        """Rebuild a run from the journal alone and start carrying it on (E14, A2).

        An unfinished run whose owner is alive (see ``actors.ownership``) is refused with
        RunOwnedElsewhere unless ``take_over`` is set. A pass run of an orchestration is refused:
        its orchestration drives it, within its budget (O3, ADR 0010).
        """
        return self._resume_start(
            run_id, call_budget, answers, reserve, on_progress, trace, take_over, driven=False
        )

    def _resume_pass(
        self,
        run_id: str,
        call_budget: int | None,
        answers: Mapping[str, str] | None,
        *,
        reserve: Reserve | None,
        on_progress: Progress | None,
        take_over: bool,
    ) -> RunHandle[ExecuteResult]:
        """Resume a pass run for the orchestration that drives it (the orchestrator alone)."""
        return self._resume_start(
            run_id, call_budget, answers, reserve, on_progress, None, take_over, driven=True
        )

    def _resume_start(
        self,
        run_id: str,
        call_budget: int | None,
        answers: Mapping[str, str] | None,
        reserve: Reserve | None,
        on_progress: Progress | None,
        trace: Trace | None,
        take_over: bool,
        *,
        driven: bool,
    ) -> RunHandle[ExecuteResult]:
        try:
            claim = self._claim(run_id, take_over)
        except RunOwnedElsewhere:
            self._check_here(run_id)  # another organization's: unknown, not "executing here"
            raise
        try:
            # Its state is checked first: another organization's is unknown (ADR 0074).
            state, opening, reserve = self._reopen(
                run_id, call_budget, answers, reserve, on_progress, take_over
            )
            if state.started is not None:
                self._check_may_resume(run_id, state.started.organization)
                if not driven:
                    self._check_not_a_pass(run_id, state.started.parent_run)
            self._catch_up_memory(run_id)
        except BaseException:
            self._release(run_id, claim)
            raise
        started = state.started
        assert started is not None
        parent = (started.parent_run, started.parent_step or "") if started.parent_run else None
        return self._start(run_id, claim, state, opening, reserve, on_progress, trace, parent)

    def _check_not_a_pass(self, run_id: str, parent: str | None) -> None:
        """Refuse to resume a pass run apart from its orchestration: it would spend past the
        orchestration's budget with no event of it (O3, ADR 0010); resume the orchestration."""
        if parent is None:
            return
        head = self._journal.head(parent)  # the tag alone: no plan decoded
        if head is not None and head[1] == tag_of(OrchestrationStarted):
            raise RunNotResumable(
                f"run {run_id} is a pass of orchestration {parent}, which drives it within its "
                f"budget: resume the orchestration instead (rt.resume({parent!r}))"
            )

    def _catch_up_memory(self, run_id: str) -> None:
        """Fold into memory what other processes appended, before a resumed run's steps read
        it: they read memory as new as the journal the resume began from (P4: a run refreshed
        elsewhere, resumed in a process behind on the journal, reads today's memory)."""
        if self.catch_up_memory is None:
            return
        try:
            self.catch_up_memory()
        except pykka.ActorDeadError as exc:  # its actors were stopped by a close meanwhile
            raise RuntimeClosed(
                f"the runtime closed while run {run_id} was being resumed: resume it in a new "
                "runtime (journaled.open)"
            ) from exc
        except ActorTimeout:
            # Memory busy for the whole wait: its steps read it as far as it has folded, as
            # every read does between two follows.
            log.warning("memory did not catch up before run %s resumed; going on", run_id)

    def _reopen(
        self,
        run_id: str,
        call_budget: int | None,
        answers: Mapping[str, str] | None,
        reserve: Reserve | None,
        on_progress: Progress | None,
        take_over: bool,
    ) -> tuple[RunFold, list[DomainEvent], Reserve | None]:
        """Read a run this runtime has claimed and decide the events that reopen it."""
        state = self.state(run_id)
        if state.purged is not None:
            raise RunNotResumable(f"run {run_id} was purged: its inputs are gone, it cannot resume")
        took_over = self._check_free(run_id, state, take_over, claimed=True)
        if state.is_finished and state.run_status in ("completed", "failed", "cancelled"):
            raise RunNotResumable(
                f"run {run_id} already finished ({state.run_status}); there is nothing to resume"
            )
        budget = check_budget("call_budget", call_budget)
        if budget is not None and budget < state.calls_used:
            # As for an orchestration: a budget below what was spent would stop the run at once
            # and read "2 of 1 used" (E14, O3).
            raise ValueError(
                f"call_budget must be at least the {state.calls_used} model call(s) already "
                f"used, got {budget}"
            )
        if state.cancel_requested and answers:
            raise RunNotResumable(
                f"run {run_id} was cancelled while a step asked for an answer: the answer would "
                "never be used (E5)"
            )
        if answers is not None and not isinstance(answers, Mapping):
            raise RunNotResumable(
                f"answers must be a dict {{step_id: answer}}, got {type(answers).__name__}"
            )
        given = dict(answers or {})
        for step_id, answer in given.items():
            if step_id not in state.waiting:
                waiting = ", ".join(state.waiting) or "none"
                raise RunNotResumable(
                    f"run {run_id}: step {step_id!r} is not waiting for an answer "
                    f"(waiting steps: {waiting})"
                )
            problem = text_problem(answer, empty=False)  # as a clarification (O4)
            if problem:
                raise RunNotResumable(f"run {run_id}: the answer for step {step_id!r} {problem}")
        check_callable("reserve", reserve)
        check_callable("on_progress", on_progress)
        journaled_policy = state.reserve
        given_policy = policy_name(reserve)
        if reserve is None and journaled_policy is not None:
            source = state.forked.source if state.forked is not None else None
            reserve = find_policy(journaled_policy) or self._given_policies.find(
                [run_id, source], journaled_policy
            )
            agents_left = any(
                state.steps[i].agent is not None and state.status[i] != "succeeded"
                for i in state.order
            )
            if reserve is None and agents_left:
                raise RunNotResumable(
                    f"run {run_id} costs its agent steps with reserve={journaled_policy}, "
                    "which cannot be imported here: pass reserve= to resume so they cost the "
                    "same (a resume without it would make them free at the budget gate)"
                )
        now = self._clock()
        opening: list[DomainEvent] = []
        if given:
            opening.append(AnswersGiven(at=now, answers=given))
        if budget is not None and budget != state.budget:
            opening.append(BudgetRaised(at=now, previous=state.budget, budget=budget))
        opening.append(
            RunResumed(
                at=now,
                resumption=state.resumptions + 1,
                rerun=tuple(state.in_flight()),
                owner=this_process(),
                took_over_from=took_over,
                reserve=given_policy if given_policy != journaled_policy else None,
            )
        )
        return state, opening, reserve

    def _claim(self, run_id: str, take_over: bool = False) -> _Claim:
        """Hold a run id for one executor of this runtime, or raise RunOwnedElsewhere (R8)."""
        with self._lock:
            if run_id in self._active:
                raise RunOwnedElsewhere(
                    f"run {run_id} is being executed in this process right now; "
                    "wait for that execution to end before resuming it"
                )
            if self._closing:
                raise RuntimeClosed(
                    f"cannot run {run_id}: the runtime is closing; open a new one to run or "
                    "resume it"
                )
            _hold_in_process(run_id, take_over)
            claim = _Claim()
            self._active[run_id] = claim
            return claim

    def _release(self, run_id: str, claim: _Claim) -> None:
        """Drop a claim: only its owner does, so a loser never removes the winner's entry (R8)."""
        with self._lock:
            if self._active.get(run_id) is claim:
                del self._active[run_id]
                _let_go_in_process(run_id)
        claim.ready.set()
        claim.settled.set()

    def check_free(self, run_id: str, take_over: bool = False) -> None:
        """Raise unless nobody executes the run now (RunOwnedElsewhere: a live owner has it)."""
        self._check_free(run_id, self.state(run_id), take_over)

    def _check_free(
        self, run_id: str, state: RunFold, take_over: bool, *, claimed: bool = False
    ) -> str | None:
        """Refuse a run executing here or owned by a live process; return the owner taken over.

        ``claimed``: the caller holds this runtime's claim on the run (R8), so its own entry in
        the active table is not someone else executing it.
        """
        if not claimed:
            with self._lock:
                if run_id in self._active:
                    raise RunNotResumable(f"run {run_id} is executing in this runtime right now")
        if state.is_finished or state.suspended is not None or not state.owner:
            return None  # a suspended run's owner let it go (R3)
        if state.owner == this_process():
            others = _holds_in_process(run_id) - (1 if claimed else 0)
            if others <= 0:
                # This process owns it and no other executor of it holds it: the one that did
                # stopped (it crashed); nobody to wait for (R8).
                return None
        now = self._clock()
        if owner_alive(state.owner, state.last_at, now) and not take_over:
            raise RunOwnedElsewhere(
                f"run {run_id} is being executed by another process ({state.owner}, last "
                f"event {max(0, now - state.last_at) // 1000}s ago); wait for it, or pass "
                "take_over=True if you know that process is gone"
            )
        return state.owner

    def cancel(self, run_id: str) -> bool:
        """Ask a running run (and its child runs) to stop scheduling; False if it is not running."""
        with self._lock:
            active = self._active.get(run_id)
            children = list(self._children.get(run_id, ()))
        for child in children:
            self.cancel(child)
        if active is None:
            return False
        active.token.set()
        active.tell(CancelRun())
        return True

    def cancel_at_rest(self, run_id: str, timeout: float = 30.0) -> bool:
        """End as cancelled a run that no process executes; False if there is none to end (E5).

        A run waiting for an answer or for budget, suspended by a close, or left by a crashed
        process is taken up as a resume is (R8: never one another live process executes) with
        its cancel already requested: its pending and waiting steps are skipped as E5 says and
        nothing runs, not even a step that was in flight (ADR 0075). Its child runs that are
        at rest too (a waiting step's child that asks) are cancelled next. The run itself goes
        first, so a process killed in between has made the cancel asked for durable: no answer
        carries that run on, and cancelling it again ends the children it left (ADR 0079).

        Raises:
            RunNotResumable: the run cannot be taken up (its ``reserve`` policy is missing).
        """
        if self._closing:
            return False  # a closed runtime takes nothing up (R3); the run stays as it is
        try:
            state = self.state(run_id)
        except RunNotFound:
            return False
        if state.purged is not None:
            return False
        if state.is_finished and state.run_status == "cancelled":
            # A cancel cut short once the run had ended: the children it left follow now.
            ended_any = False
            for child in self._children_at_rest(run_id):  # every one, not up to the first
                ended_any = self.cancel_at_rest(child, timeout) or ended_any
            return ended_any
        if state.is_finished and state.run_status in ("completed", "failed"):
            return False
        try:
            claim = self._claim(run_id)
        except RunOwnedElsewhere:
            return False
        try:
            state, opening, reserve = self._reopen(run_id, None, None, None, None, False)
        except RunOwnedElsewhere:
            self._release(run_id, claim)
            return False
        except BaseException:
            self._release(run_id, claim)
            raise
        claim.token.set()  # told before Begin: the executor cancels before it schedules anything
        started = state.started
        assert started is not None
        parent = (started.parent_run, started.parent_step or "") if started.parent_run else None
        try:
            handle = self._start(run_id, claim, state, opening, reserve, None, None, parent)
            handle.result(timeout)
        except RunOwnedElsewhere:
            # Another process appended to the run after it was read here (it answered or
            # resumed it): that one carries it on, or finished it, and nothing was appended.
            return False
        for child in self._children_at_rest(run_id):
            self.cancel_at_rest(child, timeout)
        return True

    def _children_at_rest(self, run_id: str) -> list[str]:
        """Return the child runs of a run that are not finished, by the run-summary projection."""
        found = self.summaries.read(self._organization).values()
        return [
            s.run_id
            for s in found
            if s.parent_run == run_id and s.status not in ("completed", "failed", "cancelled")
        ]

    def _start(
        self,
        run_id: str,
        claim: _Claim,
        state: RunFold,
        opening: list[DomainEvent],
        reserve: Reserve | None,
        on_progress: Progress | None,
        trace: Trace | None,
        parent: tuple[str, str] | None,
    ) -> RunHandle[ExecuteResult]:
        """Start the run's executor; return once its opening events are committed (or it ended).

        The executor answers :class:`RunEnded` (or a failure) at this runtime's ``runs`` address
        when it stops; that reply completes the handle and releases the claim.
        """
        self._given_policies.remember(run_id, reserve)
        correlation, reply = self._inbox.expect(f"{run_id}.{os.urandom(4).hex()}")
        on_progress = awaited_progress(on_progress, self._services.loop)
        try:
            executor = Executor.start(
                journal=self._journal,
                services=self._services,
                state=state,
                opening=opening,
                reply_to=self._inbox.address,
                correlation=correlation,
                clock=self._clock,
                cancel=claim.token,
                reserve=reserve,
                on_progress=on_progress,
                trace=trace,
                opened=claim.opened,
            )
        except BaseException:
            self._inbox.forget(correlation)
            self._release(run_id, claim)
            raise
        done: Future[ExecuteResult] = running_future()

        def settle(answer: Future[Any]) -> None:
            try:
                self._forget(run_id, claim, parent)
                claim.woken.set()  # whoever waits for the opening (below) waits no more
                error = answer.exception()
                with contextlib.suppress(InvalidStateError):  # completed by its caller
                    if error is not None:
                        done.set_exception(error)
                    else:
                        ended: RunEnded = answer.result()
                        done.set_result(ended.result)
            finally:
                claim.settled.set()  # a close and wait_idle wait for this, whatever came before

        reply.add_done_callback(settle)
        parent_active = None
        with self._lock:
            claim.executor = executor
            claim.done = done
            closing = self._closing
            if parent is not None:
                self._children.setdefault(parent[0], []).append(run_id)
                self._parents[run_id] = parent[0]
                parent_active = self._active.get(parent[0])
        claim.ready.set()
        if claim.token.is_set() or (parent_active is not None and parent_active.token.is_set()):
            self.cancel(run_id)  # a cancel that came before the executor existed
        if closing:
            executor.tell(Drain(drain=self._drain[0], cause=self._drain[1]))
        executor.tell(Begin())
        handle: RunHandle[ExecuteResult] = RunHandle(
            run_id, done, self.cancel, self.current, self._check_may_wait, self._started_by
        )
        # Return once the opening events are in the journal, so that the id can be read at once;
        # a run that ends before (it failed to append) has nothing more to wait for.
        claim.woken.wait()
        if not claim.opened.is_set() and done.exception() is not None:
            done.result()  # the run could not even begin: raise its error here
        # Begun, even if it stopped since: the caller gets its id, and its error from result().
        return handle

    def _started_by(self, run_id: str) -> list[str]:
        """Return the run and the runs that started it, up to the first not executing here."""
        line = [run_id]
        with self._lock:
            while (parent := self._parents.get(line[-1])) is not None and parent not in line:
                line.append(parent)
        return line

    def _check_may_wait(self) -> None:
        """Refuse to block the event loop that async steps run on, waiting for a run (A1).

        The run's own async steps would wait for that loop, and the loop for the run: a deadlock.
        """
        if self._services.loop.in_loop_thread():
            raise RuntimeError(
                "waiting for a run would block the event loop async steps run on, and the run's "
                "own async steps need it: from an async step use `await ctx.execute_async(plan)` "
                "(agents), or the asyncio runtime's `await rt.execute(...)`"
            )

    def _forget(self, run_id: str, claim: _Claim, parent: tuple[str, str] | None) -> None:
        """Drop a run that stopped executing: its claim and its place among its parent's."""
        claim.ready.set()
        with self._lock:
            if self._active.get(run_id) is claim:
                del self._active[run_id]
                _let_go_in_process(run_id)
            self._children.pop(run_id, None)
            self._parents.pop(run_id, None)
            if parent is not None:
                siblings = self._children.get(parent[0])
                if siblings is not None and run_id in siblings:
                    siblings.remove(run_id)
                    if not siblings:
                        del self._children[parent[0]]

    def _child_runner(
        self, plan: Plan, *, parent: tuple[str, str], call: int, **options: Any
    ) -> ExecuteResult:
        """Run the ``call``-th child plan of a parent step, or find it again (R5).

        A child that finished is answered from the journal; one that did not (the parent step
        waited, crashed, was suspended or retried) is resumed, never started twice.
        """
        started = self._child_start(plan, parent=parent, call=call, **options)
        return started.result() if isinstance(started, RunHandle) else started

    def _child_starter(
        self, plan: Plan, *, parent: tuple[str, str], call: int, **options: Any
    ) -> Future[ExecuteResult]:
        """Start (or find again) a parent step's ``call``-th child plan as :meth:`_child_runner`
        does; return the future its run completes, for an async agent to await (A1, E9)."""
        started = self._child_start(plan, parent=parent, call=call, **options)
        if isinstance(started, RunHandle):
            return started.future
        finished: Future[ExecuteResult] = Future()
        finished.set_result(started)
        return finished

    def _child_start(
        self, plan: Plan, *, parent: tuple[str, str], call: int, **options: Any
    ) -> RunHandle[ExecuteResult] | ExecuteResult:
        """Start or resume a parent step's ``call``-th child; a finished one is its result."""
        run_id = child_run_id(parent[0], parent[1], call)
        if self._journal.head(run_id) is None:
            return self.start(plan, parent=parent, run_id=run_id, call=call, **options)
        state = self.state(run_id)
        changed = _child_plan_change(plan, state.plan())
        if changed is not None:
            # Answering with the first plan's child would be silently wrong, and starting another
            # would leave the first behind (R5): the step fails, saying so.
            raise PlanRejected(
                None,
                f"ctx.execute call {call} of step {parent[1]!r} passed another plan than on its "
                f"first attempt, which started child run {run_id} ({changed}); a step must pass "
                "the same child plans, in the same order, every time it runs",
            )
        if state.is_finished and state.run_status in ("completed", "failed", "cancelled"):
            return state.result()
        with self._lock:
            running = self._active.get(run_id)
            done = None if running is None else running.done
        if done is not None:
            # An earlier attempt of the step (it timed out) started this child, which still
            # runs here: this attempt waits for it too, never a second execution (R5, ADR 0020).
            return RunHandle(
                run_id, done, self.cancel, self.current, self._check_may_wait, self._started_by
            )
        return self.resume_start(
            run_id,
            call_budget=options.get("call_budget"),
            reserve=options.get("reserve"),
            on_progress=options.get("on_progress"),
        )

    def close(self, drain: float, cause: str = "close") -> list[str]:
        """Stop taking work, drain, then suspend every run still executing (R3).

        No run starts from now on. Every executor is told to start no more steps; those whose
        steps in flight end within ``drain`` seconds suspend on their own, the others are then
        suspended with those steps still in flight (they run again on resume). Returns the runs
        that did not stop even then.
        """
        with self._lock:
            self._closing = True
            self._drain = (drain, cause)
            claims = list(self._active.values())
        for claim in claims:
            claim.tell(Drain(drain=drain, cause=cause))
        still = self.wait_idle(drain)
        if not still:
            return []
        with self._lock:
            claims = [self._active[r] for r in still if r in self._active]
        for claim in claims:
            claim.tell(Suspend())
        return self.wait_idle(_STOP_TIMEOUT)

    def _close_inbox(self) -> None:
        """Fail every run still awaited here: the runtime is closed (its executors stopped)."""
        self._inbox.close()

    @property
    def closing(self) -> bool:
        """Tell whether :meth:`close` was called: no run starts any more (R3)."""
        return self._closing

    @property
    def _loop(self) -> LoopRunner:
        """The event loop ``async def`` user code of this runtime runs on (A1, ADR 0025)."""
        return self._services.loop

    @property
    def _closed_by(self) -> str:
        """Return why :meth:`close` was called: ``close`` or ``exit`` (what suspensions record)."""
        return self._drain[1]

    # -- erasure ---------------------------------------------------------------------------------

    def purge(self, run_id: str, reason: str) -> int:
        """Erase a finished run's content from storage, keeping its events' shape (R2).

        See :func:`journaled.actors.run_erasure.purge_run`; a purged run cannot be resumed.
        """
        check_reason(reason)  # the same answer for every id, before the run is looked at
        self._check_here(run_id)  # another organization's run is unknown (ADR 0074)
        with self._lock:
            executing = set(self._active)
        boundary = self.boundary
        erased = purge_run(
            self._journal,
            run_id,
            reason,
            now=self._clock(),
            executing=executing,
            elsewhere=boundary.run_elsewhere if boundary is not None else None,
        )
        if erased:
            # Time travel's checkpoints hold the erased content of the run and of every run
            # purged with it; a purge is rare, so all of them go (ADR 0034).
            with self._checkpoints_lock:
                self.checkpoints.clear()
            # Erased once committed; the files are scrubbed as after a fact's purge, giving way
            # to readers and retrying in the background (rt.memory.scrub() tries again).
            self._scrubber.after_erasure()
        return erased

    def wait_idle(self, timeout: float) -> list[str]:
        """Wait up to ``timeout`` s for every executing run to stop; return those still running."""
        deadline = time.monotonic() + timeout
        with self._lock:
            active = dict(self._active)
        for claim in active.values():
            # A run claimed just before close() may have no executor yet: wait for it too (R3);
            # then for its answer, not only its actor: the answer comes after the actor stopped.
            claim.ready.wait(max(0.0, deadline - time.monotonic()))
            claim.settled.wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            return sorted(r for r, c in self._active.items() if not c.settled.is_set())

    def active(self) -> list[str]:
        """Return the runs executing in this runtime now.

        A run is listed once its opening events are in the journal, so every id returned here
        can be read at once with :meth:`history`, :meth:`state` or :meth:`why`.
        """
        with self._lock:
            return sorted(r for r, claim in self._active.items() if claim.opened.is_set())

    def cancel_all(self) -> list[str]:
        """Ask every run executing in this runtime to stop, opened or not; return their ids."""
        with self._lock:
            run_ids = sorted(self._active)
        return [r for r in run_ids if self.cancel(r)]


def _check_limits(limits: Limits | None) -> Limits:
    if limits is None:
        return Limits()
    if not isinstance(limits, Limits):
        raise argument_error(
            "limits", f"limits must be a journaled.Limits, got {type(limits).__name__}"
        )
    for table_name in ("per_tool", "per_skill", "per_agent"):
        table = getattr(limits, table_name)
        if not isinstance(table, dict):
            raise argument_error(
                f"limits.{table_name}",
                f"limits.{table_name} must be a dict, got {type(table).__name__}",
            )
        for index, (key, cap) in enumerate(table.items()):
            if text_problem(key, empty=False):
                raise argument_error(
                    f"limits.{table_name}", f"limits.{table_name} key {key!r} {text_problem(key)}"
                )
            # Keys are names, journaled as given with the run and kept by its purge, so one that
            # holds a secret is refused without quoting it, as a plan's ids are (ADR 0069).
            kinds = find_secrets(key)
            if kinds:
                kind = table_name.removeprefix("per_")
                raise argument_error(
                    f"limits.{table_name}",
                    f"limits.{table_name} key #{index} holds a secret ({', '.join(kinds)}): "
                    f"limits are journaled as they are, never redacted; key them by {kind} name",
                )
            if int_problem(cap, low=1):
                raise argument_error(
                    f"limits.{table_name}",
                    f"limits.{table_name}[{key!r}] must be a 64-bit int >= 1, got {short(cap)}",
                )
    return limits


def check_timeout(timeout: object) -> None:
    """Raise ValueError naming ``timeout`` unless it is None or a non-negative number."""
    problem = timeout_problem(timeout)
    if problem:
        raise ValueError(f"timeout {problem}")


def awaited_progress(on_progress: Progress | None, loop: LoopRunner) -> Progress | None:
    """Return ``on_progress`` as the executor calls it: when a call gives back an awaitable (an
    ``async def`` function, an object with an async ``__call__``), it is run to its end on the
    loop async steps run on (A1), each time, as a plain call is; the run's id marks its task, so
    a wait there for the run is refused as it is from a plain one (ADR 0063)."""
    if on_progress is None:
        return None
    given = on_progress

    @functools.wraps(given)  # its signature says whether it takes run_id
    def call(*args: Any, **kwargs: Any) -> None:
        result = given(*args, **kwargs)
        if inspect.isawaitable(result):
            loop.run(_marked(result, reporting()))

    return call


async def _marked(awaitable: Any, run_id: str | None) -> None:
    """Await an on_progress coroutine with its run's id as the task's mark."""
    token = REPORTING_TASK.set(run_id)
    try:
        await awaitable
    finally:
        REPORTING_TASK.reset(token)


def check_callable(name: str, value: object) -> None:
    """Raise ValueError naming the argument unless it is None or callable."""
    if value is not None and not callable(value):
        raise ValueError(f"{name} must be callable, got {type(value).__name__}")
