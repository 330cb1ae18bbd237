"""The SQLite recorder: one INSERT per append, payloads, snapshots, secure deletes."""

from __future__ import annotations

import sqlite3
import sqlite3 as _driver  # the pool's own name: tests stand in for ``sqlite3`` in DDL
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from eventsourcing.persistence import (
    ConnectionPoolClosedError,
    ConnectionUnavailableError,
    InterfaceError,
    OperationalError,
    StoredEvent,
)
from eventsourcing.sqlite import (
    SQLiteApplicationRecorder,
    SQLiteConnection,
    SQLiteConnectionPool,
    SQLiteCursor,
    SQLiteFactory,
    SQLiteTransaction,
)
from eventsourcing.utils import Environment

from journaled.events.journal._common import (
    _ROWS_PER_INSERT,
    PAYLOAD_TABLE,
    SCRUB_TABLE,
    SNAPSHOT_TABLE,
    SUBSCRIPTION_TABLE,
    LockWaitExpired,
    Row,
    SnapshotRefused,
    content_key,
    erases,
    refused_after,
)
from journaled.events.journal._digest import DigestRow, chain, payload_hash
from journaled.events.url import DEFAULT_LOCK_WAIT

_CHAIN_COLUMNS = {
    "chain_first": "INTEGER",
    "chain_prev": "INTEGER",
    "chain_hashes": "BLOB",
    "chain_entries": "BLOB",
    "chain_digest": "BLOB",
}
"""The digest record of a commit (R7), kept in the commit's last event row: a side table would
cost one more B-tree page per commit (about a third of a small commit's time), a column nothing."""


STATEMENT_CACHE = 64
"""Prepared statements each connection keeps: an append uses a handful (BEGIN, one INSERT per
row count, the payload and snapshot writes), reads a few more."""


def _integer(column: str) -> str:
    """Select an integer column for verification: any other stored type reads as -1 (R7).

    SQLite keeps whatever type a raw ``UPDATE`` writes; -1 is never a valid position or version,
    so the row is then reported as altered instead of failing the check with a ``TypeError``.
    """
    return f"CASE WHEN typeof({column}) IN ('integer', 'null') THEN {column} ELSE -1 END"


_BUSY_SLACK_MS = 50
"""How far the append connection's busy timeout may differ from the time an append has left
before it is set again: an append that waited longer than this for the pool's own lock waits
that much less in SQLite's busy handler, and the common case runs no extra statement."""


