"""Tamper evidence (R7): the digest chain, ``rt.journal.verify()`` and ``journal verify``."""

from __future__ import annotations

import itertools
import json
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

import journaled
from journaled.cli import main
from journaled.events.base import Pending
from journaled.events.catalog import codec
from journaled.events.errors import ConcurrencyConflict
from journaled.events.journal import Journal, VerifyReport
from journaled.events.memory import FactRemembered
from journaled.events.url import parse_url
from journaled.runtime import verify
from journaled.testing import ManualClock

SQL_BACKENDS = ["sqlite", "postgresql"]
CHAIN_COLUMNS = ("chain_first", "chain_prev", "chain_hashes", "chain_entries", "chain_digest")
EVENTS = {
    "sqlite": ("stored_events", "rowid"),
    "postgresql": ("journaled_events", "notification_id"),
}


@pytest.fixture(params=SQL_BACKENDS)
def db_url(request: pytest.FixtureRequest, sqlite_url: str) -> str:
    """Yield a fresh journal URL on each backend that raw SQL can reach."""
    if request.param == "postgresql":
        url: str = request.getfixturevalue("pg_url")
        return url
    return sqlite_url


def _backend(url: str) -> str:
    return "postgresql" if url.startswith("postgresql") else "sqlite"


def _sql(url: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement behind the journal's back (``?`` placeholders); return its rows."""
    if _backend(url) == "sqlite":
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            cur = conn.execute(statement, params)
            rows = cur.fetchall()
            conn.commit()
            return rows
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url) as pg_conn:
        found = pg_conn.execute(statement.replace("?", "%s"), params)
        return found.fetchall() if found.description else []


def _story(url: str) -> list[journaled.Fact]:
    """Remember five facts (each text a forgettable payload) and close."""
    with journaled.open(url, clock=ManualClock(start=1_700_000_000_000, step=1)) as rt:
        return [rt.memory.remember(f"the deploy key rotates on day {i}") for i in range(5)]


def _position(url: str, fact: journaled.Fact) -> int:
    with journaled.open(url) as rt:
        return rt.memory.history(fact.id)[0].position


def _check(url: str) -> VerifyReport:
    return verify(url)


def _failed(report: VerifyReport, position: int, kind: str) -> None:
    assert not report.ok, report
    assert report.problem is not None
    assert (report.problem.position, report.problem.kind) == (position, kind), report.problem
    assert f"position {position}" in report.problem.reason


def test_a_clean_journal_verifies_on_every_backend(journal_url: str) -> None:
    """R7: every event of a clean journal is chained from position 1 and verifies."""
    with journaled.open(journal_url) as rt:
        for i in range(4):
            rt.memory.remember(f"fact {i}")
        report = rt.journal.verify()
        assert report.ok, report
        assert report.problem is None
        assert report.events == rt.journal.position() == 4
        assert (report.chained_from, report.unchained, report.payloads) == (1, 0, 4)
        assert report.head is not None
        assert len(report.head) == 32  # a 16-byte chained digest (ADR 0040)


def test_a_purge_still_verifies_on_every_backend(journal_url: str) -> None:
    """R7: a purged payload keeps its digest, so the chain still verifies after erasure."""
    with journaled.open(journal_url) as rt:
        facts = [rt.memory.remember(f"secret number {i}") for i in range(3)]
        assert rt.memory.purge(facts[1].id)
        rt.memory.remember("after the purge")
        report = rt.journal.verify()
        assert report.ok, report
        assert report.events == rt.journal.position()


def test_changing_one_byte_of_an_event_is_reported_at_its_position(db_url: str) -> None:
    """R7: one byte changed in one event's stored state is found at that position."""
    facts = _story(db_url)
    position = _position(db_url, facts[2])
    table, pos = EVENTS[_backend(db_url)]
    [(state,)] = _sql(db_url, f"SELECT state FROM {table} WHERE {pos} = ?", (position,))  # noqa: S608
    changed = bytearray(state)
    changed[-1] ^= 0x01
    _sql(db_url, f"UPDATE {table} SET state = ? WHERE {pos} = ?", (bytes(changed), position))  # noqa: S608
    _failed(_check(db_url), position, "altered")


