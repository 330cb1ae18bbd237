"""Benchmark of start-up (SPEC T4): wall time of `import journaled` and read-only CLI commands.

Each command runs N times as a fresh process; the row gives its median wall time, the median of
``python -c pass`` measured in the same run as the baseline, their ratio, and PASS/MISS against
the target: 0.3 s wall per command. A miss is reported, never raised.

The journal is a small SQLite file (a few runs, one of them an orchestration, and facts). The
commands that open a full runtime (`runs why`, `journal tail`, `memory search`) have the same
target. The informative row (no target) shows `runs list` over a larger journal, from the stored
run-summary projection plus its tail.

Run ``python bench/startup.py`` (N = 15) or ``python bench/startup.py --quick`` (N = 5).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import Row, header, print_table

import journaled

TARGET = 0.3
"""Seconds of wall time per command (T4)."""
BIN = Path(sys.executable).parent
SMALL_RUNS = 5
LARGE_RUNS = 300


def _wall(argv: list[str], runs: int, cwd: Path) -> float:
    """Return the median wall time of running ``argv`` as a new process ``runs`` times.

    As installed code runs: with bytecode caches, written by one uncounted warm-up run (an
    environment that sets PYTHONDONTWRITEBYTECODE would compile every module on every start).
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(argv, cwd=cwd, capture_output=True, check=True, env=env)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, capture_output=True, check=True, env=env)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _journal(path: Path, runs: int) -> str:
    url = f"sqlite:///{path}"
    with journaled.open(url) as rt:
        rt.register_tool("fetch", lambda _: "page")
        rt.register_skill("summarize", lambda _: "summary")
        rt.memory.remember("the deploy runs on Fridays", conflict_key="deploy-day")
        for i in range(runs):
            steps = [
                journaled.Step("a", tool="fetch"),
                journaled.Step("b", skill="summarize", depends_on=["a"]),
            ]
            rt.execute(journaled.Plan(goal=f"goal {i}", steps=steps))
        rt.orchestrate(
            "orchestrated",
            lambda goal, _obs, _cl: journaled.Plan(
                goal=goal, steps=[journaled.Step("a", tool="fetch")]
            ),
        )
    return url


def main() -> None:
    """Measure each command and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="5 runs per command")
    args = parser.parse_args()
    n = 5 if args.quick else 15
    header(f"Start-up: median wall time of a fresh process, N = {n}", args.quick)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        small = _journal(work / "small.sqlite", SMALL_RUNS)
        large = _journal(work / "large.sqlite", LARGE_RUNS)
        run_id = journaled.open(small).runs.list(limit=1)[0].run_id  # closes at exit below
        cli = [str(BIN / "journaled")]
        baseline = _wall([sys.executable, "-c", "pass"], n, work)
        targeted = {
            "import journaled": [sys.executable, "-c", "import journaled"],
            "journaled runs list": [*cli, "--url", small, "runs", "list"],
            "journaled runs list --json": [*cli, "--url", small, "runs", "list", "--json"],
            "journaled runs follow RUN --json": [
                *cli,
                "--url",
                small,
                "runs",
                "follow",
                run_id,
                "--json",
            ],
            # These open a full runtime (memory replayed, actors started and stopped).
            "runs why RUN (opens a runtime)": [*cli, "--url", small, "runs", "why", run_id],
            "journal tail (opens a runtime)": [*cli, "--url", small, "journal", "tail"],
            "memory search (opens a runtime)": [*cli, "--url", small, "memory", "search", "deploy"],
        }
        informative = {
            f"runs list, {LARGE_RUNS} runs": [*cli, "--url", large, "runs", "list", "--json"],
        }
        rows = [Row("python -c pass", f"{baseline:.3f} s", "", "", "", None)]
        for name, argv in targeted.items():
            wall = _wall(argv, n, work)
            rows.append(
                Row(
                    name,
                    f"{wall:.3f} s",
                    f"{baseline:.3f} s",
                    f"{wall / baseline:.1f}x",
                    f"<= {TARGET} s",
                    wall <= TARGET,
                )
            )
        for name, argv in informative.items():
            wall = _wall(argv, n, work)
            rows.append(
                Row(name, f"{wall:.3f} s", f"{baseline:.3f} s", f"{wall / baseline:.1f}x", "", None)
            )
    print_table(rows)


if __name__ == "__main__":
    main()
