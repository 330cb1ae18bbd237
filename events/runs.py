"""Run events: every state change of a plan in execution, with its cause (SPEC section 2).

Events that carry run data (``has_content``) are at version 2: from then on the journal keeps
their content in a forgettable payload beside the event, so ``runs purge`` can erase it; version 1
held it inline and is upcast unchanged (ADR 0018).

A run is one stream (its run id). Its single writer is the executor actor running it; a second
process trying to execute the same run collides on the stream's next version. Events are appended
with a wave's partition and the steps it starts, at each step's result, at a budget stop, a
suspension and the end — so a crash loses at most the steps in flight, and those are known from
``step-started`` (R4).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal, Self

import msgspec
from msgspec import UNSET, UnsetType

from journaled.events.base import DomainEvent
from journaled.events.plans import Limits, Observation, Plan, map_observation, map_plan

RunStatus = Literal["completed", "failed", "waiting", "stopped_for_budget", "cancelled"]


class RunStarted(DomainEvent, frozen=True, kw_only=True, tag="run.started"):
    """A run began with its settled plan (O5): journaled before the first step runs."""

    run_id: str
    plan: Plan
    call_budget: int | None = None
    max_parallel_steps: int = 2
    limits: Limits = Limits()
    parent_run: str | None = None
    """For a sub-agent's run: the run whose agent step started it (E9)."""
    parent_step: str | None = None
    step_timeout: float | None = None
    """Seconds after which a step that has not answered fails (None: no limit)."""
    owner: str = ""
    """The process executing the run (``host/pid/start-time``)."""
    parent_call: int | None = None
    """For a child run: which ``ctx.execute`` call of the parent step started it, from 1 (R5)."""
    reserve: str | None = None
    """The ``reserve`` policy as ``module:qualname``, so a resume costs agents the same way (R6)."""
    organization: str | UnsetType | None = UNSET
    """The organization of the runtime that started it (None: none configured). Only runtimes
    of that organization see or act on the run (R1, ADR 0074); a fork keeps its source's.
    UNSET (not stored) in runs of earlier releases, which every runtime sees as before."""

    version: ClassVar[int] = 2
    has_content: ClassVar[bool] = True

    def map_content(self, f: Callable[[Any], Any]) -> Self:
        """Apply ``f`` to the plan's goal and step inputs."""
        return msgspec.structs.replace(self, plan=map_plan(self.plan, f))


class WavePartitioned(DomainEvent, frozen=True, kw_only=True, tag="run.wave-partitioned"):
    """A wave's steps were sorted into runnable and skipped/cancelled, with each reason (E4, E5).

    Stored only when it says more than the step starts appended with it (see
    :func:`implied_partitions`, ADR 0035): a wave whose runnable steps all start in the same
    commit, none skipped, is recorded by those ``step-started`` events alone.
    """

    wave: int
    """Wave number, from 1."""
    runnable: tuple[str, ...] = ()
    skipped: tuple[Observation, ...] = ()
    """Observations of the steps skipped (dependency failed) or cancelled (branch or abort)."""
    unobserved: tuple[str, ...] = ()
    """Steps skipped because the run was aborted, which record no observation (E5)."""


class StepStarted(DomainEvent, frozen=True, kw_only=True, tag="run.step-started"):
    """A step was handed to a step actor. A start with no result means it was in flight."""

    step_id: str
    attempt: int
    """1 for the first execution; a re-run after a crash or an answer counts up (at-least-once)."""
    wave: int
    """The wave it belongs to; folding it makes this the run's current wave."""


class StepSucceeded(DomainEvent, frozen=True, kw_only=True, tag="run.step-succeeded"):
    """A step finished well."""

    step_id: str
    attempt: int
    observation: Observation
    charged: int = 0
    """Model calls charged for it (E8)."""

    version: ClassVar[int] = 2
    has_content: ClassVar[bool] = True

    def map_content(self, f: Callable[[Any], Any]) -> Self:
        """Apply ``f`` to the observation's output, error, data and artifacts."""
        return msgspec.structs.replace(self, observation=map_observation(self.observation, f))


