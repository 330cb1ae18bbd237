"""Benchmark of time travel (T1): ``runs.at``, ``runs.diff`` and ``memory.as_of`` at past positions.

Every figure is measured on a SQLite journal in a temporary directory, next to a baseline measured
in the same run, with a ratio and PASS/MISS against a target. A miss is reported, never raised.

1. A chain of 10,000 no-op tool steps (quick: the same; it takes a few seconds) is executed. A
   fresh ``journaled.open`` of the file then serves ``rt.runs.at(run, position)``:
   - cold: the first call of a new runtime (what a CLI command pays), p50 over 5 new
     runtimes, at the run's middle: one read of the stream's prefix, folded plainly (the
     checkpoints are built by a runtime's second call); and the first call of another new
     runtime at the run's end, a plain fold of the whole stream (time travel never reads a
     snapshot, ADR 0034);
   - warm: 200 positions spread evenly over the run, p50 and p90, "served by the checkpoint
     cache" (nearest checkpoint + at most 31 events, ADR 0034). Target p50 <= 1 ms.
   Baseline: the plain fold a call made before checkpoints (the stream's prefix read from SQL
   and folded by ``fold_run``, then ``result()``), at 5 of those positions, p50.
2. ``rt.runs.diff(run, a, b)`` for 100 pairs spread over the run: p50, warm. Target <= 1 ms.
3. The 1,000-step chain at its step 500 (the figure compared with other runtimes): cold, the
   first call of each of 9 new runtimes (p50, target <= 4 ms), and warm, against the plain
   fold of that prefix.
4. ``rt.memory.as_of(position=p).all()`` over a memory of 100,000 facts (quick: 10,000), against
   the eager fold ``as_of`` made before (every text indexed as it comes, every payload read up
   front), measured in the same run: cold at 5 positions spread over it (no checkpoint held:
   a fold from the start that leaves checkpoints), p50; warm at 50 positions, p50 and p90,
   served by the checkpoints a first view of the end left (ADR 0034's update), with the memory
   they hold (tracemalloc); then with a first search (which builds the view's index); then
   at the end (time travel never starts from memory's snapshot, ADR 0034).
5. Informative: the checkpoint cache's units and traced bytes for the 10,000-step run.

Run ``python bench/timetravel.py`` (full sizes) or ``python bench/timetravel.py --quick`` (< 60 s).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory import Corpus, build_journal  # the helpers beside this script
from report import Row, header, print_table

import journaled
from journaled.events.catalog import codec
from journaled.events.journal import Journal
from journaled.events.memory_state import MemoryState
from journaled.events.run_checkpoints import DEFAULT_EVERY, RunTimeline
from journaled.events.run_state import fold_run
from journaled.events.url import parse_url
from journaled.memory import MemoryView

TARGET_MS = 1.0
"""T1: p50 of runs.at / runs.diff at positions spread over a 10,000-step run."""
COLD_TARGET_MS = 4.0
"""T1: a new process's first runs.at at step 500 of the 1,000-step chain (peers: ~4 ms)."""
COLD_RUNTIMES = 9
"""New runtimes whose first call is timed, one call each: the p50 of those."""


def cold_calls(url: str, run_id: str, position: int, count: int = COLD_RUNTIMES) -> list[float]:
    """Time the first runs.at of ``count`` new runtimes, one each: what a CLI command pays."""
    out = []
    for _ in range(count):
        with journaled.open(url) as rt:
            out.append(_timed(lambda rt=rt: rt.runs.at(run_id, position)))  # type: ignore[misc]
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _timed(fn: Callable[[], object]) -> float:
    gc.collect()
    gc.disable()  # as timeit does: a collection's cost grows with the heap, not the work
    try:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    finally:
        gc.enable()


