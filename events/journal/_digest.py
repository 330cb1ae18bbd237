"""Tamper evidence (R7): a digest chained through the journal's one global order (J1).

Every append computes, inside its own transaction and after its events got their positions, one
digest record per commit (per run of consecutive positions, should a commit's ever have a gap),
kept in the commit's last event row on SQLite and in ``journaled_digests`` elsewhere:

- ``position``: the commit's last event; ``first``: its first; ``prev``: the last position of the
  commit before it (positions may have gaps on PostgreSQL, so the link names its predecessor
  instead of assuming ``first - 1``); NULL where the chain starts;
- ``hashes``: SHA-256 of each event's stored content (stream, version, topic, state), in order
  (the first :data:`HASH_SIZE` bytes);
- ``entries``: the forgettable payloads the commit wrote (key and SHA-256 of key and bytes) or
  erased (key and NULL), msgpack; an erased payload keeps, in the commit that wrote it, the digest
  it was written with, so the chain still verifies after a purge;
- ``digest``: SHA-256 over the previous commit's digest, the positions, the hashes and entries,
  its first :data:`DIGEST_SIZE` bytes (a journal's earlier commits may keep all 32, ADR 0040).

So each event's hash is chained to every event before it, and altering, removing, inserting or
moving any event, payload or digest record changes a digest that :func:`verify` recomputes. The
chain starts at the first append made by a release that writes digests; events before it (an
older journal) are decoded but not chain-checked, and the report says from which position the
chain starts. Snapshots are caches rebuilt from events and are not covered. See ADR 0021.
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import msgspec

from journaled.events.errors import EventsError
from journaled.events.journal._common import Row

DIGEST_TABLE = "journaled_digests"
HASH_SIZE = 16
"""Bytes kept of an event's or a payload's SHA-256: 128 bits resist a second preimage as well as
the whole digest does for this use, and halve what every row carries."""
DIGEST_SIZE = 16
"""Bytes kept of a commit's chained digest. The chain is as strong as its weakest link, the
16-byte event hashes it covers, so 16 more bytes of chain digest added no strength (ADR 0040).
Journals of earlier releases hold 32-byte digests; :func:`verify` checks each at its own size."""
_SIZES = frozenset((DIGEST_SIZE, 32))

DigestRow = tuple[int, int, int | None, bytes, bytes | None, bytes]
"""One commit's link: (last position, first position, previous commit's last position or None at
the chain's start, event hashes, payload entries or None, digest)."""
Entry = tuple[str, bytes | None]
"""A payload the commit wrote (key, digest of key and bytes) or erased (key, None)."""

_encode = msgspec.msgpack.encode  # unambiguous framing of the hashed fields
_entries = msgspec.msgpack.Decoder(list[tuple[str, bytes | None]])
_sha256 = hashlib.sha256


def event_hash(stream: str, version: int, topic: str, state: bytes) -> bytes:
    """Return the hash of one stored event's content."""
    return _sha256(_encode((stream, version, topic, state))).digest()[:HASH_SIZE]


def payload_hash(key: str, payload: bytes) -> bytes:
    """Return the hash of a payload row; the key is inside, so rows cannot trade contents."""
    return _sha256(_encode((key, payload))).digest()[:HASH_SIZE]


SEALED = b"\xc1"
"""The first byte of a payload row stored with a salt (ADR 0096): 0xC1 is never the first byte of
msgpack (it is the one byte msgpack leaves unused) nor of UTF-8 text, which every row of an
earlier release, and every payload a caller gives, begins with."""
SALT_SIZE = 16
_SEAL_SIZE = 1 + SALT_SIZE


def sealed(payloads: Mapping[str, bytes]) -> dict[str, bytes]:
    """Return payloads as rows are stored: each after the mark and 16 random bytes of its own.

    A row's hash stays in the digest chain after a purge erased the row (R7), and the chain's
    readers may be anyone holding the file. Unsalted, that hash would let them test guesses of
    an erased text offline (a PIN, a name, a yes or no): the salt, erased with the row, makes
    the hash that stays say nothing of the text (M10, R2).
    """
    if not payloads:
        return {}
    salts = os.urandom(SALT_SIZE * len(payloads))
    return {
        key: b"".join((SEALED, salts[i * SALT_SIZE : (i + 1) * SALT_SIZE], value))
        for i, (key, value) in enumerate(payloads.items())
    }