def test_deleting_an_event_row_is_reported_as_removed(db_url: str) -> None:
    """R7: an event row deleted behind the journal's back is reported removed at its position."""
    facts = _story(db_url)
    position = _position(db_url, facts[1])
    table, pos = EVENTS[_backend(db_url)]
    _sql(db_url, f"DELETE FROM {table} WHERE {pos} = ?", (position,))  # noqa: S608
    _failed(_check(db_url), position, "removed")


def test_deleting_an_event_with_its_digest_is_reported_by_the_next_link(pg_url: str) -> None:
    """R7: deleting an event and its digest record leaves a gap the chain names (J1)."""
    facts = _story(pg_url)
    position = _position(pg_url, facts[2])
    _sql(pg_url, "DELETE FROM journaled_events WHERE notification_id = ?", (position,))
    _sql(pg_url, "DELETE FROM journaled_digests WHERE position = ?", (position,))
    _failed(_check(pg_url), position, "removed")


def test_deleting_a_digest_record_is_reported(db_url: str) -> None:
    """R7: a commit's digest record erased behind the journal's back is reported at its event."""
    facts = _story(db_url)
    position = _position(db_url, facts[2])
    _strip_digests(db_url, position, position)
    _failed(_check(db_url), position, "altered")


def _strip_digests(url: str, first: int, last: int) -> None:
    """Delete the digest records of positions first..last, wherever the backend keeps them."""
    if _backend(url) == "sqlite":
        columns = ", ".join(f"{c} = NULL" for c in CHAIN_COLUMNS)
        _sql(url, f"UPDATE stored_events SET {columns} WHERE rowid BETWEEN ? AND ?", (first, last))  # noqa: S608
    else:
        _sql(url, "DELETE FROM journaled_digests WHERE position BETWEEN ? AND ?", (first, last))


def test_swapping_two_events_payloads_is_reported_at_the_first(db_url: str) -> None:
    """R7: two rows whose stored states were swapped are reported at the first, as moved."""
    facts = _story(db_url)
    first, second = _position(db_url, facts[1]), _position(db_url, facts[3])
    table, pos = EVENTS[_backend(db_url)]
    select = f"SELECT state FROM {table} WHERE {pos} = ?"  # noqa: S608
    [(a,)], [(b,)] = _sql(db_url, select, (first,)), _sql(db_url, select, (second,))
    update = f"UPDATE {table} SET state = ? WHERE {pos} = ?"  # noqa: S608
    _sql(db_url, update, (bytes(b), first))
    _sql(db_url, update, (bytes(a), second))
    report = _check(db_url)
    _failed(report, first, "reordered")
    assert report.problem is not None
    assert f"position {second}" in report.problem.reason


def test_changing_a_payload_row_is_reported(db_url: str) -> None:
    """R7: a forgettable payload changed behind the journal's back is found at its event."""
    facts = _story(db_url)
    position = _position(db_url, facts[3])
    _sql(
        db_url,
        "UPDATE journaled_payloads SET payload = ? WHERE stream = ?",
        (b"the deploy key never rotates", facts[3].id),
    )
    report = _check(db_url)
    _failed(report, position, "payload-altered")
    assert report.problem is not None
    assert facts[3].id in report.problem.reason


def test_deleting_a_payload_row_without_purge_is_reported(db_url: str) -> None:
    """R7: a payload row deleted outside the journal's erasure is reported, a purge is not."""
    facts = _story(db_url)
    with journaled.open(db_url) as rt:
        assert rt.memory.purge(facts[0].id)
    assert _check(db_url).ok
    position = _position(db_url, facts[2])
    _sql(db_url, "DELETE FROM journaled_payloads WHERE stream = ?", (facts[2].id,))
    report = _check(db_url)
    _failed(report, position, "payload-removed")
    assert report.problem is not None
    assert facts[2].id in report.problem.reason


