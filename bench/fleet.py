"""Benchmark of PostgreSQL at fleet scale (J1, S3, T1): the durable chain against one commit, many
processes on one journal, and time travel, each against a baseline measured in the same run.

The script starts its own throwaway PostgreSQL 15 (``tests/pg.py``, as the tests do) with
durability on: ``fsync=on``, ``synchronous_commit=on`` and ``full_page_writes=on`` (the test server
runs with all three off; they are given on its command line, so ``ALTER SYSTEM`` cannot turn them
back on). The settings that decide what a commit costs are read back from the server and printed
above the table.

1. floor: one ``INSERT`` of a 200-byte row + ``COMMIT`` per iteration into a scratch table over one
   psycopg connection (statements prepared by psycopg after their fifth use), in µs/commit. Best of
   the repeats, each interleaved with one chain of row 2.
2. chain: the durable chain of N no-op tool steps (N = 1,000; quick: 200), built and timed as
   ``bench/executor.py`` does it (``rt.register_tool("noop", ...)``, each step depending on the
   previous one, ``rt.execute(plan, max_parallel_steps=2)`` wall time / N), best of the repeats;
   the ratio to the floor, target <= 2.0x. Per step, from the server's cumulative statistics:
   transactions committed in the journal's database (``pg_stat_database.xact_commit``), WAL
   fsyncs (``pg_stat_wal.wal_sync``) and WAL bytes (``pg_stat_wal.wal_bytes``); and the client's
   CPU (``time.process_time`` of this process, every thread) over ``rt.execute``.
3. fleet: 1, 2 and 4 processes (``multiprocessing``, spawn), each with its own runtime executing
   its own run, a chain of M no-op steps, on ONE journal (a fresh database per point). M is picked
   from row 2's step time so one process alone runs >= 3 s (quick: >= 1 s), and lengthened if the
   first one-process point ran shorter (that point then runs again). Every process opens
   its runtime and executes a short warm-up chain, then waits at a barrier with the parent; the
   figure is the aggregate steps/s = all steps / (last process's finish - barrier release), so a
   process finishing early does not flatter it; best of 2 rounds of the three points (quick: 1),
   which keeps a neighbour's load on this shared machine out of one point alone. The ratio is to
   one process; target: 4 processes >= 1.5x one. The curve is printed under the table. Per point:
   the server's work per step (each worker is one runtime session around its chain; row 2's
   session cost, measured on the older journal, is subtracted per process) and the workers' CPU
   per step (median of the processes).
4. time travel: ``rt.runs.at(run, position)`` at step 500 of a 1,000-step run of row 2 (quick: at
   the middle of the 200-step run): cold, the first call of each of 5 new runtimes (p50), which
   reads the run's prefix from the server and folds it plainly (a runtime builds the run's
   checkpoints from its second call, ADR 0034: the row says whether the cache was empty before the
   call); and warm, p50 over 200 positions spread over the run, served by the checkpoint cache.
   Target <= 2 ms. Baseline: the journal's own read of the run's stream up to that position.

How the statistics are read. PostgreSQL 15 keeps them in shared memory, but a backend flushes its
pending counts lazily (at most once a second while busy, or when idle for a while); every backend
flushes at exit. So each measured stretch runs on its own connections: its runtime (or connection)
is opened after a first reading and closed before the second, and the second reading waits until
no backend is connected to the journal's database any more. The readings are taken over a
connection to the ``postgres`` database, so the bench's own reads are counted there, never in the
journal's database. Opening and closing a runtime costs transactions of its own: a stretch that
opens a runtime, executes the warm-up chain and closes it is measured as well, and subtracted.
``pg_stat_wal`` is cluster-wide: nothing else writes during a stretch (autovacuum is off). The
floor checks the method: N plain commits over one new connection must read as N + 1 transactions
(a backend's start-up runs one transaction of its own) and about N WAL fsyncs.

Run ``python bench/fleet.py`` (about 1.5 minutes on a 2-core machine) or ``python
bench/fleet.py --quick`` (about 20 s).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any, NamedTuple, TypeVar
from urllib.parse import urlsplit

from executor import chain  # the chain's shape, as the executor bench builds it
from report import Row, header, print_table

import journaled
from journaled.events.catalog import codec
from journaled.events.journal import Journal
from journaled.events.url import parse_url

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = (
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_sync_method",
    "commit_delay",
    "shared_buffers",
)
"""The server settings a commit's cost depends on, printed with every run."""
DURABLE = (("fsync", "on"), ("synchronous_commit", "on"), ("full_page_writes", "on"))
"""What the bench's server must run with, checked before anything is measured."""
CHAIN_TARGET = 2.0
"""Issue 16: the durable chain costs at most 2x one INSERT + commit per step."""
FLEET_TARGET = 1.5
"""Issue 16: 4 processes on one journal push >= 1.5x the steps/s of one."""
AT_TARGET_MS = 2.0
"""T1 on PostgreSQL: runs.at at step 500 of a 1,000-step run."""
T = TypeVar("T")
PROCESSES = (1, 2, 4)
WARM = 20
"""Steps of the warm-up chain each runtime executes before anything is timed."""


