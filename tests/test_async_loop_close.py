"""Async steps and the runtime's own event loop (SPEC A1, R3)."""

from __future__ import annotations

import asyncio
import threading

import journaled
from journaled.testing import wait_for

WAIT = 10.0


def test_close_cancels_an_async_step_left_running_on_the_runtime_loop(sqlite_url: str) -> None:
    """A1/R3: closing with drain=0 suspends the run and cancels the step's task on the loop."""
    started = threading.Event()
    cancelled = threading.Event()

    async def forever(_: object) -> str:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    rt = journaled.open(sqlite_url)
    rt.register_tool("forever", forever)
    handle = rt.start(journaled.Plan(goal="g", steps=[journaled.Step("a", tool="forever")]))
    assert started.wait(WAIT)
    rt.close(drain=0)
    assert handle.result(timeout=WAIT).suspended
    wait_for(cancelled.is_set, WAIT)
