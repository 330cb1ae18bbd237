"""A small filesystem of a test's own, filled until the kernel answers ENOSPC (ADR 0081).

A tmpfs of a few MiB, mounted for one test and unmounted after: the journal meets a real full
disk, not a stand-in. Mounting needs root and mount(8), which CI and these machines have.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

needs_mount = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mount") is None,
    reason="a small filesystem of the test's own needs root and mount(8)",
)


@contextmanager
def mounted(where: Path, size: str = "4m") -> Iterator[Path]:
    """Mount a tmpfs of ``size`` at ``where`` (made if missing); unmount it after."""
    where.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Write a file on ``disk`` until the kernel says it is full; return the file."""
    filler = disk / "filler"
    with filler.open("ab", buffering=0) as out:
        while _wrote(out):
            pass
    return filler


def _wrote(out: Any) -> bool:
    """Write a page to ``out``: False once the disk is full (any other error is raised)."""
    try:
        out.write(b"x" * 4096)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        return False
    return True


class FillingEcho:
    """A tool echoing its input with 2 KB of padding, that fills ``disk`` (once) in the call
    whose input is ``at``: the disk fills while that step runs, before its result is stored."""

    def __init__(self, disk: Path, at: int) -> None:
        self.disk = disk
        self.at = at
        self.calls: list[int] = []
        self.filled: list[Path] = []

    def __call__(self, value: int) -> dict[str, Any]:
        self.calls.append(value)
        if value == self.at and not self.filled:
            self.filled.append(fill(self.disk))
        return {"echo": value, "pad": "y" * 2000}

    def free(self) -> None:
        """Remove the file that filled the disk."""
        for filler in self.filled:
            filler.unlink()
