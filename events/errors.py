"""Errors raised by the log layer.

Every error here derives from :class:`EventsError`; where a builtin fits, it is inherited too, so
callers can catch either::

    EventsError
    ├── JournalUrlError (ValueError)         a journal URL that cannot be used
    │   └── JournalUnreadable                the file or database at the URL is no journal
    ├── JournalClosed (RuntimeError)         the journal was used after close()
    ├── JournalBusy                          another connection held the write lock too long
    ├── JournalFull                          the disk holding the journal is full
    ├── JournalReadOnly                      the journal's file cannot be written
    ├── JournalUnavailable                   the database could not be reached; nothing stored
    │   └── AppendOutcomeUnknown             ... after an append was sent: it may be stored
    ├── ConcurrencyConflict                  another writer appended to a stream first
    ├── CorruptEvent (ValueError)            an undecodable stored event, with its position
    │   └── UnknownEventType                 a stored topic this release does not know
    ├── PlanRejected (ValueError)            a plan that cannot run, naming the step
    ├── ProtocolError (ValueError)           a message that cannot be encoded or decoded (A4)
    └── IndexTorn (RuntimeError)             a view's search index was left half built
"""

from __future__ import annotations

import functools


class EventsError(Exception):
    """Root of every error the log layer raises."""


class JournalUrlError(EventsError, ValueError):
    """A journal URL that names no usable backend."""


class JournalUnreadable(JournalUrlError):
    """The URL names a file or database that cannot be read as a journal (not one, or damaged)."""


class JournalClosed(EventsError, RuntimeError):
    """The journal was used after it was closed."""


class JournalBusy(EventsError):
    """Another connection held the journal's write lock for longer than ``lock_wait``.

    Nothing of the append was stored: the caller may try again once the other writer is done.
    """

    def __init__(self, journal: str, waited: float) -> None:
        self.journal = journal
        self.waited = waited
        super().__init__(
            f"journal {journal} is busy: another connection held its write lock for "
            f"{waited:.3g}s, so nothing was appended. Try again once that writer is done (a "
            "backup, a VACUUM, a transaction left open in a sqlite3 or psql shell, or a "
            "LOCK TABLE), or give journaled.open() a longer lock_wait="
        )

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuilt from its fields: the default rebuilds from ``args``, the one message.
        return (type(self), (self.journal, self.waited))


class JournalFull(EventsError):
    """The disk (or tablespace) holding the journal is full: nothing of the write was stored.

    Everything stored before stays as it was; once space is freed, the same call can be made
    again, and a run it stopped is resumed by ``rt.resume(run_id)`` (its steps that succeeded
    do not run again).
    """

    def __init__(self, journal: str, detail: str) -> None:
        self.journal = journal
        self.detail = detail
        super().__init__(
            f"journal {journal} is out of space ({detail}), so nothing was stored. Free space "
            "where it is kept, then try again: a run it stopped resumes with rt.resume(run_id)"
        )

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuilt from its fields: the default rebuilds from ``args``, the one message.
        return (type(self), (self.journal, self.detail))


class JournalReadOnly(EventsError):
    """The journal's file cannot be written (read-only, immutable, a read-only mount): nothing of
    the write was stored (ADR 0081 update).

    Everything stored before stays as it was and can still be read; once the file can be
    written again, the same call can be made again, and a run it stopped is resumed by
    ``rt.resume(run_id)``.
    """

    def __init__(self, journal: str, detail: str) -> None:
        self.journal = journal
        self.detail = detail
        super().__init__(
            f"journal {journal} cannot be written ({detail}), so nothing was stored. Make the "
            "file writable by this user (its permissions, attributes or mount), then try again: "
            "a run it stopped resumes with rt.resume(run_id)"
        )

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuilt from its fields: the default rebuilds from ``args``, the one message.
        return (type(self), (self.journal, self.detail))


class JournalUnavailable(EventsError):
    """The journal's database could not be reached for the whole wait: nothing was appended
    (``read``: the call was a read).

    Everything stored before stays as it was; the same call can be made again once the database
    is back.
    """

    def __init__(
        self, journal: str, waited: float, detail: str, *, read: bool = False, busy: int = 0
    ) -> None:
        self.journal = journal
        self.waited = waited
        self.detail = detail
        self.read = read
        """A read failed (nothing was to be appended)."""
        self.busy = busy
        """The size of this process's connection pool, when every connection in it stayed in
        use for the whole wait (0 otherwise): the database may be there, connections were short."""
        super().__init__(self._words())

    def _words(self) -> str:
        outcome = "" if self.read else ", so nothing was appended"
        if self.busy:
            return (
                f"journal {self.journal} had no free connection for {self.waited:.3g}s: each of "
                f"this process's {self.busy} pooled connections stayed in use by its other calls"
                f"{outcome}; try again, or give the URL a larger ?pool_size="
            )
        return (
            f"journal {self.journal} could not be reached for {self.waited:.3g}s ({self.detail})"
            f"{outcome}; try again once the database is back"
        )

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuilt from its fields: the default rebuilds from ``args``, the one message.
        return (
            functools.partial(type(self), read=self.read, busy=self.busy),
            (self.journal, self.waited, self.detail),
        )


