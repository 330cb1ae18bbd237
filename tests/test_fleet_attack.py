"""Many processes on one PostgreSQL journal (J1-J3, R1, R7, R8, E14, S3): what must hold.

Real child processes (``python -c`` of :data:`CHILD`) share one database and talk to the test
through files in a work directory only: ``NAME.ready`` once the runtime is open, then they wait
for ``go``; ``NAME.log`` lines for what they were told was stored; ``effects`` lines (appended
with ``O_APPEND``) for each side effect a step made.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pg
import pytest
from required import unavailable

pytest.importorskip("psycopg", reason="PostgreSQL tests need the postgres extra (psycopg)")

import journaled
from journaled.testing import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
WAIT = 60.0
"""Longest any wait lasts (never reached when things work)."""

CHILD = r"""
import os, sys, time
from pathlib import Path
import journaled
from journaled.testing import wait_for

command, url, name, workdir = sys.argv[1:5]
args = sys.argv[5:]
workdir = Path(workdir)
log = (workdir / f"{name}.log").open("a", buffering=1)


def effect(step):
    def tool(value):
        fd = os.open(workdir / "effects", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{name} {step}\n".encode())
        os.close(fd)
        if (workdir / f"block-{step}").exists():
            (workdir / f"{name}.blocked").touch()
            while (workdir / f"block-{step}").exists():  # held until the test lets it go
                time.sleep(0.01)
        return value
    return tool


org = os.environ.get("FLEET_ORG") or None
with journaled.open(url, organization=org, follow=None) as rt:
    for step in ("a", "b", "c"):
        rt.register_tool(f"t{step}", effect(step))
    (workdir / f"{name}.ready").touch()
    wait_for((workdir / "go").exists, 60)
    if command == "remember":
        key, count, scope = args[0], int(args[1]), args[2]
        for i in range(count):
            fact = rt.memory.remember(f"{name} value {i}", scope=scope, conflict_key=key)
            log.write(f"fact {fact.id}\n")
    elif command == "execute":
        plan = journaled.Plan(goal="fleet", steps=[
            journaled.Step("a", tool="ta", input={"n": 1}),
            journaled.Step("b", tool="tb", input={"n": 2}, depends_on=["a"]),
            journaled.Step("c", tool="tc", input={"n": 3}, depends_on=["b"]),
        ])
        handle = rt.start(plan)
        log.write(f"run {handle.run_id}\n")
        log.write(f"ok {handle.result().ok}\n")
    elif command == "loop":
        i = 0
        while not (workdir / "stop").exists() and not (workdir / "stop-writers").exists():
            i += 1
            try:
                fact = rt.memory.remember(f"{name} value {i}", domain=name)
            except Exception as exc:
                first = str(exc).splitlines()[0][:200] if str(exc) else ""
                log.write(f"error {type(exc).__name__} {first}\n")
                time.sleep(0.05)
            else:
                log.write(f"fact {fact.id}\n")
    elif command == "follow":
        with rt.journal.subscribe(topics="memory.fact-remembered") as sub:
            while not (workdir / "stop").exists():
                try:
                    event = sub.poll(timeout=0.2)
                    if event is not None:
                        log.write(f"seen {event.stream} {event.position}\n")
                except Exception as exc:
                    log.write(f"error {type(exc).__name__} {exc}\n".replace("\n", " ") + "\n")
                    time.sleep(0.2)
    elif command == "resume":
        try:
            result = rt.resume(args[0])
        except journaled.RunOwnedElsewhere:
            log.write("owned\n")
        else:
            log.write(f"ok {result.ok}\n")
    elif command == "verify":
        for _ in range(int(args[0])):
            report = rt.journal.verify()
            log.write(f"verify {report.ok} {report.events} {report.problem!r}\n")
log.write("done\n")
"""


class Fleet:
    """Child processes on one journal and the files they leave in ``workdir``."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, command: str, name: str, *args: str, org: str | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "FLEET_ORG": org or ""}
        with (self.workdir / f"{name}.err").open("wb") as err:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-c", CHILD, command, self.url, name, str(self.workdir), *args],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
            )

    def err(self, name: str) -> str:
        return (self.workdir / f"{name}.err").read_text(errors="replace")[-3000:]

    def log(self, name: str) -> list[str]:
        path = self.workdir / f"{name}.log"
        return path.read_text().splitlines() if path.exists() else []

    def ready(self, *names: str) -> None:
        for name in names:
            wait_for(lambda n=name: self._there(n, "ready"), WAIT)  # type: ignore[misc]

    def _there(self, name: str, suffix: str) -> bool:
        proc = self.procs[name]
        if proc.poll() is not None and not (self.workdir / f"{name}.{suffix}").exists():
            pytest.fail(f"{name} exited ({proc.returncode}):\n{self.err(name)}")
        return (self.workdir / f"{name}.{suffix}").exists()

    def blocked(self, name: str) -> None:
        wait_for(lambda: self._there(name, "blocked"), WAIT)

    def go(self) -> None:
        (self.workdir / "go").touch()

    def finished(self, *names: str, timeout: float = WAIT) -> None:
        for name in names:
            try:
                code = self.procs[name].wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name} did not finish within {timeout}s:\n{self.err(name)}")
            assert code == 0, f"{name} exited {code}:\n{self.err(name)}"

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(timeout=WAIT)

    def effects(self) -> list[tuple[str, str]]:
        path = self.workdir / "effects"
        if not path.exists():
            return []
        return [(n, s) for n, s in (line.split() for line in path.read_text().splitlines())]

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def fleet(pg_url: str, tmp_path: Path) -> Iterator[Fleet]:
    journaled.open(pg_url, agents=False).close()  # migrate once, before the children race
    children = Fleet(pg_url, tmp_path)
    try:
        yield children
    finally:
        children.close()