class Counters(NamedTuple):
    """A reading of the server's cumulative statistics for one database."""

    xacts: int
    wal_syncs: int
    wal_bytes: int

    def __sub__(self, other: tuple[int, ...]) -> Counters:
        return Counters(*(a - b for a, b in zip(self, other, strict=True)))

    def total(self) -> str:
        """Say the counters as they are."""
        return f"{self.xacts:,} xact, {self.wal_syncs:,} fsync, {self.wal_bytes:,} B WAL"

    def per(self, count: int) -> str:
        """Say the counters per unit of work, e.g. per step."""
        return (
            f"{self.xacts / count:.2f} xact, {self.wal_syncs / count:.2f} fsync, "
            f"{self.wal_bytes / count:,.0f} B WAL"
        )


class Stats:
    """Read ``pg_stat_database`` and ``pg_stat_wal`` over a connection to another database.

    Args:
        admin_url: a URL of the server's ``postgres`` database (the bench's own reads count
            there, not in the database measured).
    """

    def __init__(self, admin_url: str) -> None:
        import psycopg  # noqa: PLC0415 - only when measuring PostgreSQL

        self.conn = psycopg.connect(admin_url, autocommit=True)

    def read(self, dbname: str, timeout: float = 30.0) -> Counters:
        """Return the counters once no backend is connected to ``dbname`` (all have flushed)."""
        deadline = time.monotonic() + timeout
        while True:
            row = self.conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (dbname,)
            ).fetchone()
            if row is not None and row[0] == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"connections to {dbname} still open after {timeout:g} s")
            time.sleep(0.01)
        # Every statement here is its own transaction, so no snapshot of an earlier one is kept;
        # clearing it says so explicitly.
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        row = self.conn.execute(
            "SELECT d.xact_commit, w.wal_sync, w.wal_bytes "
            "FROM pg_stat_database d, pg_stat_wal w WHERE d.datname = %s",
            (dbname,),
        ).fetchone()
        assert row is not None, f"no statistics for database {dbname}"
        return Counters(int(row[0]), int(row[1]), int(row[2]))

    def measure(self, dbname: str, work: Callable[[], T]) -> tuple[Counters, T]:
        """Run ``work`` (which must close every connection it opens); return its cost and result."""
        before = self.read(dbname)
        result = work()
        return self.read(dbname) - before, result

    def settings(self) -> str:
        """Return the server's version and the settings in :data:`SETTINGS`, one line."""
        rows = self.conn.execute(
            "SELECT name, setting, coalesce(unit, '') FROM pg_settings WHERE name = ANY(%s) "
            "ORDER BY name",
            (list(SETTINGS),),
        ).fetchall()
        version = self.conn.execute("SHOW server_version").fetchone()
        shown = ", ".join(f"{n}={_setting(s, u)}" for n, s, u in rows)
        return f"PostgreSQL {version[0] if version else '?'}: {shown}"

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


def _setting(value: str, unit: str) -> str:
    if unit == "8kB":
        return f"{int(value) * 8 // 1024}MB"
    return f"{value}{unit}"


def dbname(url: str) -> str:
    """Return the database a PostgreSQL URL names."""
    return urlsplit(url).path.lstrip("/")


@dataclass
class Server:
    """A durable throwaway server: its admin URL, a statistics reader, and new databases."""

    admin_url: str
    stats: Stats

    def database(self) -> str:
        """Create an empty database; return its URL."""
        from pg import create_database  # noqa: PLC0415 - tests/pg.py, on sys.path by now

        return create_database(self.admin_url)


