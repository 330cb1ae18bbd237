"""Benchmark of `journal verify`: the digest chain alone, and with the snapshots checked (R7).

Builds a SQLite journal of N remembered facts (default 10,000) through a runtime, snapshots
memory (the runtime may have taken automatic snapshots too: the count checked is printed), then
times the chain check (``Journal.verify``) and the full check that also folds memory's events to
compare them with each snapshot (``snapshot_audit.verify``), alternately over several rounds;
prints the medians and the snapshot check's extra time. Run ``python bench/verify.py``
(``--facts`` to change N, ``--quick`` for 2,000 facts over 3 rounds).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import journaled
from journaled.events.catalog import codec
from journaled.events.journal import Journal
from journaled.events.snapshot_audit import verify
from journaled.events.url import parse_url


def build(url: str, facts: int) -> None:
    """Remember ``facts`` facts (from a few threads, so remembers commit in groups), snapshot."""
    with journaled.open(url) as rt:
        with ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda i: rt.memory.remember(
                        f"service {i} deploys from branch release-{i % 97} on host web-{i % 13}",
                        conflict_key=f"svc-{i % 500}" if i % 5 == 0 else None,
                    ),
                    range(facts),
                )
            )
        rt.memory.checkpoint()


def main() -> None:
    """Build the journal, time both checks, print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--facts", type=int, default=None, help="default 10,000 (quick: 2,000)")
    parser.add_argument("--rounds", type=int, default=None, help="default 7 (quick: 3)")
    parser.add_argument("--quick", action="store_true", help="2,000 facts over 3 rounds")
    args = parser.parse_args()
    if args.facts is None:
        args.facts = 2_000 if args.quick else 10_000
    if args.rounds is None:
        args.rounds = 3 if args.quick else 7
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'journal.sqlite'}"
        build(url, args.facts)
        journal = Journal(parse_url(url), codec(), create=False)
        chain: list[float] = []
        full: list[float] = []
        try:
            for _ in range(args.rounds):
                start = time.perf_counter()
                assert journal.verify().ok
                chain.append(time.perf_counter() - start)
                start = time.perf_counter()
                report = verify(journal)
                full.append(time.perf_counter() - start)
                assert report.ok, report
                assert report.snapshots >= 1, report
        finally:
            journal.close()
    c, f = statistics.median(chain), statistics.median(full)
    print(
        f"{report.events} events, {args.facts} facts, {report.snapshots} memory snapshots checked, "
        f"{args.rounds} rounds"
    )
    print(f"chain only        {c * 1000:8.0f} ms")
    print(f"chain + snapshots {f * 1000:8.0f} ms  (+{(f - c) * 1000:.0f} ms, {f / c:.2f}x)")


if __name__ == "__main__":
    main()