def test_an_undecodable_event_is_reported(db_url: str) -> None:
    """R7, J5: an event whose topic no release knows is reported undecodable at its position."""
    facts = _story(db_url)
    position = _position(db_url, facts[4])
    table, pos = EVENTS[_backend(db_url)]
    _sql(db_url, f"UPDATE {table} SET topic = ? WHERE {pos} = ?", ("no-such@1", position))  # noqa: S608
    report = _check(db_url)
    assert report.problem is not None
    assert report.problem.position == position
    assert report.problem.kind == "altered"  # the digest catches it before the decoder does
    _strip_digests(db_url, 1, 10**9)
    report = _check(db_url)  # without digests, the decoder alone finds it
    _failed(report, position, "undecodable")


def test_a_postgres_id_gap_from_a_failed_insert_is_not_a_problem(pg_url: str) -> None:
    """R7, J1: notification ids skipped by a failed insert are a legitimate gap; it verifies."""
    journal = Journal(parse_url(pg_url), codec())
    try:
        journal.append(_pendings("a", 2))
        with pytest.raises(ConcurrencyConflict):
            journal.append(_pendings("a", 1))  # version 1 again: the insert fails, ids are used
        positions = journal.append(_pendings("b", 2))
        assert positions[0] > 3  # the gap is there
        report = journal.verify()
        assert report.ok, report
        assert report.events == 4
    finally:
        journal.close()


def _pendings(tag: str, n: int) -> list[Pending]:
    return [
        Pending(
            stream=f"mem_{tag}_{i:06d}",
            version=1,
            data=FactRemembered(
                at=1_700_000_000_000 + i, fact_id=f"mem_{tag}_{i:06d}", scope="project"
            ),
        )
        for i in range(n)
    ]


WRITER = textwrap.dedent(
    """
    import sys
    from journaled.events.base import Pending
    from journaled.events.catalog import codec
    from journaled.events.journal import Journal
    from journaled.events.memory import FactRemembered
    from journaled.events.url import parse_url

    url, tag, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    journal = Journal(parse_url(url), codec())
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(count):
        events = [
            Pending(stream=f"mem_{tag}_{i}_{j}", version=1,
                    data=FactRemembered(at=1_700_000_000_000 + i, fact_id=f"mem_{tag}_{i}_{j}",
                                          scope="project"))
            for j in range(1 + i % 3)
        ]
        journal.append(events, payloads={e.stream: f"text {tag} {i}".encode() for e in events})
    journal.close()
    """
)


