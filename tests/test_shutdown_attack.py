"""Shutdown and cancellation in the middle of an operation (SPEC R3, R4, E5, A1-A3).

A close from another thread, an asyncio task cancelled or timed out, an event loop ending: while
a read, a resume, a cancel at rest, a remember, a semantic search or a run is in flight. Probes
that hold are plain tests; each that shows a defect is a strict xfail whose reason says what.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections import Counter
from typing import Any

import pytest
from crash import run_script

import journaled
import journaled.aio
from journaled import AgentResult, NeedsInput, Plan, Step
from journaled.errors import JournalClosed
from journaled.events.run_state import RunFold
from journaled.runtime import verify
from journaled.testing import LoopLag, wait_for

WAIT = 10.0
"""Longest a probe waits for anything (never reached when things work)."""
CLEAR = (JournalClosed, journaled.RuntimeClosed)
"""The errors a caller caught by a close may get: they say the runtime or journal closed."""


def _child(script: str, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return run_script(script, *args, timeout=timeout)


def _tools_run(url: str, steps: int = 30) -> str:
    """Journal one completed run of ``steps`` tool steps; return its id."""
    with journaled.open(url) as rt:
        rt.register_tool("t", lambda x: x)
        plan = Plan(goal="g", steps=[Step(f"s{i}", tool="t", input=i) for i in range(steps)])
        return rt.execute(plan).run_id


def _asker(step: Step, ctx: Any) -> AgentResult:
    if ctx.answer is None:
        raise NeedsInput(f"what for {step.id}?")
    return AgentResult(output=f"{step.id}: {ctx.answer}")


def _waiting_run(url: str) -> str:
    """Journal a run whose step 'a' waits for an answer and 'b' (after it) is pending."""
    with journaled.open(url) as rt:
        rt.register_agent("asker", _asker)
        plan = Plan(
            goal="g",
            steps=[Step("a", agent="asker"), Step("b", agent="asker", depends_on=["a"])],
        )
        result = rt.execute(plan)
        assert result.waiting == ["a"]
        return result.run_id


def _close_after_reopen(rt: journaled.Runtime) -> list[threading.Thread]:
    """Make the runtime's next take-up of a run (``_reopen``: a resume, a cancel at rest) start
    ``rt.close()`` in another thread right after the run's state was read, and go on only once
    the close has begun: the close lands in the middle of the operation."""
    closers: list[threading.Thread] = []
    original = rt.runs._reopen

    def reopen(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        closer = threading.Thread(target=rt.close)
        closer.start()
        closers.append(closer)
        wait_for(lambda: rt.runs.closing, timeout=WAIT)
        return out

    rt.runs._reopen = reopen  # type: ignore[method-assign]
    return closers


# -- a close racing reads ------------------------------------------------------------------------

READS_RACING_CLOSE = """
import json, sys, threading, time
import journaled
from journaled.errors import JournalClosed
url, run_id = sys.argv[1], sys.argv[2]
errors = {}
for _ in range(20):
    rt = journaled.open(url)
    going = threading.Event()

    def reader():
        going.set()
        try:
            while True:
                rt.journal.position()
                rt.runs.summary(run_id)
                rt.runs.history(run_id)
        except Exception as exc:
            name = f"{type(exc).__module__}.{type(exc).__name__}"
            errors[name] = errors.get(name, 0) + 1

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    going.wait(10)
    time.sleep(0.01)
    rt.close()
    thread.join(10)
    assert not thread.is_alive(), "a read still runs after close"
