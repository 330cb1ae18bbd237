"""Start-up cost (SPEC T4): no backend driver is imported before its URL is used."""

from __future__ import annotations

import json
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


HEAVY = ("rich", "psycopg", "pykka", "eventsourcing")
MODULES = """
import sys
loaded = {m.split(".")[0] for m in sys.modules} & set(sys.argv[1:])
print("LOADED", *sorted(loaded))
"""


def _loaded_after(code: str, *argv: str) -> set[str]:
    probe = code + MODULES
    done = subprocess.run(
        [sys.executable, "-c", probe, *HEAVY, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    last = done.stdout.splitlines()[-1].split()
    assert last[0] == "LOADED", done.stdout
    return set(last[1:])


CLI_PROBE = """
import sys
from journaled.cli import main
args = sys.argv[sys.argv.index("--") + 1:]
try:
    main(args, standalone_mode=False)
except SystemExit:
    pass
"""


def _cli_loads(url: str, *args: str) -> set[str]:
    return _loaded_after(CLI_PROBE, "--", "--url", url, *args)


def _small_journal(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'small.sqlite'}"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, journaled\n"
            "with journaled.open(sys.argv[1]) as rt:\n"
            "    rt.register_tool('t', lambda x: x)\n"
            "    rt.execute(journaled.Plan(goal='g', steps=[journaled.Step('a', tool='t')]))\n",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return url


def test_import_journaled_loads_no_actor_system_journal_or_terminal_library() -> None:
    """T4: `import journaled` loads neither pykka, eventsourcing, rich nor psycopg."""
    assert _loaded_after("import journaled") == set()


def test_a_public_name_still_loads_on_first_use() -> None:
    """T4: journaled.Plan and journaled.open are there when first used (loaded lazily)."""
    code = "import journaled\njournaled.open\nassert journaled.Plan(goal='g', steps=[])"
    loaded = _loaded_after(code)
    assert "pykka" in loaded
    assert "psycopg" not in loaded


def test_read_only_runs_commands_as_json_load_neither_rich_nor_psycopg(tmp_path: Path) -> None:
    """T4: runs list --json and runs follow --json load no rich, psycopg or actor system."""
    url = _small_journal(tmp_path)
    assert _cli_loads(url, "runs", "list", "--json") == {"eventsourcing"}
    run_id = json.loads(
        subprocess.run(
            [sys.executable, "-m", "journaled.cli", "--url", url, "runs", "list", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    )[0]["run_id"]
    assert _cli_loads(url, "runs", "follow", run_id, "--json") == {"eventsourcing"}


def test_the_runs_table_loads_rich_but_no_driver_or_actors(tmp_path: Path) -> None:
    """T4: runs list (a table) loads rich only to render, and no psycopg or pykka."""
    url = _small_journal(tmp_path)
    assert _cli_loads(url, "runs", "list") == {"eventsourcing", "rich"}
