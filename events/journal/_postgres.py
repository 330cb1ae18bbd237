"""The PostgreSQL recorder, its explicit migration, and erasure by VACUUM FULL."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from eventsourcing.persistence import (
    DatabaseError,
    DataError,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    PersistenceError,
    ProgrammingError,
    StoredEvent,
)

try:
    import psycopg
    from eventsourcing.postgres import (
        PostgresApplicationRecorder,
        PostgresDatastore,
        PostgresFactory,
    )
    from psycopg import sql
    from psycopg.rows import DictRow, tuple_row
    from psycopg.types.composite import register_composite
    from psycopg_pool import PoolTimeout

    from journaled.events.journal import _pg_arrays
except ImportError as _exc:  # the "postgres" extra is not installed
    _POSTGRES_MISSING: str | None = str(_exc)
else:
    _POSTGRES_MISSING = None
    # Dumpers of our own wrapper types only: every connection made from now on has them.
    _pg_arrays.register(psycopg.adapters)

from journaled.events.errors import JournalUrlError
from journaled.events.journal._common import (
    _PG_ATTEMPTS,
    _PG_CONNECT_TIMEOUT,
    _PG_EVENT_TYPE,
    _PG_MAX_OVERFLOW,
    _PG_MIGRATE_LOCK,
    APP_NAME,
    EVENTS_TABLE_POSTGRES,
    OUTAGE_WAIT,
    PAYLOAD_TABLE,
    SCRUB_TABLE,
    SNAPSHOT_TABLE,
    SUBSCRIPTION_TABLE,
    LockWaitExpired,
    Row,
    SnapshotRefused,
    Unreached,
    causes,
    disk_full,
    erases,
    hide_password,
    refused_after,
)
from journaled.events.journal._digest import (
    DIGEST_TABLE,
    ChainBroken,
    DigestRow,
    chain,
    commit_parts,
    payload_hash,
)
from journaled.events.url import DEFAULT_LOCK_WAIT, JournalConfig


def _pg_ddl(*, proofs: bool = True) -> list[str]:
    """Return the journal's schema; the events table and type match the pinned library's own.

    ``proofs``: the flush table has its ``upto`` column, so this release's procedures are
    created too (ADR 0052); without it only the previous release's are.
    """
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
        f"CREATE TABLE IF NOT EXISTS public.{DIGEST_TABLE} (position bigint PRIMARY KEY, "
        "first bigint NOT NULL, prev bigint, hashes bytea NOT NULL, entries bytea, "
        "digest bytea NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS public.{SCRUB_TABLE} (id int PRIMARY KEY CHECK (id = 1), "
        "erased bigint NOT NULL, scrubbed bigint NOT NULL)",
        _SUBSCRIPTION_DDL,
        *_append_ddl(proofs=proofs),
    ]


APPEND_PROCEDURE = "journaled_append_v2"
"""The server-side append (ADR 0044, 0052); a new body gets a new name, so that processes of two
releases sharing a journal each call the body they were written for."""

DURABLE_FUNCTION = "journaled_durable_v2"
"""Returns the last position whose commit is on disk (ADR 0044, 0052)."""

APPEND_PROCEDURE_V1 = "journaled_append_v1"
DURABLE_FUNCTION_V1 = "journaled_durable_v1"
"""The previous release's bodies, kept for its processes: a journal migrated by it has only
these, and a process of this release that opens it without migrating calls them (ADR 0052)."""

FLUSH_TABLE = "journaled_flush"
"""One row per server process that appended: the write that makes an append's flush commit,
and (column ``upto``) the last position that commit proves durable (ADR 0052)."""

_CHAIN_BROKEN = "journaled: chain broken"
"""The prefix of the append procedure's error when the chain already reaches its positions."""


_LOCK_SLACK = 0.05
"""Seconds by which an append's own ``lock_wait`` must undercut the session's before the append
sets it for itself (a round trip more): callers pass what they have left, a hair below it."""
_PROVE_LOCK_WAIT = "200ms"
"""Longest wait of the flush made for an append whose call was cut off (ADR 0052)."""


def _sqlstates(exc: BaseException) -> Iterator[str]:
    """Yield the SQLSTATEs of an error and of the errors it was raised from or while, four deep,
    outermost first: none when no server answered it."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return
        state = getattr(seen, "sqlstate", None)
        if state is not None:
            yield str(state)
        seen = seen.__cause__ or seen.__context__


def lock_timed_out(exc: BaseException) -> bool:
    """Tell whether an error, or what caused it, is PostgreSQL's lock timeout (55P03)."""
    return "55P03" in _sqlstates(exc)


def _append_ddl(*, proofs: bool = True) -> list[str]:
    """Return the append procedure, its msgpack helper and the durable-position function.

    One ``CALL`` appends events and content rows in one round trip (ADR 0044). Its first
    transaction takes the events table's EXCLUSIVE lock (the lock every writer of every release
    takes, so ids stay in commit order, J1), inserts the events, upserts the content rows,
    extends the digest chain (R7) from the hashes and entries the client computed, notifies
    followers with ``note``, and commits without waiting for the disk: the lock is held for the
    statements alone, not for an fsync. Its second transaction writes one small row and commits
    waiting for the disk, which flushes the write-ahead log up to and past the first one: when
    the ``CALL`` returns, the append is durable. Appends of many processes thus share fsyncs.

    A committed but not yet flushed append is visible to other sessions, and a server crash
    would take it back; so readers read only up to :data:`DURABLE_FUNCTION`'s answer: the last
    position visible, once the log is flushed past everything committed when it looked.

    The chain's digest is SHA-256 over the previous digest, the msgpack array (first, last,
    prev) and the hashes and entries (:func:`journaled.events.journal._digest.commit_digest`),
    so the procedure encodes unsigned integers exactly as msgpack does: the smallest form.

    The previous release's procedure and function (``_v1``) are kept beside this release's, which
    differ in what an append's flush writes: the last position it proves durable, which lets the
    durable check answer without waiting on the log (ADR 0052).
    """
    return [
        # A journal of the previous release has this table without ``upto``:
        # :func:`_add_proof_column` adds it, outside the migration's transaction.
        f"CREATE TABLE IF NOT EXISTS public.{FLUSH_TABLE} "
        "(pid integer PRIMARY KEY, appends bigint NOT NULL, upto bigint)",
        "CREATE OR REPLACE FUNCTION public.journaled_mp_uint(v bigint) RETURNS bytea "
        "LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT CASE "
        "WHEN v IS NULL THEN '\\xc0'::bytea "
        "WHEN v < 128 THEN substring(int8send(v) FROM 8 FOR 1) "
        "WHEN v < 256 THEN '\\xcc'::bytea || substring(int8send(v) FROM 8 FOR 1) "
        "WHEN v < 65536 THEN '\\xcd'::bytea || substring(int8send(v) FROM 7 FOR 2) "
        "WHEN v < 4294967296 THEN '\\xce'::bytea || substring(int8send(v) FROM 5 FOR 4) "
        "ELSE '\\xcf'::bytea || int8send(v) END $$",
        _append_procedure(APPEND_PROCEDURE_V1, _FLUSH_V1),
        _durable_function(DURABLE_FUNCTION_V1, proof=False),
        *(
            [
                _append_procedure(APPEND_PROCEDURE, _FLUSH_V2),
                _durable_function(DURABLE_FUNCTION, proof=True),
            ]
            if proofs
            else []
        ),
    ]


_PROOF_COLUMN_LOCK_WAIT = "500ms"
"""Longest wait of the upgrading open's ``ALTER TABLE`` for the flush table (ADR 0052)."""


