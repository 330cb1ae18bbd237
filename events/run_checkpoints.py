"""Checkpoints of runs for time travel: a past state is a checkpoint plus a short tail (T1).

A :class:`RunTimeline` folds a run's stream forward once, keeping the decoded events and, every
``every`` events, a :class:`Checkpoint`: the plan's steps then (every ``KEYFRAME``-th checkpoint
holds the whole list of pointers to shared, memoised :class:`Step` objects, the others only the
places that changed since the checkpoint before), how many observations there were
(observations only grow, so a count stands for the list), and a copy of the small fields. The
state at a position is the nearest checkpoint at or before it plus at most ``every - 1`` events
folded by the ordinary :meth:`RunFold.fold`, so time travel and replay share one fold (ADR 0034).

:class:`RunCheckpoints` holds timelines for many runs, least recently used first out, within a
bound on what it holds. It is a cache: the journal stays the truth. It is told of new events
by a reader it is given, and when those include a ``run.purged`` it throws away everything it
had of that run (the erased content was in its events) and folds the run again.

Nothing here reads the journal, a clock or user code; the class is not thread-safe (the caller
serialises calls).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from journaled.events.base import Event
from journaled.events.plans import ExecuteResult, Step, StepStatus
from journaled.events.run_state import RunFold
from journaled.events.runs import RunPurged

__all__ = [
    "DEFAULT_BUDGET",
    "DEFAULT_EVERY",
    "KEYFRAME",
    "Checkpoint",
    "Reader",
    "RunCheckpoints",
    "RunTimeline",
    "fold_at",
]

DEFAULT_EVERY = 32
"""Events between two checkpoints of a run: a past state folds at most 31 events."""
KEYFRAME = 16
"""Every this many checkpoints, one holds the whole plan; the others hold what changed."""
DEFAULT_BUDGET = 60_000
"""What the cache of a runtime holds at most, in units (see :attr:`RunTimeline.weight`)."""
POINTERS_PER_UNIT = 64
"""A decoded event held costs one unit; so do 64 step pointers of a checkpoint (a changed place
counts as 4: its tuple and its slot). Measured on a 10,000-step chain: about 1 KB a unit."""

_SHARED = frozenset({"started", "order", "steps", "_index", "_variants", "run_id"})
"""State fields set by the first event alone: shared by every checkpoint, never copied."""
_REBUILT = frozenset(
    {"status", "observations", "_plan", "attempts", "retried", "failures", "cancelled"}
)
"""Fields a checkpoint keeps otherwise (plan, observation count) or not at all: a state
rebuilt from it is exact for :meth:`RunFold.result`, which reads none of the last four."""


@dataclass(frozen=True)
class Checkpoint:
    """A run's state after its first ``count`` events, as cheap to keep as it can be."""

    count: int
    """Events of the run folded into it."""
    plan: list[Step] | None
    """The plan's steps with their statuses then (shared objects); None but at a keyframe."""
    changes: list[tuple[int, Step]]
    """The places of the plan that changed since the checkpoint before, and their new steps."""
    observed: int
    """How many observations the run had then: a prefix of the run's (they only grow)."""
    fields: dict[str, Any] = field(repr=False)
    """Every other field of the state, containers copied."""


class _Statuses(dict[str, StepStatus]):
    """A status table holding only what a tail set; reads fall back to the kept plan's step."""

    def __init__(self, state: RunFold, index: dict[str, int]) -> None:
        super().__init__()
        self._state = state
        self._index = index

    def __missing__(self, key: str) -> StepStatus:
        return self._state._plan[self._index[key]].status


class _Noted(dict[str, StepStatus]):
    """The head's status table, noting which steps were set since the last checkpoint."""

    def __init__(self, table: dict[str, StepStatus]) -> None:
        super().__init__(table)
        self.noted: set[str] = set(table)

    def __setitem__(self, key: str, value: StepStatus) -> None:
        self.noted.add(key)
        super().__setitem__(key, value)


