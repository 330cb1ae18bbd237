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
from journaled.events.codec import topics_of
from journaled.events.journal import Journal
from journaled.events.memory import (
    FactDeleted,
    FactPurged,
    FactRelinked,
    FactRemembered,
    FactRestored,
    FactSuperseded,
)
from journaled.events.runs import MemoryRead

Change = Literal["superseded", "deleted", "purged", "expired"]


class Use(msgspec.Struct, frozen=True, kw_only=True):
    """A step that read a fact (P2)."""

    run_id: str
    step_id: str
    position: int
    """Journal position of the ``run.memory-read`` event that recorded the read."""


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

    ``since`` is the position from which the change holds (for expiry: the epoch ms it expired).
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
    if valid_until is not None and valid_until <= now:
        return "expired", valid_until, None
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
