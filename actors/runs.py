"""Plans in execution: ``rt.execute``, ``rt.resume``, ``rt.cancel``, ``rt.runs`` (SPEC 2)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import msgspec

from journaled.actors.errors import RunNotFound, RunNotResumable, RunOwnedElsewhere
from journaled.actors.executor import Executor
from journaled.actors.ownership import owner_alive, this_process
from journaled.actors.run_recorder import Progress, Trace
from journaled.actors.steps import Registry, journalable
from journaled.events.base import DomainEvent, Event
from journaled.events.codec import topic_of
from journaled.events.errors import PlanRejected
from journaled.events.journal import Journal
from journaled.events.orchestration import OrchestrationStarted, PassStarted
from journaled.events.orchestration_state import fold_orchestration
from journaled.events.plan_rules import Reserve, validate
from journaled.events.plans import ExecuteResult, Limits, Plan, RunDiff, diff_results
from journaled.events.run_audit import explain_orchestration, explain_run
from journaled.events.run_messages import Begin, CancelRun
from journaled.events.run_state import RunState, fold_run
from journaled.events.runs import AnswersGiven, BudgetRaised, RunResumed, RunStarted

RUN_PREFIX = "run_"
_STOP_TIMEOUT = 5.0


def new_run_id(now: int) -> str:
    """Make a collision-safe, time-ordered run id."""
    return f"{RUN_PREFIX}{now:012x}_{os.urandom(6).hex()}"


def check_budget(name: str, value: object) -> int | None:
    """Return a model-call budget, or raise ValueError naming the argument."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int (model calls) or None, got {value!r}")
    return value


def _normalise(plan: Plan, run_id: str) -> Plan:
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
    return Plan(goal=plan.goal, steps=steps, id=plan.id or run_id.replace(RUN_PREFIX, "plan_", 1))


