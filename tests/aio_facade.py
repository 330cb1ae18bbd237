"""Run the synchronous test suites through the asyncio runtime (A1).

:class:`SyncFacade` owns a thread running an event loop and an :class:`journaled.aio.AsyncRuntime`
opened on it; each call of the sync API is forwarded to the async runtime with
``asyncio.run_coroutine_threadsafe`` and waited for. A test written against ``journaled.open``
then exercises the async surface unchanged: ``flavour="aio"`` in :func:`open_runtime`.

Private attributes (``rt._journal``, ``rt.runs._active``) are not part of the async surface: they
are read from the sync runtime underneath.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import weakref
from types import TracebackType
from typing import Any, cast

import journaled
import journaled.aio
from journaled.aio import AsyncJournal, AsyncMemory, AsyncMemoryView, AsyncRunHandle, AsyncRuns

FLAVOURS = ["sync", "aio"]
_WRAPPED = (AsyncMemory, AsyncRuns, AsyncJournal, AsyncRunHandle, AsyncMemoryView)
_PROPERTIES = {"scrub_pending"}
"""Sync properties that are coroutine methods on the async API (they read the journal)."""
_UNDERNEATH = {
    "AsyncRuntime": "_sync",
    "AsyncMemory": "_memory",
    "AsyncRuns": "_runs",
    "AsyncJournal": "_journal",
    "AsyncRunHandle": "_handle",
    "AsyncMemoryView": "_view",
}


class _Loop:
    """An event loop in a thread of its own; :meth:`call` runs a coroutine on it and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=_serve, args=(self.loop,), name="facade-loop")
        self.thread.daemon = True
        self.thread.start()
        # Handles outlive the runtime's close (their result can still be awaited), so the loop
        # stops only once nothing refers to it any more.
        weakref.finalize(self, self.loop.call_soon_threadsafe, self.loop.stop)

    def call(self, awaitable: Any) -> Any:
        async def run() -> Any:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_forever()
    loop.close()


class _Proxy:
    """The sync API of one async object: coroutines are run on the facade's loop."""

    def __init__(self, target: Any, loop: _Loop) -> None:
        self._target = target
        self._loop = loop

    def _wrap(self, value: Any) -> Any:
        if isinstance(value, _WRAPPED):
            return _Proxy(value, self._loop)
        return value

    def __getattr__(self, name: str) -> Any:
        target = self._target
        if name.startswith("_"):
            underneath = getattr(target, _UNDERNEATH[type(target).__name__])
            return getattr(underneath, name)
        value = getattr(target, name)
        if name in _PROPERTIES:
            return self._loop.call(value())
        if not callable(value):
            return self._wrap(value)

        def forward(*args: Any, **kwargs: Any) -> Any:
            result = value(*args, **kwargs)
            if inspect.isawaitable(result):
                result = self._loop.call(result)
            return self._wrap(result)

        return forward

    def __repr__(self) -> str:
        return f"<sync facade of {self._target!r}>"


class SyncFacade(_Proxy):
    """A :class:`journaled.Runtime` look-alike driving a :class:`journaled.aio.AsyncRuntime`."""

    def __init__(self, url: str | None, **options: Any) -> None:
        loop = _Loop()
        try:
            runtime = loop.call(journaled.aio.open(url, **options))
        except BaseException:
            loop.stop()
            raise
        super().__init__(runtime, loop)

    def close(self, drain: float | None = None) -> None:
        """Close the async runtime. Idempotent.

        The loop goes on until the facade and its handles are gone (the application's loop
        outlives a runtime too).
        """
        self._loop.call(self._target.close(drain))

    def __enter__(self) -> SyncFacade:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open_runtime(flavour: str, url: str | None = None, **options: Any) -> journaled.Runtime:
    """Open a runtime with the sync API: the sync runtime, or the facade over the async one."""
    if flavour == "sync":
        return journaled.open(url, **options)
    assert flavour == "aio", flavour
    return cast(journaled.Runtime, SyncFacade(url, **options))