@contextmanager
def durable_postgres() -> Iterator[Server | None]:
    """Yield a throwaway PostgreSQL server with durability on, or None if there is none."""
    sys.path.insert(0, str(ROOT / "tests"))
    from pg import PostgresServer, PostgresUnavailable  # noqa: PLC0415 - tests/pg.py

    try:
        # Durability is set on the server's command line: ALTER SYSTEM cannot outrank the
        # test server's own "-c fsync=off".
        server = PostgresServer(durable=True)
    except PostgresUnavailable as exc:
        print(f"PostgreSQL skipped: {exc}\n")
        yield None
        return
    server.start()
    try:
        stats = Stats(server.url("postgres"))
        try:
            for name, value in DURABLE:
                row = stats.conn.execute(f"SHOW {name}").fetchone()
                if row is None or row[0] != value:
                    raise RuntimeError(f"the server runs with {name}={row}, not {value}")
            yield Server(server.url("postgres"), stats)
        finally:
            stats.close()
    finally:
        server.stop()


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


# 1. floor --------------------------------------------------------------------------------------


def floor_commits(url: str, n: int) -> float:
    """Insert and commit n rows one at a time over one fresh connection; return seconds."""
    import psycopg  # noqa: PLC0415

    body = b"x" * 200
    with psycopg.connect(url) as conn:
        start = time.perf_counter()
        for _ in range(n):
            conn.execute("INSERT INTO floor_scratch (body) VALUES (%s)", (body,))
            conn.commit()
        return time.perf_counter() - start


def make_floor_table(url: str) -> None:
    """Create the floor's scratch table."""
    import psycopg  # noqa: PLC0415

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE floor_scratch (id bigserial PRIMARY KEY, body bytea NOT NULL)")


# 2. chain --------------------------------------------------------------------------------------


def open_runtime(url: str) -> journaled.Runtime:
    """Open a runtime with the no-op tool the chains use."""
    rt = journaled.open(url)
    rt.register_tool("noop", lambda x: None)
    return rt


class ChainRun(NamedTuple):
    """One timed chain: wall and CPU seconds and its run id."""

    wall: float
    cpu: float
    run_id: str


def execute_chain(rt: journaled.Runtime, n: int, prefix: str = "c") -> ChainRun:
    """Execute a chain of n no-op steps; return its wall and process CPU seconds."""
    plan = journaled.Plan(goal="bench", steps=chain(n, prefix))
    cpu, start = time.process_time(), time.perf_counter()
    result = rt.execute(plan, max_parallel_steps=2)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    if not result.ok:
        raise RuntimeError(f"the chain failed: {result}")
    return ChainRun(wall, cpu, result.run_id)


def chain_session(url: str, n: int) -> ChainRun | None:
    """Open a runtime, execute the warm-up chain (and a chain of n steps if n), close it."""
    with open_runtime(url) as rt:
        execute_chain(rt, WARM, "warm")
        return execute_chain(rt, n) if n else None


class Chained(NamedTuple):
    """What row 2 hands on: seconds per step, a 1,000-step run's id, and what one runtime
    session (open, warm-up chain, close) costs the server."""

    step: float
    run_id: str
    session: Counters


def bench_chain(server: Server, url: str, n: int, repeats: int) -> tuple[list[Row], Chained]:
    """Rows 1 and 2: the floor and the chain, interleaved."""
    db, stats = dbname(url), server.stats
    make_floor_table(url)
    chain_session(url, 0)  # the schema is created once, outside every measured stretch
    floor_n = n
    floors: list[float] = []
    floor_cost: list[Counters] = []
    runs: list[ChainRun] = []
    costs: list[Counters] = []
    overheads: list[Counters] = []
    for _ in range(repeats):
        cost, seconds = stats.measure(db, lambda: floor_commits(url, floor_n))
        floor_cost.append(cost)
        floors.append(seconds)
        cost, run = stats.measure(db, lambda: chain_session(url, n))
        assert run is not None
        costs.append(cost)
        runs.append(run)
        overheads.append(stats.measure(db, lambda: chain_session(url, 0))[0])
    floor = min(floors) / floor_n
    best = min(runs, key=lambda r: r.wall)
    step = best.wall / n
    cpu = statistics.median(r.cpu for r in runs) / n
    fc = _median_counters(floor_cost)
    per_step = _median_counters([c - o for c, o in zip(costs, overheads, strict=True)])
    overhead = _median_counters(overheads)
    ratio = step / floor
    # The method's check: n plain commits over one connection must read as n + 1 transactions
    # (a backend's start-up runs one) and about n WAL fsyncs.
    counted = fc.xacts == floor_n + 1 and abs(fc.wal_syncs - floor_n) <= floor_n // 50
    label = f"best of {repeats}"
    rows = [
        Row(f"floor: INSERT + commit per iteration, one connection, {label}",
            _us(floor) + "/commit", "", "", "-", None),
        Row(f"  statistics of the floor's {floor_n:,} commits + 1 connection", fc.total(),
            f"{floor_n + 1:,} xact, {floor_n:,} fsync", "", "exact xact, ~fsync", counted),
        Row(f"chain {n:,} no-op steps, per step, {label}", _us(step), f"floor {_us(floor)}",
            f"{ratio:.2f}x", f"<= {CHAIN_TARGET:g}x", ratio <= CHAIN_TARGET),
        Row("  chain, server per step (runtime open, warm-up, close subtracted)",
            per_step.per(n), "", "", "-", None),
        Row("  chain, client CPU per step (this process's time, all threads)", _us(cpu), "",
            "", "-", None),
        Row(f"  one runtime session: open, {WARM}-step warm-up chain, close", overhead.per(1),
            "", "", "-", None),
    ]  # fmt: skip
    return rows, Chained(step, best.run_id, overhead)