def busy(exc: BaseException) -> bool:
    """Tell whether an error is SQLite's "database is locked": its busy handler gave up."""
    for error in (exc, exc.__cause__, exc.__context__):
        if (
            isinstance(error, sqlite3.OperationalError)
            and getattr(error, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY
        ):
            return True
    return False


_CLOSE_POLL = 0.05
"""Seconds a writer waiting for the pool's write lock sleeps between looks at a close."""


class _WriteLock:
    """The pool's write lock, whose waits give up once the journal begins to close.

    Every writer of the pool waits for it: appends (:meth:`_Pool.writer`) and the library's
    own writes (a subscription's acknowledgement, the scrub mark). One still waiting when the
    journal closes raises :class:`ConnectionPoolClosedError` (the journal's JournalClosed)
    instead of holding the close up behind the writes before it (ADR 0080).
    """

    __slots__ = ("_lock", "_owner", "closing")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        """The thread holding the lock: a close on it (a signal handler's) must not wait."""
        self.closing = False

    def acquire(self, blocking: bool = True, timeout: float | None = -1) -> bool:
        """Take the lock as :meth:`threading.Lock.acquire` does, giving up on a close.

        Raises:
            ConnectionPoolClosedError: the journal began to close while this waited.
        """
        if not self._take(blocking, timeout):
            return False
        self._owner = threading.get_ident()
        return True

    def _take(self, blocking: bool, timeout: float | None) -> bool:
        if self._lock.acquire(blocking=False):
            return True
        if not blocking:
            return False
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        while True:
            if self.closing:
                raise ConnectionPoolClosedError
            left = _CLOSE_POLL if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return False
            if self._lock.acquire(timeout=min(left, _CLOSE_POLL)):
                return True

    def release(self) -> None:
        self._owner = None
        self._lock.release()

    def held_here(self) -> bool:
        """Whether the calling thread holds the lock (its call is suspended under a handler)."""
        return self._owner == threading.get_ident()

    def wait_and_take(self) -> None:
        """Take the lock whatever closes: the pool's own close waits for the writer."""
        self._lock.acquire()
        self._owner = threading.get_ident()


class _Pool(SQLiteConnectionPool):
    """Connections that erase deleted bytes and commit with the configured durability."""

    synchronous = "NORMAL"
    lock_wait: float = DEFAULT_LOCK_WAIT
    """Seconds a connection waits for the file's write lock held by another connection (its
    busy timeout), and an append for the pool's own write lock: ``JournalConfig.lock_wait``."""
    _writer_busy_ms = 0
    """The append connection's busy timeout as last set, in milliseconds."""

    def _create_connection(self) -> SQLiteConnection:
        # As the library's (eventsourcing 9.5.6, sqlite.py), but with a statement cache: its
        # connections keep one prepared statement (``cached_statements=True``), so an append's
        # BEGIN and INSERT evicted each other and every append parsed its SQL again (ADR 0036).
        try:
            raw = _driver.connect(
                database=self.db_name,
                uri=True,
                check_same_thread=False,
                isolation_level=None,
                cached_statements=STATEMENT_CACHE,
                timeout=self.lock_wait,
            )
        except (sqlite3.Error, TypeError) as exc:
            raise InterfaceError(exc) from exc
        if not self.is_sqlite_memory_mode and not self.is_journal_mode_wal:
            mode = raw.execute("PRAGMA journal_mode").fetchone()[0]
            if mode.lower() != "wal":
                raw.execute("PRAGMA journal_mode=WAL")
                self.journal_mode_was_changed_to_wal = True
            self.is_journal_mode_wal = True
        raw.row_factory = _driver.Row
        raw.execute("PRAGMA secure_delete=ON")
        raw.execute(f"PRAGMA synchronous={self.synchronous}")
        return SQLiteConnection(sqlite_conn=raw, max_age=self.max_age)

    _writer: SQLiteConnection | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # ``_writer_lock`` is the library's (eventsourcing 9.5, pinned in pyproject.toml): the
        # lock every writer of this pool takes. Ours gives up waiting when the journal closes.
        self._writer_lock: Any = _WriteLock()

    @property
    def closing(self) -> bool:
        """Whether the journal began to close: writers still waiting for the lock give up."""
        return bool(self._writer_lock.closing)

    @closing.setter
    def closing(self, value: bool) -> None:
        self._writer_lock.closing = value

    def writer(self, timeout: float | None = None) -> SQLiteConnection:
        """Take the pool's write lock and return its one connection for appends.

        The library checks a connection out per transaction (a semaphore, a reader/writer
        interlock, a condition, bookkeeping for a pool of five): about a quarter of an append's
        Python time. Appends take the same write lock as the pool's own writers, so they still
        take turns with them in this process; the caller releases it with :meth:`release_writer`.

        Raises:
            ConnectionUnavailableError: the write lock was not free within the pool's timeout.
            ConnectionPoolClosedError: the pool is closed.
        """
        wait = self.pool_timeout if timeout is None else timeout
        if not self._writer_lock.acquire(timeout=wait):
            raise ConnectionUnavailableError("Timed out waiting for return of writer")
        try:
            if self._closed or self.closing:
                raise ConnectionPoolClosedError
            if self._writer is None:
                self._writer = self._create_connection()
                self._writer_busy_ms = round(self.lock_wait * 1000)
        except BaseException:
            self._writer_lock.release()
            raise
        return self._writer

    def bound_busy(self, conn: SQLiteConnection, left: float) -> None:
        """Let the append connection wait at most ``left`` seconds more for the file's lock.

        Set only when it differs by more than :data:`_BUSY_SLACK_MS` from the last setting: an
        append that took the pool's lock at once keeps the connection's timeout as it is.
        """
        wanted = max(0, int(left * 1000))
        if abs(wanted - self._writer_busy_ms) > _BUSY_SLACK_MS:
            conn.cursor().execute(f"PRAGMA busy_timeout = {wanted}")
            self._writer_busy_ms = wanted

    def release_writer(self) -> None:
        """Give the write lock taken by :meth:`writer` back."""
        self._writer_lock.release()

    def close(self) -> None:
        """Close the pooled connections and the append connection.

        It waits for a writer of another thread to finish; a write of the closing thread itself
        (a signal handler's close, landing in it) is not waited for, which would never end: its
        connection is closed under it, and it fails with the journal's JournalClosed.
        """
        super().close()
        lock = self._writer_lock
        mine = lock.held_here()
        if not mine:
            lock.wait_and_take()
        try:
            writer, self._writer = self._writer, None
        finally:
            if not mine:
                lock.release()
        if writer is not None:
            writer.close()


class _FullPool(_Pool):
    synchronous = "FULL"


_RANGE_FROM = 32
"""Side rows wanted from one stream from which a range read beats a list of keys."""
_SPAN_SLACK = 4
"""A range of payload keys is read whole when it holds at most this many rows per key wanted."""


class _SQLiteRecorder(SQLiteApplicationRecorder):
    """The library's recorder, plus forgettable payloads and one INSERT per append."""

    chained = True
    """Extend the digest chain on append (R7); off only to measure its cost (bench/journal.py)
    and on an old journal that could not be given the digest columns."""
    _columns = True
    """The events table has the digest columns."""
    _head: tuple[int, bytes] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._inserts: dict[tuple[int, bool], str] = {}
        """INSERT statements by (rows, digest columns): the text is the statement cache's key."""

    def construct_create_table_statements(self) -> list[str]:
        """Return the library's events table and our payload table."""
        return [
            *super().construct_create_table_statements(),
            f"CREATE TABLE IF NOT EXISTS {PAYLOAD_TABLE} "
            "(stream TEXT PRIMARY KEY, payload BLOB NOT NULL) WITHOUT ROWID",
            f"CREATE TABLE IF NOT EXISTS {SNAPSHOT_TABLE} "
            "(stream TEXT PRIMARY KEY, version INTEGER NOT NULL, state BLOB NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {SCRUB_TABLE} (id INTEGER PRIMARY KEY CHECK (id = 1), "
            "erased INTEGER NOT NULL, scrubbed INTEGER NOT NULL)",
        ]

    def create_table(self) -> None:
        """Create the tables, then add the digest columns a journal of an older release lacks.

        ``ALTER TABLE ... ADD COLUMN`` only changes the schema (no row is rewritten); it runs in
        an immediate transaction of its own so that processes opening an old journal at once
        take turns, and the second finds the columns there. A journal that cannot be written
        still opens: it is read without a chain (and an append fails as it would anyway). One
        whose lock another connection holds for longer than ``lock_wait`` does not open.

        Raises:
            LockWaitExpired: another connection held the write lock for ``lock_wait``.
        """
        pool = self.datastore.pool
        wait = pool.lock_wait if isinstance(pool, _Pool) else DEFAULT_LOCK_WAIT
        started = time.monotonic()
        try:
            super().create_table()
        except OperationalError as exc:
            if busy(exc):
                raise LockWaitExpired(time.monotonic() - started) from exc
            raise
        conn = sqlite3.connect(pool.db_name, uri=True, timeout=wait, isolation_level=None)
        table = self.events_table_name

        def missing() -> list[str]:
            have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            return [name for name in _CHAIN_COLUMNS if name not in have]

        try:
            if missing():
                conn.execute("BEGIN IMMEDIATE")
                for name in missing():
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {_CHAIN_COLUMNS[name]}")
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if busy(exc):  # it can be written, only not now: never go on without a chain
                raise LockWaitExpired(time.monotonic() - started) from exc
            self.chained = self._columns = False
        finally:
            conn.close()

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """Append as the library does; remember the chain's head only once the commit is made.

        A head remembered before the commit would outlive a rollback: another writer could fill
        the positions given back, and the next append, finding its predicted positions right,
        would chain to a digest that was never committed (R7).

        The wait for the write lock (this process's, then the file's) is bounded by the pool's
        ``lock_wait``, or by a ``lock_wait`` keyword when the caller has less time left.

        Raises:
            LockWaitExpired: the lock stayed taken for the whole wait; nothing was stored.
        """
        head: list[tuple[int, bytes]] = []
        pool = self.datastore.pool
        wait: float | None = kwargs.pop("lock_wait", None)
        if isinstance(pool, _Pool) and not pool.is_sqlite_memory_mode:
            wait = pool.lock_wait if wait is None else wait
            started = time.monotonic()
            try:
                conn = pool.writer(wait)
            except ConnectionUnavailableError:  # another thread of this process kept it
                raise LockWaitExpired(time.monotonic() - started) from None
            try:
                raw = conn._sqlite_conn  # the library's (eventsourcing 9.5, pinned)
                if raw.in_transaction:
                    # An append interrupted between its BEGIN and its end (a KeyboardInterrupt
                    # lands between any two bytecodes of the main thread) left it open: what it
                    # held was never committed, and every BEGIN after it would fail.
                    raw.rollback()
                # What the pool's lock took comes off SQLite's wait for the file's lock.
                pool.bound_busy(conn, wait - (time.monotonic() - started))
                # As SQLiteConnection.transaction does, without its generator's frames.
                with SQLiteTransaction(conn, commit=True) as c, c:
                    positions = self._insert_events(c, stored_events, **kwargs, head=head)
            except OperationalError as exc:
                if busy(exc):  # rolled back: nothing of this append is stored
                    raise LockWaitExpired(time.monotonic() - started) from exc
                raise
            except BaseException:
                # Interrupted where the library's transaction cannot roll back (in its enter,
                # or in its exit before the commit): roll back here, so the file's write lock
                # is not held until this connection's next append.
                if conn._sqlite_conn.in_transaction:
                    conn._sqlite_conn.rollback()
                raise
            finally:
                pool.release_writer()
        else:
            positions = super().insert_events(stored_events, **kwargs, head=head)
        if head:
            self._head = head[0]
        return positions

    def _insert_events(
        self, c: SQLiteCursor, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        guard = refused_after(kwargs)
        if guard is not None:
            # Take the write lock first (deleting the rows about to be replaced), so no purge
            # can commit between the check and the write; a read first would fail the write
            # instead ("database is locked") whenever one did.
            replaced = [(k,) for k in kwargs.get("snapshots") or {}]
            if replaced:
                c.executemany(
                    f"DELETE FROM {SNAPSHOT_TABLE} WHERE stream = ?",  # noqa: S608
                    replaced,
                )
            else:  # a guarded append of events alone: a write that matches nothing takes it
                c.execute(f"DELETE FROM {SNAPSHOT_TABLE} WHERE 0")  # noqa: S608
            after, prefixes = guard
            sql = f"SELECT 1 FROM {self.events_table_name} WHERE rowid > ? AND ("  # noqa: S608
            sql += " OR ".join(["substr(topic, 1, ?) = ?"] * len(prefixes)) + ") LIMIT 1"
            guard_params: list[Any] = [after]
            for prefix in prefixes:
                guard_params += [len(prefix), prefix]
            c.execute(sql, guard_params)
            if c.fetchone() is not None:
                raise SnapshotRefused
        payloads: Mapping[str, bytes] = kwargs.get("payloads") or {}
        forget: Sequence[str] = kwargs.get("forget") or ()
        head = self._head
        record: DigestRow | None = None
        if stored_events and self.chained and head is not None:
            # SQLite gives positions out one after the other: this append will most likely start
            # right after this recorder's own last one; checked below, once the positions are known.
            first = head[0] + 1
            record = self._record(
                head, range(first, first + len(stored_events)), stored_events, payloads, forget
            )
        positions: list[int] = []
        blank = (None,) * len(_CHAIN_COLUMNS) if self._columns else ()
        for start in range(0, len(stored_events), _ROWS_PER_INSERT):
            chunk = stored_events[start : start + _ROWS_PER_INSERT]
            params: list[Any] = []
            for s in chunk:
                params += (s.originator_id, s.originator_version, s.topic, s.state, *blank)
            if record is not None and start + len(chunk) == len(stored_events):
                params[-len(_CHAIN_COLUMNS) :] = record[1:]
            c.execute(self._insert_sql(len(chunk)), params)
            last = int(c.lastrowid)
            positions.extend(range(last - len(chunk) + 1, last + 1))
        if stored_events and self.chained:
            if record is None or record[0] != positions[-1]:
                record = self._rechain(c, positions, stored_events, payloads, forget)
            holder: list[tuple[int, bytes]] | None = kwargs.get("head")
            if holder is not None:  # published by insert_events once committed
                holder[:] = [(record[0], record[5])]
        if len(payloads) == 1:  # a remember's one text: no executemany around a single row
            c.execute(
                f"INSERT OR REPLACE INTO {PAYLOAD_TABLE} VALUES (?, ?)",  # noqa: S608
                next(iter(payloads.items())),
            )
        elif payloads:
            c.executemany(
                f"INSERT OR REPLACE INTO {PAYLOAD_TABLE} VALUES (?, ?)",  # noqa: S608
                list(payloads.items()),
            )
        if forget:
            c.executemany(
                f"DELETE FROM {PAYLOAD_TABLE} WHERE stream = ?",  # noqa: S608
                [(s,) for s in forget],
            )
        dropped: str | None = kwargs.get("drop_snapshots")
        if dropped:
            c.execute(
                f"DELETE FROM {SNAPSHOT_TABLE} WHERE substr(stream, 1, ?) = ?",  # noqa: S608
                [len(dropped), dropped],
            )
        snapshots: Mapping[str, tuple[int, bytes]] = kwargs.get("snapshots") or {}
        if snapshots:
            c.executemany(
                f"INSERT OR REPLACE INTO {SNAPSHOT_TABLE} VALUES (?, ?, ?)",  # noqa: S608
                [(k, v, b) for k, (v, b) in snapshots.items()],
            )
        if erases(kwargs):
            # The scrub this erasure owes, durable with it: a crash before the scrub leaves it.
            c.execute(
                f"INSERT INTO {SCRUB_TABLE} VALUES (1, 1, 0) "  # noqa: S608
                "ON CONFLICT (id) DO UPDATE SET erased = erased + 1"
            )
        return positions

    def _insert_sql(self, rows: int) -> str:
        """Return the INSERT of ``rows`` events, built once per row count and column set."""
        key = (rows, self._columns)
        sql = self._inserts.get(key)
        if sql is None:
            columns = ", ".join(["state", *_CHAIN_COLUMNS] if self._columns else ["state"])
            marks = "(" + ",".join("?" * (4 + (len(_CHAIN_COLUMNS) if self._columns else 0))) + ")"
            sql = (
                f"INSERT INTO {self.events_table_name} (originator_id, originator_version, "  # noqa: S608
                f"topic, {columns}) VALUES {','.join([marks] * rows)}"
            )
            if len(self._inserts) < _ROWS_PER_INSERT:  # one per row count an append ever had
                self._inserts[key] = sql
        return sql

    @staticmethod
    def _record(
        head: tuple[int, bytes] | None,
        positions: Sequence[int],
        stored_events: Sequence[StoredEvent],
        payloads: Mapping[str, bytes],
        forget: Sequence[str],
    ) -> DigestRow:
        events = [
            (str(s.originator_id), s.originator_version, s.topic, s.state) for s in stored_events
        ]
        [record] = chain(head, positions, events, payloads, forget)  # SQLite's are consecutive
        return record

    def _rechain(
        self,
        c: SQLiteCursor,
        positions: Sequence[int],
        stored_events: Sequence[StoredEvent],
        payloads: Mapping[str, bytes],
        forget: Sequence[str],
    ) -> DigestRow:
        """Chain an append whose head was not known: first of this recorder, or another wrote.

        Runs after the INSERT, which holds the file's write lock, so the head read here is the
        last commit's for good.
        """
        c.execute(
            f"SELECT rowid, chain_digest FROM {self.events_table_name} "  # noqa: S608
            "WHERE rowid < ? AND chain_digest IS NOT NULL ORDER BY rowid DESC LIMIT 1",
            [positions[0]],
        )
        found = c.fetchone()
        head = (int(found[0]), bytes(found[1])) if found else None
        record = self._record(head, positions, stored_events, payloads, forget)
        c.execute(
            f"UPDATE {self.events_table_name} SET chain_first = ?, chain_prev = ?, "  # noqa: S608
            "chain_hashes = ?, chain_entries = ?, chain_digest = ? WHERE rowid = ?",
            [*record[1:], record[0]],
        )
        return record

    def select_raw(self, after: int, upto: int, limit: int) -> list[Row]:
        """Return rows as stored bytes, even when a column was rewritten as invalid text (R7)."""
        with self.datastore.transaction(commit=False) as c:
            c.execute(
                f"SELECT rowid, CAST(originator_id AS BLOB), {_integer('originator_version')}, "  # noqa: S608
                f"CAST(topic AS BLOB), CAST(state AS BLOB) FROM {self.events_table_name} "
                "WHERE rowid > ? AND rowid <= ? ORDER BY rowid LIMIT ?",
                [after, upto, limit],
            )
            return [
                (
                    int(r[0]),
                    bytes(r[1] or b"").decode("utf-8", "replace"),
                    int(r[2]),
                    bytes(r[3] or b"").decode("utf-8", "replace"),
                    bytes(r[4] or b""),
                )
                for r in c.fetchall()
            ]

    def select_digests(self, after: int, upto: int, limit: int) -> list[DigestRow]:
        """Return digest records after a position, up to another, in order (R7)."""
        if not self._columns:
            return []
        with self.datastore.transaction(commit=False) as c:
            c.execute(
                f"SELECT rowid, {_integer('chain_first')}, {_integer('chain_prev')}, "  # noqa: S608
                "CAST(chain_hashes AS BLOB), CAST(chain_entries AS BLOB), "
                f"CAST(chain_digest AS BLOB) FROM {self.events_table_name} "
                "WHERE rowid > ? AND rowid <= ? AND chain_digest IS NOT NULL "
                "ORDER BY rowid LIMIT ?",
                [after, upto, limit],
            )
            return [
                (
                    int(r[0]),
                    int(r[1] or 0),
                    None if r[2] is None else int(r[2]),
                    bytes(r[3] or b""),
                    None if r[4] is None else bytes(r[4]),
                    bytes(r[5]),
                )
                for r in c.fetchall()
            ]

    def select_digest_state(self) -> tuple[int, dict[str, bytes]]:
        """Return, from one snapshot, the last position and each payload's hash (R7).

        Payloads are hashed one row at a time, so a journal of large payloads is checked without
        holding their bytes.
        """
        with self.datastore.transaction(commit=False) as c:
            c.execute(f"SELECT max(rowid) FROM {self.events_table_name}")  # noqa: S608
            upto = int(c.fetchone()[0] or 0)
            c.execute(f"SELECT stream, CAST(payload AS BLOB) FROM {PAYLOAD_TABLE}")  # noqa: S608
            hashes: dict[str, bytes] = {}
            while row := c.fetchone():
                hashes[str(row[0])] = payload_hash(str(row[0]), bytes(row[1]))
            return upto, hashes

    def select_scrub_marks(self) -> tuple[int, int]:
        """Return (erasures committed, erasures scrubbed from the files) so far."""
        with self.datastore.transaction(commit=False) as c:
            c.execute(f"SELECT erased, scrubbed FROM {SCRUB_TABLE}")  # noqa: S608
            row = c.fetchone()
            return (int(row[0]), int(row[1])) if row is not None else (0, 0)

    def mark_scrubbed(self, erased: int) -> None:
        """Record that the first ``erased`` erasures are scrubbed from the files."""
        with self.datastore.transaction(commit=True) as c:
            c.execute(
                f"UPDATE {SCRUB_TABLE} SET scrubbed = max(scrubbed, ?) WHERE id = 1",  # noqa: S608
                [erased],
            )

    def select_snapshots(self) -> list[tuple[str, int, bytes]]:
        """Return every snapshot as (key, version, state), in key order (R7 checks them)."""
        with self.datastore.transaction(commit=False) as c:
            c.execute(f"SELECT stream, version, state FROM {SNAPSHOT_TABLE} ORDER BY stream")  # noqa: S608
            return [(str(r[0]), int(r[1]), bytes(r[2])) for r in c.fetchall()]

    def select_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        """Return a stream's snapshot (version, state), if one was written."""
        with self.datastore.transaction(commit=False) as c:
            c.execute(
                f"SELECT version, state FROM {SNAPSHOT_TABLE} WHERE stream = ?",  # noqa: S608
                [stream],
            )
            row = c.fetchone()
            return (int(row[0]), bytes(row[1])) if row is not None else None

    def select_rows(
        self,
        after: int,
        upto: int | None,
        limit: int,
        topics: Sequence[str] = (),
        skip_prefixes: Sequence[str] = (),
    ) -> list[Row]:
        """Return raw rows after a position (up to another, of some topics), in global order."""
        sql = (
            f"SELECT rowid, originator_id, originator_version, topic, state "  # noqa: S608
            f"FROM {self.events_table_name} WHERE rowid > ?"
        )
        params: list[Any] = [after]
        if upto is not None:
            sql += " AND rowid <= ?"
            params.append(upto)
        # A row whose topic is NULL (edited by hand) passes every filter, to fail its decode
        # naming its position (J5): compared, NULL is never true, and the row was left out.
        if topics:
            sql += f" AND (topic IN ({','.join('?' * len(topics))}) OR topic IS NULL)"
            params += list(topics)
        for prefix in skip_prefixes:
            sql += " AND (substr(topic, 1, ?) != ? OR topic IS NULL)"
            params += [len(prefix), prefix]
        sql += " ORDER BY rowid LIMIT ?"
        params.append(limit)
        with self.datastore.transaction(commit=False) as c:
            c.execute(sql, params)
            return [tuple(row) for row in c.fetchall()]

    def select_stream(
        self, stream: str, after_version: int, upto: int | None, limit: int | None
    ) -> list[Row]:
        """Return a stream's raw rows after a version (up to a position), oldest first."""
        sql = (
            f"SELECT rowid, originator_id, originator_version, topic, state "  # noqa: S608
            f"FROM {self.events_table_name} WHERE originator_id = ? AND originator_version > ?"
        )
        params: list[Any] = [stream, after_version]
        if upto is not None:
            sql += " AND rowid <= ?"
            params.append(upto)
        sql += " ORDER BY originator_version"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self.datastore.transaction(commit=False) as c:
            # Plain tuples straight from the driver: a Row object per row, then a tuple of it,
            # cost as much as the query itself on a long stream (time travel reads thousands).
            c.sqlite_cursor.row_factory = None
            c.execute(sql, params)
            rows: list[Row] = c.fetchall()
            return rows

    def create_subscription_table(self) -> None:
        """Create the named subscriptions' table if missing (A3; older journals lack it)."""
        with self.datastore.transaction(commit=True) as c:
            c.execute(
                f"CREATE TABLE IF NOT EXISTS {SUBSCRIPTION_TABLE} "
                "(name TEXT PRIMARY KEY, position INTEGER NOT NULL) WITHOUT ROWID"
            )

    def has_subscription_table(self) -> bool:
        """Tell whether the named subscriptions' table exists."""
        with self.datastore.transaction(commit=False) as c:
            c.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                [SUBSCRIPTION_TABLE],
            )
            return c.fetchone() is not None

    def select_subscriptions(self, name: str | None = None) -> list[tuple[str, int]]:
        """Return (name, acknowledged position) of one named subscription or all, by name."""
        sql = f"SELECT name, position FROM {SUBSCRIPTION_TABLE}"  # noqa: S608
        params: list[Any] = []
        if name is not None:
            sql += " WHERE name = ?"
            params.append(name)
        with self.datastore.transaction(commit=False) as c:
            c.execute(sql + " ORDER BY name", params)
            return [(str(r[0]), int(r[1])) for r in c.fetchall()]

    def advance_subscription(self, name: str, position: int) -> int:
        """Store a subscription's position unless it is behind the stored one; return the stored."""
        with self.datastore.transaction(commit=True) as c:
            c.execute(
                f"INSERT INTO {SUBSCRIPTION_TABLE} VALUES (?, ?) "  # noqa: S608
                "ON CONFLICT (name) DO UPDATE SET position = max(position, excluded.position)",
                [name, position],
            )
            c.execute(
                f"SELECT position FROM {SUBSCRIPTION_TABLE} WHERE name = ?",  # noqa: S608
                [name],
            )
            return int(c.fetchone()[0])

    def delete_subscription(self, name: str) -> bool:
        """Forget a named subscription's position; tell whether there was one."""
        with self.datastore.transaction(commit=True) as c:
            c.execute(f"DELETE FROM {SUBSCRIPTION_TABLE} WHERE name = ?", [name])  # noqa: S608
            c.execute("SELECT changes()")
            return int(c.fetchone()[0]) > 0

    def select_head(self, stream: str) -> tuple[int, str] | None:
        """Return the position and topic of a stream's first event (its state unread)."""
        with self.datastore.transaction(commit=False) as c:
            c.sqlite_cursor.row_factory = None
            c.execute(
                f"SELECT rowid, topic FROM {self.events_table_name} "  # noqa: S608
                "WHERE originator_id = ? ORDER BY originator_version LIMIT 1",
                [stream],
            )
            row = c.fetchone()
        return None if row is None else (int(row[0]), row[1])  # the topic as stored

    def select_firsts(self, streams: Sequence[str]) -> list[Row]:
        """Return the first event's row of each of these streams that has one (any order)."""
        rows: list[Row] = []
        wanted = list(dict.fromkeys(streams))
        with self.datastore.transaction(commit=False) as c:
            c.sqlite_cursor.row_factory = None
            for start in range(0, len(wanted), _ROWS_PER_INSERT):
                chunk = wanted[start : start + _ROWS_PER_INSERT]
                c.execute(
                    f"SELECT rowid, originator_id, originator_version, topic, state "  # noqa: S608
                    f"FROM {self.events_table_name} WHERE originator_version = 1 "
                    f"AND originator_id IN ({','.join('?' * len(chunk))})",
                    chunk,
                )
                rows += c.fetchall()
        return rows

    def select_content(self, stream: str, versions: Sequence[int]) -> dict[int, bytes]:
        """Return the side rows of these versions of one stream, by version.

        Many are read as one range of the table's key, ``<stream>@`` up to ``<stream>A`` (text
        compares bytewise here), and kept when wanted: one statement in place of an ``IN`` list
        per 500 keys, each parsed afresh. Few are looked up by their keys.
        """
        if len(versions) < _RANGE_FROM:
            found = self.select_payloads([content_key(stream, v) for v in versions])
            return {int(k.rpartition("@")[2]): v for k, v in found.items()}
        wanted = set(versions)
        start = len(stream) + 1
        with self.datastore.transaction(commit=False) as c:
            c.execute(
                f"SELECT stream, payload FROM {PAYLOAD_TABLE} "  # noqa: S608
                "WHERE stream >= ? AND stream < ?",
                [f"{stream}@", f"{stream}A"],
            )
            out: dict[int, bytes] = {}
            for key, payload in c.fetchall():
                suffix = key[start:]
                # Another stream's id may begin with "<stream>@": its keys hold another "@".
                if suffix.isascii() and suffix.isdigit() and int(suffix) in wanted:
                    out[int(suffix)] = bytes(payload)
            return out

    _utf8: bool | None = None
    """Whether the file stores text as UTF-8 (asked once): the one encoding whose bytewise
    order, SQLite's for text, is the order Python sorts strings in."""

    def _sorts_as_python(self, c: Any) -> bool:
        """Tell whether a range of text keys holds what Python sorts between its ends."""
        if self._utf8 is None:
            c.execute("PRAGMA encoding")
            self._utf8 = str(c.fetchone()[0]).upper() == "UTF-8"
        return self._utf8

    def select_payloads(self, streams: Sequence[str] | None) -> dict[str, bytes]:
        """Return the payloads of the given streams (every payload when None).

        Keys are looked up 500 at a time, sorted: each 500 first as one range of the table's
        key (text compares bytewise, which sorts as Python does in a UTF-8 file; a file of
        another encoding looks every key up), read whole when it holds at most
        :data:`_SPAN_SLACK` times as many rows as it has keys, which is one ordered scan in
        place of 500 lookups (a memory snapshot's check reads every fact's text, ADR 0058);
        a range with more rows than that, by their keys.
        """
        with self.datastore.transaction(commit=False) as c:
            c.sqlite_cursor.row_factory = None  # plain tuples (ADR 0034's update)
            if streams is None:
                c.execute(f"SELECT stream, payload FROM {PAYLOAD_TABLE}")  # noqa: S608
                return dict(c.fetchall())
            found: dict[str, bytes] = {}
            wanted = sorted(set(streams))
            ranges = len(wanted) >= _RANGE_FROM and self._sorts_as_python(c)
            for start in range(0, len(wanted), _ROWS_PER_INSERT):
                chunk = wanted[start : start + _ROWS_PER_INSERT]
                if ranges and len(chunk) >= _RANGE_FROM:
                    limit = _SPAN_SLACK * len(chunk)
                    c.execute(
                        f"SELECT stream, payload FROM {PAYLOAD_TABLE} "  # noqa: S608
                        "WHERE stream >= ? AND stream <= ? ORDER BY stream LIMIT ?",
                        [chunk[0], chunk[-1], limit + 1],
                    )
                    rows: list[tuple[str, bytes]] = c.fetchall()
                    if len(rows) <= limit:
                        keys = set(chunk)
                        found.update(row for row in rows if row[0] in keys)
                        continue
                marks = ",".join("?" * len(chunk))
                c.execute(
                    f"SELECT stream, payload FROM {PAYLOAD_TABLE} WHERE stream IN ({marks})",  # noqa: S608
                    chunk,
                )
                found.update(c.fetchall())
            return found


class _SQLiteFactory(SQLiteFactory):
    application_recorder_class = _SQLiteRecorder

    def __init__(self, env: Environment | Any) -> None:
        super().__init__(env)
        pool_class = _FullPool if self.env.get("JOURNALED_DURABILITY") == "full" else _Pool
        wait = float(self.env.get("JOURNALED_LOCK_WAIT") or DEFAULT_LOCK_WAIT)
        stock = self.datastore.pool
        pool = pool_class(db_name=stock.db_name, pool_size=5, max_overflow=10)
        pool.lock_wait = wait
        self.datastore.pool = pool
        stock.close()


# -- PostgreSQL ----------------------------------------------------------------------------------
