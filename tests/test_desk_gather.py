"""A leader after a group waits a little for that group's callers to line up again (ADR 0059).

The desk is driven with a stand-in writer whose store takes a fixed time, so what is measured is
the desk's grouping, not a disk; the bounds are raised where a slow machine could otherwise
decide the outcome.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from journaled.actors import desk as desk_module
from journaled.actors.desk import Sent, WriterDesk
from journaled.actors.group_commit import Answer
from journaled.events.memory import Fact
from journaled.events.messages import Remember


class TimedWriter:
    """Stores each group in ``took`` seconds (or refuses it as busy while ``busy`` is set),
    answering every remember with a fact."""

    def __init__(self, took: float) -> None:
        self.took = took
        self.busy = threading.Event()
        self.groups: list[list[Remember]] = []
        self.entered = threading.Event()
        self._lock = threading.Lock()

    def remember_here(self, group: Sequence[Remember], answer: Answer) -> bool:
        self.entered.set()
        if self.busy.is_set():
            return False
        with self._lock:
            self.groups.append(list(group))
        time.sleep(self.took)
        for message in group:
            answer(
                message,
                Fact(id=f"f-{id(message)}", scope="project", text=message.text, created_at=1),
                None,
            )
        return True

    def sizes(self) -> list[int]:
        with self._lock:
            return [len(g) for g in self.groups]

    def stored(self) -> list[str]:
        with self._lock:
            return [m.text for g in self.groups for m in g]


def _never_sent(message: Remember) -> object:
    raise AssertionError("the stand-in writer is never busy")


def _callers(desk: WriterDesk, callers: int, each: int) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(callers)

    def remember(k: int) -> None:
        try:
            start.wait(10)
            for i in range(each):
                fact = desk.remember(Remember(text=f"caller {k} fact {i}"), _never_sent)
                assert isinstance(fact, Fact)
                assert not isinstance(fact, Sent)
                assert fact.text == f"caller {k} fact {i}"
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=remember, args=(k,)) for k in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return errors


def test_callers_answered_together_are_stored_together_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four callers remembering in a loop: after the first groups, each group holds all four.
    Without the wait, the leader's own thread (running already) came back alone and paid a
    store for one remember, while the other three lined up behind it: groups of 1, 3, 1, 3."""
    monkeypatch.setattr(desk_module, "GATHER_MAX", 1.0)  # the time to gather never runs out
    writer = TimedWriter(took=0.01)
    desk = WriterDesk()
    desk.writer = writer
    callers, each = 4, 25
    assert _callers(desk, callers, each) == []
    assert sum(writer.sizes()) == callers * each
    # Perfect grouping stores the 100 remembers in 25 groups (and the first few may be short);
    # the 1, 3, 1, 3 pattern takes about 50.
    assert len(writer.groups) <= 30, writer.sizes()
    assert writer.sizes().count(callers) >= 20, writer.sizes()


def test_a_caller_alone_never_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """After groups of one, a leader takes its group at once: a lone caller pays no wait."""
    waited: list[float | None] = []
    desk = WriterDesk()
    real = desk._grown.wait_for

    def spy(predicate: object, timeout: float | None = None) -> bool:
        waited.append(timeout)
        return real(predicate, timeout)  # type: ignore[arg-type]

    monkeypatch.setattr(desk._grown, "wait_for", spy)
    desk.writer = TimedWriter(took=0.001)
    assert _callers(desk, 1, 20) == []
    assert waited == []


def test_a_leader_waits_no_longer_than_twice_the_last_group_took(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When the last group's callers do not come back, the next leader waits at most
    GATHER_FACTOR times the last group's store time, then leads the line as it is."""
    monkeypatch.setattr(desk_module, "GATHER_MAX", 10.0)
    writer = TimedWriter(took=0.2)
    desk = WriterDesk()
    desk.writer = writer
    assert _callers(desk, 3, 1) == []  # one group of three (or so), then nobody comes back
    last = writer.sizes()[-1]
    assert last >= 2, writer.sizes()  # the barrier released them together
    start = time.monotonic()
    fact = desk.remember(Remember(text="alone after the group"), _never_sent)
    waited = time.monotonic() - start - writer.took
    assert isinstance(fact, Fact)
    assert waited < desk_module.GATHER_FACTOR * writer.took + 1.0, waited  # bounded
    assert waited >= 0.8 * desk_module.GATHER_FACTOR * writer.took, waited  # and it did wait


def test_close_ends_a_leaders_wait_and_its_remember_is_stored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A leader waiting for callers that never come stops waiting when the desk closes."""
    monkeypatch.setattr(desk_module, "GATHER_MAX", 60.0)
    monkeypatch.setattr(desk_module, "GATHER_FACTOR", 1000.0)
    writer = TimedWriter(took=0.05)
    desk = WriterDesk()
    desk.writer = writer
    assert _callers(desk, 3, 1) == []
    stored: list[object] = []
    lone = threading.Thread(
        target=lambda: stored.append(desk.remember(Remember(text="lone"), _never_sent))
    )
    lone.start()
    time.sleep(0.3)  # it leads, and waits for the group of three
    assert stored == []
    start = time.monotonic()
    assert desk.close(30)
    lone.join(30)
    assert time.monotonic() - start < 10
    assert len(stored) == 1
    assert isinstance(stored[0], Fact)
    assert stored[0].text == "lone"
