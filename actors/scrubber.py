"""Scrub erased bytes out of the journal's files, now if it can, in the background if not (M10).

A purge is final once its transaction commits: the text is gone from every table and no read
returns it (R2). Removing the bytes from the files as well (a checkpoint of SQLite's write-ahead
log, a ``VACUUM FULL`` on PostgreSQL) has to wait for readers that still hold older data — a
backup, a report — so it is cleanup, never part of the purge: attempts that give way to readers
and writers for a short grace (readers about to finish), then retries on a thread with a growing
pause until one succeeds or the runtime closes. ``rt.memory.scrub()`` tries again on demand.
"""

from __future__ import annotations

import logging
import threading
import time

from journaled.actors.errors import ScrubPending
from journaled.events.journal import Journal

__all__ = ["Scrubber"]

log = logging.getLogger("journaled.memory")

GRACE = 1.0
"""Seconds a purge's caller gives short-lived readers to let go before the scrub goes to the
background. Only that caller waits: the memory writer and other connections' writes go on."""
_FIRST_PAUSE = 0.05
_LONGEST_PAUSE = 5.0


class Scrubber:
    """Own the pending scrub of one journal and the thread that retries it."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._wanted = 0
        """Erasures asked for; a scrub that began after the last one covers them all."""
        self._done = 0
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> bool:
        """Tell whether erased bytes may still be in the files (a scrub has not yet succeeded)."""
        return self._done < self._wanted

    def after_erasure(self) -> None:
        """Scrub now, giving readers :data:`GRACE` to let go; else retry in the background."""
        with self._lock:
            self._wanted += 1
        if not self._attempt(GRACE):
            self._start()

    def scrub(self, timeout: float) -> None:
        """Scrub now, retrying for up to ``timeout`` seconds.

        Raises:
            ScrubPending: a reader still holds old data; the background retries go on.
        """
        with self._lock:
            self._wanted += 1
        deadline = time.monotonic() + timeout
        pause = _FIRST_PAUSE
        while not self._attempt(0.0):
            left = deadline - time.monotonic()
            if left <= 0:
                self._start()
                raise ScrubPending(
                    "erased bytes are still in the journal's files: another connection (a "
                    "backup, a report) keeps reading older data; the scrub is retried in the "
                    "background, or call rt.memory.scrub() (journaled memory scrub) again once it "
                    "is done"
                )
            time.sleep(min(pause, left))
            pause = min(pause * 2, _LONGEST_PAUSE)

    def stop(self, timeout: float) -> None:
        """Stop retrying (the journal is closing), after one last attempt if one is pending."""
        if self.pending and not self._attempt(GRACE):
            log.warning(
                "closing with erased bytes still in the journal's files (a reader holds old "
                "data): open the journal again and call rt.memory.scrub()"
            )
        self._stopped.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _attempt(self, wait: float) -> bool:
        with self._lock:
            covers = self._wanted
        try:
            self._journal.scrub(wait)
        except Exception as exc:
            log.debug("scrub not done yet: %s", exc)
            return False
        with self._lock:
            self._done = max(self._done, covers)
        return True

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
            if self.pending:
                if self._attempt(0.0):
                    pause = _FIRST_PAUSE
                    continue
                self._stopped.wait(pause)
                pause = min(pause * 2, _LONGEST_PAUSE)
                continue
            self._wake.wait()
            self._wake.clear()
