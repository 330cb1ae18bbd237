"""Child processes for the global-order tests on PostgreSQL (J1, J3): writers and readers.

Run as ``python tests/pg_order_worker.py writer URL NAME WORKDIR COUNT plans|facts GATE`` or
``python tests/pg_order_worker.py reader URL NAME WORKDIR``. They talk to the test through files
in WORKDIR only, so that a writer killed with SIGKILL leaves behind exactly what it had
acknowledged:

- ``NAME.ready``: the process has opened its runtime; a writer then waits for the file GATE
  (``go`` for all at once) to exist.
- a writer's ``NAME.log``: ``try TEXT`` before each append, ``fact ID TEXT`` once a remember
  returned (committed), ``run ID`` once a plan's run finished; ``done`` after its runtime closed.
  COUNT 0 means "until ``stop-writers`` exists".
- a reader's ``NAME.seen``: one ``POSITION STREAM VERSION KIND`` line per event read, in the order
  read. It reads ``rt.journal.read(after=last)`` over and over; once ``stop-readers`` holds a
  position P, it reads until it has passed P and a read finds nothing more, then writes ``done``.
- a reader's ``NAME.ahead``: ``HEAD LAST`` whenever ``rt.journal.position()`` said HEAD but the
  read right after it reached only LAST (a consumer starting after HEAD would miss events).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import journaled
from journaled.testing import wait_for

WAIT = 60.0
"""Longest a child waits for the test's go-ahead or target (never reached when things work)."""
PLAN_EVERY = 5
"""A writer with plans runs a short plan in place of every fifth remember."""
SCOPES = ("user", "project", "repository")


def writer(url: str, name: str, workdir: Path, count: int, plans: bool, gate: str) -> None:
    """Append until told to stop: remembers in the writer's own domain, and short runs."""
    scope = SCOPES[sum(map(ord, name)) % len(SCOPES)]
    with (workdir / f"{name}.log").open("a", buffering=1) as log:
        with journaled.open(url, follow=None) as rt:
            rt.register_tool("echo", lambda x: x)
            (workdir / f"{name}.ready").touch()
            wait_for((workdir / gate).exists, WAIT)
            stop = workdir / "stop-writers"
            i = 0
            while (i < count) if count else not stop.exists():
                if plans and i % PLAN_EVERY == PLAN_EVERY - 1:
                    log.write(f"try run {i}\n")
                    plan = journaled.Plan(
                        goal=f"{name} plan {i}",
                        steps=[
                            journaled.Step("a", tool="echo", input={"n": i}),
                            journaled.Step("b", tool="echo", input={"m": i}, depends_on=["a"]),
                        ],
                    )
                    result = rt.execute(plan)
                    if not result.ok:
                        raise SystemExit(f"{name}: run {result.run_id} failed")
                    log.write(f"run {result.run_id}\n")
                else:
                    text = f"{name} fact {i:05d}"
                    log.write(f"try {text}\n")
                    fact = rt.memory.remember(text, scope=scope, domain=name)
                    log.write(f"fact {fact.id} {text}\n")
                i += 1
        log.write("done\n")


def reader(url: str, name: str, workdir: Path) -> None:
    """Poll the log after the last position seen and write down every event, as read."""
    stop = workdir / "stop-readers"
    with (
        (workdir / f"{name}.seen").open("a", buffering=1) as out,
        (workdir / f"{name}.ahead").open("a", buffering=1) as ahead,
        journaled.open(url, follow=None, agents=False) as rt,
    ):
        (workdir / f"{name}.ready").touch()
        last = 0
        target: int | None = None
        deadline = None
        while True:
            if target is None and stop.exists():
                text = stop.read_text()
                if text.endswith("\n"):
                    target = int(text)
                    deadline = time.monotonic() + WAIT
            head = rt.journal.position()
            events = rt.journal.read(after=last)
            for event in events:
                out.write(f"{event.position} {event.stream} {event.version} {event.kind}\n")
                last = event.position
            if last < head:
                ahead.write(f"{head} {last}\n")
            if target is not None and last >= target and not events:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise SystemExit(f"{name}: position {target} not reached within {WAIT}s")
            if not events:
                time.sleep(0.002)  # poll interval of an idle reader, not synchronisation
        out.write("done\n")


if __name__ == "__main__":
    role, url, who, where = sys.argv[1:5]
    if role == "writer":
        writer(url, who, Path(where), int(sys.argv[5]), sys.argv[6] == "plans", sys.argv[7])
    else:
        reader(url, who, Path(where))
