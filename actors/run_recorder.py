"""Recording a run: each decision is folded at once and appended at the next quiescent point.

The executor decides; the recorder keeps the run's :class:`RunFold` and the journal in step. An
event is folded into the state the moment it is staged, so the executor's next decision already
sees it; the staged events are appended together when the executor flushes — before it
dispatches any step they started, and at each step's result (R4) — and spans (T3) and progress
(E12) are derived from them only after the append: neither can hold a result out of the journal
(ADR 0070).
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import threading
import time
from collections.abc import Callable

from journaled.actors.errors import RunOwnedElsewhere
from journaled.actors.tracing import Tracing
from journaled.events.base import DomainEvent, Pending
from journaled.events.errors import ConcurrencyConflict
from journaled.events.journal import Journal
from journaled.events.plans import ExecuteResult, Observation
from journaled.events.redact import redact_data
from journaled.events.run_state import RunFold
from journaled.events.runs import implied_partitions

__all__ = ["SNAPSHOT_EVERY", "Progress", "RunRecorder", "Trace"]

log = logging.getLogger("journaled.executor")

_REPORTING = threading.local()
"""The run whose ``on_progress`` this thread is calling, if any (see :func:`reporting`)."""
REPORTING_TASK: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "journaled_reporting", default=None
)
"""The run whose ``async def`` on_progress this task (and the tasks it starts) runs for."""


def reporting() -> str | None:
    """Return the id of the run whose ``on_progress`` the caller is in (this thread, or this
    task for an async one), or None.

    The callback runs on the run's executor: a wait there for that run to end would never end.
    """
    run_id: str | None = getattr(_REPORTING, "run_id", None)
    return run_id if run_id is not None else REPORTING_TASK.get()


def refuse_close_from_progress() -> None:
    """Refuse to close a runtime from a run's ``on_progress`` (R3, A2).

    The close drains every run, that one too, and it cannot go on until on_progress returns:
    the close would wait out its whole drain and leave the run neither finished nor suspended.

    Raises:
        RuntimeError: the caller is in a run's on_progress.
    """
    reporter = reporting()
    if reporter is not None:
        raise RuntimeError(
            f"closing the runtime from run {reporter}'s on_progress would wait for that run to "
            "drain, and it cannot go on until on_progress returns: close the runtime elsewhere "
            "(R3)"
        )


def on_progress_wait(reporter: str, run_id: str, verb: str = "waits for") -> str:
    """Say why a wait from run ``reporter``'s on_progress for run ``run_id`` is refused (A2)."""
    if reporter == run_id:
        return (
            f"run {run_id}'s on_progress {verb} the run's end, and the run cannot go on until "
            "on_progress returns: wait for it elsewhere (A2)"
        )
    return (
        f"run {reporter}'s on_progress {verb} the end of run {run_id}, which waits for run "
        f"{reporter} (a run it started), and that run cannot go on until on_progress returns: "
        "wait for it elsewhere (A2)"
    )


SNAPSHOT_EVERY = 2000
"""Events between two snapshots of a long-running run."""

Progress = Callable[..., object]
"""``on_progress(at, observations_delta, calls_used, waiting)`` (E12); a callable that also has a
parameter named ``run_id`` (positional, at any place, or keyword-only), or ``**kwargs``, is given
the run's id (A2)."""
Trace = Callable[[int, ExecuteResult], None]
"""Test hook: called with (position, state) after each event is appended."""


