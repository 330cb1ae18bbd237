"""Every message actors exchange is a catalogued, wire-safe Struct (SPEC A4).

The recorder wraps pykka's ``ActorRef.tell`` and ``ActorRef.ask`` (and any ``tell`` or ``ask`` a
class of ``journaled.actors`` defines, a mailbox of its own) for the length of a representative
story, so it sees every message really sent, not the ones a list says exist. pykka's own control
messages (stop) are not the protocol and are left out.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pykka
import pytest
from protocol_story import tell as tell_story

import journaled
import journaled.actors
from journaled.events import protocol
from journaled.events.errors import ProtocolError
from journaled.events.memory_state import Query
from journaled.events.messages import Delete, Message, Remember, SearchScore

SENDERS = ("tell", "ask")
"""Names of the methods that put a message in a mailbox."""

CORE_TAGS = {
    "memory.remember",
    "memory.catch-up",
    "memory.apply",
    "memory.get",
    "memory.delete",
    "memory.purge",
    "memory.search-stats",
    "memory.search-score",
    "run.begin",
    "run.run-step",
    "run.step-done",
    "run.step-deadline",
    "run.cancel",
    "run.drain",
    "orchestration.begin",
    "orchestration.ask-planner",
    "orchestration.planner-answered",
    "orchestration.pass-stopped",
    "orchestration.stopped",
    "orchestration.cancel",
    "orchestration.drain",
}
"""Message types the story sends for certain: memory, runs, a timeout, a cancel, a drain, and
orchestrations (their planner, their passes, a cancel and a drain while the planner thinks)."""


def mailbox_classes() -> list[type]:
    """Return pykka's ActorRef and every journaled.actors class defining a sender of its own."""
    found: list[type] = [pykka.ActorRef]
    for info in pkgutil.iter_modules(journaled.actors.__path__, "journaled.actors."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and any(n in vars(cls) for n in SENDERS):
                found.append(cls)
    return found


class Recorder:
    """Every message put in a mailbox while recording, in the order it was sent."""

    def __init__(self) -> None:
        self.messages: list[object] = []
        self._lock = threading.Lock()

    def wrap(self, send: Callable[..., Any]) -> Callable[..., Any]:
        def recording(ref: object, *args: Any, **kwargs: Any) -> Any:
            # The message is the last positional argument: ``ref.tell(message)``,
            # ``ref.ask(message, block=False)``, ``directory.tell(address, message)``.
            message = args[-1] if args else kwargs.get("message")
            if not type(message).__module__.startswith("pykka"):
                with self._lock:
                    self.messages.append(message)
            return send(ref, *args, **kwargs)

        return recording

    def tags(self) -> set[str]:
        """Return the tag (or, untagged, the class name) of each message type seen."""
        return {tag_of(m) for m in self.messages}


def tag_of(message: object) -> str:
    if isinstance(message, msgspec.Struct):
        tag = type(message).__struct_config__.tag
        if isinstance(tag, str):
            return tag
    return type(message).__qualname__


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorder:
    """Record every message sent while the representative story runs on a SQLite journal."""
    recorder = Recorder()
    patch = pytest.MonkeyPatch()
    try:
        for cls in mailbox_classes():
            for name in SENDERS:
                if name in vars(cls):
                    patch.setattr(cls, name, recorder.wrap(vars(cls)[name]))
        url = f"sqlite:///{Path(tmp_path_factory.mktemp('story')) / 'journal.sqlite'}"
        tell_story(url)
    finally:
        patch.undo()
    return recorder


def first_difference(sent: object, back: object, path: str) -> str:
    """Describe where ``back`` first differs from ``sent``: the path, and what each holds there."""
    if isinstance(sent, msgspec.Struct) and type(back) is type(sent):
        for name in type(sent).__struct_fields__:
            if getattr(sent, name) != getattr(back, name):
                return first_difference(getattr(sent, name), getattr(back, name), f"{path}.{name}")
    elif isinstance(sent, (list, tuple)) and type(back) is type(sent) and len(back) == len(sent):
        for i, (a, b) in enumerate(zip(sent, back, strict=True)):
            if a != b:
                return first_difference(a, b, f"{path}[{i}]")
    return (
        f"comes back different at {path}: sent a {type(sent).__qualname__}, "
        f"got a {type(back).__qualname__}"
    )


def round_trip_problems(message: object) -> list[str]:
    """Return why ``message`` is not catalogued or does not come back equal through JSON/msgpack."""
    tag = tag_of(message)
    if type(message) not in protocol.MESSAGE_TYPES:
        return [f"{tag}: {type(message).__qualname__} is not a catalogued message type"]
    problems = []
    for name, encode, decode in (
        ("json", protocol.encode_json, protocol.decode_json),
        ("msgpack", protocol.encode_msgpack, protocol.decode_msgpack),
    ):
        try:
            back = decode(encode(message))  # type: ignore[arg-type]
        except ProtocolError as exc:
            problems.append(f"{tag} ({name}): {exc}")
            continue
        if back != message:
            problems.append(f"{tag} ({name}): {first_difference(message, back, '$')}")
    return problems


def test_every_message_sent_is_catalogued_and_round_trips(recorded: Recorder) -> None:
    """A4: each message sent in the story is catalogued and equal after JSON and msgpack."""
    problems: dict[str, None] = {}
    for message in recorded.messages:
        problems.update(dict.fromkeys(round_trip_problems(message)))
    assert not problems, "\n".join(problems)


def test_recorder_sees_the_core_message_types(recorded: Recorder) -> None:
    """A4: the recorder really saw memory, run, timeout, cancel and drain messages being sent."""
    assert recorded.tags() >= CORE_TAGS, CORE_TAGS - recorded.tags()
    assert len(recorded.messages) > len(CORE_TAGS)


# -- the catalog -----------------------------------------------------------------------------------


class StrayMessage(Message, frozen=True, kw_only=True, tag="memory.stray"):
    """A message type defined outside the catalogued modules: the walk below must find it."""


class Untagged(Message, frozen=True, kw_only=True):
    """A message type without an explicit tag."""


class Twin(Remember, frozen=True, kw_only=True):
    """A message type that inherits its parent's tag."""


def message_classes(module_names: list[str]) -> list[type[msgspec.Struct]]:
    """Return every message class defined in the given modules (not the bases themselves)."""
    found: list[type[msgspec.Struct]] = []
    for name in module_names:
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (
                cls.__module__ == name
                and issubclass(cls, protocol.MESSAGE_BASES)
                and cls not in protocol.MESSAGE_BASES
            ):
                found.append(cls)
    return found


def every_module() -> list[str]:
    """Return the name of every module of the package, its layers included."""
    return [info.name for info in pkgutil.walk_packages(journaled.__path__, "journaled.")]


def test_catalog_holds_every_message_class_of_the_package() -> None:
    """A4: every message class defined anywhere in journaled is catalogued, uniquely tagged."""
    defined = message_classes(every_module())
    assert len(defined) >= 20
    assert [c for c in defined if c not in protocol.MESSAGE_TYPES] == []
    assert set(protocol.MESSAGE_TYPES) == set(defined)
    assert protocol.catalog_problems(protocol.MESSAGE_TYPES) == []


def test_catalog_checks_catch_a_stray_an_untagged_and_a_twin_message() -> None:
    """A4: the checks fail for a message outside the catalog, one without a tag, a shared tag."""
    [stray, *_] = message_classes([__name__])
    assert stray is StrayMessage
    assert StrayMessage not in protocol.MESSAGE_TYPES
    problems = protocol.catalog_problems([*protocol.MESSAGE_TYPES, Untagged, Twin])
    assert problems == [
        f"{__name__}.Untagged has no explicit tag=...",
        "tag 'memory.remember' is used by both Remember and Twin",
    ]
    with pytest.raises(ProtocolError, match="StrayMessage is not a catalogued message type"):
        protocol.encode_json(StrayMessage())


# -- codecs ----------------------------------------------------------------------------------------


def test_envelope_and_messages_round_trip_through_both_codecs() -> None:
    """A4: a message and an envelope come back equal from JSON and msgpack, by their tag."""
    message = SearchScore(
        query=Query(terms=("deploys",), now=1, scopes=frozenset({"project"})),
        idfs={"deploys": 1.5},
        avgdl=3.0,
    )
    envelope = protocol.Envelope(to="memory/project", message=Delete(fact_id="f1"))
    assert protocol.decode_json(protocol.encode_json(message)) == message
    assert protocol.decode_msgpack(protocol.encode_msgpack(message)) == message
    assert protocol.decode_envelope_json(protocol.encode_json(envelope)) == envelope
    assert protocol.decode_envelope_msgpack(protocol.encode_msgpack(envelope)) == envelope
    assert b'"type":"memory.delete"' in protocol.encode_json(envelope)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b'{"type": "memory.nope"}', "Invalid value 'memory.nope' - at `$.type`"),
        (b'{"type": "memory.get", "fact_id": 7}', "Expected `str`, got `int` - at `$.fact_id`"),
        (b'{"type": "memory.get"}', "missing required field `fact_id`"),
        (b'{"type": "memory.get", "fact_id"', "malformed message"),
    ],
)
def test_bad_input_is_a_protocol_error_naming_the_tag_or_path(data: bytes, words: str) -> None:
    """A4: undecodable input raises ProtocolError naming the unknown tag or msgspec's path."""
    with pytest.raises(ProtocolError, match=re.escape(words)):
        protocol.decode_json(data)
    with pytest.raises(ProtocolError, match=re.escape("at `$.message")):
        protocol.decode_envelope_json(b'{"to": "x", "message": {"type": "memory.get"}}')


def test_a_live_object_is_refused_naming_its_field() -> None:
    """A4: encoding a message that holds a live object names the message's tag and the field."""
    # msgspec does not validate on construction: a caller can still put anything in a field.
    held = Remember(text="x", reply_to=threading.Event())  # type: ignore[arg-type]
    for encode in (protocol.encode_json, protocol.encode_msgpack):
        with pytest.raises(ProtocolError, match=r"memory\.remember.*reply_to \(threading\.Event\)"):
            encode(held)
