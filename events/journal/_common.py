"""Names every part of the journal adapter shares: tables, the row shape, the mapper."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from typing import Any

from eventsourcing.persistence import (
    JSONTranscoder,
    Mapper,
    StoredEvent,
)

from journaled.events.base import Pending
from journaled.events.codec import Codec

PAYLOAD_TABLE = "journaled_payloads"
SNAPSHOT_TABLE = "journaled_snapshots"
SCRUB_TABLE = "journaled_scrub"
SUBSCRIPTION_TABLE = "journaled_subscriptions"
"""One row per named subscription: the last position its consumer acknowledged (A3, ADR 0026).
Not part of the log: no digest covers it, and verify, purge and scrub never read it."""
"""One row (id 1): how many erasures committed (``erased``, counted in their own transaction)
and how many of them a scrub has since removed from the files (``scrubbed``). A process killed
between a purge's commit and its scrub leaves ``erased > scrubbed``: the debt outlives it (M10)."""
Row = tuple[int, str, int, str, bytes]
"""A stored event as read: (position, stream, version, topic, payload)."""
_ROWS_PER_INSERT = 500  # 9 parameters a row stay far below SQLite's 32,766-variable limit
APP_NAME = "journaled"
EVENTS_TABLE_POSTGRES = f"{APP_NAME}_events"
"""PostgreSQL events table: the library names it after the application."""
_PG_EVENT_TYPE = "stored_event_text"  # the library's composite type for text originator ids
_PG_MIGRATE_LOCK = 0x6A6F75726E616C  # advisory lock key ("journal"), per database
_PG_CONNECT_TIMEOUT = 10  # seconds to establish one connection
_PG_MAX_OVERFLOW = 2  # connections opened beyond pool_size under load, closed when idle
_PG_ATTEMPTS = 3  # a read retried on a dropped connection


SQLITE_IOERR_SHMSIZE = 4874
"""SQLite could not grow the shared-memory file beside a WAL journal: a full disk most often
(what opening a journal no connection holds open meets then), but also an I/O error."""


def causes(error: object) -> Iterator[BaseException]:
    """Yield ``error`` and the errors it was raised from (``raise … from``), outermost first."""
    seen: set[int] = set()
    while isinstance(error, BaseException) and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__


_WHOLE_WORD_HIDDEN = 8
"""A password this long or longer is hidden wherever it appears in a driver's message; a
shorter one only where a URL or a connection string would hold it (``:pw@``, ``password=pw``):
replacing every occurrence of a short one garbles the message ("c***nnecti***n"), and which
letters vanish tells the password."""


def hide_password(text: str, password: str | None) -> str:
    """Remove a journal URL's password from a message (libpq does not echo it; this makes sure)."""
    if not password:
        return text
    if len(password) >= _WHOLE_WORD_HIDDEN:
        return text.replace(password, "***")
    for shown, hidden in (
        (f":{password}@", ":***@"),
        (f"password={password}", "password=***"),
        (f"password='{password}'", "password='***'"),
    ):
        text = text.replace(shown, hidden)
    return text


