"""An append the database never answered, then could not be asked about (R5, J1, ADR 0095).

A remember is sent; its connection is lost before the answer; and the database then refuses
every connection for longer than the journal keeps trying. Before, the caller got an
``ActorsError`` saying ``OperationalError: couldn't get a connection``, and nothing told it
that the fact might be stored: a retry stored it twice. Now it gets
:class:`AppendOutcomeUnknown` naming the fact's id, and once the database is back the runtime
agrees with the journal, whichever way the append went. Real PostgreSQL: the database refuses
connections (``ALLOW_CONNECTIONS false``) and the append's own server process is terminated
while it waits.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("psycopg", reason="PostgreSQL tests need the postgres extra (psycopg)")

import psycopg

import journaled
from journaled.events.journal import (
    EVENTS_TABLE_POSTGRES,
    _JournalApp,
    _postgres,
)
from journaled.events.journal._postgres import FLUSH_TABLE

pytestmark = pytest.mark.slow

WAIT = 30.0


@pytest.fixture
def url(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh database; the journal stops trying to reach it after half a second."""
    monkeypatch.setattr(_postgres, "OUTAGE_WAIT", 0.5)
    return pg_url


def _admin(url: str) -> psycopg.Connection[Any]:
    """A connection to the server's maintenance database, which stays open to connections."""
    head, _, _ = url.rpartition("/")
    return psycopg.connect(f"{head}/postgres", autocommit=True)


def _dbname(url: str) -> str:
    return url.rpartition("/")[2].partition("?")[0]


@contextlib.contextmanager
def _refused(url: str) -> Iterator[None]:
    """Refuse every new connection to the database until the block ends."""
    with _admin(url) as admin:
        admin.execute(f'ALTER DATABASE "{_dbname(url)}" ALLOW_CONNECTIONS false')
        try:
            yield
        finally:
            admin.execute(f'ALTER DATABASE "{_dbname(url)}" ALLOW_CONNECTIONS true')


def _terminate_all_but(url: str, holder: psycopg.Connection[Any]) -> None:
    """Terminate every server process of the database but the holder's."""
    with _admin(url) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> %s",
            [_dbname(url), holder.info.backend_pid],
        )


def _waiting_appends(url: str) -> list[int]:
    with _admin(url) as admin:
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock' "
            "AND query LIKE 'CALL public.journaled_append%%'",
            [_dbname(url)],
        ).fetchall()
    return [int(r[0]) for r in rows]


def _wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class _Remember:
    """A remember on a thread: its fact or its error."""

    def __init__(self, rt: journaled.Runtime, text: str) -> None:
        self.fact: journaled.Fact | None = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.fact = rt.memory.remember(text)
            except BaseException as exc:  # reported by the test
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.thread.join(WAIT * 2)
        assert not self.thread.is_alive(), "the remember never answered"


def _cut_off_while_it_waits(url: str, rt: journaled.Runtime, hold: str, text: str) -> _Remember:
    """Start a remember that waits on a lock ``hold`` takes, refuse connections, and terminate
    every server process of the runtime (the remember's too): the caller's answer comes while
    the database is refused, and no connection is left to look with."""
    with psycopg.connect(url) as holder:
        holder.execute(hold)
        remember = _Remember(rt, text)
        _wait_for(lambda: bool(_waiting_appends(url)), "the remember to wait for the lock")
        assert len(_waiting_appends(url)) == 1
        with _refused(url):
            _terminate_all_but(url, holder)
            holder.rollback()
            remember.join()
    return remember


def _until_back(rt: journaled.Runtime) -> None:
    """Wait until the runtime reads the journal again: its pool backs off while refused."""

    def back() -> bool:
        with contextlib.suppress(journaled.JournalUnavailable):
            rt.refresh()
            return True
        return False

    _wait_for(back, "the runtime to reach the database again")


def _texts(url: str) -> list[str]:
    with journaled.open(url) as fresh:
        assert fresh.journal.verify().ok
        return sorted(f.text for f in fresh.memory.all())