class RunTimeline:
    """One run's events, folded forward once, with a checkpoint every ``every`` events."""

    def __init__(self, every: int = DEFAULT_EVERY) -> None:
        if every < 1:
            raise ValueError(f"every must be at least 1 event, got {every}")
        self.every = every
        self.head = RunFold()
        """The state after the last event held."""
        self.events: list[Event] = []
        self.positions: list[int] = []
        self.checkpoints: list[Checkpoint] = []
        self._pointers = 0
        """Step pointers the checkpoints hold (a changed place counts 4)."""
        self._last: list[Step] = []
        """The plan at the last checkpoint, to find what changed since."""
        self.pending: list[Event] = []
        """Events held but not folded yet: a first (cold) call's prefix, folded into checkpoints
        by the next :meth:`extend`."""

    @property
    def version(self) -> int:
        """Return the stream version of the last event held (0 when none)."""
        return self.pending[-1].version if self.pending else self.head.version

    @property
    def weight(self) -> int:
        """Return what this timeline holds in units: its events plus its checkpoints' pointers."""
        return len(self.events) + len(self.pending) + self._pointers // POINTERS_PER_UNIT

    def first(self) -> Event | None:
        """Return the run's first event held, or None when none is."""
        held = self.events or self.pending
        return held[0] if held else None

    def hold(self, events: Sequence[Event]) -> None:
        """Keep the run's next events without folding them until the next :meth:`extend`.

        A first call pays for reading and one plain fold only; the checkpoints, which cost more
        than the fold, are built by a second call, which shows the run is being explored.
        """
        self.pending.extend(events)

    def extend(self, events: Sequence[Event]) -> None:
        """Fold the run's next events (oldest first), checkpointing every ``every`` of them."""
        if self.pending:
            events, self.pending = [*self.pending, *events], []
        head = self.head
        for event in events:
            head.apply(event)
            if type(head.status) is not _Noted:  # the first event sets the table whole
                head.status = _Noted(head.status)
            self.events.append(event)
            self.positions.append(event.position)
            if (len(self.events) - 1) % self.every == 0:
                self.checkpoints.append(self._capture())

    def _capture(self) -> Checkpoint:
        head = self.head
        fields = {
            name: _copied(value) if name not in _SHARED else value
            for name, value in vars(head).items()
            if name not in _REBUILT
        }
        now = head._plan
        assert isinstance(head.status, _Noted)
        noted, head.status.noted = head.status.noted, set()
        if len(self.checkpoints) % KEYFRAME == 0 or len(now) != len(self._last):
            self._last = list(now)
            plan: list[Step] | None = list(now)
            changes: list[tuple[int, Step]] = []
        else:
            index = head._index
            places = sorted(index[i] for i in noted if i in index)
            changes = [(n, now[n]) for n in places if now[n] is not self._last[n]]
            for n, step in changes:
                self._last[n] = step
            plan = None
        self._pointers += len(plan or ()) + 4 * len(changes)
        return Checkpoint(
            count=len(self.events),
            plan=plan,
            changes=changes,
            observed=len(head.observations),
            fields=fields,
        )

    def result_at(self, position: int) -> ExecuteResult | None:
        """Return the run as it was at a journal position; None before its first event."""
        return self.results_at([position])[0]

    def results_at(self, positions: Sequence[int]) -> list[ExecuteResult | None]:
        """Return the run at each position (None before its first event).

        A position a little after the one before it carries on from that state rather than
        from a checkpoint, when that folds fewer events (a diff's second state).
        """
        if self.pending:
            self.extend(())
        out: list[ExecuteResult | None] = []
        state: RunFold | None = None
        done = 0
        for position in positions:
            held = bisect_right(self.positions, position)
            if held == 0:
                out.append(None)
                continue
            if held == len(self.events):
                out.append(self.head.result())
                continue
            number = (held - 1) // self.every
            if state is None or held < done or done < self.checkpoints[number].count:
                state = self._restore(number)
                done = self.checkpoints[number].count
            for event in self.events[done:held]:
                state.apply(event)
            done = held
            out.append(state.result())  # copies what it returns: folding on is safe
        return out

    def _restore(self, number: int) -> RunFold:
        """Rebuild the state at a checkpoint, exact for what :meth:`RunFold.result` reads."""
        checkpoint = self.checkpoints[number]
        key = number
        while self.checkpoints[key].plan is None:
            key -= 1
        plan = list(self.checkpoints[key].plan or ())
        for later in self.checkpoints[key + 1 : number + 1]:
            for n, step in later.changes:
                plan[n] = step
        state = RunFold.__new__(RunFold)
        vars(state).update(
            {
                name: _copied(value) if name not in _SHARED else value
                for name, value in checkpoint.fields.items()
            }
        )
        state._plan = plan
        state.status = _Statuses(state, self.head._index)
        state.observations = self.head.observations[: checkpoint.observed]
        state.attempts = {}
        state.retried = {}
        state.failures = {}
        state.cancelled = set()
        return state