def _median_counters(samples: list[Counters]) -> Counters:
    return Counters(*(int(statistics.median(column)) for column in zip(*samples, strict=True)))


# 3. fleet --------------------------------------------------------------------------------------


class Done(NamedTuple):
    """What one worker process reports: monotonic start and finish, steps, CPU seconds."""

    start: float
    finish: float
    steps: int
    cpu: float


def worker(url: str, steps: int, tag: str, barrier: Barrier, out: Any) -> None:
    """In a process of its own: open a runtime, warm up, wait at the barrier, run one chain."""
    try:
        with open_runtime(url) as rt:
            execute_chain(rt, WARM, f"warm{tag}_")
            barrier.wait(timeout=300)
            start = time.monotonic()
            run = execute_chain(rt, steps, f"{tag}_")
            out.put(Done(start, time.monotonic(), steps, run.cpu))
    except BaseException as exc:
        barrier.abort()
        out.put(f"process {tag}: {type(exc).__name__}: {exc}")
        raise


def fleet_point(
    server: Server, processes: int, steps: int
) -> tuple[float, list[Done], float, Counters]:
    """Run ``processes`` workers on one fresh journal; return aggregate steps/s, reports, the
    wall from the barrier to the last finish, and what the server counted for the workers."""
    url = server.database()
    with open_runtime(url):
        pass  # the schema, created once: processes creating it at once race on DDL
    before = server.stats.read(dbname(url))
    context = mp.get_context("spawn")
    barrier = context.Barrier(processes + 1)
    out = context.Queue()
    workers = [
        context.Process(target=worker, args=(url, steps, f"p{i}", barrier, out), daemon=True)
        for i in range(processes)
    ]
    for process in workers:
        process.start()
    try:
        barrier.wait(timeout=300)
        released = time.monotonic()
        reports = [out.get(timeout=600) for _ in workers]
    finally:
        for process in workers:
            process.join(timeout=60)
    failed = [r for r in reports if not isinstance(r, Done)]
    if failed:
        raise RuntimeError("; ".join(map(str, failed)))
    done = [r for r in reports if isinstance(r, Done)]
    wall = max(d.finish for d in done) - released
    cost = server.stats.read(dbname(url)) - before
    return sum(d.steps for d in done) / wall, done, wall, cost


def bench_fleet(
    server: Server, chained: Chained, seconds: float, rounds: int
) -> tuple[list[Row], str]:
    """Row 3: aggregate steps/s of 1, 2 and 4 processes on one journal, the best of ``rounds``
    rounds (each runs every point once, in turn); return the rows and the curve."""
    steps = max(100, math.ceil(seconds / chained.step / 100) * 100)
    best: dict[int, tuple[float, list[Done], float, Counters]] = {}
    point = fleet_point(server, 1, steps)
    for _ in range(3):  # one process alone must run >= seconds: lengthen the chain if it did not
        if point[2] >= seconds:
            break
        steps = math.ceil(steps * 1.1 * seconds / point[2] / 100) * 100
        point = fleet_point(server, 1, steps)
    best[1] = point
    for round_no in range(rounds):
        for processes in PROCESSES[1:] if round_no == 0 else PROCESSES:
            point = fleet_point(server, processes, steps)
            if processes not in best or point[0] > best[processes][0]:
                best[processes] = point
    rows: list[Row] = []
    rates: list[float] = []
    for processes in PROCESSES:
        rate, done, wall, cost = best[processes]
        rates.append(rate)
        ratio = rate / rates[0]
        spread = max(d.finish for d in done) - min(d.finish for d in done)
        cpu = statistics.median(d.cpu for d in done) / steps
        target = processes == PROCESSES[-1]
        # Each worker is one runtime session around its chain: row 2's session cost comes off.
        net = cost - Counters(*(processes * c for c in chained.session))
        rows += [
            Row(f"fleet: {processes} process(es) x {steps:,}-step chain, one journal, "
                f"best of {rounds}",
                f"{rate:,.0f} steps/s", "1 process" if processes > 1 else "",
                f"{ratio:.2f}x" if processes > 1 else "",
                f">= {FLEET_TARGET:g}x" if target else "-",
                ratio >= FLEET_TARGET if target else None),
            Row(f"  {processes}: wall barrier to last finish, finishes spread, CPU/step",
                f"{wall:.2f} s, {spread:.2f} s, {_us(cpu)}", "", "", "-", None),
            Row(f"  {processes}: server per step (row 2's session cost subtracted)",
                net.per(processes * steps), "", "", "-", None),
        ]  # fmt: skip
    curve = " | ".join(
        f"{p} proc: {r:,.0f} steps/s ({r / rates[0]:.2f}x)"
        for p, r in zip(PROCESSES, rates, strict=True)
    )
    return rows, f"fleet curve, aggregate steps/s: {curve}"


