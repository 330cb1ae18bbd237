"""The memory writer's desk: remembers stored on callers' threads, in groups (ADR 0054, 0055).

Callers remembering at once stand in one line at the desk. The caller at its front leads: it takes
the remembers waiting behind it (up to a group's size, and never two claims of one conflict key)
and has the writer store them in one transaction on its own thread, while the writer is idle;
the others wait for their answers. Remembers that arrive meanwhile wait in line for the next
leader, so under concurrency one commit carries many remembers, without a hop through the
writer's thread or a reply message. When the writer is busy (its inbox holds a message), the
leader's group is handed back unsettled and each caller sends its remember to the actor, which
groups them its own way (ADR 0015).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from journaled.actors.directory import as_answered
from journaled.actors.errors import RememberInterrupted
from journaled.actors.group_commit import Answer
from journaled.actors.scope import UNSETTLED, Unsettled
from journaled.events.memory import Fact
from journaled.events.messages import Remember

__all__ = ["GROUP_MAX", "WriterDesk"]

GROUP_MAX = 256
"""Remembers one leader stores at most in one transaction (as the actor's group, ADR 0015)."""


class Storer(Protocol):
    """What the desk needs of the writer."""

    def remember_here(self, group: Sequence[Remember], answer: Answer) -> bool:
        """Store ``group`` on this thread and answer each remember, if the writer is idle.

        Returns False, answering none, when the writer is busy: its callers send them instead.
        """


class _Seat:
    """One caller's place in line: its remember, then its outcome."""

    __slots__ = ("done", "error", "fact", "group", "message", "taken", "turn", "unsettled")

    def __init__(self, message: Remember) -> None:
        self.message = message
        self.taken = False
        """A leader has it in its group: only that leader settles or removes it now."""
        self.done = False
        self.fact: Fact | None = None
        self.error: Exception | None = None
        self.unsettled = False
        self.group: list[_Seat] | None = None
        """The group this caller took to store, once it leads."""
        self.turn = threading.Lock()
        """Held while the caller waits; released when it leads or is answered."""
        self.turn.acquire()

    def settle(self, fact: Fact | None, error: Exception | None) -> None:
        self.fact, self.error = fact, error

    def outcome(self) -> Fact | Unsettled:
        if self.unsettled:
            return UNSETTLED
        if self.error is not None:
            raise as_answered(self.error)
        assert self.fact is not None
        return self.fact


class WriterDesk:
    """Where callers find the memory writer, and stand in line to store their remembers in
    groups on their own threads while it is idle; the writer takes its place when it starts."""

    def __init__(self, group_max: int = GROUP_MAX) -> None:
        self.writer: Storer | None = None
        self.group_max = group_max
        self._line: deque[_Seat] = deque()
        self._mutex = threading.Lock()
        self._emptied = threading.Condition(self._mutex)
        self._closed = False

    def remember(self, message: Remember) -> Fact | Unsettled:
        """Store ``message`` here, alone or with others, if the writer is idle; else
        :data:`UNSETTLED` (send it to the actor).

        Raises:
            Exception: what the actor would have answered (InvalidFact, JournalBusy, ...), or
                :class:`RememberInterrupted` when the leader storing it was interrupted.
        """
        writer = self.writer
        if writer is None:
            return UNSETTLED
        seat = _Seat(message)
        with self._mutex:
            if self._closed:
                return UNSETTLED
            self._line.append(seat)
            leads = self._line[0] is seat
        try:
            if not leads:
                seat.turn.acquire()
                if seat.done:
                    return seat.outcome()
            group = self._take(seat)
            if not writer.remember_here([s.message for s in group], _answering(group)):
                for s in group:
                    s.unsettled = True
        finally:
            # Also on an interrupt, wherever it lands: a leader always answers its group and
            # hands the lead on; a caller interrupted before it led steps out of line.
            if seat.group is not None:
                self._finish(seat.group)
            elif not seat.done:
                self._leave(seat)
        return seat.outcome()

    def close(self, timeout: float) -> bool:
        """Send every later remember to the actor, and wait up to ``timeout`` seconds for the
        ones in line to be stored (or handed to the actor); return whether the line emptied.

        Memory calls it before it stops the writer, so a remember that came before the close is
        stored, whichever way it went, as the actor stores what it holds when stopped.
        """
        with self._mutex:
            self._closed = True
            return self._emptied.wait_for(lambda: not self._line, timeout)

    def _take(self, leader: _Seat) -> list[_Seat]:
        """Take the group this leader stores: the line's front, in order, up to the group's
        size, stopping before a second claim of one conflict key (it must see the first)."""
        group: list[_Seat] = []
        keys: set[str] = set()
        with self._mutex:
            assert self._line[0] is leader
            for s in self._line:
                # A key that is no string is refused when decided: it must not reach the set.
                key = s.message.conflict_key if isinstance(s.message.conflict_key, str) else None
                if len(group) >= self.group_max or (key is not None and key in keys):
                    break
                if key is not None:
                    keys.add(key)
                group.append(s)
            leader.group = group  # from here on, the leader's finally answers the group
            for s in group:
                s.taken = True
        return group

    def _finish(self, group: list[_Seat]) -> None:
        """Answer the group's callers and hand the lead to the next in line."""
        with self._mutex:
            for s in group:
                assert self._line[0] is s  # a group is the line's front
                self._line.popleft()
                if not s.done:
                    s.done = True
                    if s.fact is None and s.error is None and not s.unsettled:
                        s.error = RememberInterrupted(
                            "the remember's outcome is unknown: the caller storing it with others "
                            "was interrupted (look for the fact before remembering it again)"
                        )
            waiters = group[1:]
            front = self._line[0] if self._line else None
            if front is None:
                self._emptied.notify_all()
        for s in waiters:
            s.turn.release()
        if front is not None:
            front.turn.release()

    def _leave(self, seat: _Seat) -> None:
        """Take an interrupted caller out of line, unless a leader already took its remember;
        if it was at the front, the next in line leads."""
        with self._mutex:
            if seat.taken or seat not in self._line:
                return
            was_front = self._line[0] is seat
            self._line.remove(seat)
            front = self._line[0] if was_front and self._line else None
            if not self._line:
                self._emptied.notify_all()
        if front is not None:
            front.turn.release()


def _answering(group: list[_Seat]) -> Answer:
    by_message = {id(s.message): s for s in group}

    def answer(message: Remember, fact: Fact | None, error: Exception | None) -> None:
        by_message[id(message)].settle(fact, error)

    return answer
