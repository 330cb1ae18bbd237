"""Explain runs and orchestrations from their events, in plain words with ids and numbers (O6)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from journaled.events.base import Event
from journaled.events.fork import Lineage
from journaled.events.inputs import flat, json_bytes
from journaled.events.memory_audit import when
from journaled.events.orchestration import (
    ApprovalRequested,
    BudgetAwaited,
    BudgetGiven,
    ClarificationGiven,
    ClarificationRequested,
    OrchestrationEnded,
    OrchestrationResumed,
    OrchestrationStarted,
    OrchestrationSuspended,
    PassEnded,
    PassStarted,
    PlanApproved,
    PlanningFailed,
    PlanProposed,
    ReplanDecided,
)
from journaled.events.orchestration_state import fold_orchestration
from journaled.events.run_state import RunFold, fold_run
from journaled.events.runs import (
    AnswersGiven,
    BudgetRaised,
    BudgetStopped,
    CallsOverrun,
    CancelRequested,
    MemoryRead,
    RunFinished,
    RunForked,
    RunPurged,
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


def duration(ms: int) -> str:
    """Render a duration in milliseconds for people: 850ms, 12.5s, 3m 20s, 2h 5m."""
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {sec}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes}m"


def describe_run_event(event: Event) -> str | None:
    """Say in one line what a run event records (None for routine bookkeeping)."""
    data = event.data
    match data:
        case RunForked():
            return describe_fork(data)
        case RunStarted():
            budget = (
                "no call budget"
                if data.call_budget is None
                else f"a budget of {data.call_budget} model call(s)"
            )
            parent = (
                f", for step {data.parent_step!r} of {data.parent_run}" if data.parent_run else ""
            )
            steps = len(data.plan.steps)
            return f"started {steps} step(s) toward {data.plan.goal!r} with {budget}{parent}"
        case WavePartitioned():
            skipped = [o.step_id for o in data.skipped] + list(data.unobserved)
            extra = f"; skipped {', '.join(skipped)}" if skipped else ""
            return f"wave {data.wave}: runnable {', '.join(data.runnable) or 'none'}{extra}"
        case StepStarted():
            again = f" (attempt {data.attempt})" if data.attempt > 1 else ""
            return f"step {data.step_id!r} started{again}"
        case StepSucceeded():
            return f"step {data.step_id!r} succeeded" + (
                f", charged {data.charged} call(s)" if data.charged else ""
            )
        case StepFailed():
            return f"step {data.step_id!r} {_failed_in(data)}: {flat(data.observation.error)}"
        case StepRetrying():
            charged = f", charged {data.charged} call(s)" if data.charged else ""
            return (
                f"step {data.step_id!r} attempt {data.attempt} failed{charged}: "
                f"{flat(data.observation.error)}; retrying in {data.delay:g}s "
                f"(at most {data.attempts} attempt(s))"
            )
        case StepWaiting():
            return f"step {data.step_id!r} waits for an answer: {flat(data.question)}"
        case StepsSkipped():
            ids = [o.step_id for o in data.observations] + list(data.unobserved)
            return f"steps {', '.join(ids)} skipped ({data.cause})"
        case CancelRequested():
            return "cancel requested"
        case BudgetStopped():
            return (
                f"paused before wave {data.wave}: it needed {data.estimate} model call(s) with "
                f"{data.used} of the budget of {data.budget} used"
            )
        case AnswersGiven():
            return "answers given for " + ", ".join(f"{k!r}" for k in data.answers)
        case BudgetRaised():
            return f"call budget changed from {data.previous} to {data.budget}"
        case RunResumed():
            rerun = (
                f"; re-running {', '.join(data.rerun)} (in flight when it stopped)"
                if data.rerun
                else ""
            )
            return f"resumed (resumption {data.resumption}){rerun}"
        case RunFinished():
            return f"pass ended: {data.status}, {data.calls_used} model call(s) used"
        case RunPurged():
            return _purged(data, event.stream)
        case RunSuspended():
            flight = (
                f"; {', '.join(data.in_flight)} still in flight, run again on resume"
                if data.in_flight
                else ""
            )
            why = "the runtime closed" if data.cause == "close" else "the process exited"
            return f"suspended: {why} (drained up to {data.drain:g}s){flight}"
        case CallsOverrun():
            return (
                f"step {data.step_id!r} overran its reservation: it reported {data.reported} "
                f"model call(s) against {data.reserved} reserved, and was charged "
                f"{data.reported}"
            )
        case MemoryRead():
            ops = ", ".join(data.ops)
            return (
                f"step {data.step_id!r} read {len(data.fact_ids)} fact(s) from memory ({ops}): "
                + ", ".join(data.fact_ids)
            )
    return None


def _failed_in(data: StepFailed) -> str:
    """Say which attempt failed, against the retry policy's bound when it had one (S2).

    The attempt number counts every start, so after a crash or a closing runtime cut attempts
    short (they run again, E14, R3) it may exceed the failures the policy allows.
    """
    if data.attempts <= 0:
        return "failed"
    if data.attempt <= data.attempts:
        return f"failed in attempt {data.attempt} of {data.attempts}"
    return (
        f"failed in attempt {data.attempt} (its retry policy allows {data.attempts} failed "
        "attempt(s); attempts cut short by a crash or a closing runtime do not count)"
    )


def describe_fork(data: RunForked) -> str:
    """Say where a fork comes from and what it changed, in one line (F2)."""
    steps = {s.id: s for s in data.started.plan.steps}
    changes = []
    if data.replaced:
        what = ", ".join(
            f"{i!r} (now {steps[i].kind} {steps[i].target!r}, input {_brief(steps[i].input)})"
            for i in data.replaced
        )
        changes.append(f"step(s) {what} replaced")
    if data.answers:
        changes.append("answers given for " + ", ".join(f"{k!r}" for k in data.answers))
    if data.started.call_budget != data.budget_from:
        changes.append(f"call budget {data.budget_from} -> {data.started.call_budget}")
    kept = [c.observation.step_id for c in data.carried]
    charged = sum(c.charged for c in data.carried)
    pending = [s.id for s in data.started.plan.steps if s.id not in set(kept)]
    with_changes = f" with {'; '.join(changes)}" if changes else " with no change"
    return (
        f"forked from {data.source} at #{data.position}{with_changes}: kept "
        f"{', '.join(kept) or 'no step'} ({charged} model call(s)), pending "
        f"{', '.join(pending) or 'none'}"
    )


def _brief(value: Any) -> str:
    """Render a step input as short JSON on one line (an input may be [purged] text)."""
    text = flat(json_bytes(value).decode())
    return text if len(text) <= 80 else text[:79] + "…"


def _purged(data: RunPurged, stream: str) -> str:
    via = "" if data.root == stream else f" (with {data.root})"
    return f"content purged{via}: {data.reason}"


def explain_run(
    run_id: str,
    events: Sequence[Event],
    lineage: Sequence[Lineage] = (),
    *,
    interrupted: bool = False,
) -> str:
    """Explain why a run is in its state, from its events alone (O6).

    ``lineage`` is the run's chain of forks, root first (``rt.runs.lineage``): a fork of a fork
    names it after the line that says where it comes from (F2). ``interrupted``: the run
    listing judged, now, that the owner of this unsettled run stopped executing it (T2,
    ADR 0088); the head and the ``now:`` line say so, as the listing does.
    """
    if not events:
        return f"no run {run_id} in this journal"
    why = RunWhy(run_id, interrupted=interrupted)
    for event in events:
        why.add(event)
    lines = why.lines()
    lines[1:1] = describe_lineage(lineage)
    return "\n".join(lines)


def describe_lineage(lineage: Sequence[Lineage]) -> list[str]:
    """Say a chain of forks, root first, one run a line (F2); nothing for a chain of two or
    fewer runs: a fork's why opens with the line that names its source."""
    if len(lineage) <= 2:
        return []
    lines = ["lineage, root first:"]
    for link in lineage:
        if link.forked_from is None:
            lines.append(f"  {link.run_id} — the root run")
        else:
            lines.append(f"  {link.run_id} — forked from {link.forked_from} at #{link.at}")
    return lines


