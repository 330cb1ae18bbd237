"""One global order under many PostgreSQL writers (J1, J3): what every reader must see.

Writer processes append at once (remembers in their own scope and domain, short runs) while
reader processes poll ``rt.journal.read(after=last)`` and write down every event as they read it.
Whatever makes appends from many processes safe (a table lock, a sequence checked against
transaction ids, an append service), these must hold:

- each reader sees positions strictly increase: nothing ever appears behind what it passed, nor
  at or before a position ``rt.journal.position()`` already named;
- once the writers are done, a full read equals exactly what each reader saw, in order (nothing
  skipped, nothing twice), and every stream's versions run 1, 2, 3... in that order;
- every append a writer saw committed is there; one killed mid-append leaves no reader stuck and
  never shows what it had not committed;
- a foreign transaction left open (a slow job, a backup) blocks no writer and hides nothing once
  it ends.

The children live in tests/pg_order_worker.py and talk to the test through files only.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("psycopg", reason="PostgreSQL tests need the postgres extra (psycopg)")
import psycopg

import journaled
from journaled.subscriptions import Subscription
from journaled.testing import wait_for

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("pg_order_worker.py")
WAIT = 60.0
"""Longest any wait in these tests lasts (never reached when things work)."""

PROGRESS = 20.0
"""Longest a reader may lag behind appends other writers committed (never reached either)."""

Seen = tuple[int, str, int, str]
"""An event as a reader wrote it down: position, stream, version, kind."""


class Fleet:
    """Writer and reader processes on one journal, and the files they leave in ``workdir``."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def _start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with (self.workdir / f"{name}.err").open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, str(WORKER), *args],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        self.procs[name] = proc
        return proc

    def writer(
        self, name: str, count: int = 0, *, plans: bool = True, gate: str = "go"
    ) -> subprocess.Popen[bytes]:
        """Start a writer of ``count`` appends (0: until :meth:`stop_writers`) once ``gate``
        exists in the work directory (:meth:`go` for most)."""
        kind = "plans" if plans else "facts"
        args = [self.url, name, str(self.workdir), str(count), kind, gate]
        return self._start(name, "writer", *args)

    def reader(self, name: str) -> subprocess.Popen[bytes]:
        """Start a reader polling the log."""
        return self._start(name, "reader", self.url, name, str(self.workdir))

    def ready(self, *names: str) -> None:
        """Wait until each named child has opened its runtime."""
        for name in names:
            wait_for(lambda n=name: self._ready_or_dead(n), WAIT)  # type: ignore[misc]

    def _ready_or_dead(self, name: str) -> bool:
        proc = self.procs[name]
        if proc.poll() is not None:
            pytest.fail(f"{name} exited ({proc.returncode}) before it was ready:\n{self.err(name)}")
        return (self.workdir / f"{name}.ready").exists()

    def go(self) -> None:
        """Let every writer start appending."""
        (self.workdir / "go").touch()

    def stop_writers(self) -> None:
        """Ask the writers started without a count to stop."""
        (self.workdir / "stop-writers").touch()

    def err(self, name: str) -> str:
        return (self.workdir / f"{name}.err").read_text(errors="replace")[-3000:]

    def finished(self, *names: str) -> None:
        """Wait for each named child to exit successfully."""
        for name in names:
            proc = self.procs[name]
            try:
                code = proc.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name} did not finish within {WAIT}s:\n{self.err(name)}")
            assert code == 0, f"{name} exited {code}:\n{self.err(name)}"

    def kill(self, name: str) -> None:
        """SIGKILL a child at once."""
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=WAIT) == -signal.SIGKILL

    def log(self, name: str) -> list[str]:
        """Return a writer's complete log lines."""
        return _lines(self.workdir / f"{name}.log")

    def committed(self, name: str) -> int:
        """Count the appends a writer saw committed so far."""
        return sum(line.startswith(("fact ", "run ")) for line in self.log(name))

    def seen(self, name: str) -> list[Seen]:
        """Return what a reader wrote down so far, in the order it read it."""
        out: list[Seen] = []
        for line in _lines(self.workdir / f"{name}.seen"):
            if line != "done":
                position, stream, version, kind = line.split(" ")
                out.append((int(position), stream, int(version), kind))
        return out

    def last_seen(self, name: str) -> int:
        seen = self.seen(name)
        return seen[-1][0] if seen else 0

    def drain_readers(self, *names: str) -> list[Seen]:
        """Tell the readers where the log ends, wait for them; return the full log."""
        final = full_log(self.url)
        (self.workdir / "stop-readers").write_text(f"{final[-1][0] if final else 0}\n")
        self.finished(*names)
        return final

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=WAIT)


