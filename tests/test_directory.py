"""Addresses and replies by correlation id (SPEC A4, ADR 0024)."""

from __future__ import annotations

import threading

import pykka
import pytest

import journaled
from journaled.actors.directory import Directory, Inbox, failure, rebuild_error
from journaled.actors.errors import InvalidFact, RunOwnedElsewhere
from journaled.actors.executor import Executor
from journaled.events.memory import Fact
from journaled.events.messages import Failure, Remembered

WAIT = 10.0


def test_an_inbox_completes_the_future_of_each_correlation_id() -> None:
    """A4: a reply told to an inbox's address completes the future of its correlation id only."""
    directory = Directory("rt-test")
    inbox = Inbox(directory, "caller")
    assert inbox.address == "rt-test/caller"
    first, one = inbox.expect()
    second, two = inbox.expect()
    fact = Fact(id="mem_1", scope="project", text="t", created_at=1)
    assert directory.tell(inbox.address, Remembered(correlation=second, fact=fact))
    assert two.result(0).fact == fact
    assert not one.done()
    directory.tell(inbox.address, failure(first, InvalidFact("text", "is empty")))
    with pytest.raises(InvalidFact, match="text is empty") as caught:
        one.result(0)
    assert caught.value.field == "text"


def test_a_reply_nobody_waits_for_is_dropped() -> None:
    """A4: replies to a forgotten correlation or to a free address are dropped, never raised."""
    directory = Directory()
    inbox = Inbox(directory, "caller")
    correlation, future = inbox.expect()
    inbox.forget(correlation)
    fact = Fact(id="mem_1", scope="project", text="t", created_at=1)
    assert directory.tell(inbox.address, Remembered(correlation=correlation, fact=fact))
    assert not future.done()
    assert directory.tell("rt-x/nobody", Remembered(correlation="c", fact=fact)) is False
    inbox.close()
    assert directory.lookup(inbox.address) is None


def test_an_address_is_taken_once() -> None:
    """A4: two mailboxes never share an address."""
    directory = Directory()
    Inbox(directory, "caller")
    with pytest.raises(ValueError, match="taken"):
        Inbox(directory, "caller")


def test_a_failure_is_rebuilt_as_its_class_or_named_in_the_text() -> None:
    """A4: a failure reply rebuilds journaled and built-in errors; others keep their name."""
    owned = rebuild_error(failure("c", RunOwnedElsewhere("run r is elsewhere")))
    assert isinstance(owned, journaled.RunNotResumable)
    assert str(owned) == "run r is elsewhere"
    assert isinstance(rebuild_error(failure("c", OSError("disk full"))), OSError)

    class Strange(Exception):
        pass

    other = rebuild_error(failure("c", Strange("odd")))
    assert isinstance(other, journaled.ActorsError)
    assert "Strange: odd" in str(other)
    assert rebuild_error(Failure(correlation="c", error="NoSuchName", message="m")).args


def test_an_executor_stopped_from_outside_still_answers_its_run(sqlite_url: str) -> None:
    """A2/A4: a run whose executor is stopped from outside fails its handle instead of hanging."""
    with journaled.open(sqlite_url) as rt:
        release = threading.Event()
        rt.register_tool("slow", lambda x: release.wait(WAIT) and x)
        handle = rt.start(journaled.Plan(goal="g", steps=[journaled.Step("a", tool="slow")]))
        executors = pykka.ActorRegistry.get_by_class(Executor)
        assert len(executors) == 1
        executors[0].stop()
        with pytest.raises(RuntimeError, match="stopped before the run did"):
            handle.result(timeout=WAIT)
        release.set()


def test_closing_an_inbox_fails_the_replies_still_awaited() -> None:
    """A4/R3: nobody waits forever on a closed runtime: awaited replies fail with RuntimeClosed."""
    directory = Directory()
    inbox = Inbox(directory, "caller")
    _, future = inbox.expect()
    inbox.close()
    with pytest.raises(journaled.RuntimeClosed):
        future.result(0)
