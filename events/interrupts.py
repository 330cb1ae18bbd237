"""Keep Ctrl-C out of a section that holds locks on the main thread (R4, ADR 0076).

CPython raises KeyboardInterrupt on the main thread between any two bytecodes, also right after
a lock's ``acquire`` returned and before the ``try`` that would release it: in a
``Condition``'s ``__enter__``, a pool's checkout, a non-blocking ``acquire``. A lock left held
there is held for good, and every later remember, append or read waiting on it hangs. A
remember stored on the caller's thread (ADR 0054) and a read in place (ADR 0053) take such
locks on whatever thread calls, the main one included.

:class:`interrupts_deferred` holds a SIGINT that arrives meanwhile and hands it, once the
section is left and its locks are released, to the handler that was installed: the default one
raises KeyboardInterrupt there; a program's own handler runs there, on a consistent state.

A section knows itself by the frame that opened it. Another signal whose handler raises can
still cut a section's ``__exit__`` short (CPython runs a pending handler as a function is
entered): the holding handler then finds that frame gone from the stack when SIGINT comes, puts
the program's handler back and hands it the signal at once, so Ctrl-C is never swallowed.
"""

from __future__ import annotations

import importlib
import signal
import sys
import threading
from types import FrameType
from typing import Any

__all__ = ["heal", "interrupts_deferred"]

# The C functions under the ``signal`` module: its own wrappers convert every handler to and
# from an enum (a failed ``Handlers(value)`` lookup for each Python handler), which made a
# section cost ~9 µs on the main thread against ~1 µs. They take and give the same handlers;
# the defaults come back as the plain ints 0 (SIG_DFL) and 1 (SIG_IGN).
_c_signal: Any = importlib.import_module("_signal")
_SIGINT = int(signal.SIGINT)
_DEFAULT, _IGNORED = int(signal.SIG_DFL), int(signal.SIG_IGN)


def _is(handler: Any, number: int) -> bool:
    """Tell whether a handler is the default (0) or ignoring (1) one, an enum or an int."""
    return isinstance(handler, int) and handler == number


class _Hold:
    """The SIGINT handler of an open section: notes the signal, or heals if the section is gone."""

    __slots__ = ("frame", "held", "previous")

    def __init__(self, previous: Any, frame: FrameType) -> None:
        self.previous = previous
        self.frame = frame
        self.held: list[tuple[int, FrameType | None]] = []

    def open_in(self, frame: FrameType | None) -> bool:
        """Tell whether the section's frame is on the stack that ``frame`` is the top of."""
        while frame is not None:
            if frame is self.frame:
                return True
            frame = frame.f_back
        return False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.open_in(frame):
            self.held.append((signum, frame))
            return
        # The section ended without restoring (its exit was cut short): heal, then deliver.
        _c_signal.signal(_SIGINT, self.previous)
        _deliver(self.previous, signum, frame)


class interrupts_deferred:
    """Run the ``with`` body with SIGINT held until it ends, on the main thread.

    Elsewhere (no signal reaches another thread's code) and where SIGINT is ignored or not
    handled in Python, the body runs as it is. A section inside another leaves the signal to
    the outer one (installing a handler costs about 5 µs).

    The section is the frame that enters it. A context manager of one's own that enters this
    one from its ``__enter__`` passes ``depth=2``, so that the section is its caller's frame
    and not the ``__enter__`` that returns before the body runs. (A generator-based one cannot
    defer at all: its frame is suspended, off the stack, while the body runs.)
    """

    __slots__ = ("_depth", "_hold")

    def __init__(self, depth: int = 1) -> None:
        self._hold: _Hold | None = None
        self._depth = depth

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        current = _c_signal.getsignal(_SIGINT)
        caller = sys._getframe(self._depth)
        if isinstance(current, _Hold):
            if current.open_in(caller):
                return  # inside an open section: it holds the signal
            current = current.previous  # a section whose exit was cut short: take its place
        if current is None or _is(current, _IGNORED):
            return
        hold = _Hold(current, caller)
        _c_signal.signal(_SIGINT, hold)
        self._hold = hold

    def __exit__(self, *exc: object) -> None:
        hold = self._hold
        if hold is None:
            return
        self._hold = None
        _c_signal.signal(_SIGINT, hold.previous)
        if hold.held:
            _deliver(hold.previous, *hold.held[0])


def heal() -> None:
    """Put the program's SIGINT handler back if a section's exit was cut short (main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return
    current = _c_signal.getsignal(_SIGINT)
    while isinstance(current, _Hold) and not current.open_in(sys._getframe(1)):
        current = current.previous
        _c_signal.signal(_SIGINT, current)


def _deliver(handler: Any, signum: int, frame: FrameType | None) -> None:
    """Hand a held signal to the handler that was installed when it came."""
    if _is(handler, _DEFAULT):
        signal.raise_signal(signum)  # the default action: the process ends, as it would have
    elif callable(handler):
        handler(signum, frame)  # the default one raises KeyboardInterrupt here
