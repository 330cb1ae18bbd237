"""Tamper evidence (R7): a digest chained through the journal's one global order (J1).

Every append computes, inside its own transaction and after its events got their positions, one
*digest row* per event and one *payload digest row* per forgettable payload it writes or erases:

- ``journaled_digests(position, prev, event_hash, digest)``: ``event_hash`` is SHA-256 over the
  stored event (stream, version, topic, state); ``digest`` is SHA-256 over the previous digest,
  this position, the previous event's position ``prev`` (positions may have gaps on PostgreSQL, so
  the link names its predecessor instead of assuming ``position - 1``), ``event_hash`` and, for
  the last event of an append, the payload entries written with it;
- ``journaled_payload_digests(key, position, digest)``: SHA-256 over a payload's key and bytes, or
  NULL when the append erased that key (``forget``). The entries are append-only: an erased
  payload keeps the digest it was written with, so the chain still verifies after a purge.

The chain starts at the first append made by a release that writes digests (``prev`` NULL);
events before it (an older journal) are decoded by :func:`verify` but not chain-checked, and the
report says from which position the chain starts. Snapshots are caches rebuilt from events and are
not covered. See ADR 0021.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import msgspec

from journaled.events.errors import EventsError
from journaled.events.journal._common import Row

DIGEST_TABLE = "journaled_digests"
PAYLOAD_DIGEST_TABLE = "journaled_payload_digests"

DigestRow = tuple[int, int | None, bytes, bytes]
"""A stored link: (position, previous position or None at the chain's start, event hash, digest)."""
PayloadDigestRow = tuple[str, int, bytes | None]
"""A payload entry: (key, position of the append's last event, digest, or None if erased)."""

_encode = msgspec.msgpack.encode  # unambiguous framing of the hashed fields


def event_hash(stream: str, version: int, topic: str, state: bytes) -> bytes:
    """Return the hash of one stored event's content."""
    return hashlib.sha256(_encode((stream, version, topic, state))).digest()


def payload_hash(key: str, payload: bytes) -> bytes:
    """Return the hash of a payload row; the key is inside, so rows cannot trade contents."""
    return hashlib.sha256(_encode((key, payload))).digest()


def link(
    prev_digest: bytes | None,
    position: int,
    prev: int | None,
    ehash: bytes,
    entries: Sequence[tuple[str, bytes | None]] = (),
) -> bytes:
    """Return an event's chained digest."""
    body = _encode((position, prev, ehash, sorted(entries, key=lambda e: e[0])))
    return hashlib.sha256((prev_digest or b"") + body).digest()


class ChainBroken(EventsError):
    """An append refused because the journal's chain was broken behind its back (R7)."""


class Chained(msgspec.Struct):
    """What one append adds to the chain: its digest rows and payload digest rows."""

    digests: list[DigestRow]
    payloads: list[PayloadDigestRow]


def chain(
    head: tuple[int, bytes] | None,
    positions: Sequence[int],
    events: Sequence[tuple[str, int, str, bytes]],
    payloads: Mapping[str, bytes],
    forget: Sequence[str],
) -> Chained:
    """Extend the chain from ``head`` (last position, digest) by one append's events.

    Must run inside the append's transaction, with writers serialised, so that ``head`` is the
    digest of the event just before these in the global order.
    """
    if head is not None and positions and positions[0] <= head[0]:
        raise ChainBroken(
            f"cannot append at position {positions[0]}: the journal's digest chain already "
            f"reaches position {head[0]}, so events at its end were removed outside the journal; "
            "run `journaled journal verify`"
        )
    erased = set(forget)
    entries: list[tuple[str, bytes | None]] = [
        (k, payload_hash(k, v)) for k, v in payloads.items() if k not in erased
    ]
    entries += [(k, None) for k in sorted(erased)]
    prev, prev_digest = head if head is not None else (None, None)
    rows: list[DigestRow] = []
    last = len(events) - 1
    for i, (position, event) in enumerate(zip(positions, events, strict=True)):
        ehash = event_hash(*event)
        digest = link(prev_digest, position, prev, ehash, entries if i == last else ())
        rows.append((position, prev, ehash, digest))
        prev, prev_digest = position, digest
    at = positions[-1] if positions else 0
    return Chained(digests=rows, payloads=[(k, at, d) for k, d in entries])


# -- verification --------------------------------------------------------------------------------


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    """The first thing wrong in a journal: where, what kind, and why.

    ``kind`` is one of ``altered``, ``removed``, ``reordered``, ``inserted``, ``undecodable``,
    ``payload-altered``, ``payload-removed``, ``payload-restored``, ``payload-inserted``.
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
        head: hex digest of the last chained event; kept elsewhere, it also reveals a later
            truncation of the journal's tail, which the chain alone cannot.
        problem: the first problem found (lowest position), or None.
    """

    ok: bool
    events: int
    chained_from: int | None
    unchained: int
    payloads: int
    head: str | None
    problem: Problem | None = None


def _merge(
    events: Iterator[Row], digests: Iterator[DigestRow]
) -> Iterator[tuple[int, Row | None, DigestRow | None]]:
    """Walk two position-ordered streams together: (position, event or None, digest or None)."""
    event = next(events, None)
    digest = next(digests, None)
    while event is not None or digest is not None:
        if digest is None or (event is not None and event[0] < digest[0]):
            assert event is not None
            yield event[0], event, None
            event = next(events, None)
        elif event is None or digest[0] < event[0]:
            yield digest[0], None, digest
            digest = next(digests, None)
        else:
            yield event[0], event, digest
            event, digest = next(events, None), next(digests, None)


def verify(
    events: Callable[[], Iterator[Row]],
    digests: Callable[[], Iterator[DigestRow]],
    entries: Iterable[PayloadDigestRow],
    payloads: Mapping[str, bytes],
    decode: Callable[[Row], Any],
) -> VerifyReport:
    """Check events, digests and payloads read up to one position; return the first problem.

    ``events`` and ``digests`` are called again only to name the position that an out-of-place
    event's content was recorded at.
    """
    at: dict[int, list[tuple[str, bytes | None]]] = {}
    latest: dict[str, tuple[int, bytes | None]] = {}
    for key, position, digest in entries:
        at.setdefault(position, []).append((key, digest))
        if key not in latest or latest[key][0] <= position:
            latest[key] = (position, digest)
    found: list[Problem] = []
    count = unchained = 0
    start: int | None = None
    prev: int | None = None
    prev_digest: bytes | None = None
    for position, event, stored in _merge(events(), digests()):
        if event is not None:
            count += 1
            if stored is None and start is None:
                unchained += 1
        problem = _check(
            event, stored, position, start, prev, prev_digest, at, decode, (events, digests)
        )
        if problem is not None:
            found.append(problem)
            break
        if stored is not None:
            start = position if start is None else start
            prev, prev_digest = position, stored[3]
    found += _check_payloads(latest, payloads, start)
    first = min(found, key=lambda p: p.position) if found else None
    return VerifyReport(
        ok=first is None,
        events=count,
        chained_from=start,
        unchained=unchained,
        payloads=len(latest),
        head=prev_digest.hex() if prev_digest is not None else None,
        problem=first,
    )


def _check(
    event: Row | None,
    stored: DigestRow | None,
    position: int,
    start: int | None,
    prev: int | None,
    prev_digest: bytes | None,
    at: Mapping[int, list[tuple[str, bytes | None]]],
    decode: Callable[[Row], Any],
    again: tuple[Callable[[], Iterator[Row]], Callable[[], Iterator[DigestRow]]],
) -> Problem | None:
    if stored is None:
        assert event is not None
        if start is not None:
            return Problem(
                position=position,
                kind="inserted",
                reason=f"event at position {position} has no digest: it was not appended through "
                "the journal (inserted, or its digest record was deleted)",
            )
        return _decodes(event, decode)
    if event is None:
        return Problem(
            position=position,
            kind="removed",
            reason=f"event at position {position} was removed (its digest record remains)",
        )
    link_prev = stored[1]
    if start is None and link_prev is not None:
        return Problem(
            position=link_prev,
            kind="removed",
            reason=f"the chain's first record (position {position}) links to position "
            f"{link_prev}, whose event or digest record was removed",
        )
    if start is not None and link_prev != prev:
        if link_prev is not None and (prev is None or link_prev > prev):
            return Problem(
                position=link_prev,
                kind="removed",
                reason=f"event at position {link_prev} was removed (the event at {position} "
                "links to it)",
            )
        return Problem(
            position=position,
            kind="altered",
            reason=f"the digest record at position {position} links to {link_prev}, "
            f"but the previous event is at {prev}",
        )
    _, stream, version, topic, state = event
    ehash = event_hash(stream, version, topic, state)
    if ehash != stored[2]:
        origin = _recorded_at(again, state, position)
        if origin is not None:
            return Problem(
                position=position,
                kind="reordered",
                reason=f"event at position {position} (stream {stream!r} version {version}) "
                f"holds the content stored at position {origin}: rows were swapped or moved",
            )
        return Problem(
            position=position,
            kind="altered",
            reason=f"event at position {position} (stream {stream!r} version {version}) does "
            "not match its digest: its stored content was changed",
        )
    if link(prev_digest, position, link_prev, ehash, at.get(position, ())) != stored[3]:
        return Problem(
            position=position,
            kind="altered",
            reason=f"the chained digest at position {position} does not match: its digest "
            "record, or the record of a payload written with it, was changed",
        )
    return _decodes(event, decode)


def _recorded_at(
    again: tuple[Callable[[], Iterator[Row]], Callable[[], Iterator[DigestRow]]],
    state: bytes,
    position: int,
) -> int | None:
    """Return the other position whose recorded content this state is, if any (a swap, a move)."""
    events, digests = again
    for other, event, stored in _merge(events(), digests()):
        if other != position and event is not None and stored is not None:
            _, stream, version, topic, _ = event
            if event_hash(stream, version, topic, state) == stored[2]:
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
    latest: Mapping[str, tuple[int, bytes | None]],
    payloads: Mapping[str, bytes],
    start: int | None,
) -> list[Problem]:
    found: list[Problem] = []
    for key, (position, digest) in latest.items():
        payload = payloads.get(key)
        if digest is None:
            if payload is not None:
                found.append(
                    Problem(
                        position=position,
                        kind="payload-restored",
                        reason=f"payload {key!r} was erased at position {position} but is "
                        "present again",
                    )
                )
        elif payload is None:
            found.append(
                Problem(
                    position=position,
                    kind="payload-removed",
                    reason=f"payload {key!r} (written at position {position}) was deleted "
                    "without an erasure through the journal",
                )
            )
        elif payload_hash(key, payload) != digest:
            found.append(
                Problem(
                    position=position,
                    kind="payload-altered",
                    reason=f"payload {key!r} (written at position {position}) does not match "
                    "its digest: its stored bytes were changed",
                )
            )
    if start == 1:  # the chain covers the whole journal: every payload row must be in it
        found += [
            Problem(
                position=1,
                kind="payload-inserted",
                reason=f"payload {key!r} has no digest: it was not written through the journal",
            )
            for key in sorted(set(payloads) - set(latest))
        ]
    return found
