"""Where ``async def`` skills, tools and agents run: an event loop, and the tokens that cancel them.

A step worker is a thread; user code written as a coroutine runs on an event loop instead and the
worker waits for it (SPEC A1, ADR 0025). The asyncio runtime runs it on the application's own loop,
so a step can use clients bound to that loop; the synchronous runtime owns a loop in one daemon
thread, started the first time an async step runs. Cancelling the run, or the step's deadline,
sets the step's :class:`StepToken`, which cancels the step's task.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import CancelledError, Future
from typing import Any, TypeVar

from journaled.actors.errors import RuntimeClosed
from journaled.events.plans import CANCELLED_ABORT

__all__ = ["Cancellations", "LoopRunner", "StepCancelled", "StepToken"]

T = TypeVar("T")


class StepCancelled(Exception):
    """An async step's task was cancelled: its run was cancelled or its deadline passed.

    ``reason`` is what set the step's token (:data:`CANCELLED` for a cancel of its run), or
    None when nothing of journaled cancelled it.
    """

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


CANCELLED = "cancelled"
"""A step token's reason when its run was cancelled (E5)."""


class LoopGone(RuntimeClosed):
    """The event loop an async step ran on ended under it (its program's ``asyncio.run``
    returned): the step has no result and runs again when its run is resumed (R3)."""


def _ending(loop: asyncio.AbstractEventLoop, wait: float = 1.0) -> bool:
    """Tell whether ``loop`` stops or closes within ``wait`` seconds of a step's task being
    cancelled by something other than journaled: ``asyncio.run`` closes its loop right after
    cancelling the tasks it leaves."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if loop.is_closed() or not loop.is_running():
            return True
        time.sleep(0.01)
    return loop.is_closed() or not loop.is_running()


class StepToken:
    """One step attempt's cancellation, set by a cancel of its run or by its deadline."""

    def __init__(self) -> None:
        # A flag under a lock, not a threading.Event: one token is made for every step attempt,
        # nothing ever blocks on it, and an Event (a Condition and its lock) costs several times
        # more to build, on the executor's path of every step.
        self._set = False
        self._hooks: list[Callable[[], Any]] = []
        self._lock = threading.Lock()
        self.reason: str | None = None
        """Why it was set first: :data:`CANCELLED` (the run's cancel), ``"deadline"`` or
        ``"suspended"`` (a close or a stop); None while it is not set."""
        self.child: str | None = None
        """The child run the attempt's agent started last (``ctx.execute``), for the
        observation the executor writes when the attempt times out (E9)."""

    def is_set(self) -> bool:
        """Tell whether the step was asked to stop."""
        return self._set

    def set(self, reason: str = CANCELLED) -> None:
        """Ask the step to stop: user code sees ``ctx.cancelled()``; an async step is cancelled.

        ``reason``: why (the first one given is kept).
        """
        with self._lock:
            if self._set:
                return
            self._set = True
            self.reason = reason
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()

    def on_set(self, hook: Callable[[], Any]) -> None:
        """Call ``hook`` when the token is set (at once if it is)."""
        with self._lock:
            if not self._set:
                self._hooks.append(hook)
                return
        hook()


class Cancellations:
    """The tokens of the step attempts running in one runtime, by (run, step, attempt).

    Only the key travels in messages; the executor sets a token, the worker running that attempt
    reads it.
    """

    def __init__(self) -> None:
        self._tokens: dict[tuple[str, str, int], StepToken] = {}
        self._lock = threading.Lock()

    def open(self, run_id: str, step_id: str, attempt: int) -> StepToken:
        """Return the token of a step attempt, making it if needed."""
        key = (run_id, step_id, attempt)
        with self._lock:
            token = self._tokens.get(key)
            if token is None:
                token = self._tokens[key] = StepToken()
            return token

    def close(self, run_id: str, step_id: str, attempt: int) -> None:
        """Forget a step attempt's token (it ended)."""
        with self._lock:
            self._tokens.pop((run_id, step_id, attempt), None)


