"""What a remember request must satisfy before anything is decided or appended (M2)."""

from __future__ import annotations

import contextlib
import math

from journaled.actors.errors import InvalidFact, OrganizationNotConfigured
from journaled.events.inputs import MAX_TEXT_BYTES, int_problem, text_problem
from journaled.events.memory import physical_scope
from journaled.events.messages import Remember
from journaled.events.redact import find_secrets

__all__ = ["Validated", "validate_remember"]

_LIMITS = {"text": MAX_TEXT_BYTES, "source": 64 * 1024}
"""UTF-8 bytes a field may hold; scope, domain and conflict key name things (1 KiB)."""


class Validated:
    """What a valid remember request resolves to: its physical scope and its confidence."""

    __slots__ = ("confidence", "physical")

    def __init__(self, physical: str, confidence: float) -> None:
        self.physical = physical
        self.confidence = confidence


_CLEAN_NAMES: dict[str, None] = {}
"""Short names found clean, oldest first (at most :data:`_CLEAN_NAMES_KEPT`): a name refused
for holding a secret is never kept, not even in this process's memory."""
_CLEAN_NAMES_KEPT = 1024


def _names_a_secret(value: str) -> bool:
    """Whether a scope, domain, key or step id holds a secret; the few names a memory sees
    over and over (its scopes, its domains) are scanned once."""
    cacheable = type(value) is str and len(value) <= 128  # a str subclass could equal any
    if cacheable and value in _CLEAN_NAMES:
        return False
    if find_secrets(value):
        return True
    if cacheable:
        if len(_CLEAN_NAMES) >= _CLEAN_NAMES_KEPT:
            # Another thread may take the oldest first.
            with contextlib.suppress(KeyError, StopIteration, RuntimeError):
                del _CLEAN_NAMES[next(iter(_CLEAN_NAMES))]
        _CLEAN_NAMES[value] = None
    return False


def validate_remember(msg: Remember, organization: str | None) -> Validated:
    """Check a remember request; raise :class:`InvalidFact` naming the field and the fix (M2)."""
    if not isinstance(msg.text, str):
        raise InvalidFact("text", f"must be a string, got {type(msg.text).__name__}")
    if not msg.text.strip():
        raise InvalidFact("text", "is empty: give the fact's words")
    if not isinstance(msg.scope, str) or not msg.scope.strip():
        raise InvalidFact("scope", f"must be a non-empty string, got {msg.scope!r}")
    physical = physical_scope(msg.scope)
    if physical == "organization" and organization is None:
        raise OrganizationNotConfigured
    for name in ("domain", "conflict_key", "source", "run_id", "step_id"):
        value = getattr(msg, name)
        if value is not None and not isinstance(value, str):
            raise InvalidFact(name, f"must be a string or None, got {type(value).__name__}")
    if msg.step_id is not None and msg.run_id is None:
        raise InvalidFact("run_id", "is missing: a step_id names a step of a run (P1)")
    for name in ("text", "scope", "domain", "conflict_key", "source", "run_id", "step_id"):
        value = getattr(msg, name)
        problem = None if value is None else text_problem(value, limit=_LIMITS.get(name, 1024))
        if problem:
            raise InvalidFact(name, problem)
    for name in ("scope", "domain", "conflict_key", "run_id", "step_id"):
        value = getattr(msg, name)
        if value is not None and "\x00" in value:
            # They name streams and keys, which PostgreSQL keeps as text: one rule for every
            # backend, so a fact SQLite would take is never refused by another journal.
            raise InvalidFact(name, f"holds a NUL character at index {value.index(chr(0))}")
    for name in ("scope", "domain", "conflict_key", "step_id"):
        value = getattr(msg, name)
        if value is not None and _names_a_secret(value):
            # Scopes, keys, domains and step ids name streams, filters and steps: they cannot
            # be redacted, only refused (M9).
            raise InvalidFact(
                name, "contains what looks like a secret: name the subject, not a credential"
            )
    confidence = 1.0
    if msg.confidence is not None:
        if isinstance(msg.confidence, bool) or not isinstance(msg.confidence, int | float):
            raise InvalidFact(
                "confidence", f"must be a number in [0, 1], got {type(msg.confidence).__name__}"
            )
        if math.isnan(msg.confidence):
            raise InvalidFact("confidence", "is NaN: give a number in [0, 1]")
        confidence = min(1.0, max(0.0, float(msg.confidence)))
    for name in ("valid_from", "valid_until"):
        value = getattr(msg, name)
        problem = None if value is None else int_problem(value, unit="epoch milliseconds (int)")
        if problem:
            raise InvalidFact(name, problem)
    if (
        msg.valid_from is not None
        and msg.valid_until is not None
        and msg.valid_until < msg.valid_from
    ):
        raise InvalidFact(
            "valid_until",
            f"({msg.valid_until}) is before valid_from ({msg.valid_from}): the fact would never "
            "be valid",
        )
    return Validated(physical, confidence)