def test_processes_remembering_one_conflict_key_leave_one_current_fact(fleet: Fleet) -> None:
    """M3, J3: six processes remember with one conflict key at once: every fact acknowledged is
    stored once, exactly one is current, and the supersessions form one chain."""
    names = [f"w{n}" for n in range(6)]
    for name in names:
        fleet.start("remember", name, "the-key", "8", "project")
    fleet.ready(*names)
    fleet.go()
    fleet.finished(*names)
    acknowledged = [line.split()[1] for n in names for line in fleet.log(n) if line[:4] == "fact"]
    assert len(acknowledged) == 48
    with journaled.open(fleet.url, agents=False, follow=None) as rt:
        facts = rt.memory.all()
        assert sorted(f.id for f in facts) == sorted(acknowledged)
        current = [f for f in facts if f.superseded_by is None]
        assert len(current) == 1, [f.text for f in current]
        by_id = {f.id: f for f in facts}
        # every superseded fact names a fact that lists it, and each fact is superseded once
        listed = [old for f in facts for old in f.supersedes]
        assert sorted(listed) == sorted(f.id for f in facts if f.superseded_by is not None)
        for f in facts:
            if f.superseded_by is not None:
                assert f.id in by_id[f.superseded_by].supersedes


def test_processes_resuming_one_crashed_run_execute_it_once(fleet: Fleet) -> None:
    """R8, E14: the owner is SIGKILLed in step b; four processes resume the run at once:
    exactly one executes (the others are told RunOwnedElsewhere) and b and c run once more."""
    (fleet.workdir / "block-b").touch()
    fleet.start("execute", "owner")
    fleet.ready("owner")
    fleet.go()
    fleet.blocked("owner")
    run_id = next(line.split()[1] for line in fleet.log("owner") if line.startswith("run "))
    fleet.kill("owner")
    (fleet.workdir / "go").unlink()
    names = [f"r{n}" for n in range(4)]
    for name in names:
        fleet.start("resume", name, run_id)
    fleet.ready(*names)
    fleet.go()
    # The one that executes is held in b until the three others have tried: a resume that came
    # after the run completed would be told there is nothing to resume, which is no race here.
    wait_for(
        lambda: (
            sum(fleet.log(n)[:1] == ["owned"] for n in names) == 3
            and sum((fleet.workdir / f"{n}.blocked").exists() for n in names) == 1
        ),
        WAIT,
    )
    (fleet.workdir / "block-b").unlink()
    fleet.finished(*names)
    outcomes = sorted(fleet.log(n)[0] for n in names)
    assert outcomes == ["ok True", "owned", "owned", "owned"], outcomes
    effects = fleet.effects()
    assert sorted(s for _, s in effects) == ["a", "b", "b", "c"], effects
    with journaled.open(fleet.url, agents=False, follow=None) as rt:
        kinds = [e.kind for e in rt.runs.history(run_id)]
        assert kinds.count("run.resumed") == 1, kinds
        assert rt.runs.list()[0].status == "completed"


def test_verify_while_other_processes_append_reports_no_fault(fleet: Fleet) -> None:
    """R7, J1: ``journal verify`` in one process while four others append reports a whole
    chain every time."""
    names = [f"w{n}" for n in range(4)]
    for name in names:
        fleet.start("remember", name, f"key-{name}", "40", "project")
    fleet.start("verify", "v", "15")
    fleet.ready(*names, "v")
    fleet.go()
    fleet.finished(*names, "v")
    reports = [line for line in fleet.log("v") if line.startswith("verify")]
    assert len(reports) == 15
    assert all(line.split()[1] == "True" for line in reports), reports


