"""A run's owner in another PID namespace of the same host name (a sidecar container of one
pod, ``docker run --network host``) is judged by the lease, not by a pid this reader cannot see
(E14, J3, T2, ADR 0011, ADR 0088): a live run is listed ``running`` and never taken over."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from required import unavailable

import journaled
from journaled.actors.ownership import LEASE_MS, owner_alive, owner_stopped, this_process

WAIT = 30.0
CLI = [sys.executable, "-m", "journaled.cli"]
ROOT = Path(__file__).resolve().parent.parent

RUNNER = textwrap.dedent(
    """
    import os, sys, time
    import journaled
    url, gate = sys.argv[1], sys.argv[2]
    def wait_gate(_):
        end = time.time() + 60
        while not os.path.exists(gate) and time.time() < end:
            time.sleep(0.05)
        return "through"
    with journaled.open(url) as rt:
        rt.register_tool("gate", wait_gate)
        handle = rt.start(journaled.Plan(goal="long run", steps=[journaled.Step("a", tool="gate")]))
        print(handle.run_id, flush=True)
        handle.result(timeout=90)
    """
)

RESUMER = textwrap.dedent(
    """
    import sys
    import journaled
    url, run_id = sys.argv[1], sys.argv[2]
    with journaled.open(url) as rt:
        rt.register_tool("gate", lambda _: "second executor")
        try:
            rt.resume(run_id)
            print("RESUMED")
        except journaled.RunOwnedElsewhere:
            print("REFUSED")
    """
)


def _in_other_pid_namespace(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


@pytest.fixture
def other_namespace() -> None:
    if shutil.which("unshare") is None:
        unavailable("NAMESPACES", "no unshare on this machine (util-linux)")
    probe = _in_other_pid_namespace("true")
    if probe.returncode != 0:
        why = probe.stderr.strip()[:200]
        unavailable("NAMESPACES", f"no PID namespace can be made here (run as root): {why}")


@pytest.fixture
def running(tmp_path: Path, sqlite_url: str) -> Iterator[str]:
    """A run whose step is in flight in a child process; yields its id."""
    journaled.open(sqlite_url).close()
    gate = tmp_path / "gate"
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    proc = subprocess.Popen(
        [sys.executable, str(script), sqlite_url, str(gate)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        run_id = proc.stdout.readline().strip()
        assert run_id.startswith("run_")
        deadline = time.monotonic() + WAIT
        with journaled.open(sqlite_url) as rt:
            while rt.runs.state(run_id).status.get("a") != "running":
                assert time.monotonic() < deadline, "the step never started"
                time.sleep(0.05)
        yield run_id
    finally:
        gate.touch()
        try:
            proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(WAIT)
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_run_executing_in_another_pid_namespace_is_running_there_and_not_taken_over(
    other_namespace: None, running: str, sqlite_url: str, tmp_path: Path
) -> None:
    """T2, E14: read from another PID namespace, where the owner's pid does not exist, the run
    is ``running``, and a resume there is refused with RunOwnedElsewhere (its step would run
    twice at once)."""
    listed = _in_other_pid_namespace(*CLI, "--url", sqlite_url, "--json", "runs", "list")
    assert listed.returncode == 0, listed.stderr[-800:]
    assert json.loads(listed.stdout)[0]["status"] == "running"
    script = tmp_path / "resumer.py"
    script.write_text(RESUMER)
    resumed = _in_other_pid_namespace(sys.executable, str(script), sqlite_url, running)
    assert resumed.returncode == 0, resumed.stderr[-800:]
    assert resumed.stdout.strip() == "REFUSED"


def test_an_owner_of_this_host_name_in_another_namespace_is_judged_by_the_lease() -> None:
    """ADR 0011: the owner id names the PID namespace beside the host name; an owner of the
    same host name and another namespace (or of a release that did not name it) is alive while
    its last event is younger than the lease, whatever pid it gives."""
    host, pid, started = this_process().rsplit("/", 2)
    assert host.startswith(f"{host.partition('#')[0]}#")  # this machine has /proc
    for elsewhere in (
        f"{host.partition('#')[0]}#1/{pid}/{started}",
        f"{host.partition('#')[0]}/1/1",
    ):
        assert owner_alive(elsewhere, last_seen=1_000, now=1_000 + LEASE_MS - 1)
        assert not owner_alive(elsewhere, last_seen=1_000, now=1_000 + LEASE_MS)
        assert owner_stopped(elsewhere, last_seen=1_000, now=1_000 + LEASE_MS)
    assert owner_alive(this_process(), last_seen=0, now=10 * LEASE_MS)
