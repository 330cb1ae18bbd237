"""Orchestration: plan, approve, fit the budget, execute passes, replan (SPEC section 3).

The orchestrator runs in the caller's thread and is the single writer of the orchestration's
stream; each pass executes on the executor actor as a child run (``actors.runs``). Planner code is
user code: whatever it raises or returns, ``orchestrate`` answers with an :class:`Outcome` — a
planning failure is the ``failed`` status with the reason in the summary and in the journal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from journaled.actors.errors import RunNotFound, RunNotResumable
from journaled.actors.run_recorder import Progress
from journaled.actors.runs import Runs, check_budget, check_callable, new_run_id
from journaled.actors.steps import storable_text
from journaled.events.base import DomainEvent, Event, Pending
from journaled.events.errors import ConcurrencyConflict, PlanRejected
from journaled.events.inputs import text_problem
from journaled.events.journal import Journal
from journaled.events.orchestration import (
    ApprovalRequested,
    Budget,
    BudgetAwaited,
    BudgetGiven,
    ClarificationGiven,
    ClarificationRequested,
    Clarify,
    Gap,
    Gaps,
    Mode,
    OrchestrationEnded,
    OrchestrationStarted,
    Outcome,
    OutcomeStatus,
    PassEnded,
    PassStarted,
    PlanApproved,
    PlanningFailed,
    PlanProposed,
)
from journaled.events.orchestration_state import OrchestrationState, fold_orchestration
from journaled.events.plan_rules import Reserve, fold_calls
from journaled.events.plans import ExecuteResult, Observation, Plan
from journaled.events.run_state import RunState

Planner = Callable[[str, list[Observation], list[tuple[str, str]]], Any]
"""``planner(goal, observations, clarifications) -> Plan | Clarify | Gaps``."""

MODES: tuple[str, ...] = ("plan", "execute", "orchestrate")


@dataclass
class _Drive:
    state: OrchestrationState
    planner: Planner | None
    reserve: Reserve | None
    on_progress: Progress | None
    answers: dict[str, str] = field(default_factory=dict)
    take_over: bool = False


class Orchestrations:
    """Start and resume orchestrations over the runs of one runtime."""

    def __init__(self, journal: Journal, runs: Runs, clock: Callable[[], int]) -> None:
        self._journal = journal
        self._runs = runs
        self._clock = clock
        self._planners: dict[str, Planner] = {}

    # -- entry points ----------------------------------------------------------------------------

    def orchestrate(
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
    ) -> Outcome:
        """Plan toward a goal and run it under the budget and approval policy (O1-O5)."""
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
        run_id = new_run_id(self._clock())
        self._planners[run_id] = planner
        drive = _Drive(OrchestrationState(), planner, reserve, on_progress)
        self._append(
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
            ),
        )
        return self._drive(drive)

    def is_orchestration(self, run_id: str) -> bool:
        """Tell whether a run id names an orchestration (rather than a plain run)."""
        first = self._journal.first(run_id)
        return first is not None and isinstance(first.data, OrchestrationStarted)

    def state(self, run_id: str, position: int | None = None) -> OrchestrationState:
        """Fold an orchestration's events (up to a journal position)."""
        events = self._journal.stream(run_id)
        if not events:
            raise RunNotFound(f"no run {run_id!r} in this journal")
        if position is not None:
            events = [e for e in events if e.position <= position]
        return fold_orchestration(events)

    def resume(
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
    ) -> Outcome:
        """Take an orchestration up again: approve, clarify, answer or raise the budget (O3, O4)."""
        state = self.state(run_id)
        status = state.status
        if status is not None and status in ("completed", "failed", "dry_run"):
            raise RunNotResumable(f"run {run_id} already finished ({status}); nothing to resume")
        check_budget("call_budget", call_budget)
        check_callable("reserve", reserve)
        check_callable("on_progress", on_progress)
        if approve and not state.approval_pending:
            raise RunNotResumable(f"run {run_id} is not waiting for approval (status: {status})")
        given = dict(answers or {})
        pass_state = self._pass_state(state)
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
        chosen = planner or self._planners.get(run_id)
        if state.question is not None and clarification is not None and chosen is None:
            raise RunNotResumable(
                f"run {run_id}: pass planner=... to resume, the planner must be asked again"
            )
        drive = _Drive(state, chosen, reserve, on_progress, given, take_over)
        state.reopen()
        now = self._clock()
        if call_budget is not None and call_budget != state.budget:
            self._append(drive, BudgetGiven(at=now, previous=state.budget, budget=call_budget))
        if approve:
            self._append(drive, PlanApproved(at=now, pass_no=state.pass_no))
        if clarification is not None and state.question is not None:
            self._append(
                drive, ClarificationGiven(at=now, question=state.question, answer=clarification)
            )
        return self._drive(drive)

    # -- the loop --------------------------------------------------------------------------------

    def _drive(self, d: _Drive) -> Outcome:
        st = d.state
        started = st.started
        assert started is not None
        while True:
            run_id = st.current_run
            if run_id is None:
                if st.question is not None:
                    return self._end(
                        d, "waiting_for_clarification", f"waiting for clarification: {st.question}"
                    )
                if st.pass_no not in st.plans:
                    ended = self._plan(d)
                    if ended is not None:
                        return ended
                plan = st.plans[st.pass_no]
                if started.mode == "plan":
                    return self._end(
                        d, "dry_run", f"dry run: planned {len(plan.steps)} step(s); nothing ran"
                    )
                if started.require_approval and st.pass_no not in st.approved:
                    if not st.approval_pending:
                        self._append(d, ApprovalRequested(at=self._clock(), pass_no=st.pass_no))
                    return self._end(
                        d,
                        "waiting_for_approval",
                        f"waiting for approval of a {len(plan.steps)}-step plan",
                    )
                budget = self._pass_budget(st)
                if budget is not None and not started.partial:
                    estimate = fold_calls(plan.steps, budget, d.reserve)
                    if estimate > budget:
                        return self._await_budget(d, plan, None, estimate)
                run_id = new_run_id(self._clock())
                self._append(d, PassStarted(at=self._clock(), pass_no=st.pass_no, run=run_id))
                result: ExecuteResult | None = self._execute(d, plan, run_id, budget)
            else:
                result = self._continue(d, run_id)
            if result is not None or st.pass_status.get(st.pass_no) is None:
                pass_state = self._runs.state(run_id)
                self._append(
                    d,
                    PassEnded(
                        at=self._clock(),
                        pass_no=st.pass_no,
                        run=run_id,
                        status=pass_state.run_status or "failed",
                        calls_used=pass_state.calls_used,
                    ),
                )
            d.answers = {}
            pass_state = self._runs.state(run_id)
            if pass_state.stopped_for_budget:
                budget = self._pass_budget(st)
                plan = pass_state.plan()
                rest = [s for s in plan.steps if s.status != "succeeded"]
                remaining = None if budget is None else budget - pass_state.calls_used
                estimate = fold_calls(rest, remaining, d.reserve)
                return self._await_budget(d, plan, pass_state, estimate)
            if pass_state.waiting:
                step_id = pass_state.waiting[0]
                question = pass_state.questions.get(step_id, "")
                return self._end(
                    d,
                    "waiting_for_clarification",
                    f"waiting for an answer to step {step_id!r}: {question}",
                )
            if pass_state.run_status == "completed":
                calls = self._calls_before(st) + pass_state.calls_used
                return self._end(
                    d,
                    "completed",
                    f"completed {len(pass_state.order)} step(s) in {st.pass_no} pass(es) "
                    f"using {calls} model call(s)",
                )
            failed = _first_failure(pass_state)
            if started.mode == "orchestrate" and st.pass_no < started.max_passes:
                if d.planner is None:
                    return self._end(
                        d, "failed", f"{failed}; resume with planner=... to plan another pass"
                    )
                st.pass_no += 1  # replan with what this pass observed (the event follows)
                continue
            return self._end(d, "failed", failed)

    def _plan(self, d: _Drive) -> Outcome | None:
        """Ask the planner; journal its plan, question or failure (O1, O4, bad input)."""
        st = d.state
        started = st.started
        assert started is not None
        if d.planner is None:
            raise RunNotResumable(
                f"run {st.run_id}: pass planner=... to resume, the planner must be asked again"
            )
        observations = self._observations(st)
        try:
            answer = d.planner(started.goal, observations, list(st.clarifications))
        except Exception as exc:  # user code: a planner failure is an outcome, not a crash
            reason = storable_text(f"the planner raised {type(exc).__name__}: {exc}")
            return self._fail_planning(d, reason)
        if isinstance(answer, Clarify):
            problem = text_problem(answer.question, empty=False)
            if problem:
                return self._fail_planning(d, f"the planner's clarifying question {problem}")
            self._append(d, ClarificationRequested(at=self._clock(), question=str(answer.question)))
            return self._end(
                d, "waiting_for_clarification", f"waiting for clarification: {answer.question}"
            )
        if isinstance(answer, Gaps):
            gaps = tuple(
                g if isinstance(g, Gap) else Gap(kind="capability", name=str(g))
                for g in answer.gaps
            )
            names = ", ".join(f"{g.kind} {g.name!r}" for g in gaps) or "unspecified"
            return self._fail_planning(d, f"missing capabilities: {names}", gaps)
        if not isinstance(answer, Plan):
            return self._fail_planning(
                d, f"the planner returned {type(answer).__name__}, not a Plan, Clarify or Gaps"
            )
        try:
            self._runs.validate(answer)
        except PlanRejected as exc:
            return self._fail_planning(d, f"the planner's plan is invalid: {exc}")
        self._append(d, PlanProposed(at=self._clock(), pass_no=st.pass_no, plan=answer))
        return None

    def _fail_planning(self, d: _Drive, reason: str, gaps: tuple[Gap, ...] = ()) -> Outcome:
        self._append(
            d, PlanningFailed(at=self._clock(), pass_no=d.state.pass_no, reason=reason, gaps=gaps)
        )
        return self._end(d, "failed", f"planning failed: {reason}")

    def _await_budget(
        self,
        d: _Drive,
        plan: Plan,
        pass_state: RunState | None,
        estimate: int,
    ) -> Outcome:
        """Wait for a bigger total budget; the numbers are the orchestration's, across passes."""
        st = d.state
        total = st.budget or 0
        used = self._calls_before(st) + (pass_state.calls_used if pass_state is not None else 0)
        completed = sum(1 for s in plan.steps if s.status == "succeeded")
        awaited = Budget(
            est_calls=estimate,
            max_calls=total,
            completed_steps=completed,
            total_steps=len(plan.steps),
        )
        self._append(
            d,
            BudgetAwaited(
                at=self._clock(),
                pass_no=st.pass_no,
                budget=awaited,
                partial=pass_state is not None,
                used=used,
            ),
        )
        return self._end(
            d,
            "waiting_for_budget",
            f"waiting for budget: the remaining steps need {estimate} model call(s); "
            f"{used} of {total} used — resume with a call_budget of at least {used + estimate}",
        )

    def _execute(self, d: _Drive, plan: Plan, run_id: str, budget: int | None) -> ExecuteResult:
        return self._runs.execute(
            plan,
            call_budget=budget,
            reserve=d.reserve,
            on_progress=d.on_progress,
            parent=(d.state.run_id, f"pass-{d.state.pass_no}"),
            run_id=run_id,
        )

    def _continue(self, d: _Drive, run_id: str) -> ExecuteResult | None:
        """Carry on the current pass's run: start it if a crash came first, else resume it."""
        st = d.state
        try:
            pass_state = self._runs.state(run_id)
        except RunNotFound:
            return self._execute(d, st.plans[st.pass_no], run_id, self._pass_budget(st))
        status = pass_state.run_status
        if status in ("completed", "failed", "cancelled"):
            return None
        return self._runs.resume(
            run_id,
            call_budget=self._pass_budget(st),
            answers=d.answers or None,
            reserve=d.reserve,
            on_progress=d.on_progress,
            take_over=d.take_over,
        )

    # -- helpers ---------------------------------------------------------------------------------

    def _pass_budget(self, st: OrchestrationState) -> int | None:
        if st.budget is None:
            return None
        return max(0, st.budget - self._calls_before(st))

    def _calls_before(self, st: OrchestrationState) -> int:
        return sum(
            self._runs.state(run).calls_used for n, run in st.pass_runs.items() if n < st.pass_no
        )

    def _pass_state(self, st: OrchestrationState) -> RunState | None:
        run = st.current_run
        if run is None:
            return None
        try:
            return self._runs.state(run)
        except RunNotFound:
            return None

    def _observations(self, st: OrchestrationState) -> list[Observation]:
        out: list[Observation] = []
        for _, run in sorted(st.pass_runs.items()):
            try:
                out += self._runs.state(run).observations
            except RunNotFound:
                continue
        return out

    def outcome(self, st: OrchestrationState) -> Outcome:
        """Describe an orchestration as an :class:`Outcome` from its state."""
        pass_state = self._pass_state(st)
        plan = pass_state.plan() if pass_state is not None else st.plan
        ended = st.ended
        return Outcome(
            run_id=st.run_id,
            status=ended.status if ended is not None else "failed",
            plan=plan,
            observations=self._observations(st),
            summary=ended.summary if ended is not None else "running",
            budget=st.waiting_budget
            if ended is not None and ended.status == "waiting_for_budget"
            else None,
            gaps=list(st.gaps) if st.gaps else None,
            pass_run=st.current_run,
        )

    def _end(self, d: _Drive, status: OutcomeStatus, summary: str) -> Outcome:
        self._append(d, OrchestrationEnded(at=self._clock(), status=status, summary=summary))
        if status in ("completed", "failed", "dry_run"):
            self._planners.pop(d.state.run_id, None)  # finished: nothing will ask it again
        return self.outcome(d.state)

    def _append(self, d: _Drive, event: DomainEvent) -> None:
        st = d.state
        stream = event.run_id if isinstance(event, OrchestrationStarted) else st.run_id
        pending = Pending(stream=stream, version=st.version + 1, data=event)
        try:
            [position] = self._journal.append([pending])
        except ConcurrencyConflict as exc:
            raise RunNotResumable(
                f"run {stream} is being orchestrated by another process; reload and retry"
            ) from exc
        st.apply(Event(position=position, stream=stream, version=pending.version, data=event))


def _first_failure(state: RunState) -> str:
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