class Touched(dict[str, Any]):
    """A dict that remembers which keys were set since :meth:`take` was last called.

    Put in place of a :class:`RunFold`'s ``status`` table, it tells a reader which steps an event
    changed, so it need not compare every step after every event. The fold only sets single
    steps' statuses once a run started (it replaces the table whole only at the start).
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.touched: set[str] = set(self)

    def __setitem__(self, key: str, value: Any) -> None:
        self.touched.add(key)
        super().__setitem__(key, value)

    def take(self) -> set[str]:
        """Return the keys set since the last call (all keys the first time)."""
        touched, self.touched = self.touched, set()
        return touched


class RunWhy:
    """A run's why, kept up to date one event at a time (what ``explain_run`` says after each).

    The why is a head line, one line per described event, and a ``now:`` line; only the head and
    the ``now:`` line depend on more than their own event, so adding an event costs one line.
    """

    def __init__(self, run_id: str, *, interrupted: bool = False) -> None:
        self.run_id = run_id
        self.interrupted = interrupted
        """Judged by the run listing, not folded: its owner stopped executing it (ADR 0088)."""
        self.state = RunFold()
        self.timeline: list[str] = []
        """One line per described event so far."""
        self._start: int | None = None
        self._waiting_since: dict[str, int] = {}
        self._running: set[str] = set()
        self._index: dict[str, int] = {}
        self._wave_told = 0
        """The wave the last partition line named (0: none yet, or a new pass began)."""
        self._implied: tuple[int, list[str], str] | None = None
        """The line told for a partition left out as implied (ADR 0035): its index in the
        timeline, the steps it started so far, and the line's prefix."""

    def add(self, event: Event) -> None:
        """Fold one event of the run's stream."""
        self.state.apply(event)
        status = self.state.status
        if not isinstance(status, Touched):
            status = self.state.status = Touched(status)
            self._index = {step_id: i for i, step_id in enumerate(self.state.order)}
        for step_id in status.take():
            if status.get(step_id) == "running":
                self._running.add(step_id)
            else:
                self._running.discard(step_id)
        data = event.data
        if self._start is None:
            self._start = data.at
        if isinstance(data, StepWaiting):
            since = self._waiting_since.get(data.step_id)
            self._waiting_since[data.step_id] = data.at if since is None else max(since, data.at)
        prefix = f"  [#{event.position} +{duration(data.at - self._start)}] "
        match data:
            case WavePartitioned():
                self._wave_told, self._implied = data.wave, None
            case StepStarted() if data.wave != self._wave_told:
                self._tell_implied_partition(data, prefix)
            case StepStarted() if self._implied is not None:
                # Every step the wave starts, first attempts or not: a resumed wave's steps
                # start again at attempt 2 or later (O6). A retry is already on the line.
                line, started, told = self._implied
                if data.step_id not in started:
                    started.append(data.step_id)
                    self.timeline[line] = f"{told}wave {data.wave}: runnable {', '.join(started)}"
            case RunResumed():
                self._wave_told, self._implied = 0, None
            case _:
                pass
        text = describe_run_event(event)
        if text is not None:
            self.timeline.append(prefix + text)

    def _tell_implied_partition(self, data: StepStarted, prefix: str) -> None:
        """Say the wave a start opens whose partition was not stored: it said no more (0035)."""
        self._wave_told = data.wave
        self._implied = (len(self.timeline), [data.step_id], prefix)
        self.timeline.append(f"{prefix}wave {data.wave}: runnable {data.step_id}")

    def head(self) -> str:
        """Return the first line: the run and how it ended (or that it runs)."""
        state = self.state
        status = _run_status(state.run_status, state.is_finished, state.suspended is not None)
        if state.forked is not None and not state.resumptions:
            status = "a fork, not run yet"
        elif self._interrupted():
            status = "interrupted"
        return f"run {self.run_id} — {status}:"

    def _interrupted(self) -> bool:
        """Tell whether the listing's ``interrupted`` holds for the run as folded so far."""
        state = self.state
        unsettled = not state.is_finished and state.suspended is None
        return self.interrupted and unsettled and not (state.forked and not state.resumptions)

    def now(self) -> str:
        """Return the last line: why the run is in its state now."""
        flight = sorted(self._running, key=lambda step_id: self._index.get(step_id, 0))
        if self._interrupted():
            return "now: " + _interrupted_now(self.state.owner, flight)
        return "now: " + _run_now(self.state, self._waiting_since, flight)

    def lines(self) -> list[str]:
        """Return the whole why, line by line; a fork's starts with where it comes from (F2)."""
        forked = self.state.forked
        origin = [describe_fork(forked)] if forked is not None else []
        return [*origin, self.head(), *self.timeline, self.now()]


