"""Keep Ctrl-C out of a section that holds locks on the main thread (R4, ADR 0076).

CPython raises KeyboardInterrupt on the main thread between any two bytecodes, also right after
a lock's ``acquire`` returned and before the ``try`` that would release it: in a
``Condition``'s ``__enter__``, a pool's checkout, a non-blocking ``acquire``. A lock left held
there is held for good, and every later remember, append or read waiting on it hangs. A
remember stored on the caller's thread (ADR 0054) and a read in place (ADR 0053) take such
locks on whatever thread calls, the main one included.

:func:`interrupts_deferred` holds a SIGINT that arrives meanwhile and hands it, once the
section is left and its locks are released, to the handler that was installed: the default one
raises KeyboardInterrupt there; a program's own handler runs there, on a consistent state.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

__all__ = ["interrupts_deferred"]


class interrupts_deferred:
    """Run the ``with`` body with SIGINT held until it ends, on the main thread.

    Elsewhere (no signal reaches another thread's code) and where SIGINT is ignored or not
    handled in Python, the body runs as it is. A section inside another is free: the outer one
    holds the signal (installing a handler costs about 5 µs).
    """

    __slots__ = ("_held", "_previous")

    def __init__(self) -> None:
        self._previous: Any = None
        self._held: list[tuple[int, FrameType | None]] | None = None

    def __enter__(self) -> None:
        global _depth  # noqa: PLW0603 - the main thread's nesting, read by the next section
        if threading.current_thread() is not threading.main_thread():
            return
        if _depth:
            _depth += 1
            return
        previous = signal.getsignal(signal.SIGINT)
        if previous is signal.SIG_IGN or previous is None:
            return
        held: list[tuple[int, FrameType | None]] = []
        self._previous, self._held = previous, held
        signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
        _depth = 1

    def __exit__(self, *exc: object) -> None:
        global _depth  # noqa: PLW0603
        if threading.current_thread() is not threading.main_thread() or not _depth:
            return
        _depth -= 1
        if _depth or self._held is None:
            return
        signal.signal(signal.SIGINT, self._previous)
        if self._held:
            _deliver(self._previous, *self._held[0])


_depth = 0
"""How many deferred sections the main thread is in (the outermost holds the signal)."""


def _deliver(handler: Any, signum: int, frame: FrameType | None) -> None:
    """Hand a held signal to the handler that was installed when it came."""
    if handler is signal.SIG_DFL:
        signal.raise_signal(signum)  # the default action: the process ends, as it would have
    elif callable(handler):
        handler(signum, frame)  # the default one raises KeyboardInterrupt here
