"""Subscriptions and run handles at their edges (A1, A2, A3): two consumers of one
subscription, poll timeouts on the asyncio side, topics given once, a start past the head, an
async handle of a finished run, async and self-waiting on_progress callbacks, bad timeouts.

Every wait is bounded, so a test that would hang fails instead.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import journaled
import journaled.aio
from journaled import Plan, Step
from journaled.errors import InvalidArgument
from journaled.subscriptions import AsyncSubscription

WAIT = 10.0
TRIALS = 300
"""Attempts at the two-consumer race (it showed in about 1 of 60 on a 2-core machine)."""


@pytest.fixture
def three(journal_url: str) -> Iterator[journaled.Runtime]:
    """Yield a runtime whose journal holds three remembered facts (positions 1, 2, 3)."""
    with journaled.open(journal_url) as rt:
        for text in ("alpha", "beta", "gamma"):
            rt.memory.remember(f"the {text} service is up")
        yield rt


def test_two_threads_iterating_one_subscription_never_end_before_it_is_closed() -> None:
    """A3: a ``for`` loop over a subscription ends only once the subscription is closed."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over often: the race shows within a few trials
    try:
        with journaled.open("memory://") as rt:
            for i in range(30):
                rt.memory.remember(f"fact {i}")
            for trial in range(TRIALS):
                sub = rt.journal.subscribe(topics=["memory.fact-remembered"])
                ended = threading.Event()

                def consume(sub: Any = sub, ended: threading.Event = ended) -> None:
                    for _ in sub:
                        pass
                    if not sub.closed:
                        ended.set()

                consumers = [threading.Thread(target=consume) for _ in range(2)]
                for t in consumers:
                    t.start()
                time.sleep(0.02)  # both drain the 30 events, then wait for more
                sub.close()
                for t in consumers:
                    t.join(WAIT)
                assert not any(t.is_alive() for t in consumers)
                assert not ended.is_set(), f"a for loop ended before close (trial {trial})"
    finally:
        sys.setswitchinterval(previous)


def test_async_poll_checks_its_timeout_like_poll(three: journaled.Runtime) -> None:
    """A3: ``await sub.poll(t)`` refuses a negative, NaN or non-number ``t`` at once."""

    async def story() -> list[str]:
        wrong: list[str] = []
        async with await AsyncSubscription.open(three.journal, after=3) as sub:
            for timeout in (-1, float("nan"), "1"):
                try:
                    got = await asyncio.wait_for(sub.poll(timeout), 3.0)  # type: ignore[arg-type]
                except InvalidArgument as exc:
                    if not str(exc).startswith("timeout "):
                        wrong.append(f"{timeout!r}: {exc}")
                except TimeoutError:
                    wrong.append(f"{timeout!r}: still waiting after 3 s")
                except Exception as exc:  # any other error is the defect
                    wrong.append(f"{timeout!r}: {type(exc).__name__}: {exc}")
                else:
                    wrong.append(f"{timeout!r}: returned {got!r}")
        return wrong

    assert asyncio.run(story()) == []


def test_topics_given_as_a_generator_are_told_by_sub_topics(three: journaled.Runtime) -> None:
    """A3: ``sub.topics`` names the tags given, whatever iterable they came in."""
    tags = (t for t in ["memory.fact-remembered"])
    with three.journal.subscribe(topics=tags) as sub:
        assert sub.poll(WAIT) is not None  # the filter itself works
        assert sub.topics == ("memory.fact-remembered",)


def test_an_after_past_the_head_is_refused(three: journaled.Runtime) -> None:
    """A3: ``after`` past the last position is refused and stores no name."""
    head = three.journal.position()
    with pytest.raises(InvalidArgument, match=r"^after "):
        three.journal.subscribe(after=head + 100, name="typo")
    assert three.journal.subscriptions() == []


def test_an_async_handle_result_zero_returns_a_finished_run(sqlite_url: str) -> None:
    """A2: ``await handle.result(0)`` returns the result of a run that has finished."""

    async def story() -> journaled.ExecuteResult:
        async with journaled.aio.open(sqlite_url) as rt:
            rt.register_tool("echo", lambda x: x)
            handle = await rt.start(Plan(goal="g", steps=[Step("a", tool="echo", input=1)]))
            await handle
            assert handle.done()
            return await handle.result(0)

    assert asyncio.run(story()).ok