class StepFailed(DomainEvent, frozen=True, kw_only=True, tag="run.step-failed"):
    """A step failed; the observation carries the error (and a code when there is one)."""

    step_id: str
    attempt: int
    observation: Observation
    charged: int = 0
    attempts: int = 0
    """Failed attempts in all that the step's retry policy allowed (S2); 0: it had no policy,
    or the event was written before this was recorded (a trailing default: old payloads read
    as before)."""

    version: ClassVar[int] = 2
    has_content: ClassVar[bool] = True

    def map_content(self, f: Callable[[Any], Any]) -> Self:
        """Apply ``f`` to the observation's output, error, data and artifacts."""
        return msgspec.structs.replace(self, observation=map_observation(self.observation, f))


class StepRetrying(DomainEvent, frozen=True, kw_only=True, tag="run.step-retrying"):
    """A step's attempt failed and its retry policy starts it again after ``delay`` (S2).

    The step stays in flight: the next attempt's ``step-started`` follows once the delay is
    over, and a crash before that runs it again on resume. The failed attempt's observation is
    kept here, not among the run's observations: only the last attempt's result is the step's.
    """

    step_id: str
    attempt: int
    """The attempt that failed."""
    observation: Observation
    charged: int = 0
    """Model calls charged for the failed attempt (a skill's call was made, E8)."""
    delay: float = 0.0
    """Seconds until the next attempt starts."""
    attempts: int = 1
    """Failed attempts in all that the policy allows (``Retry.attempts``)."""

    version: ClassVar[int] = 2
    has_content: ClassVar[bool] = True

    def map_content(self, f: Callable[[Any], Any]) -> Self:
        """Apply ``f`` to the observation's output, error, data and artifacts."""
        return msgspec.structs.replace(self, observation=map_observation(self.observation, f))


class StepWaiting(DomainEvent, frozen=True, kw_only=True, tag="run.step-waiting"):
    """An agent step needs an answer: it stays pending and the run pauses after its wave (E10)."""

    step_id: str
    attempt: int
    question: str
    observation: Observation
    charged: int = 0

    version: ClassVar[int] = 2
    has_content: ClassVar[bool] = True

    def map_content(self, f: Callable[[Any], Any]) -> Self:
        """Apply ``f`` to the question and the observation's content."""
        return msgspec.structs.replace(
            self, question=f(self.question), observation=map_observation(self.observation, f)
        )


class StepsSkipped(DomainEvent, frozen=True, kw_only=True, tag="run.steps-skipped"):
    """Steps of the current wave that were never started because the run was cancelled (E5)."""

    observations: tuple[Observation, ...] = ()
    unobserved: tuple[str, ...] = ()
    cause: str = "cancel"


class CancelRequested(DomainEvent, frozen=True, kw_only=True, tag="run.cancel-requested"):
    """Someone asked the run to stop scheduling (E5)."""


class BudgetStopped(DomainEvent, frozen=True, kw_only=True, tag="run.budget-stopped"):
    """Execution stopped before a wave that would exceed the call budget (E7)."""

    wave: int
    estimate: int
    """Model calls the wave's runnable steps would cost."""
    used: int
    budget: int
    pending: tuple[str, ...] = ()
    """The wave's runnable steps, left pending."""


class AnswersGiven(DomainEvent, frozen=True, kw_only=True, tag="run.answers-given"):
    """Answers for waiting steps were given (E10)."""

    answers: dict[str, str]

    version: ClassVar[int] = 2
    has_content: ClassVar[bool] = True

    def map_content(self, f: Callable[[Any], Any]) -> Self:
        """Apply ``f`` to each answer (the step ids are kept)."""
        return msgspec.structs.replace(self, answers={k: f(v) for k, v in self.answers.items()})


class BudgetRaised(DomainEvent, frozen=True, kw_only=True, tag="run.budget-raised"):
    """The run's total call budget changed on resume (E14)."""

    previous: int | None
    budget: int | None


