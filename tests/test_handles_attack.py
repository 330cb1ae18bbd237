"""Run handles under attack: many threads, closed runtimes, odd waits and callbacks (A1, A2).

Every probe here holds: each asserts the specific behaviour SPEC A2 (with A1 for the asyncio
handle, E5 for cancel, E11/E12 for progress and R3 for close) asks of a ``RunHandle``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import journaled
import journaled.aio
from journaled import Plan, Step
from journaled.errors import JournalClosed
from journaled.testing import wait_for

SHARED = pytest.mark.parametrize("journal_url", ["sqlite", "postgresql"], indirect=True)
"""Backends a second runtime can reopen (an in-memory journal is gone once closed)."""
WAIT = 10.0
"""Longest a probe waits for a run (never reached when things work)."""
THREADS = 16


def _gate(rt: journaled.Runtime) -> tuple[threading.Event, threading.Event]:
    """Register a tool ``gate`` that says it started and waits for a release; return both."""
    started, release = threading.Event(), threading.Event()

    def gate(x: Any) -> Any:
        started.set()
        release.wait(WAIT)
        return x

    rt.register_tool("gate", gate)
    return started, release


def _gated_plan() -> Plan:
    return Plan(goal="g", steps=[Step("a", tool="gate", input=1)])


def _all(n: int, fn: Callable[[], Any]) -> list[Any]:
    """Call ``fn`` from ``n`` threads released at once; return what each returned or raised."""
    barrier = threading.Barrier(n)
    out: list[Any] = [None] * n

    def call(i: int) -> None:
        barrier.wait(WAIT)
        try:
            out[i] = fn()
        except Exception as exc:  # recorded for the assertion
            out[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 2)
    assert not any(t.is_alive() for t in threads), "a thread still waits"
    return out


# -- many threads --------------------------------------------------------------------------------


def test_result_from_many_threads_is_one_and_the_same(journal_url: str) -> None:
    """A2: sixteen threads waiting in ``result()`` on one running run all return, once it
    stops, the very same ExecuteResult (the run is executed and settled once)."""
    with journaled.open(journal_url) as rt:
        started, release = _gate(rt)
        handle = rt.start(_gated_plan())
        assert started.wait(WAIT)
        threading.Timer(0.2, release.set).start()
        results = _all(THREADS, lambda: handle.result(WAIT))
        finished = [e for e in rt.runs.history(handle.run_id) if e.kind == "run.finished"]
    assert all(r is results[0] for r in results)
    assert isinstance(results[0], journaled.ExecuteResult)
    assert results[0].ok
    assert len(finished) == 1


def test_cancel_from_many_threads_cancels_once(journal_url: str) -> None:
    """A2/E5: sixteen threads cancelling one running run at once: each is told True (it was
    executing), the journal holds a single cancel request and one cancelled finish, and a
    cancel after it stopped is False and appends nothing."""

    def wait_for_cancel(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        entered.set()
        # The step outlives every cancel call, so each one is made while the run executes
        # however late a loaded machine schedules its thread.
        while not (ctx.cancelled() and all_told.is_set()):
            time.sleep(0.005)
        return journaled.AgentResult(ok=False, error="stopped")

    entered = threading.Event()
    all_told = threading.Event()
    with journaled.open(journal_url) as rt:
        rt.register_agent("waiter", wait_for_cancel)
        handle = rt.start(Plan(goal="g", steps=[Step("a", agent="waiter")]))
        assert entered.wait(WAIT)
        told = _all(THREADS, handle.cancel)
        all_told.set()
        result = handle.result(WAIT)
        kinds = [e.kind for e in rt.runs.history(handle.run_id)]
        position = rt.journal.position()
        assert _all(4, handle.cancel) == [False] * 4
        assert rt.journal.position() == position
        last = rt.runs.history(handle.run_id)[-1].data
    assert told == [True] * THREADS
    assert not result.ok
    assert kinds.count("run.cancel-requested") == 1
    assert kinds.count("run.finished") == 1
    assert getattr(last, "status", None) == "cancelled"


def test_state_from_many_threads_while_it_runs(journal_url: str) -> None:
    """A2: ``state()`` read from sixteen threads while the run executes gives each a result for
    that run with its step not yet succeeded; once it stopped, ``state()`` equals ``result()``."""
    with journaled.open(journal_url) as rt:
        started, release = _gate(rt)
        handle = rt.start(_gated_plan())
        assert started.wait(WAIT)
        states = _all(THREADS, handle.state)
        release.set()
        result = handle.result(WAIT)
        after = handle.state()
    for state in states:
        assert isinstance(state, journaled.ExecuteResult), state
        assert state.run_id == handle.run_id
        assert not state.ok
        assert state.plan.steps[0].status in ("pending", "running")
    assert after == result


# -- waits and cancels at the edges --------------------------------------------------------------


def test_result_zero_times_out_at_once_then_returns_once_finished(journal_url: str) -> None:
    """A2: ``result(timeout=0)`` on a running run raises TimeoutError at once and the run goes
    on; once it stopped, ``result(timeout=0)`` returns its result at once."""
    with journaled.open(journal_url) as rt:
        started, release = _gate(rt)
        handle = rt.start(_gated_plan())
        assert started.wait(WAIT)
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            handle.result(timeout=0)
        assert time.monotonic() - began < 0.5
        assert not handle.done()
        release.set()
        waited = handle.result(WAIT)
        began = time.monotonic()
        again = handle.result(timeout=0)
        assert time.monotonic() - began < 0.5
    assert again is waited
    assert again.ok


def test_cancelling_a_finished_run_is_false_and_appends_nothing(journal_url: str) -> None:
    """A2/E5: ``cancel()`` (handle and runtime) on a run that finished answers False, appends
    nothing, and leaves its result as it was."""
    with journaled.open(journal_url) as rt:
        rt.register_tool("echo", lambda x: x)
        handle = rt.start(Plan(goal="g", steps=[Step("a", tool="echo", input=1)]))
        result = handle.result(WAIT)
        position = rt.journal.position()
        assert handle.cancel() is False
        assert rt.cancel(handle.run_id) is False
        assert rt.journal.position() == position
        assert handle.state() == result
    assert result.ok


@SHARED
def test_handles_after_the_runtime_closed(journal_url: str) -> None:
    """A2/R3: after close, a finished run's handle still returns its result; a run that was
    executing returns a result with ``suspended`` set, and resumes in a new runtime; ``state()``
    raises JournalClosed naming the closed journal, ``cancel()`` is False, and ``start`` raises
    RuntimeClosed."""
    with journaled.open(journal_url, drain=0.1) as rt:
        rt.register_tool("echo", lambda x: x)
        finished = rt.start(Plan(goal="g", steps=[Step("a", tool="echo", input=1)]))
        done = finished.result(WAIT)
        started, release = _gate(rt)
        running = rt.start(_gated_plan())
        assert started.wait(WAIT)
        rt.close()
        try:
            suspended = running.result(WAIT)
        finally:
            release.set()
        assert finished.result(0) is done
        with pytest.raises(JournalClosed, match="closed"):
            running.state()
        assert running.cancel() is False
        assert finished.cancel() is False
        with pytest.raises(journaled.RuntimeClosed):
            rt.start(_gated_plan())
    assert suspended.suspended
    assert not suspended.ok
    with journaled.open(journal_url) as again:
        again.register_tool("gate", lambda x: x)
        resumed = again.resume(running.run_id)
    assert isinstance(resumed, journaled.ExecuteResult)
    assert resumed.ok


# -- progress callbacks --------------------------------------------------------------------------


def test_an_on_progress_that_raises_never_harms_the_run(journal_url: str) -> None:
    """A2/E11/E12: an on_progress raising at every point is called at every point still, and
    the run completes with all its observations."""
    calls: list[str] = []

    def boom(at: str, delta: list[Any], calls_used: int, waiting: list[str]) -> None:
        calls.append(at)
        raise RuntimeError(f"progress failed at {at}")

    with journaled.open(journal_url) as rt:
        rt.register_tool("echo", lambda x: x)
        plan = Plan(
            goal="g",
            steps=[Step("a", tool="echo", input=1), Step("b", tool="echo", depends_on=["a"])],
        )
        result = rt.start(plan, on_progress=boom).result(WAIT)
    assert result.ok
    assert [o.step_id for o in result.observations] == ["a", "b"]
    assert calls[-1] == "plan-end"
    assert len(calls) >= 3


def test_a_cancel_while_on_progress_blocks_takes_effect_after_it(journal_url: str) -> None:
    """A2/E5/E12: while an on_progress blocks the run's executor, ``cancel()`` is accepted at
    once (True); once the callback returns, no step starts after the cancel request (a step
    already started may finish), the last step is skipped and the run finishes cancelled."""
    entered, unblock = threading.Event(), threading.Event()

    def block(at: str, delta: list[Any], calls_used: int, waiting: list[str]) -> None:
        if delta and not entered.is_set():
            entered.set()
            unblock.wait(WAIT)

    with journaled.open(journal_url) as rt:
        rt.register_tool("echo", lambda x: x)
        plan = Plan(
            goal="g",
            steps=[
                Step("a", tool="echo", input=1),
                Step("b", tool="echo", depends_on=["a"]),
                Step("c", tool="echo", depends_on=["b"]),
            ],
        )
        handle = rt.start(plan, on_progress=block)
        assert entered.wait(WAIT)
        began = time.monotonic()
        assert handle.cancel() is True
        assert time.monotonic() - began < 1.0
        unblock.set()
        result = handle.result(WAIT)
        kinds = [e.kind for e in rt.runs.history(handle.run_id)]
        last = rt.runs.history(handle.run_id)[-1].data
    requested = kinds.index("run.cancel-requested")
    assert "run.step-started" not in kinds[requested:]
    assert result.plan.steps[0].status == "succeeded"
    assert result.plan.steps[2].status == "skipped"
    assert getattr(last, "status", None) == "cancelled"


# -- async steps that ignore cancellation ------------------------------------------------------


class Stubborn:
    """An ``async def`` tool that swallows CancelledError until let go (then it ends)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.let_go = threading.Event()
        self.ignored = 0
        self.ended = threading.Event()

    async def __call__(self, x: Any) -> Any:
        self.entered.set()
        try:
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    if self.let_go.is_set():
                        raise
                    self.ignored += 1  # ignored on purpose: the probe
        finally:
            self.ended.set()


