"""The README's quick start works on a fresh clone with a fresh virtual environment."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def quick_start_commands() -> list[str]:
    """Return the shell commands of the README's quick start block."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "the quick start has a ```sh block"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_quick_start_has_exactly_two_commands() -> None:
    """README: exactly two commands, one for the demo and one for the tests; CI runs the latter."""
    commands = quick_start_commands()
    assert commands == ["./dev demo", "./dev test"]
    assert "./dev test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to make a fresh clone")
def test_demo_command_works_on_a_fresh_clone(tmp_path: Path) -> None:
    """README: `./dev demo` sets up a fresh clone from nothing and runs the demo, twice."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    tracked = subprocess.run(
        ["git", "ls-files", "-m", "-o", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in tracked:  # carry uncommitted work so the test checks the tree under test
        source = ROOT / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "JOURNALED_"))}
    for run in (1, 2):
        out = subprocess.run(
            ["./dev", "demo"],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert "superseded" in out.stdout, f"run {run}"
    assert (clone / ".journaled" / "journal.sqlite").exists()


def python_examples() -> list[str]:
    """Return the README's Python examples that stand alone (those that import journaled)."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    return [b for b in blocks if b.startswith("import journaled")]


@pytest.mark.parametrize("index", range(4))
def test_python_examples_run_as_written(index: int, tmp_path: Path) -> None:
    """README: the tour's Python examples run as written, in a fresh process."""
    examples = python_examples()
    assert len(examples) == 4
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOURNALED_")}
    done = subprocess.run(
        [sys.executable, "-c", examples[index]],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_replan_bound_is_documented_where_orchestrate_is() -> None:
    """O2: the replan loop's bound, ``max_passes``, is named with its default in the README's
    line on ``rt.orchestrate`` and in the method's docstring, sync and asyncio: a user whose
    planner keeps failing learns why the orchestration stopped."""
    import journaled
    import journaled.aio

    text = (ROOT / "README.md").read_text()
    line = text.split("- `rt.orchestrate(", 1)[1].split("\n- ", 1)[0]
    assert "max_passes=3" in line
    assert "at most `max_passes` passes" in line
    for method in (journaled.Runtime.orchestrate, journaled.aio.AsyncRuntime.orchestrate):
        assert "max_passes" in (method.__doc__ or ""), method
