"""Journals earlier layouts wrote (tests/fixtures), copied for a test, and the tools their runs use.

``release2-runs`` holds every wave partition and whole-event side rows (before ADR 0035);
``map-payloads-runs`` holds map payloads and uncompressed caches (before ADR 0040). Each has a
``.json`` beside it with its run ids and the results a reader must find.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import journaled

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def copy_journal(tmp_path: Path, name: str) -> tuple[str, dict[str, Any]]:
    """Copy fixture ``name`` (e.g. ``release2-runs``) into ``tmp_path``; return its URL and
    what it is expected to hold."""
    copy = tmp_path / f"{name}.db"
    shutil.copy(FIXTURES / f"{name}.db", copy)
    expected: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return f"sqlite:///{copy}", expected


def register_tools(rt: journaled.Runtime) -> None:
    """Register the tools the fixtures' runs name, as the scripts that wrote them did."""
    rt.register_tool("noop", lambda data: None)
    rt.register_tool("echo", lambda data: {"echo": data})
    rt.register_tool("crash", lambda data: data)