def _each(calls: list[Callable[[], object]]) -> list[float]:
    """Time each call on its own, with the collector off for the whole series (as timeit does)."""
    gc.collect()
    gc.disable()
    try:
        out = []
        for call in calls:
            start = time.perf_counter()
            call()
            out.append(time.perf_counter() - start)
        return out
    finally:
        gc.enable()


def _pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def _spread(items: list[int], count: int) -> list[int]:
    if len(items) <= count:
        return list(items)
    return [items[(i * (len(items) - 1)) // (count - 1)] for i in range(count)]


def build_chain(url: str, n: int) -> str:
    """Execute a chain of ``n`` no-op tool steps; return its run id."""
    steps = [
        journaled.Step(f"s{i}", tool="noop", depends_on=[f"s{i - 1}"] if i else [])
        for i in range(n)
    ]
    with journaled.open(url) as rt:
        rt.register_tool("noop", lambda _: None)
        return rt.execute(journaled.Plan(goal="chain", steps=steps)).run_id


def plain_fold(journal: Journal, run_id: str, position: int) -> journaled.ExecuteResult:
    """Return the run at a position as every call did before checkpoints: fold the prefix."""
    return fold_run(journal.stream(run_id, upto=position)).result()


def reader(url: str) -> Journal:
    """Open the journal at ``url`` for plain reads, beside the runtime."""
    return Journal(parse_url(url), codec(), create=False)


def bench_chain(url: str, run_id: str, n: int, positions: int) -> list[Row]:
    """Rows 1 and 2: cold, warm, baseline and diff over the chain."""
    rows: list[Row] = []
    journal = reader(url)
    with journaled.open(url) as rt:
        everything = [e.position for e in rt.runs.history(run_id)]
        spread = _spread(everything, positions)
        middle = everything[len(everything) // 2]
        cold = statistics.median(cold_calls(url, run_id, middle, 5))
        base = statistics.median(
            _timed(lambda p=p: plain_fold(journal, run_id, p))  # type: ignore[misc]
            for p in _spread(everything, 5)
        )
        rows.append(
            Row(
                f"runs.at cold at the middle ({n} steps, {len(everything)} events), "
                "p50 of 5 new runtimes",
                _ms(cold),
                _ms(base),
                f"{cold / base:.2f}x",
                "informative",
                None,
            )
        )
        for p in spread[::40]:  # what the cache serves must be what a plain fold gives
            if rt.runs.at(run_id, p) != plain_fold(journal, run_id, p):
                raise AssertionError(f"runs.at({p}) differs from the plain fold")
        warm = _each([lambda p=p: rt.runs.at(run_id, p) for p in spread])  # type: ignore[misc]
        p50, p90 = statistics.median(warm), _pct(warm, 0.9)
        rows.append(
            Row(
                f"runs.at p50, {len(spread)} positions, served by the checkpoint cache",
                _ms(p50),
                _ms(base),
                f"{p50 / base:.3f}x",
                f"<= {TARGET_MS:g} ms",
                p50 <= TARGET_MS / 1e3,
            )
        )
        rows.append(
            Row(
                "runs.at p90, same positions, served by the checkpoint cache",
                _ms(p90),
                _ms(base),
                f"{p90 / base:.3f}x",
                "informative",
                None,
            )
        )
        pairs = list(zip(spread[::2], spread[1::2], strict=False))
        diffs = _each([lambda a=a, b=b: rt.runs.diff(run_id, a, b) for a, b in pairs])  # type: ignore[misc]
        d50 = statistics.median(diffs)
        rows.append(
            Row(
                f"runs.diff p50, {len(pairs)} pairs, served by the checkpoint cache",
                _ms(d50),
                _ms(2 * base),
                f"{d50 / (2 * base):.3f}x",
                f"<= {TARGET_MS:g} ms",
                d50 <= TARGET_MS / 1e3,
            )
        )
        rows.append(_cache_row(journal, run_id))
    with journaled.open(url) as rt:  # a new runtime again: its first call, at the run's end
        last = everything[-1]
        cold_end = _timed(lambda: rt.runs.at(run_id, last))
        base_end = _timed(lambda: plain_fold(journal, run_id, last))
        rows.append(
            Row(
                "runs.at cold at the run's end, from events alone (no snapshot)",
                _ms(cold_end),
                _ms(base_end),
                f"{cold_end / base_end:.3f}x",
                "informative",
                None,
            )
        )
    journal.close()
    return rows


def _cache_row(journal: Journal, run_id: str) -> Row:
    """Row 5: what the cache holds for the run, in units and traced bytes."""
    events = journal.stream(run_id)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        timeline = RunTimeline(DEFAULT_EVERY)
        timeline.extend(events)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # Traced while the events were already decoded: their bytes are counted apart.
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        again = journal.stream(run_id)
        decoded = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del again
    return Row(
        f"cache held for it: {timeline.weight} units, {len(timeline.checkpoints)} checkpoints",
        f"{(held + decoded) / 2**20:.1f} MB",
        f"events {decoded / 2**20:.1f} MB",
        f"{(held + decoded) / len(events):.0f} B/event",
        "informative",
        None,
    )


def bench_thousand(url: str, run_id: str) -> list[Row]:
    """Row 3: the 1,000-step chain at step 500, cold then warm, against the plain fold."""
    journal = reader(url)
    with journaled.open(url) as rt:
        history = rt.runs.history(run_id)
        # The event that made step 500 succeed: the state as of that step.
        position = next(
            e.position
            for e in history
            if getattr(e.data, "step_id", None) == "s499"
            and type(e.data).__name__ == "StepSucceeded"
        )
        rt.runs.at(run_id, position)
        warm = statistics.median(_each([lambda: rt.runs.at(run_id, position)] * 50))
        base = statistics.median(
            _timed(lambda: plain_fold(journal, run_id, position)) for _ in range(5)
        )
    cold = statistics.median(cold_calls(url, run_id, position))
    journal.close()
    return [
        Row(
            f"1,000-step chain at step 500, cold (p50 of {COLD_RUNTIMES} new runtimes)",
            _ms(cold),
            _ms(base),
            f"{cold / base:.2f}x",
            f"<= {COLD_TARGET_MS:g} ms",
            cold <= COLD_TARGET_MS / 1e3,
        ),
        Row(
            "1,000-step chain at step 500, warm (checkpoint cache)",
            _ms(warm),
            _ms(base),
            f"{warm / base:.3f}x",
            f"<= {TARGET_MS:g} ms",
            warm <= TARGET_MS / 1e3,
        ),
    ]


def eager_as_of(rt: journaled.Runtime, position: int) -> MemoryView:
    """Return memory at a position as ``as_of`` did before T1: a fold from the journal's start
    that indexes every text as it comes, with every payload read up front."""
    memory = rt.memory
    state = MemoryState(list(memory._scopes), memory._organization)
    journal = memory._journal
    texts = journal.payloads()
    now = 0
    for event in journal.read(upto=position):
        state.apply(event, texts)
        now = event.data.at
    return MemoryView(state, now, memory._semantic)


def bench_memory(tmp: Path, facts: int) -> list[Row]:
    """Row 4: memory.as_of at positions spread over a memory: the eager fold it made before,
    a cold call (no checkpoint held: a full fold that leaves checkpoints), and warm calls served
    by the checkpoint cache (ADR 0034's update)."""
    url = f"sqlite:///{tmp / f'facts-{facts}.sqlite'}"
    build_journal(url, facts, Corpus(seed=7), seed=facts)
    with journaled.open(url) as rt:
        end = rt.journal.position()
        points = [(k * end) // 6 for k in range(1, 6)]
        word = rt.memory.all()[0].text.split()[0]
        cache = rt.memory._past_checkpoints
        for p in points[::2]:  # the new path must answer as the old one did
            # A position inside one append is taken at that append's end (ADR 0064).
            new = rt.memory.as_of(position=p)
            old = eager_as_of(rt, new.position)
            if old.all() != new.all() or old.search(word) != new.search(word):
                raise AssertionError(f"memory.as_of({p}) differs from the eager fold")
        before = [_timed(lambda p=p: eager_as_of(rt, p).all()) for p in points]  # type: ignore[misc]
        cold = []
        for p in points:
            cache.clear()
            cold.append(_timed(lambda p=p: rt.memory.as_of(position=p).all()))  # type: ignore[misc]
        cache.clear()
        gc.collect()
        tracemalloc.start()
        rt.memory.as_of(position=end)  # a first view of the end: it leaves the checkpoints
        gc.collect()
        held_bytes = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        spread = [(k * end) // 51 for k in range(1, 51)]
        warm = [_timed(lambda p=p: rt.memory.as_of(position=p).all()) for p in spread]  # type: ignore[misc]
        searched = [
            _timed(lambda p=p: rt.memory.as_of(position=p).search(word))  # type: ignore[misc]
            for p in points
        ]
        eager_searched = [
            _timed(lambda p=p: eager_as_of(rt, p).search(word))  # type: ignore[misc]
            for p in points
        ]
        rt.memory.checkpoint()  # a snapshot at the end, which as_of must not start from
        at_end = statistics.median(
            _timed(lambda: rt.memory.as_of(position=end).all()) for _ in range(3)
        )
        eager_end = _timed(lambda: eager_as_of(rt, end).all())
        held, every = len(cache.positions), cache.every
    b50, c50, s50, e50 = (statistics.median(x) for x in (before, cold, searched, eager_searched))
    w50, w90 = statistics.median(warm), sorted(warm)[int(len(warm) * 0.9)]
    return [
        Row(
            f"memory.as_of cold p50 (get/all; no checkpoint held), {len(points)} positions over "
            f"{facts:,} facts",
            _ms(c50),
            _ms(b50),
            f"{c50 / b50:.2f}x",
            "informative",
            None,
        ),
        Row(
            "memory.as_of warm p50 (get/all), 50 positions, served by the checkpoint cache",
            _ms(w50),
            _ms(b50),
            f"{w50 / b50:.3f}x",
            "informative",
            None,
        ),
        Row(
            "memory.as_of warm p90, same positions, served by the checkpoint cache",
            _ms(w90),
            _ms(b50),
            f"{w90 / b50:.3f}x",
            "informative",
            None,
        ),
        Row(
            f"memory checkpoints held: {held}, one per {every:,} positions at least",
            f"{held_bytes / 1e6:.1f} MB",
            f"{end:,} positions",
            "-",
            "informative",
            None,
        ),
        Row(
            "memory.as_of p50 + its first search (builds the index), served by the cache",
            _ms(s50),
            _ms(e50),
            f"{s50 / e50:.2f}x",
            "informative",
            None,
        ),
        Row(
            "memory.as_of at the end, served by the cache (a snapshot lies there, unread)",
            _ms(at_end),
            _ms(eager_end),
            f"{at_end / eager_end:.2f}x",
            "informative",
            None,
        ),
    ]


def main() -> None:
    """Run every measurement and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke run (< 60 s)")
    quick = parser.parse_args().quick
    steps, facts = (10_000, 10_000) if quick else (10_000, 100_000)
    header("journaled time travel benchmark", quick)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-timetravel-") as name:
        tmp = Path(name)
        url = f"sqlite:///{tmp / 'chain.sqlite'}"
        rows += bench_chain(url, build_chain(url, steps), steps, 200)
        small = f"sqlite:///{tmp / 'chain-1000.sqlite'}"
        rows += bench_thousand(small, build_chain(small, 1000))
        rows += bench_memory(tmp, facts)
    print_table(rows)


if __name__ == "__main__":
    main()