def _run_status(status: str | None, finished: bool, suspended: bool = False) -> str:
    if suspended:
        return "suspended"
    return status.replace("_", " ") if finished and status else "running (or stopped mid-step)"


def _interrupted_now(owner: str, flight: Sequence[str]) -> str:
    """Say that an unsettled run's owner stopped executing it, and what a resume does (T2)."""
    rerun = f"; step(s) {', '.join(flight)} were in flight and run again" if flight else ""
    return (
        f"interrupted: its owner ({owner or 'unknown'}) stopped without ending it — resume it "
        f"to carry on{rerun}"
    )


def _run_now(state: RunFold, waiting_since: dict[str, int], flight: list[str]) -> str:
    last = state.last_at
    if state.suspended is not None:
        suspended_flight = state.suspended.in_flight
        rerun = f"; step(s) {', '.join(suspended_flight)} run again" if suspended_flight else ""
        return f"suspended when its runtime closed — resume it to carry on{rerun}"
    if state.forked is not None and state.resumptions == 0:
        return (
            f"forked, not run yet — run it with rt.resume({state.run_id!r}) from a program "
            "that registers its steps"
        )
    if not state.is_finished:
        return (
            f"not finished; step(s) {', '.join(flight)} were in flight and run again on resume"
            if flight
            else "not finished; resume it to carry on"
        )
    if state.waiting:
        parts = []
        for step_id in state.waiting:
            since = waiting_since.get(step_id, last)
            parts.append(
                f"step {step_id!r} waits for an answer to {state.questions.get(step_id, '?')!r} "
                f"since {when(since)}"
            )
        return "; ".join(parts) + " — resume with answers={step: answer}"
    if state.stopped_for_budget and state.budget_stop is not None:
        stop = state.budget_stop
        return (
            f"paused for budget before wave {stop.wave}: it needs {stop.estimate} model call(s), "
            f"{stop.used} of {stop.budget} used — resume with a call_budget of at least "
            f"{stop.used + stop.estimate}"
        )
    if state.run_status == "failed":
        failed = [
            f"step {s!r} failed with {state.failures[s]!r}"
            for s in state.order
            if s in state.failures
        ]
        return "; ".join(failed) or "not every step succeeded"
    if state.run_status == "cancelled":
        return "cancelled; steps that had not started were skipped"
    return f"completed using {state.calls_used} model call(s)"


