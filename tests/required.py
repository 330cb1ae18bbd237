"""What a test needs from the machine: a skip where it is missing, a failure where CI needs it."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def unavailable(need: str, reason: str) -> NoReturn:
    """Skip with ``reason``, or fail when ``$JOURNALED_TEST_REQUIRE_<NEED>`` is set (as CI does).

    Args:
        need: ``POSTGRES``, ``BROWSER``, ``NAMESPACES`` (a PID namespace: ``unshare``) or
            ``CHATTR`` (``chattr``, to make a journal's file immutable).
        reason: What is missing and how to get it.
    """
    if os.environ.get(f"JOURNALED_TEST_REQUIRE_{need}"):
        pytest.fail(f"{reason} (required here: $JOURNALED_TEST_REQUIRE_{need} is set)")
    pytest.skip(reason)
