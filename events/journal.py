"""The journal: one ordered log of events over the eventsourcing library (J1, J2, J4, J5).

This module is the only one that imports ``eventsourcing``. It builds one eventsourcing
``Application`` per journal, sealed against the process environment (its settings come from the
journal URL alone), with a mapper that stores our msgspec events, and recorder subclasses that add
two things the library lacks:

- *forgettable payloads*: a side table written in the same transaction as the events, holding data
  that may later have to be erased (a fact's text). Erasing deletes the row with SQLite's
  ``secure_delete`` on and truncates the write-ahead log, so the bytes leave the file (M10); on
  PostgreSQL it deletes the row, then rewrites the table (``VACUUM FULL``) once no snapshot can
  still see it;
- a snapshot table beside the log (ADR 0009), written in the same transactions;
- SQLite: one multi-row INSERT per append, and ``synchronous=NORMAL`` unless ``durability=full``;
- PostgreSQL: tables created by :func:`migrate` (idempotent, serialised by an advisory lock), never
  by the library's racy automatic DDL. Positions are the library's notification ids: they increase
  in commit order but have gaps (a failed insert consumes ids), so readers page by the last id.

PostgreSQL needs the ``postgres`` extra (``eventsourcing[postgres]``: psycopg and psycopg_pool).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from eventsourcing.application import Application
from eventsourcing.persistence import (
    IntegrityError,
    InterfaceError,
    JSONTranscoder,
    Mapper,
    OperationalError,
    PersistenceError,
    StoredEvent,
)
from eventsourcing.popo import POPOApplicationRecorder, POPOFactory
from eventsourcing.sqlite import (
    SQLiteApplicationRecorder,
    SQLiteConnection,
    SQLiteConnectionPool,
    SQLiteCursor,
    SQLiteFactory,
)
from eventsourcing.utils import Environment, get_topic

try:
    import psycopg
    from eventsourcing.postgres import (
        PostgresApplicationRecorder,
        PostgresDatastore,
        PostgresFactory,
    )
    from psycopg.rows import DictRow, tuple_row
except ImportError as _exc:  # the "postgres" extra is not installed
    _POSTGRES_MISSING: str | None = str(_exc)
else:
    _POSTGRES_MISSING = None

from events.base import DomainEvent, Event, Pending
from events.codec import Codec
from events.errors import ConcurrencyConflict, CorruptEvent, JournalClosed, JournalUrlError
from events.url import JournalConfig

PAYLOAD_TABLE = "journaled_payloads"
SNAPSHOT_TABLE = "journaled_snapshots"
Row = tuple[int, str, int, str, bytes]
"""A stored event as read: (position, stream, version, topic, payload)."""
_ROWS_PER_INSERT = 500  # 4 parameters a row stays far below SQLite's 32,766-variable limit
APP_NAME = "journaled"
EVENTS_TABLE_POSTGRES = f"{APP_NAME}_events"
"""PostgreSQL events table: the library names it after the application."""
_PG_EVENT_TYPE = "stored_event_text"  # the library's composite type for text originator ids
_PG_MIGRATE_LOCK = 0x6A6F75726E616C  # advisory lock key ("journal"), per database
_PG_CONNECT_TIMEOUT = 10  # seconds to establish one connection
_PG_MAX_OVERFLOW = 2  # connections opened beyond pool_size under load, closed when idle
_PG_ATTEMPTS = 3  # a read retried on a dropped connection
_SCRUB_WAIT = 50  # polls of 20 ms for readers to release old snapshots (about 1 s)


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
        self, after: int, upto: int | None, limit: int, topics: Sequence[str] = ()
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


def _pg_ddl() -> list[str]:
    """Return the journal's schema; the events table and type match the pinned library's own."""
    events = EVENTS_TABLE_POSTGRES
    return [
        f"CREATE TABLE IF NOT EXISTS public.{events} ("
        "originator_id text NOT NULL, "
        "originator_version bigint NOT NULL, "
        "topic text, "
        "state bytea, "
        "notification_id bigserial, "
        "PRIMARY KEY (originator_id, originator_version)) "
        "WITH (autovacuum_enabled = true, autovacuum_vacuum_threshold = 100000000, "
        "autovacuum_vacuum_scale_factor = 0.5, autovacuum_analyze_threshold = 1000, "
        "autovacuum_analyze_scale_factor = 0.01)",
        f"CREATE UNIQUE INDEX IF NOT EXISTS {events}_notification_id_idx "
        f"ON public.{events} (notification_id ASC)",
        f"CREATE TABLE IF NOT EXISTS public.{PAYLOAD_TABLE} "
        "(stream text PRIMARY KEY, payload bytea NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS public.{SNAPSHOT_TABLE} "
        "(stream text PRIMARY KEY, version bigint NOT NULL, state bytea NOT NULL)",
    ]


_OLDER_SNAPSHOTS = """
    WITH m AS (SELECT %(now)s::xid8 AS xid8, %(now)s::xid8::xid AS xid)
    SELECT (SELECT count(*) FROM m WHERE pg_snapshot_xmin(pg_current_snapshot()) <= m.xid8)
         + (SELECT count(*) FROM pg_stat_activity, m
            WHERE datname = current_database() AND pid <> pg_backend_pid()
            AND (age(backend_xmin) >= age(m.xid) OR age(backend_xid) >= age(m.xid)))
         + (SELECT count(*) FROM pg_replication_slots, m WHERE age(xmin) >= age(m.xid))