def disk_full(error: object) -> str | None:
    """Return the database's words when ``error``, or an error it was raised from, says that
    the disk holding the journal is full (SQLite's SQLITE_FULL, PostgreSQL's SQLSTATE 53100).

    Only what an error was raised *from* counts: an error raised while another was being
    handled (a lookup failing after a full disk) says nothing of the disk.
    """
    for cause in causes(error):
        if (
            getattr(cause, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
            or getattr(cause, "sqlstate", None) == "53100"
        ):
            return (str(cause).strip().splitlines() or ["disk full"])[0]
    return None


def read_only(error: object) -> str | None:
    """Return the database's words when ``error``, or an error it was raised from, says that
    the journal's file cannot be written (SQLite's SQLITE_READONLY and its extended codes: a
    read-only or immutable file, a read-only mount).

    Only what an error was raised *from* counts, as for :func:`disk_full`.
    """
    for cause in causes(error):
        code = getattr(cause, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_READONLY:
            return (str(cause).strip().splitlines() or ["read-only"])[0]
    return None


def truncate_wal(path: str, wait: float) -> bool:
    """Copy a SQLite file's write-ahead log into the file and empty the log (ADR 0005).

    Run after an erasure with ``secure_delete`` on: the zeroed pages reach the file and the log
    keeps no frame of the erased bytes. Each attempt gives way at once to a reader or a writer
    (no busy timeout: a checkpoint waiting for readers would hold the write lock meanwhile);
    attempts are repeated every 20 ms for up to ``wait`` seconds (0: one attempt).

    Returns:
        True once the log is empty; False when another connection kept reading older data, or
        writing, for ``wait`` seconds.

    Raises:
        sqlite3.OperationalError: the disk is full (:func:`disk_full` names it) or the file
            cannot be written (:func:`read_only` names it): no reader is to blame, and the log
            cannot be copied into the file.
    """
    deadline = time.monotonic() + wait
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute("PRAGMA secure_delete=ON")
        while True:
            try:
                row = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.OperationalError as exc:
                if disk_full(exc) is not None or read_only(exc) is not None:
                    raise
                row = (1, 0, 0)  # a writer holds the lock right now
            if not row[0]:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)  # a reader holds the log; its snapshot ends soon
    finally:
        conn.close()


class LockWaitExpired(Exception):
    """Raised by a recorder when a write waited ``lock_wait`` for the journal's lock in vain.

    Nothing of the write was stored; :class:`~journaled.events.journal.Journal` names the
    journal in the :class:`~journaled.events.errors.JournalBusy` it raises instead.
    """

    def __init__(self, waited: float) -> None:
        self.waited = waited
        super().__init__(f"waited {waited:.3g}s for the journal's write lock")


class Unreached(Exception):
    """Raised by a recorder when the database stayed unreachable through an append's retries.

    ``sent``: a call may have reached the server with no answer since, and no look at the log
    after it could be made: the append is stored whole or not at all, unknown which (ADR 0095).
    :class:`~journaled.events.journal.Journal` raises
    :class:`~journaled.events.errors.AppendOutcomeUnknown` or
    :class:`~journaled.events.errors.JournalUnavailable` instead, naming the journal.
    """

    def __init__(self, waited: float, sent: bool, cause: BaseException, *, busy: int = 0) -> None:
        self.waited = waited
        self.sent = sent
        self.busy = busy
        """The pool's size when each of its connections stayed in use: the database may be
        reachable, but this process had no connection free (0: not so)."""
        lines = str(cause).strip().splitlines() or [type(cause).__name__]
        self.detail = lines[0][:200]
        super().__init__(f"unreachable for {waited:.3g}s (sent: {sent}): {self.detail}")


OUTAGE_WAIT = 10.0
"""Seconds an append keeps trying to reach the database after its first dropped connection,
looking whether a call sent before the drop was stored (ADR 0095)."""


class SnapshotRefused(Exception):
    """Raised inside a snapshot's transaction to roll it back: an erasure came after its state."""


def erases(kwargs: dict[str, Any]) -> bool:
    """Tell whether an append deletes forgettable data, which leaves bytes to scrub."""
    return bool(kwargs.get("forget") or kwargs.get("drop_snapshots"))


def refused_after(kwargs: dict[str, Any]) -> tuple[int, tuple[str, ...]] | None:
    """Return a snapshot write's guard (position, topic prefixes), if it has one."""
    guard: tuple[int, tuple[str, ...]] | None = kwargs.get("refuse_after")
    return guard


class _MsgspecMapper(Mapper[str]):
    """Store our events as ``<tag>@<version>`` topics with msgpack payloads.

    The released mapper copies events through ``__dict__``, which slotted msgspec Structs lack; it
    also stores ``module:qualname`` topics, which would tie old journals to class locations.
    """

    def __init__(self, codec: Codec) -> None:
        super().__init__(transcoder=JSONTranscoder())
        self.codec = codec

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        """Convert a :class:`Pending` event into the library's stored form."""
        pending: Pending = domain_event
        return StoredEvent(
            originator_id=pending.stream,
            originator_version=pending.version,
            topic=self.codec.topic(pending.data),
            state=self.codec.encode(pending.data),
        )

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        """Decode a stored event's payload (position unknown on this path)."""
        return self.codec.decode(stored_event.topic, stored_event.state)


def content_key(stream: str, version: int) -> str:
    """Return the side-table key of a content event's payload: ``<stream>@<version>``."""
    return f"{stream}@{version}"