def waited(
    condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.01
) -> None:
    """Wait for ``condition``, or fail the test saying ``what`` did not happen."""
    try:
        wait_for(condition, timeout, interval)
    except TimeoutError:
        pytest.fail(f"{what} within {timeout}s")


def client_ports(pid: int) -> list[int]:
    """Return the local TCP ports of a process's sockets: its connections' ``client_port``."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


_WRITING = (
    "SELECT CASE WHEN state = 'active' AND wait_event_type IS DISTINCT FROM 'Lock' "
    "THEN 'busy' ELSE state END FROM pg_stat_activity "
    "WHERE client_port = ANY(%s) AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()"
)
"""The states of a process's sessions whose open transaction has written something: ``busy``
while the server works on what it was sent (one waiting for a lock, maybe held by a sibling
session of the frozen process, is not)."""


def sessions(url: str, ports: list[int]) -> list[int]:
    """Return the server processes of the sessions connected from these client ports."""
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s)", [ports]
        ).fetchall()
        return [int(pid) for (pid,) in found]


def kill_mid_transaction(fleet: Fleet, name: str, within: float) -> list[int]:
    """SIGKILL a writer while a transaction of its own that has written is open; return its
    client ports then, or [] when none was caught within ``within`` seconds (the writer is
    left running).

    The writer is frozen (SIGSTOP) as soon as one of its sessions holds a transaction id; if,
    once the server has done what it was sent, that session is idle in its transaction, the
    writer dies there: between taking its place in the log and committing it.
    """
    pid = fleet.procs[name].pid
    deadline = time.monotonic() + within
    with psycopg.connect(fleet.url, autocommit=True) as monitor:

        def writing(ports: list[int]) -> set[str]:
            return {str(state) for (state,) in monitor.execute(_WRITING, [ports])}

        while time.monotonic() < deadline:
            ports = client_ports(pid)
            if not writing(ports):
                continue
            os.kill(pid, signal.SIGSTOP)
            try:
                wait_for(lambda p=ports: "busy" not in writing(p), 2.0)  # type: ignore[misc]
                if "idle in transaction" in writing(ports):
                    fleet.kill(name)
                    return ports
            except TimeoutError:  # still at work when it was frozen: let it go and try again
                pass
            finally:
                if fleet.procs[name].poll() is None:
                    os.kill(pid, signal.SIGCONT)
    return []


def freeze_in_flight(fleet: Fleet, name: str, in_flight: Callable[[], bool]) -> list[int]:
    """Freeze a writer (SIGSTOP) at a moment its log says an append is under way, and return its
    client ports; it is left frozen, for the caller to kill.

    The log is read again once the writer is stopped: a writer that finished the append between
    the first look and the signal is let go and caught at a later one, so the kill never lands
    between two appends (which a loaded machine makes likely enough to matter).
    """
    proc = fleet.procs[name]
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        waited(in_flight, WAIT, f"{name} was never seen appending", 0.001)
        proc.send_signal(signal.SIGSTOP)
        waited(lambda: stopped(proc.pid), WAIT, f"{name} did not stop")
        if in_flight():
            return client_ports(proc.pid)
        proc.send_signal(signal.SIGCONT)
    pytest.fail(f"{name} was never frozen while appending within {WAIT}s")


def stopped(pid: int) -> bool:
    """Tell whether a process is stopped by a signal (state T in /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2] == "T"