class RunResumed(DomainEvent, frozen=True, kw_only=True, tag="run.resumed"):
    """The run was taken up again; steps that were in flight will run again (E14)."""

    resumption: int
    """1 for the first resume."""
    rerun: tuple[str, ...] = ()
    """Steps that were started but never finished: they run again with the next attempt."""
    owner: str = ""
    """The process executing the run from now on."""
    took_over_from: str | None = None
    """The previous owner, found dead, when the run had not finished its pass."""
    reserve: str | None = None
    """A ``reserve`` policy given to this resume (``module:qualname``); None keeps the last (R6)."""


class RunHeartbeat(DomainEvent, frozen=True, kw_only=True, tag="run.heartbeat"):
    """The owner is alive and still executing (appended when it was quiet for a while)."""

    owner: str


class RunSuspended(DomainEvent, frozen=True, kw_only=True, tag="run.suspended"):
    """The runtime closed under the run: it stopped taking work and drained; still resumable (R3).

    Unlike ``run.finished``, a suspended run is not an end: ``resume`` carries it on, in this
    process or another, without waiting for the owner's lease (the owner let it go).
    """

    in_flight: tuple[str, ...] = ()
    """Steps whose results had not come back when the drain ended: they run again on resume."""
    drain: float = 0.0
    """Seconds the runtime waited for steps in flight."""
    cause: str = "close"
    """``close`` (``rt.close()`` or leaving ``with``) or ``exit`` (the interpreter exiting)."""


class CallsOverrun(DomainEvent, frozen=True, kw_only=True, tag="run.calls-overrun"):
    """An agent reported more model calls than its reservation; it is charged what it reported (R6).

    Appended right after the step's result, so an audit shows where a budget was overspent.
    """

    step_id: str
    attempt: int
    reserved: int
    """The reservation the budget gate approved for the step (E6)."""
    reported: int
    """The ``calls_used`` the agent reported (and was charged, E8)."""


class MemoryRead(DomainEvent, frozen=True, kw_only=True, tag="run.memory-read"):
    """The facts a step attempt read through ``ctx.memory``: ids only, once per attempt (P1).

    Staged in the same commit as the attempt's result (``step-succeeded``, ``-failed`` or
    ``-waiting``), just before it; an attempt that never reports (a crash) records no reads, and
    its re-run reads again (ADR 0033).
    """

    step_id: str
    attempt: int
    fact_ids: tuple[str, ...] = ()
    """Every distinct fact id the attempt's reads returned, in first-read order."""
    ops: tuple[str, ...] = ()
    """The distinct read operations used (``search``, ``search_semantic``, ``search_hybrid``,
    ``get``, ``all``)."""
    read_position: int | None = None
    """Where the attempt's first read began: every change of memory up to this journal
    position was folded before it, so only a later one can have been missed by it (ADR 0062).
    None in earlier releases' events: the event's own position stands in."""
    read_at: int | None = None
    """When the attempt first read (epoch ms): a fact expiring after it was valid then. None
    in earlier releases' events: ``at`` stands in."""


class RunFinished(DomainEvent, frozen=True, kw_only=True, tag="run.finished"):
    """A pass of the run ended: completed, failed, waiting, stopped for budget, or cancelled."""

    status: RunStatus
    ok: bool
    calls_used: int
    waiting: tuple[str, ...] = ()


class RunPurged(DomainEvent, frozen=True, kw_only=True, tag="run.purged"):
    """The run's content was erased from storage; its events keep their shape (R2, ADR 0018).

    Appended to the purged run and to each run or orchestration the purge reached through it.
    A purged run cannot be resumed.
    """

    reason: str
    """Why, as given (redacted like all run data)."""
    root: str
    """The run whose purge was asked for (this stream's own id, or an ancestor's)."""
    erased: int = 0
    """How many of this stream's events had their content erased."""


class CarriedStep(msgspec.Struct, frozen=True, kw_only=True):
    """A step a fork keeps from its source: succeeded there, it never runs again (F1)."""

    observation: Observation
    charged: int = 0
    """Model calls the source charged for it; they count as used in the fork."""


