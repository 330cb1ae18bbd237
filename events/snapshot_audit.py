"""Check the journal's snapshots against the events they claim to fold (R7).

Snapshots are caches outside the digest chain (ADR 0021), yet memory serves fact texts from its
snapshot at open and a run resumes from its own. Each snapshot is therefore compared with the
fold of the journal's events up to the snapshot's position (memory) or version (a run), using the
same pure projections a cold open uses; a difference is reported as ``snapshot-altered``.

A snapshot the runtime would ignore anyway (unreadable, of another schema, or a run's snapshot
blanked by its purge) is not checked: nothing is served from it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import msgspec

from journaled.events.base import Event
from journaled.events.catalog import NOT_MEMORY
from journaled.events.inputs import same_value
from journaled.events.inverted_index import IndexSnapshot, decode_posting
from journaled.events.journal import Journal, Problem, VerifyReport
from journaled.events.memory import MEMORY_EVENTS, FactPurged, FactRemembered, physical_scope
from journaled.events.memory_state import (
    MEMORY_SNAPSHOT_DECODER,
    MEMORY_SNAPSHOT_PREFIX,
    MEMORY_SNAPSHOT_SCHEMA,
    PURGED_TEXT,
    SCOPE_SNAPSHOT_DECODER,
    MemorySnapshot,
    MemoryState,
    ScopeSnapshot,
)
from journaled.events.run_state import SNAPSHOT_SCHEMA, decode_snapshot, fold_run
from journaled.events.run_summaries import SUMMARIES_KEY, check_stored
from journaled.events.tenancy import belongs_elsewhere

SNAPSHOT_ALTERED = "snapshot-altered"
_BATCH = 2000
_ENCODER = msgspec.msgpack.Encoder()


def verify(journal: Journal, head: str | None = None) -> VerifyReport:
    """Check the digest chain, then, if it holds, every snapshot against its events (R7).

    A journal whose chain fails is reported as it is: its snapshots would be compared with events
    already known to be wrong.
    """
    report = journal.verify(head)
    if not report.ok:
        return report
    checked, problems = check_snapshots(journal)
    first = min(problems, key=lambda p: p.position) if problems else None
    return msgspec.structs.replace(report, ok=first is None, snapshots=checked, problem=first)


def check_snapshots(journal: Journal) -> tuple[int, list[Problem]]:
    """Compare every usable snapshot with the fold of its events.

    Returns:
        (snapshots checked, one ``snapshot-altered`` problem per snapshot that differs).
    """
    stored = journal.snapshots()
    end = journal.position()
    memory: list[tuple[str, MemorySnapshot]] = []
    problems: list[tuple[str, Problem]] = []
    checked = 0
    for key, _, state in stored:
        if key.startswith(MEMORY_SNAPSHOT_PREFIX):
            snap = _memory_snapshot(state)
            if snap is None:
                continue
            checked += 1
            if snap.position > end:
                problems.append(
                    _altered(
                        key,
                        end,
                        f"it claims position {snap.position}, past the journal's end ({end})",
                    )
                )
            else:
                memory.append((key, snap))
        elif key == SUMMARIES_KEY:
            found = check_stored(journal, state)
            checked += 1
            if found is not None:
                problems.append(_altered(key, *found))
        else:
            checked += _check_run(journal, key, state, problems)
    problems += _check_memory(journal, memory)
    # A snapshot replaced or dropped while it was checked (a purge drops memory's in the same
    # transaction that erases a text) is no evidence of anything: only report unchanged ones.
    before = {key: (version, state) for key, version, state in stored}
    now = {key: (version, state) for key, version, state in journal.snapshots()}
    return checked, [p for key, p in problems if now.get(key) == before[key]]


def _altered(key: str, position: int, why: str) -> tuple[str, Problem]:
    problem = Problem(
        position=position,
        kind=SNAPSHOT_ALTERED,
        reason=f"snapshot {key} at position {position} does not match the journal's events: {why}",
    )
    return key, problem


# -- memory --------------------------------------------------------------------------------------


def _memory_snapshot(state: bytes) -> MemorySnapshot | None:
    """Decode a memory snapshot as an open would use it, or None where an open ignores it."""
    try:
        snap = MEMORY_SNAPSHOT_DECODER.decode(state)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return snap if snap.schema == MEMORY_SNAPSHOT_SCHEMA else None


class _MemoryFold:
    """Memory as one snapshot's writer would have folded it: its organization, its scopes."""

    def __init__(self, key: str, snap: MemorySnapshot) -> None:
        self.key = key
        self.snap = snap
        self.state = MemoryState(sorted(snap.scopes), snap.organization)
        self.versions: dict[str, int] = {}
        self.purged: set[str] = set()

    def apply(self, event: Event, texts: dict[str, bytes]) -> None:
        if isinstance(event.data, MEMORY_EVENTS):
            self.versions[event.stream] = event.version
            if isinstance(event.data, FactPurged):
                self.purged.add(event.data.fact_id)
        self.state.apply(event, texts)

    def difference(self) -> str | None:
        """Say what the snapshot holds that the fold does not, or None when they agree."""
        snap = self.snap
        if snap.versions != self.versions:
            return f"stream versions differ{_first_key(snap.versions, self.versions)}"
        if snap.route != self.state.route:
            return f"the route of facts to scopes differs{_first_key(snap.route, self.state.route)}"
        if set(snap.purged) != self.purged:
            return "the set of purged facts differs"
        for physical in sorted(snap.scopes):
            try:
                held = SCOPE_SNAPSHOT_DECODER.decode(snap.scopes[physical])
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                return f"scope {physical} cannot be read ({exc})"
            folded = SCOPE_SNAPSHOT_DECODER.decode(
                _ENCODER.encode(self.state.scopes[physical].export())
            )
            why = _scope_difference(held, folded)
            if why is not None:
                return f"scope {physical}: {why}"
        return None


