"""Addresses: how actors and callers find each other, and how replies find their askers (A4).

Messages never hold a live object (ADR 0024). An actor that must answer later is given an address
(``reply_to``, a string) and a correlation id; it tells its answer — a tagged reply message that
repeats the correlation id — to that address through the runtime's :class:`Directory`. An address
names a mailbox: an actor of this runtime, an :class:`Inbox` through which a caller's thread (or
event loop) waits for its answers, or anything a foreign system registers with a ``tell`` method.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import queue
import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any, Protocol

import pykka

from journaled.actors import errors as actor_errors
from journaled.events import errors as event_errors
from journaled.events.messages import Failure

__all__ = [
    "CountingInbox",
    "Directory",
    "Inbox",
    "Mailbox",
    "as_answered",
    "failure",
    "quick_inbox",
    "rebuild_error",
]

log = logging.getLogger("journaled.directory")


class Mailbox(Protocol):
    """Anything that takes messages: a pykka actor ref, an inbox, a foreign system's adapter."""

    def tell(self, message: Any) -> None:
        """Take one message; never block for long."""


def quick_inbox() -> queue.SimpleQueue[Any]:
    """Return an actor inbox for the per-step hand-offs (executor, step workers).

    pykka's default ``queue.Queue`` takes a Python ``Condition`` per put and get (a fresh lock
    per waiter, a notify per put); ``SimpleQueue`` does both in C, and its blocked ``get`` wakes
    from one semaphore release. A step of a chain crosses two inboxes, so this is on the path of
    every step. The inbox is unbounded either way, and ``put``, ``get`` and ``empty`` are all
    that pykka uses of it.
    """
    return queue.SimpleQueue()


class CountingInbox(queue.SimpleQueue[Any]):
    """An actor inbox in C, as :func:`quick_inbox`, that counts what is put into it, so that a
    thread doing the actor's work in its place can tell whether a message waits: the executor's
    (ADR 0043), the memory writer's and the scope actors' (ADR 0053, 0054)."""

    def __init__(self) -> None:
        super().__init__()
        self._count = threading.Lock()
        self.puts = 0
        """Messages put so far, pykka's stop included; counted before each is queued."""

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Count the message, then queue it."""
        with self._count:
            self.puts += 1
        super().put(item, block, timeout)


class Directory:
    """The mailboxes of one runtime, by address. Thread-safe.

    Addresses are ``<runtime>/<kind>/<name>`` strings: a runtime's addresses never collide with
    another runtime's in the same process, and a message that names one can be sent anywhere.
    """

    def __init__(self, name: str | None = None) -> None:
        self.name = name or f"rt-{os.getpid()}-{os.urandom(4).hex()}"
        self._boxes: dict[str, Mailbox] = {}
        self._lock = threading.Lock()

    def address(self, *parts: str) -> str:
        """Return the address of ``parts`` within this runtime."""
        return "/".join((self.name, *parts))

    def register(self, address: str, mailbox: Mailbox) -> None:
        """Give ``mailbox`` the address; an address already taken is an error."""
        with self._lock:
            if address in self._boxes:
                raise ValueError(f"address {address!r} is taken")
            self._boxes[address] = mailbox

    def unregister(self, address: str, mailbox: Mailbox | None = None) -> None:
        """Free an address (only if it still names ``mailbox``, when one is given)."""
        with self._lock:
            if mailbox is None or self._boxes.get(address) is mailbox:
                self._boxes.pop(address, None)

    def lookup(self, address: str) -> Mailbox | None:
        """Return the mailbox at an address, or None."""
        with self._lock:
            return self._boxes.get(address)

    def tell(self, address: str | None, message: Any) -> bool:
        """Deliver a message; False when nobody is at that address any more (it is dropped).

        A reply to an asker that gave up or stopped is dropped the same way a message to a stopped
        actor is: the sender never fails because of its receiver.
        """
        if address is None:
            return False
        box = self.lookup(address)
        if box is None:
            return False
        try:
            box.tell(message)
        except pykka.ActorDeadError:
            self.unregister(address, box)
            return False
        except Exception:  # a foreign mailbox's failure is its own, never its sender's
            log.warning("the mailbox at %s failed to take a message; it is dropped", address)
            log.debug("why the mailbox failed", exc_info=True)
            return False
        return True

    def addresses(self) -> list[str]:
        """Return every address registered now (for diagnostics)."""
        with self._lock:
            return sorted(self._boxes)


class Inbox:
    """A caller's mailbox: each expected reply completes the future of its correlation id.

    The reply message itself is the future's result; a :class:`Failure` reply completes it with the
    error it describes, rebuilt. Futures stay in this process: only the address and the
    correlation id travel in messages.
    """

    def __init__(self, directory: Directory, name: str) -> None:
        self.directory = directory
        self.address = directory.address(name)
        self._pending: dict[str, Future[Any]] = {}
        self._lock = threading.Lock()
        self._count = 0
        directory.register(self.address, self)

    def expect(self, correlation: str | None = None) -> tuple[str, Future[Any]]:
        """Return a fresh correlation id (or ``correlation``) and the future its reply completes."""
        future: Future[Any] = Future()
        with self._lock:
            if correlation is None:
                self._count += 1
                correlation = f"c{self._count}"
            if correlation in self._pending:
                raise ValueError(f"correlation {correlation!r} is already awaited")
            self._pending[correlation] = future
        return correlation, future

    def forget(self, correlation: str) -> None:
        """Stop expecting a reply (the caller gave up): a late reply is dropped."""
        with self._lock:
            self._pending.pop(correlation, None)

    def tell(self, message: Any) -> None:
        """Complete the future the message answers; drop a reply nobody waits for."""
        correlation = getattr(message, "correlation", None)
        if not isinstance(correlation, str):
            return
        with self._lock:
            future = self._pending.pop(correlation, None)
        if future is None:
            return
        with contextlib.suppress(InvalidStateError):
            if isinstance(message, Failure):
                future.set_exception(rebuild_error(message))
            else:
                future.set_result(message)

    def close(self) -> None:
        """Free the address and fail every reply still awaited."""
        self.directory.unregister(self.address, self)
        with self._lock:
            pending, self._pending = self._pending, {}
        for future in pending.values():
            with contextlib.suppress(InvalidStateError):
                future.set_exception(
                    actor_errors.RuntimeClosed("the runtime closed before answering")
                )


def failure(correlation: str, exc: BaseException) -> Failure:
    """Describe an error as a reply message: its class by name, its text, its plain attributes.

    The text is the one string the error was raised with when there is one (so a ``KeyError``
    is not quoted twice once rebuilt), else what ``str()`` shows.
    """
    args = exc.args
    message = _text(exc)
    if len(args) == 1 and isinstance(args[0], str) and message in (args[0], repr(args[0])):
        message = args[0]  # KeyError shows its argument quoted: rebuilt from it, it reads the same
    field = getattr(exc, "field", None)
    return Failure(
        correlation=correlation,
        error=type(exc).__name__,
        message=message,
        field=field if isinstance(field, str) else None,
        attributes=_plain_attributes(exc),
    )


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # an error whose __str__ fails still has a name
        return f"{type(exc).__name__} (its message could not be read)"


def _plain_attributes(exc: BaseException) -> dict[str, Any]:
    """Return the error's public attributes that are plain data, lists of it as lists."""
    plain: dict[str, Any] = {}
    for name, value in vars(exc).items() if hasattr(exc, "__dict__") else ():
        if name.startswith("_"):
            continue
        if value is None or isinstance(value, str | int | float | bool):
            plain[name] = value
        elif isinstance(value, list | tuple) and all(
            isinstance(v, str | int) and not isinstance(v, bool) for v in value
        ):
            plain[name] = list(value)
    return plain


