"""The catalog of every actor message type, its codecs, and the JSON Schema of the protocol (A4).

The catalog is found from the types themselves: every subclass, transitively, of a base in
:data:`MESSAGE_BASES` that is defined in a module of :data:`MESSAGE_MODULES`. A new family of
messages adds its base to the one tuple and its module to the other; nothing else lists message
types by hand. Every catalogued type has an explicit tag of its own, so the whole protocol is one
msgspec tagged union, decoded in one step from JSON or msgpack.

An :class:`Envelope` is what a foreign system sends to an address of a runtime: the address and one
message. The JSON Schema of every stored event and every message comes from
``msgspec.json.schema_components`` over the same types, never from a hand-written file.
"""

from __future__ import annotations

import functools
import importlib
import operator
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from journaled.events.base import DomainEvent
from journaled.events.catalog import STORED_EVENTS
from journaled.events.errors import ProtocolError
from journaled.events.gateway_messages import GatewayReply, GatewayRequest
from journaled.events.messages import Message
from journaled.events.orchestration_messages import OrchestrationMessage
from journaled.events.run_messages import RunMessage

__all__ = [
    "JSON_SCHEMA_DIALECT",
    "MESSAGE_BASES",
    "MESSAGE_MODULES",
    "MESSAGE_TYPES",
    "AnyMessage",
    "Envelope",
    "catalog_problems",
    "decode_envelope_json",
    "decode_envelope_msgpack",
    "decode_json",
    "decode_msgpack",
    "encode_json",
    "encode_msgpack",
    "json_schema",
    "message_tag",
]

MESSAGE_BASES: tuple[type[msgspec.Struct], ...] = (
    Message,
    RunMessage,
    OrchestrationMessage,
    GatewayRequest,
    GatewayReply,
)
"""The abstract bases of actor messages: a new family of messages adds its base here."""

MESSAGE_MODULES: tuple[str, ...] = (
    "journaled.events.messages",
    "journaled.events.run_messages",
    "journaled.events.orchestration_messages",
    "journaled.events.gateway_messages",
)
"""Every module that defines message types. Importing them all here makes discovery complete;
a test fails when a message type is defined in a module missing from this tuple."""

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
"""The dialect msgspec's generated schemas follow."""


def _subclasses(base: type[msgspec.Struct]) -> list[type[msgspec.Struct]]:
    """Return every subclass of ``base``, transitively, in definition order."""
    found: list[type[msgspec.Struct]] = []
    for sub in base.__subclasses__():
        found.append(sub)
        found.extend(_subclasses(sub))
    return found


def _discover() -> tuple[type[msgspec.Struct], ...]:
    for name in MESSAGE_MODULES:
        importlib.import_module(name)
    seen: dict[type[msgspec.Struct], None] = {}
    for base in MESSAGE_BASES:
        for cls in _subclasses(base):
            # Subclasses defined elsewhere (a test's, a user's) are not part of the protocol.
            if cls.__module__ in MESSAGE_MODULES and cls not in MESSAGE_BASES:
                seen[cls] = None
    return tuple(seen)


def message_tag(cls: type[msgspec.Struct]) -> str | None:
    """Return the explicit tag of a message type, or None when it has none of its own."""
    tag = cls.__struct_config__.tag
    return tag if isinstance(tag, str) and tag != cls.__name__ else None


def catalog_problems(types: Iterable[type[msgspec.Struct]]) -> list[str]:
    """Return what keeps ``types`` from forming one tagged union: a missing or shared tag.

    A subclass of a tagged message inherits its parent's tag, so it shows up as a shared tag.
    """
    problems: list[str] = []
    owners: dict[str, type[msgspec.Struct]] = {}
    for cls in types:
        tag = message_tag(cls)
        if tag is None:
            problems.append(f"{cls.__module__}.{cls.__qualname__} has no explicit tag=...")
            continue
        if cls.__struct_config__.tag_field != "type":
            problems.append(
                f"{tag}: tag_field must be 'type', not {cls.__struct_config__.tag_field!r}"
            )
        other = owners.setdefault(tag, cls)
        if other is not cls:
            problems.append(
                f"tag {tag!r} is used by both {other.__qualname__} and {cls.__qualname__}"
            )
    return problems


