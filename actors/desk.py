"""The memory writer's desk: remembers stored on callers' threads, in groups (ADR 0054, 0055).

Callers remembering at once stand in one line at the desk. The caller at its front leads: it takes
the remembers waiting behind it (up to a group's size, and never two claims of one conflict key)
and has the writer store them in one transaction on its own thread, while the writer is idle;
the others wait for their answers. Remembers that arrive meanwhile wait in line for the next
leader, so under concurrency one commit carries many remembers, without a hop through the
writer's thread or a reply message. When the writer is busy (its inbox holds a message), the
leader sends its whole group to the actor, in line order, before it hands the lead on, and each
caller waits for its reply: the actor then stores them in that order, grouped its own way (ADR
0015), and before a stop that comes later.

A leader that finds fewer callers in line than the last group held waits a little for them
first (ADR 0059): the callers a group answers come back at about the same time, but the
leader's own thread, already running, would otherwise lead a group of one, and pay a commit for
one remember, while the others line up behind it.

The line's bookkeeping runs to its end whatever interrupts it (a signal handler raising in the
main thread): an interrupt is held back until the lead is handed on, then raised.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from journaled.actors.directory import as_answered
from journaled.actors.errors import RememberInterrupted
from journaled.actors.group_commit import Answer
from journaled.actors.scope import UNSETTLED, Unsettled
from journaled.events.interrupts import interrupts_deferred
from journaled.events.memory import Fact
from journaled.events.messages import Remember

__all__ = ["GROUP_MAX", "Sent", "WriterDesk"]

H = TypeVar("H")

GROUP_MAX = 256
"""Remembers one leader stores at most in one transaction (as the actor's group, ADR 0015)."""
GATHER_FACTOR = 2.0
"""A leader waits for the last group's callers at most this many times as long as the last
group took to store (ADR 0059): never more than a few commits' worth of waiting."""
GATHER_MAX = 0.002
"""Seconds a leader waits for the last group's callers at most, whatever the last group took."""


class Storer(Protocol):
    """What the desk needs of the writer."""

    def remember_here(self, group: Sequence[Remember], answer: Answer) -> bool:
        """Store ``group`` on this thread and answer each remember, if the writer is idle.

        Returns False, answering none, when the writer is busy: the desk sends them instead.
        """


class Sent(Generic[H]):
    """A remember the desk sent to the writer actor: wait for its reply on ``handle``."""

    __slots__ = ("handle",)

    def __init__(self, handle: H) -> None:
        self.handle = handle


_LEADING = threading.Event()
_LEADING.set()  # the turn of a caller that led at once: a wake-up of it (a set) changes nothing


class _Seat:
    """One caller's place in line: its remember, how to send it, then its outcome."""

    __slots__ = (
        "done",
        "error",
        "fact",
        "group",
        "message",
        "owner",
        "send",
        "sent",
        "taken",
        "turn",
    )

    def __init__(self, message: Remember, send: Callable[[Remember], Any]) -> None:
        self.message = message
        self.send = send
        self.owner = threading.get_ident()
        self.taken = False
        """A leader has it in its group: only that leader settles or removes it now."""
        self.done = False
        self.fact: Fact | None = None
        self.error: Exception | None = None
        self.sent: Sent[Any] | None = None
        self.group: list[_Seat] | None = None
        """The group this caller took to store, once it leads."""
        self.turn = _LEADING
        """Set when the caller leads or is answered (setting it twice is harmless). A caller
        that finds the line empty leads at once and never waits on it: it gets its own event
        only when it lines up behind others (made under the desk's mutex, before any other
        thread can see the seat)."""

    def settle(self, fact: Fact | None, error: Exception | None) -> None:
        self.fact, self.error = fact, error

    def outcome(self) -> Fact | Sent[Any]:
        if self.sent is not None:
            return self.sent
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
        self._grown = threading.Condition(self._mutex)
        """Notified when a caller joins the line: a gathering leader counts it."""
        self._last_group = 1
        """How many remembers the last leader took (ADR 0059)."""
        self._last_took = 0.0
        """Seconds the last leader's group took to store or send."""
        self._closed = False

    def remember(
        self, message: Remember, send: Callable[[Remember], H]
    ) -> Fact | Sent[H] | Unsettled:
        """Store ``message`` here, alone or with others, while the writer is idle.

        ``send`` tells the writer actor a remember and returns what its caller waits on; the
        desk calls it for a group that finds the writer busy, in line order, and returns
        :class:`Sent` with it. :data:`UNSETTLED` (send it yourself): there is no writer, or
        memory is closing.

        Raises:
            Exception: what the actor would have answered (InvalidFact, JournalBusy, ...), or
                :class:`RememberInterrupted` when the leader storing it was interrupted.
        """
        writer = self.writer
        if writer is None:
            return UNSETTLED
        seat = _Seat(message, send)
        try:
            with self._mutex:
                if self._closed or any(s.owner == seat.owner for s in self._line):
                    # Closing, or this thread already waits in line (a signal handler that
                    # remembers): its seat could never lead, so the actor stores it.
                    seat.done = True
                    return UNSETTLED
                self._line.append(seat)
                leads = self._line[0] is seat
                if not leads:
                    seat.turn = threading.Event()
                self._grown.notify()
            if not leads:
                seat.turn.wait()
                if seat.done:
                    return seat.outcome()
            self._gather()
            group = self._take(seat)
            started = time.monotonic()
            # Storing takes the writer's, the journal's and the scopes' locks on this thread,
            # and a send takes the actor's queue's: Ctrl-C waits for them (ADR 0076).
            with interrupts_deferred():
                if not writer.remember_here([s.message for s in group], _answering(group)):
                    for s in group:  # the actor stores them, in line order, before the rest
                        try:
                            s.sent = Sent(s.send(s.message))
                        except Exception as exc:
                            s.error = exc
            self._last_took = time.monotonic() - started
        finally:
            # Also on an interrupt, wherever it lands: a leader answers its group and hands the
            # lead on; a caller interrupted before it led steps out of line.
            # The retry loop is inline: CPython runs a pending signal handler when a function is
            # called, before its ``try``, which would skip the bookkeeping.
            held: BaseException | None = None
            while True:
                try:
                    if seat.group is not None:
                        self._finish(seat.group)
                    elif not seat.done:
                        self._leave(seat)
                    break
                except BaseException as exc:
                    held = held or exc
            if held is not None:
                raise held
        return seat.outcome()

    def close(self, timeout: float) -> bool:
        """Send every later remember to the actor, and wait up to ``timeout`` seconds for the
        ones in line to be stored or sent; return whether the line emptied.

        Memory calls it before it stops the writer, so a remember that came before the close is
        stored, whichever way it went: a group sent to the actor is in its inbox ahead of the
        stop, which stores what it holds first.
        """
        with self._mutex:
            self._closed = True
            self._grown.notify_all()  # a gathering leader leads at once
            return self._emptied.wait_for(lambda: not self._line, timeout)

    def _gather(self) -> None:
        """Wait a little for the last group's callers to line up behind this leader (ADR 0059).

        Only after a group of more than one, while the line is shorter than that group was, and
        for at most :data:`GATHER_FACTOR` times as long as that group took (and
        :data:`GATHER_MAX`): a caller alone never waits, and a group that does not come back
        costs its next leader one short wait, after which it leads as many as are there.
        """
        with self._mutex:
            want = self._last_group
            if want <= 1 or len(self._line) >= want or self._closed:
                return
            bound = min(GATHER_MAX, GATHER_FACTOR * self._last_took)
            self._grown.wait_for(lambda: len(self._line) >= want or self._closed, bound)

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
            self._last_group = len(group)
            leader.group = group  # from here on, the leader's finally answers the group
            for s in group:
                s.taken = True
        return group

    def _finish(self, group: list[_Seat]) -> None:
        """Answer the group's callers and hand the lead on (safe to run again)."""
        with self._mutex:
            for s in group:
                if self._line and self._line[0] is s:  # a group is the line's front
                    self._line.popleft()
                if not s.done:
                    if s.fact is None and s.error is None and s.sent is None:
                        s.error = RememberInterrupted(
                            "the remember's outcome is unknown: the caller storing it with others "
                            "was interrupted (look for the fact before remembering it again)"
                        )
                    s.done = True
        for s in group[1:]:
            s.turn.set()
        self._wake_front()

    def _leave(self, seat: _Seat) -> None:
        """Take an interrupted caller out of line, unless a leader already took its remember,
        and let the front lead if nobody does (safe to run again)."""
        with self._mutex:
            if not seat.taken and seat in self._line:
                self._line.remove(seat)
        self._wake_front()

    def _wake_front(self) -> None:
        """Let the seat at the line's front lead, unless it already leads (its group is taken);
        tell a waiting close when the line is empty."""
        with self._mutex:
            front = self._line[0] if self._line else None
            if front is None:
                self._emptied.notify_all()
        if front is not None and not front.taken:
            front.turn.set()


def _answering(group: list[_Seat]) -> Answer:
    by_message = {id(s.message): s for s in group}

    def answer(message: Remember, fact: Fact | None, error: Exception | None) -> None:
        by_message[id(message)].settle(fact, error)

    return answer
