"""Run ids and the arguments a run is started with: budgets and reserve policies (E7, R5, R6)."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from journaled.events.inputs import int_problem, short
from journaled.events.plan_rules import Reserve

RUN_PREFIX = "run_"


def new_run_id(now: int) -> str:
    """Make a collision-safe, time-ordered run id."""
    return f"{RUN_PREFIX}{now:012x}_{os.urandom(6).hex()}"


def child_run_id(parent_run: str, step_id: str, call: int) -> str:
    """Return the run id of the ``call``-th ``ctx.execute`` of a parent step (R5).

    Derived, not drawn, so a step that runs again finds its child again. It keeps the parent's
    time prefix, so children sort next to their parent.
    """
    digest = hashlib.sha256(f"{parent_run}\0{step_id}\0{call}".encode()).hexdigest()
    stamp = parent_run[len(RUN_PREFIX) : len(RUN_PREFIX) + 12]
    if len(stamp) != 12 or not all(c in "0123456789abcdef" for c in stamp):
        stamp = digest[12:24]
    return f"{RUN_PREFIX}{stamp}_{digest[:12]}"


def policy_name(reserve: Reserve | None) -> str | None:
    """Return how a ``reserve`` policy is journaled: ``module:qualname`` (R6)."""
    if reserve is None:
        return None
    module = getattr(reserve, "__module__", None) or "?"
    name = getattr(reserve, "__qualname__", None)
    if not isinstance(name, str):
        # A callable object (a partial, an instance): named, but not to be imported back.
        name = f"<{type(reserve).__qualname__} object>"
    return f"{module}:{name}"


def find_policy(name: str) -> Reserve | None:
    """Find a journaled ``reserve`` policy by ``module:qualname``; None if it cannot be.

    Only a module this process has already imported is looked in: a journal is data, and a name
    read from it never makes this process import (run) a module it had not loaded itself.
    """
    module_name, _, qualname = name.partition(":")
    if not qualname or "<" in qualname:
        return None  # a lambda or a local function: nothing to find
    found: Any = sys.modules.get(module_name)
    if found is None:
        return None
    for part in qualname.split("."):
        found = getattr(found, part, None)
        if found is None:
            return None
    return found if callable(found) else None


class GivenPolicies:
    """The ``reserve`` policies a runtime was handed, by run (R6, E14).

    A journal names a policy ``module:qualname``, which a lambda or a local function cannot be
    found by again; the runtime that was handed one still holds it, so a resume in that runtime
    costs the run's agent steps the same without being handed it again (as an orchestration's
    planner is kept, ADR 0029). The newest runs are kept, at most :attr:`bound`. Thread-safe.
    """

    def __init__(self, bound: int = 4096) -> None:
        self.bound = bound
        self._given: OrderedDict[str, Reserve] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, run_id: str, reserve: Reserve | None) -> None:
        """Keep the policy a run was started or resumed with."""
        if reserve is None:
            return
        with self._lock:
            self._given[run_id] = reserve
            self._given.move_to_end(run_id)
            while len(self._given) > self.bound:
                self._given.popitem(last=False)

    def find(self, run_ids: Iterable[str | None], name: str) -> Reserve | None:
        """Return the policy named ``name`` that one of these runs was handed here, or None."""
        with self._lock:
            for run_id in run_ids:
                given = self._given.get(run_id) if run_id is not None else None
                if given is not None and policy_name(given) == name:
                    return given
        return None


def argument_error(field: str, message: str) -> ValueError:
    """Return a ValueError that names the argument at fault in ``.field`` too: a refusal told
    by message (``reply.failure``, A4) then carries it as its ``field``."""
    error = ValueError(message)
    error.field = field  # type: ignore[attr-defined]
    return error


def check_budget(name: str, value: object) -> int | None:
    """Return a model-call budget, or raise ValueError naming the argument."""
    if value is None:
        return None
    if int_problem(value, low=0):
        raise argument_error(
            name,
            f"{name} must be a non-negative 64-bit int (model calls) or None, got {short(value)}",
        )
    assert isinstance(value, int)
    return value
