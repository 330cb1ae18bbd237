"""The PostgreSQL journal: URLs, migration, gaps in positions, purge, many writers (J3, J4, M10).

The contract suite (tests/test_journal.py and the memory and executor suites) already runs on
PostgreSQL through the ``journal_url`` fixture; these are the checks particular to this backend.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pg
import pytest
from required import unavailable

pytest.importorskip("psycopg", reason="PostgreSQL tests need the postgres extra (psycopg)")
import psycopg

import journaled
from journaled.events.base import Pending
from journaled.events.codec import Codec
from journaled.events.errors import ConcurrencyConflict, JournalUrlError
from journaled.events.journal import (
    DIGEST_TABLE,
    EVENTS_TABLE_POSTGRES,
    PAYLOAD_TABLE,
    SCRUB_TABLE,
    SNAPSHOT_TABLE,
    SUBSCRIPTION_TABLE,
    Journal,
    migrate,
)
from journaled.events.journal._postgres import FLUSH_TABLE
from journaled.events.memory import MEMORY_EVENTS, FactPurged, FactRemembered
from journaled.events.url import parse_url
from journaled.testing import ManualClock

ROOT = Path(__file__).resolve().parent.parent


def _journal(url: str, *, create: bool = True) -> Journal:
    return Journal(parse_url(url), Codec(MEMORY_EVENTS), create=create)


def _remembered(fact_id: str) -> FactRemembered:
    return FactRemembered(at=1, fact_id=fact_id, scope="project")


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
        return {r[0] for r in rows}


def _with(url: str, *, user: str | None = None, port: int | None = None) -> str:
    parts = urlsplit(url)
    host = f"{user or parts.username}@{parts.hostname}:{port or parts.port}"
    return urlunsplit(parts._replace(netloc=host))


@pytest.fixture
def journal(pg_url: str) -> Iterator[Journal]:
    """Yield an open journal on a fresh PostgreSQL database."""
    j = _journal(pg_url)
    yield j
    j.close()


# -- URLs (J4) -------------------------------------------------------------------------------------


def test_postgres_urls_parse_into_the_config() -> None:
    """J4: postgresql:// and postgres:// URLs give host, port, user, password, database, pool."""
    config = parse_url("postgresql://me:s%40cret@db.example:6543/journal?pool_size=3")
    assert (config.backend, config.host, config.port, config.user, config.dbname) == (
        "postgresql",
        "db.example",
        6543,
        "me",
        "journal",
    )
    assert config.password == "s@cret"
    assert config.pool_size == 3
    assert "s%40cret" not in config.url
    assert "s@cret" not in repr(config)
    default = parse_url("postgres://me@localhost/j")
    assert (default.port, default.password, default.pool_size) == (5432, None, 5)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("postgresql://me:hunter2@db/j?durability=full", "SQLite journals only"),
        ("postgresql://me:hunter2@db/j?pool=3", "unknown parameter"),
        ("postgresql://me:hunter2@db/j?pool_size=0", "pool_size"),
        ("postgresql://me:hunter2@db/j?pool_size=many", "pool_size"),
        ("postgresql://me:hunter2@db:port/j", "invalid port"),
        ("postgresql://me:hunter2@/j", "no host"),
        ("postgresql://me:hunter2@db/", "no database"),
        ("postgresql://db/j", "no user"),
        ("postgresql://me@db/j?password=hunter2", "unknown parameter"),
    ],
)
def test_malformed_postgres_urls_are_clear_and_hide_the_password(url: str, words: str) -> None:
    """J4: a malformed PostgreSQL URL names what is wrong, never the password."""
    with pytest.raises(JournalUrlError, match=words) as info:
        parse_url(url)
    assert "hunter2" not in str(info.value)


