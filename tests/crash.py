"""Kill a child process with SIGKILL while it has steps in flight (E14, O5 crash tests)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_SECONDS = 30.0


def kill_when_in_flight(script: str, config: str, markers: list[Path], workdir: Path) -> None:
    """Run ``python -c script config``; once every marker file exists, SIGKILL the child.

    The markers are written by the child's step code when the step is in flight, so they decide
    when to kill; the loop only polls for them. Fails the test if the child exits first, takes
    too long, or printed a result (it must not have finished).
    """
    out = workdir / "child.out"
    err = workdir / "child.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, config], cwd=ROOT, stdout=stdout, stderr=stderr
        )
        try:
            deadline = time.monotonic() + DEADLINE_SECONDS
            while not all(m.exists() for m in markers):
                if proc.poll() is not None:
                    pytest.fail(
                        f"the child exited ({proc.returncode}) before its steps were in flight:\n"
                        + err.read_text()
                    )
                if time.monotonic() > deadline:
                    names = [m.name for m in markers]
                    pytest.fail(f"{names} were not all in flight within {DEADLINE_SECONDS}s")
                time.sleep(0.01)  # polling interval, not synchronisation: the markers decide
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=DEADLINE_SECONDS) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=DEADLINE_SECONDS)
    assert out.read_text() == "", "the killed child must not have finished"


def run_script(script: str, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run a Python script in a fresh interpreter, with faulthandler on: signals and crashes
    stay there, and a crash prints the stacks."""
    return subprocess.run(  # our own interpreter and script
        [sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
