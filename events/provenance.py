"""Provenance: which steps read which facts, and which of those reads went stale (P2, P3).

Pure projections of the journal: a step's reads are its ``run.memory-read`` events (ADR 0033) and
a fact's changes are its own stream's events, so a process that never saw the reads answers the
same as the one that ran them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal

import msgspec

from journaled.events.base import Event
from journaled.events.codec import tag_of, topics_of
from journaled.events.journal import Journal
from journaled.events.memory import (
    FactDeleted,
    FactPurged,
    FactRelinked,
    FactRemembered,
    FactRestored,
    FactSuperseded,
)
from journaled.events.runs import MemoryRead, RunForked

Change = Literal["superseded", "deleted", "purged", "expired"]


class Use(msgspec.Struct, frozen=True, kw_only=True):
    """A step that read a fact (P2)."""

    run_id: str
    step_id: str
    position: int
    """Journal position of the ``run.memory-read`` event that recorded the read."""
    carried_from: str | None = None
    """For a fork's step that kept its source's output (F1): the run whose read that output
    rests on (the read is that run's event). None for a read the step made itself."""


class Stale(msgspec.Struct, frozen=True, kw_only=True):
    """A step whose read fact changed after it was read (P3)."""

    run_id: str
    step_id: str
    fact_id: str
    change: Change
    """``superseded``, ``deleted``, ``purged`` or ``expired``."""
    position: int
    """Journal position of the read that went stale (its ``run.memory-read`` event)."""
    replacement: str | None = None
    """The fact that superseded the one read, when there is one."""


def read_events(journal: Journal) -> list[Event]:
    """Return every ``run.memory-read`` event of the journal, in order (others are not decoded)."""
    return list(journal.read(topics=topics_of(MemoryRead)))


def uses(fact_id: str, reads: Iterable[Event]) -> list[Use]:
    """Return the steps whose recorded reads include ``fact_id``, in journal order (P2)."""
    found: list[Use] = []
    for event in reads:
        data = event.data
        if isinstance(data, MemoryRead) and fact_id in data.fact_ids:
            found.append(Use(run_id=event.stream, step_id=data.step_id, position=event.position))
    return found


def fact_uses(fact_id: str, journal: Journal) -> list[Use]:
    """Return every step that read ``fact_id``, forks' kept steps included, in journal order (P2).

    A fork's step that kept its source's output (F1) never runs again: it rests on the reads its
    source recorded, so it is listed at that read's position, with ``carried_from`` naming the
    run that read. At one position the step that read comes first, then the forks, by run id.
    """
    reads = read_events(journal)
    found = uses(fact_id, reads)
    for fork, event, source in forks_reads(journal, reads):
        data = event.data
        if isinstance(data, MemoryRead) and fact_id in data.fact_ids:
            found.append(
                Use(run_id=fork, step_id=data.step_id, position=event.position, carried_from=source)
            )
    found.sort(key=lambda u: (u.position, u.carried_from is not None, u.run_id))
    return found


def forks_reads(journal: Journal, reads: Sequence[Event]) -> list[tuple[str, Event, str]]:
    """Return ``(fork, read, run that read)`` for every read a fork's kept steps rest on.

    ``reads`` are every ``run.memory-read`` event of the journal (:func:`read_events`): the
    sources' reads are looked up there, not read again.
    """
    by_run: dict[str, list[Event]] = {}
    for event in reads:
        by_run.setdefault(event.stream, []).append(event)

    def recorded(run_id: str, upto: int) -> list[Event]:
        return [e for e in by_run.get(run_id, ()) if e.position <= upto]

    found: list[tuple[str, Event, str]] = []
    for fork in journal.read(topics=topics_of(RunForked)):
        if isinstance(fork.data, RunForked):
            for event, source in carried_reads(journal, fork.data, {fork.stream}, recorded):
                found.append((fork.stream, event, source))
    return found


_FORKED = tag_of(RunForked)
"""The tag a fork's stream starts with."""


def carried_reads(
    journal: Journal,
    forked: RunForked,
    seen: set[str],
    recorded: Callable[[str, int], list[Event]],
) -> list[tuple[Event, str]]:
    """Return the reads behind the steps a fork carried, each with the run that made it
    (P2, P3, ADR 0062).

    A carried step never runs again in the fork (F1): its output rests on the reads its source
    recorded up to the fork's position (``recorded(source, position)``), and on those of the
    source's source for a step it carried in turn. ``seen`` holds the runs already walked.
    """
    carried = {c.observation.step_id for c in forked.carried}
    if not carried or forked.source in seen:
        return []
    found = [
        (e, forked.source)
        for e in recorded(forked.source, forked.position)
        if isinstance(e.data, MemoryRead) and e.data.step_id in carried
    ]
    head = journal.head(forked.source)  # a fork of a fork: its plan is decoded only then
    if head is not None and head[1] == _FORKED:
        source = journal.first(forked.source)
        if source is not None and isinstance(source.data, RunForked):
            further = carried_reads(journal, source.data, seen | {forked.source}, recorded)
            found += [
                (e, by)
                for e, by in further
                if isinstance(e.data, MemoryRead) and e.data.step_id in carried
            ]
    return found


def latest_reads(reads: Iterable[Event]) -> list[Event]:
    """Keep, per (run, step), the reads of its latest recorded attempt: earlier ones were redone."""
    last: dict[tuple[str, str], Event] = {}
    for event in reads:
        data = event.data
        if not isinstance(data, MemoryRead):
            continue
        key = (event.stream, data.step_id)
        held = last.get(key)
        if held is None or data.attempt >= held.data.attempt:  # type: ignore[attr-defined]
            last[key] = event
    return sorted(last.values(), key=lambda e: e.position)


def fact_change(
    history: Sequence[Event],
    now: int,
    lapsed: Callable[[str], bool] = lambda _: False,
) -> tuple[Change, int, str | None] | None:
    """Return how a fact stands changed now — (change, since position, replacement) — or None.

    ``since`` is the position from which the change holds (for expiry: the first epoch ms at which
    search no longer returns the fact, ``valid_until + 1``, since M5 keeps it while
    ``valid_until >= now``).
    Purged outranks deleted, deleted outranks superseded; an expired fact that is otherwise
    active is ``expired``. A fact whose superseder has lapsed (``lapsed(superseder)``: it expired)
    is visible again (M5), so it is not superseded.
    """
    superseded: tuple[int, str] | None = None
    deleted: int | None = None
    purged: int | None = None
    valid_until: int | None = None
    for event in history:
        data = event.data
        match data:
            case FactRemembered():
                valid_until = data.valid_until
            case FactSuperseded():
                superseded = (event.position, data.by)
            case FactRelinked():
                superseded = (event.position, data.to)
            case FactRestored():
                superseded = None
            case FactDeleted():
                deleted = event.position
            case FactPurged():
                purged = event.position
    if purged is not None:
        return "purged", purged, None
    if deleted is not None:
        return "deleted", deleted, None
    if superseded is not None and not lapsed(superseded[1]):
        return "superseded", superseded[0], superseded[1]
    if valid_until is not None and valid_until < now:  # as search judges it (M5)
        return "expired", valid_until + 1, None
    return None


def stale_reads(
    reads: Iterable[Event],
    history: Callable[[str], Sequence[Event]],
    now: int,
    hidden: Callable[[str], bool] = lambda _: False,
    origin: Mapping[int, str] | None = None,
) -> list[Stale]:
    """Return the reads whose fact changed after the read: superseded, deleted, purged, expired.

    Only each step's latest recorded attempt counts. A change counts when it comes after the
    position where the attempt's first read began (for expiry: the fact expired after the time
    of that read and before ``now``), ADR 0062.
    ``hidden`` names facts this runtime must not see (another organization's, R1). A fact
    superseded by one the reading step remembered itself is not stale: the step wrote what it
    read over (ADR 0062). ``origin`` names, by read position, the run whose step read, when it
    is not the read's stream (a fork's carried reads).
    """

    def writer(fact_id: str) -> tuple[str | None, str | None]:
        """Return the run and step that remembered a fact (its provenance, P1)."""
        for event in history(fact_id):
            if isinstance(event.data, FactRemembered):
                return event.data.run_id, event.data.step_id
        return None, None

    def lapsed(fact_id: str) -> bool:
        """Tell whether a superseder has expired by ``now`` (its superseded fact shows again)."""
        for event in history(fact_id):
            if isinstance(event.data, FactRemembered):
                until = event.data.valid_until
                return until is not None and until < now
        return False

    changes: dict[str, tuple[Change, int, str | None] | None] = {}
    found: list[Stale] = []
    for event in latest_reads(reads):
        data = event.data
        assert isinstance(data, MemoryRead)
        for fact_id in data.fact_ids:
            if fact_id not in changes:
                changes[fact_id] = (
                    None if hidden(fact_id) else fact_change(history(fact_id), now, lapsed)
                )
            change = changes[fact_id]
            if change is None:
                continue
            kind, since, replacement = change
            if kind == "superseded" and replacement is not None:
                reader = (
                    event.stream if origin is None else origin.get(event.position, event.stream)
                )
                if writer(replacement) == (reader, data.step_id):
                    continue
            # After where the read began (ADR 0062); events of earlier releases say only when
            # and where the result was committed.
            if kind == "expired":
                after = since > (data.at if data.read_at is None else data.read_at)
            else:
                began = event.position if data.read_position is None else data.read_position
                after = since > began
            if after:
                found.append(
                    Stale(
                        run_id=event.stream,
                        step_id=data.step_id,
                        fact_id=fact_id,
                        change=kind,
                        position=event.position,
                        replacement=replacement,
                    )
                )
    return found
