"""Run a call in a thread and keep what it returned or raised, for tests that race threads."""

from __future__ import annotations

import threading
from typing import Any


def in_thread(fn: Any, *args: Any, **kwargs: Any) -> tuple[threading.Thread, list[Any]]:
    """Run ``fn`` in a started thread; the list receives its result or the exception it raised."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(fn(*args, **kwargs))
        except BaseException as exc:  # the test asserts on it
            out.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, out