print(json.dumps(errors))
"""


def test_reads_racing_a_close_end_with_journal_closed_not_a_crash(sqlite_url: str) -> None:
    """R3/A1: a read in flight when another thread closes the runtime ends with JournalClosed
    (or RuntimeClosed); the process lives on (20 closes, each racing a reading thread)."""
    run_id = _tools_run(sqlite_url)
    done = _child(READS_RACING_CLOSE, sqlite_url, run_id)
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    clear = {"journaled.events.errors.JournalClosed", "journaled.actors.errors.RuntimeClosed"}
    assert set(errors) <= clear, errors


def test_reads_racing_a_close_on_postgresql_raise_journal_closed(pg_url: str) -> None:
    """R3: on PostgreSQL a read or a fork caught by a close from another thread raises
    JournalClosed or RuntimeClosed, never a driver's or library's error; verify stays ok."""
    run_id = _tools_run(pg_url, steps=10)
    seen: Counter[str] = Counter()
    odd: list[BaseException] = []
    deadline = time.monotonic() + 7.0
    attempts = 0
    while attempts < 25 and time.monotonic() < deadline and not odd:
        attempts += 1
        rt = journaled.open(pg_url)
        going = threading.Event()

        def reader(rt: journaled.Runtime = rt, going: threading.Event = going) -> None:
            going.set()
            try:
                while True:
                    rt.runs.summary(run_id)
                    rt.runs.history(run_id)
                    rt.journal.position()
                    rt.runs.fork(run_id)
            except Exception as exc:  # recorded for the assertion
                seen[type(exc).__name__] += 1
                if not isinstance(exc, CLEAR):
                    odd.append(exc)

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        assert going.wait(WAIT)
        time.sleep(0.02)
        rt.close()
        thread.join(WAIT)
        assert not thread.is_alive(), "a read still runs after close"
    assert verify(pg_url).ok
    assert not odd, f"{seen}: first odd error {type(odd[0]).__module__}.{odd[0]!r}"
    assert sum(seen.values()) == attempts


# -- the event loop ending -----------------------------------------------------------------------

LOOP_ENDS_MID_STEP = """
import asyncio, sys
import journaled, journaled.aio
from journaled import Plan, Step
url = sys.argv[1]

async def slow(x):
    await asyncio.sleep(2.0)
    return "done"

async def main():
    rt = await journaled.aio.open(url)  # never closed: the program ends with the run in flight
    rt.register_tool("slow", slow)
    handle = await rt.start(Plan(goal="g", steps=[Step("a", tool="slow", input=1)]))
    print(handle.run_id, flush=True)
    await asyncio.sleep(0.3)

asyncio.run(main())
"""


def test_the_event_loop_ending_mid_step_is_no_cancel_and_the_run_resumes(
    sqlite_url: str,
) -> None:
    """R3/A1: a program whose asyncio.run ends without closing its aio runtime while an async
    step runs neither fails nor cancels the run: it is suspended and resumes in a new runtime."""
    done = _child(LOOP_ENDS_MID_STEP, sqlite_url)
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = done.stdout.split()[0]
    with journaled.open(sqlite_url) as rt:
        ran: list[object] = []

        async def slow(x: object) -> str:
            ran.append(x)
            return "done"

        rt.register_tool("slow", slow)
        status = rt.runs.summary(run_id).status
        observations = rt.runs.current(run_id).observations
        assert status == "suspended", f"{status}: {observations}"
        result = rt.resume(run_id)
        assert isinstance(result, journaled.ExecuteResult)
        assert result.ok
        assert ran == [1]


LOOP_ENDS_BEFORE_AN_ASYNC_STEP = """
import asyncio, sys, time
import journaled, journaled.aio
from journaled import Plan, Step
url = sys.argv[1]

def slow(x):
    time.sleep(0.5)
    return x

async def fast(x):
    return "fast"

async def main():
    rt = await journaled.aio.open(url)  # never closed: the loop ends while 'a' runs
    rt.register_tool("slow", slow)
    rt.register_tool("fast", fast)
    plan = Plan(
        goal="g",
        steps=[Step("a", tool="slow", input=1), Step("b", tool="fast", input=2, depends_on=["a"])],
    )
    handle = await rt.start(plan)
    print(handle.run_id, flush=True)
    await asyncio.sleep(0.1)