"""
"""Count what may keep rows deleted before transaction ``now`` from being removed: a transaction
that began before it, in any database (it holds back the horizon of every new snapshot, VACUUM
FULL's own included); an older snapshot of a session of this database; a replication slot."""


def _require_postgres() -> None:
    if _POSTGRES_MISSING is not None:
        raise JournalUrlError(
            "PostgreSQL journals need the postgres extra: pip install 'journaled[postgres]' "
            f"({_POSTGRES_MISSING})"
        )


def _hide(text: str, config: JournalConfig) -> str:
    """Remove the password from a message (libpq does not echo it; this makes sure)."""
    return text.replace(config.password, "***") if config.password else text


def _pg_connect(config: JournalConfig) -> psycopg.Connection[tuple[Any, ...]]:
    """Open one connection outside the pool, or raise a clear error without the password."""
    _require_postgres()
    try:
        return psycopg.connect(
            host=config.host,
            port=config.port,
            user=config.user,
            password=config.password or "",
            dbname=config.dbname,
            connect_timeout=_PG_CONNECT_TIMEOUT,
            application_name=APP_NAME,
        )
    except psycopg.Error as exc:
        reason = _hide(str(exc).strip(), config)
        raise JournalUrlError(
            f"cannot connect to the PostgreSQL journal {config.url}: {reason} (check the host, "
            "port, user, password and database name, and that the server accepts connections)"
        ) from None


def migrate(config: JournalConfig) -> None:
    """Create a PostgreSQL journal's tables, idempotently and safely under concurrency.

    One transaction holds a per-database advisory lock while it creates what is missing, so any
    number of processes may migrate at once: the library's automatic DDL, run unguarded by every
    process constructing an application, races ("tuple concurrently updated").

    Raises:
        JournalUrlError: the server cannot be reached or refuses the statements (no password in
            the message).
    """
    if config.backend != "postgresql":
        raise JournalUrlError(f"migrate() is for PostgreSQL journals, not {config.url}")
    with _pg_connect(config) as conn:
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", [_PG_MIGRATE_LOCK])
                found = conn.execute("SELECT to_regtype(%s)", [f"public.{_PG_EVENT_TYPE}"])
                row = found.fetchone()
                if row is None or row[0] is None:  # CREATE TYPE has no IF NOT EXISTS
                    conn.execute(
                        f"CREATE TYPE public.{_PG_EVENT_TYPE} AS (originator_id text, "
                        "originator_version bigint, topic text, state bytea)"
                    )
                for statement in _pg_ddl():
                    conn.execute(statement)
        except psycopg.Error as exc:
            raise JournalUrlError(
                f"cannot create the journal's tables in {config.url}: "
                f"{_hide(str(exc).strip(), config)}"
            ) from None


def _pg_exists(config: JournalConfig) -> bool:
    with _pg_connect(config) as conn:
        row = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL "
            "AND to_regclass(%s) IS NOT NULL",
            [
                f"public.{EVENTS_TABLE_POSTGRES}",
                f"public.{PAYLOAD_TABLE}",
                f"public.{SNAPSHOT_TABLE}",
            ],
        ).fetchone()
        return bool(row and row[0])