def describe_orchestration_event(event: Event) -> str | None:
    """Say in one line what an orchestration event records."""
    data = event.data
    match data:
        case OrchestrationStarted():
            budget = (
                "no call budget"
                if data.call_budget is None
                else f"a budget of {data.call_budget} call(s)"
            )
            return f"asked to reach {data.goal!r} (mode {data.mode}, {budget})"
        case PlanProposed():
            return f"pass {data.pass_no}: the planner proposed {len(data.plan.steps)} step(s)"
        case PlanningFailed():
            return f"pass {data.pass_no}: planning failed: {flat(data.reason)}"
        case ClarificationRequested():
            return f"the planner asked: {flat(data.question)}"
        case ClarificationGiven():
            return f"answered {data.question!r} with {data.answer!r}"
        case ApprovalRequested():
            return f"pass {data.pass_no}: the plan waits for approval"
        case PlanApproved():
            return f"pass {data.pass_no}: the plan was approved"
        case BudgetAwaited():
            b = data.budget
            how = "after running the waves that fit" if data.partial else "before running anything"
            return (
                f"waiting for budget {how}: {b.est_calls} more call(s) needed, {data.used} of "
                f"{b.max_calls} used ({b.completed_steps} of {b.total_steps} step(s) done)"
            )
        case BudgetGiven():
            return f"call budget changed from {data.previous} to {data.budget}"
        case PassStarted():
            return f"pass {data.pass_no} runs as {data.run}"
        case PassEnded():
            return (
                f"pass {data.pass_no} ({data.run}) ended: {data.status}, {data.calls_used} call(s)"
            )
        case ReplanDecided():
            return f"{data.reason}; replanning as pass {data.pass_no} of at most {data.max_passes}"
        case OrchestrationResumed():
            return "resumed: " + "; ".join(_resume_changes(data))
        case OrchestrationSuspended():
            return f"suspended when its runtime closed ({_suspended_where(data)})"
        case OrchestrationEnded():
            return f"status {data.status}: {data.summary}"
        case RunPurged():
            return _purged(data, event.stream)
    return None