class Runs:
    """``rt.runs`` and the run operations of a runtime. Safe to use from any thread."""

    def __init__(
        self,
        journal: Journal,
        registry: Registry,
        clock: Callable[[], int],
        agents_enabled: bool,
    ) -> None:
        self._journal = journal
        self._registry = registry
        self._clock = clock
        self._agents = agents_enabled
        self._lock = threading.Lock()
        self._active: dict[str, tuple[Any, threading.Event, threading.Event]] = {}
        """run id -> (executor, cancel token, set once the run's opening events are committed)"""
        self._children: dict[str, list[str]] = {}

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
    ) -> ExecuteResult:
        """Validate and execute a plan as a new journaled run (E1-E13)."""
        self.validate(plan)
        budget = check_budget("call_budget", call_budget)
        if isinstance(max_parallel_steps, bool) or not isinstance(max_parallel_steps, int):
            raise ValueError(f"max_parallel_steps must be an int >= 1, got {max_parallel_steps!r}")
        if max_parallel_steps < 1:
            raise ValueError(f"max_parallel_steps must be >= 1, got {max_parallel_steps}")
        limits = _check_limits(limits)
        check_callable("reserve", reserve)
        check_callable("on_progress", on_progress)
        if step_timeout is not None and (
            isinstance(step_timeout, bool)
            or not isinstance(step_timeout, int | float)
            or step_timeout <= 0
        ):
            raise ValueError(
                f"step_timeout must be a positive number of seconds, got {step_timeout!r}"
            )
        now = self._clock()
        run_id = run_id or new_run_id(now)
        settled = _normalise(plan, run_id)
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
        )
        return self._run(run_id, RunState(), [started], reserve, on_progress, trace, parent)

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
        """Rebuild a run from the journal alone and carry on (E14).

        An unfinished run whose owner is alive (see ``actors.ownership``) is refused with
        RunOwnedElsewhere unless ``take_over`` is set.
        """
        state = self.state(run_id)
        took_over = self._check_free(run_id, state, take_over)
        if state.is_finished and state.run_status in ("completed", "failed", "cancelled"):
            raise RunNotResumable(
                f"run {run_id} already finished ({state.run_status}); there is nothing to resume"
            )
        budget = check_budget("call_budget", call_budget)
        given = dict(answers or {})
        for step_id, answer in given.items():
            if step_id not in state.waiting:
                waiting = ", ".join(state.waiting) or "none"
                raise RunNotResumable(
                    f"run {run_id}: step {step_id!r} is not waiting for an answer "
                    f"(waiting steps: {waiting})"
                )
            if not isinstance(answer, str):
                raise RunNotResumable(
                    f"run {run_id}: the answer for step {step_id!r} must be a string"
                )
        check_callable("reserve", reserve)
        check_callable("on_progress", on_progress)
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
            )
        )
        started = state.started
        assert started is not None
        parent = (started.parent_run, started.parent_step or "") if started.parent_run else None
        return self._run(run_id, state, opening, reserve, on_progress, trace, parent)

    def check_free(self, run_id: str, take_over: bool = False) -> None:
        """Raise unless nobody executes the run now (RunOwnedElsewhere: a live owner has it)."""
        self._check_free(run_id, self.state(run_id), take_over)

    def _check_free(self, run_id: str, state: RunState, take_over: bool) -> str | None:
        """Refuse a run executing here or owned by a live process; return the owner taken over."""
        with self._lock:
            if run_id in self._active:
                raise RunNotResumable(f"run {run_id} is executing in this runtime right now")
        if state.is_finished or not state.owner:
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
        executor, token, _ = active
        token.set()
        executor.tell(CancelRun())
        return True

    def _run(
        self,
        run_id: str,
        state: RunState,
        opening: list[DomainEvent],
        reserve: Reserve | None,
        on_progress: Progress | None,
        trace: Trace | None,
        parent: tuple[str, str] | None,
    ) -> ExecuteResult:
        done: Future[ExecuteResult] = Future()
        token = threading.Event()
        opened = threading.Event()
        executor = Executor.start(
            journal=self._journal,
            registry=self._registry,
            state=state,
            opening=opening,
            done=done,
            clock=self._clock,
            cancel=token,
            reserve=reserve,
            on_progress=on_progress,
            child_runner=self._child_runner,
            trace=trace,
            opened=opened,
        )
        with self._lock:
            self._active[run_id] = (executor, token, opened)
            if parent is not None:
                self._children.setdefault(parent[0], []).append(run_id)
                parent_active = self._active.get(parent[0])
        if parent is not None and parent_active is not None and parent_active[1].is_set():
            self.cancel(run_id)
        try:
            executor.tell(Begin())
            while True:
                try:
                    result = done.result(timeout=0.5)
                    executor.actor_stopped.wait(_STOP_TIMEOUT)  # it stops right after answering
                    return result
                except FutureTimeout:
                    if not executor.is_alive() and not done.done():
                        raise RuntimeError(
                            f"the executor of run {run_id} stopped unexpectedly"
                        ) from None
        finally:
            with self._lock:
                self._active.pop(run_id, None)
                self._children.pop(run_id, None)
                if parent is not None:
                    siblings = self._children.get(parent[0])
                    if siblings is not None and run_id in siblings:
                        siblings.remove(run_id)
                        if not siblings:
                            del self._children[parent[0]]

    def _child_runner(
        self, plan: Plan, *, parent: tuple[str, str], **options: Any
    ) -> ExecuteResult:
        return self.execute(plan, parent=parent, **options)

    # -- reading ---------------------------------------------------------------------------------

    def history(self, run_id: str) -> list[Event]:
        """Return every event of a run, oldest first."""
        events = self._journal.stream(run_id)
        if not events:
            raise RunNotFound(f"no run {run_id!r} in this journal")
        return events

    def state(self, run_id: str, position: int | None = None) -> RunState:
        """Fold a run's events (up to a journal position) into its state.

        The latest state starts from the run's snapshot, when there is one, and folds only the
        events after it; a past state folds the prefix of the stream.
        """
        first = self._journal.first(run_id)
        if first is None:
            raise RunNotFound(f"no run {run_id!r} in this journal")
        if position is not None:
            if position < first.position:
                raise ValueError(
                    f"position {position} is before run {run_id} began "
                    f"(its first event is at {first.position})"
                )
            return fold_run(self._journal.stream(run_id, upto=position))
        snapshot = self._journal.snapshot(run_id)
        state = RunState.restore(snapshot[1]) if snapshot is not None else None
        if state is None:
            return fold_run(self._journal.stream(run_id))
        for event in self._journal.stream(run_id, after_version=state.version):
            state.apply(event)
        return state

    def at(self, run_id: str, position: int) -> ExecuteResult:
        """Return the run exactly as it was at a journal position (O7).

        For an orchestration, this is the run of the pass that was current at that position.
        """
        first = self._journal.first(run_id)
        if first is None:
            raise RunNotFound(f"no run {run_id!r} in this journal")
        end = self._journal.position()
        if position > end:
            raise ValueError(f"position {position} is past the end of the journal ({end})")
        if isinstance(first.data, OrchestrationStarted):
            if position < first.position:
                raise ValueError(
                    f"position {position} is before run {run_id} began "
                    f"(its first event is at {first.position})"
                )
            # The current pass's run, never an earlier one: after a replan the failed pass is
            # history, and the new pass has no run until its pass-started.
            then = fold_orchestration(self._journal.stream(run_id, upto=position))
            current = then.current_run
            pass_events = self._journal.stream(current, upto=position) if current else []
            if not pass_events:
                raise ValueError(
                    f"run {run_id} had not started executing pass {then.pass_no} "
                    f"at position {position}"
                )
            return fold_run(pass_events).result()
        return self.state(run_id, position).result()

    def diff(self, run_id: str, a: int, b: int) -> RunDiff:
        """Say what changed in a run from position ``a`` to position ``b`` (O7)."""
        if b < a:
            raise ValueError(f"diff needs a <= b, got a={a}, b={b}")
        return diff_results(run_id, a, b, self.at(run_id, a), self.at(run_id, b))

    def position_at(self, run_id: str, at: int) -> int:
        """Return the journal position of a run's last event recorded by an epoch-ms time.

        For an orchestration, the events of its passes count too.
        """
        events = self.history(run_id)
        if at < events[0].data.at:
            raise ValueError(
                f"run {run_id} had not begun at {at} (it began at {events[0].data.at})"
            )
        everything = list(events)
        for e in events:
            if isinstance(e.data, PassStarted):
                everything += self._journal.stream(e.data.run)
        return max(e.position for e in everything if e.data.at <= at)

    def at_time(self, run_id: str, at: int) -> ExecuteResult:
        """Return the run as it was at an epoch-ms time: after its last event recorded by then."""
        return self.at(run_id, self.position_at(run_id, at))

    def why(self, run_id: str) -> str:
        """Explain, from events alone, why a run or orchestration is in its state (O6)."""
        events = self.history(run_id)
        if isinstance(events[0].data, OrchestrationStarted):
            return explain_orchestration(run_id, events, self._journal.stream)
        return explain_run(run_id, events)

    def wait_idle(self, timeout: float) -> list[str]:
        """Wait up to ``timeout`` s for every executing run to stop; return those still running."""
        deadline = time.monotonic() + timeout
        with self._lock:
            active = dict(self._active)
        for executor, _, _ in active.values():
            executor.actor_stopped.wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            return sorted(r for r, (ex, _, _) in self._active.items() if ex.is_alive())

    def active(self) -> list[str]:
        """Return the runs executing in this runtime now.

        A run is listed once its opening events are in the journal, so every id returned here
        can be read at once with :meth:`history`, :meth:`state` or :meth:`why`.
        """
        with self._lock:
            return sorted(r for r, (_, _, opened) in self._active.items() if opened.is_set())

    def cancel_all(self) -> list[str]:
        """Ask every run executing in this runtime to stop, opened or not; return their ids."""
        with self._lock:
            run_ids = sorted(self._active)
        return [r for r in run_ids if self.cancel(r)]

    def list(self) -> list[str]:
        """Return the ids of every run and orchestration in the journal, oldest first."""
        topics = [topic_of(RunStarted), topic_of(OrchestrationStarted)]
        return [e.stream for e in self._journal.read(topics=topics) if e.version == 1]


def _check_limits(limits: Limits | None) -> Limits:
    if limits is None:
        return Limits()
    if not isinstance(limits, Limits):
        raise ValueError(f"limits must be a journaled.Limits, got {type(limits).__name__}")
    for table_name in ("per_tool", "per_skill", "per_agent"):
        for key, cap in getattr(limits, table_name).items():
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
                raise ValueError(f"limits.{table_name}[{key!r}] must be an int >= 1, got {cap!r}")
    return limits


def check_callable(name: str, value: object) -> None:
    """Raise ValueError naming the argument unless it is None or callable."""
    if value is not None and not callable(value):
        raise ValueError(f"{name} must be callable, got {type(value).__name__}")