def test_an_async_step_ignoring_cancellation_does_not_hold_the_run(journal_url: str) -> None:
    """A1/A2/E5: a run whose ``async def`` step swallows CancelledError still stops promptly
    when cancelled: the step fails as cancelled and the run finishes cancelled, while the
    step's task is still running (it did ignore the cancel)."""
    stubborn = Stubborn()
    with journaled.open(journal_url) as rt:
        rt.register_tool("stubborn", stubborn)
        handle = rt.start(Plan(goal="g", steps=[Step("a", tool="stubborn", input=1)]))
        assert stubborn.entered.wait(WAIT)
        began = time.monotonic()
        assert handle.cancel() is True
        result = handle.result(WAIT)
        stopped_in = time.monotonic() - began
        last = rt.runs.history(handle.run_id)[-1].data
        # the cancel reaches the task on its own loop: the run need not wait for it, the probe does
        wait_for(lambda: stubborn.ignored >= 1, WAIT)
        ignored, ended = stubborn.ignored, stubborn.ended.is_set()
        stubborn.let_go.set()
    assert stopped_in < 2.0
    assert ignored == 1
    assert not ended
    assert result.plan.steps[0].status == "failed"
    assert "cancelled" in (result.observations[0].error or "")
    assert getattr(last, "status", None) == "cancelled"


