"""R3, A1: closing the runtime's own step loop cancels the async steps still on it, and stops the
loop only once each has seen its cancellation, whatever its cleanup awaits."""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any

import pytest

import journaled
from journaled.actors.loop import LoopGone, LoopRunner, StepCancelled, StepToken

WAIT = 10.0


class Step:
    """A coroutine that sleeps until cancelled, then cleans up with awaits of its own."""

    def __init__(self, cleanup_awaits: int) -> None:
        self.cleanup_awaits = cleanup_awaits
        self.started = threading.Event()
        self.cleaned = threading.Event()

    async def __call__(self) -> None:
        self.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            for _ in range(self.cleanup_awaits):
                await asyncio.sleep(0)
            self.cleaned.set()
            raise


@pytest.mark.parametrize("cleanup_awaits", [0, 1, 5])
def test_closing_the_loop_lets_each_cancelled_step_finish_its_cleanup(cleanup_awaits: int) -> None:
    runner = LoopRunner()
    steps = [Step(cleanup_awaits) for _ in range(3)]
    outcomes: list[BaseException | None] = []

    def work(step: Step) -> None:
        try:
            runner.run(step())
            outcomes.append(None)
        except BaseException as exc:
            outcomes.append(exc)

    workers = [threading.Thread(target=work, args=(s,)) for s in steps]
    for w in workers:
        w.start()
    for s in steps:
        assert s.started.wait(WAIT)
    runner.close()
    for w in workers:
        w.join(WAIT)
    assert all(s.cleaned.is_set() for s in steps), "a step was left pending when the loop stopped"
    assert len(outcomes) == 3
    assert all(isinstance(o, StepCancelled) for o in outcomes), outcomes


def test_a_close_while_a_cancelled_step_cleans_up_does_not_cancel_it_again() -> None:
    """A step cancelled by its token (a deadline, a cancel of its run) is still in its cleanup
    when the runner closes: the close waits for that cleanup and does not cut it short."""
    runner = LoopRunner()
    started, in_cleanup, cleaned = threading.Event(), threading.Event(), threading.Event()

    async def step() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            in_cleanup.set()
            await asyncio.sleep(0.3)  # the close comes meanwhile
            cleaned.set()
            raise

    token = StepToken()
    outcome: list[BaseException] = []

    def work() -> None:
        try:
            runner.run(step(), token)
        except StepCancelled as exc:
            outcome.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    assert started.wait(WAIT)
    token.set("deadline")
    assert in_cleanup.wait(WAIT)
    runner.close()
    worker.join(WAIT)
    assert cleaned.is_set(), "the close cancelled the step's cleanup a second time"
    assert len(outcome) == 1


def test_a_close_without_drain_lets_an_async_step_clean_up_and_suspends_its_run(
    sqlite_url: str,
) -> None:
    step = Step(cleanup_awaits=3)

    async def hang(x: Any) -> Any:
        await step()
        return x

    rt = journaled.open(sqlite_url)
    rt.register_tool("hang", hang)
    handle = rt.start(journaled.Plan(goal="g", steps=[journaled.Step("a", tool="hang", input=1)]))
    assert step.started.wait(WAIT)
    rt.close(drain=0)
    assert handle.result(WAIT).suspended
    assert step.cleaned.wait(WAIT)


def test_a_step_submitted_as_its_loop_closes_raises_loop_gone_not_a_hang() -> None:
    """R3/A1 (ADR 0025): a step whose coroutine reached a loop that closed before starting it
    (asyncio.run's last turn) raises LoopGone, so the step runs again on resume; its worker does
    not wait for ever, and the coroutine is closed rather than left never awaited."""
    loop = asyncio.new_event_loop()  # not running: the task is queued, never started
    started = threading.Event()
    outcome: list[BaseException | None] = []

    async def step() -> None:
        started.set()

    coroutine = step()

    def work() -> None:
        try:
            LoopRunner(loop).run(coroutine)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join(0.2)
    loop.close()
    worker.join(WAIT)
    assert not worker.is_alive(), "the worker waits for a loop that closed"
    assert len(outcome) == 1, outcome
    assert isinstance(outcome[0], LoopGone), outcome
    assert not started.is_set()
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED  # never 'never awaited'


def test_a_step_due_on_a_closed_loop_raises_loop_gone() -> None:
    """R3/A1 (ADR 0025): an async step whose loop closed before its turn came raises LoopGone
    (no result: it runs again on resume), not the loop's RuntimeError, which its step would
    have journaled as a failure of the user's code."""
    loop = asyncio.new_event_loop()
    loop.close()

    async def step() -> None:
        raise AssertionError("never runs")

    coroutine = step()
    with pytest.raises(LoopGone):
        LoopRunner(loop).run(coroutine)
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED
