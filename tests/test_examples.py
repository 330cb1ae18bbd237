"""Every program in examples/ runs offline and prints what its docstring promises (SPEC X3)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

ID = r"[a-z]+_[0-9a-z_]+"
EXPECTED: dict[str, list[str]] = {
    "foreign_actor.py": [
        r"remembered mem_[0-9a-z_]+: releases ship on Fridays",
        r"search found: \['releases ship on Fridays'\]",
        rf"run {ID} started; carrying on without waiting",
        r"run ended ok=True: v2.0 is out, SHIP IT",
    ],
    "asyncio_app.py": [
        r"remembered mem_[0-9a-z_]+: the release freeze starts on Wednesday",
        r"search found: \['the release freeze starts on Wednesday'\]",
        rf"run {ID} started; the app carries on",
        r"run ended ok=True calls_used=1: Release 2.0 ships on Friday after the freeze\.",
        r"the loop stayed free: heartbeat ticked during the run: True",
        rf"why: run {ID} — completed:",
    ],
    "autogen_memory.py": [
        r"memory knows: \['staging runs in eu-west-1'\]",
        r"waiting: \['deploy'\] - approve: deploy billing to staging\?",
        r"the model reads: 1\. staging runs in eu-west-1",
        r"step output: deploying billing to eu-west-1",
        r"calls charged: 1",
        r"why: 1\. .*from 'ops-chat' with conflict key 'staging-region' superseding.*",
        r"after clear: 0 facts; why: 3\. .*deleted at.*",
    ],
    "mcp_client.py": [
        r"tools: memory_remember, memory_search, memory_why, memory_history, memory_as_of, "
        r"runs_list, runs_why, runs_at, runs_stale",
        rf"remembered {ID}, superseding {ID}",
        r"search found: \['on-call is Bob'\]",
        rf"why {ID}: 2\. \[#\d+\] superseded at .* by {ID}, which claimed the same conflict key "
        r"'on-call'",
        rf"run {ID}: completed, goal 'triage ticket 42', calls used 1",
        r"why the run: now: completed using 1 model call\(s\)",
        r"refused: position: 10000 is past the end of the journal \(its last position is \d+\)",
    ],
}
"""Lines each example must print, in this order (regular expressions, each a whole line)."""


def test_every_example_has_a_docstring_and_expected_output() -> None:
    """X3: each example says what it shows and has its output checked here."""
    assert {path.name for path in EXAMPLES} >= {
        "foreign_actor.py",
        "asyncio_app.py",
        "mcp_client.py",
        "autogen_memory.py",
    }
    for path in EXAMPLES:
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc, f"{path.name} has no docstring saying what it shows"
        assert f"python examples/{path.name}" in doc, f"{path.name}: say how to run it"
        assert path.name in EXPECTED, f"add the lines {path.name} prints to EXPECTED"


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_the_example_runs_offline_and_prints_what_it_shows(path: Path) -> None:
    """X3: the example exits 0 and prints its expected lines, in order, with no network."""
    done = subprocess.run(
        [sys.executable, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = iter(done.stdout.splitlines())
    for pattern in EXPECTED.get(path.name, []):
        assert any(re.fullmatch(pattern, line) for line in lines), (
            f"{path.name} did not print a line matching {pattern!r} (in order):\n{done.stdout}"
        )
