"""Benchmark of the journal: append and replay throughput per backend and per batch size.

For each backend — in-process (``memory://``), SQLite (``durability=normal`` and ``full``) and
PostgreSQL — append N events in batches of 1, 10 and 100 events per transaction (each event a
~150-byte fact on its own stream, as memory writes them), then read the whole log back decoded.
Each figure is compared with eventsourcing's stock recorder for that backend doing the same
appends (same row sizes and transactions, same synchronous level for SQLite), in the same run.
Ours also writes each fact's text to the payload table in the same transaction, as memory does.

The digest chain (R7, ADR 0021) is measured on its own: the same journal appends alternately with
and without it (rounds interleaved, medians compared), so both see the same file, cache and load;
the ratio is the chain's extra cost per append (target: at most 5% on the durable backends).

PostgreSQL: pass ``--postgres URL``, or let the script start a throwaway server (PostgreSQL 15
binaries under /usr/lib/postgresql/15/bin) with durability on (``fsync``, ``synchronous_commit``
and ``full_page_writes``), as ``bench/fleet.py`` does. On that server each append row of ours and
of the stock recorder is followed by what one append cost the server: transactions committed in
the journal's database, WAL fsyncs and WAL bytes (``pg_stat_database``, ``pg_stat_wal``), read as
``bench/fleet.py`` reads them (every connection of the appends closed before the second reading;
opening and closing the journal, or the stock recorder, measured apart and subtracted).
Run ``python bench/journal.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import timeit
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from eventsourcing.persistence import ApplicationRecorder, InfrastructureFactory, StoredEvent
from eventsourcing.sqlite import SQLiteDatastore
from fleet import Counters, Stats, dbname, durable_postgres  # the durable server, its stats
from report import Row, header, print_table, set_synchronous

from journaled.events.base import Pending
from journaled.events.catalog import codec
from journaled.events.journal import Journal
from journaled.events.journal._digest import chain
from journaled.events.memory import FactRemembered
from journaled.events.url import parse_url

ROOT = Path(__file__).resolve().parent.parent
BATCHES = (1, 10, 100)
T0 = 1_700_000_000_000


def pendings(n: int, offset: int) -> list[Pending]:
    """Make n fact events on distinct streams."""
    return [
        Pending(
            stream=f"mem_{offset + i:012d}_bench",
            version=1,
            data=FactRemembered(at=T0 + i, fact_id=f"mem_{offset + i:012d}_bench", scope="project"),
        )
        for i in range(n)
    ]


def time_ours(
    url: str, n: int, batch: int, stats: Stats | None = None
) -> tuple[float, float, Counters | None]:
    """Append n events in batches through our journal, then read them all; return seconds and,
    given ``stats``, what the server counted for the appends (with the journal's open and close).
    """
    before_stats = stats.read(dbname(url)) if stats is not None else None
    journal = Journal(parse_url(url), codec())
    cost = None
    try:
        before = journal.position()
        events = pendings(n, batch * 10**7)
        texts = {p.stream: b"x" * 80 for p in events}
        start = time.perf_counter()
        for i in range(0, n, batch):
            chunk = events[i : i + batch]
            journal.append(chunk, payloads={p.stream: texts[p.stream] for p in chunk})
        appended = time.perf_counter() - start
        if stats is not None and before_stats is not None:
            # The server counts a connection's work when it closes: close, read, and read the
            # events back through a new journal, whose reads are not counted.
            journal.close()
            cost = stats.read(dbname(url)) - before_stats
            journal = Journal(parse_url(url), codec())
        start = time.perf_counter()
        count = sum(1 for _ in journal.read(after=before))
        read = time.perf_counter() - start
        assert count == n
        return appended, read, cost
    finally:
        journal.close()


def open_close_ours(url: str) -> None:
    """Open the journal, read its position and close it: what ``time_ours`` adds to appends."""
    journal = Journal(parse_url(url), codec())
    try:
        journal.position()
    finally:
        journal.close()


def open_close_stock(env: dict[str, str]) -> None:
    """Construct the stock recorder and close it: what ``time_stock`` adds to appends."""
    factory = InfrastructureFactory.construct(env)
    try:
        factory.application_recorder()
    finally:
        factory.close()


def measured_stock(
    stats: Stats | None, url: str, env: dict[str, str], n: int, batch: int, level: str | None
) -> tuple[Counters | None, float]:
    """Time the stock recorder's appends; given ``stats``, count what they cost the server."""
    if stats is None:
        return None, time_stock(env, n, batch, level)
    return stats.measure(dbname(url), lambda: time_stock(env, n, batch, level))


def server_row(
    stats: Stats, url: str, env: dict[str, str], ours: Counters, stock: Counters, appends: int
) -> Row:
    """Return the row of what one append cost the server, ours and stock's, net of open/close."""
    db = dbname(url)
    ours_open = stats.measure(db, lambda: open_close_ours(url))[0]
    stock_open = stats.measure(db, lambda: open_close_stock(env))[0]
    return Row(
        "  per append: transactions, WAL fsyncs, WAL bytes",
        (ours - ours_open).per(appends),
        "stock " + (stock - stock_open).per(appends),
        "",
        "-",
        None,
    )


CHAIN_ROUNDS = 30
CHAIN_BATCHES = (1, 100)
CHAIN_TARGET = 0.05


def time_chain(url: str, n: int, batch: int) -> tuple[float, float]:
    """Append n events with and n without the digest chain, interleaved; return median seconds.

    Switches the recorder's ``chained`` flag (only a benchmark does that): the journal's chain is
    left broken, which does not matter for a throwaway file.
    """
    journal = Journal(parse_url(url), codec())
    recorder = journal._recorder  # the measurement knob lives on the recorder
    try:
        per_round = max(n // CHAIN_ROUNDS, batch)
        events = pendings(per_round * CHAIN_ROUNDS * 2, 5 * 10**9 + batch * 10**7)
        times: dict[bool, list[float]] = {True: [], False: []}
        for r in range(CHAIN_ROUNDS):
            for on in (True, False) if r % 2 == 0 else (False, True):
                recorder.chained = on
                offset = (2 * r + int(on)) * per_round
                chunk = events[offset : offset + per_round]
                start = time.perf_counter()
                for i in range(0, per_round, batch):
                    part = chunk[i : i + batch]
                    journal.append(part, payloads={p.stream: b"x" * 80 for p in part})
                times[on].append((time.perf_counter() - start) / per_round)
        return statistics.median(times[True]), statistics.median(times[False])
    finally:
        recorder.chained = True
        journal.close()


def time_stock(env: dict[str, str], n: int, batch: int, level: str | None) -> float:
    """Append the same rows with eventsourcing's stock recorder; return seconds."""
    factory = InfrastructureFactory.construct(env)
    try:
        recorder = factory.application_recorder()
        assert isinstance(recorder, ApplicationRecorder)
        datastore = getattr(factory, "datastore", None)
        if level is not None and isinstance(datastore, SQLiteDatastore):
            set_synchronous(datastore, level)
        c = codec()
        rows = [
            StoredEvent(p.stream, 1, c.topic(p.data), c.encode(p.data) + b"x" * 80)
            for p in pendings(n, 10**9 + batch * 10**7)
        ]
        start = time.perf_counter()
        for i in range(0, n, batch):
            recorder.insert_events(rows[i : i + batch])
        return time.perf_counter() - start
    finally:
        factory.close()


@contextmanager
def postgres(url: str | None) -> Iterator[str | None]:
    """Yield a PostgreSQL URL: the one given, a durable throwaway server, or None if none."""
    with measured_postgres(url) as server:
        yield None if server is None else server[0]


@contextmanager
def measured_postgres(url: str | None) -> Iterator[tuple[str, Stats | None] | None]:
    """Yield a PostgreSQL URL and a reader of its server's statistics: the URL given (with no
    reader: others may use that server), a durable throwaway server, or None if there is none.
    """
    if url is not None:
        yield url, None
        return
    with durable_postgres() as server:
        if server is None:
            yield None
            return
        print(server.stats.settings() + "\n")
        yield server.database(), server.stats


Backend = tuple[str, Callable[[str], str], dict[str, str], str | None]


def backends(tmp: Path, pg: str | None) -> Iterator[Backend]:
    """Yield (name, url for a label, stock env, synchronous level) for every backend."""
    yield "memory", lambda _: "memory://", {"PERSISTENCE_MODULE": "eventsourcing.popo"}, None
    for durability, level in (("normal", "NORMAL"), ("full", "FULL")):

        def sqlite_url(label: str, d: str = durability) -> str:
            return f"sqlite:///{tmp / f'{label}-{d}.sqlite'}?durability={d}"

        stock = {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "ORIGINATOR_ID_TYPE": "text"}
        yield f"sqlite {durability}", sqlite_url, stock, level
    if pg is not None:
        parts = parse_url(pg)
        stock = {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": str(parts.dbname),
            "POSTGRES_HOST": str(parts.host),
            "POSTGRES_PORT": str(parts.port),
            "POSTGRES_USER": str(parts.user),
            "POSTGRES_PASSWORD": parts.password or "",
            "ORIGINATOR_ID_TYPE": "text",
        }
        yield "postgresql", lambda _: pg, stock, None


def main() -> None:
    """Run every measurement and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    parser.add_argument("--postgres", default=None, help="a PostgreSQL URL to measure against")
    parser.add_argument("--chain-only", action="store_true", help="only the digest chain's cost")
    args = parser.parse_args()
    n = 2000 if args.quick else 10_000
    header("journaled journal benchmark", args.quick)
    rows: list[Row] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-journal-") as name,
        measured_postgres(args.postgres) as server,
    ):
        tmp = Path(name)
        pg, pg_stats = server if server is not None else (None, None)
        for backend, url_for, stock_env, level in backends(tmp, pg):
            stats = pg_stats if backend == "postgresql" else None
            for batch in () if args.chain_only else BATCHES:
                count = n if batch > 1 else n // 5
                label = f"{backend}-b{batch}"
                url = url_for(label)
                appended, read, ours_cost = time_ours(url, count, batch, stats)
                env = dict(stock_env)
                if "SQLITE_DBNAME" not in env and backend.startswith("sqlite"):
                    env["SQLITE_DBNAME"] = str(tmp / f"stock-{label}.sqlite")
                stock_cost, stock = measured_stock(stats, url, env, count, batch, level)
                rows.append(
                    Row(
                        f"{backend}: append, {batch} event(s) per commit",
                        f"{count / appended:,.0f} ev/s",
                        f"stock {count / stock:,.0f} ev/s" if stock else "",
                        f"{stock / appended:.2f}" if stock else "",
                        "-",
                        None,
                    )
                )
                if stats is not None and ours_cost is not None and stock_cost is not None:
                    rows.append(server_row(stats, url, env, ours_cost, stock_cost, count // batch))
                if batch == BATCHES[-1]:
                    speed = f"{count / read:,.0f} ev/s"
                    rows.append(Row(f"{backend}: read back, decoded", speed, "", "", "-", None))
            for batch in CHAIN_BATCHES:
                with_chain, without = time_chain(
                    url_for(f"chain-{backend}-b{batch}"), n // 2, batch
                )
                extra = with_chain / without - 1
                durable = backend != "memory"
                rows.append(
                    Row(
                        f"{backend}: append with digest chain, {batch} event(s) per commit",
                        f"{1e6 * with_chain:,.1f} µs/ev",
                        f"without {1e6 * without:,.1f} µs/ev",
                        f"{extra:+.1%}",
                        f"<= {CHAIN_TARGET:.0%}" if durable else "-",
                        extra <= CHAIN_TARGET if durable else None,
                    )
                )
    rows += [chain_step(batch) for batch in CHAIN_BATCHES]
    print_table(rows)


def chain_step(batch: int) -> Row:
    """Time the chain's own work for one append (hashing, no I/O): its floor on any backend."""
    events = [
        (p.stream, 1, "memory.fact-remembered@1", b"y" * 70) for p in pendings(batch, 7 * 10**9)
    ]
    payloads = {e[0]: b"x" * 80 for e in events}
    positions = range(2, 2 + batch)
    head = (1, b"h" * 32)
    rounds = max(20_000 // batch, 20)
    best = min(
        timeit.repeat(lambda: chain(head, positions, events, payloads, ()), number=rounds, repeat=5)
    )
    per_event = best / rounds / batch
    return Row(
        f"digest chain step alone, {batch} event(s) + payloads",
        f"{1e6 * per_event:,.2f} µs/ev",
        "",
        "",
        "-",
        None,
    )


if __name__ == "__main__":
    main()
