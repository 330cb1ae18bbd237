"""Journal subscriptions under attack: other processes, shared names, odd arguments, closes (A3).

Every probe here holds: each asserts the specific behaviour SPEC A3 (with A1 for the asyncio
side and J1/J3 for order across processes) asks of ``rt.journal.subscribe``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import journaled
import journaled.aio
from journaled import subscriptions as subscriptions_module
from journaled.errors import InvalidArgument, JournalClosed
from journaled.events.base import Event
from journaled.subscriptions import AsyncSubscription, StoredSubscription, Subscription
from journaled.testing import wait_for

SHARED = pytest.mark.parametrize("journal_url", ["sqlite", "postgresql"], indirect=True)
"""Backends several processes can share (an in-memory journal is one runtime's)."""
WAIT = 30.0
"""Longest a probe waits for a delivery or an end (never reached when things work)."""
PER_PROCESS = 15
"""Facts each appending process remembers."""

APPENDER = """
import sys, journaled
url, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with journaled.open(url) as rt:
    for i in range(n):
        rt.memory.remember(f"{tag} fact {i}", scope="user")
"""

CONSUMER = """
import json, sys, time
from pathlib import Path
import journaled
url, name, workdir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
seen = []
with journaled.open(url) as rt, rt.journal.subscribe(name=name) as sub:
    (workdir / f"ready-{sys.argv[4]}").write_text("")
    while True:
        event = sub.poll(0.2)
        if event is None:
            if (workdir / "stop").exists():
                break
            continue
        seen.append(event.position)
        sub.ack(event.position)
(workdir / f"seen-{sys.argv[4]}.json").write_text(json.dumps(seen))
"""


def _take(sub: Subscription, n: int) -> list[Event]:
    got: list[Event] = []
    while len(got) < n:
        event = sub.poll(WAIT)
        assert event is not None, f"only {len(got)} of {n} events were delivered"
        got.append(event)
    return got


def _waiting(rt: journaled.Runtime) -> bool:
    """Tell whether some subscription of this runtime waits for appends."""
    return bool(rt._journal._waiters)


def _threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


def _script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.fixture
def no_safety_net(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every wait last an hour unless woken: only a real wake-up can end it in time."""
    monkeypatch.setattr(subscriptions_module, "_SLICE", 3600.0)


@pytest.fixture
def three(journal_url: str) -> Iterator[journaled.Runtime]:
    """Yield a runtime whose journal holds three remembered facts (positions 1, 2, 3)."""
    with journaled.open(journal_url) as rt:
        for text in ("alpha", "beta", "gamma"):
            rt.memory.remember(f"the {text} service is up")
        yield rt


# -- other processes -----------------------------------------------------------------------------


@SHARED
def test_two_processes_appending_while_it_catches_up_lose_and_repeat_nothing(
    journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A3/J1/J3: while two other processes append at once, a subscription that starts in the
    middle, catching up one event per page, then following, delivers every event exactly once,
    in the journal's order: no event lost at the seam between catch-up and follow, none twice."""
    monkeypatch.setattr(subscriptions_module, "PAGE", 1)
    script = _script(tmp_path, "append.py", APPENDER)
    with journaled.open(journal_url) as rt:
        for i in range(3):
            rt.memory.remember(f"seed {i}")
        appenders = [
            subprocess.Popen([sys.executable, script, journal_url, tag, str(PER_PROCESS)])
            for tag in ("left", "right")
        ]
        try:
            wait_for(lambda: rt.journal.position() >= 6, timeout=WAIT)  # appends under way
            with rt.journal.subscribe() as sub:
                got: list[Event] = []
                total = 3 + 2 * PER_PROCESS
                while len(got) < total:
                    event = sub.poll(WAIT)
                    assert event is not None, f"{len(got)} of {total} delivered"
                    got.append(event)
                assert sub.poll(0.3) is None  # nothing more, in particular no repeat
            for proc in appenders:
                assert proc.wait(timeout=WAIT) == 0
        finally:
            for proc in appenders:
                if proc.poll() is None:
                    proc.kill()
        logged = [e.position for e in rt.journal.read()]
    positions = [e.position for e in got]
    assert positions == logged
    assert len(set(positions)) == len(positions)


@SHARED
def test_two_processes_sharing_a_name_each_get_every_event_and_it_never_moves_back(
    journal_url: str, tmp_path: Path
) -> None:
    """A3 (ADR 0026): two consumer processes using one subscription name at once each receive
    every event after where they started, in order, without repeats; their acks, racing in the
    journal's database, only ever move the stored position forward, to the last event."""
    script = _script(tmp_path, "consume.py", CONSUMER)
    with journaled.open(journal_url) as rt:
        rt.memory.remember("before the consumers")
        consumers = [
            subprocess.Popen([sys.executable, script, journal_url, "mailer", str(tmp_path), str(i)])
            for i in range(2)
        ]
        try:
            wait_for(
                lambda: all((tmp_path / f"ready-{i}").exists() for i in range(2)), timeout=WAIT
            )
            stored: list[int] = []
            for i in range(20):
                rt.memory.remember(f"mail {i}")
                stored.extend(s.position for s in rt.journal.subscriptions())
            head = rt.journal.position()
            wait_for(lambda: rt.journal.subscriptions()[0].position == head, timeout=WAIT)
            (tmp_path / "stop").write_text("")
            for proc in consumers:
                assert proc.wait(timeout=WAIT) == 0
        finally:
            for proc in consumers:
                if proc.poll() is None:
                    proc.kill()
        logged = [e.position for e in rt.journal.read()]
        assert rt.journal.subscriptions() == [StoredSubscription(name="mailer", position=head)]
    assert stored == sorted(stored)  # never moved back while both acknowledged
    for i in range(2):
        seen: list[int] = json.loads((tmp_path / f"seen-{i}.json").read_text())
        assert seen, f"consumer {i} received nothing"
        assert seen == logged[logged.index(seen[0]) :], f"consumer {i} lost or repeated events"


def test_a_name_used_twice_in_one_process_reports_the_stored_position(
    three: journaled.Runtime,
) -> None:
    """A3: two subscriptions of one name in one process: the one behind learns the stored
    position from its ack (``acked`` is the database's), and an ack behind it changes nothing."""
    ahead = three.journal.subscribe(name="twin")
    behind = three.journal.subscribe(name="twin")
    with ahead, behind:
        ahead.ack(_take(ahead, 3)[-1].position)
        first = _take(behind, 1)[0]
        behind.ack(first.position)
        assert behind.acked == 3
        behind.ack(_take(behind, 1)[0].position)  # position 2: behind the stored 3
        assert behind.acked == 3
    assert three.journal.subscriptions() == [StoredSubscription(name="twin", position=3)]


# -- acknowledgements ----------------------------------------------------------------------------


BAD_ACKS: list[tuple[object, str]] = [
    (-1, r"^position is -1, outside"),
    (True, r"^position must be an int, got bool"),
    (1.0, r"^position must be an int, got float"),
    (None, r"^position must be an int, got NoneType"),
    ("3", r"^position must be an int, got str"),
    (2**63, r"^position is 9223372036854775808, outside"),
    (4, r"^position 4 was never delivered"),
    (10**9, r"^position 1000000000 was never delivered"),
]


def test_an_ack_of_a_bad_position_is_refused_and_stores_nothing(three: journaled.Runtime) -> None:
    """A3: an ack that is negative, not an int (bool, float, None, str), beyond 64 bits, or
    past the last delivered event (beyond the head too) raises InvalidArgument naming it; the
    stored position stays where it was."""
    with three.journal.subscribe(name="strict") as sub:
        delivered = _take(sub, 3)
        sub.ack(delivered[0].position)
        for position, problem in BAD_ACKS:
            with pytest.raises(InvalidArgument, match=problem):
                sub.ack(position)  # type: ignore[arg-type]
        assert sub.acked == delivered[0].position
    assert three.journal.subscriptions() == [StoredSubscription(name="strict", position=1)]


def test_acks_out_of_order_of_skipped_positions_and_after_close(
    three: journaled.Runtime,
) -> None:
    """A3: ack(0) before any delivery and a backward ack are ignored; a position the topic
    filter skipped, below the last delivered, is acknowledged; an ack after ``sub.close()`` of a
    delivered event is stored (a consumer finishing its last event); after the runtime closed,
    an ack raises JournalClosed."""
    three.register_tool("echo", lambda x: x)
    run = three.execute(journaled.Plan(goal="g", steps=[journaled.Step("a", tool="echo")]))
    history = three.runs.history(run.run_id)
    finished = history[-1].position
    skipped = next(e.position for e in history if e.kind not in ("run.started", "run.finished"))
    with three.journal.subscribe(name="runs", topics=["run.started", "run.finished"]) as sub:
        sub.ack(0)
        assert sub.acked == 0
        started, ended = _take(sub, 2)
        assert ended.position == finished
        assert started.position < skipped < ended.position
        sub.ack(skipped)  # a step event, filtered out: never delivered, but before the last
        assert sub.acked == skipped
        sub.ack(started.position)  # backwards
        assert sub.acked == skipped
    assert sub.closed
    sub.ack(ended.position)
    assert three.journal.subscriptions() == [StoredSubscription(name="runs", position=finished)]
    late = three.journal.subscribe(name="late")
    delivered = _take(late, 1)[0]
    three.close()
    with pytest.raises(JournalClosed, match="closed"):
        late.ack(delivered.position)
    assert late.acked == 0


# -- odd subscribe arguments ---------------------------------------------------------------------


BAD_AFTERS: list[tuple[object, str]] = [
    (None, r"^after must be an int, got NoneType"),
    (True, r"^after must be an int, got bool"),
    (1.5, r"^after must be an int, got float"),
    ("3", r"^after must be an int, got str"),
    (-1, r"^after is -1, outside"),
    (2**63, r"^after is 9223372036854775808, outside"),
]


def test_a_bad_after_is_refused_and_stores_no_name(three: journaled.Runtime) -> None:
    """A3: ``after`` that is None, a bool, a float, a str, negative or beyond 64 bits raises
    InvalidArgument naming ``after``; a named subscription refused so is not stored."""
    for after, problem in BAD_AFTERS:
        with pytest.raises(InvalidArgument, match=problem):
            three.journal.subscribe(after=after, name="bad")  # type: ignore[arg-type]
    assert three.journal.subscriptions() == []


def test_after_the_head_delivers_only_what_comes_next(three: journaled.Runtime) -> None:
    """A3: ``after`` equal to the head delivers nothing of the past and the next append."""
    with three.journal.subscribe(after=three.journal.position()) as sub:
        assert sub.poll(0) is None
        fact = three.memory.remember("the first news")
        event = sub.poll(WAIT)
    assert event is not None
    assert event.stream == fact.id
    assert event.position == 4


TAG = "memory.fact-remembered"
TOPIC_SHAPES: list[tuple[object, tuple[str, ...]]] = [
    (TAG, (TAG,)),
    ([TAG], (TAG,)),
    ((TAG,), (TAG,)),
    ({TAG}, (TAG,)),
    (frozenset({TAG}), (TAG,)),
    ([TAG, TAG], (TAG, TAG)),
]


def test_topics_of_every_container_shape_select_the_same_events_once(
    three: journaled.Runtime,
) -> None:
    """A3: a single tag as a str, and a list, tuple, set or frozenset of tags (even one naming
    a tag twice) select exactly that tag's events, each delivered once; ``sub.topics`` tells
    the tags as given."""
    three.register_tool("echo", lambda x: x)
    three.execute(journaled.Plan(goal="g", steps=[journaled.Step("a", tool="echo")]))
    for topics, told in TOPIC_SHAPES:
        with three.journal.subscribe(topics=topics) as sub:  # type: ignore[arg-type]
            got = _take(sub, 3)
            assert sub.poll(0) is None, f"topics={topics!r} delivered more"
        assert [e.position for e in got] == [1, 2, 3], f"topics={topics!r}"
        assert sub.topics == told


BAD_TOPICS: list[tuple[object, str]] = [
    ("memory", r"^topics names an unknown event tag 'memory'"),
    ("memory.*", r"^topics names an unknown event tag 'memory\.\*'"),
    ("run.start", r"unknown event tag 'run\.start': did you mean 'run\.started'"),
    ("Memory.Fact-Remembered", r"unknown event tag 'Memory\.Fact-Remembered'"),
    ([], r"^topics is empty: pass None"),
    ((), r"^topics is empty: pass None"),
    (b"memory.fact-remembered", r"^topics must be a list of event tags, got bytes"),
    ({"memory.fact-remembered": 1}, r"^topics must be a list of event tags, got dict"),
    (5, r"^topics must be a list of event tags, got int"),
    ([None], r"^topics must hold event tags \(str\), got NoneType"),
    (["memory.fact-remembered", 3], r"^topics must hold event tags \(str\), got int"),
]


def test_odd_topics_are_refused_with_a_one_line_error(three: journaled.Runtime) -> None:
    """A3: topics match exact tags only: a prefix, a glob, a near miss (with its suggestion) or
    another case is an unknown tag; an empty, bytes, dict or int value, or a non-str inside,
    raises InvalidArgument naming ``topics``; a named subscription refused so is not stored."""
    for topics, problem in BAD_TOPICS:
        with pytest.raises(InvalidArgument, match=problem):
            three.journal.subscribe(topics=topics, name="picky")  # type: ignore[arg-type]
    assert three.journal.subscriptions() == []


# -- iterators abandoned, closed, outliving the runtime ------------------------------------------


def test_an_iterator_left_half_way_resumes_where_it_stopped(three: journaled.Runtime) -> None:
    """A3: breaking out of ``for event in sub`` neither closes the subscription nor loses the
    event after the break: iterating again carries on, in order, with live appends after."""
    with three.journal.subscribe() as sub:
        first: list[int] = []
        for event in sub:
            first.append(event.position)
            if len(first) == 2:
                break
        assert not sub.closed
        three.memory.remember("appended while nobody iterated")
        rest: list[int] = []
        for event in sub:
            rest.append(event.position)
            if len(rest) == 2:
                break
    assert first + rest == [1, 2, 3, 4]


def test_close_is_idempotent_and_final(three: journaled.Runtime) -> None:
    """A3: close twice is fine; a closed subscription delivers nothing more (buffered or new),
    at once (poll with no timeout does not wait), and its iterator is empty."""
    sub = three.journal.subscribe()
    assert _take(sub, 1)[0].position == 1  # positions 2 and 3 are buffered with the page
    sub.close()
    sub.close()
    three.memory.remember("after the close")
    started = time.monotonic()
    assert sub.poll(None) is None
    assert list(sub) == []
    assert time.monotonic() - started < 1.0
    assert sub.closed
    assert sub.position == 1


def test_poll_zero_delivers_what_is_already_there(three: journaled.Runtime) -> None:
    """A3: poll(0) reads the journal before giving up: it returns a past event at once, and
    None at once when nothing is left."""
    with three.journal.subscribe(after=2) as sub:
        event = sub.poll(0)
        started = time.monotonic()
        assert sub.poll(0) is None
        assert time.monotonic() - started < 0.5
    assert event is not None
    assert event.position == 3


@pytest.mark.usefixtures("no_safety_net")
def test_closing_the_runtime_ends_a_waiting_iterator_with_journal_closed(
    journal_url: str,
) -> None:
    """A3/R3: the runtime's close does not wait for a subscription waiting in another thread;
    that iterator ends promptly with JournalClosed (a clear error, not a hang or silence), and
    so does a later poll; closing the subscription afterwards is harmless, and the thread that
    watched the journal for other processes' appends is gone."""
    rt = journaled.open(journal_url)
    rt.memory.remember("before")
    sub = rt.journal.subscribe(after=rt.journal.position())
    outcome: list[object] = []

    def consume() -> None:
        try:
            outcome.extend(sub)
            outcome.append("ended")
        except Exception as exc:  # recorded for the assertion below
            outcome.append(exc)

    consumer = threading.Thread(target=consume)
    consumer.start()
    try:
        wait_for(lambda: _waiting(rt), timeout=WAIT)
        started = time.monotonic()
        rt.close()
        closed_in = time.monotonic() - started
        consumer.join(WAIT)
        assert not consumer.is_alive()
        assert closed_in < 5.0
        assert len(outcome) == 1
        assert isinstance(outcome[0], JournalClosed)
        assert "closed" in str(outcome[0])
        with pytest.raises(JournalClosed):
            sub.poll(0)
    finally:
        sub.close()
        rt.close()
        consumer.join(WAIT)
    assert sub.poll(0) is None  # closed by its consumer: closed wins over the journal's state
    wait_for(lambda: not _threads("journaled-append-watcher"), timeout=WAIT)


def _subscription_threads() -> list[threading.Thread]:
    return _threads("journaled-subscription")


@pytest.mark.usefixtures("no_safety_net")
def test_closing_the_async_runtime_ends_a_waiting_async_iterator(journal_url: str) -> None:
    """A1/A3: closing the asyncio runtime while ``async for`` waits ends that task promptly with
    JournalClosed; the close itself is not held up, and no subscription thread is left."""

    async def story() -> tuple[BaseException | None, float]:
        rt = await journaled.aio.open(journal_url)
        await rt.memory.remember("before")
        sub = await rt.journal.subscribe(after=await rt.journal.position())

        async def consume() -> list[Event]:
            return [event async for event in sub]

        task = asyncio.create_task(consume())
        while not _waiting(rt._sync):
            await asyncio.sleep(0.01)
        started = time.monotonic()
        await rt.close()
        closed_in = time.monotonic() - started
        done, _ = await asyncio.wait([task], timeout=WAIT)
        assert done, "the async iterator still waits after the runtime closed"
        return task.exception(), closed_in

    error, closed_in = asyncio.run(story())
    assert isinstance(error, JournalClosed)
    assert closed_in < 5.0
    wait_for(lambda: not _subscription_threads(), timeout=WAIT)


@pytest.mark.usefixtures("no_safety_net")
def test_an_async_iterator_closed_from_another_thread_ends(three: journaled.Runtime) -> None:
    """A3: ``aclose()`` run from a thread that is not the loop's ends an ``async for`` waiting
    on the loop (StopAsyncIteration: the loop ends empty), and its wait thread ends."""

    async def story() -> list[Event]:
        sub = await AsyncSubscription.open(three.journal, after=three.journal.position())

        async def consume() -> list[Event]:
            return [event async for event in sub]

        task = asyncio.create_task(consume())
        while not _waiting(three):
            await asyncio.sleep(0.01)
        closer = threading.Thread(target=asyncio.run, args=(sub.aclose(),))
        closer.start()
        got = await asyncio.wait_for(task, WAIT)
        closer.join(WAIT)
        return got

    assert asyncio.run(story()) == []
    wait_for(lambda: not _subscription_threads(), timeout=WAIT)


@pytest.mark.usefixtures("no_safety_net")
def test_cancelled_async_waits_leave_no_thread_and_lose_no_event(
    three: journaled.Runtime,
) -> None:
    """A1/A3: twenty waits cancelled one after another leave no wait thread behind, and the
    event appended after them is the next one delivered (a cancelled wait consumed nothing)."""

    async def story() -> Event | None:
        async with await AsyncSubscription.open(three.journal, after=3) as sub:
            for _ in range(20):
                waiting = asyncio.create_task(sub.poll(None))
                await asyncio.sleep(0.01)
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
            await asyncio.to_thread(three.memory.remember, "after the cancels")
            return await sub.poll(WAIT)

    event = asyncio.run(story())
    assert event is not None
    assert event.position == 4
    wait_for(lambda: not _subscription_threads(), timeout=WAIT)


def test_an_async_iterator_left_half_way_resumes_where_it_stopped(
    three: journaled.Runtime,
) -> None:
    """A3: breaking out of ``async for`` loses no event: the next ``async for`` carries on."""

    async def story() -> tuple[list[int], list[int]]:
        async with await AsyncSubscription.open(three.journal) as sub:
            first: list[int] = []
            async for event in sub:
                first.append(event.position)
                break
            rest: list[int] = []
            async for event in sub:
                rest.append(event.position)
                if len(rest) == 2:
                    break
            assert await sub.poll(0) is None
            return first, rest

    assert asyncio.run(story()) == ([1], [2, 3])
