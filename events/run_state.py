"""The run projection: a plan in execution folded from its events (E13, E14, O7).

The executor applies each event it decides to a :class:`RunFold` before appending it, resume folds
the stream from the journal, and time travel folds a prefix of it: one code path for all three.
Folding reads no clock and calls no user code.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from journaled.events.base import DomainEvent, Event
from journaled.events.compressed import deflate, inflate
from journaled.events.plans import ExecuteResult, Observation, Plan, Step, StepStatus
from journaled.events.runs import (
    AnswersGiven,
    BudgetRaised,
    BudgetStopped,
    CallsOverrun,
    CancelRequested,
    MemoryRead,
    RunFinished,
    RunForked,
    RunHeartbeat,
    RunPurged,
    RunResumed,
    RunStarted,
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

SNAPSHOT_SCHEMA = 2
"""Bump when :class:`RunSnapshot` changes incompatibly: older snapshots are then ignored.

2: ``retried`` (a snapshot of schema 1 has no such count, and reading it as empty would give
its steps their whole retry budget again; it is rebuilt from the journal instead)."""


class RunSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A run's folded state at one version of its stream: a cache, rebuilt from events if lost."""

    schema: int = SNAPSHOT_SCHEMA
    version: int
    started: RunStarted
    status: dict[str, StepStatus]
    observations: list[Observation]
    calls_used: int
    budget: int | None
    waiting: list[str]
    questions: dict[str, str]
    answers: dict[str, str]
    attempts: dict[str, int]
    stopped_for_budget: bool
    budget_stop: BudgetStopped | None
    cancel_requested: bool
    finished: RunFinished | None
    resumptions: int
    wave: int
    last_at: int
    failures: dict[str, str]
    cancelled: list[str]
    owner: str = ""
    suspended: RunSuspended | None = None
    reserve: str | None = None
    forked: RunForked | None = None
    retried: dict[str, int] = {}
    """Each step's failed attempts journaled ``run.step-retrying`` (S2)."""


_SNAPSHOT_ENCODER = msgspec.msgpack.Encoder()
_SNAPSHOT_DECODER = msgspec.msgpack.Decoder(RunSnapshot)


def decode_snapshot(encoded: bytes) -> RunSnapshot:
    """Decode a stored run snapshot, deflated (ADR 0040) or, from an earlier release, not.

    Raises:
        msgspec.DecodeError: the bytes are not a snapshot (corrupt, truncated or blanked).
        msgspec.ValidationError: the snapshot does not have :class:`RunSnapshot`'s shape.
    """
    return _SNAPSHOT_DECODER.decode(inflate(encoded))


