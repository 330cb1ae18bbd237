"""Errors raised by the live layer.

::

    ActorsError
    ├── InvalidFact (ValueError)              a remember request that cannot be stored
    │   └── OrganizationNotConfigured         remembering into ``organization`` without one
    ├── ActorTimeout (TimeoutError)           an actor did not answer in time
    ├── RunNotFound (KeyError)                no run with that id in the journal
    ├── RuntimeClosed (RuntimeError)          the runtime is closing: it takes no new work
    ├── RunNotResumable (ValueError)          finished, running here, or bad answers/options
    │   └── RunOwnedElsewhere                 another live process executes the run
    └── RunNotPurgeable (ValueError)          not finished, or its content is stored inline
"""

from __future__ import annotations


class ActorsError(Exception):
    """Root of every error the live layer raises."""


class InvalidFact(ActorsError, ValueError):
    """A remember request that cannot be stored; nothing was appended."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        super().__init__(f"cannot remember this fact: {field} {problem}")


class OrganizationNotConfigured(InvalidFact):
    """The ``organization`` scope was asked for, but no organization is configured."""

    def __init__(self) -> None:
        super().__init__(
            "scope",
            "is 'organization', but the organization scope is not configured: pass "
            'organization="acme" to journaled.open() or set JOURNALED_ORGANIZATION',
        )


class ActorTimeout(ActorsError, TimeoutError):
    """An actor did not answer within its timeout (it may be stuck in user code)."""


class RunNotFound(ActorsError, KeyError):
    """No run with that id in this journal."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "run not found"


class RuntimeClosed(ActorsError, RuntimeError):
    """The runtime is closing or closed: it starts no run; runs it had are suspended (R3)."""


class MemoryBehind(ActorsError):
    """Memory's projection is being rebuilt from the journal, or could not be yet: a read would
    answer from part of it (ADR 0053). The door asks the writer to rebuild and reads again."""


class RememberInterrupted(ActorsError):
    """The caller that was storing this remember with others in one commit was interrupted before
    it could tell the outcome: the fact may or may not be stored (ADR 0055); look for it before
    remembering it again."""


class RunNotResumable(ActorsError, ValueError):
    """The run cannot be resumed as asked (finished, running here, or bad answers/options)."""


class RunOwnedElsewhere(RunNotResumable):
    """Another process executes this run (it appended first, or its owner is alive)."""


class RunNotPurgeable(ActorsError, ValueError):
    """The run's content cannot be erased now; nothing was appended (R2, ADR 0018)."""


class ScrubPending(ActorsError):
    """Erased bytes are still in the journal's files: a reader kept old data past the wait."""