def _writers(url: str, count: int) -> Iterator[subprocess.Popen[str]]:
    for tag in ("p", "q"):
        yield subprocess.Popen(
            [sys.executable, "-c", WRITER, url, tag, str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )


def test_two_writer_processes_make_one_valid_chain(db_url: str) -> None:
    """R7, J3: two processes appending to one journal at once still produce one valid chain."""
    Journal(parse_url(db_url), codec()).close()  # tables made once, before the race
    count = 60
    procs = list(_writers(db_url, count))
    for proc in procs:  # both are open and waiting: release them together
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        assert proc.wait(timeout=120) == 0
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.close()
        proc.stdout.close()
    report = _check(db_url)
    assert report.ok, report
    assert report.events == 2 * sum(1 + i % 3 for i in range(count))
    assert report.payloads == report.events
    journal = Journal(parse_url(db_url), codec())
    try:
        tags = [e.stream.split("_")[1] for e in journal.read()]
    finally:
        journal.close()
    assert "p" in tags
    assert "q" in tags
    assert any(a != b for a, b in itertools.pairwise(tags))


def test_cli_verify_exits_0_on_a_clean_journal_and_1_on_tampering(db_url: str) -> None:
    """R7: `journaled journal verify` exits 0 when clean, 1 with the position when tampered."""
    facts = _story(db_url)
    clean = CliRunner().invoke(main, ["--url", db_url, "journal", "verify"])
    assert clean.exit_code == 0, clean.output
    assert "ok" in clean.output
    as_json = CliRunner().invoke(main, ["--url", db_url, "journal", "verify", "--json"])
    assert as_json.exit_code == 0
    assert json.loads(as_json.output)["ok"] is True
    position = _position(db_url, facts[1])
    table, pos = EVENTS[_backend(db_url)]
    _sql(db_url, f"DELETE FROM {table} WHERE {pos} = ?", (position,))  # noqa: S608
    tampered = CliRunner().invoke(main, ["--url", db_url, "journal", "verify"])
    assert tampered.exit_code == 1, tampered.output
    assert f"FAILED at position {position} (removed)" in tampered.output
    data = json.loads(
        CliRunner().invoke(main, ["--url", db_url, "journal", "verify", "--json"]).output
    )
    assert data["ok"] is False
    assert data["problem"]["position"] == position


def test_cli_verify_reports_a_payload_deleted_when_memory_cannot_open(db_url: str) -> None:
    """R7: verify opens the journal alone, so it reports what makes the runtime refuse to open."""
    facts = _story(db_url)
    _sql(db_url, "DELETE FROM journaled_payloads WHERE stream = ?", (facts[0].id,))
    result = CliRunner().invoke(main, ["--url", db_url, "journal", "verify"])
    assert result.exit_code == 1, result.output
    assert "(payload-removed)" in result.output


def test_an_old_journal_without_digests_opens_and_says_where_the_chain_starts(
    db_url: str,
) -> None:
    """R7: a journal written before digests opens, works, and verify names the chain's start."""
    _story(db_url)
    if _backend(db_url) == "sqlite":  # as written by the previous release
        for column in CHAIN_COLUMNS:
            _sql(db_url, f"ALTER TABLE stored_events DROP COLUMN {column}")
    else:
        _sql(db_url, "DROP TABLE journaled_digests")
    cli = CliRunner().invoke(main, ["--url", db_url, "journal", "verify"])
    assert cli.exit_code == 0, cli.output
    assert "no digest chain yet" in cli.output
    with journaled.open(db_url) as rt:
        assert len(rt.memory.all()) == 5
        report = rt.journal.verify()
        assert report.ok
        assert report.chained_from is None
        assert report.unchained == 5
        fact = rt.memory.remember("written by this release")
        assert rt.memory.purge(rt.memory.all()[0].id)
        report = rt.journal.verify()
        assert report.ok, report
        assert report.chained_from == rt.memory.history(fact.id)[0].position == 6
        assert report.unchained == 5
        assert report.events == rt.journal.position()
    cli = CliRunner().invoke(main, ["--url", db_url, "journal", "verify"])
    assert cli.exit_code == 0, cli.output
    assert "chain starts at position 6; the 5 events before it" in cli.output


def test_payloads_without_an_event_are_refused(journal_url: str) -> None:
    """R7: a payload or an erasure appended with no event is refused: no record could cover it."""
    journal = Journal(parse_url(journal_url), codec())
    try:
        with pytest.raises(ValueError, match="at least one event"):
            journal.append([], payloads={"k": b"v"})
        with pytest.raises(ValueError, match="at least one event"):
            journal.append([], forget=["k"])
        assert journal.payloads() == {}
        assert journal.verify().ok
    finally:
        journal.close()


class _ReadOnlyModule:
    """A stand-in for the sqlite3 module whose connections refuse to write.

    Every other name (the error classes, the result codes) is the real module's, so the code
    under test tells errors apart exactly as it does with sqlite3 itself.
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(sqlite3, name)

    @staticmethod
    def connect(*args: Any, **kwargs: Any) -> Any:
        conn = sqlite3.connect(*args, **kwargs)

        class Refusing:
            def execute(self, sql: str, *params: Any) -> Any:
                if not sql.startswith("PRAGMA"):
                    raise sqlite3.OperationalError("attempt to write a readonly database")
                return conn.execute(sql, *params)

            def close(self) -> None:
                conn.close()

        return Refusing()


_ReadOnly = _ReadOnlyModule()


def test_an_old_journal_that_cannot_be_written_still_opens_and_verifies(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R7: an old SQLite journal that cannot get the digest columns opens and reads unchained."""
    _story(sqlite_url)
    for column in CHAIN_COLUMNS:
        _sql(sqlite_url, f"ALTER TABLE stored_events DROP COLUMN {column}")
    monkeypatch.setattr("journaled.events.journal._sqlite.sqlite3", _ReadOnly)
    report = _check(sqlite_url)
    assert report.ok, report
    assert (report.chained_from, report.unchained, report.events) == (None, 5, 5)
    with journaled.open(sqlite_url) as rt:
        assert len(rt.memory.all()) == 5