asyncio.run(main())
time.sleep(1.5)  # 'a' ends, and 'b' comes due, after the loop closed
"""


def test_an_async_step_due_after_the_event_loop_ended_is_suspended_not_failed(
    sqlite_url: str,
) -> None:
    """R3/A1 (ADR 0025): an async step whose turn comes after its program's asyncio.run
    returned never ran: it is not journaled as failed ('Event loop is closed'), no coroutine is
    left never awaited, and the run is suspended and resumes in a new runtime."""
    done = _child(LOOP_ENDS_BEFORE_AN_ASYNC_STEP, sqlite_url)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "never awaited" not in done.stderr, done.stderr[-3000:]
    run_id = done.stdout.split()[0]
    with journaled.open(sqlite_url) as rt:
        ran: list[object] = []

        async def fast(x: object) -> str:
            ran.append(x)
            return "fast"

        rt.register_tool("slow", lambda x: x)
        rt.register_tool("fast", fast)
        observations = rt.runs.current(run_id).observations
        assert [o.step_id for o in observations if not o.ok] == [], observations
        assert rt.runs.summary(run_id).status == "suspended", observations
        result = rt.resume(run_id)
        assert isinstance(result, journaled.ExecuteResult)
        assert result.ok
        assert ran == [2]


def test_cancelling_the_task_awaiting_execute_leaves_the_run_running(sqlite_url: str) -> None:
    """A1/A2/R3: cancelling the task that awaits ``rt.execute`` stops the wait only: the run
    goes on to completed, its step ran once, and the journal verifies."""
    ran: Counter[object] = Counter()

    async def slow(x: object) -> str:
        ran[x] += 1
        await asyncio.sleep(0.3)
        return "done"

    async def story() -> str:
        async with journaled.aio.open(sqlite_url) as rt:
            rt.register_tool("slow", slow)
            plan = Plan(goal="g", steps=[Step("a", tool="slow", input="x")])
            task = asyncio.create_task(rt.execute(plan))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            active = await rt.runs.active()
            assert len(active) == 1
            assert await rt.runs.wait_idle(WAIT) == []
            return active[0]

    run_id = asyncio.run(story())
    with journaled.open(sqlite_url) as rt:
        assert rt.runs.summary(run_id).status == "completed"
    assert ran == {"x": 1}
    assert verify(sqlite_url).ok


def test_a_timeout_around_async_with_drains_the_run_it_started(sqlite_url: str) -> None:
    """R3/A1: ``asyncio.wait_for`` timing out the body of ``async with journaled.aio.open``
    cancels the body, not the run: leaving ``async with`` drains it to completed, once."""
    ran: Counter[object] = Counter()
    ids: list[str] = []

    async def slow(x: object) -> str:
        ran[x] += 1
        await asyncio.sleep(0.4)
        return "done"

    async def body() -> None:
        async with journaled.aio.open(sqlite_url) as rt:
            rt.register_tool("slow", slow)
            handle = await rt.start(Plan(goal="g", steps=[Step("a", tool="slow", input="x")]))
            ids.append(handle.run_id)
            await handle

    async def story() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(body(), 0.15)

    asyncio.run(story())
    with journaled.open(sqlite_url) as rt:
        assert rt.runs.summary(ids[0]).status == "completed"
        assert rt.runs.current(ids[0]).observations[0].output == "done"
    assert ran == {"x": 1}


def test_the_async_close_drains_steps_without_blocking_the_loop(sqlite_url: str) -> None:
    """A1/R3: awaiting the aio runtime's close while four blocking steps drain keeps the loop
    free (lag probe under 50 ms) and the drained run completes, every step once."""
    ran: Counter[object] = Counter()

    def blocking(x: object) -> object:
        ran[x] += 1
        time.sleep(0.3)
        return x

    async def story() -> tuple[str, float]:
        async with journaled.aio.open(sqlite_url) as rt, LoopLag() as lag:
            rt.register_tool("b", blocking)
            plan = Plan(goal="g", steps=[Step(f"s{i}", tool="b", input=i) for i in range(4)])
            handle = await rt.start(plan, max_parallel_steps=4)
            await asyncio.sleep(0.1)
            await rt.close()
            assert handle.done()
        return handle.run_id, lag.max

    run_id, lag = asyncio.run(story())
    assert lag < 0.05
    with journaled.open(sqlite_url) as rt:
        assert rt.runs.summary(run_id).status == "completed"
    assert ran == {0: 1, 1: 1, 2: 1, 3: 1}


def test_a_cancelled_remember_leaves_one_current_fact_per_key(sqlite_url: str) -> None:
    """A1/M3/R3: tasks awaiting ``remember(conflict_key=...)`` cancelled at once leave memory
    whole: every fact stored is whole, one per key is current, a later remember supersedes it,
    and a new runtime (and verify) read the same."""

    async def story() -> list[str]:
        async with journaled.aio.open(sqlite_url) as rt:
            tasks = [
                asyncio.create_task(rt.memory.remember(f"region is r{i}", conflict_key="region"))
                for i in range(10)
            ]
            await asyncio.sleep(0)
            for task in tasks[::2]:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            last = await rt.memory.remember("region is final", conflict_key="region")
            stored = await rt.memory.all()
            # A cancelled wait is not a cancelled write: the fact may be stored, whole.
            assert {f.text for f in stored} <= {f"region is r{i}" for i in range(10)} | {last.text}
            current = [f.text for f in stored if f.superseded_by is None]
            assert current == [last.text]
            return current

    current = asyncio.run(story())
    with journaled.open(sqlite_url) as rt:
        assert [f.text for f in rt.memory.all() if f.superseded_by is None] == current
        hits = rt.memory.search("region")
        assert [f.text for f in hits] == ["region is final"]
    assert verify(sqlite_url).ok


# -- a close in the middle of taking a run up ----------------------------------------------------


def test_a_close_in_the_middle_of_a_cancel_at_rest_still_cancels_it(sqlite_url: str) -> None:
    """E5/R3: a close landing after ``rt.cancel`` read a waiting run's state (before its
    executor began) still ends the run cancelled, answers True, and nothing of it runs."""
    run_id = _waiting_run(sqlite_url)
    rt = journaled.open(sqlite_url)
    ran: list[str] = []

    def counting(step: Step, ctx: Any) -> AgentResult:
        ran.append(step.id)
        return _asker(step, ctx)

    rt.register_agent("asker", counting)
    closers = _close_after_reopen(rt)
    try:
        assert rt.cancel(run_id) is True
    finally:
        for closer in closers:
            closer.join(WAIT)
        rt.close()
    assert len(closers) == 1
    assert not closers[0].is_alive()
    assert ran == []
    with journaled.open(sqlite_url) as again:
        assert again.runs.summary(run_id).status == "cancelled"
    assert verify(sqlite_url).ok


def test_a_close_in_the_middle_of_a_resume_suspends_it_and_it_resumes(sqlite_url: str) -> None:
    """R3/E14: a close landing after ``rt.resume`` journaled the answer (before the executor
    began) suspends the run; a new runtime finishes it with the answer given, each step once."""
    run_id = _waiting_run(sqlite_url)
    ran: Counter[str] = Counter()

    def counting(step: Step, ctx: Any) -> AgentResult:
        ran[step.id] += 1
        return _asker(step, ctx)

    rt = journaled.open(sqlite_url)
    rt.register_agent("asker", counting)
    closers = _close_after_reopen(rt)
    try:
        result = rt.resume(run_id, answers={"a": "yes"})
    finally:
        for closer in closers:
            closer.join(WAIT)
        rt.close()
    assert isinstance(result, journaled.ExecuteResult)
    assert result.suspended
    assert not result.ok
    assert not ran
    with journaled.open(sqlite_url) as again:
        again.register_agent("asker", counting)
        assert again.runs.summary(run_id).status == "suspended"
        carried = again.resume(run_id)
        assert isinstance(carried, journaled.ExecuteResult)
        assert carried.waiting == ["b"]
        finished = again.resume(run_id, answers={"b": "ok"})
        assert isinstance(finished, journaled.ExecuteResult)
        assert finished.ok
        state: RunFold = again.runs.state(run_id)
        assert state.run_status == "completed"
    assert ran == {"a": 1, "b": 2}  # 'b' asked once, then answered (E10)
    assert verify(sqlite_url).ok


# -- a close while a semantic search waits for its embedder ----------------------------------------


class _Stuck:
    """An embedder that answers only once released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def embed(self, texts: list[str]) -> list[list[float]]:
        self.entered.set()
        self.release.wait(WAIT * 3)
        return [[1.0, 0.0] for _ in texts]


