"""A positional stored form for hot events: their fields as a msgpack array (ADR 0040).

A map payload spells every field name in every row (``step_id``, ``attempt``, ``observation``…),
most of a small event's bytes. The positional form writes the values only, in declared field
order, with the trailing ones that equal their defaults left out; nested structs (a plan's steps,
an observation) are arrays too. It is a storage encoding, nothing else: the event type, its tag,
its topic, its JSON and the wire format are those of the map form, and a reader tells the two
forms apart by the payload's first byte (an array or a map), so payloads of earlier releases
read as before.

Reading decodes the array with a typed msgspec decoder of a generated ``array_like`` twin (which
validates every value, fills the left-out defaults and refuses values past the last field), then
copies the values into the event.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

_astuple = msgspec.structs.astuple
_INDEX = re.compile(r"`\$\[(\d+)\]")
_SEQUENCES: frozenset[Any] = frozenset({list, tuple, Sequence})
ARRAY_HEADS = frozenset((*range(0x90, 0xA0), 0xDC, 0xDD))
"""First bytes of a msgpack array (fixarray, array 16, array 32)."""


class Positional:
    """The positional form of one struct type: pack to a list, decode back into the type."""

    def __init__(self, cls: type[msgspec.Struct], parent: Mapping[str, Any] | None = None) -> None:
        """Build the form of ``cls``; ``parent`` names the required fields of the struct that
        holds it (name to type), which a required ``str`` field of the same name may repeat."""
        self.cls = cls
        fields = msgspec.structs.fields(cls)
        self._names = tuple(f.name for f in fields)
        self._own = {f.name: f.type for f in fields if _required(f)}
        self._inherited: list[tuple[int, str]] = []
        self._required = 0
        self._defaults: list[Any] = []
        # (index, nested form, how many: "one", or the container type of a sequence)
        self._nested: list[tuple[int, Positional, Any]] = []
        twin_fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
        for i, f in enumerate(fields):
            twin_type = self._twin_type(i, f.type)
            if _required(f) and f.type is str and (parent or {}).get(f.name) is str:
                # An observation's step id is its event's: stored as nil when they agree.
                self._inherited.append((i, f.name))
                twin_type = str | None
            if f.default is not msgspec.NODEFAULT:
                self._defaults.append(f.default)
                twin_fields.append((f.name, twin_type, f.default))
            elif f.default_factory is not msgspec.NODEFAULT:
                self._defaults.append(f.default_factory())
                twin_fields.append(
                    (f.name, twin_type, msgspec.field(default_factory=f.default_factory))
                )
            else:
                if self._defaults:
                    raise TypeError(f"{cls.__qualname__}.{f.name}: a required field after defaults")
                self._required = i + 1
                twin_fields.append((f.name, twin_type))
        self.twin: type[msgspec.Struct] = msgspec.defstruct(
            f"{cls.__name__}Row",
            twin_fields,
            array_like=True,
            frozen=True,
            gc=False,
            forbid_unknown_fields=True,  # values past the last field are damage, not extras
        )
        self.decoder = msgspec.msgpack.Decoder(self.twin)
        self.unpack: Callable[[Any, Any], Any] = self._compile()
        """Return the struct a decoded twin holds (``parent``: the twin holding this one)."""

    def _twin_type(self, index: int, tp: Any) -> Any:
        """Return a field's type with nested structs replaced by their positional twins."""
        if _is_struct(tp):
            form = Positional(tp, self._own)
            self._nested.append((index, form, "one"))
            return form.twin
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (types.UnionType, typing.Union):
            structs = [a for a in args if _is_struct(a)]
            if not structs:
                return tp
            if len(structs) == 1 and len(args) == 2 and type(None) in args:
                form = Positional(structs[0], self._own)
                self._nested.append((index, form, "one"))
                return form.twin | None
        elif origin in _SEQUENCES and args and _is_struct(args[0]):
            if origin is tuple and (len(args) != 2 or args[1] is not Ellipsis):
                raise TypeError(f"{self.cls.__qualname__}: no positional form for {tp}")
            form = Positional(args[0])
            self._nested.append((index, form, tuple if origin is tuple else list))
            return tuple[form.twin, ...]  # type: ignore[name-defined]
        elif not _holds_struct(tp):
            return tp
        raise TypeError(f"{self.cls.__qualname__}: no positional form for a field of type {tp}")

    def pack(self, value: Any, parent: Any = None) -> list[Any]:
        """Return a struct's values in field order, trailing defaults left out, nested packed."""
        values = list(_astuple(value))
        for index, name in self._inherited:
            if values[index] == getattr(parent, name):
                values[index] = None
        count = len(values)
        defaults, required = self._defaults, self._required
        while count > required:
            last, default = values[count - 1], defaults[count - 1 - required]
            if last is not default and (type(last) is not type(default) or last != default):
                break
            count -= 1
        del values[count:]
        for index, form, many in self._nested:
            if index < count and (item := values[index]) is not None:
                values[index] = (
                    form.pack(item, value) if many == "one" else [form.pack(x) for x in item]
                )
        return values

    def _compile(self) -> Callable[[Any, Any], Any]:
        """Build ``unpack`` as straight-line code: it runs once per stored event read.

        A loop over the fields with a kwargs dict cost ~4x as much per event; the names compiled
        in are the struct's own field names (identifiers), nothing read from storage.
        """
        env: dict[str, Any] = {"cls": self.cls}
        body = ["def unpack(row, parent):"]
        body += [f"    v{i} = row.{name}" for i, name in enumerate(self._names)]
        body += [f"    if v{i} is None: v{i} = parent.{name}" for i, name in self._inherited]
        for index, form, many in self._nested:
            env[f"f{index}"], env[f"c{index}"] = form.unpack, many
            call = (
                f"f{index}(v{index}, row)"
                if many == "one"
                else f"c{index}([f{index}(x, None) for x in v{index}])"
            )
            body.append(f"    if v{index} is not None: v{index} = {call}")
        args = ", ".join(f"{name}=v{i}" for i, name in enumerate(self._names))
        body.append(f"    return cls({args})")
        exec("\n".join(body), env)  # noqa: S102
        unpack: Callable[[Any, Any], Any] = env["unpack"]
        return unpack

    def decode(self, payload: bytes) -> Any:
        """Decode a positional payload into the struct.

        Raises:
            msgspec.ValidationError: a value is not of its field's type, or values are missing.
            msgspec.DecodeError: the bytes are not msgpack.
        """
        try:
            row = self.decoder.decode(payload)
        except msgspec.ValidationError as exc:
            raise msgspec.ValidationError(self._named(str(exc))) from exc
        return self.unpack(row, None)

    def _named(self, message: str) -> str:
        """Name the field of a top-level array index in a validation message (``$[1]``)."""
        found = _INDEX.search(message)
        if found is None or int(found[1]) >= len(self._names):
            return message
        return f"{message} ({self.cls.__name__}.{self._names[int(found[1])]})"


def _required(field: msgspec.structs.FieldInfo) -> bool:
    return field.default is msgspec.NODEFAULT and field.default_factory is msgspec.NODEFAULT


def _is_struct(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def _holds_struct(tp: Any) -> bool:
    return _is_struct(tp) or any(_holds_struct(a) for a in typing.get_args(tp))
