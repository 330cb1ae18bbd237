"""Event encoding, tags, upcasting and released-schema fixtures (J5, J6)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from journaled.events.base import DomainEvent
from journaled.events.catalog import STORED_EVENTS
from journaled.events.catalog import codec as runtime_codec
from journaled.events.codec import Codec, topic_of
from journaled.events.errors import CorruptEvent, UnknownEventType
from journaled.events.memory import MEMORY_EVENTS, FactRemembered, FactSuperseded

FIXTURE = Path(__file__).parent / "fixtures" / "released-events.json"


def test_every_event_type_has_a_unique_explicit_tag() -> None:
    """J6: stored types carry explicit, unique tags, and the runtime codec decodes them all."""
    tags = [c.__struct_config__.tag for c in STORED_EVENTS]
    assert len(set(tags)) == len(tags)
    assert all(isinstance(t, str) and "." in t for t in tags)
    assert set(runtime_codec().types) == set(STORED_EVENTS)
    assert set(MEMORY_EVENTS) <= set(STORED_EVENTS)


def test_a_tagless_class_cannot_be_registered() -> None:
    """J6: an event class without an explicit tag is refused."""

    class Bare(DomainEvent, frozen=True, kw_only=True, tag=True):
        x: int

    with pytest.raises(TypeError, match="explicit tag"):
        Codec([Bare])


def test_duplicate_tags_are_refused() -> None:
    """J6: two classes may not share a tag."""

    class Twin(DomainEvent, frozen=True, kw_only=True, tag="memory.fact-remembered"):
        pass

    with pytest.raises(ValueError, match="two event types"):
        Codec([FactRemembered, Twin])


@given(
    fact_id=st.text(min_size=1, max_size=20),
    by=st.text(min_size=1, max_size=20),
    key=st.text(max_size=20),
    at=st.integers(min_value=0, max_value=2**62),
    until=st.none() | st.integers(min_value=0, max_value=2**62),
)
def test_events_round_trip(fact_id: str, by: str, key: str, at: int, until: int | None) -> None:
    """J5: every event decodes to itself."""
    codec = runtime_codec()
    event = FactSuperseded(at=at, fact_id=fact_id, by=by, conflict_key=key, by_valid_until=until)
    assert codec.decode(codec.topic(event), codec.encode(event)) == event


def test_released_events_still_decode() -> None:
    """J6: every event as released (fixture of payloads) still decodes to the expected values."""
    codec = runtime_codec()
    released: dict[str, dict[str, Any]] = json.loads(FIXTURE.read_text())
    by_topic = {topic_of(c): c for c in STORED_EVENTS}
    by_tag = {topic.rpartition("@")[0]: c for topic, c in by_topic.items()}
    assert set(by_topic) <= set(released), "add a fixture entry for every new event type"
    for topic, payload in released.items():
        event = codec.decode(topic, msgspec.msgpack.encode(payload))
        assert isinstance(event, by_tag[topic.rpartition("@")[0]])
        assert json.loads(msgspec.json.encode(event)) == payload


def test_old_versions_are_upcast() -> None:
    """J6: a payload of an older version goes through its upcaster before decoding."""

    class Renamed(DomainEvent, frozen=True, kw_only=True, tag="test.renamed"):
        version = 2
        name: str

    codec = Codec([Renamed])
    codec.register_upcaster("test.renamed", 1, lambda raw: {**raw, "name": raw.pop("title")})
    event = codec.decode("test.renamed@1", msgspec.msgpack.encode({"at": 5, "title": "x"}))
    assert event == Renamed(at=5, name="x")


def test_unknown_and_newer_topics_fail_clearly() -> None:
    """J5: unknown topics, newer versions and missing upcasters are errors, never skips."""
    codec = runtime_codec()
    with pytest.raises(UnknownEventType, match="no event type"):
        codec.decode("memory.nope@1", b"\x80", position=7)
    with pytest.raises(UnknownEventType, match="newer release"):
        codec.decode("memory.fact-remembered@9", b"\x80", position=7)
    with pytest.raises(UnknownEventType, match="no upcaster"):
        codec.decode("memory.fact-remembered@0", b"\x80", position=7)


def test_wrong_payload_shape_names_the_field() -> None:
    """J5: a payload that does not match its type names the path and the position."""
    codec = runtime_codec()
    bad = msgspec.msgpack.encode({"at": "yesterday", "fact_id": "f", "scope": "project"})
    with pytest.raises(CorruptEvent, match=r"position 12.*\$\.at"):
        codec.decode(topic_of(FactRemembered), bad, position=12)
