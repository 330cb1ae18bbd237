"""A Ctrl-C at any line of a run's fold (R4, T1, ADR 0076).

An interrupt is raised at the n-th line the fold runs, for every n until the fold finishes
without one. Each time, the caller gets that ``KeyboardInterrupt`` and nothing else, and the next
read, through the checkpoint cache the interrupted one was filling, serves the state a plain fold
of the journal gives. Before the fix, an interrupt between two fields of a run's start left a
state the end of ``apply_all`` could not make a plan of: a ``KeyError`` replaced the interrupt.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import journaled
from journaled import AgentResult, NeedsInput, Plan, Step
from journaled.events import run_checkpoints, run_state
from journaled.events.run_checkpoints import RunCheckpoints
from journaled.events.run_state import RunFold, fold_run

_FOLDING = {Path(run_state.__file__).resolve(), Path(run_checkpoints.__file__).resolve()}


@contextmanager
def interrupt_at_line(n: int) -> Iterator[list[int]]:
    """Raise KeyboardInterrupt at the n-th line run in the fold's modules on this thread.

    Yields a one-item list that holds, afterwards, how many such lines ran.
    """
    seen = [0]
    files: dict[str, bool] = {}

    def folding(filename: str) -> bool:
        known = files.get(filename)
        if known is None:
            known = files[filename] = Path(filename).resolve() in _FOLDING
        return known

    def local(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        if event == "line":
            seen[0] += 1
            if seen[0] == n:
                raise KeyboardInterrupt
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        return local if folding(frame.f_code.co_filename) else None

    before = sys.gettrace()
    sys.settrace(calls)
    try:
        yield seen
    finally:
        sys.settrace(before)


def _asker(step: Step, ctx: journaled.AgentContext) -> AgentResult:
    if ctx.answer is None:
        raise NeedsInput(f"which way for {step.id}?")
    return AgentResult(output=f"{step.id}: {ctx.answer}", calls_used=1)


@pytest.fixture
def run(sqlite_url: str) -> Iterator[tuple[journaled.Runtime, str]]:
    """A run that waited, was answered, resumed and finished: most kinds of run event."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("echo", lambda x: x)
        rt.register_agent("ask", _asker)
        plan = Plan(
            goal="interrupted folds",
            steps=[
                Step("a", tool="echo", input=1),
                Step("b", tool="echo", input=2, depends_on=["a"]),
                Step("q", agent="ask", input="?", depends_on=["a"]),
                Step("c", tool="echo", input=3, depends_on=["b", "q"]),
            ],
        )
        waiting = rt.execute(plan)
        assert waiting.waiting == ["q"]
        done = rt.resume(waiting.run_id, answers={"q": "left"})
        assert isinstance(done, journaled.ExecuteResult)
        assert done.ok
        yield rt, waiting.run_id


def test_an_interrupt_anywhere_in_a_fold_reaches_the_caller_as_itself(
    run: tuple[journaled.Runtime, str],
) -> None:
    rt, run_id = run
    events = rt.runs.history(run_id)
    expected = fold_run(events).result()
    interrupted = 0
    for n in range(1, 100_000):
        state = RunFold()
        with interrupt_at_line(n) as seen:
            try:
                state.apply_all(events)
            except KeyboardInterrupt:
                interrupted += 1
                continue
        assert seen[0] < n  # the fold ran to its end with no interrupt
        assert state.result() == expected
        break
    else:
        pytest.fail("the fold never finished")
    assert interrupted > 50  # the fold's lines were all reached, one interrupt each


@pytest.mark.parametrize("warm", [False, True], ids=["first-read", "checkpointed"])
def test_time_travel_after_an_interrupt_anywhere_serves_the_plain_fold(
    run: tuple[journaled.Runtime, str], warm: bool
) -> None:
    rt, run_id = run
    history = rt.runs.history(run_id)
    positions = [e.position for e in history]
    expected = {p: fold_run([e for e in history if e.position <= p]).result() for p in positions}
    middle = positions[len(positions) // 2]
    interrupted = 0
    for n in range(1, 100_000):
        rt.runs.checkpoints = RunCheckpoints(every=2)
        if warm:
            rt.runs.at(run_id, positions[-1])  # the next read builds checkpoints
            rt.runs.at(run_id, positions[-1])
        with interrupt_at_line(n) as seen:
            try:
                rt.runs.at(run_id, middle)
            except KeyboardInterrupt:
                interrupted += 1
            else:
                assert seen[0] < n
        for position in [middle, *positions]:
            assert rt.runs.at(run_id, position) == expected[position], (n, position)
        if seen[0] < n:
            break
    else:
        pytest.fail("the read never finished")
    assert interrupted > 10