class LoopRunner:
    """Run coroutines of user code on one event loop, from worker threads.

    Args:
        loop: the loop to run them on (the asyncio runtime's); None: a loop of its own, in a
            daemon thread started on first use and stopped by :meth:`close`.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop
        self._own = loop is None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._running: set[Future[Any]] = set()
        """The tasks of steps running now: closing the runner cancels them."""

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()
                    loop.close()

                self._thread = threading.Thread(target=serve, name="journaled-steps-loop")
                self._thread.daemon = True
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def run(self, awaitable: Awaitable[T], token: StepToken | None = None) -> T:
        """Run ``awaitable`` on the loop and wait for it from this (worker) thread.

        Raises:
            StepCancelled: the token was set and the task cancelled.
            RuntimeError: called from the loop's own thread (it would wait for itself).
        """
        loop = self._running_loop()
        with contextlib.suppress(RuntimeError):
            if asyncio.get_running_loop() is loop:
                _close(awaitable)
                raise RuntimeError(
                    "a step's coroutine cannot be awaited from its own event loop's thread"
                )
        coroutine = _as_coroutine(awaitable)
        try:
            future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, loop)
        except RuntimeError:
            if not loop.is_closed():
                raise
            # The loop ended before this step's turn came (its program's asyncio.run returned
            # while an earlier step ran on a worker thread): the step never ran (R3).
            _never_started(coroutine, awaitable)
            raise LoopGone(_LOOP_GONE) from None
        with self._lock:
            self._running.add(future)
        if token is not None:
            token.on_set(future.cancel)
        try:
            while True:
                try:
                    # Waits as result() does, but returns the coroutine's error (which may be a
                    # TimeoutError of its own) rather than raising it; a cancel wakes it.
                    future.exception(_LOOP_CHECK)
                    break
                except TimeoutError:
                    if loop.is_closed() and not future.done():
                        # Submitted as the loop made its last turn: closing dropped the callback
                        # that would have started the task; nothing will complete the future.
                        _never_started(coroutine, awaitable)
                        raise LoopGone(_LOOP_GONE) from None
            return future.result()
        except _Escaped as escaped:
            raise escaped.original from None
        except (CancelledError, asyncio.CancelledError):
            if token is not None and token.is_set() and token.reason == CANCELLED:
                raise StepCancelled(CANCELLED_ABORT, CANCELLED) from None
            if (token is not None and token.is_set()) or self._closed:
                raise StepCancelled(
                    "cancelled: the step's deadline passed or the runtime closed",
                    None if token is None else token.reason,
                ) from None
            if _ending(loop):
                # The loop's own shutdown cancelled the task (asyncio.run cancels every task
                # left): the program is ending, which is no cancel of the run (R3).
                raise LoopGone(_LOOP_GONE) from None
            raise StepCancelled(
                "the step's coroutine raised CancelledError though nothing cancelled it"
            ) from None
        finally:
            with self._lock:
                self._running.discard(future)

    def in_loop_thread(self) -> bool:
        """Tell whether the caller runs on this runner's loop.

        Such a caller must not block waiting for a run: the run's async steps need that loop.
        """
        loop = self._loop
        if loop is None:
            return False
        try:
            return asyncio.get_running_loop() is loop
        except RuntimeError:
            return False

    def close(self) -> None:
        """Cancel the step tasks still running, and stop the loop this runner owns.

        The runtime closes it after its runs were drained and suspended (R3): a task still
        running belongs to a step whose result is no longer wanted, and its worker must not wait
        for a loop that stops.
        """
        with self._lock:
            self._closed = True
            running, self._running = list(self._running), set()
            loop, thread = self._loop, self._thread
            if self._own:
                self._loop = None
                self._thread = None
        for future in running:
            future.cancel()
        if self._own and loop is not None and thread is not None:
            # Stopped only once the cancelled tasks have run their cleanup: ``run_forever`` runs
            # the callbacks already queued after a stop and no later one, so a stop queued with
            # the cancels would leave a task pending for ever, its CancelledError never thrown.
            loop.call_soon_threadsafe(_stop_once_settled, loop, _SETTLE_WAIT)
            thread.join(5.0)


_LOOP_GONE = (
    "the event loop the step ran on ended under it (its program's asyncio.run returned): the "
    "step runs again when its run is resumed"
)

_LOOP_CHECK = 0.5
"""Seconds between checks, while a step's coroutine runs, that its loop was not closed."""

_SETTLE_WAIT = 2.0
"""Seconds a closing runner's loop waits for its cancelled step tasks to end before it stops."""


def _stop_once_settled(loop: asyncio.AbstractEventLoop, wait: float) -> None:
    """Cancel what still runs on ``loop`` and no cancel reached (a runner's own: only step tasks
    run there), then stop it once they have ended, or after ``wait`` seconds."""
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    if not tasks:
        loop.stop()
        return
    for task in tasks:
        # Only a task no cancel reached yet: a second cancel of one already cancelled would
        # throw into the cleanup it runs now, and cut it short.
        if not task.cancelling():
            task.cancel()
    settled = loop.create_task(asyncio.wait(tasks, timeout=wait))
    settled.add_done_callback(lambda _: loop.stop())


class _Escaped(Exception):
    """A KeyboardInterrupt or SystemExit raised by user code on the loop, carried out of it."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(repr(original))
        self.original = original


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    try:
        return await awaitable
    except (KeyboardInterrupt, SystemExit) as exc:
        # asyncio lets these out of the loop, which would stop it for every later step: they
        # are raised in the thread that waits for this coroutine instead.
        raise _Escaped(exc) from None


def _never_started(coroutine: Coroutine[Any, Any, Any], awaitable: Awaitable[Any]) -> None:
    """Close a step's coroutine that no loop started, and the awaitable it wraps, so Python
    warns of no coroutine never awaited; one a loop started is left to that loop."""
    if inspect.getcoroutinestate(coroutine) == inspect.CORO_CREATED:
        coroutine.close()
        _close(awaitable)


def _close(awaitable: Awaitable[Any]) -> None:
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()
