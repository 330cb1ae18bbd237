"""Start-up cost (SPEC T4): no backend driver is imported before its URL is used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROBE = """
import sys
import journaled
assert "psycopg" not in sys.modules, "import journaled imported psycopg"
with journaled.open(sys.argv[1]) as rt:
    rt.memory.remember("a fact")
assert "psycopg" not in sys.modules, "a SQLite journal imported psycopg"
print("ok")
"""


def test_a_sqlite_user_never_imports_the_postgresql_driver(tmp_path: Path) -> None:
    """T4: importing journaled and using a SQLite journal leave psycopg unimported."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, url], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_postgresql_url_still_opens_with_its_driver(pg_url: str) -> None:
    """T4: the driver is imported when a PostgreSQL URL is used, and the journal works."""
    probe = (
        "import sys, journaled\n"
        "with journaled.open(sys.argv[1]) as rt:\n"
        "    rt.memory.remember('a fact')\n"
        "    assert len(rt.memory.all()) == 1\n"
        "assert 'psycopg' in sys.modules\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, pg_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
