"""Encode events to bytes and back with msgspec, upcasting older payloads (J5, J6).

The stored topic is ``<tag>@<version>``. The hot run events are stored in a positional form, a
msgpack array of their values (ADR 0040), told apart from a map by its first byte. A payload of
any other event is its msgpack map without its tag field: the topic already names the type, and a
typed decode (this release's, or an older one's) accepts a map with or without it, so payloads
of earlier releases, which carry it, decode alike
(ADR 0035). Decoding a current topic is one typed msgspec decode. An
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
from journaled.events.positional import ARRAY_HEADS, Positional

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

    def __init__(
        self,
        types: Iterable[type[DomainEvent]],
        positional: Iterable[type[DomainEvent]] = (),
    ) -> None:
        """Build the decoders of ``types``; the ``positional`` ones are stored as arrays.

        Args:
            types: every event type this codec encodes and decodes.
            positional: types whose current-topic payloads are written in the positional form
                (:mod:`journaled.events.positional`, ADR 0040); map payloads of them still read.
        """
        self._encoder = msgspec.msgpack.Encoder()
        self._by_topic: dict[str, type[DomainEvent]] = {}
        self._by_tag: dict[str, type[DomainEvent]] = {}
        self._decoders: dict[str, msgspec.msgpack.Decoder[Any]] = {}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        self._raw = msgspec.msgpack.Decoder(dict[str, Any])
        self._tag_entries: dict[type[DomainEvent], bytes] = {}
        self._topics: dict[type[DomainEvent], str] = {}
        for cls in types:
            tag = tag_of(cls)
            if tag in self._by_tag and self._by_tag[tag] is not cls:
                raise ValueError(f"tag {tag!r} is used by two event types")
            self._by_tag[tag] = cls
            topic = topic_of(cls)
            self._by_topic[topic] = cls
            self._topics[cls] = topic
            self._decoders[topic] = msgspec.msgpack.Decoder(cls)
            field = cls.__struct_config__.tag_field or "type"
            self._tag_entries[cls] = self._encoder.encode(field) + self._encoder.encode(tag)
        self._packers: dict[type[DomainEvent], Positional] = {}
        self._rows: dict[str, Positional] = {}
        self._row_decoders: dict[str, tuple[Callable[[bytes], Any], Callable[[Any, Any], Any]]] = {}
        """Per positional topic: its twin's decode and the copy into the event, bound once."""
        for cls in positional:
            if self._by_topic.get(topic_of(cls)) is not cls:
                raise ValueError(f"{cls.__qualname__} is positional but not one of the types")
            form = self._packers[cls] = self._rows[topic_of(cls)] = Positional(cls)
            self._row_decoders[topic_of(cls)] = (form.decoder.decode, form.unpack)

    @property
    def types(self) -> tuple[type[DomainEvent], ...]:
        """Return every event type this codec decodes."""
        return tuple(self._by_tag.values())

    def register_upcaster(self, tag: str, from_version: int, upcaster: Upcaster) -> None:
        """Register a rewrite of ``tag`` payloads from ``from_version`` to ``from_version + 1``."""
        self._upcasters[(tag, from_version)] = upcaster

    def topic(self, event: DomainEvent) -> str:
        """Return the stored topic of an event."""
        topic = self._topics.get(type(event))
        return topic_of(type(event)) if topic is None else topic

    def encode(self, event: DomainEvent) -> bytes:
        """Encode an event's payload: its positional form, or its msgpack map without the tag."""
        packer = self._packers.get(type(event))
        if packer is not None:
            return self._encoder.encode(packer.pack(event))
        entry = self._tag_entries.get(type(event))
        if entry is None:
            raise TypeError(f"{type(event).__qualname__} is not a registered event type")
        return _untagged(self._encoder.encode(event), entry)

    def decode(self, topic: str, payload: bytes, position: int | None = None) -> DomainEvent:
        """Decode a stored payload, upcasting it first when an older release wrote it.

        Raises:
            UnknownEventType: no event type or upcaster knows the topic.
            CorruptEvent: the payload does not match its type; the position says where.
        """
        # Runs once per event read (a cold time travel reads a thousand): the positional form,
        # the common case, is one lookup and two bound calls. The try costs nothing until it
        # catches (Python 3.11): a row edited by hand is told only once it fails.
        try:
            row = self._row_decoders.get(topic)
            if row is not None and payload and payload[0] in ARRAY_HEADS:
                try:
                    positional: DomainEvent = row[1](row[0](payload), None)
                except (msgspec.ValidationError, msgspec.DecodeError):
                    pass  # decoded again below, for an error that names the field
                else:
                    return positional
            decoder = self._decoders.get(topic)
            if row is not None and payload and payload[0] in ARRAY_HEADS:
                named: DomainEvent = self._rows[topic].decode(payload)
                return named
            if decoder is not None:
                event: DomainEvent = decoder.decode(payload)
                return event
            return self._upcast(topic, payload, position)
        except msgspec.ValidationError as exc:
            raise CorruptEvent(position, topic, str(exc)) from exc
        except msgspec.DecodeError as exc:
            raise CorruptEvent(position, topic, f"malformed payload: {exc}") from exc
        except (TypeError, AttributeError) as exc:
            problem = stored_shape_problem(topic, payload)
            if problem is None:
                raise  # not the row's fault: an upcaster's own error, say, shows as it is
            raise CorruptEvent(position, topic, problem) from exc

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


def stored_shape_problem(topic: object, payload: object) -> str | None:
    """Return what is wrong with the types of a stored row's topic and payload, or None.

    A row edited by hand (``state`` NULL, TEXT or INTEGER, ``topic`` NULL) is otherwise a
    bare TypeError from deep inside a decoder; asked only after a decode failed.
    """
    if not isinstance(topic, str):
        return f"its topic is {_stored_type(topic)}, not text"
    if not isinstance(payload, bytes | bytearray | memoryview):
        return f"its payload is {_stored_type(payload)}, not bytes"
    return None


def _stored_type(value: object) -> str:
    if value is None:
        return "NULL"
    return f"{type(value).__name__} {value!r:.40}"


_FIXMAP = 0x80
_MAP16 = 0xDE


def _untagged(payload: bytes, entry: bytes) -> bytes:
    """Drop the tag entry msgspec writes first in a tagged Struct's map, one less in the count."""
    head = payload[0]
    if _FIXMAP < head <= _FIXMAP + 0x0F and payload.startswith(entry, 1):
        return bytes((head - 1,)) + payload[1 + len(entry) :]
    if head == _MAP16 and payload.startswith(entry, 3):
        count = int.from_bytes(payload[1:3], "big") - 1
        return bytes((_MAP16,)) + count.to_bytes(2, "big") + payload[3 + len(entry) :]
    return payload  # not the layout expected: stored as encoded, which decodes just as well