def test_wrong_password_or_port_fails_clearly_without_the_password(pg_url: str) -> None:
    """J4: a refused login or a closed port is a JournalUrlError that never shows the password."""
    good = _with(pg_url, user=f"{pg.PASSWORD_ROLE}:{pg.PASSWORD}")
    _journal(good).close()  # the role does check passwords, and this one is right
    secret = "not-the-password-7731"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    cases = {
        "authentication failed": _with(pg_url, user=f"{pg.PASSWORD_ROLE}:{secret}"),
        "refused": _with(pg_url, user=f"{pg.PASSWORD_ROLE}:{secret}", port=closed_port),
    }
    for words, url in cases.items():
        for create in (True, False):
            with pytest.raises(JournalUrlError, match=words) as info:
                _journal(url, create=create)
            chain: list[str] = []
            error: BaseException | None = info.value
            while error is not None:
                chain.append(f"{error!s} {error!r}")
                error = error.__cause__ or error.__context__
            assert all(secret not in text for text in chain), chain
            assert "***" in str(info.value)


def test_stray_postgres_environment_cannot_redirect_the_journal(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """J4: the library's POSTGRES_* variables in os.environ are ignored; only the URL decides."""
    monkeypatch.setenv("PERSISTENCE_MODULE", "eventsourcing.popo")
    monkeypatch.setenv("POSTGRES_DBNAME", "decoy")
    monkeypatch.setenv("JOURNALED_POSTGRES_DBNAME", "decoy")
    monkeypatch.setenv("POSTGRES_PORT", "1")
    monkeypatch.setenv("CREATE_TABLE", "y")
    j = _journal(pg_url)
    j.append([Pending(stream="a", version=1, data=_remembered("a"))])
    j.close()
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(f"SELECT originator_id FROM {EVENTS_TABLE_POSTGRES}").fetchone()  # noqa: S608
    assert row == ("a",)


def test_pool_size_comes_from_the_url(pg_url: str) -> None:
    """J4: ?pool_size=N sizes the journal's connection pool (with a small overflow)."""
    j = _journal(f"{pg_url}?pool_size=2")
    try:
        pool: Any = j._recorder.datastore.pool  # type: ignore[union-attr]
        assert (pool.min_size, pool.max_size) == (2, 4)
    finally:
        j.close()


# -- migration -------------------------------------------------------------------------------------


def test_reading_a_missing_journal_creates_nothing(pg_url: str) -> None:
    """J4: opening an empty database for reading only fails clearly and creates no table."""
    with pytest.raises(JournalUrlError, match="no journal"):
        _journal(pg_url, create=False)
    assert _tables(pg_url) == set()
    _journal(pg_url).close()
    _journal(pg_url, create=False).close()


def test_an_older_journal_read_without_migrating_can_still_purge(pg_url: str) -> None:
    """M10/J6: a journal without the scrub table, opened without migrating, purges; counts none."""
    _journal(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {SCRUB_TABLE}")  # as an older release left it
    j = _journal(pg_url, create=False)
    try:
        j.append([Pending(stream="a", version=1, data=_remembered("a"))], payloads={"a": b"t"})
        j.append([Pending(stream="a", version=2, data=FactPurged(at=2, fact_id="a"))], forget=["a"])
        assert j.payloads() == {}
        assert j.scrub_debt() == 0
        j.scrub()
    finally:
        j.close()
    assert SCRUB_TABLE not in _tables(pg_url)  # reading created nothing


def test_migrate_is_idempotent_and_safe_under_concurrency(pg_url: str) -> None:
    """J3/J4: six migrations (and six opens) at once on a fresh database all succeed, twice."""
    config = parse_url(pg_url)
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def run(task: Any) -> None:
        try:
            barrier.wait(timeout=10)
            task()
        except BaseException as exc:
            errors.append(exc)

    def open_and_close() -> None:
        _journal(pg_url).close()

    for task in (lambda: migrate(config), lambda: migrate(config), open_and_close):
        threads = [threading.Thread(target=run, args=(task,)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert errors == []
    assert _tables(pg_url) == {
        EVENTS_TABLE_POSTGRES,
        PAYLOAD_TABLE,
        SNAPSHOT_TABLE,
        DIGEST_TABLE,
        SCRUB_TABLE,
        SUBSCRIPTION_TABLE,
        FLUSH_TABLE,
    }
    j = _journal(pg_url)
    try:
        assert j.append([Pending(stream="a", version=1, data=_remembered("a"))]) == [1]
    finally:
        j.close()


# -- positions -------------------------------------------------------------------------------------


def test_gaps_in_positions_after_a_conflict_still_read_in_order(journal: Journal) -> None:
    """J1/J3: a conflicting append consumes positions; reads page over the gap, in order."""
    journal.append([Pending(stream="a", version=1, data=_remembered("a"))])
    for _ in range(3):
        with pytest.raises(ConcurrencyConflict):
            journal.append(
                [
                    Pending(stream="b", version=1, data=_remembered("b")),
                    Pending(stream="a", version=1, data=_remembered("a")),
                ]
            )
    later = journal.append(
        [
            Pending(stream="c", version=1, data=_remembered("c")),
            Pending(stream="a", version=2, data=FactPurged(at=2, fact_id="a")),
        ]
    )
    assert later[0] > 2  # the failed appends used ids
    assert later == [later[0], later[0] + 1]
    expected = [(1, "a", 1), (later[0], "c", 1), (later[1], "a", 2)]
    for page in (1, 2, 1000):
        got = [(e.position, e.stream, e.version) for e in journal.read(page=page)]
        assert got == expected
    assert [e.position for e in journal.read(after=1, upto=later[0])] == [later[0]]
    assert [e.position for e in journal.stream("a", upto=later[0])] == [1]
    assert journal.position() == later[1]
    assert journal.stream("b") == []


# -- purge (M10) -----------------------------------------------------------------------------------


def _pageinspect(conn: psycopg.Connection[Any]) -> bool:
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
    except psycopg.Error:
        return False
    return True


def _pages_holding(conn: psycopg.Connection[Any], marker: bytes) -> list[tuple[str, int]]:
    """Return (relation, block) of every page of this database whose raw bytes hold ``marker``."""
    rows = conn.execute(
        "SELECT c.oid::regclass::text, blk FROM pg_class c, "
        "generate_series(0, (pg_relation_size(c.oid) / 8192)::int - 1) AS blk "
        "WHERE c.relkind IN ('r', 't', 'i', 'm') "
        "AND position(%s::bytea IN get_raw_page(c.oid::regclass::text, blk)) > 0",
        [marker],
    ).fetchall()
    return [(str(r[0]), int(r[1])) for r in rows]


def _files_holding(conn: psycopg.Connection[Any], marker: bytes) -> list[str] | None:
    """Return this database's data files holding ``marker`` (None when they are not readable)."""
    conn.execute("CHECKPOINT")  # write every dirty page to the files
    row = conn.execute(
        "SELECT current_setting('data_directory'), oid FROM pg_database "
        "WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    base = Path(row[0]) / "base" / str(row[1])
    if not os.access(base, os.R_OK | os.X_OK):
        return None
    return sorted(p.name for p in base.iterdir() if p.is_file() and marker in p.read_bytes())


def _payload_rows(conn: psycopg.Connection[Any], marker: bytes) -> int:
    row = conn.execute(
        f"SELECT count(*) FROM {PAYLOAD_TABLE} WHERE position(%s::bytea IN payload) > 0",  # noqa: S608
        [marker],
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_purge_removes_the_text_from_tables_pages_and_files(pg_url: str) -> None:
    """M10: after purge the text is in no row, no page and no data file of the database."""
    first, newest = b"first-secret-31-41-59", b"newest-secret-27-18-28"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        inspect = _pageinspect(conn)
        files = _files_holding(conn, first) is not None
        if not (inspect or files):
            # pg_stat_user_tables.n_dead_tup is no substitute: a backend reports its deletes
            # lazily (it read 0 here seconds after a delete, before any vacuum)
            unavailable("POSTGRES", "neither pageinspect nor the server's data files are readable")
        with journaled.open(pg_url, clock=ManualClock(step=1)) as rt:
            a = rt.memory.remember(f"the {first.decode()} is here")
            for i in range(40):  # rows enough to fill pages around it
                rt.memory.remember(f"filler fact number {i} " + "x" * 200)
            # the newest row of a page borders its free space: a plain VACUUM leaves its bytes
            b = rt.memory.remember(f"the {newest.decode()} is here")
            for marker in (first, newest):
                assert _payload_rows(conn, marker) == 1
                if inspect:
                    assert _pages_holding(conn, marker)
                if files:
                    assert _files_holding(conn, marker)
            assert rt.memory.purge(a.id, reason="compliance request")
            assert rt.memory.purge(b.id, reason="compliance request")
            assert "compliance request" in rt.memory.why(b.id)
        for marker in (first, newest):
            assert _payload_rows(conn, marker) == 0
            if inspect:
                assert _pages_holding(conn, marker) == []
            if files:
                assert _files_holding(conn, marker) == []
    with journaled.open(pg_url) as rt:
        assert rt.memory.get(a.id) is None
        assert [e.kind for e in rt.memory.history(b.id)][-1] == "memory.fact-purged"


@pytest.mark.parametrize("where", ["snapshot in this database", "transaction in another"])
def test_scrub_refuses_while_an_older_transaction_may_see_the_text(
    journal: Journal, pg_url: str, postgres_url: str, where: str
) -> None:
    """M10: scrub raises rather than claim erasure while an older transaction is open."""
    # An old snapshot in this database sees the row; a transaction in another database holds back
    # the horizon of every snapshot, VACUUM FULL's own: either would have it copy the dead row.
    secret = b"older-transaction-secret-1618"
    journal.append([Pending(stream="a", version=1, data=_remembered("a"))], payloads={"a": secret})
    other = pg_url if where == "snapshot in this database" else postgres_url
    with psycopg.connect(other) as reader, psycopg.connect(pg_url, autocommit=True) as conn:
        reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT pg_current_xact_id()")
        journal.append(
            [Pending(stream="a", version=2, data=FactPurged(at=2, fact_id="a"))], forget=["a"]
        )
        started = time.monotonic()
        with pytest.raises(Exception, match="older than the deletion") as info:
            journal.scrub()
        assert type(info.value).__name__ == "PersistenceError"
        assert time.monotonic() - started < 5
        reader.rollback()
        journal.scrub()
        assert journal.payloads() == {}
        if _pageinspect(conn):
            assert _pages_holding(conn, secret) == []


# -- many writers (J3) -----------------------------------------------------------------------------

WRITER = """
import sys
import journaled

url, who, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
with journaled.open(url) as rt:
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(count):
        rt.memory.remember(f"{who} remembers item {i:04d}")
print("done", flush=True)
"""


def _four_writers(url: str, count: int) -> None:
    """Run four processes remembering ``count`` facts each into one journal, all at once."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, url, f"w{n}", str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for n in range(4)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line == "ready\n", p.stderr.read() if p.stderr else line
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, err
            assert out == "done\n", err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _check_all_present(url: str, count: int) -> None:
    expected = {f"w{n} remembers item {i:04d}" for n in range(4) for i in range(count)}
    with journaled.open(url) as rt:
        facts = rt.memory.all()
        texts = [f.text for f in facts]
        assert len(texts) == len(expected)
        assert set(texts) == expected
        assert len({f.id for f in facts}) == len(expected)
        events = list(rt.journal.read())
        positions = [e.position for e in events]
        assert positions == sorted(set(positions))  # strictly increasing: no duplicate
        remembered = [e.stream for e in events if e.kind == "memory.fact-remembered"]
        assert len(remembered) == len(set(remembered)) == len(expected)
        by_id = {f.id: f.text for f in facts}
        for n in range(4):  # each writer's facts appear in the order it remembered them
            mine = [by_id[s] for s in remembered if by_id[s].startswith(f"w{n} ")]
            assert mine == sorted(mine)


@pytest.mark.slow
def test_four_processes_remember_into_one_postgres_journal(pg_url: str) -> None:
    """J3: 4 processes x 500 remember on one PostgreSQL journal: all 2,000 kept, once, in order."""
    _four_writers(pg_url, 500)
    _check_all_present(pg_url, 500)


@pytest.mark.slow
def test_four_processes_remember_into_one_sqlite_journal(sqlite_url: str) -> None:
    """J3: 4 processes x 500 remember on one SQLite file: all 2,000 kept, once, in order."""
    _four_writers(sqlite_url, 500)
    _check_all_present(sqlite_url, 500)


def test_cli_migrate_prepares_a_database(pg_url: str) -> None:
    """J4: `journaled journal migrate` creates the tables once; a second run changes nothing."""
    from click.testing import CliRunner

    from journaled.cli import main

    first = CliRunner().invoke(main, ["--url", pg_url, "--json", "journal", "migrate"])
    assert first.exit_code == 0, first.output
    assert '"position":0' in first.output.replace(" ", "")
    again = CliRunner().invoke(main, ["--url", pg_url, "journal", "migrate"])
    assert again.exit_code == 0
    assert "journal ready" in again.output
    assert "correct-horse" not in again.output


def test_notify_wakes_followers_before_the_poll(pg_url: str) -> None:
    """J3: on PostgreSQL a follower wakes on the append's NOTIFY, well before its poll interval."""
    import time

    import journaled
    from journaled.testing import wait_for

    with (
        journaled.open(pg_url, follow=None) as writer,
        journaled.open(pg_url, follow=10.0) as reader,
    ):
        time.sleep(0.3)  # let the reader's follower start listening
        fact = writer.memory.remember("the on-call rotation changes on Mondays")
        started = time.monotonic()
        wait_for(lambda: reader.memory.get(fact.id) == fact, 5.0)
        assert time.monotonic() - started < 5.0  # the 10 s poll could not have done it


# -- one round trip per append, notes for followers (ADR 0044) ------------------------------------


def test_the_append_procedure_encodes_integers_as_msgpack_does(journal: Journal) -> None:
    """R7: the server's integer framing equals msgspec's at every size boundary (ADR 0044)."""
    import msgspec

    values: list[int | None] = [None, 0, 1, 127, 128, 255, 256, 65535, 65536]
    values += [2**32 - 1, 2**32, 2**40 + 7, 2**63 - 1]
    with psycopg.connect(journal.config.url) as conn:
        for value in values:
            row = conn.execute("SELECT public.journaled_mp_uint(%s::bigint)", [value]).fetchone()
            assert row is not None
            assert bytes(row[0]) == msgspec.msgpack.encode(value), value


def test_an_append_of_events_and_content_is_one_statement(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """J1, R7: events and their content rows go in one statement, chained and verifiable."""
    sent: list[str] = []
    execute = psycopg.Cursor.execute
    appending = threading.get_ident()

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        # The patch is the class's: another thread of the process (a fixture dropping an old
        # test database) may run a statement meanwhile, which is not the append's.
        if threading.get_ident() == appending:
            sent.append(str(query))
        return execute(self, query, *args, **kwargs)

    journal.append([Pending(stream="warm", version=1, data=_remembered("warm"))])
    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    positions = journal.append(
        [
            Pending(stream="a", version=1, data=_remembered("a")),
            Pending(stream="b", version=1, data=_remembered("b")),
        ],
        payloads={"a": b"the text of a", "b": b"the text of b"},
    )
    monkeypatch.undo()
    # A connection the pool has just opened first sets its session up (SET ...): not the append.
    appended = [query for query in sent if "SET " not in query]
    assert len(appended) == 1, sent
    assert "journaled_append_v2" in appended[0]
    assert positions == [positions[0], positions[0] + 1]
    assert journal.payloads(["a", "b"]) == {"a": b"the text of a", "b": b"the text of b"}
    report = journal.verify()
    assert (report.ok, report.events, report.chained_from) == (True, 3, 1), report


def test_an_older_journal_without_the_procedure_appends_as_before(pg_url: str) -> None:
    """J6, R7: a journal migrated by an older release (no append procedure) appends chained."""
    _journal(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for name in ("journaled_append_v1", "journaled_append_v2"):
            conn.execute(f"DROP PROCEDURE public.{name}")
    old = _journal(pg_url, create=False)
    try:
        old.append([Pending(stream="a", version=1, data=_remembered("a"))], payloads={"a": b"x"})
        assert old.verify().ok
    finally:
        old.close()
    again = _journal(pg_url)  # a migrating open brings the function back
    try:
        again.append([Pending(stream="b", version=1, data=_remembered("b"))])
        report = again.verify()
        assert (report.ok, report.events) == (True, 2), report
    finally:
        again.close()


def test_the_append_procedure_refuses_a_chain_that_reaches_past_it(journal: Journal) -> None:
    """R7: a digest record beyond the log's end (its events removed) stops appends, clearly."""
    from journaled.events.journal._digest import ChainBroken

    journal.append([Pending(stream="a", version=1, data=_remembered("a"))])
    with psycopg.connect(journal.config.url, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {DIGEST_TABLE} (position, first, prev, hashes, entries, digest) "  # noqa: S608
            "VALUES (1000, 1000, 1, '\\x00', NULL, '\\x00')"
        )
    with pytest.raises(ChainBroken, match="already reaches position 1000"):
        journal.append([Pending(stream="b", version=1, data=_remembered("b"))])
    assert [e.stream for e in journal.read()] == ["a"]


def test_followers_wake_only_for_other_processes_events_they_fold(pg_url: str) -> None:
    """J3: a follower is not woken by its own appends nor by runs; a foreign fact wakes it."""
    from journaled.events.catalog import NOT_MEMORY, STORED_EVENTS
    from journaled.events.runs import RunHeartbeat

    codec = Codec(STORED_EVENTS)
    mine = Journal(parse_url(pg_url), codec)
    other = Journal(parse_url(pg_url), codec)
    try:
        assert not mine.wait_for_foreign(0.05, NOT_MEMORY)  # listening from now on
        mine.append([Pending(stream="m", version=1, data=_remembered("m"))])
        other.append([Pending(stream="run-x", version=1, data=RunHeartbeat(at=1, owner="x"))])
        assert not mine.wait_for_foreign(0.5, NOT_MEMORY)
        other.append([Pending(stream="f", version=1, data=_remembered("f"))])
        assert mine.wait_for_foreign(5.0, NOT_MEMORY)
    finally:
        mine.close()
        other.close()


def test_run_appends_notify_the_quiet_channel_and_memory_appends_the_main_one(
    pg_url: str,
) -> None:
    """J3, ADR 0057: an append of runs alone is never heard on the main channel, which memory's
    followers listen on; it is heard on the quiet one. A fact is heard on the main one alone."""
    from journaled.events.catalog import STORED_EVENTS
    from journaled.events.runs import RunHeartbeat

    journal = Journal(parse_url(pg_url), Codec(STORED_EVENTS))
    main, quiet = journal._channels()
    assert quiet == f"{main}_quiet"
    heard: dict[str, list[str]] = {main: [], quiet: []}
    listeners = {}
    try:
        for channel in heard:
            conn = psycopg.connect(pg_url, autocommit=True)
            conn.execute(f'LISTEN "{channel}"')
            listeners[channel] = conn

        def drain() -> None:
            for channel, conn in listeners.items():
                heard[channel] += [n.payload for n in conn.notifies(timeout=0.5, stop_after=1)]

        journal.append([Pending(stream="run-x", version=1, data=RunHeartbeat(at=1, owner="x"))])
        drain()
        assert heard[main] == []
        assert [note.split()[1:] for note in heard[quiet]] == [["run"]]
        heard[quiet].clear()
        journal.append(
            [
                Pending(stream="run-y", version=1, data=RunHeartbeat(at=1, owner="y")),
                Pending(stream="f", version=1, data=_remembered("f")),
            ]
        )
        drain()
        assert heard[quiet] == []
        assert [note.split()[1:] for note in heard[main]] == [["run", "memory"]]
    finally:
        for conn in listeners.values():
            conn.close()
        journal.close()


def test_a_waiter_with_a_mark_wakes_for_another_processes_run_append(pg_url: str) -> None:
    """A3, ADR 0057: subscriptions and `runs follow` wait with a mark; their watcher listens on
    both channels, so another process's run append wakes them at once, not at the timeout."""
    from journaled.events.catalog import STORED_EVENTS
    from journaled.events.runs import RunHeartbeat

    codec = Codec(STORED_EVENTS)
    mine = Journal(parse_url(pg_url), codec)
    other = Journal(parse_url(pg_url), codec)
    try:
        mark = mine.append_mark()
        mine.wait_for_appends(0.5, since=mark)  # starts the watcher; its first look bumps
        mark = mine.append_mark()
        time.sleep(0.3)  # the watcher listens by now
        waited: list[float] = []

        def wait() -> None:
            start = time.monotonic()
            mine.wait_for_appends(20.0, since=mark)
            waited.append(time.monotonic() - start)

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.2)
        other.append([Pending(stream="run-x", version=1, data=RunHeartbeat(at=1, owner="x"))])
        waiter.join(30)
        assert waited, "the waiter never returned"
        assert waited[0] < 10.0, waited
    finally:
        mine.close()
        other.close()


def test_wait_for_foreign_refuses_prefixes_that_leave_out_the_quiet_families(
    journal: Journal,
) -> None:
    """ADR 0057: appends of runs alone are never heard by wait_for_foreign, so a caller that
    wants to be woken by them is told so instead of waiting in vain."""
    with pytest.raises(ValueError, match="skip_prefixes must cover"):
        journal.wait_for_foreign(0.01, ("orchestration.",))


def test_an_append_is_on_disk_when_it_returns(tmp_path: Path) -> None:
    """J1, R5: what an append returned survives a server crash, in order and chained (ADR 0044).

    The append's own transaction commits without waiting for the disk; the flush commit after
    it, in the same call, must have made it durable before the call returned. A server that
    fsyncs (not the suite's shared one, which does not) is crashed right after and recovered.
    """
    try:
        server = pg.PostgresServer(durable=True)
    except pg.PostgresUnavailable as exc:
        unavailable("POSTGRES", str(exc))
    server.start()
    try:
        url = pg.create_database(server.url("postgres"))
        with psycopg.connect(url) as conn:
            row = conn.execute("SHOW synchronous_commit").fetchone()
            assert row is not None
            assert row[0] == "on"
        journal = _journal(url)
        returned: list[int] = []
        for n in range(20):
            returned += journal.append(
                [Pending(stream=f"s{n}", version=1, data=_remembered(f"f{n}"))],
                payloads={f"s{n}": f"text {n}".encode()},
            )
        journal.close()  # closing writes nothing: what returned must already be on disk
        server.crash_and_restart()
        again = _journal(url)
        try:
            assert [e.position for e in again.read()] == returned
            assert again.position() == returned[-1]
            report = again.verify()
            assert (report.ok, report.events) == (True, 20), report
        finally:
            again.close()
    finally:
        server.stop()


def test_a_short_password_is_hidden_where_a_url_holds_it_without_garbling_the_message() -> None:
    """J4, T: a password is taken out of a driver's message; a short one only where a URL or
    a connection string holds it, since replacing every "o" garbles the message and shows which
    letters the password is made of; a long one wherever it appears."""
    from journaled.events.journal._common import hide_password

    said = 'connection to server at "127.0.0.1", port 1 failed: Connection refused'
    assert hide_password(said, "o") == said
    assert hide_password("postgresql://me:o@db/j", "o") == "postgresql://me:***@db/j"
    assert hide_password("host=db password=o user=me", "o") == "host=db password=*** user=me"
    assert hide_password("echo hunter2-long here", "hunter2-long") == "echo *** here"
    assert hide_password(said, None) == said
