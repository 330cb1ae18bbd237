"""Start and stop the live actors of one runtime over one journal."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import pykka

from journaled.actors.asking import ask
from journaled.actors.clock import Clock
from journaled.actors.desk import WriterDesk
from journaled.actors.directory import Directory
from journaled.actors.errors import ActorTimeout
from journaled.actors.memory import MemoryWriter
from journaled.actors.scope import FoldMark, ScopeActor, ScopeShelf
from journaled.actors.scrubber import Scrubber
from journaled.events.catalog import NOT_MEMORY
from journaled.events.errors import JournalClosed
from journaled.events.journal import Journal
from journaled.events.messages import CatchUp, SaveSnapshot

STOP_TIMEOUT = 10.0
_WAIT_SLICE = 0.25
log = logging.getLogger("journaled.follower")


class MemoryActors:
    """The scope actors and the writer of one runtime, replayed from the journal on start."""

    def __init__(
        self,
        journal: Journal,
        clock: Clock,
        organization: str | None,
        follow: float | None = None,
        directory: Directory | None = None,
    ) -> None:
        self._journal = journal
        self.directory = directory if directory is not None else Directory()
        self.scrubber = Scrubber(journal)
        self._stop_following = threading.Event()
        self._follower: threading.Thread | None = None
        physical = ["user", "project", "repository"]
        if organization is not None:
            physical.append("organization")
        self.scopes: dict[str, Any] = {}
        lock = threading.Condition()
        self.shelves = {name: ScopeShelf(name, lock) for name in physical}
        """Each scope's state where its actor keeps it, for reads in place (ADR 0053)."""
        self.writer: Any = None
        self.desk = WriterDesk()
        """Where a caller stores a remember itself while the writer is idle (ADR 0054)."""
        self.mark = FoldMark()
        """How far the writer has queued its folds: where a read begins (ADR 0062)."""
        try:
            for name in physical:
                self.scopes[name] = ScopeActor.start(self.shelves[name])
            self.writer = MemoryWriter.start(
                journal,
                self.scopes,
                clock,
                organization,
                self.directory,
                self.shelves,
                self.desk,
                self.mark,
            )
            self._known = int(ask(self.writer, CatchUp(initial=True)))
        except BaseException:
            self.stop()
            raise
        if follow is not None:
            self._follower = threading.Thread(
                target=self._follow, args=(follow,), name="journaled-follower", daemon=True
            )
            self._follower.start()
        # After the replay, so that a rewrite of the payload table never holds up the open.
        self.scrubber.resume()

    def _follow(self, interval: float) -> None:
        """Fold what other processes append, polling the log's position every ``interval`` s.

        A fact remembered elsewhere is therefore searchable here within about one interval plus
        the time to fold it — on PostgreSQL sooner, as the library's NOTIFY on every append
        wakes the wait. Errors end the thread only at close; a failed poll is retried.
        """
        while not self._stop_following.is_set():
            try:
                self._wait(interval)
                if self._stop_following.is_set():
                    return
                if self._journal.position() > self._known:
                    self._known = self.catch_up()
            except (ActorTimeout, pykka.ActorDeadError, JournalClosed):
                if self._stop_following.is_set():
                    return
            except Exception:  # a transient database error must not end following for good
                log.exception("following the journal failed; retrying in %ss", interval)
                if self._stop_following.wait(interval):
                    return

    def _wait(self, interval: float) -> None:
        """Wait one interval, in slices so that close() never waits long for this thread."""
        deadline = time.monotonic() + interval
        if self._journal.notifies:
            # Told who appended what: this runtime's own appends and other processes' runs
            # wake nothing, and the interval's end is the poll that covers a lost notice.
            while not self._stop_following.is_set():
                left = deadline - time.monotonic()
                if left <= 0 or self._journal.wait_for_foreign(min(left, _WAIT_SLICE), NOT_MEMORY):
                    return
            return
        # Nothing tells of another process's append here: poll the position each slice, and
        # wait on the stop itself, so that a close (every command-line call's end) never waits
        # out a slice for this thread.
        start = self._journal.position()
        while not self._stop_following.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self._stop_following.wait(min(left, _WAIT_SLICE)):
                return
            if self._journal.position() != start:
                return

    def catch_up(self) -> int:
        """Fold journal events appended by other writers; return the position reached."""
        position: int = ask(self.writer, CatchUp())
        return position

    def save_snapshot(self, min_events: int) -> bool:
        """Store memory's folded state if at least ``min_events`` were folded since the last."""
        saved: bool = ask(self.writer, SaveSnapshot(min_events=min_events))
        return saved

    def stop(self) -> None:
        """Stop following, then the writer, then the scope actors (all at once).

        The writer goes first and alone: what it still has to store is folded into scope actors
        that are alive, so a remember that was stored is never answered with an error.
        """
        self._stop_following.set()
        if self._follower is not None:
            self._follower.join(STOP_TIMEOUT)
        self.scrubber.stop(STOP_TIMEOUT)
        self.desk.close(STOP_TIMEOUT)  # remembers in line are stored (or sent) first
        if self.writer is not None:
            with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
                self.writer.stop(timeout=STOP_TIMEOUT)
        refs = list(self.scopes.values())
        futures = [ref.stop(block=False) for ref in refs]
        for future in futures:
            try:
                future.get(timeout=STOP_TIMEOUT)
            except pykka.ActorDeadError:
                continue