def _lines(path: Path) -> list[str]:
    """Return the complete lines of a file another process may still be appending to."""
    if not path.exists():
        return []
    text = path.read_text()
    return text[: text.rfind("\n") + 1].splitlines()


def full_log(url: str) -> list[Seen]:
    """Read the whole journal through a fresh runtime."""
    with journaled.open(url, follow=None, agents=False) as rt:
        return [(e.position, e.stream, e.version, e.kind) for e in rt.journal.read()]


@pytest.fixture(params=["fast"])
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    """Yield an empty fleet on a fresh PostgreSQL journal; kill whatever is left at the end.

    ``durable`` (indirect parameter) puts it on a server that fsyncs and commits synchronously:
    there an append's commit is visible before it is on disk, and reads must stop at what is
    (ADR 0044); the shared server commits without waiting, so its reads never wait.
    """
    url: str = request.getfixturevalue("durable_pg_url" if request.param == "durable" else "pg_url")
    journaled.open(url, follow=None, agents=False).close()  # tables made before the children
    fleet = Fleet(url, tmp_path)
    try:
        yield fleet
    finally:
        fleet.close()


def check_order(fleet: Fleet, readers: list[str], final: list[Seen]) -> None:
    """Assert J1 as every reader saw it against the full log read after the writers ended."""
    positions = [p for p, *_ in final]
    assert positions == sorted(set(positions)), "the full log repeats or reorders positions"
    assert final == full_log(fleet.url), "the log changed after every writer had ended"
    for name in readers:
        seen = fleet.seen(name)
        passed = 0
        for position, stream, version, _ in seen:
            assert position > passed, (
                f"{name} read {stream}@{version} at {position} after it had passed {passed}"
            )
            passed = position
        missed = sorted(set(final) - set(seen))
        extra = sorted(set(seen) - set(final))
        assert not missed, f"{name} never saw {len(missed)} events, first {missed[:3]}"
        assert not extra, f"{name} saw {len(extra)} events the log does not hold: {extra[:3]}"
        assert seen == final
        ahead = _lines(fleet.workdir / f"{name}.ahead")
        assert not ahead, (
            f"rt.journal.position() named a position the read right after it did not reach "
            f"(head, reached): {ahead[:3]}"
        )
    versions: dict[str, list[int]] = defaultdict(list)
    for _, stream, version, _ in final:
        versions[stream].append(version)
    broken = {s: v for s, v in versions.items() if v != list(range(1, len(v) + 1))}
    assert not broken, f"streams whose versions are not 1..n in log order: {list(broken)[:3]}"


def acknowledged(fleet: Fleet, name: str) -> tuple[set[str], set[str]]:
    """Return the fact ids and run ids a writer saw committed."""
    facts, runs = set(), set()
    for line in fleet.log(name):
        word, _, rest = line.partition(" ")
        if word == "fact":
            facts.add(rest.split(" ")[0])
        elif word == "run":
            runs.add(rest)
    return facts, runs


def check_acknowledged(fleet: Fleet, writers: list[str], final: list[Seen]) -> int:
    """Assert every fact and run the writers saw committed is in the log; return how many."""
    streams = {stream for _, stream, _, _ in final}
    total = 0
    for name in writers:
        facts, runs = acknowledged(fleet, name)
        assert facts, f"{name} committed nothing"
        assert facts <= streams, f"{name}'s committed facts missing: {sorted(facts - streams)[:3]}"
        missing = runs - streams
        assert not missing, f"{name}'s finished runs missing from the log: {sorted(missing)[:3]}"
        total += len(facts) + len(runs)
    return total


# -- J1 under concurrent appenders -------------------------------------------------------------


