"""Benchmark of tracing (SPEC T3): the per-step cost of OpenTelemetry spans on the chain.

The 1,000-step chain of no-op tool steps (quick: 200) on a SQLite journal (default durability,
``normal``) is executed in three runtimes opened side by side, each on its own file, in
interleaved rounds so that all three see the same machine:

- off: a runtime never instrumented (``journaled.otel`` not even used for it);
- simple: ``journaled.otel.instrument(rt, tracer_provider=...)`` with the SDK's
  ``SimpleSpanProcessor`` into an ``InMemorySpanExporter`` (every span exported synchronously on
  the thread that ends it; the exporter is cleared after each round and its count checked: one run
  span plus one wave and one step span per step);
- batch: the same with the SDK's ``BatchSpanProcessor`` into an exporter that drops what it gets
  (the processor a production setup uses; its export thread runs beside the executor).

Each figure is the median over the rounds of the wall time of ``rt.execute`` / N, and of the
process CPU time / N, printed as us/step with the ratio to "off" measured in the same run. The
target (tracing on costs at most 1.3x off, wall time) is reported PASS/MISS, never raised.

Run ``python bench/otel.py`` (full) or ``python bench/otel.py --quick``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from report import Row, header, print_table

import journaled
import journaled.otel

TARGET = 1.3


class _Drop(SpanExporter):
    """Export nothing: the cost measured is the SDK's and journaled's, not a collector's."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _chain(n: int) -> journaled.Plan:
    steps = [
        journaled.Step(f"c{i}", tool="noop", depends_on=(f"c{i - 1}",) if i else ())
        for i in range(n)
    ]
    return journaled.Plan(goal="chain", steps=steps)


def _once(rt: journaled.Runtime, n: int) -> tuple[float, float]:
    """Execute the chain once; return (wall, CPU) seconds per step."""
    plan = _chain(n)
    cpu, wall = time.process_time(), time.perf_counter()
    result = rt.execute(plan)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert result.ok
    return wall / n, cpu / n


def main() -> None:
    """Measure the chain with tracing off, on (simple + in-memory) and on (batch), interleaved."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 steps, 3 rounds")
    args = parser.parse_args()
    n, rounds = (200, 3) if args.quick else (1000, 7)
    header(f"tracing overhead on the {n}-step chain", args.quick)

    memory = InMemorySpanExporter()
    simple = TracerProvider()
    simple.add_span_processor(SimpleSpanProcessor(memory))
    batch = TracerProvider()
    batch.add_span_processor(BatchSpanProcessor(_Drop(), max_queue_size=4 * n + 16))
    names = ("off", "simple", "batch")
    walls: dict[str, list[float]] = {k: [] for k in names}
    cpus: dict[str, list[float]] = {k: [] for k in names}
    with tempfile.TemporaryDirectory() as tmp:
        runtimes = {k: journaled.open(f"sqlite:///{Path(tmp) / k}.sqlite") for k in names}
        try:
            for rt in runtimes.values():
                rt.register_tool("noop", lambda x: None)
            journaled.otel.instrument(runtimes["simple"], tracer_provider=simple)
            journaled.otel.instrument(runtimes["batch"], tracer_provider=batch)
            for rt in runtimes.values():  # warm up: threads, statements, pools
                _once(rt, min(n, 50))
            memory.clear()
            batch.force_flush()
            for _ in range(rounds):
                for name, rt in runtimes.items():
                    wall, cpu = _once(rt, n)
                    walls[name].append(wall)
                    cpus[name].append(cpu)
                spans = len(memory.get_finished_spans())
                assert spans == 1 + 2 * n, f"{spans} spans for a {n}-step chain"
                memory.clear()
                batch.force_flush()
        finally:
            for rt in runtimes.values():
                rt.close()
            simple.shutdown()
            batch.shutdown()

    off_wall = statistics.median(walls["off"])
    off_cpu = statistics.median(cpus["off"])
    rows = [
        Row("chain, tracing off (wall)", f"{off_wall * 1e6:,.0f} us/step", "", "", "", None),
        Row("chain, tracing off (CPU)", f"{off_cpu * 1e6:,.0f} us/step", "", "", "", None),
    ]
    for name, label in (("simple", "simple+in-memory"), ("batch", "batch+drop")):
        wall = statistics.median(walls[name])
        cpu = statistics.median(cpus[name])
        rows.append(
            Row(
                f"chain, tracing on, {label} (wall)",
                f"{wall * 1e6:,.0f} us/step",
                f"{off_wall * 1e6:,.0f} us/step off",
                f"{wall / off_wall:.2f}x (+{(wall - off_wall) * 1e6:,.0f} us)",
                f"<= {TARGET}x",
                wall / off_wall <= TARGET,
            )
        )
        rows.append(
            Row(
                f"chain, tracing on, {label} (CPU)",
                f"{cpu * 1e6:,.0f} us/step",
                f"{off_cpu * 1e6:,.0f} us/step off",
                f"{cpu / off_cpu:.2f}x (+{(cpu - off_cpu) * 1e6:,.0f} us)",
                "",
                None,
            )
        )
    print_table(rows)
    print(f"\n{rounds} interleaved rounds, medians; spans per round: 1 run + {n} waves + {n} steps")


if __name__ == "__main__":
    main()