def _first_key(held: dict[str, Any], folded: dict[str, Any]) -> str:
    keys = sorted(k for k in held.keys() | folded.keys() if held.get(k) != folded.get(k))
    return f" (first at {keys[0]!r})" if keys else ""


def _scope_difference(held: ScopeSnapshot, folded: ScopeSnapshot) -> str | None:
    """Compare two scope snapshots by content (ids, not the index's internal numbering)."""
    ids = sorted(held.facts.keys() | folded.facts.keys())
    for fact_id in ids:
        a, b = held.facts.get(fact_id), folded.facts.get(fact_id)
        if a is not None and b is not None and same_value(a, b):
            continue  # by value and type: == holds -0.0 for 0.0 (ADR 0097)
        if a is None or b is None:
            where = "the snapshot" if a is not None else "the events"
            return f"fact {fact_id} exists only in {where}"
        fields = [f for f in a.__struct_fields__ if not same_value(getattr(a, f), getattr(b, f))]
        return f"fact {fact_id} differs in {', '.join(fields)}"
    checks: Sequence[tuple[str, object, object]] = (
        ("superseder expiries", held.superseder_until, folded.superseder_until),
        ("supersession listings", held.listed_by, folded.listed_by),
        ("conflict keys", held.by_key, folded.by_key),
        ("erased texts", set(held.erased), set(folded.erased)),
        ("conditional facts", set(held.conditional), set(folded.conditional)),
        ("search groups", held.plain_group, folded.plain_group),
        ("search totals", _groups(held), _groups(folded)),
        ("search index", _index(held.index), _index(folded.index)),
    )
    for name, a_part, b_part in checks:
        if a_part != b_part:
            return f"its {name} differ"
    return None


def _groups(snap: ScopeSnapshot) -> dict[tuple[str, str | None], tuple[int, int]]:
    return {(scope, domain): (n, length) for scope, domain, n, length in snap.groups}


def _index(index: IndexSnapshot) -> tuple[object, ...]:
    """Return an index's content keyed by document id, not by its internal document numbers."""

    def name(number: int) -> str:
        return index.names[number] if 0 <= number < len(index.names) else f"#{number}"

    per_doc: dict[str, dict[str, int]] = {}
    for term, packed in index.postings.items():
        try:
            posting = decode_posting(packed)
        except (msgspec.DecodeError, msgspec.ValidationError):
            posting = {-1: -1}  # unreadable: it differs from any fold's
        for number, tf in posting.items():
            per_doc.setdefault(name(number), {})[term] = tf
    lengths = {name(number): length for number, length in index.dl.items()}
    return per_doc, lengths, index.lengths, index.terms


def _check_memory(
    journal: Journal, snapshots: list[tuple[str, MemorySnapshot]]
) -> list[tuple[str, Problem]]:
    """Fold memory's events once, comparing each snapshot when the fold reaches its position."""
    if not snapshots:
        return []
    pending = sorted((_MemoryFold(k, s) for k, s in snapshots), key=lambda f: f.snap.position)
    problems: list[tuple[str, Problem]] = []
    active: list[_MemoryFold] = []
    upto = pending[-1].snap.position

    def settle(position: int) -> None:
        """Compare and retire every snapshot whose position the fold has reached."""
        while pending and pending[0].snap.position <= position:
            done = pending.pop(0)
            active.remove(done)
            why = done.difference()
            if why is not None:
                problems.append(_altered(done.key, done.snap.position, why))

    active.extend(pending)
    for batch in _batches(journal, upto):
        for event in batch.events:
            settle(event.position - 1)
            for fold in active:
                fold.apply(event, batch.texts)
    settle(upto)
    return problems


class _Batch(msgspec.Struct):
    events: list[Event]
    texts: dict[str, bytes]


def _batches(journal: Journal, upto: int) -> Iterator[_Batch]:
    """Yield memory's events up to a position in batches, with the texts they remember."""
    batch: list[Event] = []
    for event in journal.read(after=0, upto=upto, skip_prefixes=NOT_MEMORY):
        batch.append(event)
        if len(batch) >= _BATCH:
            yield _Batch(batch, _texts(journal, batch))
            batch = []
    if batch:
        yield _Batch(batch, _texts(journal, batch))


def _texts(journal: Journal, events: Sequence[Event]) -> dict[str, bytes]:
    ids = [e.data.fact_id for e in events if isinstance(e.data, FactRemembered)]
    return journal.payloads(ids) if ids else {}


