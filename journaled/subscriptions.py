"""Journal subscriptions: catch up on the log, then follow new appends, in order (A3, ADR 0026).

``rt.journal.subscribe(after=0, topics=None, name=None)`` returns a :class:`Subscription`: it reads
the journal in bounded pages from ``after``, then waits for appends by this process and others
(:meth:`Journal.wait_for_appends` with a mark: an in-process condition, a watcher of the SQLite
file's ``data_version``, PostgreSQL's NOTIFY) and yields them as they come. A *named* subscription
keeps the position its consumer acknowledged in the journal's database, so a consumer that
restarts resumes after its last ``ack``: delivery is at-least-once (an event handled but not yet
acknowledged when the consumer died comes again).

:class:`AsyncSubscription` is the same for asyncio: its waits run in a thread of its own, so the
event loop never blocks, and cancelling the awaiting task leaves nothing half-consumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import difflib
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable
from concurrent.futures import Future
from itertools import islice
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, Self, TypeVar

import msgspec

from journaled.errors import InvalidArgument
from journaled.events.base import Event
from journaled.events.catalog import STORED_EVENTS
from journaled.events.codec import tag_of, topics_of
from journaled.events.inputs import int_problem, text_problem, timeout_problem
from journaled.events.journal import CONNECTION_LOST, erasures_here

if TYPE_CHECKING:
    from journaled.events.journal import Journal
    from journaled.events.tenancy import Boundary
    from journaled.runtime import JournalHandle

__all__ = [
    "MAX_NAME_BYTES",
    "PAGE",
    "AsyncSubscription",
    "OpeningSubscription",
    "Runner",
    "StoredSubscription",
    "Subscription",
    "check_name",
    "names_of",
    "stored_name",
    "stored_topics",
]

PAGE = 500
"""Most events read from the database at once: catching up holds at most one page in memory."""
MAX_NAME_BYTES = 200
"""Longest subscription name, in UTF-8 bytes."""
_SLICE = 1.0
"""Longest single wait: appends whose wake-up was lost are found by reading again after it."""
log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


class Runner(Protocol):
    """Run a blocking call off the event loop and await its result: an asyncio runtime's
    pool (``journaled.aio``), so its subscriptions' blocking calls share its threads."""

    def __call__(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Awaitable[T]:
        """Run ``fn(*args, **kwargs)`` in a thread; the loop goes on meanwhile."""
        ...


_CONTENDED = 0.05
"""Longest an asyncio wait waits for the lock another consumer's wait holds before looking
whether its task gave it up."""
_GONE = 0.2
"""Wait before reading again when the database could not be reached (a server restart)."""
_FRESH = 0.005
"""Longest a page is delivered from without asking the journal's database whether an erasure
was committed since it was read: another process's purge reaches the rest of a page within it,
this process's at once (R2, ADR 0026 update)."""
_VOUCHED = 0.05
"""Longest the count a wait has just read vouches for the take that follows it: the asyncio
subscription's hop from its waiting thread to the loop may be late by a busy loop's turn; a
take later still reads the count again (ADR 0026 update of 2026-12-08)."""


class StoredSubscription(msgspec.Struct, frozen=True, kw_only=True):
    """A named subscription as the journal's database keeps it."""

    name: str
    """The subscription's name."""
    position: int
    """The last position its consumer acknowledged: a restarted consumer resumes after it."""


_OWNER = "\x1f"
"""Between an organization and a name in the stored key: no name holds it (names are printable)."""


def stored_name(organization: str | None, name: str) -> str:
    """Return the key a name is stored under: each organization names its own (R1, ADR 0077).

    A runtime without an organization keeps the bare name, as every release stored it.
    """
    return name if organization is None else f"{organization}{_OWNER}{name}"


def names_of(organization: str | None, stored: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Keep the stored subscriptions that are ``organization``'s, by the names it gave them."""
    if organization is None:
        return [(key, position) for key, position in stored if _OWNER not in key]
    owner, mine = f"{organization}{_OWNER}", []
    for key, position in stored:
        # The name is what follows the last separator: an organization's own text may hold one.
        if key.startswith(owner) and _OWNER not in key[len(owner) :]:
            mine.append((key[len(owner) :], position))
    return mine


def check_name(name: object) -> str:
    """Return a valid subscription name, or raise naming what is wrong with it.

    Raises:
        InvalidArgument: not a string; empty or blank; longer than :data:`MAX_NAME_BYTES`; holds
            a character that is not printable (a control character, a newline).
    """
    problem = text_problem(name, limit=MAX_NAME_BYTES, empty=False)
    if problem:
        raise InvalidArgument("name", problem)
    assert isinstance(name, str)
    bad = next((c for c in name if not c.isprintable()), None)
    if bad is not None:
        raise InvalidArgument(
            "name", f"holds the unprintable character {bad!r}: use letters, digits and punctuation"
        )
    return name


_TOPICS = {tag_of(cls): tuple(topics_of(cls)) for cls in STORED_EVENTS}


def stored_topics(tags: object) -> tuple[str, ...] | None:
    """Return the stored topics of event tags (every version of each), None for every event.

    A single string is one tag.

    Raises:
        InvalidArgument: ``tags`` is not a list of strings, is empty, or names an unknown tag.
    """
    if tags is None:
        return None
    if isinstance(tags, str):
        tags = [tags]
    if not isinstance(tags, Iterable) or isinstance(tags, bytes | dict):
        raise InvalidArgument("topics", f"must be a list of event tags, got {type(tags).__name__}")
    wanted = list(tags)
    if not wanted:
        raise InvalidArgument("topics", "is empty: pass None to receive every event")
    topics: list[str] = []
    for tag in wanted:
        if not isinstance(tag, str):
            raise InvalidArgument("topics", f"must hold event tags (str), got {type(tag).__name__}")
        if tag not in _TOPICS:
            near = difflib.get_close_matches(tag, _TOPICS, n=3)
            hint = (
                f"did you mean {', '.join(map(repr, near))}?" if near else "see `journaled schema`"
            )
            raise InvalidArgument("topics", f"names an unknown event tag {tag!r}: {hint}")
        topics += _TOPICS[tag]
    return tuple(dict.fromkeys(topics))


class Subscription:
    """Events of one journal in journal order: those after a position, then each new one.

    Iterate it (``for event in sub``: ends when closed), or ``poll(timeout)``. ``ack(position)``
    acknowledges everything delivered up to ``position``; a named subscription stores it in the
    journal's database. ``close()`` may be called from any thread and unblocks a consumer waiting
    in another. One consumer thread at a time.
    """

    def __init__(
        self,
        journal: JournalHandle,
        after: int = 0,
        topics: Iterable[str] | str | None = None,
        name: str | None = None,
    ) -> None:
        """Subscribe to ``journal`` (an ``rt.journal``); see :meth:`JournalHandle.subscribe`.

        Raises:
            InvalidArgument: a bad ``after``, ``topics`` or ``name`` (nothing was stored).
        """
        problem = int_problem(after, low=0)
        if problem:
            raise InvalidArgument("after", problem)
        self.name = None if name is None else check_name(name)
        if topics is not None and not isinstance(topics, str | bytes | dict):
            topics = tuple(topics) if isinstance(topics, Iterable) else topics  # read once
        self._topics = stored_topics(topics)
        self.topics: tuple[str, ...] | None = (
            None if topics is None else tuple([topics] if isinstance(topics, str) else topics)
        )
        # The door's own handle: the subscription reads through its boundary (R1).
        self._journal: Journal = journal._journal
        self._boundary: Boundary = journal._boundary
        self._key = None if self.name is None else journal._stored_name(self.name)
        head = self._journal.position()
        if after > head:
            # Events appended later at positions up to `after` would never be delivered (and a
            # named subscription would store that skip for good): a position from elsewhere.
            raise InvalidArgument(
                "after",
                f"({after}) is past the end of the journal ({head}): give a position it holds",
            )
        start = after
        if self.name is not None:
            # Registered at once (listed by rt.journal.subscriptions()); a larger explicit
            # `after` skips ahead for good, a smaller one never rewinds (ADR 0026).
            assert self._key is not None
            start = self._journal.acknowledge(self._key, after)
        self._acked = start
        self._position = start
        self._cursor = start
        self._buffer: deque[Event] = deque()
        self._erased = (0, 0)
        """The journal's erasure count and this process's erasure mark (:func:`erasures_here`)
        when the buffered events were read, or last found unchanged since."""
        self._checked = 0.0
        """When the database's count was last read (monotonic seconds)."""
        self._vouched = False
        """Set by a wait that has just found the buffer current, for the take that follows it
        (within :data:`_VOUCHED` of the count's read); cleared by a take, or a wait given up."""
        self._lock = threading.Lock()
        self._closed = False
        self._unreachable = False
        """Set while page reads fail on a dropped connection (said once an outage)."""

    @property
    def position(self) -> int:
        """Return the position of the last event delivered (the start before any)."""
        return self._position

    @property
    def acked(self) -> int:
        """Return the last acknowledged position (for a named one: as stored)."""
        return self._acked

    @property
    def closed(self) -> bool:
        """Tell whether :meth:`close` was called."""
        return self._closed

    def poll(self, timeout: float | None = None) -> Event | None:
        """Return the next event, waiting up to ``timeout`` seconds (None: until closed).

        Returns None when the time is up or the subscription is closed.

        Raises:
            CorruptEvent: an event cannot be decoded (J5); its position is in the error.
            JournalClosed: the runtime was closed.
        """
        _check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._ready(left):
                return None
            event = self._take()
            if event is not None:
                return event
            # Another thread took the event this one saw buffered: wait on, until the time.
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def ack(self, position: int) -> None:
        """Acknowledge every event delivered up to ``position`` (A3).

        A named subscription stores it in the journal's database before returning; a restarted
        consumer resumes after it. A position at or before the last acknowledged one is ignored
        (acknowledgements only move forward).

        Raises:
            InvalidArgument: ``position`` is not an int, or is past the last delivered event
                (acknowledging what was never delivered would lose it).
        """
        problem = int_problem(position, low=0)
        if problem:
            raise InvalidArgument("position", problem)
        if position > self._position:
            raise InvalidArgument(
                "position",
                f"{position} was never delivered by this subscription (the last delivered is "
                f"{self._position}): acknowledge only events you have received",
            )
        if position <= self._acked:
            return
        if self._key is None:
            self._acked = position
        else:
            self._acked = self._journal.acknowledge(self._key, position)

    def close(self) -> None:
        """Stop delivering: a consumer waiting in another thread returns. Idempotent."""
        self._closed = True
        self._journal.wake()

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Event:
        event = self.poll(None)
        if event is None:
            raise StopIteration
        return event

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the machinery, shared with AsyncSubscription --------------------------------------------

    def _ready(self, timeout: float | None, given_up: threading.Event | None = None) -> bool:
        """Wait until an event is buffered (True), or the time is up, closed, or ``given_up``.

        ``given_up`` ends this one wait (its task was cancelled): another consumer's wait goes
        on. Never takes an event: whoever waits in a thread that is given up on leaves what it
        read in the buffer for the next call.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._acquire(deadline, given_up):
            return False
        try:
            while True:
                if self._closed or (given_up is not None and given_up.is_set()):
                    return False
                if self._buffer and self._current():
                    self._vouched = True
                    return True
                mark = self._journal.append_mark()  # before reading: no append slips between
                try:
                    if self._buffer:
                        self._refresh()
                        self._unreachable = False
                        continue
                    filled = self._fill()
                    self._unreachable = False
                    if filled:
                        continue
                except CONNECTION_LOST as exc:
                    # The database went away (a server restart, a dropped connection): the
                    # journal is still there, so wait on as for an append, and read again. Said
                    # once an outage, so one that lasts is not mistaken for a quiet journal.
                    if not self._unreachable:
                        self._unreachable = True
                        log.warning("journal unreachable while following (%s): reading again", exc)
                    left = _GONE if deadline is None else min(_GONE, deadline - time.monotonic())
                    if left <= 0:
                        return False
                    self._journal.wait_for_appends(left, since=mark)
                    continue
                left = _SLICE if deadline is None else min(_SLICE, deadline - time.monotonic())
                if left <= 0:
                    return False
                self._journal.wait_for_appends(left, since=mark)
        finally:
            self._lock.release()

    def _acquire(self, deadline: float | None, given_up: threading.Event | None) -> bool:
        """Take the lock another consumer's wait may hold; False: the time is up, or this wait
        was given up meanwhile (its thread then ends within :data:`_CONTENDED`)."""
        while True:
            left = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            if given_up is not None:
                left = _CONTENDED if left < 0 else min(_CONTENDED, left)
            if self._lock.acquire(timeout=left):
                return True
            if given_up is not None and given_up.is_set():
                return False
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def _fill(self) -> bool:
        """Read one page after the cursor; tell whether anything was read (even if hidden)."""
        erased = self._erasures()  # before reading: an erasure between is seen as after it
        page = list(
            islice(
                self._journal.read(after=self._cursor, page=PAGE, topics=self._topics or ()), PAGE
            )
        )
        if not page:
            return False
        self._cursor = page[-1].position
        self._buffer.extend(self._boundary.visible(page))
        self._erased, self._checked = erased, time.monotonic()
        return True

    def _erasures(self) -> tuple[int, int]:
        """Return the journal's erasure count and this process's erasure mark, the mark read
        first: a purge of this process between the two reads is then in the count."""
        here = erasures_here()
        return self._journal.erasures(), here

    def _current(self) -> bool:
        """Tell, without reading the database, whether the buffered events may be delivered:
        no erasure of this process since they were read, and the database's count read within
        :data:`_FRESH` seconds, or :data:`_VOUCHED` for the take after the wait that read it."""
        if erasures_here() != self._erased[1]:
            return False
        age = time.monotonic() - self._checked
        return age < _FRESH or (self._vouched and age < _VOUCHED)

    def _refresh(self) -> None:
        """Read the journal's erasure count; if it moved since the buffered events were read,
        read them again, so content erased meanwhile is delivered as the journal now holds it
        (M10, R2: ``[purged]``, never the erased text)."""
        erased = self._erasures()
        if erased[0] != self._erased[0] and self._buffer:
            first, last = self._buffer[0].position, self._buffer[-1].position
            again = self._journal.read(after=first - 1, upto=last, topics=self._topics or ())
            self._buffer = deque(self._boundary.visible(list(again)))
        self._erased, self._checked = erased, time.monotonic()

    def _take(self) -> Event | None:
        """Take the next buffered event if it may be delivered now without reading the
        database (the caller's loop then waits, which reads again); never blocks on the wait
        of another thread (an asyncio task's, given up)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if not self._buffer or not self._current():
                return None
            self._vouched = False
            event = self._buffer.popleft()
            self._position = event.position
            return event
        finally:
            self._lock.release()

    def _give_up(self, given_up: threading.Event) -> None:
        """End the one wait ``given_up`` was handed to (its task was cancelled): what it vouched
        for is no take's any more."""
        given_up.set()
        self._vouched = False
        self._journal.wake()


class _ClosedOnExit:
    """``async with`` ends in ``await self.aclose()``, which each class defines."""

    aclose: Callable[[], Awaitable[None]]

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class AsyncSubscription(_ClosedOnExit):
    """A :class:`Subscription` for asyncio: ``async for``, ``await poll()``, ``await ack()``.

    Waits and database reads run in a daemon thread, never on the event loop; cancelling the
    task that awaits ``poll`` (or iterates) cancels that wait alone (another task's goes on),
    and no event is lost by it. ``ack`` writes in the asyncio runtime's pool, or on a thread of
    its own, never in the loop's default executor. Build it with ``await
    AsyncSubscription.open(rt.journal, ...)`` on a running loop (the plain constructor reads the
    stored position, which blocks briefly).
    """

    def __init__(
        self,
        journal: JournalHandle,
        after: int = 0,
        topics: Iterable[str] | str | None = None,
        name: str | None = None,
        *,
        run: Runner | None = None,
    ) -> None:
        """Subscribe to ``journal`` with the arguments of :meth:`JournalHandle.subscribe`.

        ``run`` runs :meth:`ack`'s write: an asyncio runtime passes its pool; None, a thread
        of its own per call (never the loop's default executor, the application's).
        """
        self._sync = Subscription(journal, after, topics, name)
        self._run: Runner = _apart if run is None else run

    @classmethod
    async def open(
        cls,
        journal: JournalHandle,
        after: int = 0,
        topics: Iterable[str] | str | None = None,
        name: str | None = None,
        *,
        run: Runner | None = None,
    ) -> AsyncSubscription:
        """Subscribe without blocking the loop: the stored position is read by ``run`` (see
        :meth:`__init__`)."""
        runner = _apart if run is None else run
        return await runner(cls, journal, after, topics, name, run=runner)

    @property
    def name(self) -> str | None:
        """Return the subscription's name (None: not stored)."""
        return self._sync.name

    @property
    def position(self) -> int:
        """Return the position of the last event delivered (the start before any)."""
        return self._sync.position

    @property
    def acked(self) -> int:
        """Return the last acknowledged position."""
        return self._sync.acked

    async def poll(self, timeout: float | None = None) -> Event | None:
        """Return the next event, waiting up to ``timeout`` seconds (None: until closed).

        An event already read is returned at once; otherwise a daemon thread reads and waits
        (a daemon, so that a subscription never closed cannot hold the interpreter at exit).
        """
        _check_timeout(timeout)
        sync = self._sync
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if sync.closed:
                return None
            event = sync._take()
            if event is not None:
                return event
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not await self._wait(left):
                return None
            event = sync._take()
            if event is not None:
                return event
            if deadline is not None and time.monotonic() >= deadline:
                return None

    async def _wait(self, timeout: float | None) -> bool:
        """Wait in a daemon thread until an event is buffered; False: time up or closed."""
        sync = self._sync
        given_up = threading.Event()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()

        def wait() -> None:
            try:
                ready = sync._ready(timeout, given_up)
            except BaseException as exc:  # handed to the awaiting task
                _settle(loop, done, False, exc)
            else:
                _settle(loop, done, ready, None)

        threading.Thread(target=wait, name="journaled-subscription", daemon=True).start()
        try:
            return await done
        except asyncio.CancelledError:
            sync._give_up(given_up)  # this wait alone: another consumer's goes on
            raise

    async def ack(self, position: int) -> None:
        """Acknowledge every event delivered up to ``position`` (stored for a named one)."""
        await self._run(self._sync.ack, position)

    async def aclose(self) -> None:
        """Stop delivering; a task waiting in ``poll`` returns None. Idempotent."""
        self._sync.close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Event:
        event = await self.poll(None)
        if event is None:
            raise StopAsyncIteration
        return event

    async def __aenter__(self) -> Self:
        return self


class OpeningSubscription(_ClosedOnExit, Coroutine[Any, Any, AsyncSubscription]):
    """What ``subscribe`` of an asyncio runtime returns (A3): an async iterator of the
    journal's events, or, awaited, the :class:`AsyncSubscription` itself.

    ``async for e in rt.journal.subscribe()`` and ``async with rt.journal.subscribe() as sub``
    open it on first use; ``sub = await rt.journal.subscribe()`` (every asyncio method is
    awaited, A1), ``asyncio.create_task(rt.journal.subscribe())`` or ``gather`` open it at once.
    It is opened once, in the runtime's pool (never on the loop), whichever task asks first; a
    task cancelled while it opens does not cancel the opening for the others; a bad argument is
    raised where it is used; :meth:`aclose` closes it, at once or as soon as it is open.
    """

    def __init__(self, opener: Callable[[], Awaitable[AsyncSubscription]]) -> None:
        self._opener = opener
        self._opened: asyncio.Future[AsyncSubscription] | None = None
        self._closed = False
        self._driven: Coroutine[Any, Any, AsyncSubscription] | None = None

    def _open(self) -> asyncio.Future[AsyncSubscription]:
        if self._opened is None:
            self._opened = asyncio.ensure_future(self._opener())
            self._opened.add_done_callback(self._close_if_closed)
        return self._opened

    async def _subscription(self) -> AsyncSubscription:
        # Shielded: a waiter cancelled while it opens leaves the opening to the others.
        return await asyncio.shield(self._open())

    def _close_if_closed(self, opened: asyncio.Future[AsyncSubscription]) -> None:
        if self._closed and not opened.cancelled() and opened.exception() is None:
            opened.result()._sync.close()

    # -- awaited, or driven as a coroutine (create_task, gather) -------------------------------

    def __await__(self) -> Generator[Any, None, AsyncSubscription]:
        return self._subscription().__await__()

    def _coroutine(self) -> Coroutine[Any, Any, AsyncSubscription]:
        if self._driven is None:
            self._driven = self._subscription()
        return self._driven

    def send(self, value: Any) -> Any:
        return self._coroutine().send(value)

    def throw(self, *args: Any) -> Any:
        return self._coroutine().throw(*args)

    def close(self) -> None:
        if self._driven is not None:
            self._driven.close()

    # -- iterated, or entered --------------------------------------------------------------------

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Event:
        sub = await self._subscription()
        if self._closed:
            raise StopAsyncIteration
        return await sub.__anext__()

    async def __aenter__(self) -> AsyncSubscription:
        return await self._subscription()

    async def aclose(self) -> None:
        """Stop delivering (see :meth:`AsyncSubscription.aclose`); one still opening is closed
        as soon as it is open, so none is left following the journal. Idempotent."""
        self._closed = True
        opened = self._opened
        if opened is not None and opened.done():
            self._close_if_closed(opened)


async def on_own_thread(
    call: Callable[[], T], name: str, loop: asyncio.AbstractEventLoop | None = None
) -> T:
    """Run ``call`` on a thread of its own, named ``name``, and await its result: never the
    loop's default executor (the application sizes and fills that one), nor a pool whose workers
    the call may be waiting for."""
    done: Future[T] = Future()

    def work() -> None:
        try:
            done.set_result(call())
        except BaseException as exc:  # handed to the awaiting task, raised there
            done.set_exception(exc)

    threading.Thread(target=work, name=name).start()
    return await asyncio.wrap_future(done, loop=loop)


async def _apart(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn`` on a thread of its own (:func:`on_own_thread`); the caller's context variables
    go along."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await on_own_thread(call, "journaled-subscription-call")


def _check_timeout(timeout: object) -> None:
    """Refuse a poll timeout that is not None nor a non-negative number (NaN included)."""
    problem = timeout_problem(timeout)
    if problem:
        raise InvalidArgument("timeout", problem)


def _settle(
    loop: asyncio.AbstractEventLoop,
    done: asyncio.Future[bool],
    ready: bool,
    error: BaseException | None,
) -> None:
    """Hand a wait's outcome to the loop, unless its task gave up or the loop is gone."""

    def settle() -> None:
        if done.done():  # cancelled meanwhile: what was read stays buffered
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(ready)

    with contextlib.suppress(RuntimeError):  # the loop was closed meanwhile
        loop.call_soon_threadsafe(settle)