def fold_at(events: Sequence[Event], positions: Sequence[int]) -> list[ExecuteResult | None]:
    """Return a run at each position by one plain fold of its events (None before the first).

    The fold goes forward from one position to the next, and starts again only when a position
    lies before the one before it.
    """
    out: list[ExecuteResult | None] = []
    state = RunFold()
    done = 0
    for position in positions:
        held = bisect_right(events, position, key=_position)
        if held == 0:
            out.append(None)
            continue
        if held < done:
            state, done = RunFold(), 0
        state.apply_all(events[done:held])
        done = held
        out.append(state.result())
    return out


def _position(event: Event) -> int:
    return event.position


def _copied(value: Any) -> Any:
    if isinstance(value, list | dict | set):
        return value.copy()
    return value


Reader = Callable[[str, int, int | None], list[Event]]
"""``read(run_id, after_version, upto)``: the run's events after that version, up to a journal
position (None: all), oldest first."""


class RunCheckpoints:
    """Timelines of the runs time travel visited, least recently used dropped past a bound.

    Args:
        every: Events between two checkpoints of a run.
        budget: Units held at most over all runs (an event is one unit; see
            :attr:`RunTimeline.weight`). The run just used is kept even when it alone is
            heavier, until another run is used.
    """

    def __init__(self, every: int = DEFAULT_EVERY, budget: int = DEFAULT_BUDGET) -> None:
        if budget < 0:
            raise ValueError(f"budget must be >= 0 units, got {budget}")
        RunTimeline(every)  # checks ``every``
        self.every = every
        self.budget = budget
        self._timelines: dict[str, RunTimeline] = {}
        """run id -> timeline, least recently used first."""
        self._weights: dict[str, int] = {}
        self.held = 0
        """Units held now over all runs."""

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._timelines

    def runs(self) -> list[str]:
        """Return the runs held, least recently used first."""
        return list(self._timelines)

    def result_at(self, run_id: str, position: int, read: Reader) -> ExecuteResult | None:
        """Return a run as it was at a journal position; None before its first event."""
        return self.results_at(run_id, [position], read)[0]

    def results_at(
        self, run_id: str, positions: Sequence[int], read: Reader
    ) -> list[ExecuteResult | None]:
        """Return a run as it was at each journal position (None before its first event).

        The first call for a run reads its stream up to its last position only and folds it
        plainly, holding the events read; the next call builds the run's checkpoints from them.
        Each later call reads the events after those held, to the stream's end. When those
        include a ``run.purged`` (appended after everything it erased), all that was held of the
        run is dropped and its stream read again: what is served never holds content the
        journal no longer has.
        """
        timeline = self._take(run_id)
        if timeline is None:
            return self.first_results(run_id, read(run_id, 0, max(positions)), positions)
        new = read(run_id, timeline.version, None)
        if timeline.first() is not None and any(isinstance(e.data, RunPurged) for e in new):
            timeline = RunTimeline(self.every)
            new = read(run_id, 0, None)
        timeline.extend(new)
        self._put(run_id, timeline)
        return timeline.results_at(positions)

    def first_results(
        self, run_id: str, prefix: Sequence[Event], positions: Sequence[int]
    ) -> list[ExecuteResult | None]:
        """Return a run not held yet at each position, from its stream read up to the last one.

        The prefix is folded plainly and kept: the run's next call folds it into checkpoints
        (which cost more than the fold) and reads only what follows it.
        """
        timeline = self._take(run_id) or RunTimeline(self.every)
        if timeline.first() is None:
            timeline.hold(prefix)
        self._put(run_id, timeline)
        return fold_at(prefix, positions)

    def first(self, run_id: str) -> Event | None:
        """Return a held run's first event, or None when nothing of it is held."""
        timeline = self._timelines.get(run_id)
        return timeline.first() if timeline is not None else None

    def drop(self, run_id: str) -> bool:
        """Forget what is held of a run; tell whether anything was."""
        return self._take(run_id) is not None

    def clear(self) -> None:
        """Forget every run."""
        self._timelines.clear()
        self._weights.clear()
        self.held = 0

    def _take(self, run_id: str) -> RunTimeline | None:
        timeline = self._timelines.pop(run_id, None)
        self.held -= self._weights.pop(run_id, 0)
        return timeline

    def _put(self, run_id: str, timeline: RunTimeline) -> None:
        weight = timeline.weight
        self._timelines[run_id] = timeline
        self._weights[run_id] = weight
        self.held += weight
        for oldest in list(self._timelines):
            if self.held <= self.budget or oldest == run_id:
                break
            self._take(oldest)
