"""Benchmark of Ray placement (SPEC S1): CPU-bound steps across processes, and what it costs.

Two measurements, in one run, on a local Ray cluster started here with one CPU slot per core:

- 40 tool steps of ~100 ms of pure-Python work each, ``max_parallel_steps=2``, run on local
  threads (one GIL) and on Ray workers (one process each). Target: Ray at least 1.6x faster;
  PASS/MISS is reported, never raised.
- The same number of no-op tool steps on both: µs of wall time per step, so the difference is
  the per-step cost of sending a step to a Ray worker and its result back (informative).

Ray starts its worker processes at niceness 15, so that on a host busy with other work they
yield to everything else; the threads run at the driver's own. The comparison sets the workers'
niceness to 0 (``--niceness`` to change it), as a cluster dedicated to steps would
(``RAY_worker_niceness=0 ray start ...``).

Ray's workers are warmed up by one small run first (a cluster serves many runs; starting its
worker processes is not a per-step cost). The journal is an in-memory one on both sides. Each
measurement is the best of 3 interleaved rounds (1 with ``--quick``).

Run ``python bench/scale.py`` or ``python bench/scale.py --quick`` (fewer no-op steps).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import ray
from report import Row, header, print_table

import journaled
from journaled import Plan, Step
from journaled.ray import RaySteps

TARGET = 1.6
"""How many times faster the CPU-bound run must be on Ray than on threads (S1)."""
CPU_STEPS = 40
WORK_SECONDS = 0.1


def spin(loops: int) -> int:
    """Do ``loops`` rounds of pure-Python arithmetic (holds the GIL throughout)."""
    total = 0
    for i in range(loops):
        total = (total + i * i) % 1_000_003
    return total


def burn(value: dict[str, Any]) -> int:
    """A step of about 100 ms of pure-Python work."""
    return spin(value["loops"])


def noop(value: Any) -> None:
    """A step that does nothing."""


def calibrate() -> int:
    """Return the loop count that takes about :data:`WORK_SECONDS` of this core's time.

    The best of several timings: on a busy host a single one counts the time other processes
    had the core.
    """
    loops = 100_000
    while True:
        took = min(_timed(loops) for _ in range(5))
        if took > 0.02:
            return max(1, int(loops * WORK_SECONDS / took))
        loops *= 2


def _timed(loops: int) -> float:
    began = time.perf_counter()
    spin(loops)
    return time.perf_counter() - began


def run(rt: journaled.Runtime, tool: str, n: int, value: Any) -> float:
    """Run ``n`` independent steps of ``tool``, two at a time; return the wall seconds."""
    plan = Plan(goal="scale", steps=[Step(f"s{i}", tool=tool, input=value) for i in range(n)])
    began = time.perf_counter()
    result = rt.execute(plan, max_parallel_steps=2)
    took = time.perf_counter() - began
    if not result.ok:
        raise SystemExit(f"the {tool} run failed: {result.observations[:1]}")
    return took


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--niceness",
        type=int,
        default=0,
        help="the Ray workers' niceness (Ray's own default is 15; 0 is the threads' own)",
    )
    args = parser.parse_args()
    noops = 100 if args.quick else 400
    rounds = 1 if args.quick else 3
    header("Ray placement: CPU-bound steps on threads vs Ray workers", args.quick)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"ray {ray.__version__}, Ray worker niceness {args.niceness}, load average {load}")
    print("(the Ray rows need the cores free: a load above the core count hides the gain)\n")
    loops = calibrate()
    work = {"loops": loops}
    cpus = os.cpu_count() or 2
    ray.init(
        num_cpus=cpus,
        include_dashboard=False,
        log_to_driver=False,
        _system_config={"worker_niceness": args.niceness},
    )
    try:
        steps = RaySteps()
        with journaled.open("memory://") as local, journaled.open("memory://", steps=steps) as far:
            for rt in (local, far):
                rt.register_tool("burn", burn)
                rt.register_tool("noop", noop)
            run(far, "noop", 2 * cpus, None)  # start the cluster's worker processes
            # Interleaved rounds, best of each: a machine shared with other work slows both.
            threads = on_ray = local_noop = ray_noop = float("inf")
            for _ in range(rounds):
                threads = min(threads, run(local, "burn", CPU_STEPS, work))
                on_ray = min(on_ray, run(far, "burn", CPU_STEPS, work))
                local_noop = min(local_noop, run(local, "noop", noops, None))
                ray_noop = min(ray_noop, run(far, "noop", noops, None))
    finally:
        ray.shutdown()
    speedup = threads / on_ray
    local_us = local_noop / noops * 1e6
    ray_us = ray_noop / noops * 1e6
    rows = [
        Row(
            f"{CPU_STEPS} steps of ~{WORK_SECONDS * 1000:.0f} ms, 2 at a time (s)",
            f"ray {on_ray:.2f}",
            f"threads {threads:.2f}",
            f"{speedup:.2f}x",
            f">= {TARGET}x",
            speedup >= TARGET,
        ),
        Row(
            f"{noops} no-op steps, 2 at a time (µs/step)",
            f"ray {ray_us:.0f}",
            f"threads {local_us:.0f}",
            f"+{ray_us - local_us:.0f} µs",
            "",
            None,
        ),
    ]
    print_table(rows)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
