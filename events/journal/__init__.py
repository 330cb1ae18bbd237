"""The journal: one ordered log of events over the eventsourcing library (J1, J2, J4, J5).

This package is the only one that imports ``eventsourcing``. It builds one eventsourcing
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
from eventsourcing.persistence import IntegrityError, Mapper, PersistenceError
from eventsourcing.utils import Environment, get_topic

from journaled.events.base import DomainEvent, Event, Pending
from journaled.events.codec import Codec
from journaled.events.errors import (
    ConcurrencyConflict,
    CorruptEvent,
    JournalClosed,
    JournalUnreadable,
    JournalUrlError,
)
from journaled.events.journal._common import (
    _PG_CONNECT_TIMEOUT,
    _PG_MAX_OVERFLOW,
    APP_NAME,
    EVENTS_TABLE_POSTGRES,
    PAYLOAD_TABLE,
    SNAPSHOT_TABLE,
    Row,
    _MsgspecMapper,
)
from journaled.events.journal._popo import _POPOFactory, _POPORecorder
from journaled.events.journal._postgres import (
    _POSTGRES_MISSING,
    _hide,
    _pg_connect,
    _pg_exists,
    _require_postgres,
    migrate,
)
from journaled.events.journal._sqlite import _SQLiteFactory, _SQLiteRecorder
from journaled.events.url import JournalConfig

if _POSTGRES_MISSING is None:
    from journaled.events.journal._postgres import _PostgresFactory, _PostgresRecorder


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
        except sqlite3.DatabaseError as exc:  # the file exists but is no SQLite database
            raise JournalUnreadable(
                f"cannot open the journal at {config.path}: {exc} (not a journal file, or "
                "damaged: restore it from a backup or point the URL at another file)"
            ) from exc
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
        skip_prefixes: Sequence[str] = (),
    ) -> Iterator[Event]:
        """Yield events after position ``after`` up to ``upto`` (inclusive), in global order.

        ``topics`` keeps only events of those stored topics, and ``skip_prefixes`` leaves out
        those whose topic starts with one of these; both are filtered by the database, so
        what is left out is not even decoded (nor checked: whoever reads it decodes it).

        Raises:
            CorruptEvent: an event cannot be decoded; its position is in the error.
        """
        self._check_open()
        start = after
        while True:
            rows = self._recorder.select_rows(start, upto, page, topics, skip_prefixes)
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
            except Exception:
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


__all__ = [
    "APP_NAME",
    "EVENTS_TABLE_POSTGRES",
    "PAYLOAD_TABLE",
    "SNAPSHOT_TABLE",
    "CorruptEvent",
    "Journal",
    "Row",
    "migrate",
]