def unsealed(row: bytes) -> bytes:
    """Return a stored payload row's value: without its mark and salt, or as an earlier release
    stored it."""
    return row[_SEAL_SIZE:] if row[:1] == SEALED else row


def commit_digest(
    prev_digest: bytes | None,
    first: int,
    last: int,
    prev: int | None,
    hashes: bytes,
    entries: bytes | None,
    size: int = DIGEST_SIZE,
) -> bytes:
    """Return a commit's chained digest, its first ``size`` bytes."""
    digest = _sha256(prev_digest or b"")
    digest.update(_encode((first, last, prev)))
    digest.update(hashes)
    if entries is not None:
        digest.update(entries)
    return digest.digest()[:size]


class ChainBroken(EventsError):
    """An append refused because the journal's chain was broken behind its back (R7)."""


def commit_parts(
    events: Sequence[tuple[str, int, str, bytes]],
    payloads: Mapping[str, bytes],
    forget: Sequence[str],
) -> tuple[list[bytes], bytes | None]:
    """Return what a commit's digest covers besides its positions: each event's hash, and the
    packed entries of the payloads it writes or erases (None when it touches none).

    Neither depends on where the commit lands in the global order, so a writer computes them
    before it knows its positions (the PostgreSQL append procedure chains them, ADR 0044).
    """
    sha, encode, size = _sha256, _encode, HASH_SIZE
    if forget:
        erased = set(forget)
        entries: list[Entry] = [
            (k, sha(encode((k, v))).digest()[:size]) for k, v in payloads.items() if k not in erased
        ]
        entries += [(k, None) for k in dict.fromkeys(forget)]
    else:
        entries = [(k, sha(encode((k, v))).digest()[:size]) for k, v in payloads.items()]
    packed = encode(entries) if entries else None  # stored as is: verify reads these bytes
    return [sha(encode(e)).digest()[:size] for e in events], packed


def chain(
    head: tuple[int, bytes] | None,
    positions: Sequence[int],
    events: Sequence[tuple[str, int, str, bytes]],
    payloads: Mapping[str, bytes],
    forget: Sequence[str],
) -> list[DigestRow]:
    """Extend the chain from ``head`` (last position, digest) by one append's events.

    Must run inside the append's transaction, with writers serialised, so that ``head`` is the
    digest of the commit just before this one in the global order.

    Raises:
        ChainBroken: the chain already reaches these positions (events were deleted from the
            journal's end, and SQLite gave their positions out again).
    """
    if head is not None and positions[0] <= head[0]:
        raise ChainBroken(
            f"cannot append at position {positions[0]}: the journal's digest chain already "
            f"reaches position {head[0]}, so events at its end were removed outside the journal; "
            "run `journaled journal verify`"
        )
    hashes, packed = commit_parts(events, payloads, forget)
    prev, prev_digest = head if head is not None else (None, None)
    count = len(positions)
    if count and positions[-1] - positions[0] == count - 1:  # consecutive: one record
        first, last = positions[0], positions[-1]
        joined = b"".join(hashes)
        return [
            (
                last,
                first,
                prev,
                joined,
                packed,
                commit_digest(prev_digest, first, last, prev, joined, packed),
            )
        ]
    rows: list[DigestRow] = []
    start = 0
    for i in range(1, count + 1):
        if i < count and positions[i] == positions[i - 1] + 1:
            continue
        first, last = positions[start], positions[i - 1]
        joined = b"".join(hashes[start:i])
        attached = packed if i == count else None
        digest = commit_digest(prev_digest, first, last, prev, joined, attached)
        rows.append((last, first, prev, joined, attached, digest))
        prev, prev_digest, start = last, digest, i
    return rows


# -- verification --------------------------------------------------------------------------------


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    """The first thing wrong in a journal: where, what kind, and why.

    ``kind`` is one of ``altered``, ``removed``, ``reordered``, ``inserted``, ``undecodable``,
    ``payload-altered``, ``payload-removed``, ``payload-restored``, ``payload-inserted``, and
    ``snapshot-altered`` (a snapshot that differs from the fold of its events, see
    :mod:`journaled.events.snapshot_audit`).

    ``position`` is the event's own, not its commit's (ADR 0082): a payload's problem is at the
    event its key names, a removed event at the position it held (on SQLite, where positions have
    no other gaps, the first one missing; elsewhere the one a link names). A commit's digest
    record that is changed or gone while its events remain is at its first event, ``altered``.
    """

    position: int
    kind: str
    reason: str