def _suspended_where(data: OrchestrationSuspended) -> str:
    if data.phase == "planning":
        where = f"pass {data.pass_no} was being planned"
    else:
        where = f"pass {data.pass_no} was running" + (f" as {data.run}" if data.run else "")
    return where if data.cause == "close" else f"{where}; {data.cause}"


def _resume_changes(data: OrchestrationResumed) -> list[str]:
    changes = []
    if data.budget is not None:
        changes.append(f"call budget changed from {data.previous_budget} to {data.budget}")
    if data.approved is not None:
        changes.append(f"the plan of pass {data.approved} approved")
    if data.question is not None:
        changes.append(f"answered {data.question!r} with {data.answer!r}")
    if data.answered:
        changes.append("answers given for " + ", ".join(f"{s!r}" for s in data.answered))
    return changes or [f"nothing changed (resumption {data.resumption})"]


def explain_orchestration(
    run_id: str,
    events: Sequence[Event],
    run_events: Callable[[str], Sequence[Event]],
    *,
    interrupted: Collection[str] = (),
) -> str:
    """Explain an orchestration and each of its passes, from events alone (O6).

    Its head names the status the run listing shows (T2): the status it stopped at, else
    ``suspended`` (its own ``orchestration.suspended``, ADR 0087, or in journals before it, its
    pass's suspension), else ``interrupted`` when ``interrupted`` (the ids the listing judged
    so, now: ADR 0088) holds it, else ``running``; a pass in ``interrupted`` is explained so.
    """
    if not events:
        return f"no run {run_id} in this journal"
    # The fold says whether the last status still holds: a resume after it means running again.
    state = fold_orchestration(list(events))
    last = state.ended
    current = state.current_run
    pass_state = fold_run(list(run_events(current))) if current is not None else None
    let_go = state.suspended is not None or (
        pass_state is not None and pass_state.suspended is not None and not pass_state.is_finished
    )
    if last is not None:
        status = last.status.replace("_", " ")
    elif let_go:
        status = "suspended"
    elif run_id in interrupted:
        status = "interrupted"
    else:
        status = "running"
    lines = [f"orchestration {run_id} — {status}:"]
    lines += _timeline(events, describe_orchestration_event)
    waited_since = {
        "waiting_for_approval": [
            e.data.at for e in events if isinstance(e.data, ApprovalRequested)
        ],
        "waiting_for_clarification": [
            e.data.at for e in events if isinstance(e.data, ClarificationRequested)
        ],
        "waiting_for_budget": [e.data.at for e in events if isinstance(e.data, BudgetAwaited)],
    }
    if last is not None:
        since = waited_since.get(last.status) or [e.data.at for e in events if e.data is last]
        lines.append(
            f"now: {last.summary}"
            + (f" (since {when(since[-1])})" if last.status.startswith("waiting") else "")
        )
    elif let_go:
        lines.append(
            f"now: suspended when its runtime closed, in pass {state.pass_no} — resume it to "
            "carry on"
        )
    elif status == "interrupted":
        flight = pass_state.in_flight() if pass_state is not None else []
        lines.append("now: " + _interrupted_now(state.owner, flight))
    for e in events:
        if isinstance(e.data, PassStarted):
            sub = run_events(e.data.run)
            lines.append("")
            told = explain_run(e.data.run, sub, interrupted=e.data.run in interrupted)
            lines += ["  " + line for line in told.splitlines()]
    return "\n".join(lines)


def _timeline(events: Sequence[Event], describe: Callable[[Event], str | None]) -> list[str]:
    start = events[0].data.at
    out = []
    for event in events:
        text = describe(event)
        if text is not None:
            out.append(f"  [#{event.position} +{duration(event.data.at - start)}] {text}")
    return out


def waits(events: Sequence[Event]) -> list[tuple[str, int, int | None]]:
    """Return (what, from, until) for every wait a run went through: answers and budget."""
    out: list[tuple[str, int, int | None]] = []
    open_waits: dict[str, int] = {}
    for event in events:
        data = event.data
        if isinstance(data, StepWaiting):
            open_waits.setdefault(f"an answer for step {data.step_id!r}", data.at)
        elif isinstance(data, BudgetStopped):
            open_waits.setdefault(f"budget before wave {data.wave}", data.at)
        elif isinstance(data, RunResumed):
            for what, since in open_waits.items():
                out.append((what, since, data.at))
            open_waits.clear()
    out += [(what, since, None) for what, since in open_waits.items()]
    return out