def test_a_remember_stored_unseen_is_told_unknown_and_found_once_the_database_is_back(
    url: str,
) -> None:
    """The remember's events committed before its flush, then its process was terminated and
    the database refused connections: the caller is told the outcome is unknown, with the
    fact's id, and once the database is back ``memory.get`` of that id finds the one fact."""
    with journaled.open(url + "?pool_size=1") as rt:
        rt.memory.remember("warm-up")  # the pooled connection exists, so the lock below holds it
        remember = _cut_off_while_it_waits(
            url,
            rt,
            # the flush rows of every process connected now: the append stops after its commit
            f"INSERT INTO public.{FLUSH_TABLE} (pid, appends) SELECT pid, 0 FROM "  # noqa: S608
            "pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            f"ON CONFLICT (pid) DO NOTHING; SELECT pid FROM public.{FLUSH_TABLE} FOR UPDATE",
            "the deploy key rotates on Mondays",
        )
        error = remember.error
        assert isinstance(error, journaled.AppendOutcomeUnknown), repr(error)
        assert isinstance(error, journaled.JournalUnavailable)
        assert error.fact_id is not None
        assert error.appended == [f"{error.fact_id}@1"]
        assert f"rt.memory.get({error.fact_id!r})" in str(error)
        with psycopg.connect(url) as conn:
            stored = conn.execute(
                f"SELECT count(*) FROM public.{EVENTS_TABLE_POSTGRES} "  # noqa: S608
                "WHERE originator_id = %s",
                [error.fact_id],
            ).fetchone()
        assert stored == (1,), "the premise: its events committed before the process ended"
        fact_id = error.fact_id

        _until_back(rt)

        def found() -> bool:
            rt.refresh()
            fact = rt.memory.get(fact_id)
            return fact is not None and fact.text == "the deploy key rotates on Mondays"

        _wait_for(found, "the runtime to see the fact the journal holds")
        rt.memory.remember("after the outage")
    assert _texts(url) == [
        "after the outage",
        "the deploy key rotates on Mondays",
        "warm-up",
    ]


def test_a_remember_never_stored_is_told_unknown_and_is_absent_once_the_database_is_back(
    url: str,
) -> None:
    """The remember waited for the events table's lock when its process was terminated, so
    nothing committed: told unknown, the id is then not found, and remembering again stores
    the fact once."""
    with journaled.open(url + "?pool_size=1") as rt:
        rt.memory.remember("warm-up")
        remember = _cut_off_while_it_waits(
            url,
            rt,
            f"LOCK TABLE public.{EVENTS_TABLE_POSTGRES} IN EXCLUSIVE MODE",
            "the staging database is read-only",
        )
        error = remember.error
        assert isinstance(error, journaled.AppendOutcomeUnknown), repr(error)
        assert error.fact_id is not None
        _until_back(rt)
        assert rt.memory.get(error.fact_id) is None
        again = rt.memory.remember("the staging database is read-only")
        assert again.id != error.fact_id
    assert _texts(url) == ["the staging database is read-only", "warm-up"]


def test_an_append_with_no_connection_to_be_had_stores_nothing_and_says_so(url: str) -> None:
    """During an outage, the first remember goes out on the pooled connection, whose server
    process is gone (unknown: it may have been sent); the next finds no connection at all, so
    its call never left: JournalUnavailable, which says nothing was appended."""
    with journaled.open(url + "?pool_size=1") as rt:
        rt.memory.remember("warm-up")
        with _refused(url):
            with _admin(url) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                    [_dbname(url)],
                )
            with pytest.raises(journaled.JournalUnavailable) as first:
                rt.memory.remember("sent into the outage")
            with pytest.raises(journaled.JournalUnavailable) as second:
                rt.memory.remember("never sent")
        assert isinstance(first.value, journaled.AppendOutcomeUnknown)
        assert not isinstance(second.value, journaled.AppendOutcomeUnknown)
        assert "nothing was appended" in str(second.value)
        _until_back(rt)
        rt.memory.remember("after the outage")
    assert _texts(url) == ["after the outage", "warm-up"]