def test_close_releases_a_semantic_search_waiting_for_its_embedder(sqlite_url: str) -> None:
    """R3/M7: a search_semantic waiting for a slow embedder when another thread closes the
    runtime is released within 2 s of the close with RuntimeClosed (its bound here is 5 s)."""
    embedder = _Stuck()
    rt = journaled.open(sqlite_url, embedder=embedder, embed_timeout=5)
    rt.memory.remember("staging is in eu-west-1")
    out: list[object] = []
    ended = threading.Event()

    def search() -> None:
        try:
            out.append(rt.memory.search_semantic("staging"))
        except Exception as exc:  # recorded for the assertion
            out.append(exc)
        ended.set()

    searcher = threading.Thread(target=search)
    searcher.start()
    try:
        assert embedder.entered.wait(WAIT)
        rt.close()
        released = ended.wait(2.0)
    finally:
        embedder.release.set()
        searcher.join(WAIT)
        rt.close()
    assert released, "the search still waited 2 s after close returned"
    assert len(out) == 1
    assert isinstance(out[0], journaled.RuntimeClosed)


# -- what a racing close leaves in the journal ---------------------------------------------------


def _statuses(url: str) -> dict[str, str]:
    with journaled.open(url) as rt:
        return {str(r): r.status for r in rt.runs.list()}