def test_a_second_organization_on_the_same_database_keeps_its_own_conflict_keys(
    fleet: Fleet,
) -> None:
    """R1, M3: two organizations' processes remember into their organization scope with one
    conflict key at once: each keeps one current fact of its own; neither supersedes the
    other's (the shared scopes are shared by design)."""
    for org in ("acme", "globex"):
        for n in range(2):
            fleet.start("remember", f"{org}{n}", "shared-key", "6", "organization", org=org)
    names = list(fleet.procs)
    fleet.ready(*names)
    fleet.go()
    fleet.finished(*names)
    for org in ("acme", "globex"):
        mine = {line.split()[1] for n in range(2) for line in fleet.log(f"{org}{n}")[:-1]}
        with journaled.open(fleet.url, organization=org, agents=False, follow=None) as rt:
            facts = rt.memory.all()
            texts = sorted(f.text for f in facts)
            assert {f.id for f in facts} == mine, f"{org}: {texts} {len(mine)}"
            assert len([f for f in facts if f.superseded_by is None]) == 1
            assert all(set(f.supersedes) <= mine for f in facts)


@pytest.fixture(scope="module")
def server() -> Iterator[pg.PostgresServer]:
    """A server of this module's own, which its tests restart."""
    try:
        started = pg.PostgresServer()
    except pg.PostgresUnavailable as exc:
        unavailable("POSTGRES", str(exc))
    started.start()
    try:
        yield started
    finally:
        started.stop()


def _restart(server: pg.PostgresServer, **settings: str) -> None:
    """``pg_ctl restart`` (a fast shutdown: sessions are cut off), with changed settings."""
    server._run("pg_ctl", "-D", str(server.data), "-m", "fast", "-w", "stop")
    for key, value in settings.items():
        server._options = re.sub(rf"-c {key}=\S+", f"-c {key}={value}", server._options)
    server._pg_ctl_start()


def _stored(url: str) -> set[str]:
    with journaled.open(url, agents=False, follow=None) as rt:
        return {f.id for f in rt.memory.all()}


def test_runtimes_live_through_a_server_restart_and_lose_nothing_they_acknowledged(
    server: pg.PostgresServer, tmp_path: Path
) -> None:
    """J3, S3: three processes remember in a loop while the server restarts: each remembers
    again afterwards (it reconnects), and every fact it was told was stored is there, once."""
    url = pg.create_database(server.url("postgres"))
    journaled.open(url, agents=False).close()
    fleet = Fleet(url, tmp_path)
    try:
        names = ["w0", "w1", "w2"]
        for name in names:
            fleet.start("loop", name)
        fleet.ready(*names)
        fleet.go()
        wait_for(lambda: all(len(fleet.log(n)) >= 5 for n in names), WAIT)
        _restart(server)
        before = {n: len(fleet.log(n)) for n in names}
        wait_for(
            lambda: all(
                any(line.startswith("fact") for line in fleet.log(n)[before[n] :]) for n in names
            ),
            20,
        )
        (tmp_path / "stop").touch()
        fleet.finished(*names, timeout=30)
        acknowledged = [
            line.split()[1] for n in names for line in fleet.log(n) if line.startswith("fact")
        ]
        assert len(acknowledged) == len(set(acknowledged))
        assert set(acknowledged) <= _stored(url)
    finally:
        fleet.close()


def test_a_follower_in_another_process_is_delivered_what_is_appended_after_a_restart(
    server: pg.PostgresServer, tmp_path: Path
) -> None:
    """A3, S3: a subscription follows writers of other processes; the server restarts under
    them: the follower is delivered every fact acknowledged, before and after, once, in order."""
    url = pg.create_database(server.url("postgres"))
    journaled.open(url, agents=False).close()
    fleet = Fleet(url, tmp_path)
    try:
        fleet.start("follow", "f")
        fleet.start("loop", "w0")
        fleet.start("loop", "w1")
        fleet.ready("f", "w0", "w1")
        fleet.go()
        wait_for(lambda: len(fleet.log("f")) >= 5, WAIT)
        _restart(server)
        before = {n: len(fleet.log(n)) for n in ("w0", "w1")}
        wait_for(
            lambda: all(
                sum(line.startswith("fact") for line in fleet.log(n)[before[n] :]) >= 3
                for n in ("w0", "w1")
            ),
            20,
        )
        (tmp_path / "stop-writers").touch()
        acknowledged = {
            line.split()[1]
            for n in ("w0", "w1")
            for line in fleet.log(n)
            if line.startswith("fact")
        }

        def delivered() -> list[str]:
            return [line.split()[1] for line in fleet.log("f") if line.startswith("seen")]

        deadline = time.monotonic() + 10
        while not acknowledged <= set(delivered()) and time.monotonic() < deadline:
            time.sleep(0.05)
        missing = acknowledged - set(delivered())
        assert not missing, (len(missing), len(acknowledged), fleet.log("f")[-3:], fleet.err("f"))
        seen = fleet.log("f")
        assert not [line for line in seen if line.startswith("error")], seen
        positions = [int(line.split()[2]) for line in seen if line.startswith("seen")]
        assert positions == sorted(set(positions))
    finally:
        (tmp_path / "stop").touch()
        fleet.close()
