"""An append interrupted inside its transaction (R4, J; a KeyboardInterrupt lands between any
two bytecodes of the main thread: Ctrl-C, a notebook's interrupt): the library's transaction
leaves its connection in an open transaction when the interrupt lands in its enter (after the
BEGIN) or in its exit (before the commit). Every later append of the runtime then failed with
"cannot start a transaction within a transaction", and the file's write lock could stay held."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import pytest
from eventsourcing.sqlite import SQLiteTransaction

import journaled
from journaled.events.journal import _sqlite


class _InterruptedOnce(SQLiteTransaction):
    """The library's transaction, interrupted once where it cannot roll back."""

    where = "enter"
    armed = False

    def __enter__(self) -> Any:
        cursor = super().__enter__()
        if _InterruptedOnce.armed and _InterruptedOnce.where == "enter":
            _InterruptedOnce.armed = False
            raise KeyboardInterrupt  # after the BEGIN, before the with body
        return cursor

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        if exc_val is None and _InterruptedOnce.armed and _InterruptedOnce.where == "exit":
            _InterruptedOnce.armed = False
            raise KeyboardInterrupt  # the rows are inserted, the commit never comes
        super().__exit__(exc_type, exc_val, exc_tb)


@pytest.fixture
def interrupted(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_InterruptedOnce]]:
    """Make the journal's appends use the interruptible transaction."""
    monkeypatch.setattr(_sqlite, "SQLiteTransaction", _InterruptedOnce)
    yield _InterruptedOnce
    _InterruptedOnce.armed = False


@pytest.mark.parametrize("where", ["enter", "exit"])
def test_an_append_interrupted_in_its_transaction_leaves_the_journal_writable(
    sqlite_url: str, interrupted: type[_InterruptedOnce], where: str
) -> None:
    """R4, J: after an interrupted remember, this runtime's next writes succeed, another
    connection can write at once (the lock is not held), nothing of the interrupted append
    is stored, and a fresh open folds what this runtime shows."""
    with journaled.open(sqlite_url) as rt:
        rt.memory.remember("before the interrupt")
        interrupted.where, interrupted.armed = where, True
        with pytest.raises(KeyboardInterrupt):
            rt.memory.remember("interrupted")
        assert not interrupted.armed
        other = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), timeout=0.5)
        try:
            other.execute("BEGIN IMMEDIATE")  # the file's write lock is free
            other.execute("ROLLBACK")
        finally:
            other.close()
        rt.memory.remember("after the interrupt")
        rt.register_tool("echo", lambda x: x)
        assert rt.execute(journaled.Plan(goal="g", steps=[journaled.Step("a", tool="echo")])).ok
        live = sorted(f.text for f in rt.memory.all())
        assert "after the interrupt" in live
        assert "before the interrupt" in live
    with journaled.open(sqlite_url) as fresh:
        assert sorted(f.text for f in fresh.memory.all()) == live
        assert fresh.journal.verify().ok
