"""Pure checks of what a caller hands in before it can reach an event (bad input, J5).

The journal stores UTF-8 text and msgpack integers of at most 64 bits, and every text a caller
writes costs journal space for good. These checks say, in one line, which value cannot be stored
and why, so the door can refuse it before anything is appended; and :func:`decode_text` turns a
stored text that is not UTF-8 into a :class:`CorruptEvent` carrying its position and reason.
"""

from __future__ import annotations

import datetime as dt
import math

import msgspec

from journaled.events.errors import CorruptEvent

MAX_TEXT_BYTES = 1 << 20
"""Largest goal, question, answer, fact text or reason a caller may journal: 1 MiB, the bound on
a step's encoded output (``actors.steps.MAX_OUTPUT_BYTES``)."""
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_TEXT_BYTES",
    "decode_text",
    "flat",
    "int_problem",
    "number_problem",
    "short",
    "text_problem",
]


def text_problem(value: object, *, limit: int = MAX_TEXT_BYTES, empty: bool = True) -> str | None:
    """Return why ``value`` cannot be journaled as a text, or None when it can.

    Args:
        value: What the caller passed.
        limit: The largest UTF-8 size accepted, in bytes.
        empty: Whether an empty (or all-blank) string is acceptable.
    """
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not empty and not value.strip():
        return "is empty"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return (
            f"holds a lone surrogate {value[exc.start]!r} at index {exc.start}, which UTF-8 "
            "cannot store: decode the text with errors='replace' first"
        )
    if size > limit:
        return f"is {size} bytes in UTF-8, over the {limit}-byte bound"
    return None


def int_problem(
    value: object, *, low: int = INT64_MIN, high: int = INT64_MAX, unit: str = "an int"
) -> str | None:
    """Return why ``value`` is not an int in ``[low, high]`` (64-bit by default), or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be {unit}, got {type(value).__name__} {short(value)}"
    if not low <= value <= high:
        return f"is {short(value)}, outside [{low}, {high}]"
    return None


def timeout_problem(value: object) -> str | None:
    """Return why ``value`` is not a wait in seconds (None, or a non-negative number), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:  # NaN too
        return f"must be None or a non-negative number of seconds, got {value!r}"
    return None


def number_problem(value: object) -> str | None:
    """Return why ``value`` is not a finite real number, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number, got {type(value).__name__}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be finite, got {value!r}"
    return None


def decode_text(raw: bytes, stream: str, position: int | None, topic: str) -> str:
    """Decode a stored text, or raise :class:`CorruptEvent` with its position and reason (J5)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptEvent(
            position,
            topic,
            f"the stored text of {stream} is not valid UTF-8 at byte {exc.start} ({exc.reason})",
        ) from None


def flat(text: str | None) -> str:
    """Render stored free text inside one line: its line breaks shown, never obeyed.

    A why is read line by line; a stored error holding a newline must not forge a line of its
    own (such as a ``now:`` line).
    """
    if text is None:
        return ""
    return " ⏎ ".join(text.splitlines())  # every break str.splitlines knows, \x85 and \u2028 too


def short(value: object) -> str:
    """Return a short repr of ``value`` for an error message (a huge int by its size)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"a {value.bit_length()}-bit int"  # repr of a huge int is slow, or refused
    text = repr(value)
    return text if len(text) <= 40 else text[:20] + "…" + text[-8:]


def json_bytes(value: object) -> bytes:
    """Encode a journaled value as JSON. A dict keyed by what JSON has no key for (a tuple,
    None: runs stored before ADR 0098 refused such keys) gets its keys written as their
    ``repr``, where the encoder alone would raise a ``TypeError``."""
    try:
        return msgspec.json.encode(value)
    except TypeError:
        return msgspec.json.encode(_text_keys(msgspec.to_builtins(value)))


def _text_keys(value: object) -> object:
    if isinstance(value, dict):
        return {
            k if isinstance(k, str | int | float) and not isinstance(k, bool) else repr(k): (
                _text_keys(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_text_keys(v) for v in value]
    return value


_PACK = msgspec.msgpack.Encoder()
_PACK_SORTED = msgspec.msgpack.Encoder(order="deterministic")
_DICT = msgspec.msgpack.Ext(0x4A, b"dict")
"""Marks a dict in :func:`_canonical`'s form: no journaled value holds an msgpack extension."""


def same_value(a: object, b: object) -> bool:
    """Tell whether two journaled values hold the same thing, a NaN the same as itself.

    A step's input or a tool's output may hold a float NaN (pandas, numpy), which ``==`` finds
    unequal to itself (ADR 0097); and ``==`` finds ``1``, ``1.0`` and ``True`` equal, or
    ``0.0`` and ``-0.0``, which a reader of the record tells apart. So values are compared by
    the bytes they encode to (one codec: the same contents encode alike), with no dict's key
    order counted: the order is not its content.
    """
    if a is b:
        return True
    try:
        if _PACK.encode(a) == _PACK.encode(b):  # in C: the common case, the same in order
            return True
        try:
            return _PACK_SORTED.encode(a) == _PACK_SORTED.encode(b)  # text keys sorted, in C
        except TypeError:  # a dict keyed by a number (ADR 0098): sorted here
            return _PACK.encode(_canonical(msgspec.to_builtins(a))) == _PACK.encode(
                _canonical(msgspec.to_builtins(b))
            )
    except (TypeError, ValueError, OverflowError):
        return False


def _canonical(value: object) -> object:
    """Return ``value`` with each dict as its items sorted by their keys' encodings."""
    if isinstance(value, dict):
        items = sorted(((_PACK.encode(k), _canonical(v)) for k, v in value.items()), key=_first)
        return [_DICT, [[k, v] for k, v in items]]
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


def _first(item: tuple[bytes, object]) -> bytes:
    return item[0]


def holds_infinity(value: object) -> bool:
    """Tell whether a value read from JSON text holds an infinite number: Python's reader takes
    a number out of range (``1e999``) as one, and JSON has none (RFC 8259). Iterative: a value
    nested as deep as the reader allows is walked without recursion."""
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, float):
            if math.isinf(item):
                return True
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return False


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def iso_ms(text: str) -> int | None:
    """Return an ISO-8601 time (``Z``, an offset, or none for UTC; or a date, at 00:00 UTC) in
    epoch milliseconds, or None when the text is no such time."""
    try:
        stamp = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    return epoch_ms(stamp)


def epoch_ms(stamp: dt.datetime) -> int:
    """Return a datetime in epoch milliseconds; a naive one is read as UTC (as the CLI reads a
    time given without an offset)."""
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return (stamp - _EPOCH) // dt.timedelta(milliseconds=1)
