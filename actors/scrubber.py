"""Scrub erased bytes out of the journal's files, now if it can, in the background if not (M10).

A purge is final once its transaction commits: the text is gone from every table and no read
returns it (R2). Removing the bytes from the files as well (a checkpoint of SQLite's write-ahead
log, a ``VACUUM FULL`` on PostgreSQL) has to wait for readers that still hold older data — a
backup, a report — so it is cleanup, never part of the purge: attempts that give way to readers
and writers for a short grace (readers about to finish), then retries on a thread with a growing
pause until one succeeds or the runtime closes. ``rt.memory.scrub()`` tries again on demand.

What is owed lives in the journal, not here: each erasure counts itself in its own transaction
and a successful scrub records how far it reached (``Journal.scrub_debt``). A process killed
between a purge's commit and its scrub therefore leaves a debt that the next runtime to open the
journal — in any process — finds and scrubs in the background (:meth:`Scrubber.resume`).

Files beside the journal that erasures reach (the vector cache, ADR 0048) join with
:meth:`Scrubber.include`: every attempt scrubs them too, and what they owe counts as pending.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from journaled.actors.errors import ScrubPending
from journaled.events.errors import JournalFull, JournalReadOnly
from journaled.events.journal import Journal

__all__ = ["Scrubbable", "Scrubber"]

log = logging.getLogger("journaled.memory")

GRACE = 1.0
"""Seconds a purge's caller gives short-lived readers to let go before the scrub goes to the
background. Only that caller waits: the memory writer and other connections' writes go on."""
_FIRST_PAUSE = 0.05
_LONGEST_PAUSE = 5.0


class Scrubbable(Protocol):
    """A file beside the journal whose erased bytes a scrub removes as well (M10)."""

    @property
    def scrub_pending(self) -> bool:
        """Tell whether erased bytes may still be in the file."""
        ...

    def scrub(self, wait: float) -> bool:
        """Remove them, giving readers up to ``wait`` seconds; False when one held on."""
        ...


class Scrubber:
    """Pay a journal's scrub debt: at once, in the background, on demand and on close."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._beside: list[Scrubbable] = []
        """Files beside the journal that every attempt scrubs too (:meth:`include`)."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._why = "a reader holds old data"
        """Why the last attempt failed, in words for the close's warning."""

    @property
    def pending(self) -> bool:
        """Tell whether erased bytes may still be in the files (an erasure is not scrubbed yet).

        Read from the journal: it includes erasures of other processes, and of processes that
        were killed before their scrub; and from the files beside it, what this process owes them.
        """
        return any(f.scrub_pending for f in self._beside) or self._journal.scrub_debt() > 0

    def include(self, beside: Scrubbable) -> None:
        """Scrub ``beside`` with the journal from now on, and count what it owes as pending."""
        with self._lock:
            self._beside.append(beside)

    def resume(self) -> None:
        """Scrub in the background what earlier processes erased but never scrubbed.

        Called once a runtime has opened; costs one read of a one-row table when nothing is
        owed, and never waits for the scrub.
        """
        try:
            debt = self._journal.scrub_debt()
        except Exception as exc:  # the next purge, scrub or open tries again
            log.warning("could not read the journal's scrub debt: %s", exc)
            return
        if debt:
            log.info("%d erasure(s) not yet scrubbed from the journal's files: scrubbing", debt)
            self._start()

    def after_erasure(self) -> None:
        """Scrub now, giving readers :data:`GRACE` to let go; else retry in the background."""
        if not self._attempt(GRACE):
            self._start()

    def scrub(self, timeout: float) -> None:
        """Scrub now, retrying for up to ``timeout`` seconds.

        Raises:
            ScrubPending: a reader still holds old data; the background retries go on.
            JournalFull: the disk is full (no reader is to blame); the background retries go on.
            JournalReadOnly: the journal's file cannot be written (no reader is to blame); the
                background retries go on.
        """
        deadline = time.monotonic() + timeout
        pause = _FIRST_PAUSE
        while not self._attempt(0.0, loud=True):
            left = deadline - time.monotonic()
            if left <= 0:
                self._start()
                raise ScrubPending(
                    f"erased bytes are still in the journal's files ({self._owed()}): another "
                    "connection (a backup, a report) keeps reading older data; the scrub is "
                    "retried in the background and by the next runtime to open the journal, or "
                    "call rt.memory.scrub() (journaled memory scrub) again once it is done"
                )
            time.sleep(min(pause, left))
            pause = min(pause * 2, _LONGEST_PAUSE)

    def stop(self, timeout: float) -> None:
        """Stop retrying (the journal is closing), after one last attempt if one is pending."""
        try:
            pending = self.pending
        except Exception as exc:
            log.debug("scrub debt unreadable at close: %s", exc)
            pending = False
        if pending and not self._attempt(GRACE):
            log.warning(
                "closing with erased bytes still in the journal's files (%s): the next runtime "
                "to open the journal scrubs them, or run `journaled memory scrub`",
                self._why,
            )
        self._stopped.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _owed(self) -> str:
        try:
            debt = self._journal.scrub_debt()
        except Exception:
            return "the scrub debt could not be read"
        owed = "no purge is recorded as unscrubbed"
        if debt:
            owed = f"{debt} purge{'s' if debt != 1 else ''} not yet scrubbed"
        if any(f.scrub_pending for f in self._beside):
            owed += "; the vector cache's write-ahead log still holds deleted rows"
        return owed

    def _attempt(self, wait: float, *, loud: bool = False) -> bool:
        """Scrub once; False when it could not be done yet. ``loud``: a full disk, or a file
        that cannot be written, is raised."""
        beside = True
        for file in list(self._beside):
            try:
                done = file.scrub(wait)
            except Exception as exc:  # a full disk, a read-only file: the journal's attempt tells
                log.debug("scrub of a file beside the journal not done yet: %s", exc)
                done = False
            if not done:
                self._why = "a reader holds old data of the vector cache"
                beside = False
        try:
            self._journal.scrub(wait)
        except (JournalFull, JournalReadOnly) as exc:
            full = isinstance(exc, JournalFull)
            self._why = "the disk is full" if full else "the journal's file cannot be written"
            if not loud:
                return False
            self._start()
            raise
        except Exception as exc:
            self._why = "a reader holds old data"
            log.debug("scrub not done yet: %s", exc)
            return False
        return beside

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stopped.is_set():
                self._thread = threading.Thread(
                    target=self._retry, name="journaled-scrubber", daemon=True
                )
                self._thread.start()
            else:
                self._wake.set()

    def _retry(self) -> None:
        pause = _FIRST_PAUSE
        while not self._stopped.is_set():
            try:
                pending = self.pending
            except Exception as exc:  # a dropped connection: look again after the pause
                log.debug("scrub debt unreadable: %s", exc)
                pending = True
            if pending:
                if self._attempt(0.0):
                    pause = _FIRST_PAUSE
                    continue
                self._stopped.wait(pause)
                pause = min(pause * 2, _LONGEST_PAUSE)
                continue
            self._wake.wait()
            self._wake.clear()