if _POSTGRES_MISSING is None:

    class _PostgresRecorder(PostgresApplicationRecorder):
        """The library's recorder, plus forgettable payloads, snapshots and raw reads.

        Every append takes the library's EXCLUSIVE lock on the events table, so writers are
        serialised and ids are issued in commit order; one that writes side rows (even snapshots
        alone, with no event) takes it before touching them, so two writers of side rows can never
        deadlock on each other's row locks.
        """

        datastore: Any
        """The library's :class:`PostgresDatastore`, declared ``Any`` so that code reaching
        through ``Journal._recorder.datastore`` for SQLite's cursors keeps one cursor type; this
        class uses the typed :attr:`_store`."""

        @property
        def _store(self) -> PostgresDatastore:
            store: PostgresDatastore = self.datastore
            return store

        def _insert_events(
            self, curs: psycopg.Cursor[DictRow], stored_events: Sequence[StoredEvent], **kwargs: Any
        ) -> None:
            payloads: Mapping[str, bytes] = kwargs.get("payloads") or {}
            forget: Sequence[str] = kwargs.get("forget") or ()
            dropped: str | None = kwargs.get("drop_snapshots")
            snapshots: Mapping[str, tuple[int, bytes]] = kwargs.get("snapshots") or {}
            if not (payloads or forget or dropped or snapshots):
                return
            self._lock_table(curs)
            if payloads:
                curs.execute(
                    f"INSERT INTO public.{PAYLOAD_TABLE} (stream, payload) "  # noqa: S608
                    "SELECT * FROM unnest(%s::text[], %s::bytea[]) "
                    "ON CONFLICT (stream) DO UPDATE SET payload = EXCLUDED.payload",
                    [list(payloads), list(payloads.values())],
                )
            if forget:
                curs.execute(
                    f"DELETE FROM public.{PAYLOAD_TABLE} WHERE stream = ANY(%s)",  # noqa: S608
                    [list(forget)],
                )
            if dropped:
                curs.execute(
                    f"DELETE FROM public.{SNAPSHOT_TABLE} WHERE starts_with(stream, %s)",  # noqa: S608
                    [dropped],
                )
            if snapshots:
                curs.execute(
                    f"INSERT INTO public.{SNAPSHOT_TABLE} (stream, version, state) "  # noqa: S608
                    "SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bytea[]) "
                    "ON CONFLICT (stream) DO UPDATE "
                    "SET version = EXCLUDED.version, state = EXCLUDED.state",
                    [
                        list(snapshots),
                        [v for v, _ in snapshots.values()],
                        [b for _, b in snapshots.values()],
                    ],
                )

        def _fetch(self, query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
            """Run one read on a pooled connection, retried if the connection was dropped."""
            for attempt in range(1, _PG_ATTEMPTS + 1):
                try:
                    with (
                        self._store.get_connection() as conn,
                        conn.cursor(row_factory=tuple_row) as curs,
                    ):
                        curs.execute(query, params)
                        return curs.fetchall()
                except (InterfaceError, OperationalError):
                    if attempt == _PG_ATTEMPTS:
                        raise
                    time.sleep(0.2 * attempt)
            raise AssertionError("unreachable")  # pragma: no cover

        def select_snapshot(self, stream: str) -> tuple[int, bytes] | None:
            """Return a stream's snapshot (version, state), if one was written."""
            rows = self._fetch(
                f"SELECT version, state FROM public.{SNAPSHOT_TABLE} WHERE stream = %s",  # noqa: S608
                [stream],
            )
            return (int(rows[0][0]), bytes(rows[0][1])) if rows else None

        def select_rows(
            self, after: int, upto: int | None, limit: int, topics: Sequence[str] = ()
        ) -> list[Row]:
            """Return raw rows after a position (up to another, of some topics), in order."""
            query = (
                "SELECT notification_id, originator_id, originator_version, topic, state "  # noqa: S608
                f"FROM public.{self.events_table_name} WHERE notification_id > %s"
            )
            params: list[Any] = [after]
            if upto is not None:
                query += " AND notification_id <= %s"
                params.append(upto)
            if topics:
                query += " AND topic = ANY(%s)"
                params.append(list(topics))
            query += " ORDER BY notification_id LIMIT %s"
            params.append(limit)
            return [_pg_row(r) for r in self._fetch(query, params)]

        def select_stream(
            self, stream: str, after_version: int, upto: int | None, limit: int | None
        ) -> list[Row]:
            """Return a stream's raw rows after a version (up to a position), oldest first."""
            query = (
                "SELECT notification_id, originator_id, originator_version, topic, state "  # noqa: S608
                f"FROM public.{self.events_table_name} "
                "WHERE originator_id = %s AND originator_version > %s"
            )
            params: list[Any] = [stream, after_version]
            if upto is not None:
                query += " AND notification_id <= %s"
                params.append(upto)
            query += " ORDER BY originator_version"
            if limit is not None:
                query += " LIMIT %s"
                params.append(limit)
            return [_pg_row(r) for r in self._fetch(query, params)]

        def select_payloads(self, streams: Sequence[str] | None) -> dict[str, bytes]:
            """Return the payloads of the given streams (every payload when None)."""
            if streams is None:
                rows = self._fetch(f"SELECT stream, payload FROM public.{PAYLOAD_TABLE}", [])  # noqa: S608
            else:
                rows = self._fetch(
                    f"SELECT stream, payload FROM public.{PAYLOAD_TABLE} "  # noqa: S608
                    "WHERE stream = ANY(%s)",
                    [list(streams)],
                )
            return {str(r[0]): bytes(r[1]) for r in rows}

        def erase(self) -> None:
            """Rewrite the payload and snapshot tables so deleted rows leave the database files.

            A deleted row stays on its page as a dead tuple, readable from the data files, until
            vacuumed; and a plain ``VACUUM`` only marks its space free without zeroing it (the
            newest row of a page, which sits next to the free space, keeps its bytes there).
            ``VACUUM FULL`` writes live rows into fresh zeroed pages and drops the old files, but
            copies any dead row that some snapshot might still see, its own included, whose
            horizon a transaction running in *another* database holds back. So first wait until
            every transaction begun before now (the delete has committed) has ended and no
            session of this database, nor a replication slot, holds an older snapshot.

            ``VACUUM`` cannot run inside a transaction: the pool's connections are in autocommit
            mode. It locks each table for as long as its rewrite takes (milliseconds for
            thousands of rows). The write-ahead log keeps the bytes until its segments are
            recycled; backups and replicas are beyond a journal's reach.

            Raises:
                PersistenceError: an older transaction or snapshot lasted about a second more.
            """
            with (
                self._store.get_connection() as conn,
                conn.cursor(row_factory=tuple_row) as curs,
            ):
                curs.execute("SELECT pg_current_xact_id()::text")
                marker = curs.fetchone()
                assert marker is not None
                for _ in range(_SCRUB_WAIT):
                    curs.execute(_OLDER_SNAPSHOTS, {"now": marker[0]})
                    older = curs.fetchone()
                    if older is not None and older[0] == 0:
                        break
                    time.sleep(0.02)
                else:
                    raise PersistenceError(
                        "could not erase deleted payloads: a transaction older than the deletion "
                        "is still open (in this database or, holding back every snapshot, in "
                        "another session of the server); erased bytes remain in the tables' files "
                        "until it ends and the journal is scrubbed again"
                    )
                curs.execute(f"VACUUM FULL public.{PAYLOAD_TABLE}, public.{SNAPSHOT_TABLE}")

    class _PostgresFactory(PostgresFactory):
        application_recorder_class = _PostgresRecorder


def _pg_row(row: tuple[Any, ...]) -> Row:
    return (int(row[0]), str(row[1]), int(row[2]), str(row[3]), bytes(row[4]))


class _POPORecorder(POPOApplicationRecorder):
    """The library's in-memory recorder, plus forgettable payloads and stream reads."""

    def __init__(self) -> None:
        super().__init__()
        self._payloads: dict[str, bytes] = {}
        self._snapshots: dict[str, tuple[int, bytes]] = {}

    def _insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        with self._database_lock:
            positions = super()._insert_events(stored_events)
            self._payloads.update(kwargs.get("payloads") or {})
            for stream in kwargs.get("forget") or ():
                self._payloads.pop(stream, None)
            dropped: str | None = kwargs.get("drop_snapshots")
            if dropped:
                for key in [k for k in self._snapshots if k.startswith(dropped)]:
                    del self._snapshots[key]
            self._snapshots.update(kwargs.get("snapshots") or {})
            return positions

    def select_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        """Return a stream's snapshot (version, state), if one was written."""
        with self._database_lock:
            return self._snapshots.get(stream)

    def select_rows(
        self, after: int, upto: int | None, limit: int, topics: Sequence[str] = ()
    ) -> list[Row]:
        """Return raw rows after a position (up to another, of some topics), in global order."""
        wanted = set(topics)
        with self._database_lock:
            stop = len(self._stored_events) if upto is None else min(upto, len(self._stored_events))
            out: list[Row] = []
            for i in range(max(after, 0), stop):
                s = self._stored_events[i]
                if wanted and s.topic not in wanted:
                    continue
                out.append((i + 1, str(s.originator_id), s.originator_version, s.topic, s.state))
                if len(out) == limit:
                    break
            return out

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

    def select_payloads(self, streams: Sequence[str] | None) -> dict[str, bytes]:
        """Return the payloads of the given streams (every payload when None)."""
        with self._database_lock:
            if streams is None:
                return dict(self._payloads)
            return {s: self._payloads[s] for s in streams if s in self._payloads}


class _POPOFactory(POPOFactory):
    def application_recorder(self) -> _POPORecorder:
        return _POPORecorder()


class _JournalApp(Application[str]):
    """The one eventsourcing application behind a journal, configured by our URL only."""

    name = APP_NAME

    def __init__(self, env: dict[str, str], codec: Codec) -> None:
        self._codec = codec
        super().__init__(env)

    def construct_env(self, name: str, env: Any = None) -> Environment:
        """Seal the configuration: ignore ``os.environ`` so a stray variable cannot redirect it."""
        return Environment(name, dict(env or {}))

    def construct_mapper(self) -> Mapper[str]:
        """Use our msgspec mapper instead of the library's JSON one."""
        return _MsgspecMapper(self._codec)


def _settings(config: JournalConfig) -> dict[str, str]:
    if config.backend == "memory":
        return {"PERSISTENCE_MODULE": get_topic(_POPOFactory)}
    if config.backend == "sqlite":
        assert config.path is not None
        return {
            "PERSISTENCE_MODULE": get_topic(_SQLiteFactory),
            "SQLITE_DBNAME": config.path,
            "SQLITE_LOCK_TIMEOUT": "30",
            "ORIGINATOR_ID_TYPE": "text",
            "CREATE_TABLE": "y",
            "JOURNALED_DURABILITY": config.durability,
        }
    if config.backend == "postgresql":
        _require_postgres()
        assert config.host is not None
        assert config.user is not None
        assert config.dbname is not None
        return {
            "PERSISTENCE_MODULE": get_topic(_PostgresFactory),
            "POSTGRES_DBNAME": config.dbname,
            "POSTGRES_HOST": config.host,
            "POSTGRES_PORT": str(config.port),
            "POSTGRES_USER": config.user,
            "POSTGRES_PASSWORD": config.password or "",
            "POSTGRES_SCHEMA": "public",
            "POSTGRES_POOL_SIZE": str(config.pool_size),
            "POSTGRES_MAX_OVERFLOW": str(_PG_MAX_OVERFLOW),
            "POSTGRES_CONNECT_TIMEOUT": str(_PG_CONNECT_TIMEOUT),
            "ORIGINATOR_ID_TYPE": "text",
            "CREATE_TABLE": "n",  # migrate() made them; the library's own DDL races
        }
    raise JournalUrlError(f"journal backend {config.backend!r} is not available in this release")


class Journal:
    """Append events atomically and read them back in one global order.

    Thread-safe: every method may be called from any thread.
    """

    def __init__(self, config: JournalConfig, codec: Codec, *, create: bool = True) -> None:
        self.config = config
        self.codec = codec
        self._listener: Any = None
        self._listen_lock = threading.Lock()
        if config.backend == "sqlite":
            assert config.path is not None
            path = Path(config.path)
            if not create and not path.exists():
                raise JournalUrlError(
                    f"no journal at {config.path}: check the URL (nothing was created, because "
                    "reading must not make an empty journal)"
                )
            path.parent.mkdir(parents=True, exist_ok=True)
        if config.backend == "postgresql":
            if create:
                migrate(config)
            elif not _pg_exists(config):
                raise JournalUrlError(
                    f"no journal in {config.url}: check the URL (nothing was created, because "
                    "reading must not make an empty journal)"
                )
        try:
            self._app = _JournalApp(_settings(config), codec)
        except PersistenceError as exc:
            error = JournalUrlError(f"cannot open journal {config.url}: {_hide(str(exc), config)}")
            if config.backend == "postgresql":
                raise error from None  # the driver's reason is above, with any password hidden
            raise error from exc
        self._recorder: _SQLiteRecorder | _POPORecorder | _PostgresRecorder = self._app.recorder  # type: ignore[assignment]
        self._closed = False
        self._scrub_lock = threading.Lock()

    # -- writing ---------------------------------------------------------------------------------

    def append(
        self,
        events: Sequence[Pending],
        *,
        payloads: Mapping[str, bytes] | None = None,
        forget: Sequence[str] = (),
        snapshots: Mapping[str, tuple[int, bytes]] | None = None,
        drop_snapshots: str | None = None,
    ) -> list[int]:
        """Append events, payloads, erasures and snapshots in one transaction; return positions.

        A snapshot ``{stream: (version, state)}`` is a cache of a stream's folded state at a
        version, kept beside the log; it replaces the stream's previous snapshot.
        ``drop_snapshots`` deletes every snapshot whose key starts with that prefix (a purge
        drops the memory snapshots, which hold fact texts).

        Raises:
            ConcurrencyConflict: a stream already has one of the versions (another writer won).
        """
        self._check_open()
        mapper = self._app.mapper
        stored = [mapper.to_stored_event(p) for p in events]  # type: ignore[arg-type]
        try:
            positions = self._recorder.insert_events(
                stored,
                payloads=dict(payloads or {}),
                forget=list(forget),
                snapshots=dict(snapshots or {}),
                drop_snapshots=drop_snapshots,
            )
        except IntegrityError as exc:
            streams = sorted({p.stream for p in events})
            raise ConcurrencyConflict(streams, str(exc)[:200]) from exc
        return list(positions or [])

    def scrub(self) -> None:
        """Make erased payload bytes unrecoverable from the files (after ``forget``).

        SQLite: checkpoint the zeroed pages and truncate the write-ahead log. PostgreSQL: rewrite
        the payload and snapshot tables (``VACUUM FULL``), because a deleted row otherwise stays
        readable in the data files as a dead tuple until vacuumed (see ``_PostgresRecorder.erase``).

        Raises:
            PersistenceError: another connection kept reading old data for about a second; the
                erased bytes may remain until it is done.
        """
        self._check_open()
        if self.config.backend == "postgresql":
            recorder = self._recorder
            assert isinstance(recorder, _PostgresRecorder)
            with self._scrub_lock:
                recorder.erase()
            return
        if self.config.backend != "sqlite" or self.config.path is None:
            return
        with self._scrub_lock:
            conn = sqlite3.connect(self.config.path, timeout=30, isolation_level=None)
            try:
                conn.execute("PRAGMA secure_delete=ON")
                for _ in range(50):
                    busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                    if not busy:
                        return
                    time.sleep(0.02)  # a reader holds the log; its snapshot ends soon
                raise PersistenceError(
                    f"could not truncate the write-ahead log of {self.config.path}: "
                    "another connection keeps reading; erased bytes may remain until it closes"
                )
            finally:
                conn.close()

    # -- reading ---------------------------------------------------------------------------------

    def position(self) -> int:
        """Return the global position of the last event (0 for an empty journal)."""
        self._check_open()
        return int(self._recorder.max_notification_id() or 0)

    def read(
        self,
        after: int = 0,
        upto: int | None = None,
        page: int = 1000,
        topics: Sequence[str] = (),
    ) -> Iterator[Event]:
        """Yield events after position ``after`` up to ``upto`` (inclusive), in global order.

        ``topics`` keeps only events of those stored topics (filtered by the database).

        Raises:
            CorruptEvent: an event cannot be decoded; its position is in the error.
        """
        self._check_open()
        start = after
        while True:
            rows = self._recorder.select_rows(start, upto, page, topics)
            for row in rows:
                yield self._event(row)
            if len(rows) < page:
                return
            start = rows[-1][0]  # positions may have gaps (PostgreSQL): page by the last one

    def stream(
        self,
        stream: str,
        *,
        after_version: int = 0,
        upto: int | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """Return a stream's events after a version and up to a position, oldest first."""
        self._check_open()
        rows = self._recorder.select_stream(stream, after_version, upto, limit)
        return [self._event(row) for row in rows]

    def save_snapshot(self, stream: str, version: int, state: bytes) -> None:
        """Store a snapshot (a cache of folded state at a version or position) on its own."""
        self.append([], snapshots={stream: (version, state)})

    def snapshot(self, stream: str) -> tuple[int, bytes] | None:
        """Return the latest snapshot of a stream as (version, state), or None."""
        self._check_open()
        return self._recorder.select_snapshot(stream)

    def first(self, stream: str) -> Event | None:
        """Return the first event of a stream, or None if the stream is empty."""
        events = self.stream(stream, limit=1)
        return events[0] if events else None

    def payloads(self, streams: Sequence[str] | None = None) -> dict[str, bytes]:
        """Return the forgettable payloads of the given streams (all when None)."""
        self._check_open()
        return self._recorder.select_payloads(streams)

    def wait_for_appends(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds, returning early when another process appends.

        On PostgreSQL this listens to the channel the library notifies on every append (one
        dedicated connection, opened on first use); elsewhere it simply waits. Callers poll the
        position afterwards either way, so a lost notification costs at most one timeout.
        """
        self._check_open()
        if self.config.backend != "postgresql":
            time.sleep(timeout)
            return
        with self._listen_lock:
            try:
                if self._listener is None:
                    conn = _pg_connect(self.config)
                    conn.autocommit = True
                    channel = getattr(self._recorder, "channel_name", "")
                    conn.execute(f'LISTEN "{channel}"')
                    self._listener = conn
                for _ in self._listener.notifies(timeout=timeout, stop_after=1):
                    pass
            except (JournalUrlError, psycopg.Error):
                self._drop_listener()  # the poll remains the safety net; retry next time
                time.sleep(timeout)

    def _drop_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(Exception):
                listener.close()

    def close(self) -> None:
        """Close the journal's connections. Idempotent."""
        if not self._closed:
            self._closed = True
            with self._listen_lock:
                self._drop_listener()
            self._app.close()

    def _event(self, row: Row) -> Event:
        position, stream, version, topic, state = row
        data: DomainEvent = self.codec.decode(topic, state, position=position)
        return Event(position=position, stream=stream, version=version, data=data)

    def _check_open(self) -> None:
        if self._closed:
            raise JournalClosed(f"journal {self.config.url} is closed")


__all__ = ["PAYLOAD_TABLE", "SNAPSHOT_TABLE", "CorruptEvent", "Journal", "migrate"]