class VerifyReport(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of :meth:`Journal.verify` (R7).

    Attributes:
        ok: nothing was found wrong.
        events: events read and decoded.
        chained_from: the first position covered by the digest chain (None: no digests at all).
        unchained: events before ``chained_from`` (written by an older release): decoded, not
            chain-checked.
        payloads: payload entries checked against their digests.
        head: hex digest of the last chained commit; kept elsewhere, it also reveals a later
            truncation of the journal's tail, or a chain recomputed after an edit, which the
            chain alone cannot.
        problem: the first problem found (lowest position), or None.
        snapshots: snapshots compared with the fold of their events (0 when the journal itself
            failed, or when only the chain was checked).
    """

    ok: bool
    events: int
    chained_from: int | None
    unchained: int
    payloads: int
    head: str | None
    problem: Problem | None = None
    snapshots: int = 0


class _Peek:
    """An iterator of rows that can look at its next rows."""

    def __init__(self, rows: Iterator[Row]) -> None:
        self._rows = rows
        self._ahead: deque[Row] = deque()
        self._next: Row | None = next(rows, None)

    def peek(self) -> Row | None:
        return self._next

    def pop(self) -> Row:
        row = self._next
        assert row is not None
        self._next = self._ahead.popleft() if self._ahead else next(self._rows, None)
        return row

    def upto(self, position: int) -> list[Row]:
        """Return the rows not popped yet up to a position; they stay to be popped."""
        found: list[Row] = []
        if self._next is None or self._next[0] > position:
            return found
        found.append(self._next)
        for row in self._ahead:
            if row[0] > position:
                return found
            found.append(row)
        while (more := next(self._rows, None)) is not None:
            self._ahead.append(more)
            if more[0] > position:
                break
            found.append(more)
        return found


Written = tuple[int, int, bytes | None, int | None]
"""What the chain says of one payload key: the first and last positions of the commit that wrote
it, its :func:`payload_hash` (None once erased), and the last position of the commit that erased
it (None while it is not). A payload erased that no commit of the chain wrote (it was written
before the chain began) has its eraser in place of its writer, so its last two positions match."""


Again = tuple[Callable[[], Iterator[Row]], Callable[[], Iterator[DigestRow]]]


def verify(
    events: Callable[[], Iterator[Row]],
    digests: Callable[[], Iterator[DigestRow]],
    payloads: Mapping[str, bytes],
    decode: Callable[[Row], Any],
    head: str | None = None,
    *,
    records_in_rows: bool = False,
) -> VerifyReport:
    """Check events, digest records and payloads read up to one position; report the first problem.

    ``events`` and ``digests`` yield rows in position order; they are called again only to name
    the position that an out-of-place event's content was recorded at, or the event a payload no
    commit wrote belongs to. ``payloads`` maps each payload's key to its :func:`payload_hash`,
    read in the same view as the last position. ``head`` is a digest reported by an earlier
    check: it must still be one of the chain's, else commits that followed it were removed (the
    tail cut off, then appended to) or the chain was recomputed.

    ``records_in_rows``: each commit's record is kept in its last event row, and positions have
    no gaps but the ones deleted rows leave (SQLite). Deleting the row that ends a commit then
    deletes its record too; the positions missing around it name the events removed (ADR 0082).
    """
    anchored = head is None
    latest: dict[str, Written] = {}
    count = unchained = 0
    start: int | None = None
    """Where the chain starts, once its first commit checked out."""
    chained_from: int | None = None
    """Where the chain starts, as its first record says, checked out or not."""
    prev: int | None = None
    prev_digest: bytes | None = None
    problem: Problem | None = None
    lost = False  # the problem is a commit's record missing: its erasures are unknown
    stream = _Peek(events())
    records = digests()
    for record in records:
        last, first, _, _, _, digest = record
        chained_from = first if chained_from is None else chained_from
        if start is not None:  # a broken link explains the events before this commit
            problem = _link(record, start, prev, stream, records_in_rows)
        while problem is None and (event := stream.peek()) is not None and event[0] < first:
            count += 1
            unchained += start is None
            problem = _outside(stream.pop(), start, decode)
        if start is None:
            problem = problem or _link(record, start, prev, stream, records_in_rows)
        lost = problem is not None and problem.kind != "undecodable"
        if problem is None:
            group: list[Row] = []
            while (event := stream.peek()) is not None and event[0] <= last:
                group.append(stream.pop())
            count += len(group)
            problem = _commit(record, group, prev_digest, decode, (events, digests))
            if problem is None:
                problem = _collect(latest, record)
        if problem is None:
            start = first if start is None else start
            prev, prev_digest = last, digest
            anchored = anchored or digest.hex() == head
            continue
        _collect(latest, record)
        for later in records:  # a payload erased later must not read as deleted behind its back
            _collect(latest, later)
        break
    if problem is None and records_in_rows and prev is not None and stream.peek() is not None:
        tail: list[int] = []
        while stream.peek() is not None:
            tail.append(stream.pop()[0])
        count += len(tail)
        problem, lost = _cut_tail(tail, prev), True
    while problem is None and stream.peek() is not None:
        count += 1
        unchained += start is None
        problem = _outside(stream.pop(), start, decode)
        lost = problem is not None and problem.kind == "inserted"
    found = _check_payloads(latest, payloads, events)
    if problem is not None and lost:
        # An erasure in the missing record would explain a payload missing: no finding, a note.
        missing = [p for p in found if p.kind == "payload-removed"]
        found = [p for p in found if p.kind != "payload-removed"]
        if missing:
            first_missing = min(missing, key=lambda p: p.position)
            problem = msgspec.structs.replace(
                problem,
                reason=f"{problem.reason}; the payload of the event at position "
                f"{first_missing.position} is missing too, which an erasure in the lost record "
                "may explain",
            )
    if problem is not None:
        found.append(problem)
    first_problem = min(found, key=lambda p: p.position) if found else None
    if first_problem is None and start == 1 and prev is not None:
        first_problem = _foreign_payload(latest, payloads, events, prev, records_in_rows)
    if first_problem is None and not anchored:
        first_problem = Problem(
            position=prev or 0,
            kind="removed",
            reason=f"the head digest {head} of an earlier check is not in the chain (which ends "
            f"at position {prev or 0}): commits were removed from its end, or it was recomputed",
        )
    return VerifyReport(
        ok=first_problem is None,
        events=count,
        chained_from=chained_from,
        unchained=unchained,
        payloads=len(latest),
        head=prev_digest.hex() if prev_digest is not None else None,
        problem=first_problem,
    )


def _collect(latest: dict[str, Written], record: DigestRow) -> Problem | None:
    """Record the payload entries of a commit whose digest was checked."""
    last, first, _, _, packed, _ = record
    if packed is None:
        return None
    try:
        entries = _entries.decode(packed)
    except msgspec.DecodeError as exc:
        return Problem(
            position=first,
            kind="altered",
            reason=f"the payload entries of {_commit_at(first, last)} cannot be read: {exc}",
        )
    for key, digest in entries:
        written = latest.get(key) if digest is None else None
        if written is not None and written[3] != written[1]:  # erased: keep who wrote it
            latest[key] = (written[0], written[1], None, last)
        else:
            latest[key] = (first, last, digest, None if digest is not None else last)
    return None


def _commit_at(first: int, last: int) -> str:
    if first == last:
        return f"the commit at position {first}"
    return f"the commit from position {first} to position {last}"


Span = tuple[int, int]
"""A run of consecutive positions, first and last."""


def _runs(present: Sequence[int], after: int, upto: int) -> tuple[list[Span], list[Span]]:
    """Split the positions after ``after`` up to ``upto`` into runs present and runs missing.

    ``present`` is sorted; only its runs are walked, so a forged position far ahead costs
    nothing.
    """
    have: list[Span] = []
    missing: list[Span] = []
    expected = after + 1
    for position in present:
        if position > upto:
            break
        if position > expected:
            missing.append((expected, position - 1))
        if have and have[-1][1] == position - 1:
            have[-1] = (have[-1][0], position)
        else:
            have.append((position, position))
        expected = position + 1
    if expected <= upto:
        missing.append((expected, upto))
    return have, missing


def _positions(runs: Sequence[Span]) -> str:
    """Say which positions runs of positions are: ``position 7``, ``positions 7-9, 12``."""
    shown = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:4])
    if len(runs) > 4:
        shown += ", ..."
    single = len(runs) == 1 and runs[0][0] == runs[0][1]
    return f"position {shown}" if single else f"positions {shown}"


def _unchecked(have: Sequence[Span]) -> str:
    """Say which events are left without the record that was lost, if any."""
    if not have:
        return ""
    if len(have) == 1 and have[0][0] == have[0][1]:
        return f"; the event at position {have[0][0]} remains, unchecked without that record"
    return f"; the events at {_positions(have)} remain, unchecked without that record"


def _outside(event: Row, start: int | None, decode: Callable[[Row], Any]) -> Problem | None:
    """Check an event no digest record covers: before the chain, decode it; after, it is foreign."""
    if start is None:
        return _decodes(event, decode)
    return Problem(
        position=event[0],
        kind="inserted",
        reason=f"event at position {event[0]} has no digest: it was not appended through the "
        "journal (inserted, or its digest record was deleted)",
    )


def _link(
    record: DigestRow, start: int | None, prev: int | None, stream: _Peek, records_in_rows: bool
) -> Problem | None:
    """Check that a commit's record links to the commit before it.

    ``stream`` holds the events not yet checked: those between the commit before and the one the
    link names lost their record; any that are still there were not removed, only unchecked.
    """
    last, first, link_prev = record[0], record[1], record[2]
    if start is None and link_prev is not None:
        return Problem(
            position=link_prev,
            kind="removed",
            reason=f"the chain's first record (positions {first}-{last}) links to position "
            f"{link_prev}, whose events and digest record were removed",
        )
    if start is None or link_prev == prev:
        return None
    if link_prev is not None and prev is not None and prev < link_prev < first:
        # Every event up to prev was read; those up to link_prev lost their commit's record.
        left = [row[0] for row in stream.upto(link_prev)]
        have, missing = _runs(left, prev, link_prev)
        if records_in_rows and missing:  # no gaps but deleted rows': the first is named
            return Problem(
                position=missing[0][0],
                kind="removed",
                reason=f"event at position {missing[0][0]} was removed: the commit from "
                f"position {first} links to position {link_prev}, so the commit ending "
                "there lost its digest record, which its last row carried (removed: "
                f"{_positions(missing)}{_unchecked(have)})",
            )
        if not left:
            return _removed_between(prev, link_prev, first)
        if left[-1] != link_prev:  # gaps may be legitimate, the last position a link names not
            return Problem(
                position=link_prev,
                kind="removed",
                reason=f"event at position {link_prev} was removed with the digest record of "
                f"its commit (the commit from position {first} links to it)"
                f"{_unchecked(have)}",
            )
        return Problem(
            position=left[0],
            kind="altered",
            reason=f"the digest record of the commit up to position {link_prev} was removed "
            f"or changed (its events from position {left[0]} remain)",
        )
    if link_prev is not None and prev is not None and link_prev > prev:  # links into itself
        waiting = stream.peek()
        if waiting is not None and waiting[0] <= link_prev:
            return Problem(
                position=waiting[0],
                kind="altered",
                reason=f"the digest record of the commit up to position {link_prev} was removed "
                f"or changed (its events from position {waiting[0]} remain)",
            )
        return _removed_between(prev, link_prev, first)
    return Problem(
        position=first,
        kind="altered",
        reason=f"the digest record of positions {first}-{last} links to {link_prev}, but the "
        f"commit before it ends at {prev}",
    )


def _removed_between(prev: int, link_prev: int, first: int) -> Problem:
    """Report the commits between two links removed whole: where positions may have gaps
    (PostgreSQL), only the last position the link names is certain to have held an event."""
    return Problem(
        position=link_prev,
        kind="removed",
        reason=f"the event(s) after {prev} up to position {link_prev} were removed with "
        f"their digest record (the commit at position {first} links to {link_prev})",
    )


def _cut_tail(tail: Sequence[int], end: int) -> Problem:
    """Name what removed the record of the events after the chain's last one, at ``end``.

    Only where a commit's record is kept in its last row (SQLite): the row that carried their
    record is gone. Positions have no gaps there but deleted rows', so the first position missing
    after ``end`` is the first event removed; with none missing, the journal's last events were.
    """
    have, missing = _runs(tail, end, tail[-1])
    if missing:
        position = missing[0][0]
        return Problem(
            position=position,
            kind="removed",
            reason=f"event at position {position} was removed: SQLite leaves no gaps in "
            "positions but deleted rows', and no digest record covers the events after the "
            f"chain's last record (at position {end}), which a commit keeps in its last row "
            f"(removed: {_positions(missing)}{_unchecked(have)})",
        )
    position = tail[-1] + 1
    if len(tail) == 1:
        left = f"the event at position {tail[0]} follows"
        whose, them, they = "its", "it", "it was"
    else:
        left = f"the events at {_positions(have)} follow"
        whose, them, they = "their", "them", "they were"
    return Problem(
        position=position,
        kind="removed",
        reason=f"the journal's last event(s), from position {position}, were removed: {left} "
        f"the chain's last record (at position {end}) without a record of {whose} own, "
        f"which a commit keeps in its last row (had {whose} commit ended at position "
        f"{tail[-1]}, its record was erased there instead; had no commit written {them}, "
        f"{they} inserted behind the journal's back)",
    )


def _commit(
    record: DigestRow,
    group: Sequence[Row],
    prev_digest: bytes | None,
    decode: Callable[[Row], Any],
    again: Again,
) -> Problem | None:
    """Check one commit's events against its record, then its digest, then decode them."""
    last, first, link_prev, hashes, packed, digest = record
    if len(hashes) != HASH_SIZE * (last - first + 1):
        return Problem(
            position=first if 0 < first <= last else last,  # its first may be what was changed
            kind="altered",
            reason=f"the digest record of positions {first}-{last} was changed (it holds "
            f"{len(hashes)} bytes of event hashes)",
        )
    by_position = {event[0]: event for event in group}
    for i in range(last - first + 1):
        position = first + i
        event = by_position.get(position)
        if event is None:
            return Problem(
                position=position,
                kind="removed",
                reason=f"event at position {position} was removed (its digest record remains)",
            )
        _, stream, version, topic, state = event
        if event_hash(stream, version, topic, state) != hashes[i * HASH_SIZE : (i + 1) * HASH_SIZE]:
            origin = _recorded_at(again, state, position)
            if origin is not None:
                return Problem(
                    position=position,
                    kind="reordered",
                    reason=f"event at position {position} (stream {stream!r} version {version}) "
                    f"holds the content recorded at position {origin}: rows were swapped or moved",
                )
            return Problem(
                position=position,
                kind="altered",
                reason=f"event at position {position} (stream {stream!r} version {version}) "
                "does not match its digest: its stored content was changed",
            )
    if len(digest) not in _SIZES or (
        commit_digest(prev_digest, first, last, link_prev, hashes, packed, len(digest)) != digest
    ):
        return Problem(
            position=first,
            kind="altered",
            reason=f"the chained digest of positions {first}-{last} does not match: their "
            "digest record (its digest or its payload entries) was changed",
        )
    for event in group:
        problem = _decodes(event, decode)
        if problem is not None:
            return problem
    return None


