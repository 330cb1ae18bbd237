"""The tracing hooks a runtime may be given: spans derived from a run's events (SPEC T3).

The actors know no tracing library. A runtime's :class:`~journaled.actors.steps.Services` holds
``tracing = None`` unless something implementing :class:`Tracing` (``journaled.otel``) was
installed; the executor tells it a run is starting (in the starting thread, whose context is the
run's parent), its recorder shows it each batch of events once the journal holds them, the step
worker runs user code inside :meth:`Tracing.step_scope` of the tracer tracing its run, and the
executor calls :meth:`Tracing.settled` when it stops. Spans are derived from the events and never
required: the journal stays the truth, nothing of a tracer runs before an append commits, and with
tracing off each hook costs one ``None`` check (ADR 0038, ADR 0070).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from journaled.events.base import DomainEvent
from journaled.events.run_state import RunFold

__all__ = ["Tracing"]


class Tracing(Protocol):
    """What the executor and the step workers tell a tracer. Called from many threads."""

    def starting(self, state: RunFold) -> None:
        """Note the context of the thread starting a pass of the run whose state this is.

        Called in that thread, before the run's first event is folded (a new run's ``state`` has
        no run id yet): the same ``state`` object is then given to :meth:`appended`.
        """

    def appended(self, state: RunFold, events: Sequence[DomainEvent], times: Sequence[int]) -> None:
        """Observe events of a run just appended, each staged at its time in ``times``
        (nanoseconds since the epoch); ``state`` has them all folded (the executor's thread).

        The journal holds them already: whatever this does, or however long it takes, it never
        holds an append up. It must not wait on a span exporter (ADR 0070).
        """

    def step_scope(self, run_id: str, step_id: str, attempt: int) -> AbstractContextManager[None]:
        """Return a context in which the step attempt's user code runs (the worker's thread)."""
        ...

    def settled(self, run_id: str) -> None:
        """End whatever the run left open: its executor stopped (the executor's thread)."""
