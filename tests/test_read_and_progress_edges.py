"""Reads and progress callbacks at their edges (P3, R1, A1, A2, E11; ADR 0062, 0063): a step
that writes over what it read, async and callable on_progress objects, a wait for the run from
its own async on_progress, BaseExceptions from callbacks, and the cost of scrubbing reads.
Every wait is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import journaled
import journaled.aio
from journaled import Plan, Step
from journaled.events.base import Event
from journaled.events.journal import Journal
from journaled.events.memory import FactRemembered
from journaled.events.runs import MemoryRead
from journaled.events.tenancy import Boundary

WAIT = 10.0


@pytest.fixture
def srt(sqlite_url: str) -> Iterator[journaled.Runtime]:
    """Yield a runtime on a real SQLite file."""
    with journaled.open(sqlite_url) as runtime:
        yield runtime


def test_a_step_that_supersedes_what_it_read_is_not_stale_by_its_own_write(
    srt: journaled.Runtime,
) -> None:
    """P3/P4: a read-modify-write step is not made stale by its own remember."""
    srt.memory.remember("theme is dark", conflict_key="theme")

    def update(query: str, ctx: Any) -> str:
        current = [f.text for f in ctx.memory.search(query)]
        assert current, "the step reads the current theme first"
        return str(ctx.memory.remember("theme is light", conflict_key="theme").id)

    srt.register_tool("update", update)
    result = srt.execute(Plan(goal="g", steps=[Step("a", tool="update", input="theme")]))
    assert result.ok
    assert srt.runs.stale(result.run_id) == []


def test_an_async_on_progress_awaiting_its_own_run_is_refused_at_once(tmp_path: Path) -> None:
    """A2: ``await handle`` of a run from that run's own async on_progress raises RuntimeError."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    seen: list[str] = []

    async def main() -> None:
        async with journaled.aio.open(url) as rt:
            rt.register_tool("t", lambda x: x)
            handles: list[Any] = []
            reported = asyncio.Event()

            async def progress(at: str, delta: Any, calls: int, waiting: Any) -> None:
                if reported.is_set():
                    return
                while not handles:
                    await asyncio.sleep(0.005)
                try:
                    await asyncio.wait_for(handles[0].result(), 2.0)
                    seen.append("returned")
                except RuntimeError:
                    seen.append("RuntimeError")
                except TimeoutError:
                    seen.append("TimeoutError")
                reported.set()

            plan = Plan(goal="g", steps=[Step("a", tool="t", input=1)])
            handles.append(await rt.start(plan, on_progress=progress))
            await asyncio.wait_for(reported.wait(), WAIT)
            await asyncio.wait_for(handles[0].result(), WAIT)

    asyncio.run(main())
    assert seen == ["RuntimeError"]


def test_an_on_progress_object_with_an_async_call_is_awaited(srt: journaled.Runtime) -> None:
    """A1/E12: an on_progress whose call returns a coroutine is awaited like an async def."""

    class Reporter:
        def __init__(self) -> None:
            self.points: list[str] = []

        async def __call__(self, at: str, delta: Any, calls: int, waiting: Any) -> None:
            self.points.append(at)

    srt.register_tool("t", lambda x: x)
    reporter = Reporter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = srt.execute(
            Plan(goal="g", steps=[Step("a", tool="t", input=1)]),
            on_progress=reporter,
        )
    assert result.ok
    assert reporter.points
    assert reporter.points[-1] == "plan-end"
    assert not [w for w in caught if "never awaited" in str(w.message)]


def test_scrub_reads_looks_up_the_ids_it_is_given_not_every_id_ever_seen(
    sqlite_url: str,
) -> None:
    """R1 (cost): scrubbing a read event looks up its own ids in what the boundary learnt; it
    never walks every fact id the boundary knows (one per fact a journal view showed)."""

    class Unwalkable(dict[str, bool]):
        def items(self) -> Any:
            raise AssertionError("scrub_reads walked every id it knows")

        def __iter__(self) -> Any:
            raise AssertionError("scrub_reads walked every id it knows")

    with journaled.open(sqlite_url) as rt:
        rt.memory.remember("shared fact")
        journal: Journal = rt._journal
        boundary = Boundary("a", journal.first, journal.firsts)
        for i in range(1_000):
            remembered = FactRemembered(
                at=0, fact_id=f"mem_other_{i}", scope="organization", organization="b"
            )
            boundary.hides(
                Event(position=i + 10, stream=f"mem_other_{i}", version=1, data=remembered)
            )
        boundary._elsewhere = Unwalkable(boundary._elsewhere)
        read = Event(
            position=400_000,
            stream="run_x",
            version=3,
            data=MemoryRead(at=0, step_id="a", attempt=1, fact_ids=("mem_other_1", "mem_other_2")),
        )
        assert boundary.scrub_reads([read])[0].data.fact_ids == ()  # type: ignore[attr-defined]


def test_an_async_on_progress_raising_keyboard_interrupt_does_not_hang_the_run(
    sqlite_url: str,
) -> None:
    """E12/A1: a failing async on_progress neither hangs its run nor kills the steps' loop."""
    with journaled.open(sqlite_url, drain=1.0) as rt:
        rt.register_tool("t", lambda x: x)

        async def double(x: int) -> int:
            return 2 * x

        rt.register_tool("async_double", double)
        raised: list[str] = []

        async def progress(at: str, delta: Any, calls: int, waiting: Any) -> None:
            if not raised:
                raised.append(at)
                raise KeyboardInterrupt("from on_progress")

        handle = rt.start(
            Plan(goal="g", steps=[Step("a", tool="t", input=1)]),
            on_progress=progress,
        )
        result = handle.result(5.0)
        assert result.ok
        later = rt.start(Plan(goal="g", steps=[Step("b", tool="async_double", input=4)]))
        assert later.result(5.0).observations[0].output == 8


def test_an_on_progress_raising_system_exit_leaves_other_runtimes_open(tmp_path: Path) -> None:
    """E12/R3: a callback's SystemExit in one runtime does not close another runtime."""
    with (
        journaled.open(f"sqlite:///{tmp_path / 'a.sqlite'}", drain=1.0) as rt,
        journaled.open(f"sqlite:///{tmp_path / 'b.sqlite'}", drain=1.0) as other,
    ):
        rt.register_tool("t", lambda x: x)

        def progress(at: str, delta: Any, calls: int, waiting: Any) -> None:
            raise SystemExit(3)

        handle = rt.start(
            Plan(goal="g", steps=[Step("a", tool="t", input=1)]), on_progress=progress
        )
        with contextlib.suppress(Exception):  # whatever becomes of the run itself
            handle.result(5.0)
        time.sleep(0.3)
        assert other.memory.remember("the other runtime still works").text
