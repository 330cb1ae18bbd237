"""The in-process recorder (``memory://``), with payloads and snapshots like the others."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eventsourcing.persistence import (
    StoredEvent,
)
from eventsourcing.popo import POPOApplicationRecorder, POPOFactory

from journaled.events.journal._common import (
    Row,
    SnapshotRefused,
    content_key,
    erases,
    refused_after,
)
from journaled.events.journal._digest import DigestRow, chain, payload_hash


class _POPORecorder(POPOApplicationRecorder):
    """The library's in-memory recorder, plus forgettable payloads and stream reads."""

    chained = True
    """Extend the digest chain on append (R7); off only to measure its cost (bench/journal.py)."""

    def __init__(self) -> None:
        super().__init__()
        self._payloads: dict[str, bytes] = {}
        self._snapshots: dict[str, tuple[int, bytes]] = {}
        self._digests: list[DigestRow] = []
        self._erased = 0
        self._scrubbed = 0
        self._subscriptions: dict[str, int] = {}

    def _insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        with self._database_lock:
            guard = refused_after(kwargs)
            if guard is not None:
                after, prefixes = guard
                if any(s.topic.startswith(prefixes) for s in self._stored_events[after:]):
                    raise SnapshotRefused
            positions = super()._insert_events(stored_events)
            if stored_events and positions and self.chained:
                head = self._digests[-1] if self._digests else None
                self._digests += chain(
                    (head[0], head[5]) if head else None,
                    positions,
                    [
                        (str(e.originator_id), e.originator_version, e.topic, e.state)
                        for e in stored_events
                    ],
                    kwargs.get("payloads") or {},
                    kwargs.get("forget") or (),
                )
            self._payloads.update(kwargs.get("payloads") or {})
            for stream in kwargs.get("forget") or ():
                self._payloads.pop(stream, None)
            dropped: str | None = kwargs.get("drop_snapshots")
            if dropped:
                for key in [k for k in self._snapshots if k.startswith(dropped)]:
                    del self._snapshots[key]
            self._snapshots.update(kwargs.get("snapshots") or {})
            if erases(kwargs):
                self._erased += 1
            return positions

    def select_scrub_marks(self) -> tuple[int, int]:
        """Return (erasures committed, erasures scrubbed) so far."""
        with self._database_lock:
            return self._erased, self._scrubbed

    def mark_scrubbed(self, erased: int) -> None:
        """Record that the first ``erased`` erasures are scrubbed."""
        with self._database_lock:
            self._scrubbed = max(self._scrubbed, erased)

    def create_subscription_table(self) -> None:
        """Nothing to create: the positions live in a dict (A3)."""

    def has_subscription_table(self) -> bool:
        """Tell whether named subscriptions can be stored: always."""
        return True

    def select_subscriptions(self, name: str | None = None) -> list[tuple[str, int]]:
        """Return (name, acknowledged position) of one named subscription or all, by name."""
        with self._database_lock:
            return sorted(
                (n, p) for n, p in self._subscriptions.items() if name is None or n == name
            )

    def advance_subscription(self, name: str, position: int) -> int:
        """Store a subscription's position unless it is behind the stored one; return the stored."""
        with self._database_lock:
            stored = max(self._subscriptions.get(name, position), position)
            self._subscriptions[name] = stored
            return stored

    def delete_subscription(self, name: str) -> bool:
        """Forget a named subscription's position; tell whether there was one."""
        with self._database_lock:
            return self._subscriptions.pop(name, None) is not None

    def select_snapshots(self) -> list[tuple[str, int, bytes]]:
        """Return every snapshot as (key, version, state), in key order (R7 checks them)."""
        with self._database_lock:
            return [(k, v, b) for k, (v, b) in sorted(self._snapshots.items())]

    def select_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        """Return a stream's snapshot (version, state), if one was written."""
        with self._database_lock:
            return self._snapshots.get(stream)

    def select_rows(
        self,
        after: int,
        upto: int | None,
        limit: int,
        topics: Sequence[str] = (),
        skip_prefixes: Sequence[str] = (),
    ) -> list[Row]:
        """Return raw rows after a position (up to another, of some topics), in global order."""
        wanted = set(topics)
        skipped = tuple(skip_prefixes)
        with self._database_lock:
            stop = len(self._stored_events) if upto is None else min(upto, len(self._stored_events))
            out: list[Row] = []
            for i in range(max(after, 0), stop):
                s = self._stored_events[i]
                if (wanted and s.topic not in wanted) or (skipped and s.topic.startswith(skipped)):
                    continue
                out.append((i + 1, str(s.originator_id), s.originator_version, s.topic, s.state))
                if len(out) == limit:
                    break
            return out

    def select_raw(self, after: int, upto: int, limit: int) -> list[Row]:
        """Return rows as stored, for verification (R7)."""
        return self.select_rows(after, upto, limit)

    def select_digests(self, after: int, upto: int, limit: int) -> list[DigestRow]:
        """Return digest records after a position, up to another, in order (R7)."""
        with self._database_lock:
            return [d for d in self._digests if after < d[0] <= upto][:limit]

    def select_digest_state(self) -> tuple[int, dict[str, bytes]]:
        """Return, at one instant, the last position and the payloads (R7)."""
        with self._database_lock:
            hashes = {key: payload_hash(key, payload) for key, payload in self._payloads.items()}
            return len(self._stored_events), hashes

    def select_stream(
        self, stream: str, after_version: int, upto: int | None, limit: int | None
    ) -> list[Row]:
        """Return a stream's raw rows after a version (up to a position), oldest first."""
        with self._database_lock:
            index = self._stored_events_index.get(stream, {})
            out: list[Row] = []
            for version in sorted(v for v in index if v > after_version):
                i = index[version]
                if upto is not None and i + 1 > upto:
                    break
                s = self._stored_events[i]
                out.append((i + 1, stream, s.originator_version, s.topic, s.state))
                if limit is not None and len(out) == limit:
                    break
            return out

    def select_head(self, stream: str) -> tuple[int, str] | None:
        """Return the position and topic of a stream's first event (its state unread)."""
        rows = self.select_stream(stream, 0, None, 1)
        return (int(rows[0][0]), str(rows[0][3])) if rows else None

    def select_firsts(self, streams: Sequence[str]) -> list[Row]:
        """Return the first event's row of each of these streams that has one (any order)."""
        rows: list[Row] = []
        for stream in dict.fromkeys(streams):
            rows += self.select_stream(stream, 0, None, 1)
        return rows

    def select_content(self, stream: str, versions: Sequence[int]) -> dict[int, bytes]:
        """Return the side rows of these versions of one stream, by version."""
        found = self.select_payloads([content_key(stream, v) for v in versions])
        return {int(k.rpartition("@")[2]): v for k, v in found.items()}

    def select_payloads(self, streams: Sequence[str] | None) -> dict[str, bytes]:
        """Return the payloads of the given streams (every payload when None)."""
        with self._database_lock:
            if streams is None:
                return dict(self._payloads)
            return {s: self._payloads[s] for s in streams if s in self._payloads}


class _POPOFactory(POPOFactory):
    def application_recorder(self) -> _POPORecorder:
        return _POPORecorder()
