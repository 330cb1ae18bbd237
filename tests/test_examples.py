"""The runnable programs in examples/ run offline and show what their docstrings say (X3)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_example(name: str) -> list[str]:
    """Run ``examples/<name>`` in a fresh process; return its output lines."""
    done = subprocess.run(
        [sys.executable, "-W", "error", str(ROOT / "examples" / name)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_autogen_memory_example_runs() -> None:
    """X1/X3: examples/autogen_memory.py: memory, a waiting AutoGen agent step, charging, clear."""
    lines = run_example("autogen_memory.py")
    assert lines[0] == "memory knows: ['staging runs in eu-west-1']"
    assert lines[1] == "waiting: ['deploy'] - approve: deploy billing to staging?"
    assert lines[2] == "the model reads: 1. staging runs in eu-west-1"
    assert lines[3] == "step output: deploying billing to eu-west-1"
    assert lines[4] == "calls charged: 1"
    assert lines[5].startswith("why: 1. ")
    assert "from 'ops-chat' with conflict key 'staging-region' superseding" in lines[5]
    assert lines[6].startswith("after clear: 0 facts; why: 3. ")
    assert "deleted at" in lines[6]
    assert len(lines) == 7


def test_the_examples_say_what_they_show() -> None:
    """X3: every example opens with a docstring that says what it shows and how to run it."""
    for path in sorted((ROOT / "examples").glob("*.py")):
        text = path.read_text()
        assert text.startswith('"""'), path.name
        docstring = text.split('"""', 2)[1]
        assert f"python examples/{path.name}" in docstring, path.name