def test_a_close_racing_reads_on_postgresql_leaves_no_run_behind(pg_url: str) -> None:
    """R3/R7: closes racing summaries and forks on PostgreSQL leave every run completed or
    forked (none running), the journal verifying and no actor running."""
    run_id = _tools_run(pg_url, steps=5)
    for _ in range(3):
        rt = journaled.open(pg_url)
        stop = threading.Event()

        def forker(rt: journaled.Runtime = rt, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                try:
                    rt.runs.fork(run_id)
                except Exception:  # any error ends the loop; checked below
                    return

        thread = threading.Thread(target=forker, daemon=True)
        thread.start()
        time.sleep(0.05)
        rt.close()
        stop.set()
        thread.join(WAIT)
        assert not thread.is_alive()
    statuses = _statuses(pg_url)
    assert statuses[run_id] == "completed"
    assert set(statuses.values()) <= {"completed", "forked"}
    assert verify(pg_url).ok


# -- the asyncio runtime's close and its pool ----------------------------------------------------


def test_the_async_close_is_bounded_by_its_drain_with_the_pool_busy(sqlite_url: str) -> None:
    """R3/A1: ``await rt.close(drain=0.5)`` on the aio runtime returns within a few seconds
    even while every worker of its pool is busy in a slow call (two semantic searches)."""
    embedder = _Stuck()

    async def story() -> float:
        rt = await journaled.aio.open(sqlite_url, embedder=embedder, embed_timeout=5, workers=2)
        try:
            await rt.memory.remember("staging is in eu-west-1")
            searches = [asyncio.create_task(rt.memory.search_semantic("staging")) for _ in "ab"]
            assert await asyncio.to_thread(embedder.entered.wait, WAIT)
            await asyncio.sleep(0.2)  # both workers are in a search now
            started = time.monotonic()
            await rt.close(drain=0.5)
            took = time.monotonic() - started
            await asyncio.gather(*searches, return_exceptions=True)
            return took
        finally:
            embedder.release.set()
            await rt.close()

    took = asyncio.run(story())
    assert took < 3.0, f"close(drain=0.5) took {took:.1f} s"


def test_a_named_async_subscription_left_by_asyncio_run_keeps_its_ack(sqlite_url: str) -> None:
    """A3/R3: ``asyncio.run`` ending while a task iterates a named subscription (the aio
    runtime left open) leaves no subscription thread, the acknowledged position stored, and a
    restarted consumer gets the next event after it."""
    held: list[journaled.aio.AsyncRuntime] = []
    got: list[int] = []

    async def story() -> None:
        rt = await journaled.aio.open(sqlite_url)
        held.append(rt)
        await rt.memory.remember("one")
        sub = await rt.journal.subscribe(name="billing")

        async def consume() -> None:
            async for event in sub:
                got.append(event.position)
                await sub.ack(event.position)

        consumer = asyncio.create_task(consume())
        await asyncio.sleep(0.3)
        assert not consumer.done()

    asyncio.run(story())
    rt = held[0]._sync
    try:
        wait_for(
            lambda: not any(t.name == "journaled-subscription" for t in threading.enumerate()),
            timeout=WAIT,
        )
        two = rt.memory.remember("two")
    finally:
        rt.close()
    assert got == [1]
    with journaled.open(sqlite_url) as again:
        assert [(s.name, s.position) for s in again.journal.subscriptions()] == [("billing", 1)]
        with again.journal.subscribe(name="billing") as sub:
            event = sub.poll(WAIT)
    assert event is not None
    assert event.position == 2
    assert getattr(event.data, "fact_id", None) == two.id


def test_a_close_does_not_wait_out_the_followers_poll(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R3, T4: the thread that follows other processes' appends waits on the close itself, so a
    close returns at once instead of after the follower's current wait (every command-line call
    paid about 0.2 s for it). Here a wait would last 30 s."""
    import journaled.actors.runtime as memory_runtime

    monkeypatch.setattr(memory_runtime, "_WAIT_SLICE", 30.0)
    rt = journaled.open(sqlite_url, follow=60.0)
    try:
        rt.memory.remember("a fact, so that the follower has something to follow")
        time.sleep(0.2)  # the follower is in its wait
    finally:
        began = time.monotonic()
        rt.close()
        took = time.monotonic() - began
    assert took < 5.0, f"close took {took:.1f} s"
    assert not [t for t in threading.enumerate() if t.name == "journaled-follower"]