def _add_proof_column(conn: Any) -> bool:
    """Give a previous release's flush table its ``upto`` column; tell whether it has it.

    ``ALTER TABLE`` takes the table's ACCESS EXCLUSIVE lock, which waits for every reader of it
    (a backup holds one until it ends). It runs only when the column is missing, in its own
    transaction and with a short lock timeout, so that nothing else of the migration (whose
    index statement holds the events table against writers) waits behind it: when the lock
    cannot be had, the journal keeps the previous release's procedures until a later open.
    """
    with conn.transaction():  # each block its own transaction: the migration's comes after
        row = conn.execute(
            "SELECT to_regclass(%s) IS NULL OR EXISTS (SELECT 1 FROM pg_attribute "
            "WHERE attrelid = to_regclass(%s) AND attname = 'upto' AND NOT attisdropped)",
            [f"public.{FLUSH_TABLE}", f"public.{FLUSH_TABLE}"],
        ).fetchone()
    if row is not None and row[0]:
        return True  # created with it below, or already there
    try:
        with conn.transaction():
            conn.execute(f"SET LOCAL lock_timeout = '{_PROOF_COLUMN_LOCK_WAIT}'")
            conn.execute(f"ALTER TABLE public.{FLUSH_TABLE} ADD COLUMN IF NOT EXISTS upto bigint")
    except psycopg.errors.LockNotAvailable:
        return False
    return True


_FLUSH_V1 = (
    f"INSERT INTO public.{FLUSH_TABLE} AS f VALUES (pg_backend_pid(), 1) "  # noqa: S608
    "ON CONFLICT (pid) DO UPDATE SET appends = f.appends + 1; "
)


def _prove(position: str) -> str:
    """Return the flush table's write that proves ``position`` (an SQL expression) durable.

    The proof (ADR 0052): a commit that waits for the disk becomes visible only once it is
    flushed, so a visible ``upto`` says every position up to it is on disk. A session that does
    not wait (synchronous_commit = off) proves nothing and writes NULL, which max skips.
    """
    return (
        f"INSERT INTO public.{FLUSH_TABLE} AS f (pid, appends, upto) VALUES (pg_backend_pid(), 1, "  # noqa: S608
        f"CASE WHEN current_setting('synchronous_commit') <> 'off' THEN {position} END) "
        "ON CONFLICT (pid) DO UPDATE SET appends = f.appends + 1, "
        "upto = greatest(f.upto, EXCLUDED.upto)"
    )


_FLUSH_V2 = _prove("positions[n]") + "; "
"""The second transaction of an append: the write whose commit waits for the disk."""

_PROVE_IN_TRANSACTION = _prove("%s::bigint")
"""The library's append (snapshots, erasures, guarded appends) proves its positions too, in its
own transaction: it commits waiting for the disk, unless the session chose otherwise."""


def _append_procedure(name: str, flush: str) -> str:
    """Return an append procedure whose second transaction runs ``flush`` (ADR 0044)."""
    events = EVENTS_TABLE_POSTGRES
    return (
        f"CREATE OR REPLACE PROCEDURE public.{name}("  # noqa: S608 - our own names
        "ids text[], versions bigint[], topics text[], states bytea[], keys text[], "
        "payloads bytea[], hashes bytea, entries bytea, chained boolean, channel text, "
        "note text, INOUT positions bigint[] DEFAULT NULL) "
        "LANGUAGE plpgsql AS $body$ "
        "DECLARE head_position bigint; head_digest bytea; n int; "
        "BEGIN "
        "PERFORM set_config('synchronous_commit', 'off', true); "
        f"LOCK TABLE public.{events} IN EXCLUSIVE MODE; "
        f"WITH ins AS (INSERT INTO public.{events} "
        "(originator_id, originator_version, topic, state) "
        "SELECT * FROM unnest(ids, versions, topics, states) RETURNING notification_id) "
        "SELECT array_agg(notification_id ORDER BY notification_id) INTO positions FROM ins; "
        "n := cardinality(positions); "
        "IF cardinality(keys) > 0 THEN "
        f"INSERT INTO public.{PAYLOAD_TABLE} (stream, payload) "
        "SELECT * FROM unnest(keys, payloads) "
        "ON CONFLICT (stream) DO UPDATE SET payload = EXCLUDED.payload; "
        "END IF; "
        "IF chained THEN "
        f"SELECT position, digest INTO head_position, head_digest FROM public.{DIGEST_TABLE} "
        "ORDER BY position DESC LIMIT 1; "
        "IF head_position >= positions[1] THEN "
        f"RAISE EXCEPTION '{_CHAIN_BROKEN} %', head_position; "
        "END IF; "
        "IF positions[n] - positions[1] <> n - 1 THEN "
        "RAISE EXCEPTION 'journaled: positions % of one append are not consecutive', positions; "
        "END IF; "
        f"INSERT INTO public.{DIGEST_TABLE} (position, first, prev, hashes, entries, digest) "
        "VALUES (positions[n], positions[1], head_position, hashes, entries, "
        "substring(sha256(coalesce(head_digest, ''::bytea) || '\\x93'::bytea "
        "|| public.journaled_mp_uint(positions[1]) || public.journaled_mp_uint(positions[n]) "
        "|| public.journaled_mp_uint(head_position) || hashes || coalesce(entries, ''::bytea)) "
        "FROM 1 FOR 16)); "
        "END IF; "
        "PERFORM pg_notify(channel, note); "
        "COMMIT; "
        f"{flush}"
        "COMMIT; "
        "END $body$"
    )


def _durable_function(name: str, *, proof: bool) -> str:
    """Return the function that answers the last position on disk (ADR 0044; with ``proof``,
    ADR 0052: answered at once when the flush table proves every visible position durable)."""
    events = EVENTS_TABLE_POSTGRES
    # STABLE: its max() sees the calling statement's snapshot, so a read bounded by it never
    # skips a row that snapshot cannot see; the log positions read afterwards are fresh.
    return (
        f"CREATE OR REPLACE FUNCTION public.{name}() RETURNS bigint "  # noqa: S608
        "LANGUAGE plpgsql STABLE AS $body$ "
        f"DECLARE last bigint; upto pg_lsn;{' proven bigint;' if proof else ''} "
        "BEGIN "
        f"SELECT max(notification_id) INTO last FROM public.{events}; "
        + (
            # A server configured not to wait for the disk on commit (synchronous_commit = off
            # in its configuration or on its command line, not for this role, database or
            # session alone) has chosen to show commits before they are durable; and a standby
            # has what it replayed. A reader whose own role does not wait proves nothing of the
            # writers' commits, so it is answered as any other (ADR 0052).
            "IF pg_is_in_recovery() THEN RETURN coalesce(last, 0); END IF; "  # noqa: S608
            "IF current_setting('synchronous_commit') = 'off' AND (SELECT source FROM pg_settings "
            "WHERE name = 'synchronous_commit') IN ('configuration file', 'command line', "
            "'environment variable', 'default') THEN RETURN coalesce(last, 0); END IF; "
            # Read after the max, in the same snapshot: a proof covers what the max saw or less.
            f"SELECT max(f.upto) INTO proven FROM public.{FLUSH_TABLE} f; "
            "IF last IS NULL OR proven >= last THEN RETURN coalesce(last, 0); END IF; "
            if proof
            # A server that does not wait for the disk on commit (synchronous_commit = off) has
            # chosen to show commits before they are durable; and a standby has what it replayed.
            else "IF pg_is_in_recovery() OR current_setting('synchronous_commit') = 'off' THEN "
            "RETURN coalesce(last, 0); END IF; "
        )
        # Read after the max: every commit it saw was inserted in the log before this point.
        + "upto := pg_current_wal_insert_lsn(); "
        "WHILE pg_current_wal_flush_lsn() < upto LOOP PERFORM pg_sleep(0.0002); END LOOP; "
        "RETURN coalesce(last, 0); "
        "END $body$"
    )


