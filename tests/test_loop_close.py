"""R3, A1: closing the runtime's own step loop cancels the async steps still on it, and stops the
loop only once each has seen its cancellation, whatever its cleanup awaits."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import journaled
from journaled.actors.loop import LoopRunner, StepCancelled, StepToken

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