def test_the_async_runtime_cancels_a_stubborn_async_step_too(sqlite_url: str) -> None:
    """A1/A2/E5: on the asyncio runtime (steps on the application's loop), ``await
    handle.cancel()`` stops a run whose async step swallows CancelledError, promptly."""
    stubborn = Stubborn()

    async def story() -> tuple[journaled.ExecuteResult, float, int]:
        async with journaled.aio.open(sqlite_url) as rt:
            rt.register_tool("stubborn", stubborn)
            handle = await rt.start(Plan(goal="g", steps=[Step("a", tool="stubborn", input=1)]))
            await asyncio.to_thread(stubborn.entered.wait, WAIT)
            began = time.monotonic()
            assert await handle.cancel() is True
            result = await handle.result(WAIT)
            stopped_in = time.monotonic() - began
            await asyncio.sleep(0)
            ignored = stubborn.ignored
            stubborn.let_go.set()  # the application's own loop must end: let the task go
            return result, stopped_in, ignored

    result, stopped_in, ignored = asyncio.run(story())
    assert stopped_in < 2.0
    assert ignored == 1
    assert not result.ok
    assert "cancelled" in (result.observations[0].error or "")


# -- the asyncio handle ------------------------------------------------------------------------


def test_an_async_handle_awaited_twice_and_by_many_tasks(sqlite_url: str) -> None:
    """A1/A2: an async handle can be awaited again and by several tasks at once: each gets the
    same result; cancelling one awaiting task leaves the run and the other waiters alone."""

    async def story() -> tuple[list[journaled.ExecuteResult], bool]:
        async with journaled.aio.open(sqlite_url) as rt:
            started, release = _gate(rt._sync)
            handle = await rt.start(_gated_plan())
            await asyncio.to_thread(started.wait, WAIT)
            waiters = [asyncio.create_task(handle.result(WAIT)) for _ in range(5)]
            doomed = asyncio.create_task(handle.result())
            await asyncio.sleep(0.05)
            doomed.cancel()
            with pytest.raises(asyncio.CancelledError):
                await doomed
            still_running = not handle.done()
            release.set()
            results = [await w for w in waiters]
            results += [await handle, await handle]
            return results, still_running

    results, still_running = asyncio.run(story())
    assert still_running
    assert all(r is results[0] for r in results)
    assert results[0].ok


def test_closing_the_async_runtime_settles_an_awaited_handle(sqlite_url: str) -> None:
    """A1/A2/R3: a task awaiting a running run's async handle when the runtime closes gets the
    run's result with ``suspended`` set; the handle's state() and cancel() then raise
    RuntimeClosed (the runtime's calls are refused once it closed)."""

    async def story() -> journaled.ExecuteResult:
        rt = await journaled.aio.open(sqlite_url, drain=0.1)
        started, release = _gate(rt._sync)
        try:
            handle = await rt.start(_gated_plan())
            await asyncio.to_thread(started.wait, WAIT)
            waiter = asyncio.create_task(handle.result())
            await asyncio.sleep(0.05)
            await rt.close()
            result = await asyncio.wait_for(waiter, WAIT)
            with pytest.raises(journaled.RuntimeClosed):
                await handle.state()
            with pytest.raises(journaled.RuntimeClosed):
                await handle.cancel()
            return result
        finally:
            release.set()
            await rt.close()

    result = asyncio.run(story())
    assert result.suspended
    assert not result.ok


def test_a_handles_future_cannot_be_cancelled_and_the_run_settles(sqlite_url: str) -> None:
    """A2/R3 (ADR 0031): ``handle.future`` is the caller's to wait on, not to stop the run: its
    cancel() answers False and changes nothing; the run completes, result() returns it, and
    wait_idle and close wait for the run only, not their whole timeout or drain."""
    rt = journaled.open(sqlite_url, drain=4.0)
    try:
        started, release = _gate(rt)
        handle = rt.start(Plan(goal="g", steps=[Step("a", tool="gate", input=1)]))
        assert started.wait(WAIT)
        cancelled = handle.future.cancel()
        release.set()
        began = time.monotonic()
        assert rt.runs.wait_idle(4.0) == []
        idle = time.monotonic() - began
        result = handle.result(WAIT)
        began = time.monotonic()
        rt.close()
        closing = time.monotonic() - began
    finally:
        release.set()
        rt.close()
    assert cancelled is False
    assert not handle.future.cancelled()
    assert result.ok
    assert idle < 2.0, f"wait_idle waited {idle:.1f}s for a run that had ended"
    assert closing < 2.0, f"close waited {closing:.1f}s for a run that had ended"
    with journaled.open(sqlite_url) as again:
        assert again.runs.summary(handle.run_id).status == "completed"


def test_a_timed_out_wait_for_a_wrapped_handle_future_leaves_the_handle_usable(
    sqlite_url: str,
) -> None:
    """A1/A2 (ADR 0031): ``asyncio.wait_for(asyncio.wrap_future(handle.future), t)`` timing out
    cancels the wait only: the run completes, wait_idle returns once it ended, and awaiting
    the handle gives the run's result."""

    def slow(x: Any) -> Any:
        time.sleep(0.3)
        return x

    async def story() -> tuple[list[str], float, bool, bool]:
        async with journaled.aio.open(sqlite_url, drain=4.0) as rt:
            rt.register_tool("slow", slow)
            handle = await rt.start(Plan(goal="g", steps=[Step("a", tool="slow", input=1)]))
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(asyncio.wrap_future(handle.future), 0.05)
            began = time.monotonic()
            still = await rt.runs.wait_idle(4.0)
            idle = time.monotonic() - began
            result = await asyncio.wait_for(handle.result(), WAIT)
            return still, idle, result.ok, handle.future.cancelled()

    still, idle, ok, cancelled = asyncio.run(story())
    assert still == []
    assert idle < 2.0, f"wait_idle waited {idle:.1f}s for a run that had ended"
    assert ok
    assert not cancelled
