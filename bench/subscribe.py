"""Benchmark of journal subscriptions (A3, ADR 0026): live delivery latency and catch-up speed.

Latency: a consumer in another process subscribes (``rt.journal.subscribe``) and waits; this
process appends one event at a time, a few milliseconds apart (so each is delivered live, not
caught up in a batch), and notes when each append returned. The consumer notes when each event
reached it; both clocks are the machine's monotonic clock, shared by its processes. Reported:
p50 and p99 of (received - appended), on SQLite and on PostgreSQL.

Catch-up: a journal of N events (default 20,000) is read once through a subscription from
position 0 and once through ``rt.journal.read()``, alternately over several rounds in the same
run; the medians' ratio is the subscription's cost over a plain read.

PostgreSQL: ``--postgres URL`` or a throwaway server (as bench/journal.py). Run
``python bench/subscribe.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from journal import pendings, postgres
from report import Row, header, print_table

import journaled
from journaled.events.catalog import codec
from journaled.events.journal import Journal
from journaled.events.url import parse_url

GAP = (0.005, 0.015)
"""Seconds between two appends of the latency run (uniform): live deliveries, one at a time."""
ROUNDS = 5


def consume(url: str, count: int) -> None:
    """Child process: subscribe after the current end, print ready, then time each delivery."""
    with (
        journaled.open(url, follow=None) as rt,
        rt.journal.subscribe(after=rt.journal.position()) as sub,
    ):
        assert sub.poll(0) is None
        print("ready", flush=True)
        received: dict[int, int] = {}
        while len(received) < count:
            event = sub.poll(60)
            assert event is not None, "the producer stopped appending"
            received[int(event.stream.split("_")[1])] = time.monotonic_ns()
        print(json.dumps(received), flush=True)


def latency(url: str, count: int) -> list[float]:
    """Append ``count`` events one by one; return each delivery latency in milliseconds."""
    child = subprocess.Popen(
        [sys.executable, __file__, "--consume", url, str(count)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    journal = Journal(parse_url(url), codec())
    try:
        assert child.stdout.readline().strip() == "ready"
        appended: dict[int, int] = {}
        offset = 9 * 10**8 + random.randrange(10**6) * 100
        for i, pending in enumerate(pendings(count, offset)):
            time.sleep(random.uniform(*GAP))
            journal.append([pending], payloads={pending.stream: b"a fact to deliver"})
            appended[offset + i] = time.monotonic_ns()
        received = {int(k): v for k, v in json.loads(child.stdout.readline()).items()}
    finally:
        journal.close()
        child.wait(60)
    return [(received[k] - appended[k]) / 1e6 for k in appended]


def fill(url: str, count: int) -> None:
    """Append ``count`` fact events in commits of 100."""
    journal = Journal(parse_url(url), codec())
    try:
        events = pendings(count, 10**8)
        for i in range(0, count, 100):
            chunk = events[i : i + 100]
            journal.append(chunk, payloads={p.stream: b"a fact to catch up on" for p in chunk})
    finally:
        journal.close()


def catch_up(url: str, count: int) -> tuple[float, float]:
    """Return median seconds to read ``count`` events by subscription and by ``read()``."""
    subscribed: list[float] = []
    read: list[float] = []
    with journaled.open(url, follow=None) as rt:
        for _ in range(ROUNDS):
            start = time.perf_counter()
            with rt.journal.subscribe() as sub:
                n = 0
                while n < count and sub.poll(0) is not None:
                    n += 1
            subscribed.append(time.perf_counter() - start)
            assert n == count, n
            start = time.perf_counter()
            assert len(rt.journal.read()) == count
            read.append(time.perf_counter() - start)
    return statistics.median(subscribed), statistics.median(read)


def percentile(values: list[float], q: float) -> float:
    """Return the q-quantile (0..1) of values, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    """Measure both backends and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    parser.add_argument("--postgres", default=None, help="a PostgreSQL URL to measure against")
    parser.add_argument("--consume", nargs=2, default=None, help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()
    if args.consume is not None:
        consume(args.consume[0], int(args.consume[1]))
        return
    deliveries = 60 if args.quick else 400
    events = 5_000 if args.quick else 20_000
    header("journaled subscription benchmark", args.quick)
    rows: list[Row] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-subscribe-") as name,
        postgres(args.postgres) as pg,
    ):
        urls = {"sqlite": f"sqlite:///{Path(name) / 'latency.sqlite'}"}
        if pg is not None:
            urls["postgresql"] = pg
        for backend, url in urls.items():
            ms = latency(url, deliveries)
            rows.append(
                Row(
                    f"{backend}: append → consumer in another process, p50 / p99",
                    f"{percentile(ms, 0.5):.2f} / {percentile(ms, 0.99):.2f} ms",
                    f"{deliveries} live deliveries",
                    "",
                    "-",
                    None,
                )
            )
        catch_urls = {"sqlite": f"sqlite:///{Path(name) / 'catch-up.sqlite'}"}
        if pg is not None:
            catch_urls["postgresql"] = pg  # after the latency run's events: read them all
        for backend, url in catch_urls.items():
            fill(url, events)
            with journaled.open(url, follow=None) as rt:
                total = len(rt.journal.read())
            by_sub, by_read = catch_up(url, total)
            rows.append(
                Row(
                    f"{backend}: catch-up of {total:,} events, subscription vs read()",
                    f"{total / by_sub:,.0f} ev/s",
                    f"read() {total / by_read:,.0f} ev/s",
                    f"{by_sub / by_read:.2f}",
                    "-",
                    None,
                )
            )
    print_table(rows)


if __name__ == "__main__":
    main()
