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
- *run content*: an event with ``has_content`` (goals, inputs, outputs, errors, questions,
  answers) is stored without its content, and its content values go to the same side table
  under ``<stream>@<version>`` in the same transaction (unless all its content is empty: then
  the event is its own shape and needs no side row; ADR 0035); reads put them back while the
  payload exists, and once it was erased they return the stored shape, its content reading
  ``[purged]`` (ADR 0018). Side rows of earlier releases hold the whole event and read as well;
- a snapshot table beside the log (ADR 0009), written in the same transactions;
- a digest chain (R7, ADR 0021, :mod:`._digest`): each append records, in its own transaction,
  the hash of each of its events and payloads in a digest chained to the previous append's
  (SQLite: in its last event row; elsewhere: a digest table); :meth:`Journal.verify` checks the
  whole journal against them;
- SQLite: one multi-row INSERT per append, and ``synchronous=NORMAL`` unless ``durability=full``;
- named subscriptions' positions (A3, ADR 0026) in a table of their own beside the log, which no
  digest covers and no purge or scrub touches; :meth:`Journal.wait_for_appends` with a mark wakes
  on appends of this process at once and of other processes within a few milliseconds;
- PostgreSQL: tables created by :func:`migrate` (idempotent, serialised by an advisory lock), never
  by the library's racy automatic DDL. Positions are the library's notification ids: they increase
  in commit order but have gaps (a failed insert consumes ids), so readers page by the last id.

PostgreSQL needs the ``postgres`` extra (``eventsourcing[postgres]``: psycopg and psycopg_pool).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import shutil
import sqlite3
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import msgspec
from eventsourcing.application import Application
from eventsourcing.persistence import (
    ConnectionPoolClosedError,
    DataError,
    IntegrityError,
    InterfaceError,
    Mapper,
    OperationalError,
    PersistenceError,
    StoredEvent,
)
from eventsourcing.utils import Environment, get_topic

from journaled.events.base import DomainEvent, Event, Pending, hollow
from journaled.events.catalog import NOT_MEMORY
from journaled.events.codec import Codec, stored_shape_problem, topic_of
from journaled.events.errors import (
    AppendOutcomeUnknown,
    AppendRefused,
    ConcurrencyConflict,
    CorruptEvent,
    JournalBusy,
    JournalClosed,
    JournalFull,
    JournalReadOnly,
    JournalUnavailable,
    JournalUnreadable,
    JournalUrlError,
    UnreadableEvent,
)
from journaled.events.inputs import INT64_MAX
from journaled.events.interrupts import interrupts_deferred
from journaled.events.journal._common import (
    _PG_CONNECT_TIMEOUT,
    _PG_MAX_OVERFLOW,
    APP_NAME,
    EVENTS_TABLE_POSTGRES,
    PAYLOAD_TABLE,
    SCRUB_TABLE,
    SNAPSHOT_TABLE,
    SQLITE_IOERR_SHMSIZE,
    SUBSCRIPTION_TABLE,
    LockWaitExpired,
    Row,
    SnapshotRefused,
    Unreached,
    _MsgspecMapper,
    causes,
    content_key,
    disk_full,
    hide_password,
    read_only,
    truncate_wal,
)
from journaled.events.journal._digest import (
    DIGEST_TABLE,
    ChainBroken,
    DigestRow,
    Problem,
    VerifyReport,
    sealed,
    unsealed,
)
from journaled.events.journal._digest import verify as _verify
from journaled.events.journal._popo import _POPOFactory, _POPORecorder
from journaled.events.journal._sqlite import _Pool as _SQLitePool
from journaled.events.journal._sqlite import _SQLiteFactory, _SQLiteRecorder
from journaled.events.url import JournalConfig

if TYPE_CHECKING:
    from journaled.events.journal._postgres import _PostgresRecorder

log = logging.getLogger("journaled")


def _pg() -> ModuleType:
    """Return the PostgreSQL side of the journal, importing it (and its driver) on first use.

    A SQLite or in-memory journal never pays for importing psycopg (T4).
    """
    return importlib.import_module("journaled.events.journal._postgres")


def migrate(config: JournalConfig) -> None:
    """Create or upgrade a PostgreSQL journal's tables, idempotently (ADR 0012).

    See :func:`journaled.events.journal._postgres.migrate`.
    """
    _pg().migrate(config)


_SQLITE_PROBE = 0.002
"""Seconds between two looks at a SQLite file's ``data_version`` while someone waits for appends:
a look costs a few microseconds (it reads the shared-memory index, no page), so another process's
append is seen within about this long (ADR 0026)."""
_PG_PROBE = 0.25
"""Seconds a PostgreSQL listener waits for a notification before checking it is still wanted."""
_WATCH_IDLE = 1.0
"""Seconds a watcher thread lingers with nobody waiting before it ends."""

QUIET_PREFIXES = frozenset(NOT_MEMORY)
"""Topic prefixes of the events memory's followers skip: runs and orchestrations (ADR 0057)."""
QUIET_FAMILIES = frozenset(prefix.rstrip(".") for prefix in QUIET_PREFIXES)
"""The families of :data:`QUIET_PREFIXES`: a PostgreSQL append whose events are all of these is
notified on the quiet channel, which memory's followers do not listen on (ADR 0057)."""
QUIET_SUFFIX = "_quiet"
"""The quiet channel's name is the main channel's (the library's) with this suffix."""


class _JournalApp(Application[str]):
    """The one eventsourcing application behind a journal, configured by our URL only."""

    name = APP_NAME

    def __init__(self, env: dict[str, str], codec: Codec) -> None:
        self._codec = codec
        try:
            super().__init__(env)
        except BaseException:
            # The factory may have opened its pool before a later part failed: a failed open
            # keeps no connection (a server's connection limit met here would be met again).
            factory = getattr(self, "factory", None)
            if factory is not None:
                with contextlib.suppress(Exception):
                    factory.close()
            raise

    def construct_env(self, name: str, env: Any = None) -> Environment:
        """Seal the configuration: ignore ``os.environ`` so a stray variable cannot redirect it."""
        return Environment(name, dict(env or {}))

    def construct_mapper(self) -> Mapper[str]:
        """Use our msgspec mapper instead of the library's JSON one."""
        return _MsgspecMapper(self._codec)


def _sqlite_name(path: str, create: bool) -> str:
    """Return the name to open a SQLite journal by: immutable where nothing can write it.

    A journal in WAL mode is opened with its ``-shm`` file, which a read-only directory cannot
    hold; SQLite then refuses even to read it ("attempt to write a readonly database"). With
    neither ``-wal`` nor ``-shm`` beside it, every committed event is in the file itself, and in
    a directory nobody may write, no one can append meanwhile: it is read as immutable (R7:
    `journal verify` on an archived, read-only copy).
    """
    file = Path(path)
    if (
        create
        or path.startswith("file:")
        or os.access(file.parent, os.W_OK)
        or any(Path(f"{path}{suffix}").exists() for suffix in ("-wal", "-shm"))
    ):
        return path
    return f"file:{quote(str(file.resolve()))}?immutable=1"


