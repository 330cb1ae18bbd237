"""Compression of the caches kept beside the journal: run snapshots and stored projections.

A cache is written rarely (a run's end, a projection's save) and read on a cold call, so it is
stored deflated with the standard library's zlib (ADR 0040). A stored cache whose first byte is a
msgpack map is an earlier release's uncompressed one and reads as it is; a zlib stream never
starts that way (its first byte is 0x78 here, ``CMF`` of a 32 KiB window). A stored cache that
does not inflate is reported like malformed msgpack, which every reader already treats as a
cache miss.
"""

from __future__ import annotations

import zlib

import msgspec

LEVEL = 6
"""zlib's default level: on a 1,000-step run's snapshot, higher levels shrink it by under 2 %."""
_MAP_HEADS = frozenset((*range(0x80, 0x90), 0xDE, 0xDF))


def deflate(encoded: bytes) -> bytes:
    """Return a cache's msgpack bytes as stored: deflated."""
    return zlib.compress(encoded, LEVEL)


def inflate(stored: bytes) -> bytes:
    """Return a stored cache's msgpack bytes.

    Raises:
        msgspec.DecodeError: the bytes are neither an uncompressed msgpack map nor a zlib stream.
    """
    if not stored or stored[0] in _MAP_HEADS:
        return stored
    try:
        return zlib.decompress(stored)
    except zlib.error as exc:
        raise msgspec.DecodeError(f"corrupt compressed cache: {exc}") from exc