def backed_scopes(
    snapshot: MemorySnapshot,
    payloads: Callable[[list[str]], Mapping[str, bytes]],
    firsts: Callable[[list[str]], Mapping[str, Event]],
) -> tuple[dict[str, ScopeSnapshot], str | None]:
    """Decode a memory snapshot's scopes and check their texts against the journal's payloads.

    The cheap check an open makes before serving a snapshot (R7): every fact text must be the
    payload the journal keeps for that fact (covered by the digest chain), and a fact whose text
    was erased must have no payload left. It reads the payloads (of every scope at once), not the
    events; the full comparison with the events' fold is :func:`verify`'s. Facts of the
    organization scope are checked against the events that remembered them (``firsts``): a
    fact of another organization is never served (R1).

    Returns:
        The scopes, decoded once and owned by nobody else (ADR 0058), and None; or no scopes and
        the first reason the snapshot must not be served.
    """
    scopes: dict[str, ScopeSnapshot] = {}
    for physical in sorted(snapshot.scopes):
        try:
            scopes[physical] = SCOPE_SNAPSHOT_DECODER.decode(snapshot.scopes[physical])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return {}, f"scope {physical} cannot be read ({exc})"
    for physical, held in scopes.items():
        why = _inconsistent(physical, held, snapshot.route)
        if why is not None:
            return {}, f"scope {physical}: {why}"
    shared = scopes.get("organization")  # the physical scope organizations share (R1)
    if shared is not None and shared.facts:
        remembered = firsts(list(shared.facts))
        for fact_id in shared.facts:
            first = remembered.get(fact_id)
            data = None if first is None else first.data
            if not isinstance(data, FactRemembered) or belongs_elsewhere(
                data, snapshot.organization
            ):
                return {}, f"fact {fact_id} is not this organization's"
    stored = payloads([fact_id for held in scopes.values() for fact_id in held.facts])
    for held in scopes.values():
        erased = set(held.erased)
        for fact_id, fact in held.facts.items():
            raw = stored.get(fact_id)
            if fact_id in erased:
                if raw is not None or fact.text != PURGED_TEXT:
                    return {}, f"fact {fact_id} is marked erased but has a text"
            elif raw is None or raw != fact.text.encode("utf-8"):
                return {}, f"the text of fact {fact_id} is not the one the journal holds"
    return scopes, None


def _inconsistent(
    physical: str, held: ScopeSnapshot, route: Mapping[str, str | None]
) -> str | None:
    """Say what makes a scope's part disagree with itself or the route, or None.

    Cheap checks, made before a part is served: a fact filed under another fact's id would be
    served with that id's text; a fact the route sends elsewhere is not this scope's; an
    indexed or classified fact missing from the facts would fail a search.
    """
    if held.physical != physical:
        return f"it says it is scope {held.physical}"
    facts = held.facts
    # Compared whole, in C where it can be (100,000 facts: some 40 ms in all).
    if any(physical_scope(scope) != physical for scope in {f.scope for f in facts.values()}):
        return "it holds a fact of another scope"
    if [f.id for f in facts.values()] != list(facts):
        return "it files a fact under another fact's id"
    if facts and set(map(route.get, facts)) != {physical}:
        return "it holds a fact routed to another scope"
    index = held.index
    if not index.lengths.keys() <= facts.keys() or len(index.dl) != len(index.lengths):
        return "its search index holds a fact it does not have"
    try:
        numbered = set(map(index.names.__getitem__, index.dl))
    except (IndexError, TypeError):
        numbered = set()
    if numbered != index.lengths.keys():
        return "its search index numbers a fact it does not have"
    if not held.plain_group.keys() <= facts.keys() or not set(held.conditional) <= facts.keys():
        return "its search groups hold a fact it does not have"
    return None


# -- runs ----------------------------------------------------------------------------------------


def _check_run(
    journal: Journal, key: str, state: bytes, problems: list[tuple[str, Problem]]
) -> int:
    """Compare a run's snapshot with the fold of its stream up to the snapshot's version."""
    try:
        held = decode_snapshot(state)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return 0  # blanked by a purge, or unreadable: a resume folds the events instead
    if held.schema != SNAPSHOT_SCHEMA:
        return 0
    events = [e for e in journal.stream(key) if e.version <= held.version]
    position = events[-1].position if events else 0
    if len(events) != held.version:
        why = f"it claims version {held.version}, the stream has {len(events)} events"
        problems.append(_altered(key, position, why))
        return 1
    folded = fold_run(events)
    if folded.started is None:
        problems.append(_altered(key, position, "its stream does not start a run"))
        return 1
    again = decode_snapshot(folded.snapshot())
    # Field by field, by value and type: ``==`` would pass a forged True for a 1, a -0.0 for a
    # 0.0 (ADR 0097).
    fields = [
        f for f in held.__struct_fields__ if not same_value(getattr(held, f), getattr(again, f))
    ]
    if fields:
        problems.append(_altered(key, position, f"it differs in {', '.join(fields)}"))
    return 1