_SUBSCRIPTION_DDL = (
    f"CREATE TABLE IF NOT EXISTS public.{SUBSCRIPTION_TABLE} "
    "(name text PRIMARY KEY, position bigint NOT NULL)"
)


_SCRUB_LOCK_TIMEOUT = "200ms"
"""Longest VACUUM FULL waits for its lock, during which later writers queue behind it."""

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
            **KEEPALIVES,
        )
    except psycopg.Error as exc:
        reason = hide_password(str(exc).strip(), config.password)
        if any(words in reason for words in _NO_SLOT):
            raise JournalUrlError(
                f"cannot connect to the PostgreSQL journal {config.url}: {reason}. The server "
                "has no connection left for it: a runtime needs pool_size + "
                f"{_PG_MAX_OVERFLOW + _PG_OWN_CONNECTIONS} connections at most (here "
                f"{config.pool_size + _PG_MAX_OVERFLOW + _PG_OWN_CONNECTIONS}), so give the URL "
                "a smaller ?pool_size= or raise the server's, the role's or the database's "
                "connection limit"
            ) from None
        raise JournalUrlError(
            f"cannot connect to the PostgreSQL journal {config.url}: {reason} (check the host, "
            "port, user, password and database name, and that the server accepts connections)"
        ) from None


_LIVE_BACKEND = "SELECT 1 FROM pg_stat_activity WHERE pid = %s"
"""Whether a server process lives. One whose client went away may still run the call, or not
even have read it yet (its state is then ``idle``): only its end makes a look sure."""


def went_away(exc: BaseException) -> bool:
    """Tell whether an error means the connection or the server went away, rather than an
    answer from the server: no SQLSTATE at all (a closed socket, a pool with no connection to
    give), class 08, or the server shutting the session down (57P01-57P03)."""
    state = next(_sqlstates(exc), None)
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


def _gone(reached: Sequence[Any]) -> bool:
    """Tell whether a call's connection went away: none was had, or it broke. Else the server
    answered the call with its error, and the connection is alive and idle again."""
    return not reached or bool(reached[1].broken)


def _retryable(exc: BaseException) -> bool:
    """Tell whether the server answered with an error a call made again may not meet: a
    serialization failure or a deadlock (class 40), the transaction rolled back whole."""
    return next(_sqlstates(exc), "").startswith("40")


class _StillRunning(Exception):
    """A look after a dropped append could not tell yet: the call's server process still runs,
    or the commit it found is not on disk yet (ADR 0095)."""


_LOOK_FAILED = (InterfaceError, OperationalError, _StillRunning, Unreached)
"""What a look after a failed append may raise: the outcome stays unknown."""


_LIBRARY_ERRORS: tuple[tuple[type[Exception], type[PersistenceError]], ...] = (
    ()
    if _POSTGRES_MISSING is not None
    else (
        (psycopg.InterfaceError, InterfaceError),
        (psycopg.OperationalError, OperationalError),
        (psycopg.DataError, DataError),
        (psycopg.IntegrityError, IntegrityError),
        (psycopg.InternalError, InternalError),
        (psycopg.ProgrammingError, ProgrammingError),
        (psycopg.NotSupportedError, NotSupportedError),
        (psycopg.DatabaseError, DatabaseError),
    )
)
"""psycopg's errors and what eventsourcing's ``PostgresDatastore.get_connection`` raises for
each, in its order (the first that matches)."""

KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}
"""TCP settings of every connection (libpq's): a connection the network drops without a word (a
NAT or a firewall forgetting it, a server host gone) is found dead within about 25 s idle, or
30 s with data unacknowledged, instead of the kernel's minutes; the append's retries and looks
then take over (ADR 0095)."""

_NO_SLOT = (
    "too many connections",
    "too many clients",
    "remaining connection slots are reserved",
)
"""What the server says when a connection limit (the server's, a role's, a database's) is met."""
_PG_OWN_CONNECTIONS = 2
"""Connections a runtime holds beside its pool: the follower's listener and one for schema
checks and migration at open."""


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
            proofs = _add_proof_column(conn)
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", [_PG_MIGRATE_LOCK])
                found = conn.execute("SELECT to_regtype(%s)", [f"public.{_PG_EVENT_TYPE}"])
                row = found.fetchone()
                if row is None or row[0] is None:  # CREATE TYPE has no IF NOT EXISTS
                    conn.execute(
                        f"CREATE TYPE public.{_PG_EVENT_TYPE} AS (originator_id text, "
                        "originator_version bigint, topic text, state bytea)"
                    )
                for statement in _pg_ddl(proofs=proofs):
                    conn.execute(statement)
        except psycopg.Error as exc:
            raise JournalUrlError(
                f"cannot create the journal's tables in {config.url}: "
                f"{hide_password(str(exc).strip(), config.password)}"
            ) from None


def migrate_subscriptions(config: JournalConfig) -> None:
    """Create the named subscriptions' table alone (A3): a journal opened without migrating.

    Serialised with :func:`migrate` by the same advisory lock.
    """
    with _pg_connect(config) as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [_PG_MIGRATE_LOCK])
        conn.execute(_SUBSCRIPTION_DDL)


