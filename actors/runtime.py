"""Start and stop the live actors of one runtime over one journal."""

from __future__ import annotations

from typing import Any

import pykka

from actors.memory import Clock, MemoryWriter, ScopeActor, ask
from events.journal import Journal
from events.messages import CatchUp, SaveSnapshot

STOP_TIMEOUT = 10.0


class MemoryActors:
    """The scope actors and the writer of one runtime, replayed from the journal on start."""

    def __init__(self, journal: Journal, clock: Clock, organization: str | None) -> None:
        physical = ["user", "project", "repository"]
        if organization is not None:
            physical.append("organization")
        self.scopes: dict[str, Any] = {}
        self.writer: Any = None
        try:
            for name in physical:
                self.scopes[name] = ScopeActor.start(name)
            self.writer = MemoryWriter.start(journal, self.scopes, clock, organization)
            ask(self.writer, CatchUp(initial=True))
        except BaseException:
            self.stop()
            raise

    def catch_up(self) -> int:
        """Fold journal events appended by other writers; return the position reached."""
        position: int = ask(self.writer, CatchUp())
        return position

    def save_snapshot(self, min_events: int) -> bool:
        """Store memory's folded state if at least ``min_events`` were folded since the last."""
        saved: bool = ask(self.writer, SaveSnapshot(min_events=min_events))
        return saved

    def stop(self) -> None:
        """Stop every actor: fire all stops first, then wait on each."""
        refs = [r for r in [self.writer, *self.scopes.values()] if r is not None]
        futures = [ref.stop(block=False) for ref in refs]
        for future in futures:
            try:
                future.get(timeout=STOP_TIMEOUT)
            except pykka.ActorDeadError:
                continue