def test_a_connection_limit_below_what_a_runtime_needs_is_named_with_what_to_change(
    url: str,
) -> None:
    """A role allowed fewer connections than a runtime holds: the open says so, with the count
    it needs and the two ways out, instead of "check the host, port, user, password", and
    keeps none of the connections it had opened."""
    role = f"small_{uuid.uuid4().hex[:8]}"
    with _admin(url) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 3")
        admin.execute(f'GRANT ALL ON DATABASE "{_dbname(url)}" TO {role}')
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"GRANT ALL ON SCHEMA public TO {role}")
    limited = url.replace("://postgres@", f"://{role}@", 1)
    with pytest.raises(journaled.JournalUrlError) as caught:
        journaled.open(limited)
    words = str(caught.value)
    assert f'too many connections for role "{role}"' in words
    assert "a runtime needs pool_size + 4 connections at most (here 9)" in words
    assert "smaller ?pool_size=" in words
    assert "check the host" not in words
    # The failed open closed the connections its pool had opened: before, they stayed open
    # until the process ended, and every retry met the limit again.
    with _admin(url) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", [role]
        ).fetchone()
    assert row == (0,)
    with journaled.open(limited + "?pool_size=1") as rt:  # within the limit: it works
        rt.memory.remember("fits in three connections")
        assert [f.text for f in rt.memory.all()] == ["fits in three connections"]


def test_a_pool_whose_every_connection_stays_in_use_is_not_called_unreachable(url: str) -> None:
    """ADR 0095 (update): every pooled connection is held by other calls of this process for
    the whole wait. The database is there: the error says connections were short, how many the
    pool holds and how to have more, not "could not be reached ... once the database is back".
    Nothing was appended, and the next remember, once connections are free, is stored."""
    with journaled.open(url + "?pool_size=1") as rt:
        rt.memory.remember("warm-up")
        recorder: Any = rt._journal._recorder
        store = recorder._store
        held: list[object] = []
        release = threading.Event()

        def hold() -> None:
            with store.get_connection() as conn:
                held.append(conn)
                release.wait(WAIT)

        holders = [threading.Thread(target=hold) for _ in range(3)]  # pool_size + overflow
        for holder in holders:
            holder.start()
        try:
            _wait_for(lambda: len(held) == 3, "every pooled connection to be held")
            with pytest.raises(journaled.JournalUnavailable) as append:
                rt.memory.remember("while every connection is in use")
            with pytest.raises(journaled.JournalUnavailable) as read:
                rt.journal.position()
        finally:
            release.set()
            for holder in holders:
                holder.join()
        for caught, outcome in ((append, ", so nothing was appended;"), (read, "; try again")):
            assert not isinstance(caught.value, journaled.AppendOutcomeUnknown)
            assert caught.value.busy == 3
            words = str(caught.value)
            assert "had no free connection" in words
            assert "each of this process's 3 pooled connections stayed in use" in words
            assert outcome in words
            assert "larger ?pool_size=" in words
            assert "could not be reached" not in words
        assert read.value.read
        rt.memory.remember("once connections are free")
    assert _texts(url) == ["once connections are free", "warm-up"]


