"""Remembers that queue up behind a busy writer are stored in one transaction (J2, M2, M3).

Each test holds the writer inside its first append, lets the other callers' remembers queue
behind it, then releases it: what the queued remembers did is then decided by the group commit,
not by the timing of the threads.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import journaled
from journaled.actors.group_commit import GROUP_ATTEMPTS, commit_remembers
from journaled.events.base import DomainEvent
from journaled.events.errors import ConcurrencyConflict
from journaled.events.journal import Journal
from journaled.events.memory import Fact, FactPurged
from journaled.events.messages import Remember
from journaled.testing import wait_for

WAIT = 10.0


class HeldWriter:
    """Holds the first append until released, and records the size of every append."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.appends: list[int] = []
        self.failures: list[Exception] = []
        """Errors the next appends raise, one each."""
        self.delays: dict[int, float] = {}
        """Seconds the append of that index (0 = the first) takes longer."""
        real = Journal.append

        def append(journal: Journal, events: Any, **kwargs: Any) -> list[int]:
            first = not self.appends
            self.appends.append(len(events))
            if first:
                self.entered.set()
                assert self.release.wait(WAIT)
            time.sleep(self.delays.get(len(self.appends) - 1, 0.0))
            if self.failures:
                raise self.failures.pop(0)
            return real(journal, events, **kwargs)

        monkeypatch.setattr(Journal, "append", append)


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[journaled.Runtime]:
    """Yield a runtime on a fresh SQLite journal."""
    with journaled.open(f"sqlite:///{tmp_path / 'journal.sqlite'}", follow=None) as runtime:
        yield runtime


def queue_behind_first(
    rt: journaled.Runtime, held: HeldWriter, calls: Sequence[Callable[[], Any]]
) -> list[Any]:
    """Run calls[0] until the writer holds it, queue the rest behind it, release; return outcomes.

    Each outcome is what the call returned or the exception it raised, in the order of ``calls``.
    """
    outcomes: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            outcomes[i] = calls[i]()
        except Exception as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    threads[0].start()
    assert held.entered.wait(WAIT)
    # The first is stored on its own thread (the writer was idle, ADR 0054); the others queue
    # behind it: remembers in the desk's line (ADR 0055), other commands in the writer's inbox.
    inbox, line = rt.memory._writer.actor_inbox, rt._actors.desk._line

    def queued() -> int:
        puts: int = inbox.puts
        return puts + len(line)

    for thread in threads[1:]:  # one at a time, so they queue in the order of ``calls``
        before = queued()
        thread.start()
        wait_for(lambda: queued() > before, WAIT)  # noqa: B023
    held.release.set()
    for thread in threads:
        thread.join(WAIT)
    return outcomes


