"""The SQLite recorder: one INSERT per append, payloads, snapshots, secure deletes."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from eventsourcing.persistence import (
    StoredEvent,
)
from eventsourcing.sqlite import (
    SQLiteApplicationRecorder,
    SQLiteConnection,
    SQLiteConnectionPool,
    SQLiteCursor,
    SQLiteFactory,
)
from eventsourcing.utils import Environment

from journaled.events.journal._common import (
    _ROWS_PER_INSERT,
    PAYLOAD_TABLE,
    SCRUB_TABLE,
    SNAPSHOT_TABLE,
    Row,
    SnapshotRefused,
    erases,
    refused_after,
)


class _Pool(SQLiteConnectionPool):
    """Connections that erase deleted bytes and commit with the configured durability."""

    synchronous = "NORMAL"

    def _create_connection(self) -> SQLiteConnection:
        connection = super()._create_connection()
        raw: sqlite3.Connection = connection._sqlite_conn
        raw.execute("PRAGMA secure_delete=ON")
        raw.execute(f"PRAGMA synchronous={self.synchronous}")
        return connection


class _FullPool(_Pool):
    synchronous = "FULL"


class _SQLiteRecorder(SQLiteApplicationRecorder):
    """The library's recorder, plus forgettable payloads and one INSERT per append."""

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

    def _insert_events(
        self, c: SQLiteCursor, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        guard = refused_after(kwargs)
        if guard is not None:
            # Take the write lock first (deleting the rows about to be replaced), so no purge
            # can commit between the check and the write; a read first would fail the write
            # instead ("database is locked") whenever one did.
            c.executemany(
                f"DELETE FROM {SNAPSHOT_TABLE} WHERE stream = ?",  # noqa: S608
                [(k,) for k in kwargs.get("snapshots") or {}],
            )
            after, prefixes = guard
            sql = f"SELECT 1 FROM {self.events_table_name} WHERE rowid > ? AND ("  # noqa: S608
            sql += " OR ".join(["substr(topic, 1, ?) = ?"] * len(prefixes)) + ") LIMIT 1"
            params: list[Any] = [after]
            for prefix in prefixes:
                params += [len(prefix), prefix]
            c.execute(sql, params)
            if c.fetchone() is not None:
                raise SnapshotRefused
        positions: list[int] = []
        for start in range(0, len(stored_events), _ROWS_PER_INSERT):
            chunk = stored_events[start : start + _ROWS_PER_INSERT]
            values_params: list[Any] = []
            for s in chunk:
                values_params += (s.originator_id, s.originator_version, s.topic, s.state)
            values = ",".join(["(?,?,?,?)"] * len(chunk))
            c.execute(f"INSERT INTO {self.events_table_name} VALUES {values}", values_params)  # noqa: S608
            last = int(c.lastrowid)
            positions.extend(range(last - len(chunk) + 1, last + 1))
        payloads: Mapping[str, bytes] = kwargs.get("payloads") or {}
        if payloads:
            c.executemany(
                f"INSERT OR REPLACE INTO {PAYLOAD_TABLE} VALUES (?, ?)",  # noqa: S608
                list(payloads.items()),
            )
        forget: Sequence[str] = kwargs.get("forget") or ()
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
        if topics:
            sql += f" AND topic IN ({','.join('?' * len(topics))})"
            params += list(topics)
        for prefix in skip_prefixes:
            sql += " AND substr(topic, 1, ?) != ?"
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
            c.execute(sql, params)
            return [tuple(row) for row in c.fetchall()]

    def select_payloads(self, streams: Sequence[str] | None) -> dict[str, bytes]:
        """Return the payloads of the given streams (every payload when None)."""
        with self.datastore.transaction(commit=False) as c:
            if streams is None:
                c.execute(f"SELECT stream, payload FROM {PAYLOAD_TABLE}")  # noqa: S608
                return {row[0]: bytes(row[1]) for row in c.fetchall()}
            found: dict[str, bytes] = {}
            wanted = list(streams)
            for start in range(0, len(wanted), _ROWS_PER_INSERT):
                chunk = wanted[start : start + _ROWS_PER_INSERT]
                marks = ",".join("?" * len(chunk))
                c.execute(
                    f"SELECT stream, payload FROM {PAYLOAD_TABLE} WHERE stream IN ({marks})",  # noqa: S608
                    chunk,
                )
                found.update((row[0], bytes(row[1])) for row in c.fetchall())
            return found


class _SQLiteFactory(SQLiteFactory):
    application_recorder_class = _SQLiteRecorder

    def __init__(self, env: Environment | Any) -> None:
        super().__init__(env)
        pool_class = _FullPool if self.env.get("JOURNALED_DURABILITY") == "full" else _Pool
        stock = self.datastore.pool
        self.datastore.pool = pool_class(
            db_name=stock.db_name, lock_timeout=stock.lock_timeout, pool_size=5, max_overflow=10
        )
        stock.close()


# -- PostgreSQL ----------------------------------------------------------------------------------