def test_an_async_on_progress_is_run_or_refused(sqlite_url: str) -> None:
    """A1/E12: an ``async def`` on_progress is awaited at each point, or refused by start."""
    seen: list[str] = []

    async def progress(at: str, delta: list[Any], calls: int, waiting: list[str]) -> None:
        seen.append(at)

    async def story() -> str:
        async with journaled.aio.open(sqlite_url) as rt:
            rt.register_tool("echo", lambda x: x)
            plan = Plan(goal="g", steps=[Step("a", tool="echo", input=1)])
            try:
                handle = await rt.start(plan, on_progress=progress)
            except ValueError as exc:
                return f"refused: {exc}"
            await handle
            return "ran"

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        outcome = asyncio.run(story())
    assert outcome.startswith("refused: on_progress") or seen[-1:] == ["plan-end"], outcome


def test_waiting_for_its_own_run_from_on_progress_is_refused() -> None:
    """A2: ``handle.result()`` from the run's own on_progress raises RuntimeError at once."""
    box: dict[str, Any] = {}
    outcome: list[str] = []

    def progress(at: str, delta: list[Any], calls: int, waiting: list[str]) -> None:
        handle = box.get("handle")
        if handle is None or outcome:
            return
        began = time.monotonic()
        try:
            handle.result(timeout=1.0)
            outcome.append("returned")
        except RuntimeError:
            outcome.append(f"refused in {time.monotonic() - began:.2f} s")
        except TimeoutError:
            outcome.append("deadlocked until the timeout")

    with journaled.open("memory://") as rt:
        gate = threading.Event()
        rt.register_tool("gate", lambda x: gate.wait(WAIT) and x)
        rt.register_tool("echo", lambda x: x)
        plan = Plan(
            goal="g",
            steps=[Step("a", tool="gate", input=1), Step("b", tool="echo", depends_on=["a"])],
        )
        box["handle"] = handle = rt.start(plan, on_progress=progress)
        gate.set()
        assert handle.result(WAIT).ok
    assert outcome, "on_progress never waited"
    assert outcome[0].startswith("refused"), outcome


def test_a_handle_refuses_a_timeout_that_is_no_number() -> None:
    """A2: ``handle.result(timeout="soon")`` raises an error naming ``timeout``."""
    with journaled.open("memory://") as rt:
        release = threading.Event()
        rt.register_tool("gate", lambda x: release.wait(WAIT) and x)
        handle = rt.start(Plan(goal="g", steps=[Step("a", tool="gate", input=1)]))
        try:
            with pytest.raises(ValueError, match=r"^timeout "):
                handle.result(timeout="soon")  # type: ignore[arg-type]
        finally:
            release.set()
            handle.result(WAIT)