MESSAGE_TYPES: tuple[type[msgspec.Struct], ...] = _discover()
"""Every catalogued message type, memory's first, in definition order."""

_problems = catalog_problems(MESSAGE_TYPES)
if _problems:  # pragma: no cover - a broken catalog must not import at all
    raise TypeError("; ".join(_problems))

if TYPE_CHECKING:
    AnyMessage = Message | RunMessage
else:
    # The tagged union msgspec decodes in one step; built from the catalog, never listed.
    AnyMessage = functools.reduce(operator.or_, MESSAGE_TYPES)


class Envelope(msgspec.Struct, frozen=True, kw_only=True):
    """One message addressed to an actor of a runtime: what a foreign system sends (A4)."""

    to: str
    """The address of the receiving actor."""
    message: AnyMessage
    """The message itself, with its tag in ``type``."""


class _Version(msgspec.Struct):
    """A message's optional ``version`` key, read beside the message (every other key ignored).

    On the wire a message may say which schema version it is; one that says none is version 1,
    so this release's encoders, whose messages are all version 1, leave it out (ADR 0028)."""

    version: int | None = None


class _EnvelopeVersion(msgspec.Struct):
    message: _Version


_TAGS: frozenset[type[msgspec.Struct]] = frozenset(MESSAGE_TYPES)
_JSON = msgspec.json.Encoder()
_MSGPACK = msgspec.msgpack.Encoder()
_JSON_MESSAGE = msgspec.json.Decoder(AnyMessage)
_MSGPACK_MESSAGE = msgspec.msgpack.Decoder(AnyMessage)
_JSON_ENVELOPE = msgspec.json.Decoder(Envelope)
_MSGPACK_ENVELOPE = msgspec.msgpack.Decoder(Envelope)
_JSON_VERSION = msgspec.json.Decoder(_Version)
_MSGPACK_VERSION = msgspec.msgpack.Decoder(_Version)
_JSON_ENVELOPE_VERSION = msgspec.json.Decoder(_EnvelopeVersion)
_MSGPACK_ENVELOPE_VERSION = msgspec.msgpack.Decoder(_EnvelopeVersion)


def _check_message(value: object) -> None:
    if type(value) not in _TAGS:
        raise ProtocolError(
            f"{type(value).__qualname__} is not a catalogued message type: subclass a base in "
            "journaled.events.protocol.MESSAGE_BASES with an explicit tag=..."
        )


def _unencodable(value: msgspec.Struct, encoder: msgspec.json.Encoder) -> list[str]:
    """Name each field of ``value`` that cannot be encoded, with the type of what it holds."""
    found: list[str] = []
    for name in value.__struct_fields__:
        field = getattr(value, name)
        try:
            encoder.encode(field)
        except (TypeError, ValueError):
            if isinstance(field, msgspec.Struct):
                found.extend(f"{name}.{inner}" for inner in _unencodable(field, encoder))
            else:
                kind = type(field)
                owner = "" if kind.__module__ == "builtins" else f"{kind.__module__}."
                found.append(f"{name} ({owner}{kind.__qualname__})")
    return found


def _encode(value: AnyMessage | Envelope, encode: Any) -> bytes:
    message = value.message if isinstance(value, Envelope) else value
    _check_message(message)
    try:
        data: bytes = encode(value)
    except (TypeError, ValueError) as exc:
        where = ", ".join(_unencodable(value, _JSON)) or "?"
        raise ProtocolError(
            f"cannot encode {message_tag(type(message))}: {exc}; live objects cannot cross a "
            f"process, in {where}: send an address or an id instead"
        ) from exc
    return data


def encode_json(value: AnyMessage | Envelope) -> bytes:
    """Encode a message (or an envelope) as JSON.

    Raises:
        ProtocolError: the message is not catalogued, or a field holds a live object.
    """
    return _encode(value, _JSON.encode)


def encode_msgpack(value: AnyMessage | Envelope) -> bytes:
    """Encode a message (or an envelope) as msgpack.

    Raises:
        ProtocolError: the message is not catalogued, or a field holds a live object.
    """
    return _encode(value, _MSGPACK.encode)