class RunForked(DomainEvent, frozen=True, kw_only=True, tag="run.forked"):
    """A run was forked from another at a journal position: the fork's first event (F1, F2).

    It holds all a resume needs, so the fork's state is folded from its own stream alone and the
    source is never read again (ADR 0032): ``started`` is the fork's plan (with its replacements)
    and options as a ``run.started`` would hold them, with no owner until it is resumed.
    """

    run_id: str
    source: str
    """The run forked from."""
    position: int
    """The journal position the source was read at."""
    started: RunStarted
    carried: tuple[CarriedStep, ...] = ()
    """Steps succeeded at ``position``, with their observations and charges."""
    replaced: tuple[str, ...] = ()
    """Steps whose definition was replaced."""
    repended: tuple[str, ...] = ()
    """Steps pending again because they were replaced or depend on a replaced step."""
    answers: dict[str, str] = msgspec.field(default_factory=dict)
    """Answers given with the fork to steps waiting at ``position``, and those the source held
    there for steps the fork runs again (not re-pended by a replacement)."""
    questions: dict[str, str] = msgspec.field(default_factory=dict)
    """The questions of the steps waiting at ``position``, and of those whose answer it holds."""
    budget_from: int | None = None
    """The source's call budget at ``position`` (``started.call_budget`` is the fork's)."""
    waiting: tuple[str, ...] | None = None
    """The steps the fork waits on for an answer (E10): those waiting at ``position`` that no
    replacement re-pends and no answer given with the fork answers, as the source had them.
    None in a fork stored without it: its fold takes the steps with a question, no answer and
    no replacement (ADR 0032's update of 2026-12-08)."""

    has_content: ClassVar[bool] = True

    def map_content(self, f: Callable[[Any], Any]) -> Self:
        """Apply ``f`` to the plan, the carried observations, answers and questions."""
        return msgspec.structs.replace(
            self,
            started=self.started.map_content(f),
            carried=tuple(
                msgspec.structs.replace(c, observation=map_observation(c.observation, f))
                for c in self.carried
            ),
            answers={k: f(v) for k, v in self.answers.items()},
            questions={k: f(v) for k, v in self.questions.items()},
        )


def implied_partitions(events: Sequence[DomainEvent]) -> set[int]:
    """Return the indexes of the wave partitions that the events after them make redundant.

    A :class:`WavePartitioned` with no skipped or unobserved steps is implied when the events
    after it, up to the next partition, start exactly its runnable steps in its wave: folding
    those starts gives the same state (``StepStarted`` sets the wave). One that holds a step
    back (``max_parallel_steps``, a per-key cap, a budget stop) or skips one carries
    information and is kept. ``events`` is one commit, in order (ADR 0035).
    """
    implied: set[int] = set()
    for i, event in enumerate(events):
        if not isinstance(event, WavePartitioned) or event.skipped or event.unobserved:
            continue
        started: list[str] = []
        for later in events[i + 1 :]:
            if isinstance(later, WavePartitioned):
                break
            if isinstance(later, StepStarted) and later.wave == event.wave:
                started.append(later.step_id)
        if started and started == list(event.runnable):
            implied.add(i)
    return implied


RUN_EVENTS: tuple[type[DomainEvent], ...] = (
    RunStarted,
    WavePartitioned,
    StepStarted,
    StepSucceeded,
    StepFailed,
    StepWaiting,
    StepsSkipped,
    CancelRequested,
    BudgetStopped,
    AnswersGiven,
    BudgetRaised,
    RunResumed,
    RunFinished,
    RunHeartbeat,
    RunPurged,
    RunSuspended,
    CallsOverrun,
    RunForked,
    MemoryRead,
    StepRetrying,
)

POSITIONAL_RUN_EVENTS: tuple[type[DomainEvent], ...] = (
    RunStarted,
    WavePartitioned,
    StepStarted,
    StepSucceeded,
    StepFailed,
    MemoryRead,
    RunFinished,
)
"""Run events stored as arrays of their values, not maps (ADR 0040): the ones every step writes
and the plan; their JSON, tags and topics are unchanged."""
