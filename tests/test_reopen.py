"""A SQLite journal reopened in a new process rebuilds the identical store (J1, M4, M12)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec

import journaled
from journaled.testing import ManualClock

ROOT = Path(__file__).resolve().parent.parent

DUMP = """
import sys, msgspec, journaled
with journaled.open(sys.argv[1]) as rt:
    print(msgspec.json.encode({
        "all": rt.memory.all(),
        "search": [f.id for f in rt.memory.search("deploy api", now=int(sys.argv[2]))],
        "position": rt.journal.position(),
    }).decode())
"""


def test_new_process_finds_the_identical_store(tmp_path: Path) -> None:
    """J1/M4: a fresh process replaying the file answers all() and search() as the writer did."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    clock = ManualClock(step=7)
    with journaled.open(url, clock=clock) as rt:
        a = rt.memory.remember("deploy api with helm", conflict_key="deploy")
        rt.memory.remember("deploy api with argo", conflict_key="deploy", scope="user")
        x = rt.memory.remember("the api is versioned", domain="api", confidence=0.7)
        rt.memory.remember("api keys rotate monthly", valid_until=clock.now + 100_000)
        rt.memory.delete(x.id)
        rt.memory.remember("deploy api via terraform", conflict_key="deploy")
        rt.memory.purge(a.id)
        now = clock.now
        expected = {
            "all": rt.memory.all(),
            "search": [f.id for f in rt.memory.search("deploy api", now=now)],
            "position": rt.journal.position(),
        }
    out = subprocess.run(
        [sys.executable, "-c", DUMP, url, str(now)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=60,
    )
    got = json.loads(out.stdout)
    assert got == json.loads(msgspec.json.encode(expected))