@pytest.mark.parametrize("fleet", ["fast", "durable"], indirect=True)
def test_concurrent_appenders_leave_one_order_every_reader_sees_whole(fleet: Fleet) -> None:
    """J1/J3: 4 writer processes append at once; 2 polling readers each see the log exactly once,
    in one strictly increasing order that never grows behind them, streams gap-free."""
    writers = [f"w{n}" for n in range(4)]
    readers = ["r0", "r1"]
    for name in writers:
        fleet.writer(name, 25)
    for name in readers:
        fleet.reader(name)
    fleet.ready(*writers, *readers)
    fleet.go()
    fleet.finished(*writers)
    during = {name: len(fleet.seen(name)) for name in readers}
    final = fleet.drain_readers(*readers)
    assert all(during.values()), f"the readers read nothing while the writers ran: {during}"
    check_order(fleet, readers, final)
    assert check_acknowledged(fleet, writers, final) == 4 * 25


# -- a writer killed mid-append ----------------------------------------------------------------


def test_a_writer_killed_mid_append_leaves_no_reader_stuck(fleet: Fleet) -> None:
    """J1/J3: a writer SIGKILLed mid-append, 4 times over, strands no reader; its committed
    appends are all in the one order, its uncommitted one never appears."""
    steady = ["w0", "w1"]
    readers = ["r0", "r1"]
    victims = [f"victim{k}" for k in range(4)]
    for name in steady:
        fleet.writer(name)
    for name in victims:  # each starts appending when its turn comes
        fleet.writer(name, plans=False, gate=f"{name}.go")
    for name in readers:
        fleet.reader(name)
    fleet.ready(*steady, *victims, *readers)
    fleet.go()
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    at_death: dict[str, set[str]] = {}
    with journaled.open(fleet.url, follow=None, agents=False) as rt:
        for k, name in enumerate(victims):
            (fleet.workdir / f"{name}.go").touch()
            after = rng.randint(1, 12)

            def in_flight(name: str = name) -> bool:
                return fleet.log(name)[-1].startswith("try ")

            # Half of them killed while a transaction of theirs is open (where the writer holds
            # one across round trips), the rest while the log says an append is under way:
            # before it is sent, while the server holds it, or before the caller hears back.
            waited(
                lambda n=name, a=after: fleet.committed(n) >= a,  # type: ignore[misc]
                WAIT,
                f"{name} did not commit {after} appends",
            )
            ports = kill_mid_transaction(fleet, name, 5.0) if k % 2 else []
            if not ports:
                ports = freeze_in_flight(fleet, name, in_flight)
                fleet.kill(name)
            mark = rt.journal.position()

            def passed(mark: int = mark) -> bool:
                return all(fleet.last_seen(r) > mark for r in readers)

            try:
                wait_for(passed, PROGRESS)
            except TimeoutError:
                stuck = {r: fleet.last_seen(r) for r in readers}
                pytest.fail(
                    f"readers stuck after {name} was killed (seed {seed}): {stuck} <= {mark}"
                )
            # Once the server has ended the dead writer's sessions, what it left is final.
            waited(
                lambda p=ports: not sessions(fleet.url, p),  # type: ignore[misc]
                WAIT,
                f"the server did not end {name}'s sessions",
            )
            rt.refresh()
            at_death[name] = {f.text for f in rt.memory.all() if f.domain == name}
        fleet.stop_writers()
        fleet.finished(*steady)
        final = fleet.drain_readers(*readers)
        check_order(fleet, readers, final)
        check_acknowledged(fleet, steady + victims, final)
        rt.refresh()
        by_domain: dict[str | None, set[str]] = defaultdict(set)
        for fact in rt.memory.all():
            by_domain[fact.domain].add(fact.text)
    for name in victims:
        log = fleet.log(name)
        tried = {line[4:] for line in log if line.startswith("try ")}
        committed = {line.split(" ", 2)[2] for line in log if line.startswith("fact ")}
        stored = by_domain[name]
        assert len(tried - committed) == 1, f"{name} had not exactly one append in flight"
        assert committed <= stored, f"{name}'s committed facts lost: {committed - stored}"
        assert stored <= tried, f"{name} shows facts it never appended: {stored - tried}"
        assert stored == at_death[name], (
            f"{name}'s facts changed after it died: {stored ^ at_death[name]}"
        )