def _decode(data: bytes | str, decoder: Any, versions: Any, where: str = "$") -> Any:
    try:
        decoded = decoder.decode(data)
        said = versions.decode(data)
    except msgspec.ValidationError as exc:
        # msgspec names the path (``$.message.step.id``) and, for an unknown tag, the tag.
        raise ProtocolError(f"invalid message: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"malformed message: {exc}") from exc
    message = decoded.message if isinstance(decoded, Envelope) else decoded
    version = (said.message if isinstance(said, _EnvelopeVersion) else said).version
    known: int = getattr(type(message), "version", 1)
    if version is not None and version != known:
        # Read as this release's version, a later one would be taken for what it is not (A4).
        raise ProtocolError(
            f"invalid message: {message_tag(type(message))} version {version} is not one this "
            f"release reads (it reads version {known}; a message without a version is version "
            f"1) - at `{where}.version`"
        )
    return decoded


def decode_json(data: bytes | str) -> AnyMessage:
    """Decode one message from JSON, choosing its type by the tag in ``type``.

    Raises:
        ProtocolError: the data is not JSON, names no known tag, or a field has the wrong type.
    """
    message: AnyMessage = _decode(data, _JSON_MESSAGE, _JSON_VERSION)
    return message


def decode_msgpack(data: bytes) -> AnyMessage:
    """Decode one message from msgpack, choosing its type by the tag in ``type``.

    Raises:
        ProtocolError: the data is not msgpack, names no known tag, or a field has the wrong type.
    """
    message: AnyMessage = _decode(data, _MSGPACK_MESSAGE, _MSGPACK_VERSION)
    return message


def decode_envelope_json(data: bytes | str) -> Envelope:
    """Decode an envelope (address and message) from JSON.

    Raises:
        ProtocolError: as :func:`decode_json`, with paths under ``$.message``.
    """
    envelope: Envelope = _decode(data, _JSON_ENVELOPE, _JSON_ENVELOPE_VERSION, "$.message")
    return envelope


def decode_envelope_msgpack(data: bytes) -> Envelope:
    """Decode an envelope (address and message) from msgpack.

    Raises:
        ProtocolError: as :func:`decode_msgpack`, with paths under ``$.message``.
    """
    envelope: Envelope = _decode(data, _MSGPACK_ENVELOPE, _MSGPACK_ENVELOPE_VERSION, "$.message")
    return envelope


# -- JSON Schema -----------------------------------------------------------------------------------


def _entry(cls: type[msgspec.Struct], ref: dict[str, Any], kind: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"tag": cls.__struct_config__.tag, "kind": kind}
    entry["version"] = getattr(cls, "version", 1)
    if issubclass(cls, DomainEvent):
        entry["topic"] = f"{cls.__struct_config__.tag}@{cls.version}"
    entry["fields"] = [f.encode_name for f in msgspec.structs.fields(cls)]
    entry["schema"] = ref
    return entry


def json_schema() -> dict[str, Any]:
    """Return the JSON Schema of every stored event, every message and the envelope (A4).

    One document: ``events`` (tag, kind, version, topic, fields, schema) and ``messages`` (tag,
    kind, version, fields, schema) each point with ``{"$ref": "#/$defs/Name"}`` into the shared
    ``$defs``;
    ``envelope`` is the schema of :class:`Envelope`. The ``$schema`` key names the dialect, so
    ``{"$ref": ..., "$defs": doc["$defs"]}`` is a schema a validator accepts as it is.
    """
    events: list[type[msgspec.Struct]] = list(STORED_EVENTS)
    messages = list(MESSAGE_TYPES)
    refs, defs = msgspec.json.schema_components([*events, *messages, Envelope])
    kinds = ["event"] * len(events) + ["message"] * len(messages)
    entries = [
        _entry(cls, ref, kind)
        for cls, ref, kind in zip([*events, *messages], refs, kinds, strict=False)
    ]
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "events": [e for e in entries if e["kind"] == "event"],
        "messages": [e for e in entries if e["kind"] == "message"],
        "envelope": refs[-1],
        "$defs": defs,
    }