_LOW_SPACE = 1 << 20
"""Bytes free on a journal's disk below which a failure to grow its shared-memory file is
taken for the disk being full (ADR 0081)."""


def _out_of_space(config: JournalConfig, exc: BaseException) -> str | None:
    """Return why a SQLite journal could not be opened or written when its disk is full."""
    full = disk_full(exc)
    if full is not None or config.path is None:
        return full
    if any(getattr(c, "sqlite_errorcode", None) == SQLITE_IOERR_SHMSIZE for c in causes(exc)):
        try:
            free = shutil.disk_usage(Path(config.path).resolve().parent).free
        except OSError:
            return None
        if free < _LOW_SPACE:
            return f"no room for its shared-memory file: {free} bytes free"
    return None


def _unreadable(
    config: JournalConfig, exc: Exception
) -> JournalUnreadable | JournalFull | JournalReadOnly:
    """Return the error for a SQLite file that could not be opened: its disk is full (ADR
    0081), it cannot be written, or it is no journal (never advise restoring a backup for a
    full disk or a read-only file)."""
    full = _out_of_space(config, exc)
    if full is not None:
        return JournalFull(config.url, full)
    unwritable = read_only(exc)
    if unwritable is not None:
        return JournalReadOnly(config.url, unwritable)
    if config.path is not None and Path(config.path).is_dir():
        return JournalUnreadable(
            f"cannot open the journal at {config.path}: it is a directory; point the URL at "
            f"a journal file (e.g. sqlite:///{Path(config.path) / 'journal.sqlite'})"
        )
    return JournalUnreadable(
        f"cannot open the journal at {config.path}: {exc} (not a journal file, or damaged: "
        "restore it from a backup or point the URL at another file)"
    )


def _storable(stream: str) -> bool:
    """Tell whether a stream id can be stored on every backend: UTF-8 cannot encode a lone
    surrogate (what an argument of invalid UTF-8 becomes), and PostgreSQL's text holds no NUL,
    so such an id names no stream and reads as unknown.

    Asked only after the database driver refused an id, never on the way of a good read.
    """
    if "\x00" in stream:
        return False
    try:
        stream.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_REFUSED_ID = (UnicodeEncodeError, DataError)
"""What a driver raises for an id it cannot store (:func:`_storable` tells which it was)."""


_JOURNAL_COLUMNS = ("originator_id", "originator_version", "topic", "state")
"""Columns of the events table every release of the journal has had."""