# 4. time travel --------------------------------------------------------------------------------


def bench_time_travel(url: str, run_id: str, n: int, cold_runtimes: int = 5) -> list[Row]:
    """Row 4: runs.at at step n/2 of the chain, cold and warm, against the stream read."""
    with open_runtime(url) as rt:
        history = rt.runs.history(run_id)
        target = f"c{n // 2 - 1}"
        position = next(
            e.position
            for e in history
            if getattr(e.data, "step_id", None) == target
            and type(e.data).__name__ == "StepSucceeded"
        )
        spread = [history[(i * (len(history) - 1)) // 199].position for i in range(200)]
        rt.runs.at(run_id, position)
        rt.runs.at(run_id, position)  # the second call builds the run's checkpoints
        warm = []
        for p in spread:
            start = time.perf_counter()
            rt.runs.at(run_id, p)
            warm.append(time.perf_counter() - start)
    journal = Journal(parse_url(url), codec(), create=False)
    try:
        reads = []
        for _ in range(5):
            start = time.perf_counter()
            journal.stream(run_id, upto=position)
            reads.append(time.perf_counter() - start)
    finally:
        journal.close()
    cold, empty = [], []
    for _ in range(cold_runtimes):
        with open_runtime(url) as rt:
            cache = getattr(rt.runs, "checkpoints", None)
            empty.append(cache is not None and run_id not in cache)
            start = time.perf_counter()
            rt.runs.at(run_id, position)
            cold.append(time.perf_counter() - start)
    read = statistics.median(reads)
    c50, w50 = statistics.median(cold), statistics.median(warm)
    said = (
        "checkpoint cache empty before it"
        if all(empty)
        else "checkpoint cache state unknown"
        if not any(empty)
        else "checkpoint cache not always empty"
    )
    return [
        Row(
            f"runs.at step {n // 2:,} of {n:,}, cold: 1st call of {cold_runtimes} runtimes, p50",
            _ms(c50),
            f"stream read {_ms(read)}",
            f"{c50 / read:.2f}x",
            f"<= {AT_TARGET_MS:g} ms",
            c50 <= AT_TARGET_MS / 1e3,
        ),
        Row(f"  cold call: {said}", "", "", "", "-", None),
        Row(
            f"runs.at warm p50, {len(spread)} positions over the run, checkpoint cache",
            _ms(w50),
            f"stream read {_ms(read)}",
            f"{w50 / read:.2f}x",
            f"<= {AT_TARGET_MS:g} ms",
            w50 <= AT_TARGET_MS / 1e3,
        ),
    ]


def main() -> None:
    """Run every measurement and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    quick = parser.parse_args().quick
    n, repeats, fleet_seconds, rounds = (200, 1, 1.0, 1) if quick else (1000, 3, 3.0, 2)
    header("journaled fleet benchmark (PostgreSQL)", quick)
    with durable_postgres() as server:
        if server is None:
            return
        print(server.stats.settings() + "\n")
        url = server.database()
        rows, chained = bench_chain(server, url, n, repeats)
        fleet, curve = bench_fleet(server, chained, fleet_seconds, rounds)
        rows += fleet
        rows += bench_time_travel(url, chained.run_id, n)
    print_table(rows)
    print(f"\n{curve}")


if __name__ == "__main__":
    main()
