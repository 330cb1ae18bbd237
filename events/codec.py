"""Encode events to bytes and back with msgspec, upcasting older payloads (J5, J6).

The stored topic is ``<tag>@<version>``. Decoding a current topic is one typed msgspec decode. An
older topic goes through the upcasters registered for it, each rewriting the raw payload from one
version to the next, and then through the typed decode. Schema rules: fields only grow (new fields
get defaults); never rename, retype or reuse a tag; a breaking change is a new version plus an
upcaster from the previous one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from journaled.events.base import DomainEvent
from journaled.events.errors import CorruptEvent, UnknownEventType

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


def tag_of(cls: type[DomainEvent]) -> str:
    """Return the explicit tag of an event class, refusing classes that lack one."""
    tag = cls.__struct_config__.tag
    if not isinstance(tag, str) or tag == cls.__name__:
        raise TypeError(f"{cls.__qualname__} needs an explicit tag=... to be stored")
    return tag


def topic_of(cls: type[DomainEvent]) -> str:
    """Return the stored topic of an event class: ``<tag>@<version>``."""
    return f"{tag_of(cls)}@{cls.version}"


def topics_of(cls: type[DomainEvent]) -> list[str]:
    """Return every topic an event class was ever stored under, oldest first (for filters)."""
    return [f"{tag_of(cls)}@{v}" for v in range(1, cls.version + 1)]


class Codec:
    """Turn domain events into bytes and back. Thread-safe once built."""

    def __init__(self, types: Iterable[type[DomainEvent]]) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._by_topic: dict[str, type[DomainEvent]] = {}
        self._by_tag: dict[str, type[DomainEvent]] = {}
        self._decoders: dict[str, msgspec.msgpack.Decoder[Any]] = {}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        self._raw = msgspec.msgpack.Decoder(dict[str, Any])
        for cls in types:
            tag = tag_of(cls)
            if tag in self._by_tag and self._by_tag[tag] is not cls:
                raise ValueError(f"tag {tag!r} is used by two event types")
            self._by_tag[tag] = cls
            topic = topic_of(cls)
            self._by_topic[topic] = cls
            self._decoders[topic] = msgspec.msgpack.Decoder(cls)

    @property
    def types(self) -> tuple[type[DomainEvent], ...]:
        """Return every event type this codec decodes."""
        return tuple(self._by_tag.values())

    def register_upcaster(self, tag: str, from_version: int, upcaster: Upcaster) -> None:
        """Register a rewrite of ``tag`` payloads from ``from_version`` to ``from_version + 1``."""
        self._upcasters[(tag, from_version)] = upcaster

    def topic(self, event: DomainEvent) -> str:
        """Return the stored topic of an event."""
        return topic_of(type(event))

    def encode(self, event: DomainEvent) -> bytes:
        """Encode an event's payload."""
        if type(event).__struct_config__.tag not in self._by_tag:
            raise TypeError(f"{type(event).__qualname__} is not a registered event type")
        return self._encoder.encode(event)

    def decode(self, topic: str, payload: bytes, position: int | None = None) -> DomainEvent:
        """Decode a stored payload, upcasting it first when an older release wrote it.

        Raises:
            UnknownEventType: no event type or upcaster knows the topic.
            CorruptEvent: the payload does not match its type; the position says where.
        """
        decoder = self._decoders.get(topic)
        try:
            if decoder is not None:
                event: DomainEvent = decoder.decode(payload)
                return event
            return self._upcast(topic, payload, position)
        except msgspec.ValidationError as exc:
            raise CorruptEvent(position, topic, str(exc)) from exc
        except msgspec.DecodeError as exc:
            raise CorruptEvent(position, topic, f"malformed payload: {exc}") from exc

    def _upcast(self, topic: str, payload: bytes, position: int | None) -> DomainEvent:
        tag, _, version_text = topic.rpartition("@")
        cls = self._by_tag.get(tag)
        if cls is None or not version_text.isdigit():
            raise UnknownEventType(position, topic, "no event type of this release has that topic")
        version = int(version_text)
        if version > cls.version:
            raise UnknownEventType(
                position, topic, f"written by a newer release (this one reads up to @{cls.version})"
            )
        raw = self._raw.decode(payload)
        while version < cls.version:
            upcaster = self._upcasters.get((tag, version))
            if upcaster is None:
                raise UnknownEventType(position, topic, f"no upcaster from {tag}@{version}")
            raw = upcaster(raw)
            version += 1
        raw.setdefault("type", tag)
        upcast: DomainEvent = msgspec.convert(raw, cls)
        return upcast
