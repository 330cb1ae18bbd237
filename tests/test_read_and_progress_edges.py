"""Reads and progress callbacks at their edges (P3, R1, A1, A2, E11; ADR 0062, 0063): a step
that writes over what it read, async and callable on_progress objects, a wait for the run from
its own async on_progress, BaseExceptions from callbacks, and the cost of scrubbing reads.
Every wait is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import warnings
from collections import OrderedDict
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

    class Unwalkable(OrderedDict[str, bool]):
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
        boundary._elsewhere._items = Unwalkable(boundary._elsewhere._items)
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


def _waiter(box: dict[str, Any], outcome: list[str]) -> Any:
    """Return an on_progress that waits (once) for the handle in ``box``, saying how it ended."""

    def progress(at: str, delta: Any, calls: int, waiting: Any) -> None:
        handle = box.get("handle")
        if handle is None or outcome:
            return
        began = time.monotonic()
        try:
            handle.result(timeout=1.0)
            outcome.append("returned")
        except RuntimeError as exc:
            outcome.append(f"refused in {time.monotonic() - began:.2f} s: {exc}")
        except TimeoutError:
            outcome.append("deadlocked until the timeout")

    return progress


def test_a_child_runs_on_progress_waiting_for_its_parent_is_refused(
    srt: journaled.Runtime,
) -> None:
    """A2, E9: the parent waits for the step that waits for the child, which waits for its
    on_progress: a wait there for the parent is refused at once, and both runs complete."""
    box: dict[str, Any] = {}
    outcome: list[str] = []
    srt.register_tool("echo", lambda x: x)

    def lead(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        child = ctx.execute(
            Plan(goal="sub", steps=[Step("x", tool="echo", input=5)]),
            on_progress=_waiter(box, outcome),
        )
        return journaled.AgentResult(output=child.observations[0].output, calls_used=0)

    srt.register_agent("lead", lead)
    gate = threading.Event()
    srt.register_tool("gate", lambda x: gate.wait(WAIT) and x)
    plan = Plan(
        goal="g", steps=[Step("a", tool="gate", input=1), Step("p", agent="lead", depends_on=["a"])]
    )
    box["handle"] = handle = srt.start(plan)
    gate.set()
    result = handle.result(WAIT)
    assert result.ok
    assert result.observations[-1].output == 5
    assert outcome, "on_progress never waited"
    assert outcome[0].startswith("refused"), outcome
    assert f"waits for the end of run {handle.run_id}," in outcome[0]


def test_a_passs_on_progress_waiting_for_its_orchestration_is_refused(
    srt: journaled.Runtime,
) -> None:
    """A2, O5: an orchestration waits for its pass, the pass for its on_progress: a wait there
    for the orchestration is refused at once, and the orchestration completes."""
    box: dict[str, Any] = {}
    outcome: list[str] = []
    gate = threading.Event()
    srt.register_tool("gate", lambda x: gate.wait(WAIT) and x)

    def planner(goal: str, observations: Any, clarifications: Any) -> Plan:
        return Plan(goal=goal, steps=[Step("a", tool="gate", input=1)])

    box["handle"] = handle = srt.orchestrate_start("g", planner, on_progress=_waiter(box, outcome))
    gate.set()
    assert handle.result(WAIT).status == "completed"
    assert outcome, "on_progress never waited"
    assert outcome[0].startswith("refused"), outcome
    assert f"waits for the end of run {handle.run_id}," in outcome[0]


def test_an_async_childs_on_progress_awaiting_its_parent_is_refused(tmp_path: Path) -> None:
    """A2, E9 on the asyncio door: ``await parent_handle`` from a child's async on_progress."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    seen: list[str] = []

    async def main() -> None:
        async with journaled.aio.open(url) as rt:
            rt.register_tool("echo", lambda x: x)
            handles: list[Any] = []

            async def progress(at: str, delta: Any, calls: int, waiting: Any) -> None:
                if seen or not handles:
                    return
                try:
                    await asyncio.wait_for(handles[0].result(), 1.0)
                    seen.append("returned")
                except RuntimeError as exc:
                    seen.append(f"RuntimeError: {exc}")
                except TimeoutError:
                    seen.append("TimeoutError")

            async def lead(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
                while not handles:
                    await asyncio.sleep(0.005)
                child = await ctx.execute_async(
                    Plan(goal="sub", steps=[Step("x", tool="echo", input=5)]),
                    on_progress=progress,
                )
                return journaled.AgentResult(output=child.observations[0].output, calls_used=0)

            rt.register_agent("lead", lead)
            handles.append(await rt.start(Plan(goal="g", steps=[Step("p", agent="lead")])))
            result = await asyncio.wait_for(handles[0].result(), WAIT)
            assert result.ok

    asyncio.run(main())
    assert seen, "on_progress never awaited"
    assert seen[0].startswith("RuntimeError"), seen
    assert "awaits the end of run" in seen[0]


def test_closing_the_runtime_from_on_progress_is_refused_and_closes_nothing(
    sqlite_url: str,
) -> None:
    """R3, A2: ``rt.close()`` from on_progress would drain the reporting run, which waits for
    on_progress: it waited out the whole drain and left the run neither finished nor
    suspended. It is refused at once; the runtime stays open and the run completes."""
    outcome: list[str] = []
    rt = journaled.open(sqlite_url)
    rt.register_tool("echo", lambda x: x)

    def progress(at: str, delta: Any, calls: int, waiting: Any) -> None:
        if outcome:
            return
        began = time.monotonic()
        try:
            rt.close()
            outcome.append("closed")
        except RuntimeError as exc:
            outcome.append(f"refused in {time.monotonic() - began:.2f} s: {exc}")

    try:
        plan = Plan(goal="g", steps=[Step("a", tool="echo", input=1)])
        result = rt.execute(plan, on_progress=progress)
        assert result.ok
        assert outcome, "on_progress never closed"
        assert outcome[0].startswith("refused"), outcome
        assert "close the runtime elsewhere" in outcome[0]
        assert rt.execute(plan).ok  # still open
    finally:
        rt.close()
    rt.close()  # closed above: a second close is a no-op


def test_closing_the_async_runtime_from_an_async_on_progress_is_refused(tmp_path: Path) -> None:
    """R3, A2 on the asyncio door: the refusal comes before anything is shut down, so the
    runtime (and its worker pool) still serves calls afterwards."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    seen: list[str] = []

    async def main() -> None:
        async with journaled.aio.open(url) as rt:
            rt.register_tool("echo", lambda x: x)

            async def progress(at: str, delta: Any, calls: int, waiting: Any) -> None:
                if seen:
                    return
                try:
                    await asyncio.wait_for(rt.close(), 2.0)
                    seen.append("closed")
                except RuntimeError:
                    seen.append("RuntimeError")
                except TimeoutError:
                    seen.append("TimeoutError")

            plan = Plan(goal="g", steps=[Step("a", tool="echo", input=1)])
            assert (await rt.execute(plan, on_progress=progress)).ok
            assert (await rt.execute(plan)).ok
            assert await rt.memory.remember("still open")

    asyncio.run(main())
    assert seen == ["RuntimeError"]