class AppendOutcomeUnknown(JournalUnavailable):
    """An append reached the database, the connection was lost before its answer, and the
    database stayed unreachable, so the journal could not look whether it was stored (ADR 0095).

    It was stored whole or not at all. ``appended`` names its events as ``stream@version``; once
    the database is back, a read of those streams tells which. Making the same change again
    before that may store it twice.
    """

    def __init__(
        self,
        journal: str,
        waited: float,
        detail: str,
        appended: list[str],
        fact_id: str | None = None,
    ) -> None:
        self.appended = appended
        self.fact_id = fact_id
        """For a remember: the id the fact has if it was stored."""
        super().__init__(journal, waited, detail)

    def _words(self) -> str:
        shown = ", ".join(self.appended[:3]) + (", ..." if len(self.appended) > 3 else "")
        what = (
            f"a remember (fact {self.fact_id})"
            if self.fact_id is not None
            else f"an append of {len(self.appended)} event(s) ({shown})"
        )
        check = (
            f"rt.memory.get({self.fact_id!r}) tells which once the database is back; "
            "remember it again only if it was not"
            if self.fact_id is not None
            else "read those streams once the database is back before making the same change again"
        )
        return (
            f"journal {self.journal}: {what} was sent, then the connection was lost and the "
            f"database stayed unreachable for {self.waited:.3g}s ({self.detail}), so it is not "
            f"known whether it was stored (whole, or not at all): {check}"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (
            type(self),
            (self.journal, self.waited, self.detail, self.appended, self.fact_id),
        )


class ConcurrencyConflict(EventsError):
    """Another writer appended to one of the streams first; reload, re-decide and append again."""

    def __init__(self, streams: list[str], detail: str) -> None:
        self.streams = streams
        super().__init__(
            f"concurrent append to stream(s) {', '.join(streams) or '?'}: {detail}; "
            "the writer must catch up with the journal and decide again"
        )


class CorruptEvent(EventsError, ValueError):
    """A stored event that cannot be decoded. Carries the journal position and the reason."""

    def __init__(self, position: int | None, topic: str, reason: str) -> None:
        self.position = position
        self.topic = topic
        self.reason = reason
        where = f"at journal position {position}" if position is not None else "(no position)"
        super().__init__(
            f"cannot decode event {where} (topic {topic!r}): {reason}. "
            "The journal was written by an incompatible release or damaged; nothing was skipped."
        )


class UnknownEventType(CorruptEvent):
    """A stored topic that no event type of this release (nor any upcaster) knows."""


class PlanRejected(EventsError, ValueError):
    """A plan that cannot run: names the step and the reason (E1). Nothing ran."""

    def __init__(self, step_id: str | None, reason: str) -> None:
        self.step_id = step_id
        self.reason = reason
        where = f"step {step_id!r}: " if step_id is not None else ""
        super().__init__(f"plan rejected: {where}{reason}")

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuilt from its fields: the default rebuilds from ``args``, the one message.
        return (type(self), (self.step_id, self.reason))


class ProtocolError(EventsError, ValueError):
    """A message that cannot cross the wire: it names the message's tag or msgspec's path (A4)."""


class IndexTorn(EventsError, RuntimeError):
    """Building a deferred search index stopped part way through a fact (ADR 0056): that state
    answers no search. Live memory rebuilds such a scope itself; a view of the past is taken
    again."""


class UnreadableEvent(EventsError, ValueError):
    """An event that would be stored in a form this release cannot read back (a field of the
    wrong type, say): refused before anything of its append was stored (R7)."""

    def __init__(self, stream: str, topic: str, reason: str) -> None:
        self.stream = stream
        self.topic = topic
        self.reason = reason
        super().__init__(
            f"event {topic!r} of stream {stream} would be stored unreadable: {reason}; "
            "nothing was appended"
        )


class AppendRefused(EventsError):
    """An append guarded by ``refuse_after`` found such an event after its position: nothing
    was stored. The caller reads again (what it decided from may be erased) and decides anew."""
