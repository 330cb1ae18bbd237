"""Requests the executor and the step actors exchange (never stored), and their replies.

Every message is data (SPEC A4, ADR 0024): the executor is reached by its address, a step's cancel
token stays in the process (the step worker finds it by run, step and attempt), and user code is
looked up by the step's kind and name.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from journaled.events.plans import ExecuteResult, Observation, Step


class RunMessage(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every execution message."""

    version: ClassVar[int] = 1
    """The message's schema version (see :attr:`journaled.events.messages.Message.version`)."""


class Begin(RunMessage, frozen=True, kw_only=True, tag="run.begin"):
    """Start (or resume) the run the executor was built for."""


class CancelRun(RunMessage, frozen=True, kw_only=True, tag="run.cancel"):
    """Stop scheduling: steps not yet started are skipped (E5)."""


class Drain(RunMessage, frozen=True, kw_only=True, tag="run.drain"):
    """The runtime is closing: start nothing more; suspend once no step is in flight (R3)."""

    drain: float = 0.0
    """Seconds the runtime waits for the steps in flight."""
    cause: str = "close"
    """``close`` or ``exit``: journaled with the suspension."""


class Suspend(RunMessage, frozen=True, kw_only=True, tag="run.suspend"):
    """The drain time is up: suspend now, leaving the steps still in flight to run again (R3)."""


class RunStep(RunMessage, frozen=True, kw_only=True, tag="run.run-step"):
    """Execute one step and tell the executor the outcome."""

    run_id: str
    step: Step
    attempt: int
    reservation: int | None = 0
    """Model calls reserved for an agent step (E6); None: unbounded (no call budget)."""
    answer: str | None = None
    reply_to: str
    """The executor's address: the worker tells it :class:`StepDone` there."""


class StepDone(RunMessage, frozen=True, kw_only=True, tag="run.step-done"):
    """A step actor finished a step (well or not)."""

    run_id: str
    step_id: str
    attempt: int
    observation: Observation
    question: str | None = None
    """Set when an agent asked for input (``NeedsInput``)."""
    interrupted: bool = False
    """The step could not finish because the runtime is closing (a child run was suspended):
    no result is journaled and the step runs again on resume (R3)."""
    reads: tuple[str, ...] = ()
    """Ids of the facts the attempt read through ``ctx.memory``, journaled with its result (P1)."""
    read_ops: tuple[str, ...] = ()
    """The read operations used (``search``, ``get``, ...)."""
    read_position: int | None = None
    """Where the attempt's first read began, as ``run.memory-read`` records it (ADR 0062)."""
    read_at: int | None = None
    """When the attempt first read (epoch ms)."""
    memory: bool = False
    """The attempt was offered ``ctx.memory``: a re-run that read nothing journals an empty
    read, so an earlier attempt's reads no longer stand for its result (ADR 0062)."""
    ran: bool = True
    """False: the step's placement refused it before any of its code ran (resources no node
    has, a function that cannot be sent to Ray, ...): charged nothing, not retried (R6, S1)."""


class StepDeadline(RunMessage, frozen=True, kw_only=True, tag="run.step-deadline"):
    """A step's timeout passed; if that attempt is still running, it fails."""

    step_id: str
    attempt: int


class StepRetryDue(RunMessage, frozen=True, kw_only=True, tag="run.step-retry-due"):
    """A failed attempt's backoff is over: start the step's next attempt (S2)."""

    step_id: str
    attempt: int
    """The attempt that failed."""


class Heartbeat(RunMessage, frozen=True, kw_only=True, tag="run.heartbeat-tick"):
    """Time to show the run's owner is alive, if it appended nothing for a while."""


class RunEnded(RunMessage, frozen=True, kw_only=True, tag="run.ended"):
    """An executor stopped: the run's result at this stop (finished, waiting, suspended, ...)."""

    correlation: str
    result: ExecuteResult
