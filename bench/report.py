"""What every benchmark here shares: the result row and table, the version header, and a way to
run eventsourcing's stock SQLite recorder at journaled's durability for a fair floor."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sqlite3
from typing import NamedTuple

from eventsourcing.sqlite import SQLiteDatastore

LIBRARIES = ("eventsourcing", "pykka", "msgspec")
SYNCHRONOUS_CODES = {"OFF": 0, "NORMAL": 1, "FULL": 2}


class Row(NamedTuple):
    """One line of the result table; ``ok`` is None for an informative line without a target."""

    name: str
    ours: str
    baseline: str
    ratio: str
    target: str
    ok: bool | None


def header(title: str, quick: bool) -> None:
    """Print the benchmark's title and the versions it ran with."""
    print(f"{title} ({'quick' if quick else 'full'}, {os.cpu_count()} CPUs)")
    versions = ", ".join(f"{n} {importlib.metadata.version(n)}" for n in LIBRARIES)
    print(f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, {versions}\n")


def print_table(rows: list[Row]) -> None:
    """Print the rows as aligned columns."""
    verdicts = {None: "", True: "PASS", False: "MISS"}
    cells = [("measurement", "ours", "baseline", "ratio", "target", "")]
    cells += [(*r[:5], verdicts[r.ok]) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(6)]
    for i, cell in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def set_synchronous(datastore: SQLiteDatastore, level: str) -> None:
    """Run ``PRAGMA synchronous=<level>`` on every connection the stock recorder's pool keeps.

    The library has no setting for it. The PRAGMA is per connection and refused inside a
    transaction, and ``datastore.transaction()`` always begins with BEGIN, so all ``pool_size``
    connections are checked out at once through the pool's public ``get_connection`` (which
    creates them), the PRAGMA runs through each connection's public ``cursor()`` (autocommit: no
    transaction is open), and they are put back. A single-threaded run never opens overflow
    connections, so every later commit runs at this level; it is read back to prove it.
    """
    pool = datastore.pool
    connections = [pool.get_connection() for _ in range(pool.pool_size)]
    try:
        for connection in connections:
            connection.cursor().execute(f"PRAGMA synchronous={level}")
    finally:
        for connection in connections:
            pool.put_connection(connection)
    with datastore.transaction(commit=True) as cursor:
        cursor.execute("PRAGMA synchronous")
        found = cursor.fetchone()[0]
    if found != SYNCHRONOUS_CODES[level]:
        raise RuntimeError(f"stock recorder runs at synchronous={found}, not {level}")
