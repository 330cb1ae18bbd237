"""What a PostgreSQL reader may see: only what is on disk, answered without waiting on log
records that no commit flushes (J1, R5; ADR 0044, 0052).

The module starts its own server that fsyncs and commits synchronously, with the WAL writer's
delay at its maximum (10 s), so that a log record written by no commit stays unflushed for
seconds, as it does on an idle production server whose WAL writer hibernates.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pg
import pytest
from required import unavailable

psycopg = pytest.importorskip("psycopg", reason="PostgreSQL tests need the postgres extra")

from journaled.events.base import Pending  # noqa: E402 - after the extra's check
from journaled.events.codec import Codec  # noqa: E402
from journaled.events.journal import Journal  # noqa: E402
from journaled.events.journal._postgres import (  # noqa: E402
    APPEND_PROCEDURE,
    DURABLE_FUNCTION,
    DURABLE_FUNCTION_V1,
    FLUSH_TABLE,
)
from journaled.events.memory import MEMORY_EVENTS, FactRemembered  # noqa: E402
from journaled.events.url import parse_url  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server() -> Iterator[pg.PostgresServer]:
    """A durable server whose WAL writer flushes what no commit waits for every 10 s only."""
    try:
        with pg.slow_wal_writer_server() as started:
            yield started
    except pg.PostgresUnavailable as exc:
        unavailable("POSTGRES", str(exc))


@pytest.fixture
def url(server: pg.PostgresServer) -> str:
    """A fresh database on the module's server."""
    return pg.create_database(server.url("postgres"))


def _journal(url: str, *, create: bool = True) -> Journal:
    return Journal(parse_url(url), Codec(MEMORY_EVENTS), create=create)


def _append(journal: Journal, stream: str, **kwargs: object) -> list[int]:
    event = FactRemembered(at=1, fact_id=stream, scope="project")
    return journal.append([Pending(stream=stream, version=1, data=event)], **kwargs)  # type: ignore[arg-type]


def _unflushed_tail(url: str) -> None:
    """Write a log record no commit flushes (a non-transactional logical message), and check
    that the log's insert position is now past its flush position."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_logical_emit_message(false, 'journaled-test', 'tail')")
        row = conn.execute(
            "SELECT pg_current_wal_insert_lsn() > pg_current_wal_flush_lsn()"
        ).fetchone()
        assert row == (True,), "the test needs an unflushed record at the log's end"


def test_a_read_after_records_no_commit_flushes_answers_at_once(url: str) -> None:
    """J1, R5 (ADR 0052): after an append, a log record nobody flushes does not hold up a new
    reader: its position and its read come at once, and hold every appended event."""
    writer = _journal(url)
    try:
        appended = _append(writer, "a") + _append(writer, "b")
        _unflushed_tail(url)
        reader = _journal(url, create=False)
        try:
            started = time.monotonic()
            assert reader.position() == appended[-1]
            assert [e.position for e in reader.read()] == appended
            assert time.monotonic() - started < 3.0, "the reader waited on the log's tail"
        finally:
            reader.close()
    finally:
        writer.close()


def test_the_previous_releases_check_waits_on_such_records(url: str) -> None:
    """J1 (ADR 0052): the premise of the test above: the check that waits for the log's flush
    position to pass its insert position is still waiting after a second."""
    _append(_journal(url), "a")
    _unflushed_tail(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET statement_timeout = '1s'")
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute(f"SELECT public.{DURABLE_FUNCTION_V1}()")
        row = conn.execute(f"SELECT public.{DURABLE_FUNCTION}()").fetchone()
        assert row == (1,)


def _proven(url: str) -> int | None:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(f"SELECT max(upto) FROM public.{FLUSH_TABLE}").fetchone()  # noqa: S608
        assert row is not None
        return None if row[0] is None else int(row[0])


def test_every_append_path_proves_what_it_appended(url: str) -> None:
    """R5 (ADR 0052): the append procedure and the library's append (a snapshot rides on it)
    each record the last position their commit made durable."""
    journal = _journal(url)
    try:
        first = _append(journal, "a")
        assert _proven(url) == first[-1]
        second = _append(journal, "b", snapshots={"a": (1, b"state")})
        assert second[-1] > first[-1]
        assert _proven(url) == second[-1]
    finally:
        journal.close()


def test_a_session_that_does_not_wait_for_the_disk_proves_nothing(url: str) -> None:
    """R5 (ADR 0052): appends of a session with synchronous_commit off record no proof; a reader
    of that journal waits for the log's flush instead, and sees them once it has."""
    dbname = url.rsplit("/", 1)[1]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {dbname} SET synchronous_commit = off")
    journal = _journal(url)
    try:
        appended = _append(journal, "a") + _append(journal, "b", snapshots={"a": (1, b"s")})
        assert _proven(url) is None
    finally:
        journal.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        started = time.monotonic()
        row = conn.execute(f"SELECT public.{DURABLE_FUNCTION}()").fetchone()
    assert row == (appended[-1],)
    assert time.monotonic() - started < 30


def test_a_journal_of_the_previous_release_is_appended_and_read_through_its_procedures(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """J6, R7 (ADR 0052): a journal that has only the previous release's procedures, opened
    without migrating, appends through them and reads what is durable."""
    _journal(url).close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP PROCEDURE public.{APPEND_PROCEDURE}")
        conn.execute(f"DROP FUNCTION public.{DURABLE_FUNCTION}")
    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def counted(self: object, query: object, *args: object, **kwargs: object) -> object:
        sent.append(str(query))
        return execute(self, query, *args, **kwargs)

    old = _journal(url, create=False)
    try:
        monkeypatch.setattr(psycopg.Cursor, "execute", counted)
        appended = _append(old, "a")
        monkeypatch.undo()
        assert any("journaled_append_v1" in q for q in sent), sent
        assert old.position() == appended[-1]
        assert [e.position for e in old.read()] == appended
        assert old.verify().ok
    finally:
        old.close()
