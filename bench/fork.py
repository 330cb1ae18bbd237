"""Cost of forking a 1,000-step run at its middle, against rebuilding it there (F1, O7).

A fork folds the source's stream up to the position (as ``rt.runs.at`` does), then appends one
``run.forked`` event holding the plan and the carried-over observations. The table prints the
median time of each over several repeats on a SQLite file, and the fork's share over ``at``.

Run ``python bench/fork.py`` for the full size or ``python bench/fork.py --quick``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import Row, header, print_table  # the helper beside this script

import journaled
from journaled import Plan, Step

TARGET_MS = 20.0
"""SPEC target for a fork of a 1,000-step run at its middle."""


def _plan(n: int) -> Plan:
    # Layers of 100 independent steps, each layer depending on one step of the previous: a few
    # waves, so the run is quick to produce while its stream has every kind of step event.
    steps = []
    for i in range(n):
        layer = i // 100
        deps = [f"s{(layer - 1) * 100}"] if layer else []
        steps.append(Step(f"s{i}", tool="t", input={"i": i}, depends_on=deps))
    return Plan(goal="a thousand steps", steps=steps)


def measure(n: int, repeats: int) -> tuple[float, float, int]:
    """Return the median ms of fork and of ``runs.at`` at the run's middle, and the position."""
    with tempfile.TemporaryDirectory() as tmp, journaled.open(f"sqlite:///{tmp}/j.db") as rt:
        rt.register_tool("t", lambda data: data)
        run_id = rt.execute(_plan(n), max_parallel_steps=16).run_id
        history = rt.runs.history(run_id)
        middle = history[len(history) // 2].position
        forks, ats = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            rt.runs.fork(run_id, middle)
            forks.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            rt.runs.at(run_id, middle)
            ats.append((time.perf_counter() - start) * 1000)
        return statistics.median(forks), statistics.median(ats), middle


def main() -> None:
    """Measure and print the table (ours = fork, baseline = runs.at at the same position)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats, a smoke run")
    quick = parser.parse_args().quick
    n = 1000
    repeats = 5 if quick else 25
    header("journaled fork of a 1,000-step run", quick)
    fork_ms, at_ms, middle = measure(n, repeats)
    print_table(
        [
            Row(
                f"fork at its middle (#{middle}), {n} steps",
                f"{fork_ms:.1f} ms",
                f"{at_ms:.1f} ms (runs.at)",
                f"{fork_ms / at_ms:.2f}x" if at_ms else "",
                f"<= {TARGET_MS:g} ms",
                fork_ms <= TARGET_MS,
            )
        ]
    )


if __name__ == "__main__":
    main()