def _recorded_at(again: Again, state: bytes, position: int) -> int | None:
    """Return the other position whose recorded content this state is, if any (a swap, a move)."""
    events, digests = again
    stream = _Peek(events())
    for last, first, _, hashes, _, _ in digests():
        for i in range(last - first + 1):
            other = first + i
            while (event := stream.peek()) is not None and event[0] < other:
                stream.pop()
            if event is None or event[0] != other or other == position:
                continue
            _, name, version, topic, _ = event
            if (
                event_hash(name, version, topic, state)
                == hashes[i * HASH_SIZE : (i + 1) * HASH_SIZE]
            ):
                return other
    return None


def _decodes(event: Row, decode: Callable[[Row], Any]) -> Problem | None:
    try:
        decode(event)
    except Exception as exc:  # any failure to decode is the finding, whatever its class
        return Problem(
            position=event[0],
            kind="undecodable",
            reason=f"event at position {event[0]} cannot be decoded: {exc}",
        )
    return None


def _check_payloads(
    latest: Mapping[str, Written],
    payloads: Mapping[str, bytes],
    events: Callable[[], Iterator[Row]],
) -> list[Problem]:
    """Compare each payload with what the chain says of it; report each at the event it is of.

    The event is found only for the payloads found wrong, in a second read of the events: the
    one of the commit that wrote it that its key names (:func:`_named`).
    """
    wrong: list[tuple[str, str, Written]] = []
    for key, written in latest.items():
        payload, digest = payloads.get(key), written[2]
        if digest is None:
            if payload is not None:
                wrong.append((key, "payload-restored", written))
        elif payload is None:
            wrong.append((key, "payload-removed", written))
        elif payload != digest:
            wrong.append((key, "payload-altered", written))
    if not wrong:
        return []
    owners = _owners(
        events,  # an erasure whose payload no commit of the chain wrote names no event
        {key: (w[0], w[1]) for key, _, w in wrong if w[3] is None or w[3] != w[1]},
    )
    found: list[Problem] = []
    for key, kind, (first, last, _, erased) in wrong:
        owner = owners.get(key)
        if owner is not None:
            of = f"payload {key!r} of the event at position {owner}"
        elif erased == last:
            of = f"payload {key!r}"
        else:
            of = f"payload {key!r} (written by {_commit_at(first, last)})"
        if kind == "payload-restored":
            assert erased is not None
            what = f"was erased at position {erased} but is present again"
        elif kind == "payload-removed":
            what = "was deleted without an erasure through the journal"
        else:
            what = "does not match its digest: its stored bytes were changed"
        found.append(
            Problem(position=first if owner is None else owner, kind=kind, reason=f"{of} {what}")
        )
    return found


