"""A page's vouch reaches only the take that follows its wait (R2, M10, ADR 0026 updates).

An asyncio subscription reads its page and the journal's erasure count in a waiting thread,
and the loop takes the event after it. A wait given up on (its task cancelled), or a loop busy
long after the wait, must not deliver what another process purged meanwhile.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import msgspec
import pytest

import journaled
from journaled.subscriptions import AsyncSubscription

MARK = "quokkamark"
PURGE_RUN_ELSEWHERE = """
import sys, journaled
with journaled.open(sys.argv[1], follow=None) as rt:
    assert rt.runs.purge(sys.argv[2], reason="erasure request") > 0
"""


def _purge_elsewhere(url: str, run_id: str) -> None:
    subprocess.run([sys.executable, "-c", PURGE_RUN_ELSEWHERE, url, run_id], check=True, timeout=60)


def _run_with_mark(rt: journaled.Runtime) -> str:
    rt.register_tool("echo", lambda x: f"out {MARK} {x}")
    plan = journaled.Plan(
        goal=f"goal {MARK}", steps=[journaled.Step("s", tool="echo", input=f"in {MARK}")]
    )
    run = rt.execute(plan)
    assert run.ok
    return run.run_id


def test_a_cancelled_poll_leaves_no_vouch_that_delivers_purged_content(sqlite_url: str) -> None:
    """R2: the page a cancelled poll's thread read and vouched for is checked again against
    the journal's erasures before any later poll delivers from it."""
    with journaled.open(sqlite_url, follow=None) as rt:
        run_id = _run_with_mark(rt)

        async def story() -> list[journaled.Event]:
            sub = await AsyncSubscription.open(rt.journal)
            task = asyncio.create_task(sub.poll(10))
            await asyncio.sleep(0)  # the task starts its waiting thread
            time.sleep(0.5)  # the loop is busy: the thread reads the page and vouches for it
            task.cancel()  # before the wait's outcome reaches the loop
            with pytest.raises(asyncio.CancelledError):
                await task
            assert sub._sync._buffer, "the given-up wait read the page"
            await asyncio.to_thread(_purge_elsewhere, sqlite_url, run_id)
            await asyncio.sleep(0.1)
            events = []
            while (event := await sub.poll(5)) is not None and event.stream == run_id:
                events.append(event)
            await sub.aclose()
            return events

        events = asyncio.run(story())
    assert events
    leaked = [e.position for e in events if MARK.encode() in msgspec.json.encode(e)]
    assert leaked == []


def test_a_loop_busy_past_the_wait_reads_the_erasures_again(sqlite_url: str) -> None:
    """R2: a loop that takes the event long after its wait vouched for the page (another
    process purged meanwhile) delivers the event as the journal now holds it."""
    with journaled.open(sqlite_url, follow=None) as rt:
        run_id = _run_with_mark(rt)

        async def story() -> journaled.Event | None:
            sub = await AsyncSubscription.open(rt.journal)
            task = asyncio.create_task(sub.poll(10))
            await asyncio.sleep(0)
            time.sleep(0.5)  # the thread reads the page and vouches for it
            _purge_elsewhere(sqlite_url, run_id)  # the loop is still busy
            first = await task  # the task resumes only now, after the purge
            await sub.aclose()
            return first

        first = asyncio.run(story())
    assert first is not None
    assert first.stream == run_id
    assert MARK.encode() not in msgspec.json.encode(first)