def _pg_chained(config: JournalConfig) -> bool:
    """Tell whether a PostgreSQL journal has the digest tables (R7; older ones lack them)."""
    with _pg_connect(config) as conn:
        row = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL",
            [f"public.{DIGEST_TABLE}"],
        ).fetchone()
        return bool(row and row[0])


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

        track_scrub = True
        """Whether the journal has its scrub table (one created by an older release and opened
        only for reading has not, and then erasures are not counted)."""

        datastore: Any
        """The library's :class:`PostgresDatastore`, declared ``Any`` so that code reaching
        through ``Journal._recorder.datastore`` for SQLite's cursors keeps one cursor type; this
        class uses the typed :attr:`_store`."""

        chained = True
        """Extend the digest chain on append (R7): off on a journal without its tables (and to
        measure its cost, bench/journal.py)."""

        lock_wait: float = DEFAULT_LOCK_WAIT
        """Seconds an append waits for the events table's lock (``JournalConfig.lock_wait``):
        every connection's ``lock_timeout``, set when it connects (ADR 0039)."""

        def _lock_table(self, curs: psycopg.Cursor[DictRow]) -> None:
            # The library's sets ``lock_timeout`` to its own setting first (0: wait forever);
            # the connection's, or the one :meth:`_insert_events` set for the append, bounds it.
            curs.execute(self._lock_statement, prepare=True)

        @property
        def _lock_statement(self) -> Any:
            return self.lock_table_statements[-1]

        @property
        def _store(self) -> PostgresDatastore:
            store: PostgresDatastore = self.datastore
            return store

        def _insert_events(
            self, curs: psycopg.Cursor[DictRow], stored_events: Sequence[StoredEvent], **kwargs: Any
        ) -> None:
            if "backend" in kwargs:  # whose end a look after a drop must wait for (ADR 0095)
                kwargs["backend"][:] = [curs.connection.info.backend_pid, curs.connection]
            payloads: Mapping[str, bytes] = kwargs.get("payloads") or {}
            forget: Sequence[str] = kwargs.get("forget") or ()
            dropped: str | None = kwargs.get("drop_snapshots")
            snapshots: Mapping[str, tuple[int, bytes]] = kwargs.get("snapshots") or {}
            wait: float | None = kwargs.get("lock_wait")
            if wait is not None and wait < self.lock_wait - _LOCK_SLACK:
                curs.execute(f"SET LOCAL lock_timeout = '{max(1, int(wait * 1000))}ms'")
            guard = refused_after(kwargs)
            if not (payloads or forget or dropped or snapshots or guard):
                return
            self._lock_table(curs)
            if guard is not None:
                # After the lock: every append is serialised with this check (R2).
                after, prefixes = guard
                curs.execute(
                    f"SELECT 1 FROM public.{self.events_table_name} "  # noqa: S608
                    "WHERE notification_id > %s AND EXISTS "
                    "(SELECT 1 FROM unnest(%s::text[]) AS p WHERE starts_with(topic, p)) LIMIT 1",
                    [after, list(prefixes)],
                )
                if curs.fetchone() is not None:
                    raise SnapshotRefused
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
            if self.track_scrub and erases(kwargs):
                # The scrub this erasure owes, durable with it: a crash before the scrub leaves it.
                curs.execute(
                    f"INSERT INTO public.{SCRUB_TABLE} AS s VALUES (1, 1, 0) "  # noqa: S608
                    "ON CONFLICT (id) DO UPDATE SET erased = s.erased + 1"
                )

        fast = False
        """Append events and content rows through the append procedure, and read only what
        is durable (set at open when the journal has them; one migrated by an older release has
        not, and every writer of it commits waiting for the disk, ADR 0044)."""

        proves = False
        """This release's procedures (ADR 0052): appends record in the flush table what their
        flush proves durable, and the durable check answers at once from it."""

        _append_call = ""
        _durable_call = ""

        def use_procedures(self, version: int) -> None:
            """Append and check durability through the procedures of ``version`` (2: this
            release's, 1: the previous release's, 0: none, the library's append)."""
            self.fast, self.proves = version >= 1, version >= 2
            append, durable = (
                (APPEND_PROCEDURE, DURABLE_FUNCTION)
                if version >= 2
                else (APPEND_PROCEDURE_V1, DURABLE_FUNCTION_V1)
            )
            self._append_call = _APPEND_CALL.format(procedure=append)
            self._durable_call = f"SELECT public.{durable}()"
            if not version:  # just looked; what its writers committed so far is on disk
                self._looked = time.monotonic()
                self.max_notification_id()

        durable = 0
        """A position known to be on disk with everything before it: reads up to it need no
        check. Raised by this process's appends and by each check."""

        def _known_durable(self, position: int) -> None:
            # Two threads may race here: the lower answer winning only costs a later read a check.
            self.durable = max(self.durable, position)

        _looked = 0.0
        """When a journal without procedures was last looked at for them (monotonic seconds)."""

        def _look_for_procedures(self) -> None:
            """Take the procedures another process's migration created since the open (at most
            one look a second); until then reads stop short of what they could leave unflushed
            (:meth:`_bounded`)."""
            now = time.monotonic()
            if self.fast or now - self._looked < 1.0:
                return
            self._looked = now
            version = _version_of(self._fetch(_VERSION_QUERY, _VERSION_PARAMS)[0])
            if version:
                self.use_procedures(version)

        def _bounded(self, upto: int | None) -> tuple[str, list[Any]]:
            """Return the condition that keeps a read at or below ``upto`` and what is durable."""
            self._look_for_procedures()
            if self.fast and (upto is None or upto > self.durable):
                clause = f" AND notification_id <= ({self._durable_call})"
                if upto is None:
                    return clause, []
                return clause + " AND notification_id <= %s", [upto]
            clause, params = "", []
            if not self.fast:
                # Rows of a journal whose writers all wait for the disk; should procedures
                # (and appends that commit before their flush) appear during this read, only
                # what was known durable before it.
                clause, params = f" AND ({_NO_PROCEDURES} OR notification_id <= %s)", [self.durable]
            if upto is None:
                return clause, params
            return clause + " AND notification_id <= %s", [*params, upto]

        def max_notification_id(self) -> int | None:
            """Return the last position on disk (the library's max on an older journal)."""
            self._look_for_procedures()
            if not self.fast:
                rows = self._fetch(
                    f"SELECT {_NO_PROCEDURES}, max(notification_id) "  # noqa: S608
                    f"FROM public.{self.events_table_name}",
                    [],
                )
                if rows[0][0]:  # still none: every commit seen is on disk
                    found = None if rows[0][1] is None else int(rows[0][1])
                    if found is not None:
                        self._known_durable(found)
                    return found
                self._looked = 0.0  # they appeared since the last look: take them now
                self._look_for_procedures()
                if not self.fast:  # dropped again in between: what was known durable
                    return self.durable
            rows = self._fetch(self._durable_call, [])
            position = int(rows[0][0] or 0)
            self._known_durable(position)
            return position

        def insert_events(
            self, stored_events: Sequence[StoredEvent], **kwargs: Any
        ) -> Sequence[int] | None:
            """Append in one round trip when only events and content rows are written (ADR
            0044); otherwise as the library does, carrying a holder for the chain's head (R7).

            Raises:
                LockWaitExpired: the events table stayed locked for ``lock_wait`` (the
                    keyword's, else the journal's); nothing was stored.
            """
            started = time.monotonic()
            try:
                return self._insert(stored_events, **kwargs)
            except (LockWaitExpired, Unreached):
                raise  # an Unreached may have come from a look's lock timeout: not the call's
            except Exception as exc:
                if lock_timed_out(exc):
                    raise LockWaitExpired(time.monotonic() - started) from exc
                raise

        def _insert(
            self, stored_events: Sequence[StoredEvent], **kwargs: Any
        ) -> Sequence[int] | None:
            if (
                self.fast
                and stored_events
                and not (
                    kwargs.get("forget")
                    or kwargs.get("snapshots")
                    or kwargs.get("drop_snapshots")
                    or refused_after(kwargs)
                )
            ):
                side, note = kwargs.get("payloads") or {}, kwargs.get("note")
                appended: list[int] = self._append(
                    stored_events, side, note, kwargs.get("lock_wait"), kwargs.get("channel")
                )
                self._known_durable(appended[-1])
                return appended
            # The library's append without its retry, which would also retry a lock timeout
            # (ten waits of ``lock_wait``): a dropped connection is retried here, a timeout not.
            # A dropped connection may have come after the commit: before calling again, the
            # log is looked at (the transaction held the events and all else, whole or not at
            # all), lest the call meet the append's own events as another writer's (ADR 0095).
            library_append = PostgresApplicationRecorder.insert_events.__wrapped__
            started, sent = time.monotonic(), False
            backend: list[int] = []
            gone = False  # the last call's connection went away (else the server answered)
            answered = 0  # calls the server answered with an error
            given: float | None = kwargs.get("lock_wait")
            budget = self.lock_wait if given is None else given
            for attempt in itertools.count(1):
                if sent and stored_events:
                    sure, found = self._look_again(stored_events, backend if gone else [], started)
                    if not sure:
                        continue
                    if found is not None:
                        return found
                    sent = False
                options = kwargs
                if attempt > 1:  # only what the caller has left of its lock_wait
                    wait = budget - (time.monotonic() - started)
                    if wait <= 0:
                        raise LockWaitExpired(budget)  # looked: nothing of it is stored
                    options = {**kwargs, "lock_wait": wait}
                reached: list[Any] = []
                try:
                    positions: Sequence[int] | None = library_append(
                        self, stored_events, **options, head=[], backend=reached
                    )
                    break
                except (InterfaceError, OperationalError) as exc:
                    if lock_timed_out(exc) or disk_full(exc) is not None:
                        raise  # rolled back, and would be again
                    gone = _gone(reached)
                    if reached:  # a transaction was begun: it may have committed unseen
                        backend[:], sent = reached[:1], True
                    if gone:
                        self._outage(started, sent, exc)
                        continue
                    answered += 1
                    if answered >= _PG_ATTEMPTS and not _retryable(exc):
                        raise  # answered, and rolled back whole: the caller's error
                    time.sleep(min(0.05, 0.001 * 2**attempt))
            if positions:  # committed waiting for the disk, after every lower position
                self._known_durable(positions[-1])
            return positions

        def _append(
            self,
            stored_events: Sequence[StoredEvent],
            payloads: Mapping[str, bytes],
            note: Any,
            lock_wait: float | None = None,
            channel: str | None = None,
        ) -> list[int]:
            """Call the append procedure: one statement, one round trip; durable on return.

            The procedure notifies ``channel`` (default: the main one, the library's) with
            ``note``; the journal picks the quiet channel for appends followers skip (ADR 0057).

            A ``lock_wait`` shorter than the connection's is set around the call (two round
            trips more, only for a caller short of time). A lock timeout is not retried.

            A dropped connection is retried, but first the call's server process is waited
            for and the append looked up: its first transaction (the events) may have
            committed before the connection went, and calling again would then meet the
            append's own events and report another writer's win (ADR 0052). Both go on for
            :data:`OUTAGE_WAIT` seconds; then :class:`Unreached` says whether a call may have
            been stored unseen (ADR 0095).
            """
            backend: list[int] = []
            sent = False  # a call may have reached the server unanswered, and no look since
            gone = False  # the last call's connection went away (else the server answered)
            failed: Exception | None = None  # the last call's error
            answered = 0  # calls the server answered with an error
            started = time.monotonic()
            budget = self.lock_wait if lock_wait is None else lock_wait
            for attempt in itertools.count(1):
                if sent:
                    # Answered, the call is over: the look is sure at once. Gone, the call's
                    # server process may not even have read it yet: the look waits for that
                    # process to end (its state says nothing of bytes it has not read).
                    sure, found = self._look_again(stored_events, backend if gone else [], started)
                    if not sure:
                        continue
                    if found is not None:
                        return found
                    sent = False  # not stored
                    if failed is not None and not gone:
                        if answered >= _PG_ATTEMPTS and not _retryable(failed):
                            raise failed  # answered and rolled back: the caller's error
                        time.sleep(min(0.05, 0.001 * 2**attempt))
                wait, timeout = lock_wait, None
                if attempt > 1:
                    # A retry waits for the lock only what the caller has left of its
                    # lock_wait (nothing is stored after the caller was told it failed),
                    # and for a connection only what is left of the window.
                    wait = budget - (time.monotonic() - started)
                    if wait <= 0:
                        raise LockWaitExpired(budget)  # looked: nothing of it is stored
                    timeout = self._left(started)[0]
                reached: list[Any] = []
                try:
                    return self._call_append(
                        stored_events, payloads, note, wait, reached, channel, timeout
                    )
                except LockWaitExpired as exc:
                    if attempt == 1:
                        raise
                    raise LockWaitExpired(time.monotonic() - started) from exc  # in all
                except (InterfaceError, OperationalError) as exc:
                    failed = exc
                    gone = _gone(reached)
                    answered += not gone
                    if reached:  # a connection was had: the call may have been sent
                        backend[:], sent = reached[:1], True
                    if disk_full(exc) is not None:
                        # The server answered, and a call again would meet the full disk
                        # again (ADR 0081). The events' transaction may have committed before
                        # the failure: look once, and if the look fails, it is not known.
                        try:
                            found = self._appended_already(stored_events, [], *self._left(started))
                        except _LOOK_FAILED as e:
                            raise Unreached(time.monotonic() - started, True, e) from exc
                        if found is not None:
                            return found
                        raise
                    if not sent and not gone:
                        raise  # answered before any call was sent
                    if gone:
                        self._outage(started, sent, exc)
            raise AssertionError("unreachable")  # pragma: no cover

        def _look_again(
            self, stored_events: Sequence[StoredEvent], backend: list[int], started: float
        ) -> tuple[bool, list[int] | None]:
            """Look whether a failed call of an append begun at ``started`` was stored: (True,
            its positions or None when it was not), or (False, None) when the look failed,
            after a pause (:class:`Unreached` once the window is over)."""
            try:
                return True, self._appended_already(stored_events, backend, *self._left(started))
            except _LOOK_FAILED as exc:
                self._outage(started, True, exc)
                return False, None

        def _outage(self, started: float, sent: bool, exc: BaseException) -> None:
            """Wait a little before trying again; raise :class:`Unreached` once the window of
            an append begun at ``started`` is over."""
            waited = time.monotonic() - started
            if waited >= OUTAGE_WAIT:
                raise Unreached(waited, sent, exc, busy=self._all_in_use(exc)) from exc
            time.sleep(min(0.2, max(0.0, OUTAGE_WAIT - waited)))

        def _all_in_use(self, exc: BaseException) -> int:
            """Return the pool's size when ``exc`` is a wait for a connection that timed out with
            none of them free while the database answers a connection of its own, else 0: the
            database is there, and what is short is this process's connections.

            The pool's counts alone cannot tell: in an outage its connections being made again
            count as held too. So a fresh connection, outside the pool, is tried once (at most
            libpq's 2 s), on this failure's path alone.
            """
            if not any(isinstance(e, PoolTimeout) for e in causes(exc)):
                return 0
            pool = self._store.pool
            try:
                stats = pool.get_stats()
                if stats.get("pool_available", 1) or stats.get("pool_max", 0) <= 0:
                    return 0
                info = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
                given = pool.kwargs() if callable(pool.kwargs) else pool.kwargs
                with psycopg.connect(info, **{**(given or {}), "connect_timeout": 2}):
                    pass
            except Exception:  # the database did not answer either: an outage after all
                return 0
            return int(stats["pool_max"])

        @staticmethod
        def _left(started: float) -> tuple[float, float]:
            """Return the seconds left of an append's outage window (begun at ``started``) and
            its end, on the monotonic clock."""
            until = started + OUTAGE_WAIT
            return max(0.05, until - time.monotonic()), until

        def _appended_already(
            self,
            stored_events: Sequence[StoredEvent],
            backend: list[int],
            timeout: float | None = None,
            until: float | None = None,
        ) -> list[int] | None:
            """Return the positions of an append found whole in the log once the server process
            that ran it has ended or gone idle (and its commit is on disk); None when it is not
            there.

            ``timeout`` bounds each wait for a connection; ``until`` (monotonic) bounds the
            whole look, past which :class:`_StillRunning` says the outcome is not known yet:
            the process has not ended, or the commit seen is not on disk yet (ADR 0095).
            """
            deadline = until if until is not None else time.monotonic() + max(self.lock_wait, 1.0)

            def bound() -> float | None:
                return timeout if until is None else max(0.05, until - time.monotonic())

            if backend:
                # The call's connection went away: sure once its server process has ended.
                while self._fetch(_LIVE_BACKEND, [backend[0]], bound()):
                    if time.monotonic() >= deadline:
                        raise _StillRunning(f"the call's server process {backend[0]} still runs")
                    time.sleep(0.05)
            rows = self._fetch(
                f"SELECT e.notification_id, e.state FROM unnest(%s::text[], %s::bigint[]) "  # noqa: S608
                f"WITH ORDINALITY AS k(id, v, i) JOIN public.{self.events_table_name} e "
                "ON e.originator_id = k.id AND e.originator_version = k.v ORDER BY k.i",
                [
                    [str(e.originator_id) for e in stored_events],
                    [e.originator_version for e in stored_events],
                ],
                bound(),
            )
            if len(rows) != len(stored_events) or any(
                bytes(state) != e.state for (_, state), e in zip(rows, stored_events, strict=True)
            ):
                return None  # not appended (or another writer's: calling again says so)
            positions = [int(r[0]) for r in rows]
            if self.proves:
                # The flush the call did not get to: its commit waits for the disk, which
                # flushes the log past the append's commit, and records the proof. Should this
                # process's row be locked, the durable check below waits for the log instead.
                with self._connection(bound()) as conn:
                    try:
                        with conn.transaction():
                            conn.execute(f"SET LOCAL lock_timeout = '{_PROVE_LOCK_WAIT}'")
                            conn.execute(_PROVE_IN_TRANSACTION, [positions[-1]])
                    except (psycopg.errors.LockNotAvailable, psycopg.errors.DiskFull):
                        pass  # the durable check below waits for the log instead
            while int(self._fetch(self._durable_call, [], bound())[0][0] or 0) < positions[-1]:
                if until is not None and time.monotonic() >= until:
                    raise _StillRunning(f"position {positions[-1]} is not on disk yet")
                time.sleep(0.01)  # the check waits for the log's flush; it cannot fall short
            self._known_durable(positions[-1])
            return positions

        def _call_append(
            self,
            stored_events: Sequence[StoredEvent],
            payloads: Mapping[str, bytes],
            note: Any,
            lock_wait: float | None,
            backend: list[Any],
            channel: str | None = None,
            timeout: float | None = None,
        ) -> list[int]:
            events = [
                (str(e.originator_id), e.originator_version, e.topic, e.state)
                for e in stored_events
            ]
            hashes, entries = commit_parts(events, payloads, ()) if self.chained else ([], None)
            pack = _pg_arrays
            params = [
                pack.text_array([e[0] for e in events]),
                pack.int8_array([e[1] for e in events]),
                pack.text_array([e[2] for e in events]),
                pack.bytea_array([e[3] for e in events]),
                pack.text_array(list(payloads)),
                pack.bytea_array(list(payloads.values())),
                b"".join(hashes),
                entries,
                self.chained,
                channel or self.channel_name,
                note if isinstance(note, str) else "",
            ]
            with (
                self._connection(timeout) as conn,
                conn.cursor(row_factory=tuple_row) as curs,
            ):
                backend[:] = [conn.info.backend_pid, conn]
                own = lock_wait is not None and lock_wait < self.lock_wait - _LOCK_SLACK
                try:
                    if own:
                        assert lock_wait is not None
                        curs.execute(f"SET lock_timeout = '{max(1, int(lock_wait * 1000))}ms'")
                    curs.execute(self._append_call, params, prepare=True, binary=True)
                    found = curs.fetchone()  # before a RESET takes the cursor's result
                except psycopg.errors.LockNotAvailable as exc:
                    raise LockWaitExpired(lock_wait or self.lock_wait) from exc
                except psycopg.errors.RaiseException as exc:
                    text = str(exc).strip()
                    if text.startswith(_CHAIN_BROKEN):
                        raise ChainBroken(
                            f"cannot append: the journal's digest chain already reaches position "
                            f"{text.removeprefix(_CHAIN_BROKEN).split()[0]}, so events at its end "
                            "were removed outside the journal; run `journaled journal verify`"
                        ) from None
                    raise
                finally:
                    if own:
                        curs.execute("RESET lock_timeout")
            assert found is not None
            return [int(p) for p in found[0]]

        def _notify_channel(self, curs: psycopg.Cursor[DictRow]) -> None:
            """Notify nothing here: :meth:`_insert_stored_events` notifies with the note."""

        def _insert_stored_events(
            self, curs: psycopg.Cursor[DictRow], stored_events: Sequence[StoredEvent], **kwargs: Any
        ) -> None:
            # In place of the library's bare NOTIFY (see _notify_channel): the journal's note
            # and, for runs alone, the quiet channel, as the append procedure's (ADR 0057).
            # Sent at the commit; first here, since the library reads the INSERT's result last.
            note = kwargs.get("note")
            curs.execute(
                sql.SQL("NOTIFY {0}, {1}").format(
                    sql.Identifier(kwargs.get("channel") or self.channel_name),
                    sql.Literal(note if isinstance(note, str) else ""),
                )
            )
            super()._insert_stored_events(curs, stored_events, **kwargs)
            if self.chained:
                # Queued in the same pipeline after the INSERT, which holds the table's EXCLUSIVE
                # lock: the head read is the last committed event's, and costs no round trip.
                head = curs.connection.cursor(row_factory=tuple_row)
                head.execute(
                    f"SELECT position, digest FROM public.{DIGEST_TABLE} "  # noqa: S608
                    "ORDER BY position DESC LIMIT 1"
                )
                kwargs["head"][:] = [head]

        def _fetch_ids_after_insert_events(
            self, curs: psycopg.Cursor[DictRow], stored_events: Sequence[StoredEvent], **kwargs: Any
        ) -> Sequence[int] | None:
            positions = super()._fetch_ids_after_insert_events(curs, stored_events, **kwargs)
            if positions and self.proves:
                # In the append's own transaction, which waits for the disk (ADR 0052).
                curs.execute(_PROVE_IN_TRANSACTION, [positions[-1]])
            if not self.chained or not positions:
                return positions
            with kwargs["head"][0] as cursor:
                found = cursor.fetchone()
                rows = chain(
                    (int(found[0]), bytes(found[1])) if found else None,
                    positions,
                    [
                        (str(e.originator_id), e.originator_version, e.topic, e.state)
                        for e in stored_events
                    ],
                    kwargs.get("payloads") or {},
                    kwargs.get("forget") or (),
                )
                values = ",".join(["(%s,%s,%s,%s,%s,%s)"] * len(rows))
                cursor.execute(
                    f"INSERT INTO public.{DIGEST_TABLE} "  # noqa: S608
                    f"(position, first, prev, hashes, entries, digest) VALUES {values}",
                    [v for row in rows for v in row],
                )
            return positions

        def select_raw(self, after: int, upto: int, limit: int) -> list[Row]:
            """Return rows as stored, for verification (R7)."""
            return self.select_rows(after, upto, limit)

        def select_digests(self, after: int, upto: int, limit: int) -> list[DigestRow]:
            """Return digest records after a position, up to another, in order (R7)."""
            if not self.chained:
                return []
            rows = self._fetch(
                f"SELECT position, first, prev, hashes, entries, digest FROM public.{DIGEST_TABLE} "  # noqa: S608
                "WHERE position > %s AND position <= %s ORDER BY position LIMIT %s",
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
                for r in rows
            ]

        def select_digest_state(self) -> tuple[int, dict[str, bytes]]:
            """Return, from one snapshot, the last position (events or digests) and payloads."""
            with (
                self._store.get_connection() as conn,
                conn.transaction(),
                conn.cursor(row_factory=tuple_row) as curs,
            ):
                curs.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                curs.execute(
                    f"SELECT max(notification_id) FROM public.{self.events_table_name}"  # noqa: S608
                )
                found = curs.fetchone()
                upto = int(found[0] or 0) if found else 0
                if self.chained:
                    curs.execute(f"SELECT max(position) FROM public.{DIGEST_TABLE}")  # noqa: S608
                    found = curs.fetchone()
                    upto = max(upto, int(found[0] or 0) if found else 0)
                hashes: dict[str, bytes] = {}
                # A server-side cursor in the same snapshot: payloads are hashed as they stream in,
                # so a journal of large payloads is checked without holding their bytes.
                with conn.cursor(name="journaled_verify_payloads", row_factory=tuple_row) as rows:
                    rows.execute(f"SELECT stream, payload FROM public.{PAYLOAD_TABLE}")  # noqa: S608
                    for key, payload in rows:
                        hashes[str(key)] = payload_hash(str(key), bytes(payload))
                return upto, hashes

        @contextlib.contextmanager
        def _connection(self, timeout: float | None) -> Iterator[Any]:
            """A pooled connection, as the library's ``get_connection`` gives it; with
            ``timeout``, waiting that long at most for one (an outage's retries, ADR 0095)."""
            if timeout is None:
                with self._store.get_connection() as conn:
                    yield conn
                return
            store = self._store
            try:
                store.pool.open(wait=False)  # as get_connection does: a no-op once open
                with store.pool.connection(timeout=max(0.05, timeout)) as conn:
                    for info in store.psycopg_type_adapters.values():
                        if not conn.adapters.types.get(info.oid):
                            register_composite(info, conn)
                    yield conn
            except psycopg.Error as exc:
                # The library's own mapping, class for class, so callers see the same errors.
                for theirs, ours in _LIBRARY_ERRORS:
                    if isinstance(exc, theirs):
                        raise ours(str(exc)) from exc
                raise PersistenceError(str(exc)) from exc

        def _fetch(
            self, query: str, params: Sequence[Any], timeout: float | None = None
        ) -> list[tuple[Any, ...]]:
            """Run one read on a pooled connection, retried if the connection was dropped.

            With ``timeout`` (a look): one attempt, waiting that long at most for anything. Without:
            a connection that went away is tried again for :data:`OUTAGE_WAIT` seconds, every
            wait for a connection bounded by the time left, then :class:`Unreached` (the
            journal's ``JournalUnavailable``); an error the server answered is raised at once.
            """
            if timeout is not None:
                return self._fetch_once(query, params, timeout, look=True)
            started = time.monotonic()
            for attempt in itertools.count(1):
                left = OUTAGE_WAIT - (time.monotonic() - started)
                try:
                    return self._fetch_once(query, params, left)
                except (InterfaceError, OperationalError) as exc:
                    if not went_away(exc):
                        # The server answered (a lock or statement timeout, a query error):
                        # the caller's error at once; a serialization failure, a few times.
                        if not _retryable(exc) or attempt >= _PG_ATTEMPTS:
                            raise
                        continue
                    waited = time.monotonic() - started
                    if waited >= OUTAGE_WAIT:
                        raise Unreached(waited, False, exc, busy=self._all_in_use(exc)) from exc
                    time.sleep(min(0.2 * attempt, 1.0))
            raise AssertionError("unreachable")  # pragma: no cover

        def _fetch_once(
            self, query: str, params: Sequence[Any], timeout: float | None, *, look: bool = False
        ) -> list[tuple[Any, ...]]:
            """Run one read; a ``look`` (after a failed append) waits for locks and runs for
            ``timeout`` seconds at most, as it waits for a connection (ADR 0095)."""
            with (
                self._connection(timeout) as conn,
                conn.cursor(row_factory=tuple_row) as curs,
            ):
                if look and timeout is not None:
                    ms = max(1, int(timeout * 1000))
                    with conn.transaction():
                        curs.execute(f"SET LOCAL lock_timeout = '{ms}ms'")
                        curs.execute(f"SET LOCAL statement_timeout = '{ms}ms'")
                        curs.execute(query, params)
                        looked: list[tuple[Any, ...]] = curs.fetchall()
                        return looked
                curs.execute(query, params)
                rows: list[tuple[Any, ...]] = curs.fetchall()
                return rows

        def select_snapshots(self) -> list[tuple[str, int, bytes]]:
            """Return every snapshot as (key, version, state), in key order (R7 checks them)."""
            rows = self._fetch(
                f"SELECT stream, version, state FROM public.{SNAPSHOT_TABLE} ORDER BY stream",  # noqa: S608
                [],
            )
            return [(str(r[0]), int(r[1]), bytes(r[2])) for r in rows]

        def select_snapshot(self, stream: str) -> tuple[int, bytes] | None:
            """Return a stream's snapshot (version, state), if one was written."""
            rows = self._fetch(
                f"SELECT version, state FROM public.{SNAPSHOT_TABLE} WHERE stream = %s",  # noqa: S608
                [stream],
            )
            return (int(rows[0][0]), bytes(rows[0][1])) if rows else None

        def select_rows(
            self,
            after: int,
            upto: int | None,
            limit: int,
            topics: Sequence[str] = (),
            skip_prefixes: Sequence[str] = (),
        ) -> list[Row]:
            """Return raw rows after a position (up to another, of some topics), in order."""
            query = (
                "SELECT notification_id, originator_id, originator_version, topic, state "  # noqa: S608
                f"FROM public.{self.events_table_name} WHERE notification_id > %s"
            )
            bound, more = self._bounded(upto)
            query += bound
            params: list[Any] = [after, *more]
            # A NULL topic passes every filter, to fail its decode (see the SQLite recorder).
            if topics:
                query += " AND (topic = ANY(%s) OR topic IS NULL)"
                params.append(list(topics))
            for prefix in skip_prefixes:
                query += " AND (left(topic, %s) <> %s OR topic IS NULL)"
                params += [len(prefix), prefix]
            query += " ORDER BY notification_id LIMIT %s"
            params.append(limit)
            return _rows(self._fetch(query, params))

        def select_stream(
            self, stream: str, after_version: int, upto: int | None, limit: int | None
        ) -> list[Row]:
            """Return a stream's raw rows after a version (up to a position), oldest first."""
            query = (
                "SELECT notification_id, originator_id, originator_version, topic, state "  # noqa: S608
                f"FROM public.{self.events_table_name} "
                "WHERE originator_id = %s AND originator_version > %s"
            )
            bound, more = self._bounded(upto)
            query += bound
            params: list[Any] = [stream, after_version, *more]
            query += " ORDER BY originator_version"
            if limit is not None:
                query += " LIMIT %s"
                params.append(limit)
            return _rows(self._fetch(query, params))

        def select_head(self, stream: str) -> tuple[int, str] | None:
            """Return the position and topic of a stream's first durable event (its state
            unread)."""
            bound, more = self._bounded(None)
            rows = self._fetch(
                f"SELECT notification_id, topic FROM public.{self.events_table_name} "  # noqa: S608
                f"WHERE originator_id = %s{bound} ORDER BY originator_version LIMIT 1",
                [stream, *more],
            )
            return (int(rows[0][0]), rows[0][1]) if rows else None  # the topic as stored

        def select_firsts(self, streams: Sequence[str]) -> list[Row]:
            """Return the first event's row of each of these streams that has one (any order),
            of what is durable."""
            query = (
                "SELECT notification_id, originator_id, originator_version, topic, state "  # noqa: S608
                f"FROM public.{self.events_table_name} "
                "WHERE originator_id = ANY(%s) AND originator_version = 1"
            )
            bound, more = self._bounded(None)
            return _rows(self._fetch(query + bound, [list(dict.fromkeys(streams)), *more]))

        def select_content(self, stream: str, versions: Sequence[int]) -> dict[int, bytes]:
            """Return the side rows of these versions of one stream, by version.

            The versions go as one integer array and the server builds each key from it: a
            long read (time travel, replay) sent hundreds of ``<stream>@<version>`` strings
            instead, which cost more to send than the rows that came back. Each key is still
            looked up by equality, so the table's index serves it whatever the database's
            collation (a range of keys would need the C collation to be bytewise).
            """
            if not versions:
                return {}
            rows = self._fetch(
                "SELECT k.v, p.payload FROM unnest(%s::bigint[]) AS k(v) "  # noqa: S608
                f"JOIN public.{PAYLOAD_TABLE} p ON p.stream = %s || '@' || k.v",
                [list(versions), stream],
            )
            return {int(r[0]): bytes(r[1]) for r in rows}

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

        def has_subscription_table(self) -> bool:
            """Tell whether the named subscriptions' table exists (older journals lack it)."""
            rows = self._fetch(
                "SELECT to_regclass(%s) IS NOT NULL", [f"public.{SUBSCRIPTION_TABLE}"]
            )
            return bool(rows[0][0])

        def select_subscriptions(self, name: str | None = None) -> list[tuple[str, int]]:
            """Return (name, acknowledged position) of one named subscription or all, by name."""
            query = f"SELECT name, position FROM public.{SUBSCRIPTION_TABLE}"  # noqa: S608
            params: list[Any] = []
            if name is not None:
                query += " WHERE name = %s"
                params.append(name)
            return [(str(r[0]), int(r[1])) for r in self._fetch(query + " ORDER BY name", params)]

        def advance_subscription(self, name: str, position: int) -> int:
            """Store a subscription's position unless behind the stored one; return the stored."""
            with self._store.get_connection() as conn:
                row = conn.execute(
                    f"INSERT INTO public.{SUBSCRIPTION_TABLE} AS s VALUES (%s, %s) "  # noqa: S608
                    "ON CONFLICT (name) DO UPDATE SET position = greatest(s.position, "
                    "EXCLUDED.position) RETURNING position",
                    [name, position],
                ).fetchone()
                assert row is not None
                return int(row[0] if isinstance(row, tuple) else row["position"])

        def delete_subscription(self, name: str) -> bool:
            """Forget a named subscription's position; tell whether there was one."""
            with self._store.get_connection() as conn:
                found = conn.execute(
                    f"DELETE FROM public.{SUBSCRIPTION_TABLE} WHERE name = %s",  # noqa: S608
                    [name],
                )
                return int(found.rowcount) > 0

        def has_scrub_table(self) -> bool:
            """Tell whether the scrub table exists (a journal migrated by this release)."""
            rows = self._fetch("SELECT to_regclass(%s) IS NOT NULL", [f"public.{SCRUB_TABLE}"])
            return bool(rows[0][0])

        def select_scrub_marks(self) -> tuple[int, int]:
            """Return (erasures committed, erasures scrubbed from the files) so far.

            A journal read without migrating, whose scrub table another process has made since,
            counts from then on: the table is looked for again while it is missing.
            """
            if not self.track_scrub:
                self.track_scrub = self.has_scrub_table()
            if not self.track_scrub:
                return 0, 0
            rows = self._fetch(f"SELECT erased, scrubbed FROM public.{SCRUB_TABLE}", [])  # noqa: S608
            return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)

        def mark_scrubbed(self, erased: int) -> None:
            """Record that the first ``erased`` erasures are scrubbed from the files."""
            if not self.track_scrub:
                return
            with self._store.get_connection() as conn:
                conn.execute(
                    f"UPDATE public.{SCRUB_TABLE} "  # noqa: S608
                    "SET scrubbed = greatest(scrubbed, %s) WHERE id = 1",
                    [erased],
                )

        def erase(self, wait: float = 1.0) -> None:
            """Rewrite the payload and snapshot tables so deleted rows leave the database files.

            A deleted row stays on its page as a dead tuple, readable from the data files, until
            vacuumed; and a plain ``VACUUM`` only marks its space free without zeroing it (the
            newest row of a page, which sits next to the free space, keeps its bytes there).
            ``VACUUM FULL`` writes live rows into fresh zeroed pages and drops the old files, but
            copies any dead row that some snapshot might still see, its own included, whose
            horizon a transaction running in *another* database holds back. So first wait (up to
            ``wait`` seconds) until every transaction begun before now (the delete has committed)
            has ended and no session of this database, nor a replication slot, holds an older
            snapshot.

            ``VACUUM`` cannot run inside a transaction: the pool's connections are in autocommit
            mode. It locks each table for as long as its rewrite takes (milliseconds for
            thousands of rows); it waits for that lock at most :data:`_SCRUB_LOCK_TIMEOUT`,
            because every writer that comes after it queues behind its request (a reader holding
            the table, a report or a backup, would otherwise stop every append). The write-ahead
            log keeps the bytes until its segments are recycled; backups and replicas are beyond
            a journal's reach.

            Raises:
                PersistenceError: an older transaction or snapshot lasted ``wait`` seconds more,
                    or another session held the tables.
            """
            deadline = time.monotonic() + wait
            with (
                self._store.get_connection() as conn,
                conn.cursor(row_factory=tuple_row) as curs,
            ):
                curs.execute("SELECT pg_current_xact_id()::text")
                marker = curs.fetchone()
                assert marker is not None
                while True:
                    curs.execute(_OLDER_SNAPSHOTS, {"now": marker[0]})
                    older = curs.fetchone()
                    if older is not None and older[0] == 0:
                        break
                    if time.monotonic() >= deadline:
                        raise PersistenceError(
                            "could not erase deleted payloads: a transaction older than the "
                            "deletion is still open (in this database or, holding back every "
                            "snapshot, in another session of the server); erased bytes remain in "
                            "the tables' files until it ends and the journal is scrubbed again "
                            "(rt.memory.scrub(), retried in the background)"
                        )
                    time.sleep(0.02)
                curs.execute(f"SET lock_timeout = '{_SCRUB_LOCK_TIMEOUT}'")
                try:
                    curs.execute(f"VACUUM FULL public.{PAYLOAD_TABLE}, public.{SNAPSHOT_TABLE}")
                except psycopg.errors.LockNotAvailable:
                    raise PersistenceError(
                        "could not erase deleted payloads: another session holds the journal's "
                        "tables; erased bytes remain in the tables' files until it ends and the "
                        "journal is scrubbed again (rt.memory.scrub(), retried in the background)"
                    ) from None
                finally:
                    curs.execute("RESET lock_timeout")

    class _PostgresFactory(PostgresFactory):
        application_recorder_class = _PostgresRecorder

        def __init__(self, env: Any) -> None:
            super().__init__(env)
            self.lock_wait = float(self.env.get("JOURNALED_LOCK_WAIT") or DEFAULT_LOCK_WAIT)
            # Every connection's default, so that ``RESET lock_timeout`` returns to it too.
            ms = max(1, int(self.lock_wait * 1000))
            options = self.datastore.pool.kwargs
            assert isinstance(options, dict)
            options["options"] = f"-c lock_timeout={ms}"
            # The append's text arrays are packed in UTF-8 (ADR 0051): the server must read them
            # so, whatever the database's encoding or a PGCLIENTENCODING in the environment.
            options["client_encoding"] = "UTF8"
            options.update(KEEPALIVES)

        def application_recorder(self) -> Any:
            """Return the recorder, bounding its appends' lock waits by ``lock_wait``."""
            recorder = super().application_recorder()
            assert isinstance(recorder, _PostgresRecorder)
            recorder.lock_wait = self.lock_wait
            return recorder