# -- a foreign transaction left open -----------------------------------------------------------


@pytest.mark.parametrize("fleet", ["fast", "durable"], indirect=True)
@pytest.mark.parametrize("foreign", ["commit", "rollback", "backup"])
def test_an_open_foreign_transaction_blocks_no_writer_and_hides_nothing(
    fleet: Fleet, foreign: str
) -> None:
    """J1/J3: while another session holds a transaction open (one that wrote a scratch table and
    then commits or rolls back, or a REPEATABLE READ backup of every table), writers finish,
    readers keep up, and the one order holds with every append seen."""
    writers = ["w0", "w1", "w2"]
    readers = ["r0", "r1"]
    with psycopg.connect(fleet.url, autocommit=True) as admin:
        admin.execute("CREATE TABLE order_scratch (n int)")
    slow = psycopg.connect(fleet.url)
    caught_up = True
    try:
        if foreign == "backup":
            slow.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            tables = slow.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
            ).fetchall()
            for (table,) in tables:  # each now held (ACCESS SHARE) until the backup ends
                slow.execute(f'SELECT count(*) FROM public."{table}"')  # noqa: S608
        else:
            slow.execute("INSERT INTO order_scratch VALUES (1)")
            xid = slow.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()
            assert xid is not None
            assert xid[0] is not None, "the slow transaction holds no transaction id"
        for name in writers:
            fleet.writer(name, 20)
        for name in readers:
            fleet.reader(name)
        fleet.ready(*writers, *readers)
        fleet.go()
        fleet.finished(*writers)
        assert slow.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        committed = set().union(*(set().union(*acknowledged(fleet, w)) for w in writers))

        def seen_by_all() -> bool:
            return all(committed <= {s for _, s, _, _ in fleet.seen(r)} for r in readers)

        try:
            wait_for(seen_by_all, PROGRESS)
        except TimeoutError:
            caught_up = False
        assert slow.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        if foreign == "rollback":
            slow.rollback()
        else:
            slow.commit()
    finally:
        slow.close()
    final = fleet.drain_readers(*readers)
    check_order(fleet, readers, final)
    assert check_acknowledged(fleet, writers, final) == 3 * 20
    assert caught_up, (
        "readers did not see the writers' appends while the other transaction was open"
    )


# -- a named subscription across the concurrent appends -----------------------------------------


def test_a_named_subscription_delivers_every_concurrent_append_once_in_order(
    fleet: Fleet,
) -> None:
    """J1/A3: a named subscription followed while 3 processes append, closed and resumed half-way,
    delivers every event of the log exactly once, in log order."""
    writers = ["w0", "w1", "w2"]
    for name in writers:
        fleet.writer(name, 20)
    got: list[Seen] = []

    def take(sub: Subscription, enough: Callable[[], bool]) -> None:
        while not enough():
            event = sub.poll(WAIT)
            assert event is not None, f"nothing delivered within {WAIT}s after {len(got)} events"
            got.append((event.position, event.stream, event.version, event.kind))
            sub.ack(event.position)

    with journaled.open(fleet.url, follow=None) as rt, rt.journal.subscribe(name="audit") as sub:
        fleet.ready(*writers)
        fleet.go()
        take(sub, lambda: len(got) >= 30)
    with journaled.open(fleet.url, follow=None) as rt, rt.journal.subscribe(name="audit") as sub:
        assert sub.position == got[-1][0], "the named subscription did not resume at its ack"
        mine = rt.memory.remember("the subscriber's own process appends too")
        fleet.finished(*writers)
        final = full_log(fleet.url)
        take(sub, lambda: got[-1][0] >= final[-1][0])
        assert sub.poll(0.2) is None
    assert got == final
    assert len(got) == len(set(got))
    assert mine.id in {stream for _, stream, _, _ in got}