def _owners(
    events: Callable[[], Iterator[Row]], keys: Mapping[str, tuple[int, int]]
) -> dict[str, int]:
    """Return the position of the event each payload key names, between the positions given."""
    wanted: dict[tuple[str, int | None], list[str]] = {}
    for key in keys:
        wanted.setdefault(_named(key), []).append(key)
    upto = max((hi for _, hi in keys.values()), default=0)
    owners: dict[str, int] = {}
    for position, stream, version, _, _ in events():
        if position > upto or len(owners) == len(keys):
            break
        for name in ((stream, version), (stream, None)):
            for key in wanted.get(name, ()):
                low, high = keys[key]
                if low <= position <= high and key not in owners:
                    owners[key] = position
    return owners


def _foreign_payload(
    latest: Mapping[str, Written],
    payloads: Mapping[str, bytes],
    events: Callable[[], Iterator[Row]],
    end: int,
    records_in_rows: bool,
) -> Problem | None:
    """Find a payload row no commit wrote, when the chain (ending at ``end``) covers the journal.

    Reported only when nothing else is: a deleted digest record also leaves its payloads without
    a digest, and that is the finding. A payload whose key names an event of the journal was put
    beside it (``payload-inserted`` at that event). One whose event is nowhere was written by a
    commit removed whole, which the chain cannot show otherwise: the journal's last (a commit
    removed before others would break the next one's link), so after ``end``.
    """
    foreign = sorted(set(payloads) - set(latest))
    if not foreign:
        return None
    owners = _owners(events, dict.fromkeys(foreign, (1, end)))
    found: list[Problem] = []
    for key in foreign:
        owner = owners.get(key)
        if owner is not None:
            found.append(
                Problem(
                    position=owner,
                    kind="payload-inserted",
                    reason=f"payload {key!r} has no digest, but its event, at position {owner}, "
                    "was committed without it: the payload was not written through the journal",
                )
            )
            continue
        removed = end + 1
        where = (
            f"from position {removed}"
            if records_in_rows  # positions have no gaps: the next commit began there
            else f"at position {removed} or later"
        )
        found.append(
            Problem(
                position=removed,
                kind="removed",
                reason=f"payload {key!r} has no digest and belongs to no event in the journal: "
                f"the commit that wrote it, the journal's last, was removed with its events "
                f"({where}, after the chain's end at position {end}), or the payload was "
                "inserted behind the journal's back",
            )
        )
    return min(found, key=lambda p: p.position)


def _named(key: str) -> tuple[str, int | None]:
    """Return the event a payload key names: ``(stream, version)`` for a content event's
    ``<stream>@<version>`` (``content_key``), else ``(stream, None)``, a stream's own payload (a
    fact's text, keyed by the fact's stream)."""
    stream, at, version = key.rpartition("@")
    if at and version.isdigit() and version.isascii():
        return stream, int(version)
    return key, None