def test_remembers_queued_behind_a_commit_share_the_next_one(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """J2: seven callers queued behind a commit are stored by one append, each gets its fact."""
    held = HeldWriter(monkeypatch)
    texts = [f"fact number {i} about the proxy" for i in range(8)]
    calls = [functools.partial(rt.memory.remember, t) for t in texts]
    facts = queue_behind_first(rt, held, calls)
    assert held.appends == [1, 7]
    assert [f.text for f in facts] == texts
    stored = {f.id: f for f in rt.memory.all()}
    assert all(stored[f.id] == f for f in facts)


def test_a_lone_caller_is_committed_at_once(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """J2: with nobody else waiting, every remember is its own commit (no added latency)."""
    held = HeldWriter(monkeypatch)
    held.release.set()
    for i in range(5):
        rt.memory.remember(f"fact {i}")
    assert held.appends == [1, 1, 1, 1, 1]


def test_an_invalid_remember_fails_alone(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """M2: an invalid request in a group gets its own error; the rest of the group is stored."""
    held = HeldWriter(monkeypatch)
    calls = [
        lambda: rt.memory.remember("first"),
        lambda: rt.memory.remember("second"),
        lambda: rt.memory.remember("   "),
        lambda: rt.memory.remember("third", confidence=float("nan")),
        lambda: rt.memory.remember("fourth"),
    ]
    outcomes = queue_behind_first(rt, held, calls)
    assert isinstance(outcomes[2], journaled.InvalidFact)
    assert "text is empty" in str(outcomes[2])
    assert isinstance(outcomes[3], journaled.InvalidFact)
    assert "NaN" in str(outcomes[3])
    assert held.appends == [1, 2]
    assert sorted(f.text for f in rt.memory.all()) == ["first", "fourth", "second"]


def test_a_key_claimed_twice_in_a_group_is_superseded_in_order(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """M3: a second claim of a key in the group commits the group first, then supersedes."""
    held = HeldWriter(monkeypatch)
    calls = [
        lambda: rt.memory.remember("unrelated"),
        lambda: rt.memory.remember("port is 8080", conflict_key="port"),
        lambda: rt.memory.remember("host is alpha", conflict_key="host"),
        lambda: rt.memory.remember("port is 9090", conflict_key="port"),
    ]
    _, old, host, new = queue_behind_first(rt, held, calls)
    assert held.appends == [1, 4, 3]  # (old + its key claim, host + claim) then new's events
    assert new.supersedes == (old.id,)
    stored = {f.id: f for f in rt.memory.all()}
    assert stored[old.id].superseded_by == new.id
    assert stored[host.id].superseded_by is None
    assert [f.id for f in rt.memory.search("port")] == [new.id]


def test_a_failed_append_fails_the_whole_group_and_stores_none_of_it(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """J2: the group is one transaction: if it fails, every caller in it gets the error."""
    held = HeldWriter(monkeypatch)
    held.failures = [OSError("disk full"), OSError("disk full")]
    calls = [functools.partial(rt.memory.remember, f"fact {i}") for i in range(4)]
    outcomes = queue_behind_first(rt, held, calls)
    assert all(isinstance(o, OSError) for o in outcomes)  # the first, then the group of three
    assert held.appends == [1, 3]
    assert rt.memory.all() == []
    assert rt.memory.remember("after the failure").text == "after the failure"


def test_keyed_remembers_from_threads_of_two_runtimes_keep_one_holder_per_key(
    tmp_path: Path,
) -> None:
    """J3/M3: grouped claims that conflict with another process are decided again, never lost."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    keys = ["port", "host", "region"]
    with journaled.open(url) as one, journaled.open(url) as two:
        barrier = threading.Barrier(8, timeout=WAIT)

        def write(rt: journaled.Runtime, who: int) -> None:
            barrier.wait()
            for i in range(15):
                rt.memory.remember(f"writer {who} claim {i}", conflict_key=keys[(who + i) % 3])

        threads = [
            threading.Thread(target=write, args=(rt, who)) for who, rt in enumerate([one, two] * 4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        one.refresh()
        for rt in (one, two):
            rt.refresh()
            facts = rt.memory.all()
            assert len(facts) == 8 * 15
            for key in keys:
                holders = [f for f in facts if f.conflict_key == key and f.superseded_by is None]
                assert len(holders) == 1, key
            superseded = [f for f in facts if f.superseded_by is not None]
            assert len(superseded) == len(facts) - len(keys)


def test_a_group_pending_when_the_writer_stops_is_still_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """J2: remembers grouped by the writer actor just before it is stopped are stored and
    answered (sent to it, not stored at the desk: ADR 0055)."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    held = HeldWriter(monkeypatch)
    with journaled.open(url, follow=None) as rt:
        writer = rt.memory._writer
        rt.memory._desk = None  # every remember goes to the actor
        outcomes: list[Any] = []
        threads = [
            threading.Thread(target=lambda i=i: outcomes.append(rt.memory.remember(f"f{i}")))
            for i in range(3)
        ]
        base = writer.actor_inbox.puts
        threads[0].start()
        assert held.entered.wait(WAIT)  # the actor is appending the first
        for thread in threads[1:]:
            thread.start()
        wait_for(lambda: writer.actor_inbox.puts == base + 3, WAIT)
        held.delays[1] = 1.2  # the group's commit outlasts the callers' 0.5 s liveness polls
        stopped = writer.stop(block=False)  # queued behind the two remembers
        held.release.set()
        stopped.get(timeout=WAIT)
        for thread in threads:
            thread.join(WAIT)
        assert held.appends == [1, 2]
        assert sorted(f.text for f in outcomes) == ["f0", "f1", "f2"]
    with journaled.open(url) as again:
        assert sorted(f.text for f in again.memory.all()) == ["f0", "f1", "f2"]


def test_closing_stores_and_answers_what_the_writer_still_holds(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """J2: closing memory first stores the remembers waiting in the desk's line behind one being
    stored (ADR 0055), then stops the writer before the scope actors, so all fold and answer."""
    held = HeldWriter(monkeypatch)
    outcomes: list[Any] = []
    threads = [
        threading.Thread(target=lambda i=i: outcomes.append(rt.memory.remember(f"f{i}")))
        for i in range(3)
    ]
    desk = rt._actors.desk
    threads[0].start()
    assert held.entered.wait(WAIT)  # stored on its own thread, the writer being idle
    for thread in threads[1:]:
        thread.start()
    wait_for(lambda: len(desk._line) == 3, WAIT)  # the first, and two waiting behind it
    stopping = threading.Thread(target=rt._actors.stop)
    stopping.start()
    wait_for(lambda: desk._closed, WAIT)
    assert rt.memory._writer.is_alive()  # the close waits for the line before it stops the writer
    held.release.set()
    stopping.join(WAIT)
    for thread in threads:
        thread.join(WAIT)
    assert sorted(f.text for f in outcomes) == ["f0", "f1", "f2"]
    assert held.appends == [1, 2]


def test_a_conflict_key_that_is_no_string_is_refused_and_the_writer_lives(
    rt: journaled.Runtime,
) -> None:
    """M2: a key of the wrong type is an InvalidFact for its caller, never a dead writer."""
    with pytest.raises(journaled.InvalidFact, match="conflict_key"):
        rt.memory.remember("port is 80", conflict_key=["port"])  # type: ignore[arg-type]
    assert rt.memory.remember("port is 80", conflict_key="port").conflict_key == "port"


def _message(text: str, key: str | None = None) -> Remember:
    return Remember(text=text, conflict_key=key, reply_to="caller", correlation=text)


def test_a_key_other_processes_keep_claiming_does_not_fail_the_rest_of_its_group() -> None:
    """J3: after a few conflicting tries together, each remember of a group gets its own retries."""
    hot, calm = _message("hot", key="port"), [_message("a"), _message("b")]
    appended: list[list[str]] = []

    def decide(message: Remember) -> tuple[list[tuple[str, DomainEvent]], str, Fact]:
        fact = Fact(id=f"mem_{message.text}", scope="project", text=message.text, created_at=1)
        return [(fact.id, FactPurged(at=1, fact_id=fact.id))], message.text, fact

    def append(staged: list[tuple[str, DomainEvent]], payloads: dict[str, bytes]) -> None:
        appended.append(sorted(payloads))
        if "mem_hot" in payloads:
            raise ConcurrencyConflict([], "another process claimed the key first")

    answers: dict[str, Fact | Exception] = {}

    def answer(message: Remember, fact: Fact | None, error: Exception | None) -> None:
        assert message.correlation is not None
        answers[message.correlation] = error if error is not None else fact  # type: ignore[assignment]

    commit_remembers(
        [hot, *calm],
        decide=decide,
        append=append,
        catch_up=lambda: None,
        attempts=5,
        answer=answer,
    )
    assert [answers[m.text].text for m in calm] == ["a", "b"]  # type: ignore[union-attr]
    assert isinstance(answers["hot"], ConcurrencyConflict)
    assert "gave up after 5" in str(answers["hot"])
    assert appended[:GROUP_ATTEMPTS] == [["mem_a", "mem_b", "mem_hot"]] * GROUP_ATTEMPTS
    assert appended[GROUP_ATTEMPTS:] == [["mem_hot"]] * 5 + [["mem_a"], ["mem_b"]]
