"""The base types every stored event and every journal read shares.

A *domain event* is a past-tense fact about one stream (``FactRemembered``, ``FactSuperseded``): a
frozen, keyword-only msgspec Struct with an explicit tag. The tag and the class's ``version`` form
the stored topic (``memory.fact-remembered@1``), so moving or renaming a class never breaks an old
journal. An :class:`Event` is what reading the journal gives back: the domain event with the stream
it belongs to, its version in that stream and its global position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Self

import msgspec

PURGED = "[purged]"
"""What erased run content reads as once its payload is gone (ADR 0018)."""


class Unpackable(msgspec.Struct, frozen=True):
    """A value SPEC also describes as a tuple of its fields, in their order: it unpacks
    (``primary, relationships = rt.memory.delete(id)``), indexes, and equals that tuple, while
    keeping its names and encoding as a Struct (ADR 0099)."""

    def __iter__(self) -> Iterator[Any]:
        return iter([getattr(self, name) for name in self.__struct_fields__])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, tuple):
            return tuple(self) == other
        if type(other) is type(self):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __len__(self) -> int:
        return len(self.__struct_fields__)

    def __getitem__(self, index: int) -> Any:
        return tuple(self)[index]


class DomainEvent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Base of every stored event. Subclasses set ``tag=`` and may raise ``version``.

    Fields equal to their default are not stored (``omit_defaults``): a default never changes.
    """

    version: ClassVar[int] = 1
    """Schema version of the payload. A breaking change is a new version plus an upcaster."""

    at: int
    """When the event happened, in epoch milliseconds from the runtime's clock."""

    has_content: ClassVar[bool] = False
    """True for events that carry run data (goals, inputs, outputs, errors, questions, answers).
    The journal stores such an event without its content and keeps the whole event as a
    forgettable payload beside it, so that the content can be erased later (ADR 0018)."""

    def map_content(self, f: Callable[[Any], Any]) -> Self:
        """Return this event with ``f`` applied to each content value (None stays None).

        Shape (ids, statuses, times, calls, names) is never passed to ``f``. Events without
        content return themselves.
        """
        return self


def hollow(value: Any) -> Any:
    """Replace a content value by :data:`PURGED` (None stays None): the stored shape."""
    return None if value is None else PURGED


class Pending(msgspec.Struct, frozen=True, kw_only=True):
    """An event about to be appended: its stream and the version it must take there."""

    stream: str
    """Identifier of the stream (one aggregate: a fact, a conflict key, a run)."""
    version: int
    """Version the event takes in its stream, 1 for the first; a taken version is a conflict."""
    data: DomainEvent
    """The event itself."""


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """An event as read back from the journal, in the journal's one global order (J1)."""

    position: int
    """Global position in the journal (the notification id): the journal's clock."""
    stream: str
    """The stream the event belongs to."""
    version: int
    """Version of the event within its stream."""
    data: DomainEvent
    """The decoded (and, for old releases, upcast) event."""

    @property
    def kind(self) -> str:
        """Return the event's tag, e.g. ``memory.fact-superseded``."""
        return str(type(self.data).__struct_config__.tag)
