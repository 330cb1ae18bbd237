"""The command line as an operator scripts it: odd encodings, narrow screens, closed pipes.

ADR 0023 (one line, no traceback), T2 (`runs follow` exit statuses), R7 (`journal verify`'s).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import journaled
from journaled import Plan, Step

JOURNALED = str(Path(sys.executable).with_name("journaled"))


def _world(url: str) -> dict[str, str]:
    """Two runs (one a fork) that read a fact, then a superseding fact; all text ASCII."""
    with journaled.open(url) as rt:
        rt.register_tool("read", lambda x, ctx: [f.id for f in ctx.memory.search("python")])
        rt.register_tool("ok", lambda x: x)
        old = rt.memory.remember("The build uses Python 3.11", conflict_key="py")
        run = rt.execute(
            Plan(
                goal="g",
                steps=[
                    Step("a", tool="read", input=1),
                    Step("b", tool="ok", input=2, depends_on=["a"]),
                ],
            )
        )
        new = rt.memory.remember("The build uses Python 3.12", conflict_key="py")
        fork = rt.runs.fork(run.run_id)
        rt.resume(fork)
        hist = rt.runs.history(run.run_id)
    return {
        "run": run.run_id,
        "fork": fork,
        "old": old.id,
        "new": new.id,
        "first": str(hist[0].position),
        "last": str(hist[-1].position),
    }


def _run(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **env}
    full.pop("JOURNALED_URL", None)
    return subprocess.run(
        [JOURNALED, "--url", url, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=full,
        errors="replace",
    )


# -- a non-UTF-8 stdout ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "which",
    [
        "runs show RUN",
        "runs diff RUN FIRST LAST",
        "runs compare RUN FORK",
        "schema",
        "runs follow RUN",
    ],
)
def test_plain_output_survives_an_ascii_stdout(sqlite_url: str, which: str) -> None:
    """ADR 0006/0023: human output goes through rich/`_out`; on a terminal whose encoding is not
    UTF-8 (LANG=C with UTF-8 mode off, an old latin-1 box, PYTHONIOENCODING=ascii) every
    command still prints, with stand-ins for what it cannot encode, and never a traceback.
    The project's own ✓, → and … raised UnicodeEncodeError (exit 1)."""
    w = _world(sqlite_url)
    args = (
        which.replace("RUN", w["run"])
        .replace("FORK", w["fork"])
        .replace("FIRST", w["first"])
        .replace("LAST", w["last"])
        .split()
    )
    done = _run(sqlite_url, *args, PYTHONIOENCODING="ascii")
    assert "Traceback" not in done.stderr, done.stderr[-400:]
    assert done.returncode == 0, done.stderr[-400:]
    assert done.stdout.strip()


# -- a narrow screen: fact ids are never cut ------------------------------------------------


@pytest.mark.parametrize("columns", ["20", "40"])
@pytest.mark.parametrize(
    "command", [["memory", "search", "python"], ["memory", "as-of", "--position", "1"]]
)
def test_fact_tables_never_cut_ids_on_a_narrow_screen(
    sqlite_url: str, columns: str, command: list[str]
) -> None:
    """cli_render.facts_table: "Tabulate facts: id, scope, text ..., ids never cut." With
    COLUMNS=20 or 40 the id column is squeezed to `mem_0mxe1…`: the id a user copies into
    `memory why` is gone (runs list keeps whole rows when piped; the fact table does not)."""
    w = _world(sqlite_url)
    done = _run(sqlite_url, *command, COLUMNS=columns)
    assert done.returncode == 0, done.stderr
    fact = w["new"] if command[1] == "search" else w["old"]
    assert fact in done.stdout, done.stdout


# -- a closed pipe keeps the exit statuses that mean something ------------------------------------


def _into_closed_pipe(url: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    """Run a command whose stdout is a pipe nobody reads any more (`| head -1` gone)."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes: EPIPE on its first write
    env = {k: v for k, v in os.environ.items() if k != "JOURNALED_URL"}
    try:
        return subprocess.run(
            [JOURNALED, "--url", url, *args],
            check=False,
            stdout=write,
            stderr=subprocess.PIPE,
            timeout=60,
            env=env,
        )
    finally:
        os.close(write)


@pytest.mark.parametrize("as_json", [True, False])
def test_runs_follow_into_a_closed_pipe_is_not_an_unknown_run(
    sqlite_url: str, as_json: bool
) -> None:
    """`runs follow --help`: "0 completed ...; 1 for an unknown run". `runs follow RUN | head -1`
    on a completed run exits 1 (click's EPIPE rule), which a script reads as "no such run".
    `journal tail` in the same pipe stops quietly with 0; follow should too (or keep the
    settled status), quietly."""
    w = _world(sqlite_url)
    args = ["--json"] if as_json else []
    done = _into_closed_pipe(sqlite_url, *args, "runs", "follow", w["run"])
    assert b"Traceback" not in done.stderr
    assert done.returncode != 1, "exit 1 means 'unknown run' to runs follow"


def test_journal_verify_into_a_closed_pipe_is_not_a_tampered_journal(sqlite_url: str) -> None:
    """R7: `journal verify` exits 1 "when any is found" (altered/removed/undecodable event).
    A healthy journal verified into a closed pipe also exits 1, indistinguishable from
    tampering to a script using the status (`set -o pipefail`)."""
    _world(sqlite_url)
    assert _run(sqlite_url, "journal", "verify").returncode == 0
    done = _into_closed_pipe(sqlite_url, "journal", "verify")
    assert b"Traceback" not in done.stderr
    assert done.returncode != 1, "exit 1 means 'the journal was tampered with' to verify"


def test_journal_tail_into_a_closed_pipe_exits_0(sqlite_url: str) -> None:
    """journal tail stops quietly with 0 when its reader is gone."""
    _world(sqlite_url)
    done = _into_closed_pipe(sqlite_url, "journal", "tail")
    assert done.returncode == 0
    assert done.stderr == b""
