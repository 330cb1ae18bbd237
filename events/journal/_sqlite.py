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
    SNAPSHOT_TABLE,
    Row,
)
from journaled.events.journal._digest import DIGEST_TABLE, DigestRow, chain


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

    chained = True
    """Extend the digest chain on append (R7); off only to measure its cost (bench/journal.py)."""
    _head: tuple[int, bytes] | None = None

    def construct_create_table_statements(self) -> list[str]:
        """Return the library's events table and our payload table."""
        return [
            *super().construct_create_table_statements(),
            f"CREATE TABLE IF NOT EXISTS {PAYLOAD_TABLE} "
            "(stream TEXT PRIMARY KEY, payload BLOB NOT NULL) WITHOUT ROWID",
            f"CREATE TABLE IF NOT EXISTS {SNAPSHOT_TABLE} "
            "(stream TEXT PRIMARY KEY, version INTEGER NOT NULL, state BLOB NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {DIGEST_TABLE} (position INTEGER PRIMARY KEY, "
            "first INTEGER NOT NULL, prev INTEGER, hashes BLOB NOT NULL, entries BLOB, "
            "digest BLOB NOT NULL)",
        ]

    def _insert_events(
        self, c: SQLiteCursor, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        positions: list[int] = []
        for start in range(0, len(stored_events), _ROWS_PER_INSERT):
            chunk = stored_events[start : start + _ROWS_PER_INSERT]
            params: list[Any] = []
            for s in chunk:
                params += (s.originator_id, s.originator_version, s.topic, s.state)
            values = ",".join(["(?,?,?,?)"] * len(chunk))
            c.execute(f"INSERT INTO {self.events_table_name} VALUES {values}", params)  # noqa: S608
            last = int(c.lastrowid)
            positions.extend(range(last - len(chunk) + 1, last + 1))
        payloads: Mapping[str, bytes] = kwargs.get("payloads") or {}
        if stored_events and self.chained:
            self._chain(c, positions, stored_events, payloads, kwargs.get("forget") or ())
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
        return positions

    def _chain(
        self,
        c: SQLiteCursor,
        positions: Sequence[int],
        stored_events: Sequence[StoredEvent],
        payloads: Mapping[str, bytes],
        forget: Sequence[str],
    ) -> None:
        """Extend the digest chain (R7); the INSERT above holds the file's write lock.

        The head (last position, digest) is remembered from this recorder's own last append:
        SQLite gives out positions one after the other, so if this append starts right after
        it, no other connection has appended since and the head need not be read again.
        """
        head = self._head
        if head is None or positions[0] != head[0] + 1:
            c.execute(f"SELECT position, digest FROM {DIGEST_TABLE} ORDER BY position DESC LIMIT 1")  # noqa: S608
            found = c.fetchone()
            head = (int(found[0]), bytes(found[1])) if found else None
        events = [
            (str(s.originator_id), s.originator_version, s.topic, s.state) for s in stored_events
        ]
        rows = chain(head, positions, events, payloads, forget)
        values = ",".join(["(?,?,?,?,?,?)"] * len(rows))
        c.execute(
            f"INSERT INTO {DIGEST_TABLE} (position, first, prev, hashes, entries, digest) "  # noqa: S608
            f"VALUES {values}",
            [v for row in rows for v in row],
        )
        self._head = (rows[-1][0], rows[-1][5])  # a rolled-back append fails the check above

    def select_raw(self, after: int, upto: int, limit: int) -> list[Row]:
        """Return rows as stored bytes, even when a column was rewritten as invalid text (R7)."""
        with self.datastore.transaction(commit=False) as c:
            c.execute(
                "SELECT rowid, CAST(originator_id AS BLOB), originator_version, "  # noqa: S608
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
        with self.datastore.transaction(commit=False) as c:
            c.execute(
                f"SELECT position, first, prev, hashes, entries, digest FROM {DIGEST_TABLE} "  # noqa: S608
                "WHERE position > ? AND position <= ? ORDER BY position LIMIT ?",
                [after, upto, limit],
            )
            return [
                (
                    int(r[0]),
                    int(r[1]),
                    None if r[2] is None else int(r[2]),
                    bytes(r[3]),
                    None if r[4] is None else bytes(r[4]),
                    bytes(r[5]),
                )
                for r in c.fetchall()
            ]

    def select_digest_state(self) -> tuple[int, dict[str, bytes]]:
        """Return, from one snapshot, the last position (events or digests) and payloads (R7)."""
        with self.datastore.transaction(commit=False) as c:
            c.execute(f"SELECT max(rowid) FROM {self.events_table_name}")  # noqa: S608
            upto = int(c.fetchone()[0] or 0)
            c.execute(f"SELECT max(position) FROM {DIGEST_TABLE}")  # noqa: S608
            upto = max(upto, int(c.fetchone()[0] or 0))
            c.execute(f"SELECT stream, payload FROM {PAYLOAD_TABLE}")  # noqa: S608
            return upto, {str(r[0]): bytes(r[1]) for r in c.fetchall()}

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
