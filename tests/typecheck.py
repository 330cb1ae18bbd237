"""Type-check a snippet as a user's code is checked: ``mypy --strict`` in a process of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def mypy_strict(tmp_path: Path, lines: list[str]) -> subprocess.CompletedProcess[str]:
    """Write ``lines`` to a module in ``tmp_path`` and run ``mypy --strict`` on it from the
    repository's root (the package's own types, not the tests' settings); return the run."""
    probe = tmp_path / "probe.py"
    probe.write_text("\n".join(lines) + "\n")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--follow-imports=silent",
            str(probe),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=Path(__file__).resolve().parent.parent,
    )