_APPEND_CALL = (
    "CALL public.{procedure}(%s::text[], %s::bigint[], %s::text[], %s::bytea[], "
    "%s::text[], %s::bytea[], %s::bytea, %s::bytea, %s::boolean, %s::text, %s::text)"
)


_VERSION_QUERY = (
    "SELECT to_regproc(%s) IS NOT NULL AND to_regproc(%s) IS NOT NULL, "
    "to_regproc(%s) IS NOT NULL AND to_regproc(%s) IS NOT NULL"
)
_VERSION_PARAMS = [
    f"public.{APPEND_PROCEDURE}",
    f"public.{DURABLE_FUNCTION}",
    f"public.{APPEND_PROCEDURE_V1}",
    f"public.{DURABLE_FUNCTION_V1}",
]
_NO_PROCEDURES = f"to_regproc('public.{DURABLE_FUNCTION_V1}') IS NULL"
"""True while a journal has no durable check: its writers all commit waiting for the disk.
Every migration that creates procedures creates this one (ADR 0052)."""


def _version_of(row: Sequence[Any] | None) -> int:
    if row is None:
        return 0
    return 2 if row[0] else 1 if row[1] else 0


def _pg_append_version(config: JournalConfig) -> int:
    """Tell which append procedures a PostgreSQL journal has: 2 (this release's, ADR 0052),
    1 (the previous release's, ADR 0044) or 0 (none: migrated before either)."""
    with _pg_connect(config) as conn:
        return _version_of(conn.execute(_VERSION_QUERY, _VERSION_PARAMS).fetchone())


def _rows(fetched: list[tuple[Any, ...]]) -> list[Row]:
    """The driver's rows of (position, stream, version, topic, state), as they come.

    psycopg already gives ``bigint`` as int, ``text`` as str and ``bytea`` as bytes: converting
    every value again cost about 1 us a row, a millisecond on a long read (time travel, replay).
    """
    return fetched
