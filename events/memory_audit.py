"""Explain a fact's life from its events, in plain words with ids and times (M11)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from journaled.events.base import Event
from journaled.events.inputs import flat
from journaled.events.memory import (
    FactDeleted,
    FactPurged,
    FactRelinked,
    FactRemembered,
    FactRestored,
    FactSuperseded,
    FactUnlinked,
)


def when(ms: int) -> str:
    """Render epoch milliseconds as an ISO-8601 UTC time; one past the calendar's years 1-9999
    (a "never expires" of 2**63 - 1, say) as its milliseconds."""
    try:
        stamp = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    except (ValueError, OverflowError, OSError):
        return f"epoch ms {ms}"
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def describe(event: Event) -> str:
    """Say in one line what a memory event records."""
    data = event.data
    at = when(data.at)
    match data:
        case FactRemembered():
            parts = [f"remembered at {at} in scope {data.scope!r}"]
            if data.run_id is not None:
                step = "a step" if data.step_id is None else f"step {data.step_id!r}"
                parts.append(f"by {step} of run {data.run_id}")
            if data.source:
                parts.append(f"from {data.source!r}")
            if data.conflict_key:
                parts.append(f"with conflict key {data.conflict_key!r}")
            if data.supersedes:
                parts.append(f"superseding {', '.join(data.supersedes)}")
            if data.redacted:
                parts.append(
                    f"({len(data.redacted)} secret(s) redacted: {', '.join(data.redacted)})"
                )
            return " ".join(parts)
        case FactSuperseded():
            until = data.by_valid_until
            return (
                f"superseded at {at} by {data.by}, which claimed the same conflict key "
                f"{data.conflict_key!r}" + (f" (until {when(until)})" if until is not None else "")
            )
        case FactRelinked():
            return (
                f"re-linked at {at}: its superseder {data.deleted} was deleted, so it is now "
                f"superseded by {data.to}"
            )
        case FactRestored():
            return (
                f"restored at {at}: its superseder {data.deleted} was deleted and had no "
                "superseder of its own, so this fact is active again"
            )
        case FactUnlinked():
            gained = f"; it now supersedes {', '.join(data.gained)}" if data.gained else ""
            return f"stopped listing the deleted fact {data.deleted} at {at}{gained}"
        case FactDeleted():
            return f"deleted at {at} ({data.relationships} related fact(s) re-linked or stripped)"
        case FactPurged():
            reason = f": {flat(data.reason)}" if data.reason else ""
            return f"purged at {at}: its text was erased from the journal{reason}"
    return f"{event.kind} at {at}"


def explain(fact_id: str, history: Sequence[Event]) -> str:
    """Explain a fact's life from its events, oldest first, one numbered line each."""
    if not history:
        return f"no fact {fact_id} in this journal"
    lines = [f"fact {fact_id}:"]
    lines += [f"  {i}. [#{e.position}] {describe(e)}" for i, e in enumerate(history, 1)]
    return "\n".join(lines)
