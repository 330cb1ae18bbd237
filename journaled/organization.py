"""The organization a runtime acts for (R1, ADR 0074), as every door resolves and checks it.

Kept apart from the runtime so that the journal-only commands (``runs list``, ``runs follow``)
check it the same way without importing the actors (T4).
"""

from __future__ import annotations

import os

from journaled.errors import ConfigurationError
from journaled.events.inputs import text_problem

ENV_ORGANIZATION = "JOURNALED_ORGANIZATION"


def resolve_organization(organization: object = None) -> str | None:
    """Return the organization a runtime acts for: the one given, else ``JOURNALED_ORGANIZATION``
    (unset or empty: none), checked as every door checks it (R1, ADR 0074).

    Raises:
        ConfigurationError: it is no non-blank printable string of at most 1,024 characters.
    """
    if organization is None:
        organization = os.environ.get(ENV_ORGANIZATION) or None
    if organization is None:
        return None
    if not isinstance(organization, str) or not organization.strip():
        raise ConfigurationError(
            f"organization must be a non-empty string, got {organization!r}: pass "
            'organization="acme" to journaled.open() or unset JOURNALED_ORGANIZATION'
        )
    if "\x00" in organization:  # PostgreSQL's text holds none: the journals would disagree
        raise ConfigurationError(
            f"organization holds a NUL character at index {organization.index(chr(0))}"
        )
    if text_problem(organization, limit=1024):
        raise ConfigurationError(f"organization {text_problem(organization, limit=1024)}")
    return organization