def test_a_follower_whose_page_reads_fail_reads_again_and_says_so_once(
    sqlite_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A3, ADR 0026 update: page reads that fail on a dropped connection (a server restart)
    are read again from the same cursor, nothing skipped, and the outage is logged once (not
    taken silently for a quiet journal), however many reads it fails."""
    from eventsourcing.persistence import OperationalError

    from journaled.subscriptions import Subscription

    with journaled.open(sqlite_url) as rt:
        first = rt.memory.remember("first fact")
        sub = rt.journal.subscribe(topics=["memory.fact-remembered"])
        real = Subscription._fill
        failures = iter(range(3))

        def flaky(self: Subscription) -> bool:
            if next(failures, None) is not None:
                raise OperationalError("terminating connection due to administrator command")
            return real(self)

        monkeypatch.setattr(Subscription, "_fill", flaky)
        with caplog.at_level("WARNING", logger="journaled.subscriptions"):
            got = sub.poll(timeout=5.0)
        assert got is not None
        assert getattr(got.data, "fact_id", None) == first.id
        unreachable = [r for r in caplog.records if "journal unreachable" in r.getMessage()]
        assert len(unreachable) == 1, caplog.records
        sub.close()


def _subscription_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "journaled-subscription"]


def test_cancelling_one_async_poll_never_ends_another_consumers_async_for(
    sqlite_url: str,
) -> None:
    """A3, ADR 0026 update: a task's ``await sub.poll()`` cancelled ends that wait alone:
    another task's ``async for`` over the same subscription goes on and receives the next
    append; the cancelled wait's thread ends though the other consumer's wait holds the
    subscription."""

    async def story() -> tuple[bool, list[int], int]:
        async with journaled.aio.open(sqlite_url) as rt:
            await rt.memory.remember("fact one")
            sub = await rt.journal.subscribe(topics="memory.fact-remembered")
            got: list[int] = []

            async def consume() -> None:
                async for event in sub:
                    got.append(event.position)  # noqa: PERF401 - seen one by one, while it waits

            consumer = asyncio.create_task(consume())
            while not got or not rt._sync._journal._waiters:
                await asyncio.sleep(0.01)
            given_up = asyncio.create_task(sub.poll(None))
            while len(_subscription_threads()) < 2:
                await asyncio.sleep(0.01)
            given_up.cancel()
            with pytest.raises(asyncio.CancelledError):
                await given_up
            deadline = time.monotonic() + WAIT
            while len(_subscription_threads()) > 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            lingering = len(_subscription_threads()) - 1
            await asyncio.sleep(0.2)  # a loop ended by the cancel would have ended by now
            ended_early = consumer.done()
            await rt.memory.remember("fact two")
            while len(got) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await sub.aclose()
            await asyncio.wait_for(consumer, WAIT)
            return ended_early, got, lingering

    ended_early, got, lingering = asyncio.run(asyncio.wait_for(story(), 4 * WAIT))
    assert not ended_early, "the async for ended though the subscription was open"
    assert len(got) == 2, got
    assert lingering == 0, "the cancelled wait's thread still waits"


def test_cancelling_an_async_poll_never_ends_a_threads_for_loop(sqlite_url: str) -> None:
    """A3, ADR 0026 update: a cancelled ``await sub.poll()`` does not end a ``for`` loop over
    the same subscription in another thread; the loop ends when the subscription is closed."""
    with journaled.open(sqlite_url) as rt:
        rt.memory.remember("fact one")
        asub = AsyncSubscription(rt.journal, topics="memory.fact-remembered")
        sync = asub._sync
        seen: list[int] = []
        ended_open = threading.Event()

        def consume() -> None:
            seen.extend(event.position for event in sync)
            if not sync.closed:
                ended_open.set()

        consumer = threading.Thread(target=consume)
        consumer.start()
        try:

            async def cancel_a_poll() -> None:
                while not seen or not rt._journal._waiters:
                    await asyncio.sleep(0.01)
                task = asyncio.create_task(asub.poll(None))
                await asyncio.sleep(0.1)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await asyncio.sleep(0.2)

            asyncio.run(asyncio.wait_for(cancel_a_poll(), WAIT))
            assert not ended_open.is_set(), "the for loop ended though nobody closed it"
            rt.memory.remember("fact two")
            wait_until = time.monotonic() + WAIT
            while len(seen) < 2 and time.monotonic() < wait_until:
                time.sleep(0.01)
            assert len(seen) == 2, seen
        finally:
            sync.close()
            consumer.join(WAIT)
        assert not consumer.is_alive()
        assert not ended_open.is_set()


def test_an_async_subscription_of_a_sync_runtime_never_uses_the_default_executor(
    three: journaled.Runtime,
) -> None:
    """A3, ADR 0025 update: ``AsyncSubscription.open(rt.journal, name=...)`` and its ``await
    ack()`` read and write on threads of their own: both complete while the application's
    blocking work holds the loop's default executor."""
    from concurrent.futures import ThreadPoolExecutor

    release = threading.Event()

    async def story() -> int:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))  # the application sizes its own
        busy = loop.run_in_executor(None, release.wait, WAIT)  # and fills it
        try:
            opening = AsyncSubscription.open(three.journal, name="consumer")
            async with await asyncio.wait_for(opening, WAIT / 2) as sub:
                event = await sub.poll(WAIT)
                assert event is not None
                await asyncio.wait_for(sub.ack(event.position), WAIT / 2)
                return event.position
        finally:
            release.set()
            await busy

    position = asyncio.run(asyncio.wait_for(story(), 3 * WAIT))
    assert [(s.name, s.position) for s in three.journal.subscriptions()] == [("consumer", position)]