def _holds_journal(path: str) -> bool:
    """Tell whether a SQLite file holds a journal, reading it without changing it.

    A file that holds another application's database is refused before anything is written
    to it (ADR 0004): its own ``stored_events`` table, or tables of its own and no journal,
    a mistyped URL would otherwise have given a journal's tables and columns.

    Raises:
        sqlite3.DatabaseError: the file is not a SQLite database.
        JournalUnreadable: the file is another application's database.
    """
    name = _sqlite_name(path, create=False)
    if not name.startswith("file:"):
        name = f"file:{quote(str(Path(path).resolve()))}?mode=ro"
    probe = sqlite3.connect(name, uri=True)
    try:
        tables = [
            row[0]
            for row in probe.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        columns = [row[1] for row in probe.execute("PRAGMA table_info(stored_events)")]
    finally:
        probe.close()
    if "stored_events" in tables:
        lacking = [c for c in _JOURNAL_COLUMNS if c not in columns]
        if lacking:
            raise JournalUnreadable(
                f"cannot open the journal at {path}: its table stored_events has the columns "
                f"{', '.join(columns)}, not a journal's (no {', '.join(lacking)}): it is another "
                "application's database, left as it was; point the URL at a journal or a new file"
            )
        return True
    theirs = [t for t in tables if not t.startswith(("sqlite_", "journaled_"))]
    if theirs:
        shown = ", ".join(theirs[:5]) + (f" and {len(theirs) - 5} more" if len(theirs) > 5 else "")
        raise JournalUnreadable(
            f"no journal at {path}, but the tables {shown}: it is another application's "
            "database, left as it was; point the URL at a journal or a new file"
        )
    return False


def _settings(config: JournalConfig, create: bool = True) -> dict[str, str]:
    if config.backend == "memory":
        return {"PERSISTENCE_MODULE": get_topic(_POPOFactory)}
    if config.backend == "sqlite":
        assert config.path is not None
        return {
            "PERSISTENCE_MODULE": get_topic(_SQLiteFactory),
            "SQLITE_DBNAME": _sqlite_name(config.path, create),
            "JOURNALED_LOCK_WAIT": repr(config.lock_wait),
            "ORIGINATOR_ID_TYPE": "text",
            "CREATE_TABLE": "y",
            "JOURNALED_DURABILITY": config.durability,
        }
    if config.backend == "postgresql":
        _pg()._require_postgres()
        assert config.host is not None
        assert config.user is not None
        assert config.dbname is not None
        return {
            "PERSISTENCE_MODULE": get_topic(_pg()._PostgresFactory),
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
            "JOURNALED_LOCK_WAIT": repr(config.lock_wait),
        }
    raise JournalUrlError(f"journal backend {config.backend!r} is not available in this release")


_CUT_BY_CLOSE = (ConnectionPoolClosedError, PersistenceError, sqlite3.Error)
"""What a call on the recorder raises when its connection was closed under it."""


class _Use:
    """A call on a journal's recorder under way: counted for :meth:`Journal.close`, with Ctrl-C
    held until it ends (ADR 0076, ADR 0080).

    A class and not a generator: the deferral knows its section by the caller's frame, and a
    generator's frame is off the stack while the ``with`` body runs, so a Ctrl-C would have
    landed in the middle of a pool's checkout.

    The call is counted by the object itself being in the journal's set of calls: adding and
    discarding it are single C calls, done or not wherever another signal's raising handler
    lands (a SIGTERM raising SystemExit, a SIGALRM timeout), and they take no lock that such an
    exception could leave held. ``__enter__`` discards it again on its error path. A handler
    can still run as ``__exit__`` is entered, before its first line, and leave the call in the
    set: the call knows the frame of its ``with`` (enter it only from a ``with`` statement in
    the frame that makes the call), and :meth:`Journal._calls_under_way` forgets a call whose
    frame is on no thread's stack (ADR 0080 update).
    """

    __slots__ = ("_defer", "_frame", "_journal")

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._defer = interrupts_deferred(depth=2)
        self._frame: FrameType | None = None

    def __enter__(self) -> None:
        self._defer.__enter__()
        try:
            journal = self._journal
            self._frame = sys._getframe(1)
            if len(journal._calls) >= _STALE_SWEEP:
                journal._calls_under_way()
            journal._calls.add(self)
            # After the add, as the close sets the mark before it looks at the calls: either
            # this call sees the mark, or the close sees this call (both under the GIL).
            if journal._closed:
                raise JournalClosed(f"journal {journal.config.url} is closed")
        except BaseException:
            self._journal._calls.discard(self)
            if self._journal._closed:
                self._journal._wake_close()  # a close may have seen this call before it left
            self._defer.__exit__(None, None, None)
            raise

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        journal = self._journal
        try:
            journal._calls.discard(self)
            if journal._closed:
                journal._wake_close()
        finally:
            self._defer.__exit__(kind, error, trace)
        if isinstance(error, Unreached):  # a read the database stayed away from (ADR 0095)
            raise JournalUnavailable(
                journal.config.url, error.waited, error.detail, read=True, busy=error.busy
            ) from error
        if not isinstance(error, _CUT_BY_CLOSE):
            return
        full = disk_full(error)
        if full is not None:  # the database's words, made the journal's (ADR 0081)
            raise JournalFull(journal.config.url, full) from error
        unwritable = read_only(error)
        if unwritable is not None:  # a read-only or immutable file, named (ADR 0081 update)
            raise JournalReadOnly(journal.config.url, unwritable) from error
        if isinstance(error, ConnectionPoolClosedError) or journal._shut:
            # The connection was closed under this call: a close on this thread (a signal
            # handler's) or one that gave up waiting. The caller learns what happened; a
            # call that failed on its own while a close waited for it keeps its error.
            raise JournalClosed(f"journal {journal.config.url} is closed") from error


_STALE_SWEEP = 1000
"""Calls in a journal's set at which entering one first forgets those no longer under way
(left by an exception landing as their ``__exit__`` was entered), so that they cannot pile up
between closes: far more calls than any program has under way at once."""
_CLOSE_LOOK = 0.05
"""Seconds a close waits before looking again at the calls under way, woken or not: a call
whose ``__exit__`` an exception cut short never wakes it."""


def _stack(frame: FrameType | None) -> Iterator[FrameType]:
    """Yield a frame and the frames under it: a thread's stack from there down."""
    while frame is not None:
        yield frame
        frame = frame.f_back


class Journal:
    """Append events atomically and read them back in one global order.

    Thread-safe: every method may be called from any thread.
    """

    def __init__(self, config: JournalConfig, codec: Codec, *, create: bool = True) -> None:
        self.config = config
        self.codec = codec
        self._listener: Any = None
        """The connection :meth:`wait_for_foreign` listens on: the main channel alone."""
        self._listener_all: Any = None
        """The connection :meth:`wait_for_appends` listens on: both channels."""
        self._listen_lock = threading.Lock()
        if config.backend == "sqlite":
            assert config.path is not None
            path = Path(config.path)
            try:
                holds = path.exists() and _holds_journal(config.path)
            except sqlite3.DatabaseError as exc:  # the file exists but is no SQLite database
                raise _unreadable(config, exc) from exc
            if not create and not holds:
                raise JournalUrlError(
                    f"no journal at {config.path}: check the URL (nothing was created, because "
                    "reading must not make an empty journal)"
                )
            path.parent.mkdir(parents=True, exist_ok=True)
        if config.backend == "postgresql":
            if create:
                migrate(config)
            elif not _pg()._pg_exists(config):
                raise JournalUrlError(
                    f"no journal in {config.url}: check the URL (nothing was created, because "
                    "reading must not make an empty journal)"
                )
        try:
            self._app = _JournalApp(_settings(config, create), codec)
        except LockWaitExpired as exc:
            raise JournalBusy(config.url, exc.waited) from exc
        except sqlite3.DatabaseError as exc:  # the file exists but is no SQLite database
            raise _unreadable(config, exc) from exc
        except PersistenceError as exc:
            full = _out_of_space(config, exc)
            if full is not None:
                raise JournalFull(config.url, full) from exc
            unwritable = read_only(exc)
            if unwritable is not None:
                raise JournalReadOnly(config.url, unwritable) from exc
            error = JournalUrlError(
                f"cannot open journal {config.url}: {hide_password(str(exc), config.password)}"
            )
            if config.backend == "postgresql":
                raise error from None  # the driver's reason is above, with any password hidden
            raise error from exc
        self._recorder: _SQLiteRecorder | _POPORecorder | _PostgresRecorder = self._app.recorder  # type: ignore[assignment]
        self._content_topics = frozenset(topic_of(c) for c in codec.types if c.has_content)
        self._content_tags = frozenset(t.rpartition("@")[0] for t in self._content_topics)
        try:
            self._check_schema(config, create)
        except BaseException:
            # The pool's connections are open by now: an open that fails must not keep them
            # (a server's connection limit met here would be met again by every retry).
            with contextlib.suppress(Exception):
                self._app.close()
            raise
        self._token = os.urandom(6).hex()
        """Names this journal's appends in its notifications, so that its own followers can
        tell them from other processes' (ADR 0044)."""
        self._closed = False
        self._calls: set[_Use] = set()
        """Calls on the recorder under way, on any thread: close waits for them (ADR 0080)."""
        self._woken = threading.Lock()
        """Released by a call ending while the journal closes: the close looks again at once."""
        self._woken.acquire()
        self._closing = threading.RLock()
        """Held by the thread that waits for the calls under way and closes the connections:
        a second close waits for it (a handler's close on the same thread goes through)."""
        self._shut = False
        """The connections are closed: set once a close got through its wait."""
        self._scrub_lock = threading.Lock()
        self._appended = threading.Condition()
        self._appends = 0
        """Bumped on every append by this process and every change another process commits
        (seen by the watcher), and by :meth:`wake`: what :meth:`append_mark` returns."""
        self._waiters = 0
        self._watcher: threading.Thread | None = None
        self._subscription_table = create and config.backend != "sqlite"
        if create and config.backend == "sqlite":
            # Created on open like the other tables; a read-only open creates nothing (the
            # first acknowledgement of a named subscription does then, ADR 0026).
            with contextlib.suppress(sqlite3.Error, PersistenceError):
                self._create_subscription_table()

    def _check_schema(self, config: JournalConfig, create: bool) -> None:
        """Learn what a PostgreSQL journal's schema offers: the append procedure's version and,
        opened for reading, whether it is chained and keeps scrub marks."""
        if config.backend != "postgresql":
            return
        recorder = self._recorder
        assert isinstance(recorder, _pg()._PostgresRecorder)
        recorder.use_procedures(_pg()._pg_append_version(config))
        if not create:
            # Reading creates nothing (ADR 0012): a journal of an older release without the
            # digest table is appended to unchained until `journal migrate` adds it (ADR 0021).
            recorder.chained = _pg()._pg_chained(config)
            # Opened for reading without migrating: a journal of an older release has no scrub
            # table, and creating one here would break the promise that reading creates nothing.
            recorder.track_scrub = recorder.has_scrub_table()

    # -- writing ---------------------------------------------------------------------------------

    def append(
        self,
        events: Sequence[Pending],
        *,
        payloads: Mapping[str, bytes] | None = None,
        forget: Sequence[str] = (),
        snapshots: Mapping[str, tuple[int, bytes]] | None = None,
        drop_snapshots: str | None = None,
        lock_wait: float | None = None,
        refuse_after: tuple[int, Sequence[str]] | None = None,
    ) -> list[int]:
        """Append events, payloads, erasures and snapshots in one transaction; return positions.

        ``refuse_after=(position, topic prefixes)`` stores nothing when an event of one of those
        topics was appended after ``position``: the check runs in the append's own transaction,
        serialised with every other append, so what was decided from a read at ``position``
        never lands after such an event (a fork after a purge of its source, R2).

        A snapshot ``{stream: (version, state)}`` is a cache of a stream's folded state at a
        version, kept beside the log; it replaces the stream's previous snapshot.
        ``drop_snapshots`` deletes every snapshot whose key starts with that prefix (a purge
        drops the memory snapshots, which hold fact texts).

        Each append also extends the digest chain (R7, ADR 0021) in the same transaction.

        The wait for the journal's write lock, which another connection or process may hold, is
        bounded by ``lock_wait`` (default: the config's): a caller whose own caller gives up
        sooner passes what it has left, so that no append lands after it was reported failed.

        Raises:
            ConcurrencyConflict: a stream already has one of the versions (another writer won).
            JournalBusy: the lock stayed taken for the whole wait; nothing was appended.
            ValueError: payloads or erasures without any event (no digest record would cover
                them), or a malformed ``refuse_after``.
            AppendRefused: ``refuse_after`` found such an event; nothing was appended.
            UnreadableEvent: an event would not decode as stored (a field of the wrong type);
                nothing was appended.
        """
        self._check_open()
        if not events and (payloads or forget):
            raise ValueError(
                "payloads and erasures must be appended with at least one event: the digest "
                "chain covers them through it (R7)"
            )
        codec = self.codec  # the mapper's (see _JournalApp): its to_stored_event, inlined
        side = dict(payloads or {})
        stored = []
        for p in events:
            data = p.data
            if data.has_content:
                shape = data.map_content(hollow)
                if shape != data:
                    # The content goes to the forgettable side table, the log keeps the shape.
                    # An event whose content is all empty (a step that returned None) is its
                    # own shape: a side row would only repeat it (ADR 0035).
                    side[content_key(p.stream, p.version)] = content_of(data)
                    data = shape
            topic, payload = codec.topic(data), codec.encode(data)
            try:
                # msgspec encodes what a Struct holds without checking its field types; the
                # decoder checks them. An event it could not read back would make every later
                # read of the journal fail there (R7): refused now, with nothing stored.
                codec.decode(topic, payload)
            except CorruptEvent as exc:
                raise UnreadableEvent(p.stream, topic, exc.reason) from None
            stored.append(StoredEvent(p.stream, p.version, topic, payload))
        # The transaction and the wake-up take locks on the calling thread: Ctrl-C waits for
        # them to be released (ADR 0076).
        guard = None if refuse_after is None else _guard(refuse_after)
        side = sealed(side)  # each row salted, so its hash in the chain tells nothing once erased
        with self._using():
            try:
                positions = self._insert(
                    stored, side, forget, snapshots, drop_snapshots, lock_wait, guard
                )
            except SnapshotRefused as exc:
                raise AppendRefused(
                    f"an event of {', '.join(guard[1]) if guard else '?'} was appended after "
                    f"position {guard[0] if guard else '?'}; nothing was appended"
                ) from exc
            finally:
                if forget or drop_snapshots:  # before the erasure's caller hears of it
                    _ERASED_HERE.bump()
            if events:
                self._bump()
        return list(positions or [])

    def _insert(
        self,
        stored: list[StoredEvent],
        side: dict[str, bytes],
        forget: Sequence[str],
        snapshots: Mapping[str, tuple[int, bytes]] | None,
        drop_snapshots: str | None,
        lock_wait: float | None,
        guard: tuple[int, tuple[str, ...]] | None = None,
    ) -> Sequence[int] | None:
        """Insert stored events and what goes with them in one transaction; map its errors."""
        try:
            return self._recorder.insert_events(
                stored,
                payloads=side,
                forget=list(forget),
                snapshots=dict(snapshots or {}),
                drop_snapshots=drop_snapshots,
                **({"refuse_after": guard} if guard is not None else {}),
                **(self._notice(stored) if self.notifies else {}),
                **({"lock_wait": max(0.0, lock_wait)} if lock_wait is not None else {}),
            )
        except LockWaitExpired as exc:
            raise JournalBusy(self.config.url, exc.waited) from exc
        except Unreached as exc:
            if exc.sent:
                appended = [f"{e.originator_id}@{e.originator_version}" for e in stored]
                raise AppendOutcomeUnknown(
                    self.config.url, exc.waited, exc.detail, appended
                ) from exc
            raise JournalUnavailable(
                self.config.url, exc.waited, exc.detail, busy=exc.busy
            ) from exc
        except IntegrityError as exc:
            streams = sorted({str(e.originator_id) for e in stored})
            raise ConcurrencyConflict(streams, str(exc)[:200]) from exc
        except ConnectionPoolClosedError as exc:  # closed while this append waited its turn
            raise JournalClosed(f"journal {self.config.url} is closed") from exc

    @property
    def notifies(self) -> bool:
        """Whether appends notify other processes with a note of who appended what (ADR 0044)."""
        return self.config.backend == "postgresql"

    def _notice(self, stored: Sequence[StoredEvent]) -> dict[str, str]:
        """Return an append's notification: its note and, for an append of quiet families
        alone, the quiet channel (ADR 0057).

        The note is this journal's token, then the families of its events' topics (the part
        before the first dot), each once.
        """
        families = dict.fromkeys(e.topic.partition(".")[0] for e in stored)
        note = " ".join((self._token, *families))
        if families.keys() <= QUIET_FAMILIES:
            return {"note": note, "channel": self._channels()[1]}
        return {"note": note}

    def _channels(self) -> tuple[str, str]:
        """Return the main channel (the library's) and the quiet one (ADR 0057)."""
        main = str(getattr(self._recorder, "channel_name", ""))
        return main, f"{main}{QUIET_SUFFIX}"

    def wait_for_foreign(self, timeout: float, skip_prefixes: Sequence[str]) -> bool:
        """Wait up to ``timeout`` seconds for another process's append a reader may need.

        On PostgreSQL, listen for notifications and return True on one from another journal
        whose events are not all of topics starting with ``skip_prefixes`` (or one that says
        nothing of them: an append by an older release, or a snapshot or erasure); False when
        the time runs out. Elsewhere wait the whole timeout and return True (callers poll).

        On PostgreSQL it listens on the main channel alone: appends of :data:`QUIET_FAMILIES`
        alone are notified on the quiet one (ADR 0057), so ``skip_prefixes`` must cover them.
        It listens in slices of :data:`_PG_PROBE`, so a close waits for one slice at most.
        """
        self._check_open()
        if not self.notifies:
            time.sleep(timeout)
            return True
        skipped = tuple(skip_prefixes)
        if not all(quiet.startswith(skipped) for quiet in QUIET_PREFIXES):
            raise ValueError(
                f"wait_for_foreign never hears appends of {sorted(QUIET_FAMILIES)} alone "
                f"(ADR 0057): skip_prefixes must cover {sorted(QUIET_PREFIXES)}"
            )
        deadline = time.monotonic() + timeout
        with self._listen_lock:
            if self._closed:  # closed since the check: open no listener close() cannot drop
                return False
            try:
                listener = self._listen()
                while (left := deadline - time.monotonic()) > 0 and not self._closed:
                    for notice in listener.notifies(timeout=min(left, _PG_PROBE), stop_after=1):
                        token, _, families = notice.payload.partition(" ")
                        if token == self._token:
                            continue
                        if not families or any(
                            not f"{family}.".startswith(skipped) for family in families.split()
                        ):
                            return True
                return False
            except Exception:
                self._drop_listener()  # the caller's poll remains the safety net
                time.sleep(max(0.0, min(deadline - time.monotonic(), _PG_PROBE)))
                return True

    def _listen(self, *, quiet: bool = False) -> Any:
        """Return the connection listening on the main channel, and with ``quiet`` on the
        quiet one too (ADR 0057); each is opened on first use."""
        held = self._listener_all if quiet else self._listener
        if held is None:
            held = self._listening(*self._channels()[: 2 if quiet else 1])
            if quiet:
                self._listener_all = held
            else:
                self._listener = held
        return held

    def _listening(self, *channels: str) -> Any:
        """Open an autocommit connection that listens on ``channels``."""
        conn = _pg()._pg_connect(self.config)
        try:
            conn.autocommit = True
            for channel in channels:
                conn.execute(f'LISTEN "{channel}"')
        except BaseException:
            conn.close()
            raise
        return conn

    def scrub(self, wait: float = 1.0) -> None:
        """Make erased payload bytes unrecoverable from the files (after ``forget``).

        SQLite: checkpoint the zeroed pages and truncate the write-ahead log. PostgreSQL: rewrite
        the payload and snapshot tables (``VACUUM FULL``), because a deleted row otherwise stays
        readable in the data files as a dead tuple until vacuumed (see ``_PostgresRecorder.erase``).

        Each attempt gives way at once to a reader or a writer instead of queueing them behind
        it (no busy wait holding SQLite's write lock, a short lock timeout on PostgreSQL), and
        attempts are repeated for up to ``wait`` seconds (0: one attempt). Once one succeeds, the
        erasures committed before it began are recorded as scrubbed (:meth:`scrub_debt`).

        Raises:
            PersistenceError: another connection kept reading old data for ``wait`` seconds; the
                erased bytes may remain until it is done and a later scrub succeeds.
            JournalFull: the disk is full, so the log cannot be checkpointed into the file.
            JournalReadOnly: the file cannot be written, so the log cannot be checkpointed into
                it (no reader is to blame).
        """
        self._check_open()
        # Counted before the attempt: an erasure committed during it may not be covered.
        with self._using():
            erased, _ = self._recorder.select_scrub_marks()
        with self._scrub_lock:
            if self.config.backend == "postgresql":
                recorder = self._recorder
                assert isinstance(recorder, _pg()._PostgresRecorder)
                with self._using():
                    recorder.erase(wait)
            elif self.config.backend == "sqlite" and self.config.path is not None:
                self._truncate_wal(self.config.path, wait)
            with self._using():
                self._recorder.mark_scrubbed(erased)

    def erasures(self) -> int:
        """Return how many erasures (purges, dropped snapshots) the journal has committed.

        Read from the journal's database, where each erasure counts itself in its own
        transaction: a reader holding events it read before compares it to tell whether any of
        their content may have been erased since (R2). See also :func:`erasures_here`.
        """
        self._check_open()
        with self._using():
            erased, _ = self._recorder.select_scrub_marks()
        return erased

    @property
    def counts_erasures(self) -> bool:
        """Whether :meth:`erasures` counts every erasure committed: not on a PostgreSQL
        journal of an older release read without migrating (no process has made its scrub
        table yet), where a reader holding content cannot learn of a purge by the count."""
        if getattr(self._recorder, "track_scrub", True):
            return True
        self.erasures()  # looks for the table again: another process may have migrated it
        return bool(getattr(self._recorder, "track_scrub", True))

    def scrub_debt(self) -> int:
        """Return how many committed erasures no scrub has yet removed from the files.

        Kept in the journal's database, in each erasure's own transaction: a process stopped
        between a purge's commit and its scrub leaves the debt to whichever opens the journal
        next, here or in another process.
        """
        self._check_open()
        with self._using():
            erased, scrubbed = self._recorder.select_scrub_marks()
        return max(0, erased - scrubbed)

    def _truncate_wal(self, path: str, wait: float) -> None:
        try:
            done = truncate_wal(path, wait)
        except sqlite3.OperationalError as exc:  # no reader to wait for: the file cannot grow
            unwritable = read_only(exc)
            if unwritable is not None:  # or cannot be written at all
                raise JournalReadOnly(self.config.url, unwritable) from exc
            raise JournalFull(self.config.url, disk_full(exc) or "disk full") from exc
        if not done:
            raise PersistenceError(
                f"could not truncate the write-ahead log of {path}: another "
                "connection keeps reading; erased bytes remain until it closes and the "
                "journal is scrubbed again (rt.memory.scrub(), retried in the background)"
            )

    # -- reading ---------------------------------------------------------------------------------

    def verify(self, head: str | None = None) -> VerifyReport:
        """Read the whole journal and check it against its digest chain (R7).

        Every event is read and decoded; from the position where the chain starts (the first
        append by a release that writes digests) each event must match its digest, link to its
        predecessor and be in its place, and every payload must match its digest unless it was
        erased through the journal. Reads a consistent view up to the position it starts at;
        appends made meanwhile are left for the next check.

        Args:
            head: the ``head`` of an earlier report, kept outside the journal: reported as
                ``removed`` unless it is still one of the chain's digests (a cut-off tail, even
                one appended to since, or a recomputed chain).

        Raises:
            ValueError: ``head`` is not a digest's 32 (or, from an earlier release, 64) hex digits.

        Returns:
            The report: ``ok``, the counts, where the chain starts, and the first problem (lowest
            position) with its kind and reason.
        """
        self._check_open()
        if head is not None and (
            not isinstance(head, str) or not re.fullmatch(r"[0-9a-f]{32}|[0-9a-f]{64}", head)
        ):
            raise ValueError(
                f"head: expected the 32 (or 64) lowercase hex digits of a reported digest, "
                f"got {head!r}"
            )
        with self._using():
            upto, payloads = self._recorder.select_digest_state()
        # A content event decodes with its payload: each page's payloads are fetched with it and
        # kept for a few pages (a commit's events may span pages), never all at once.
        content: dict[str, bytes] = {}
        pages: deque[list[str]] = deque()

        def events() -> Iterator[Row]:
            start = 0
            while True:
                # Each page holds the journal open, the whole check does not: a close waits
                # for a page, never for a verify of the whole journal.
                with self._using():
                    rows = self._recorder.select_raw(start, upto, 1000)
                    keys = [content_key(r[1], r[2]) for r in rows if r[3] in self._content_topics]
                    found = self._recorder.select_payloads(keys) if keys else {}
                content.update((k, unsealed(v)) for k, v in found.items())
                pages.append(keys)
                while len(pages) > 3:
                    for key in pages.popleft():
                        content.pop(key, None)
                yield from rows
                if len(rows) < 1000:
                    return
                start = rows[-1][0]

        def digests() -> Iterator[DigestRow]:
            start = 0
            while True:
                with self._using():
                    rows = self._recorder.select_digests(start, upto, 1000)
                yield from rows
                if len(rows) < 1000:
                    return
                start = rows[-1][0]

        return _verify(
            events,
            digests,
            payloads,
            lambda row: self._event(row, content),
            head,
            # SQLite keeps a commit's record in its last row and leaves no gaps in positions
            # but deleted rows': verify names removed events by the positions missing.
            records_in_rows=isinstance(self._recorder, _SQLiteRecorder),
        )

    def position(self) -> int:
        """Return the global position of the last event (0 for an empty journal)."""
        self._check_open()
        with self._using():
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
            with self._using():
                rows = self._recorder.select_rows(start, upto, page, topics, skip_prefixes)
            yield from self._events(rows)
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
        try:
            with self._using():
                rows = self._recorder.select_stream(stream, after_version, upto, limit)
        except _REFUSED_ID:
            if _storable(stream):
                raise
            return []  # an id no backend can store names nothing stored (see _storable)
        return self._events(rows, stream)

    def content_keys(self, stream: str) -> tuple[list[str], list[int], int]:
        """Return where a stream's run content is stored, for erasing it (ADR 0018).

        Returns:
            The side-table keys of its content events that still have their payload; the
            positions of content events an older release stored with their content inline; the
            stream's last version.
        """
        self._check_open()
        try:
            with self._using():
                rows = self._recorder.select_stream(stream, 0, None, None)
        except _REFUSED_ID:
            if _storable(stream):
                raise
            rows = []  # see _storable
        last = rows[-1][2] if rows else 0
        keys = [content_key(r[1], r[2]) for r in rows if r[3] in self._content_topics]
        inline = [
            r[0]
            for r in rows
            if r[3] not in self._content_topics and r[3].rpartition("@")[0] in self._content_tags
        ]
        with self._using():
            present = self._recorder.select_payloads(keys) if keys else {}
        return [k for k in keys if k in present], inline, last

    def save_snapshot(
        self, stream: str, version: int, state: bytes, *, unless_after: Sequence[str] = ()
    ) -> bool:
        """Store a snapshot (a cache of folded state at a version or position) on its own.

        ``unless_after`` holds topic prefixes: when an event of one of them was appended after
        position ``version``, nothing is stored and False is returned. The check runs in the
        snapshot's own transaction, serialised with every append, so a state folded before an
        erasure can never be stored after it (R2): the caller catches up and tries again.
        """
        if not unless_after:
            self.append([], snapshots={stream: (version, state)})
            return True
        self._check_open()
        try:
            with self._using():
                self._recorder.insert_events(
                    [],
                    snapshots={stream: (version, state)},
                    refuse_after=(version, tuple(unless_after)),
                )
        except SnapshotRefused:
            return False
        return True

    def snapshot(self, stream: str) -> tuple[int, bytes] | None:
        """Return the latest snapshot of a stream as (version, state), or None."""
        self._check_open()
        try:
            with self._using():
                return self._recorder.select_snapshot(stream)
        except _REFUSED_ID:
            if _storable(stream):
                raise
            return None  # see _storable

    def snapshots(self) -> list[tuple[str, int, bytes]]:
        """Return every snapshot as (key, version or position, state), in key order."""
        self._check_open()
        with self._using():
            return self._recorder.select_snapshots()

    def first(self, stream: str) -> Event | None:
        """Return the first event of a stream, or None if the stream is empty."""
        events = self.stream(stream, limit=1)
        return events[0] if events else None

    def commit_end(self, position: int) -> int:
        """Return the last position of the append that holds ``position``: the events of one
        append are stored, and seen, together (J2). A position no append is known to hold (an
        unchained journal, past the end) is returned as it is."""
        self._check_open()
        if position <= 0:
            return position
        with self._using():
            found = self._recorder.select_digests(position - 1, INT64_MAX, 1)
        if found and found[0][1] <= position <= found[0][0]:
            return found[0][0]
        return position

    def head(self, stream: str) -> tuple[int, str] | None:
        """Return the position and the tag of a stream's first event, or None if it is empty.

        The event's payload is neither read nor decoded: a run's first event holds its whole
        plan, which is what a caller asking only whether the run exists, or what kind of run
        it is, should not pay for.
        """
        self._check_open()
        try:
            with self._using():
                found = self._recorder.select_head(stream)
        except _REFUSED_ID:
            if _storable(stream):
                raise
            return None  # see _storable
        if found is None:
            return None
        position, topic = found
        if not isinstance(topic, str):  # a row edited by hand: told as its decode tells it
            raise CorruptEvent(position, topic, stored_shape_problem(topic, b"") or "no topic")
        return position, topic.partition("@")[0]

    def firsts(self, streams: Sequence[str]) -> dict[str, Event]:
        """Return the first event of each of these streams that has one, by stream."""
        self._check_open()
        if not streams:
            return {}
        try:
            with self._using():
                rows = self._recorder.select_firsts(streams)
        except _REFUSED_ID:
            kept = [s for s in streams if _storable(s)]
            if len(kept) == len(streams):
                raise
            if not kept:
                return {}
            with self._using():
                rows = self._recorder.select_firsts(kept)
        return {e.stream: e for e in self._events(rows)}

    def payloads(self, streams: Sequence[str] | None = None) -> dict[str, bytes]:
        """Return the forgettable payloads of the given streams (all when None)."""
        self._check_open()
        try:
            with self._using():
                found = self._recorder.select_payloads(streams)
        except _REFUSED_ID:
            kept = [s for s in streams or () if _storable(s)]
            if streams is None or len(kept) == len(streams):
                raise
            with self._using():
                found = self._recorder.select_payloads(kept) if kept else {}
        return {key: unsealed(row) for key, row in found.items()}

    # -- named subscriptions (A3) -----------------------------------------------------------------

    def subscriptions(self, name: str | None = None) -> list[tuple[str, int]]:
        """Return (name, acknowledged position) of every named subscription, or of one, by name.

        A journal of an older release, opened for reading, has no table yet: none is stored.
        """
        self._check_open()
        if not self._has_subscription_table():
            return []
        with self._using():
            return self._recorder.select_subscriptions(name)

    def acknowledge(self, name: str, position: int) -> int:
        """Store a named subscription's position; a position behind the stored one is ignored.

        Creates the table first if this journal lacks it (one of an older release).

        Returns:
            The stored position after the call (never smaller than before).
        """
        self._check_open()
        self._ensure_subscription_table()
        with self._using():
            return self._recorder.advance_subscription(name, position)

    def forget_subscription(self, name: str) -> bool:
        """Drop a named subscription's stored position; tell whether one was stored."""
        self._check_open()
        if not self._has_subscription_table():
            return False
        with self._using():
            return self._recorder.delete_subscription(name)

    def _has_subscription_table(self) -> bool:
        if not self._subscription_table:
            with self._using():
                self._subscription_table = self._recorder.has_subscription_table()
        return self._subscription_table

    def _ensure_subscription_table(self) -> None:
        if self._has_subscription_table():
            return
        self._create_subscription_table()

    def _create_subscription_table(self) -> None:
        recorder = self._recorder
        if isinstance(recorder, _SQLiteRecorder | _POPORecorder):
            with self._using():
                recorder.create_subscription_table()
        else:
            _pg().migrate_subscriptions(self.config)
        self._subscription_table = True

    # -- waiting for appends ---------------------------------------------------------------------

    def append_mark(self) -> int:
        """Return a number that changes once events may have been appended since.

        Take it *before* reading, then pass it to :meth:`wait_for_appends` as ``since``: an
        append between the read and the wait is then never missed.
        """
        with self._appended:
            return self._appends

    def wake(self) -> None:
        """Wake every :meth:`wait_for_appends` waiting with a mark (a subscription closing)."""
        self._bump()

    def _bump(self) -> None:
        with self._appended:
            self._appends += 1
            self._appended.notify_all()

    def wait_for_appends(self, timeout: float, *, since: int | None = None) -> None:
        """Wait up to ``timeout`` seconds, returning early when another process appends.

        Without ``since``, on PostgreSQL this listens to both channels appends notify (the main
        one and the quiet one, ADR 0057; one dedicated connection, opened on first use);
        elsewhere it simply waits.
        Callers poll the position afterwards either way, so a lost notification costs at most
        one timeout.

        With ``since`` (a mark from :meth:`append_mark`), it returns as soon as the mark has
        moved: at once for an append by this process, and for another process's append within
        about :data:`_SQLITE_PROBE` on SQLite (a watcher thread compares the file's
        ``data_version``) or on its NOTIFY on PostgreSQL. Other commits (snapshots,
        acknowledgements) may wake it too: callers read, and wait again if nothing is new.
        """
        self._check_open()
        if since is not None:
            self._wait_marked(timeout, since)
            return
        if self.config.backend != "postgresql":
            time.sleep(timeout)
            return
        deadline = time.monotonic() + timeout
        with self._listen_lock:
            if self._closed:  # closed since the check: open no listener close() cannot drop
                return
            try:
                listener = self._listen(quiet=True)
                # In slices, so that a close waits for one slice at most.
                while (left := deadline - time.monotonic()) > 0 and not self._closed:
                    slice_ = min(left, _PG_PROBE)
                    if any(True for _ in listener.notifies(timeout=slice_, stop_after=1)):
                        return
            except Exception:
                self._drop_listener()  # the poll remains the safety net; retry next time
                time.sleep(min(timeout, _PG_PROBE))  # a pause, not the whole wait: see close()

    def _wait_marked(self, timeout: float, since: int) -> None:
        with self._appended:
            if self._appends != since:
                return
            self._waiters += 1
            try:
                if self.config.backend != "memory" and self._watcher is None:
                    self._watcher = threading.Thread(
                        target=self._watch, name="journaled-append-watcher", daemon=True
                    )
                    self._watcher.start()
                self._appended.wait_for(
                    lambda: self._appends != since or self._closed, timeout=timeout
                )
            finally:
                self._waiters -= 1

    def _watch(self) -> None:
        """Bump the append mark on every change another process commits, while anyone waits.

        Ends after :data:`_WATCH_IDLE` seconds with nobody waiting (or at close); the next wait
        starts it again. Its first look is bumped too: a change committed before it began
        looking might otherwise go unseen by a waiter whose mark was taken before it.
        """
        idle_since: float | None = None
        try:
            with self._watch_source() as changed:
                self._bump()
                while not self._closed:
                    with self._appended:
                        if self._waiters:
                            idle_since = None
                        elif idle_since is None:
                            idle_since = time.monotonic()
                        elif time.monotonic() - idle_since > _WATCH_IDLE:
                            self._watcher = None
                            return
                    if changed():
                        self._bump()
        except Exception:
            log.debug("watching the journal for appends failed", exc_info=True)
            with self._appended:
                if self._watcher is threading.current_thread():
                    self._watcher = None
            # The waiters wake, read, and the next wait starts another watcher: a waiter must
            # not sleep out its whole timeout on a watcher that is gone. After a pause, so that
            # a journal that cannot be reached is not asked again in a tight loop.
            time.sleep(_PG_PROBE)
            self._bump()
            return
        with self._appended:
            if self._watcher is threading.current_thread():
                self._watcher = None

    @contextlib.contextmanager
    def _watch_source(self) -> Iterator[Callable[[], bool]]:
        """Yield a probe that waits a little and tells whether another process committed."""
        if self.config.backend == "postgresql":
            conn = self._listening(*self._channels())
            try:

                def notified() -> bool:
                    return any(True for _ in conn.notifies(timeout=_PG_PROBE, stop_after=1))

                yield notified
            finally:
                conn.close()
            return
        assert self.config.path is not None
        name = _sqlite_name(self.config.path, create=False)
        watch = sqlite3.connect(name, uri=name.startswith("file:"), isolation_level=None)
        try:
            seen = watch.execute("PRAGMA data_version").fetchone()[0]

            def committed() -> bool:
                nonlocal seen
                time.sleep(_SQLITE_PROBE)
                now = watch.execute("PRAGMA data_version").fetchone()[0]
                moved: bool = now != seen
                seen = now
                return moved

            yield committed
        finally:
            watch.close()

    def _drop_listener(self) -> None:
        held = (self._listener, self._listener_all)
        self._listener = self._listener_all = None
        for listener in held:
            if listener is not None:
                with contextlib.suppress(Exception):
                    listener.close()

    def close(self) -> None:
        """Close the journal's connections once the calls under way on them end. Idempotent.

        A call begun after this one raises :class:`JournalClosed`, and waits for appends wake at
        once. One under way on another thread (a read, an append) goes on to its end on its
        connection: closing a connection under a thread still using it fails that call with a
        driver's error, or, with SQLite, crashes the process (ADR 0080). They are waited for as
        long as a call may wait for the write lock, and a little more. A second close returns
        once the first has closed the connections; a close cut short by Ctrl-C while it waits
        closes nothing, and the next close finishes it.
        """
        self._closed = True  # before looking at the calls: see _Use.__enter__
        with self._closing:
            if self._shut:
                return
            # Each time until the connections are closed: a close cut short does them again.
            pool = getattr(getattr(self._recorder, "datastore", None), "pool", None)
            if isinstance(pool, _SQLitePool):
                pool.closing = True  # writers still waiting for SQLite's write lock give up
            self._bump()  # waiters with a mark return; the watcher ends
            with self._listen_lock:
                self._drop_listener()
            self._wait_for_calls()
            if self._shut:  # a handler on this thread closed it while this close waited
                return
            self._shut = True
            watcher = self._watcher
            if watcher is not None and watcher is not threading.current_thread():
                watcher.join(1.0)
            self._app.close()

    @property
    def _close_wait(self) -> float:
        return max(5.0, float(self.config.lock_wait or 0)) + 5.0

    def _using(self) -> _Use:
        """Hold the journal open around a call on its recorder; defer Ctrl-C meanwhile.

        Raises:
            JournalClosed: :meth:`close` has begun (on entering).
        """
        return _Use(self)

    def _wait_for_calls(self) -> None:
        """Wait for the calls under way on other threads, at most :attr:`_close_wait` seconds.

        This thread's own calls are not waited for: a close from a signal handler, or from
        inside a call, goes through.
        """
        deadline = time.monotonic() + self._close_wait
        while True:
            self._woken.acquire(blocking=False)  # forget wake-ups from before this look
            mine = set(_stack(sys._getframe()))
            others = [c for c in self._calls_under_way() if c._frame not in mine]
            left = deadline - time.monotonic()
            if not others:
                return
            if left <= 0:
                log.warning(
                    "journal %s closed with %d call(s) still under way on its connections",
                    self.config.url,
                    len(others),
                )
                return
            self._woken.acquire(timeout=min(left, _CLOSE_LOOK))

    def _wake_close(self) -> None:
        """Wake a close waiting for the calls under way (a call on it has just ended)."""
        with contextlib.suppress(RuntimeError):  # already woken
            self._woken.release()

    def _calls_under_way(self) -> list[_Use]:
        """Return the calls under way, on any thread, after forgetting those that are not.

        A call whose ``__exit__`` an exception cut short at its entry stays in the set; its
        frame is then on no thread's stack (the exception left it). The calls are copied before
        the stacks are looked at: a call in the copy still under way then is on its thread's.
        """
        calls = self._calls.copy()
        if not calls:
            return []
        running = {f for top in sys._current_frames().values() for f in _stack(top)}
        gone = [c for c in calls if c._frame not in running]
        for call in gone:
            self._calls.discard(call)
        return [c for c in calls if c._frame in running]

    @property
    def _users(self) -> int:
        """How many calls on the recorder are under way, on any thread (ADR 0080)."""
        return len(self._calls_under_way())

    def _events(self, rows: Sequence[Row], stream: str | None = None) -> list[Event]:
        """Decode rows (all of one stream, when ``stream`` is given) with their side rows."""
        topics = self._content_topics
        if stream is None:
            keys = {content_key(r[1], r[2]): r[0] for r in rows if r[3] in topics}
            with self._using():
                found_rows = self._recorder.select_payloads(list(keys)) if keys else {}
            content = {key: unsealed(row) for key, row in found_rows.items()}
            sided = {keys[key] for key in content}
        else:
            versions = [r[2] for r in rows if r[3] in topics]
            with self._using():
                found = self._recorder.select_content(stream, versions) if versions else {}
            content = {content_key(stream, v): unsealed(side) for v, side in found.items()}
            sided = {r[0] for r in rows if r[2] in found and r[3] in topics}
        decode = self.codec.decode
        # A row without a side row decodes straight from its stored shape: most events of a
        # run carry no content (a step's output is often None), and a long read (time travel,
        # replay) pays per row for anything more.
        return [
            self._event(row, content)
            if row[0] in sided
            else Event(
                position=row[0], stream=row[1], version=row[2], data=decode(row[3], row[4], row[0])
            )
            for row in rows
        ]

    def _event(self, row: Row, content: Mapping[str, bytes]) -> Event:
        position, stream, version, topic, state = row
        side = content.get(content_key(stream, version)) if topic in self._content_topics else None
        if side is not None and side[:1] in _WHOLE_EVENT:
            state, side = side, None  # an earlier release kept the whole event beside the shape
        data: DomainEvent = self.codec.decode(topic, state, position=position)
        if side is not None:
            # The full event while its content exists; the stored shape once it was erased.
            data = with_content(data, side, topic, position)
        return Event(position=position, stream=stream, version=version, data=data)

    def _check_open(self) -> None:
        if self._closed:
            raise JournalClosed(f"journal {self.config.url} is closed")


_CONTENT = msgspec.msgpack.Encoder()
_CONTENT_VALUES = msgspec.msgpack.Decoder(list[Any])
_WHOLE_EVENT = frozenset(bytes((b,)) for b in (*range(0x80, 0x90), 0xDE, 0xDF))
"""First bytes of a msgpack map: a side row holding a whole event (ADR 0018, before 0035). A
side row of this release is a msgpack array of the content values."""


class _Mark:
    """A counter threads bump and read without a lock around the read (an int is replaced whole)."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def bump(self) -> None:
        with self._lock:
            self.value += 1


_ERASED_HERE = _Mark()


def erasures_here() -> int:
    """Return a mark that every erasing append of this process (any journal) moves.

    Moved once the erasure committed (or failed), before its caller returns: a reader holding
    events read earlier compares it, at the cost of an attribute read, to tell whether a purge
    of this process may have erased their content since; other processes' erasures are counted
    in the database (:meth:`Journal.erasures`).
    """
    return _ERASED_HERE.value


def content_of(event: DomainEvent) -> bytes:
    """Encode an event's content values, in ``map_content`` order: its side row (ADR 0035)."""
    values: list[Any] = []

    def keep(value: Any) -> Any:
        values.append(value)
        return value

    event.map_content(keep)
    return _CONTENT.encode(values)


def with_content(shape: DomainEvent, side: bytes, topic: str, position: int | None) -> DomainEvent:
    """Put the content values of a side row back into an event's stored shape.

    Raises:
        CorruptEvent: the side row is not a list of as many values as the shape has content.
    """
    try:
        values = _CONTENT_VALUES.decode(side)
    except msgspec.DecodeError as exc:
        raise CorruptEvent(position, topic, f"malformed content payload: {exc}") from exc
    it = iter(values)
    missing = object()

    def put(_: Any) -> Any:
        value = next(it, missing)
        if value is missing:
            raise CorruptEvent(position, topic, "content payload has fewer values than its event")
        return value

    full = shape.map_content(put)
    if next(it, missing) is not missing:
        raise CorruptEvent(position, topic, "content payload has more values than its event")
    return full


def _guard(refuse_after: tuple[int, Sequence[str]]) -> tuple[int, tuple[str, ...]]:
    """Return an append's guard checked: a position, and topic prefixes that are texts."""
    position, prefixes = refuse_after
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
        raise ValueError(f"refuse_after's position must be an int >= 0, got {position!r}")
    if isinstance(prefixes, str) or not prefixes:
        raise ValueError(
            f"refuse_after's topic prefixes must be a non-empty sequence of texts, got {prefixes!r}"
        )
    if not all(isinstance(p, str) and p for p in prefixes):
        raise ValueError(f"refuse_after's topic prefixes must be non-empty texts: {prefixes!r}")
    return position, tuple(prefixes)


CONNECTION_LOST: tuple[type[Exception], ...] = (
    InterfaceError,
    OperationalError,
    JournalUnavailable,
)
"""What a read raises when the database went away under it (a server restart, a dropped
connection; past the journal's own retries, JournalUnavailable, ADR 0095): a follower reads
again rather than fail (ADR 0026)."""

__all__ = [
    "APP_NAME",
    "CONNECTION_LOST",
    "DIGEST_TABLE",
    "EVENTS_TABLE_POSTGRES",
    "PAYLOAD_TABLE",
    "SCRUB_TABLE",
    "SNAPSHOT_TABLE",
    "SUBSCRIPTION_TABLE",
    "ChainBroken",
    "CorruptEvent",
    "Journal",
    "Problem",
    "Row",
    "VerifyReport",
    "content_key",
    "disk_full",
    "erasures_here",
    "migrate",
    "truncate_wal",
]
