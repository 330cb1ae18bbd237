"""Growth of the timeline page and of the wave scheduler with the plan's size (O7, E2).

For a chain of n and 2n steps it prints the timeline page's bytes and build time, and the time
``waves()`` takes on a chain listed last step first (the order a layer-by-layer scan handles
worst), with the 2n/n ratio of each: about 2 is linear, about 4 quadratic.

Run ``python bench/timeline.py`` for the full sizes or ``python bench/timeline.py --quick``.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import Row, header, print_table  # the helper beside this script

import journaled
from journaled import Plan, Step, timeline
from journaled.events.plan_rules import waves

LINEAR = 2.2
"""A 2n/n ratio under this is linear growth (quadratic would be about 4)."""


def _chain(n: int) -> list[Step]:
    return [Step(f"s{i}", tool="t", depends_on=[f"s{i - 1}"] if i else []) for i in range(n)]


def page(n: int) -> tuple[int, float]:
    """Return the timeline page's size in bytes and its build time in seconds for an n-chain."""
    with journaled.open("memory://") as rt:
        rt.register_tool("t", lambda data: data)
        run_id = rt.execute(Plan(goal="chain", steps=_chain(n))).run_id
        gc.collect()
        gc.disable()  # as timeit does: a collection's cost grows with the heap, not the work
        try:
            start = time.perf_counter()
            text = timeline.render(rt, run_id)
            return len(text.encode("utf-8")), time.perf_counter() - start
        finally:
            gc.enable()


def wave_time(n: int, repeats: int) -> float:
    """Return the best time in seconds of ``waves()`` over an n-chain listed in reverse."""
    steps = _chain(n)[::-1]
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            waves(steps)
            best = min(best, time.perf_counter() - start)
        finally:
            gc.enable()
    return best


def _ratio(name: str, small: float, large: float, unit: str, target: bool) -> Row:
    ratio = large / small if small else float("inf")
    return Row(
        name,
        f"{large:,.3f} {unit}" if unit == "s" else f"{large:,.0f} {unit}",
        f"{small:,.3f} {unit}" if unit == "s" else f"{small:,.0f} {unit}",
        f"{ratio:.2f}x",
        f"< {LINEAR}x" if target else "",
        ratio < LINEAR if target else None,
    )


def main() -> None:
    """Measure at n and 2n and print the table (ours = 2n, baseline = n)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke run (< 60 s)")
    quick = parser.parse_args().quick
    n_page = 100 if quick else 400
    n_waves = 20_000 if quick else 100_000
    header("journaled timeline and waves growth", quick)
    small_bytes, small_time = page(n_page)
    large_bytes, large_time = page(2 * n_page)
    rows = [
        _ratio(
            f"timeline page, {2 * n_page} vs {n_page} steps", small_bytes, large_bytes, "B", True
        ),
        Row(
            f"timeline page bytes per step at {2 * n_page}",
            f"{large_bytes / (2 * n_page):,.0f} B",
            f"{small_bytes / n_page:,.0f} B",
            "",
            "",
            None,
        ),
        _ratio(
            f"timeline build, {2 * n_page} vs {n_page} steps", small_time, large_time, "s", True
        ),
        _ratio(
            f"waves() reverse chain, {2 * n_waves} vs {n_waves}",
            wave_time(n_waves, 5),
            wave_time(2 * n_waves, 5),
            "s",
            True,
        ),
    ]
    print_table(rows)


if __name__ == "__main__":
    main()
