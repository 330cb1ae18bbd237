"""``journaled.open()``: one runtime over one journal."""

from __future__ import annotations

import os
from types import TracebackType

from actors.memory import Clock, system_clock
from actors.runtime import MemoryActors
from events.base import Event
from events.codec import Codec
from events.journal import Journal
from events.memory import MEMORY_EVENTS
from events.url import default_url, parse_url
from journaled.errors import ConfigurationError
from journaled.memory import Embedder, Memory

ENV_URL = "JOURNALED_URL"
ENV_ORGANIZATION = "JOURNALED_ORGANIZATION"


def codec() -> Codec:
    """Return a codec for every event type this release stores."""
    return Codec(MEMORY_EVENTS)


class JournalHandle:
    """``rt.journal``: the runtime's view of its journal."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    @property
    def url(self) -> str:
        """Return the journal URL (password masked)."""
        return self._journal.config.url

    def position(self) -> int:
        """Return the global position of the last event (J1)."""
        return self._journal.position()

    def read(self, after: int = 0, upto: int | None = None) -> list[Event]:
        """Return events after ``after`` up to ``upto`` in the journal's global order (J1)."""
        return list(self._journal.read(after=after, upto=upto))


class Runtime:
    """A running journaled runtime: memory actors over one journal. Close it when done."""

    def __init__(
        self,
        url: str | None = None,
        *,
        organization: str | None = None,
        clock: Clock | None = None,
        embedder: Embedder | None = None,
        agents: bool = True,
        create: bool = True,
    ) -> None:
        resolved = url if url is not None else os.environ.get(ENV_URL) or default_url()
        config = parse_url(resolved)
        if organization is None:
            organization = os.environ.get(ENV_ORGANIZATION) or None
        if organization is not None and (
            not isinstance(organization, str) or not organization.strip()
        ):
            raise ConfigurationError(
                f"organization must be a non-empty string, got {organization!r}: pass "
                'organization="acme" to journaled.open() or unset JOURNALED_ORGANIZATION'
            )
        if clock is not None and not callable(clock):
            raise ConfigurationError("clock must be a callable returning epoch milliseconds")
        if embedder is not None and not callable(getattr(embedder, "embed", None)):
            raise ConfigurationError("embedder must have an embed(list[str]) -> list[list[float]]")
        self.organization = organization
        self.agents = agents
        self._journal = Journal(config, codec(), create=create)
        try:
            self._actors = MemoryActors(self._journal, clock or system_clock, organization)
        except BaseException:
            self._journal.close()
            raise
        self.journal = JournalHandle(self._journal)
        self.memory = Memory(
            self._journal,
            self._actors.writer,
            self._actors.scopes,
            clock or system_clock,
            embedder,
            organization,
        )
        self._closed = False

    def refresh(self) -> int:
        """Fold events other processes appended since; return the position reached."""
        return self._actors.catch_up()

    def close(self) -> None:
        """Stop every actor and close the journal. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._actors.stop()
        finally:
            self._journal.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open(
    url: str | None = None,
    *,
    organization: str | None = None,
    clock: Clock | None = None,
    embedder: Embedder | None = None,
    agents: bool = True,
) -> Runtime:
    """Open a runtime over the journal at ``url`` (default ``$JOURNALED_URL``, then the
    embedded SQLite file ``./.journaled/journal.sqlite``), replaying it into the actors."""
    return Runtime(url, organization=organization, clock=clock, embedder=embedder, agents=agents)
