"""Helpers of the tests of memory in place (ADR 0053, 0054, 0055, 0056): the writer and the desk
behind a runtime, a runtime on a fresh SQLite journal, an interrupt, a fold made to fail once, two
runtimes on one journal, and memory folded from the start indexing as it goes."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

import journaled
from journaled.actors.desk import WriterDesk
from journaled.actors.memory import MemoryWriter
from journaled.events.memory_state import MemoryState, ScopeState
from journaled.memory import MemoryView
from journaled.testing import ManualClock


def writer_of(rt: journaled.Runtime) -> MemoryWriter:
    """Return the memory writer actor of a runtime (the object, not its ref)."""
    writer = rt._actors.desk.writer
    assert isinstance(writer, MemoryWriter)
    return writer


def desk_of(rt: journaled.Runtime) -> WriterDesk:
    """Return the memory writer's desk of a runtime (ADR 0055)."""
    return rt._actors.desk


@pytest.fixture(name="rt")
def sqlite_rt(sqlite_url: str) -> Iterator[journaled.Runtime]:
    """A fixture named ``rt``: a runtime on a fresh SQLite journal, not following it. A module
    imports it to use it instead of the suite's ``rt`` over every backend."""
    with journaled.open(sqlite_url, follow=None) as runtime:
        yield runtime


class Interrupt(BaseException):
    """What a test's signal handler raises in the main thread (as Ctrl-C would)."""


@pytest.fixture(name="sigusr1_raises")
def interrupting_signal() -> Iterator[None]:
    """A fixture named ``sigusr1_raises``: SIGUSR1 raises :class:`Interrupt` in the main thread
    (as Ctrl-C would). A module imports it to use it."""
    assert threading.current_thread() is threading.main_thread()

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupt(signum)

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)


def fail_fold_once(monkeypatch: pytest.MonkeyPatch, text: str = "boom") -> None:
    """Make the fold of the fact whose text is ``text`` raise, the first time only."""
    real_apply = ScopeState.apply
    failures = [1]

    def failing(self: ScopeState, event: Any, t: str | None = None) -> None:
        if t == text and failures:
            failures.pop()
            raise RuntimeError("fold failed")
        real_apply(self, event, t)

    monkeypatch.setattr(ScopeState, "apply", failing)


@contextlib.contextmanager
def two_runtimes(url: str) -> Iterator[tuple[journaled.Runtime, journaled.Runtime]]:
    """Open two runtimes on one journal, neither following, their clocks 100 s apart."""
    with (
        journaled.open(url, clock=ManualClock(start=1_700_000_000_000), follow=None) as here,
        journaled.open(url, clock=ManualClock(start=1_700_000_100_000), follow=None) as other,
    ):
        yield here, other


def eager_view(
    rt: journaled.Runtime, position: int | None = None, at: int | None = None
) -> MemoryView:
    """Fold memory from the start, indexing as it goes: the path before T1 and ADR 0056."""
    memory = rt.memory
    state = MemoryState(list(memory._scopes), memory._organization)
    journal = memory._journal
    texts = journal.payloads()
    now = at if at is not None else 0
    for event in journal.read(upto=position):
        if at is not None and event.data.at > at:
            break
        state.apply(event, texts)
        if at is None:
            now = event.data.at
    return MemoryView(state, now, memory._semantic)