def wants_run_id(on_progress: Progress | None) -> int | bool:
    """Tell how an ``on_progress`` callable takes the run id (A2), if it names one.

    Returns the index of a positional ``run_id`` parameter among the first five (``def
    p(run_id, at, delta, calls, waiting)`` gets it first, E12's four after it; positional-only
    too), True when it takes ``run_id`` by keyword (keyword-only, or a positional one after
    parameters of its own, which keep their defaults; or ``**kwargs``), False when it takes
    E12's four arguments alone.
    """
    if on_progress is None:
        return False
    try:
        parameters = list(inspect.signature(on_progress).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: the four arguments only
        return False
    positional = [
        p
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    for index, p in enumerate(positional):
        if p.name != "run_id":
            continue
        if index <= _E12_ARGUMENTS:  # first, among E12's four, or right after them
            return index
        if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:  # after other parameters of its
            return True  # own (with defaults): by name, not in the place of one of those
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD
        or (p.name == "run_id" and p.kind is inspect.Parameter.KEYWORD_ONLY)
        for p in parameters
    )


_E12_ARGUMENTS = 4
"""``on_progress``'s arguments besides the run id: at, observations_delta, calls_used, waiting."""


class RunRecorder:
    """Stage, fold and append one run's events; report progress after each append.

    Not thread-safe: it belongs to the run's executor and is used from its thread only.
    """

    def __init__(
        self,
        journal: Journal,
        state: RunFold,
        *,
        on_progress: Progress | None = None,
        trace: Trace | None = None,
        opened: threading.Event | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.journal = journal
        self.tracing = tracing
        """Shown each batch of events once appended, to derive spans from (T3); None: off."""
        self.state = state
        self.on_progress = on_progress
        self._progress_run_id = wants_run_id(on_progress)
        self.trace = trace
        self.opened = opened
        """Set once the run's opening events are committed (the run is readable from then)."""
        self.last_append = time.monotonic()
        """When this run last appended (monotonic seconds): heartbeats fill the silences."""
        self._staged: list[DomainEvent] = []
        self._staged_at: list[int] = []
        """When each staged event was staged (epoch nanoseconds), while tracing is on: its
        span's time, whenever the span is derived."""
        self._traced: list[ExecuteResult] = []
        self._notes: list[tuple[str, list[Observation], int, list[str]]] = []
        self._emitted = len(state.observations)
        self._snapshot_version = state.version

    def stage(self, event: DomainEvent) -> None:
        """Fold an event into the run's state now; append it at the next :meth:`flush`.

        Run data is redacted here, before it is folded, so that the live state, the journal and
        a replay all hold the same redacted values (M9, R5).
        """
        if event.has_content:
            event = event.map_content(redact_data)
        self.state.fold(event)
        self._staged.append(event)
        if self.tracing is not None:
            self._staged_at.append(time.time_ns())
        if self.trace is not None:
            self._traced.append(self.state.result())

    def note(self, at: str) -> None:
        """Queue an on_progress call for the current quiescent point (E12)."""
        if self.on_progress is None:
            return
        delta = self.state.observations[self._emitted :]
        self._emitted = len(self.state.observations)
        self._notes.append((at, list(delta), self.state.calls_used, list(self.state.waiting)))

    def flush(self, snapshot: bool = False) -> None:
        """Append the staged events in one transaction, then report progress.

        A snapshot of the run goes with the append at the end of a pass and every
        :data:`SNAPSHOT_EVERY` events, so resuming a long run reads only the events after it.
        The tracer sees the events once they are committed (ADR 0070), implied partitions too.
        """
        staged, self._staged = self._staged, []
        committed, times, self._staged_at = staged, self._staged_at, []
        implied = implied_partitions(staged)
        if implied:
            # Folded already (the executor decided with it); not stored: the starts in this
            # commit say the same (ADR 0035).
            staged = [e for i, e in enumerate(staged) if i not in implied]
            self._traced = [t for i, t in enumerate(self._traced) if i not in implied]
        if staged:
            version = self.state.version
            pending = [
                Pending(stream=self.state.run_id, version=version + i, data=e)
                for i, e in enumerate(staged, 1)
            ]
            snapshots = None
            if snapshot or version + len(staged) - self._snapshot_version >= SNAPSHOT_EVERY:
                self.state.version = version + len(staged)
                snapshots = {self.state.run_id: (self.state.version, self.state.snapshot())}
                self._snapshot_version = self.state.version
                self.state.version = version
            try:
                positions = self.journal.append(pending, snapshots=snapshots)
            except ConcurrencyConflict as exc:
                raise RunOwnedElsewhere(
                    f"run {self.state.run_id} is being executed by another process: it appended "
                    "to the run first; this executor stopped without running anything more"
                ) from exc
            self.last_append = time.monotonic()
            self.state.version = version + len(staged)
            self.state.position = positions[-1]
            if self.opened is not None and not self.opened.is_set():
                self.opened.set()  # once: the run is readable from its first append on
            if self.tracing is not None:  # in the journal now: spans may follow (ADR 0070)
                self.tracing.appended(self.state, committed, times)
            if self.trace is not None:
                traced, self._traced = self._traced, []
                for position, result in zip(positions, traced, strict=True):
                    self.trace(position, result)
        notes, self._notes = self._notes, []
        if self.on_progress is not None and notes:
            _REPORTING.run_id = self.state.run_id
            try:
                for note in notes:
                    try:
                        way = self._progress_run_id
                        if way is True:
                            self.on_progress(*note, run_id=self.state.run_id)
                        elif way is False:
                            self.on_progress(*note)
                        else:  # a positional run_id, at its place among E12's four
                            self.on_progress(*note[:way], self.state.run_id, *note[way:])
                    except BaseException:  # SystemExit too: pykka would stop every actor
                        log.exception("on_progress raised at %s; the run goes on", note[0])
            finally:
                _REPORTING.run_id = None
