"""Journal subscriptions: catch-up then live, across processes, named and at-least-once (A3)."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

import journaled
from journaled import subscriptions as subscriptions_module
from journaled.cli import main
from journaled.errors import InvalidArgument
from journaled.events.base import Event
from journaled.events.journal import SUBSCRIPTION_TABLE
from journaled.runtime import verify as verify_journal
from journaled.subscriptions import AsyncSubscription, StoredSubscription, Subscription
from journaled.testing import wait_for

SHARED = pytest.mark.parametrize("journal_url", ["sqlite", "postgresql"], indirect=True)
"""Backends several runtimes and processes can share (an in-memory journal is one runtime's)."""
WAIT = 30.0
"""Longest a test waits for a delivery before failing (never reached when things work)."""

REMEMBER = """
import sys, journaled
with journaled.open(sys.argv[1]) as rt:
    for text in sys.argv[2:]:
        rt.memory.remember(text, scope="user")
"""

CONSUMER = """
import sys, time
from pathlib import Path
import journaled
url, workdir, crash_at = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
with journaled.open(url) as rt, rt.journal.subscribe(name="mailer") as sub:
    for event in sub:
        with (workdir / "handled.log").open("a") as log:
            log.write(f"{event.position}\\n")
        if event.position == crash_at:
            (workdir / "handled-not-acked").write_text(str(event.position))
            time.sleep(600)  # killed here: handled, never acknowledged
        sub.ack(event.position)
"""


def _remember_elsewhere(url: str, *texts: str) -> None:
    """Remember facts from another process (a real one, with its own connections)."""
    subprocess.run([sys.executable, "-c", REMEMBER, url, *texts], check=True, timeout=WAIT)


def _waiting(rt: journaled.Runtime) -> bool:
    """Tell whether some subscription of this runtime is waiting for appends."""
    return bool(rt._journal._waiters)


def _take(sub: Subscription, n: int) -> list[Event]:
    got: list[Event] = []
    while len(got) < n:
        event = sub.poll(WAIT)
        assert event is not None, f"only {len(got)} of {n} events were delivered"
        got.append(event)
    return got


@pytest.fixture
def two(journal_url: str) -> Iterator[journaled.Runtime]:
    """Yield a runtime whose journal holds two remembered facts."""
    with journaled.open(journal_url) as rt:
        rt.memory.remember("the deploy key rotates monthly")
        rt.memory.remember("staging runs on port 8080")
        yield rt


# -- order, filters, boundaries ----------------------------------------------------------------


def test_catch_up_then_live_in_order(
    two: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A3: past events come first, in pages, then appends as they happen, all in journal order."""
    monkeypatch.setattr(subscriptions_module, "PAGE", 1)  # several pages even for a short past
    past = two.journal.read()
    with two.journal.subscribe() as sub:
        assert [e.position for e in _take(sub, len(past))] == [e.position for e in past]
        assert sub.poll(0) is None
        appender = threading.Thread(
            target=lambda: [two.memory.remember(f"live fact {i}") for i in range(3)]
        )
        appender.start()
        live = _take(sub, 3)
        appender.join()
    assert [e.kind for e in live] == ["memory.fact-remembered"] * 3
    assert [e.position for e in live] == [
        e.position for e in two.journal.read(after=past[-1].position)
    ]
    assert sub.position == live[-1].position


def test_topics_keep_only_those_event_tags(two: journaled.Runtime) -> None:
    """A3: topics=[tags] delivers only events of those tags, before and after subscribing."""
    two.register_tool("echo", lambda x: x)
    two.execute(journaled.Plan(goal="g", steps=[journaled.Step("a", tool="echo", input=1)]))
    with two.journal.subscribe(topics=["run.started", "run.finished"]) as sub:
        past = _take(sub, 2)
        two.memory.remember("not a run event")
        two.execute(journaled.Plan(goal="h", steps=[journaled.Step("b", tool="echo", input=2)]))
        live = _take(sub, 2)
        assert sub.poll(0) is None
    assert [e.kind for e in past + live] == ["run.started", "run.finished"] * 2
    with two.journal.subscribe(topics="memory.fact-remembered") as sub:
        assert {e.kind for e in _take(sub, 2)} == {"memory.fact-remembered"}
        sub.close()
        assert sub.poll(0) is None  # one more was read with the page, but closed is closed
        assert list(sub) == []


def test_bad_arguments_are_errors_naming_them_and_store_nothing(two: journaled.Runtime) -> None:
    """A3: an unknown tag, a bad name or position is a one-line error naming it; nothing stored."""
    with pytest.raises(
        InvalidArgument, match=r"topics .*unknown event tag 'memory\.fact-remembred'"
    ):
        two.journal.subscribe(topics=["memory.fact-remembred"], name="x")
    with pytest.raises(InvalidArgument, match="topics is empty"):
        two.journal.subscribe(topics=[])
    for name, problem in [("", "empty"), ("a\nb", "unprintable"), ("n" * 201, "bound"), (3, "str")]:
        with pytest.raises(InvalidArgument, match=f"^name .*{problem}"):
            two.journal.subscribe(name=name)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"^after "):
        two.journal.subscribe(after=-1)
    with two.journal.subscribe() as sub:
        for timeout in (-1, float("nan"), "1"):
            with pytest.raises(InvalidArgument, match=r"^timeout "):
                sub.poll(timeout)  # type: ignore[arg-type]
        assert sub.position == 0
    assert two.journal.subscriptions() == []


@SHARED
def test_another_organizations_facts_are_never_delivered(journal_url: str) -> None:
    """R1/A3: a subscriber of organization `other` never receives acme's fact events."""
    with journaled.open(journal_url, organization="acme") as acme:
        acme.memory.remember("acme buys globex", scope="organization", conflict_key="deal")
        with (
            journaled.open(journal_url, organization="other") as other,
            other.journal.subscribe() as sub,
        ):
            acme.memory.remember("acme buys initech", scope="organization", conflict_key="deal")
            shared = acme.memory.remember("the wifi is called guest", scope="project")
            got = sub.poll(WAIT)
            assert got is not None
            assert sub.poll(0.2) is None
    assert got.stream == shared.id
    assert got.position > 2  # acme's facts and their key claims came before it, unseen


# -- waiting: threads and asyncio ------------------------------------------------------------


@pytest.fixture
def no_safety_net(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every wait last an hour unless woken: only a real wake-up can end it in time."""
    monkeypatch.setattr(subscriptions_module, "_SLICE", 3600.0)


@pytest.mark.usefixtures("no_safety_net")
def test_close_unblocks_an_iterator_waiting_in_another_thread(two: journaled.Runtime) -> None:
    """A3: close() from another thread ends a `for event in sub` that is waiting for appends."""
    sub = two.journal.subscribe(after=two.journal.position())
    seen: list[Event] = []
    consumer = threading.Thread(target=lambda: seen.extend(sub))
    consumer.start()
    wait_for(lambda: _waiting(two), timeout=WAIT)
    sub.close()
    consumer.join(WAIT)
    assert not consumer.is_alive()
    assert seen == []


async def _lag_probe(stop: asyncio.Event, lags: list[float]) -> None:
    while not stop.is_set():
        start = time.monotonic()
        await asyncio.sleep(0.005)
        lags.append(time.monotonic() - start - 0.005)


@pytest.mark.usefixtures("no_safety_net")
def test_async_waits_never_block_the_loop_and_cancel_cleanly(two: journaled.Runtime) -> None:
    """A3: awaiting a subscription leaves the loop free; a cancelled wait loses no event."""

    async def story() -> tuple[list[float], Event | None, Event | None, list[Event]]:
        stop = asyncio.Event()
        lags: list[float] = []
        probe = asyncio.create_task(_lag_probe(stop, lags))
        async with await AsyncSubscription.open(
            two.journal, topics=["memory.fact-remembered"]
        ) as past:
            caught_up = [await past.poll(WAIT) for _ in range(2)]
        assert [e.position for e in caught_up if e is not None] == [1, 2]
        sub = await AsyncSubscription.open(two.journal, after=two.journal.position())
        quiet = await sub.poll(1.0)  # nothing is appended: a full second's wait
        waiting = asyncio.create_task(sub.poll(None))
        while not _waiting(two):
            await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.to_thread(two.memory.remember, "appended after the cancel")
        after_cancel = await sub.poll(WAIT)
        iterated: list[Event] = []

        async def consume() -> None:
            async with sub:
                async for event in sub:
                    iterated.append(event)  # noqa: PERF401 - seen one by one, while it waits

        consumer = asyncio.create_task(consume())
        await asyncio.to_thread(two.memory.remember, "seen by async for")
        while not iterated:
            await asyncio.sleep(0.01)
        await sub.aclose()
        await asyncio.wait_for(consumer, WAIT)
        stop.set()
        await probe
        return lags, quiet, after_cancel, iterated

    lags, quiet, after_cancel, iterated = asyncio.run(story())
    assert quiet is None
    assert after_cancel is not None
    assert after_cancel.position == two.journal.position() - 1
    assert [e.position for e in iterated] == [two.journal.position()]
    assert max(lags) < 0.1  # well under the 1 s the subscription waited


# -- across processes ---------------------------------------------------------------------------


@SHARED
@pytest.mark.usefixtures("no_safety_net")
def test_appends_of_another_process_are_delivered_live(journal_url: str) -> None:
    """A3: a subscriber waiting in this process receives what another process appends, in order."""
    with journaled.open(journal_url) as rt, rt.journal.subscribe() as sub:
        assert sub.poll(0) is None
        appender = threading.Thread(
            target=_remember_elsewhere, args=(journal_url, "from afar 1", "from afar 2")
        )
        started = time.monotonic()
        appender.start()
        got = _take(sub, 2)
        # Woken by the appends: a wait nothing wakes lasts its whole timeout (WAIT), then reads.
        assert time.monotonic() - started < WAIT
        appender.join()
        logged = rt.journal.read()
        wait_for(lambda: rt.memory.get(got[1].stream) is not None, timeout=WAIT)
        texts = [rt.memory.get(e.stream) for e in got]
    assert [e.position for e in got] == [e.position for e in logged]
    assert [f.text for f in texts if f is not None] == ["from afar 1", "from afar 2"]


# -- named subscriptions -----------------------------------------------------------------------


@SHARED
def test_a_named_position_survives_reopening(journal_url: str) -> None:
    """A3: a named subscription resumes after its last acknowledged event in a new runtime."""
    with journaled.open(journal_url) as rt:
        for text in ("a", "b", "c"):
            rt.memory.remember(f"fact {text}")
        with rt.journal.subscribe(name="indexer") as sub:
            first, second = _take(sub, 2)
            sub.ack(first.position)
    with journaled.open(journal_url) as rt:
        assert rt.journal.subscriptions() == [
            StoredSubscription(name="indexer", position=first.position)
        ]
        with rt.journal.subscribe(name="indexer") as sub:
            assert _take(sub, 1)[0].position == second.position
        # An explicit `after` past the stored position skips ahead, for good.
        with rt.journal.subscribe(name="indexer", after=second.position) as sub:
            assert sub.position == second.position
        assert rt.journal.subscriptions()[0].position == second.position
        assert rt.journal.unsubscribe("indexer") is True
        assert rt.journal.unsubscribe("indexer") is False
        assert rt.journal.subscriptions() == []


def test_ack_rules(two: journaled.Runtime) -> None:
    """A3: acks only move forward (a backward one is ignored); an undelivered one is an error."""
    with two.journal.subscribe(name="rules") as sub:
        with pytest.raises(InvalidArgument, match="never delivered"):
            sub.ack(1)
        first, second = _take(sub, 2)
        with pytest.raises(InvalidArgument, match="never delivered"):
            sub.ack(second.position + 1)
        sub.ack(second.position)
        sub.ack(first.position)  # backwards: ignored
        assert sub.acked == second.position
        with pytest.raises(InvalidArgument, match=r"^position must be an int"):
            sub.ack("2")  # type: ignore[arg-type]
    assert two.journal.subscriptions() == [
        StoredSubscription(name="rules", position=second.position)
    ]


@SHARED
def test_a_consumer_killed_before_acking_gets_the_event_again(
    journal_url: str, tmp_path: Path
) -> None:
    """A3: at-least-once: killed between handling and acking, a consumer resumes at that event."""
    with journaled.open(journal_url) as rt:
        facts = [rt.memory.remember(f"mail {i}") for i in range(4)]
    positions = [1, 2, 3, 4]
    script = [CONSUMER, journal_url, str(tmp_path), str(positions[1])]
    proc = subprocess.Popen([sys.executable, "-c", *script])
    try:
        wait_for((tmp_path / "handled-not-acked").exists, timeout=WAIT)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=WAIT) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    handled = [int(p) for p in (tmp_path / "handled.log").read_text().split()]
    with journaled.open(journal_url) as rt:
        assert rt.journal.subscriptions()[0].position == handled[0]
        with rt.journal.subscribe(name="mailer") as sub:
            again = [e.stream for e in _take(sub, 3)]
    assert handled == positions[:2]
    assert again == [f.id for f in facts[1:]]  # the unacknowledged one again, then the rest


# -- not part of the log ------------------------------------------------------------------------


def test_verify_and_purge_ignore_stored_subscriptions(journal_url: str) -> None:
    """A3/R7/M10: a stored subscription leaves verify passing and purge and scrub unaffected."""
    with journaled.open(journal_url) as rt:
        fact = rt.memory.remember("to be erased")
        with rt.journal.subscribe(name="audit") as sub:
            sub.ack(_take(sub, 1)[0].position)
        assert rt.memory.purge(fact.id) is True
        rt.memory.scrub()
        report = rt.journal.verify()
        assert report.ok, report.problem
        assert rt.journal.subscriptions() == [StoredSubscription(name="audit", position=1)]
    if journal_url != "memory://":
        assert verify_journal(journal_url).ok


def test_an_older_journal_gets_the_table_and_a_read_only_open_writes_nothing(
    sqlite_url: str,
) -> None:
    """A3/J6: a journal without the table opens; reading creates nothing, opening creates it."""
    path = sqlite_url.removeprefix("sqlite:///")
    with journaled.open(sqlite_url) as rt:
        rt.memory.remember("from the previous release")
    with sqlite3.connect(path) as conn:
        conn.execute(f"DROP TABLE {SUBSCRIPTION_TABLE}")  # as the previous release left it
    before = Path(path).read_bytes()
    assert verify_journal(sqlite_url).ok
    with journaled.Runtime(sqlite_url, create=False, follow=None) as rt:
        assert rt.journal.subscriptions() == []
        assert rt.journal.unsubscribe("nobody") is False
    assert Path(path).read_bytes() == before
    with journaled.open(sqlite_url) as rt, rt.journal.subscribe(name="new") as sub:
        sub.ack(_take(sub, 1)[0].position)
        assert rt.journal.subscriptions() == [StoredSubscription(name="new", position=1)]


def test_an_older_postgresql_journal_read_without_migrating_creates_the_table_on_ack(
    pg_url: str,
) -> None:
    """A3/J6: reading creates nothing; the first acknowledgement creates the missing table."""
    import psycopg

    with journaled.open(pg_url) as rt:
        rt.memory.remember("from the previous release")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {SUBSCRIPTION_TABLE}")  # as the previous release left it

    def exists() -> bool:
        with psycopg.connect(pg_url) as conn:
            row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [SUBSCRIPTION_TABLE])
            return bool(row.fetchone()[0])  # type: ignore[index]

    assert verify_journal(pg_url).ok
    with journaled.Runtime(pg_url, create=False, follow=None) as rt:
        assert rt.journal.subscriptions() == []
        assert not exists()
        with rt.journal.subscribe(name="late") as sub:
            sub.ack(_take(sub, 1)[0].position)
        assert rt.journal.subscriptions() == [StoredSubscription(name="late", position=1)]
    assert exists()


# -- the command line ---------------------------------------------------------------------------


def _tail(url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "journaled.cli", "--url", url, "journal", "tail", "--follow", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    return out


@pytest.mark.parametrize("journal_url", ["sqlite"], indirect=True)
def test_tail_follow_prints_an_append_then_stops(journal_url: str) -> None:
    """A3: `journal tail --follow` prints an event appended after it started; Ctrl-C exits 0."""
    with journaled.open(journal_url) as rt:
        rt.memory.remember("before the tail")
    proc = _tail(journal_url, "--limit", "1")
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("#1 ")  # the backlog: it is following now
    _remember_elsewhere(journal_url, "after the tail started")
    line = proc.stdout.readline()
    assert _stop(proc) == ""
    assert line.startswith("#2 ")
    assert "remembered in scope 'user'" in line


@pytest.mark.parametrize("journal_url", ["sqlite"], indirect=True)
def test_tail_follow_with_a_name_resumes_where_it_stopped(journal_url: str) -> None:
    """A3: `tail --follow --name` acknowledges what it printed and resumes after it next time."""
    with journaled.open(journal_url) as rt:
        rt.memory.remember("first")
    proc = _tail(journal_url, "--name", "ops")
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("#1 ")
    _remember_elsewhere(journal_url, "second")
    assert proc.stdout.readline().startswith("#2 ")
    with journaled.open(journal_url) as rt:
        wait_for(lambda: rt.journal.subscriptions()[0].position == 2, timeout=WAIT)
    _stop(proc)
    _remember_elsewhere(journal_url, "third")
    proc = _tail(journal_url, "--name", "ops")
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("#3 ")
    _stop(proc)
    listed = CliRunner().invoke(main, ["--url", journal_url, "--json", "journal", "subscriptions"])
    assert listed.exit_code == 0, listed.output
    assert listed.output.strip() == '[{"name":"ops","position":3}]'
    refused = CliRunner().invoke(main, ["--url", journal_url, "journal", "tail", "--name", "x"])
    assert refused.exit_code == 1
    assert "--name needs --follow" in refused.output


# -- erasure: a page read before a purge (M10, R2) ----------------------------------------------

MARK = "quokkamark"
"""In every goal, input, output and fact text an erasure below must take out of deliveries."""

PURGE_ELSEWHERE = """
import sys, journaled
with journaled.open(sys.argv[1], follow=None) as rt:
    assert rt.runs.purge(sys.argv[2], reason="erasure request") > 0
    assert rt.memory.purge(sys.argv[3], reason="erasure request")
"""


def _with_content(rt: journaled.Runtime) -> tuple[str, str]:
    """Store a run and a fact whose content holds MARK; return the run id and the fact id."""
    rt.register_tool("echo", lambda x: f"out {MARK} {x}")
    plan = journaled.Plan(
        goal=f"goal {MARK}",
        steps=[journaled.Step(f"s{i}", tool="echo", input=f"in {MARK} {i}") for i in range(5)],
    )
    run = rt.execute(plan)
    fact = rt.memory.remember(f"the {MARK} fact")
    rt.memory.remember("a fact read after it, so the page holds both")
    return run.run_id, fact.id


def _holding_mark(events: list[Event]) -> list[int]:
    return [e.position for e in events if MARK.encode() in msgspec.json.encode(e)]


def test_events_delivered_after_a_purge_returned_hold_no_erased_content(
    journal_url: str,
) -> None:
    """M10, R2, ADR 0026 update: a subscription that has read a page before ``runs.purge`` and
    ``memory.purge`` (of another thread) returned delivers the rest of it as the journal now
    holds it: no goal, input, output or fact text the purges erased."""
    with journaled.open(journal_url) as rt:
        run_id, fact_id = _with_content(rt)
        with rt.journal.subscribe() as sub:
            first = sub.poll(WAIT)  # a page is read: everything so far, content and all
            assert first is not None
            assert len(sub._buffer) > 10

            def purge() -> None:
                assert rt.runs.purge(run_id, reason="erasure request") > 0
                assert rt.memory.purge(fact_id, reason="erasure request")

            purger = threading.Thread(target=purge)
            purger.start()
            purger.join(WAIT)
            after = _take(sub, rt.journal.position() - first.position)
    assert _holding_mark(after) == []
    assert [e.position for e in after] == list(range(first.position + 1, after[-1].position + 1))


@SHARED
def test_a_purge_by_another_process_reaches_a_page_read_before_it(journal_url: str) -> None:
    """M10, R2, ADR 0026 update: a page read before another process purged a run and a fact is
    delivered, once the purge has returned there (and the subscription's 5 ms check has passed),
    without the erased content."""
    with journaled.open(journal_url, follow=None) as rt:
        run_id, fact_id = _with_content(rt)
        with rt.journal.subscribe() as sub:
            first = sub.poll(WAIT)
            assert first is not None
            subprocess.run(
                [sys.executable, "-c", PURGE_ELSEWHERE, journal_url, run_id, fact_id],
                check=True,
                timeout=WAIT,
            )
            time.sleep(0.05)
            after = _take(sub, rt.journal.position() - first.position)
    assert _holding_mark(after) == []


def test_an_async_subscription_never_delivers_what_a_purge_erased(journal_url: str) -> None:
    """M10, R2, A3: the asyncio subscription delivers a page read before a purge returned
    without the erased content, as the sync one does (the check runs in its waiting thread)."""
    with journaled.open(journal_url) as rt:
        run_id, fact_id = _with_content(rt)
        end = rt.journal.position()

        async def story() -> list[Event]:
            async with await AsyncSubscription.open(rt.journal) as sub:
                first = await sub.poll(WAIT)
                assert first is not None
                await asyncio.to_thread(rt.runs.purge, run_id, reason="erasure request")
                await asyncio.to_thread(rt.memory.purge, fact_id, reason="erasure request")
                after: list[Event] = []
                while not after or after[-1].position < end:
                    event = await sub.poll(WAIT)
                    assert event is not None
                    after.append(event)
                return after

        after = asyncio.run(story())
    assert _holding_mark(after) == []


def test_without_an_erasure_each_page_is_read_once(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0026 update: the erasure check costs no read of the events when nothing was erased,
    however slowly the consumer takes a page (one count is read per page and per 5 ms)."""
    monkeypatch.setattr(subscriptions_module, "PAGE", 4)
    with journaled.open(sqlite_url) as rt:
        for i in range(10):
            rt.memory.remember(f"fact {i}")
        reads: list[int] = []
        journal = rt._journal
        real = journal.read

        def counted(*args: object, **kwargs: object) -> Iterator[Event]:
            reads.append(1)
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(journal, "read", counted)
        with rt.journal.subscribe() as sub:
            for _ in range(10):
                assert sub.poll(WAIT) is not None
                time.sleep(0.01)  # past the 5 ms: every take asks for the count
        assert len(reads) == 3  # pages of 4, 4 and 2 events