class RunFold:
    """Everything known about one run at one position of its stream."""

    _bulk = False
    """Inside :meth:`apply_all`: statuses go to the table only."""

    def __init__(self) -> None:
        self.run_id = ""
        self.started: RunStarted | None = None
        self.order: list[str] = []
        self.steps: dict[str, Step] = {}
        self.status: dict[str, StepStatus] = {}
        self.observations: list[Observation] = []
        self.calls_used = 0
        self.budget: int | None = None
        self.waiting: list[str] = []
        self.questions: dict[str, str] = {}
        self.answers: dict[str, str] = {}
        self.attempts: dict[str, int] = {}
        """Each step's last attempt number (its ``step-started`` count, crashes included)."""
        self.retried: dict[str, int] = {}
        """Each step's failed attempts that its retry policy ran again (``step-retrying``): the
        retry budget counts failures, not starts, so an attempt a crash cut short is free (S2)."""
        self.stopped_for_budget = False
        self.budget_stop: BudgetStopped | None = None
        self.cancel_requested = False
        self.finished: RunFinished | None = None
        self.resumptions = 0
        self.wave = 0
        self.version = 0
        self.position = 0
        self.last_at = 0
        self.failures: dict[str, str] = {}
        self.cancelled: set[str] = set()
        """Steps whose observation says ``cancelled`` (their dependents are cancelled too, E4)."""
        self.owner = ""
        self.purged: RunPurged | None = None
        """Set once the run's content was erased: it cannot be resumed (ADR 0018)."""
        self.suspended: RunSuspended | None = None
        """Set while the run is suspended by a closing runtime (R3); a resume clears it."""
        self.reserve: str | None = None
        """The reserve policy the run was last executed with, as ``module:qualname`` (R6)."""
        self.forked: RunForked | None = None
        """For a fork: its first event, naming the source, the position and the changes (F2)."""
        self._index: dict[str, int] = {}
        """Step id -> its place in ``order``."""
        self._plan: list[Step] = []
        """The plan's steps with their current statuses, kept as each status is set, so that
        :meth:`plan` and :meth:`result` copy one list instead of rebuilding every step (T1)."""
        self._unsettled = 0
        """How many steps of the plan have not succeeded (E13's ``ok`` without a scan)."""
        self._variants: dict[tuple[str, StepStatus], Step] = {}
        """(step id, status) -> that step with that status, made once: runs revisit statuses."""

    @property
    def is_finished(self) -> bool:
        """Tell whether the run's last pass ended (a resumed run is not finished)."""
        return self.finished is not None

    @property
    def run_status(self) -> RunStatus | None:
        """Return how the last pass ended, or None while it runs."""
        return self.finished.status if self.finished is not None else None

    def apply_all(self, events: Sequence[Event]) -> None:
        """Fold many events of this run's stream, oldest first, as :meth:`apply` one by one.

        Statuses go to the table only and the kept plan is made once at the end: a fold from
        the start sets each step's status two or three times, and a plan step with a status is
        a new struct each time (half a cold ``runs.at``'s fold).
        """
        if not events:
            return
        self._bulk = True
        try:
            for event in events:
                self.fold(event.data)
        finally:
            self._bulk = False
        # Only after a whole fold: one cut short (an interrupt between two of a start's fields)
        # leaves a state no plan can be made of, and its error must not hide the first.
        if self.started is not None:
            self._rebuild_plan()
        self.version = events[-1].version
        self.position = events[-1].position

    def apply(self, event: Event) -> None:
        """Fold one event of this run's stream."""
        self.version = event.version
        self.position = event.position
        self.fold(event.data)

    def fold(self, data: DomainEvent) -> None:
        """Fold one run event (without journal coordinates)."""
        self.last_at = data.at
        # The cases are tried in order: a run's own two of every step come first.
        match data:
            case StepStarted():
                # A start names its wave: a commit may hold the starts without their partition
                # when the partition said nothing more (ADR 0035).
                self.wave = data.wave
                self._set(data.step_id, "running")
                self.attempts[data.step_id] = data.attempt
            case StepSucceeded():
                self.calls_used += data.charged
                self._observe(data.observation, "succeeded")
            case RunStarted():
                self.owner = data.owner
                self.reserve = data.reserve
                self.run_id = data.run_id
                self.started = data
                self.budget = data.call_budget
                self.order = [s.id for s in data.plan.steps]
                self.steps = {s.id: s for s in data.plan.steps}
                self.status = dict.fromkeys(self.order, "pending")
                self._index = {step_id: n for n, step_id in enumerate(self.order)}
                self._variants = {}
                if not self._bulk:  # apply_all makes the plan once, at its end
                    self._plan = [self._variant(i, "pending") for i in self.order]
                self._unsettled = len(self.order)
            case RunForked():
                self.fold(data.started)
                self.forked = data
                for carried in data.carried:
                    self.calls_used += carried.charged
                    self._observe(carried.observation, "succeeded")
                self.answers.update(data.answers)
                self.questions.update(data.questions)
                # Waiting as the source was at the position, so an answer is taken (E10, F1).
                waiting = data.waiting if data.waiting is not None else forked_waiting(data)
                self.waiting = list(waiting)
            case WavePartitioned():
                self.wave = data.wave
                for obs in data.skipped:
                    self._observe(obs, "skipped")
                for step_id in data.unobserved:
                    self._set(step_id, "skipped")
            case StepFailed():
                self.calls_used += data.charged
                self._observe(data.observation, "failed")
                self.failures[data.step_id] = data.observation.error or "failed"
            case StepRetrying():
                # The step stays running: its next attempt follows, or a resume re-runs it.
                self.calls_used += data.charged
                self.retried[data.step_id] = self.retried.get(data.step_id, 0) + 1
            case StepWaiting():
                self.calls_used += data.charged
                self._observe(data.observation, "pending")
                if data.step_id not in self.waiting:
                    self.waiting.append(data.step_id)
                self.questions[data.step_id] = data.question
            case StepsSkipped():
                for obs in data.observations:
                    self._observe(obs, "skipped")
                for step_id in data.unobserved:
                    self._set(step_id, "skipped")
                if self.waiting:  # a step that asked once its run was cancelled (E5)
                    skipped = {o.step_id for o in data.observations} | set(data.unobserved)
                    self.waiting = [i for i in self.waiting if i not in skipped]
            case CancelRequested():
                self.cancel_requested = True
            case BudgetStopped():
                self.stopped_for_budget = True
                self.budget_stop = data
            case AnswersGiven():
                self.answers.update(data.answers)
            case BudgetRaised():
                self.budget = data.budget
            case RunResumed():
                self.owner = data.owner
                self.resumptions = data.resumption
                self.stopped_for_budget = False
                self.waiting = []
                self.finished = None
                self.suspended = None
                if data.reserve is not None:
                    self.reserve = data.reserve
                for step_id in data.rerun:
                    self._set(step_id, "pending")
            case RunFinished():
                self.finished = data
            case RunPurged():
                self.purged = data
            case RunSuspended():
                self.suspended = data
            case RunHeartbeat() | CallsOverrun() | MemoryRead():
                pass  # liveness (last_at is set above), an audit note by a charge, provenance
            case _:
                raise TypeError(f"a run cannot fold {type(data).__qualname__}")

    def _set(self, step_id: str, status: StepStatus) -> None:
        """Set one step's status, in the table and in the kept plan."""
        self.status[step_id] = status
        if self._bulk:
            return
        n = self._index.get(step_id)
        if n is None:
            return  # not a step of the plan: plan() never showed it either
        before = self._plan[n].status
        if before != status:
            self._unsettled += (before == "succeeded") - (status == "succeeded")
            self._plan[n] = self._variant(step_id, status)

    def _variant(self, step_id: str, status: StepStatus) -> Step:
        """Return the plan's step ``step_id`` with ``status``, made once per pair."""
        key = (step_id, status)
        step = self._variants.get(key)
        if step is None:
            step = self.steps[step_id]
            if step.status != status:
                step = msgspec.structs.replace(step, status=status)
            self._variants[key] = step
        return step

    def _rebuild_plan(self) -> None:
        """Make the kept plan agree with ``status`` after the table was set whole (a restore)."""
        self._plan = [self._variant(i, self.status[i]) for i in self.order]
        self._unsettled = sum(1 for s in self._plan if s.status != "succeeded")

    def _observe(self, obs: Observation, status: StepStatus) -> None:
        self._set(obs.step_id, status)
        self.observations.append(obs)
        if obs.code == "cancelled":
            self.cancelled.add(obs.step_id)

    def snapshot(self) -> bytes:
        """Encode this state as a :class:`RunSnapshot` at its current version, deflated."""
        assert self.started is not None
        return deflate(self._snapshot_bytes())

    def _snapshot_bytes(self) -> bytes:
        assert self.started is not None
        return _SNAPSHOT_ENCODER.encode(
            RunSnapshot(
                version=self.version,
                started=self.started,
                status=self.status,
                observations=self.observations,
                calls_used=self.calls_used,
                budget=self.budget,
                waiting=self.waiting,
                questions=self.questions,
                answers=self.answers,
                attempts=self.attempts,
                stopped_for_budget=self.stopped_for_budget,
                budget_stop=self.budget_stop,
                cancel_requested=self.cancel_requested,
                finished=self.finished,
                resumptions=self.resumptions,
                wave=self.wave,
                last_at=self.last_at,
                failures=self.failures,
                cancelled=sorted(self.cancelled),
                owner=self.owner,
                suspended=self.suspended,
                reserve=self.reserve,
                forked=self.forked,
                retried=self.retried,
            )
        )

    @classmethod
    def restore(cls, encoded: bytes) -> RunFold | None:
        """Rebuild a state from a snapshot; None if it is unreadable or of another schema."""
        try:
            snap = decode_snapshot(encoded)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        if snap.schema != SNAPSHOT_SCHEMA:
            return None
        state = cls()
        state.fold(snap.started)
        state.version = snap.version
        state.status = dict(snap.status)
        state.observations = list(snap.observations)
        state.calls_used = snap.calls_used
        state.budget = snap.budget
        state.waiting = list(snap.waiting)
        state.questions = dict(snap.questions)
        state.answers = dict(snap.answers)
        state.attempts = dict(snap.attempts)
        state.stopped_for_budget = snap.stopped_for_budget
        state.budget_stop = snap.budget_stop
        state.cancel_requested = snap.cancel_requested
        state.finished = snap.finished
        state.resumptions = snap.resumptions
        state.wave = snap.wave
        state.last_at = snap.last_at
        state.failures = dict(snap.failures)
        state.cancelled = set(snap.cancelled)
        state.owner = snap.owner
        state.suspended = snap.suspended
        state.reserve = snap.reserve
        state.forked = snap.forked
        state.retried = dict(snap.retried)
        state._rebuild_plan()
        return state

    def plan(self) -> Plan:
        """Return the plan with each step's current status."""
        assert self.started is not None
        return Plan(goal=self.started.plan.goal, steps=list(self._plan), id=self.started.plan.id)

    def in_flight(self) -> list[str]:
        """Return the steps started but not finished (running when the process stopped)."""
        return [i for i in self.order if self.status[i] == "running"]

    def result(self) -> ExecuteResult:
        """Return the run as an :class:`ExecuteResult` (E13)."""
        ok = not self.stopped_for_budget and not self.waiting and self._unsettled == 0
        return ExecuteResult(
            run_id=self.run_id,
            ok=ok,
            plan=self.plan(),
            observations=list(self.observations),
            calls_used=self.calls_used,
            stopped_for_budget=self.stopped_for_budget,
            waiting=list(self.waiting),
            suspended=self.suspended is not None,
        )


def forked_waiting(forked: RunForked) -> list[str]:
    """Return the steps a fork stored without ``waiting`` waits on (E10, ADR 0032's update).

    Its questions are those of the steps waiting at its position and of the steps whose answer
    it holds: the ones with no answer and no replacement were waiting there, unanswered.
    """
    plan = [s.id for s in forked.started.plan.steps]
    return [
        i
        for i in plan
        if i in forked.questions and i not in forked.answers and i not in forked.repended
    ]


def fold_run(events: list[Event]) -> RunFold:
    """Fold a run's events (oldest first) into its state."""
    state = RunFold()
    state.apply_all(events)
    return state
