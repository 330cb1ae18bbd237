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


def _pack(oid: int, items: Sequence[bytes]) -> bytes:
    if not items:
        return _EMPTY.pack(0, 0, oid)
    sizes = [len(item) for item in items]
    body = struct.pack(
        "!" + "".join(f"i{size}s" for size in sizes),
        *[part for pair in zip(sizes, items, strict=True) for part in pair],
    )
    return _HEAD.pack(1, 0, oid, len(items), 1) + body


def text_array(values: Sequence[str]) -> TextArray:
    """Pack strings as a ``text[]`` (UTF-8, strict: a lone surrogate raises here)."""
    return TextArray(_pack(_TEXT, [value.encode("utf-8") for value in values]))


def int8_array(values: Sequence[int]) -> Int8Array:
    """Pack integers as a ``bigint[]`` (``struct.error`` outside the signed 64-bit range)."""
    if not values:
        return Int8Array(_EMPTY.pack(0, 0, _INT8))
    n = len(values)
    return Int8Array(_HEAD.pack(1, 0, _INT8, n, 1) + struct.pack("!" + "iq" * n, *_sized(values)))


def _sized(values: Sequence[int]) -> list[int]:
    out: list[int] = []
    for value in values:
        out += (8, value)
    return out


def bytea_array(values: Sequence[bytes]) -> ByteaArray:
    """Pack byte strings as a ``bytea[]``."""
    return ByteaArray(_pack(_BYTEA, values))


class _Packed(Dumper):
    """Hand packed bytes over as they are, in binary, under the array's oid."""

    format = Format.BINARY

    def dump(self, obj: bytes) -> bytes:
        return obj


class _TextArrayDumper(_Packed):
    oid = _TEXT_ARRAY


class _Int8ArrayDumper(_Packed):
    oid = _INT8_ARRAY


class _ByteaArrayDumper(_Packed):
    oid = _BYTEA_ARRAY


def register(adapters: object) -> None:
    """Register the three dumpers on a psycopg adapters map (a connection's, or the global)."""
    for kind, dumper in (
        (TextArray, _TextArrayDumper),
        (Int8Array, _Int8ArrayDumper),
        (ByteaArray, _ByteaArrayDumper),
    ):
        adapters.register_dumper(kind, dumper)  # type: ignore[attr-defined]