_BUILTIN_ERRORS: dict[str, type[Exception]] = {
    name: value
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, Exception)
}


_KNOWN_ERRORS: dict[str, type[Exception]] = {
    **_BUILTIN_ERRORS,
    **{
        name: value
        for module in (event_errors, actor_errors)
        for name, value in vars(module).items()
        if isinstance(value, type) and issubclass(value, Exception)
    },
}
"""The errors a :class:`Failure` is rebuilt as, by class name; any other is an ActorsError."""


def as_answered(exc: Exception) -> Exception:
    """Return the error a caller gets for ``exc`` when it travels as a :class:`Failure`: the same
    error when its class is one rebuilt by name, else the ActorsError :func:`rebuild_error`
    makes of it, so that an answer given on the caller's thread reads as one sent back."""
    if _KNOWN_ERRORS.get(type(exc).__name__) is type(exc):
        return exc
    return rebuild_error(failure("", exc))


def rebuild_error(reply: Failure) -> Exception:
    """Return the exception a :class:`Failure` describes: its class when known, with its text.

    The error is rebuilt without calling its constructor (whose arguments differ per class), so
    ``str(error)`` is the original text and a ``field`` attribute is kept.
    """
    cls = _KNOWN_ERRORS.get(reply.error)
    if cls is None:
        return actor_errors.ActorsError(f"{reply.error}: {reply.message}")
    exc = cls.__new__(cls)
    Exception.__init__(exc, reply.message)
    for name, value in reply.attributes.items():
        with contextlib.suppress(AttributeError, TypeError):
            setattr(exc, name, value)
    if reply.field is not None:
        exc.field = reply.field  # type: ignore[attr-defined]
    return exc
