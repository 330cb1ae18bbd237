"""Time and identity for memory: the wall clock in milliseconds, and time-ordered fact ids."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable

__all__ = ["Clock", "new_fact_id", "system_clock"]

Clock = Callable[[], int]
"""Returns the time in epoch milliseconds; tests pass a manual one."""


def system_clock() -> int:
    """Return the wall clock in epoch milliseconds."""
    return time.time_ns() // 1_000_000


FACT_ID_PREFIX = "mem_"
"""How every fact id begins."""


def new_fact_id(now: int) -> str:
    """Make a collision-safe, time-ordered fact id: 64 random bits per millisecond."""
    return f"{_prefix(now)}{os.urandom(8).hex()}"


@functools.lru_cache(maxsize=8)
def _prefix(now: int) -> str:
    # Remembers that follow each other mostly fall in the same millisecond, or the next.
    return f"{FACT_ID_PREFIX}{_base36(now):>09}_"


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    n = max(0, n)
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out
