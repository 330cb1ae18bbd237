"""docs/protocol.md cannot drift (SPEC A4): its examples decode, its tables name every message."""

from __future__ import annotations

import re
from pathlib import Path

from journaled.events import gateway_messages, protocol

DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"
BLOCK = re.compile(r"```json\n(.*?)```", re.DOTALL)


def examples() -> list[str]:
    """Return every JSON block of the protocol page."""
    return BLOCK.findall(DOC.read_text())


def test_every_json_example_decodes_as_an_envelope_of_the_protocol() -> None:
    """A4: each JSON example on docs/protocol.md decodes with the protocol codec and re-encodes."""
    found = examples()
    assert len(found) >= 20
    for text in found:
        encoded = protocol.encode_json(protocol.decode_envelope_json(text))
        assert protocol.encode_json(protocol.decode_envelope_json(encoded)) == encoded


def test_the_page_names_every_gateway_message_and_shows_the_main_pairs() -> None:
    """A4: the tables name every gateway request and reply; examples show the key exchanges."""
    text = DOC.read_text()
    tags = [
        cls.__struct_config__.tag
        for cls in protocol.MESSAGE_TYPES
        if cls.__module__ == gateway_messages.__name__
    ]
    assert len(tags) >= 28
    assert [t for t in tags if f"`{t}`" not in text] == []
    shown = {protocol.decode_envelope_json(e).message.__struct_config__.tag for e in examples()}
    assert shown >= {
        "gateway.remember",
        "memory.remembered",
        "gateway.search",
        "gateway.facts",
        "gateway.run-start",
        "gateway.run-started",
        "run.ended",
        "gateway.run-resume",
        "gateway.run-cancel",
        "gateway.journal-read",
        "gateway.events",
        "reply.failure",
    }
