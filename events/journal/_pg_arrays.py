"""One-dimensional PostgreSQL arrays in the binary wire format, encoded without psycopg's
per-call adaptation (ADR 0051).

psycopg dumps a Python list by building a dumper for it on every call: it scans the elements to
find their type, looks up and instantiates the element's dumper, and then dumps each element
through it, some twenty Python frames per list. The append procedure takes six arrays per call
(ADR 0044), so on a chain of steps this was ~115 µs of the ~230 µs of client CPU of an append.
Here each array is packed once with :mod:`struct` into the bytes ``array_recv`` reads, and a
dumper registered for the wrapper type hands those bytes over as they are, under the array's
type oid. The server parses and checks them as it does any array (element type, dimensions,
UTF-8 and NUL-free text), so a malformed one is refused by the server, never stored.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from psycopg.abc import Buffer
from psycopg.adapt import Dumper
from psycopg.pq import Format

# Type oids of PostgreSQL's catalogue (pg_type.dat); fixed since the types were added.
_TEXT, _TEXT_ARRAY = 25, 1009
_INT8, _INT8_ARRAY = 20, 1016
_BYTEA, _BYTEA_ARRAY = 17, 1001

_HEAD = struct.Struct("!iiiii")
"""ndim, has-nulls flag, element oid, then the one dimension's length and lower bound."""
_EMPTY = struct.Struct("!iii")
"""An empty array has no dimension: ndim 0, no nulls, element oid."""


class TextArray(bytes):
    """A ``text[]`` already in the binary wire format."""


class Int8Array(bytes):
    """A ``bigint[]`` already in the binary wire format."""


class ByteaArray(bytes):
    """A ``bytea[]`` already in the binary wire format."""


_LENGTH = struct.Struct("!i")
_INT8_ITEM = struct.Struct("!iq")
"""A bigint element: its length (8), then its value."""


def _pack(oid: int, items: Sequence[bytes]) -> bytes:
    if not items:
        return _EMPTY.pack(0, 0, oid)
    parts = [_HEAD.pack(1, 0, oid, len(items), 1)]
    for item in items:
        parts += (_LENGTH.pack(len(item)), item)
    return b"".join(parts)


def text_array(values: Sequence[str]) -> TextArray:
    """Pack strings as a ``text[]`` in UTF-8, the journal connections' client encoding (a lone
    surrogate raises ``UnicodeEncodeError`` here)."""
    return TextArray(_pack(_TEXT, [value.encode("utf-8") for value in values]))


def int8_array(values: Sequence[int]) -> Int8Array:
    """Pack integers as a ``bigint[]`` (``struct.error`` outside the signed 64-bit range)."""
    if not values:
        return Int8Array(_EMPTY.pack(0, 0, _INT8))
    item = _INT8_ITEM.pack
    return Int8Array(
        b"".join([_HEAD.pack(1, 0, _INT8, len(values), 1), *map(item, [8] * len(values), values)])
    )


def bytea_array(values: Sequence[bytes | bytearray | memoryview]) -> ByteaArray:
    """Pack byte strings (any bytes-like value) as a ``bytea[]``."""
    return ByteaArray(_pack(_BYTEA, [v if type(v) is bytes else bytes(v) for v in values]))


class _Packed(Dumper):
    """Hand packed bytes over as they are, in binary, under the array's oid.

    The oid is set on each instance, not on the class: psycopg registers a dumper class whose
    ``oid`` is set for that oid too, and this one must never dump anything but its wrapper
    (a binary ``COPY`` of ``text[]`` columns elsewhere in the process keeps psycopg's own).
    """

    format = Format.BINARY
    packed_oid = 0

    def __init__(self, cls: type, context: Any = None) -> None:
        super().__init__(cls, context)
        self.oid = self.packed_oid

    def dump(self, obj: Buffer) -> Buffer:
        return obj


class _TextArrayDumper(_Packed):
    packed_oid = _TEXT_ARRAY


class _Int8ArrayDumper(_Packed):
    packed_oid = _INT8_ARRAY


class _ByteaArrayDumper(_Packed):
    packed_oid = _BYTEA_ARRAY


def register(adapters: object) -> None:
    """Register the three dumpers on a psycopg adapters map (a connection's, or the global)."""
    for kind, dumper in (
        (TextArray, _TextArrayDumper),
        (Int8Array, _Int8ArrayDumper),
        (ByteaArray, _ByteaArrayDumper),
    ):
        adapters.register_dumper(kind, dumper)  # type: ignore[attr-defined]
