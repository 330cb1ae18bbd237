"""`journaled schema`: the JSON Schema of every stored event and message, checked on a real journal.

The schema is generated from the types (msgspec); these tests validate events read back from a
real SQLite journal against it with an independent validator (jsonschema), so a stored shape and
its published schema cannot drift apart unnoticed (SPEC A4).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import msgspec
import protocol_story
import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator

import journaled
from journaled.cli import main
from journaled.events.base import Event
from journaled.events.catalog import STORED_EVENTS
from journaled.events.protocol import MESSAGE_TYPES

STORY_TAGS = {
    "memory.fact-remembered",
    "memory.fact-superseded",
    "memory.conflict-key-claimed",
    "memory.fact-deleted",
    "memory.fact-purged",
    "run.started",
    "run.step-succeeded",
    "run.step-failed",
    "run.step-waiting",
    "run.answers-given",
    "run.resumed",
    "run.cancel-requested",
    "run.suspended",
    "run.purged",
    "run.finished",
    "orchestration.started",
    "orchestration.plan-proposed",
    "orchestration.suspended",
    "orchestration.ended",
}
"""Tags the story must produce, so a story that silently shrank cannot pass."""


def schema_document() -> dict[str, Any]:
    """Return what `journaled schema --json` prints, parsed."""
    result = CliRunner().invoke(main, ["schema", "--json"])
    assert result.exit_code == 0, result.output
    document: dict[str, Any] = json.loads(result.output)
    return document


def validators(document: dict[str, Any]) -> dict[str, Draft202012Validator]:
    """Return a validator per event tag, each resolving its $ref in the document's $defs."""
    return {
        entry["tag"]: Draft202012Validator({**entry["schema"], "$defs": document["$defs"]})
        for entry in document["events"]
    }


def test_schema_lists_every_event_with_tag_and_version_and_every_message() -> None:
    """A4: `schema --json` has each stored event (tag, version, topic) and each message type."""
    document = schema_document()
    events = {e["tag"]: e for e in document["events"]}
    assert set(events) == {cls.__struct_config__.tag for cls in STORED_EVENTS}
    for cls in STORED_EVENTS:
        entry = events[str(cls.__struct_config__.tag)]
        assert entry["version"] == cls.version
        assert entry["topic"] == f"{cls.__struct_config__.tag}@{cls.version}"
        assert entry["fields"] == [f.encode_name for f in msgspec.structs.fields(cls)]
    messages = [m["tag"] for m in document["messages"]]
    assert messages == [cls.__struct_config__.tag for cls in MESSAGE_TYPES]
    # Messages carry a schema version too (A4: "every event and message type with its tag and
    # version"); every message of this release is at its first.
    assert [m["version"] for m in document["messages"]] == [1] * len(MESSAGE_TYPES)
    assert all(getattr(cls, "version", None) == 1 for cls in MESSAGE_TYPES)
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema({"$defs": document["$defs"]})
    for entry in [*document["events"], *document["messages"], {"schema": document["envelope"]}]:
        assert entry["schema"]["$ref"].removeprefix("#/$defs/") in document["$defs"]


def test_schema_table_names_every_tag_without_opening_a_journal(tmp_path: Any) -> None:
    """A4: `schema` without --json prints a table row per event and message; no journal made."""
    url = f"sqlite:///{tmp_path / 'absent.sqlite'}"
    result = CliRunner().invoke(main, ["--url", url, "schema"])
    assert result.exit_code == 0, result.output
    for tag in [cls.__struct_config__.tag for cls in (*STORED_EVENTS, *MESSAGE_TYPES)]:
        assert f"{tag} " in result.output
    assert "at, fact_id," in result.output
    assert not (tmp_path / "absent.sqlite").exists()


@pytest.fixture(scope="module")
def story_events(tmp_path_factory: pytest.TempPathFactory) -> list[Event]:
    """Tell the representative story on a fresh SQLite file and read every event back."""
    url = f"sqlite:///{tmp_path_factory.mktemp('story') / 'journal.sqlite'}"
    protocol_story.tell(url)
    with journaled.open(url) as rt:
        return rt.journal.read()


def test_real_journal_events_validate_against_the_schema(story_events: list[Event]) -> None:
    """A4: every event of a representative story, read back and JSON-encoded, fits its schema."""
    events = story_events
    checks = validators(schema_document())
    seen: Counter[str] = Counter()
    for event in events:
        instance = json.loads(msgspec.json.encode(event.data))
        assert instance["type"] == event.kind
        errors = [e.message for e in checks[event.kind].iter_errors(instance)]
        assert errors == [], f"#{event.position} {event.kind}: {errors}"
        seen[event.kind] += 1
    assert set(seen) >= STORY_TAGS, STORY_TAGS - set(seen)


def test_validator_rejects_mangled_events(story_events: list[Event]) -> None:
    """A4: the same check fails for a retyped or a missing field, a wrong tag, a nested type."""
    events = story_events
    checks = validators(schema_document())
    superseded = next(e for e in events if e.kind == "memory.fact-superseded")
    good = json.loads(msgspec.json.encode(superseded.data))
    check = checks["memory.fact-superseded"]
    assert check.is_valid(good)
    retyped = {**good, "fact_id": 42}
    missing = {k: v for k, v in good.items() if k != "by"}
    wrong_tag = {**good, "type": "memory.fact-deleted"}
    for mangled in (retyped, missing, wrong_tag):
        assert not check.is_valid(mangled), mangled
    step = next(e for e in events if e.kind == "run.step-succeeded")
    observed = json.loads(msgspec.json.encode(step.data))
    assert checks["run.step-succeeded"].is_valid(observed)
    observed["observation"]["ok"] = "yes"
    with pytest.raises(Exception, match="'yes' is not of type 'boolean'"):
        checks["run.step-succeeded"].validate(observed)
