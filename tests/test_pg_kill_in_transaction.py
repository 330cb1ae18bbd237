"""A process SIGKILLed while its transaction holds the journal's lock (J2, M10, R5).

A purge is the library's path: one transaction that takes the events table's lock, erases the
fact's text and appends its events. Its server process is made to sleep inside that transaction
(a trigger), and the client process is SIGKILLed meanwhile. The server must roll the purge back
whole: another process then appends within its lock wait, the fact is whole (not half erased),
the journal verifies, and a purge made again erases it once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

pytest.importorskip("psycopg", reason="PostgreSQL tests need the postgres extra (psycopg)")

import psycopg

import journaled
from journaled.events.journal import EVENTS_TABLE_POSTGRES, PAYLOAD_TABLE

pytestmark = pytest.mark.slow

WAIT = 30.0

_CHILD = r"""
import sys, journaled
rt = journaled.open(sys.argv[1])
fact = rt.memory.all()[0]
print("PURGING", flush=True)
rt.memory.purge(fact.id, reason="killed before it committed")
print("PURGED", flush=True)
"""


def _one(url: str, query: str, params: list[Any] | None = None) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def test_a_purge_killed_inside_its_transaction_is_rolled_back_whole(pg_url: str) -> None:
    with journaled.open(pg_url) as rt:
        fact = rt.memory.remember("the vault code is 0000")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # The insert of a purge's events sleeps 3 s inside its transaction, lock held.
        conn.execute(
            "CREATE FUNCTION slow_f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.topic LIKE 'memory.fact-purged%' THEN PERFORM pg_sleep(3); END IF; "
            "RETURN NEW; END $$"
        )
        conn.execute(
            f"CREATE TRIGGER slow_t BEFORE INSERT ON public.{EVENTS_TABLE_POSTGRES} "
            "FOR EACH ROW EXECUTE FUNCTION slow_f()"
        )
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, pg_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + WAIT
        while not _one(
            pg_url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event = 'PgSleep'",
        ):
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the purge never reached its insert"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        out, _ = child.communicate(timeout=WAIT)  # closes the pipes
    assert "PURGED" not in out
    # The killed client's server process wakes, finds its client gone, and rolls back: the
    # trigger can then be dropped (its lock waits for that transaction to end).
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP TRIGGER slow_t ON public.{EVENTS_TABLE_POSTGRES}")
    # Nothing of the purge is stored: the text is still there, no purge event.
    assert _payloads(pg_url, fact.id) == 1
    assert _one(pg_url, _PURGES) == 0
    with journaled.open(pg_url) as again:
        assert again.journal.verify().ok
        assert [f.text for f in again.memory.all()] == ["the vault code is 0000"]
        again.memory.remember("appended after the kill")  # the lock is free again
        assert again.memory.purge(fact.id, reason="the second time")
        assert again.journal.verify().ok
    assert _payloads(pg_url, fact.id) == 0
    assert _one(pg_url, _PURGES) == 1


_PAYLOADS = f"SELECT count(*) FROM public.{PAYLOAD_TABLE} WHERE stream = %s"  # noqa: S608
_PURGES = (
    f"SELECT count(*) FROM public.{EVENTS_TABLE_POSTGRES} "  # noqa: S608
    "WHERE topic LIKE 'memory.fact-purged%%'"
)


def _payloads(url: str, fact_id: str) -> int:
    return int(_one(url, _PAYLOADS, [fact_id]))