def test_an_open_that_fails_after_its_pool_connected_keeps_no_connection(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal's application fails to construct after its factory's pool connected and
    made the tables: the factory is closed, so the failed open leaves no connection behind."""
    role = f"late_{uuid.uuid4().hex[:8]}"
    with _admin(url) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f'GRANT ALL ON DATABASE "{_dbname(url)}" TO {role}')
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"GRANT ALL ON SCHEMA public TO {role}")
    own = url.replace("://postgres@", f"://{role}@", 1)
    journaled.open(own).close()  # the schema exists: the next open only connects

    def broken(self: Any) -> Any:
        raise RuntimeError("the event store could not be made")

    monkeypatch.setattr(_JournalApp, "construct_event_store", broken)
    with pytest.raises(RuntimeError, match="could not be made") as caught:
        journaled.open(own)
    # The caller still holds the error, and with it the frames of the failed construction
    # (a retry loop that logs it does): the connections must be closed, not left to the GC.
    assert caught.traceback
    with _admin(url) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", [role]
        ).fetchone()
    assert row == (0,)


@pytest.mark.parametrize("stored", [True, False], ids=["stored", "not-stored"])
def test_a_run_whose_step_result_was_cut_off_resumes_from_what_the_journal_holds(
    url: str, stored: bool
) -> None:
    """A step's success is sent, its connection lost, and the database refused: the run's
    caller is told the outcome is unknown; once the database is back, a resume runs the step
    again only if its success was not stored, and the run completes, the journal whole."""
    with journaled.open(url + "?pool_size=1") as rt:
        calls: list[str] = []
        release = threading.Event()

        def slow(x: str) -> str:
            calls.append(x)
            if x == "a":
                assert release.wait(WAIT)
            return x.upper()

        rt.register_tool("slow", slow)
        plan = journaled.Plan(
            goal="cut off",
            steps=[
                journaled.Step("a", tool="slow", input="a"),
                journaled.Step("b", tool="slow", input="b", depends_on=["a"]),
            ],
        )
        handle = rt.start(plan)
        _wait_for(lambda: calls == ["a"], "step a to start")
        hold = (
            f"INSERT INTO public.{FLUSH_TABLE} (pid, appends) SELECT pid, 0 FROM "  # noqa: S608
            "pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            f"ON CONFLICT (pid) DO NOTHING; SELECT pid FROM public.{FLUSH_TABLE} FOR UPDATE"
            if stored
            else f"LOCK TABLE public.{EVENTS_TABLE_POSTGRES} IN EXCLUSIVE MODE"
        )
        with psycopg.connect(url) as holder:
            holder.execute(hold)
            release.set()
            _wait_for(lambda: bool(_waiting_appends(url)), "a's success to wait for the lock")
            with _refused(url):
                _terminate_all_but(url, holder)
                holder.rollback()
                with pytest.raises(journaled.AppendOutcomeUnknown) as caught:
                    handle.result(WAIT * 2)
        assert f"{handle.run_id}@" in caught.value.appended[0]
        calls.clear()
        _until_back(rt)
        done = rt.resume(handle.run_id)
        assert isinstance(done, journaled.ExecuteResult)
        assert done.ok
        assert calls == (["b"] if stored else ["a", "b"])
        assert [o.output for o in done.observations if o.ok] == ["A", "B"]
        assert rt.journal.verify().ok


def test_reads_during_an_outage_say_the_journal_is_unavailable_and_work_once_it_is_back(
    url: str,
) -> None:
    """Before, a read during an outage raised the library's bare OperationalError, after up to
    three waits of 10 s for a connection; now JournalUnavailable, marked a read (it says nothing
    of appends), and the same reads answer once the database is back."""
    with journaled.open(url + "?pool_size=1") as rt:
        rt.register_tool("echo", lambda x: x)
        run = rt.execute(journaled.Plan(goal="g", steps=[journaled.Step("a", tool="echo")]))
        before = (rt.journal.read(), rt.runs.current(run.run_id))
        with _refused(url):
            with _admin(url) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                    [_dbname(url)],
                )
            for read in (
                rt.journal.read,
                lambda: rt.runs.at(run.run_id, before[0][-1].position),
                lambda: rt.runs.history(run.run_id),
            ):
                with pytest.raises(journaled.JournalUnavailable) as caught:
                    read()
                assert caught.value.read
                assert "could not be reached" in str(caught.value)
                assert "appended" not in str(caught.value)

        def back() -> bool:  # once the pool has connected again (it backs off while refused)
            with contextlib.suppress(journaled.JournalUnavailable):
                return (rt.journal.read(), rt.runs.current(run.run_id)) == before
            return False

        _wait_for(back, "reads to answer once the database is back")


def test_every_connection_finds_a_silent_drop_within_seconds(url: str) -> None:
    """A connection the network drops without a word (a NAT or firewall forgetting it) must be
    found dead in seconds, not the kernel's minutes, for the window's retries to matter: the
    pooled connections and the follower's listener carry TCP keepalives and a user timeout,
    read back from libpq."""
    from journaled.events.journal._postgres import KEEPALIVES

    with journaled.open(url) as rt:
        recorder: Any = rt._journal._recorder
        with recorder._store.get_connection() as conn:
            pooled = conn.info.get_parameters()
        listener = rt._journal._listen(quiet=True).info.get_parameters()
    for held in (pooled, listener):
        for name, value in KEEPALIVES.items():
            assert held.get(name) == str(value), (name, held)
    assert KEEPALIVES["keepalives"] == 1
    idle, every, count = (
        KEEPALIVES[k] for k in ("keepalives_idle", "keepalives_interval", "keepalives_count")
    )
    assert idle + every * count <= 30
