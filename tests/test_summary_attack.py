"""Attacks on the run listing's judgement of owners (SPEC T2, E14; ADR 0088) and on the
suspension an orchestration journals when its runtime closes (R3, R5; ADR 0087): what
``rt.runs.list``, ``runs.why``, ``journaled runs list`` and ``runs follow`` say must be true, and
the same wherever it is asked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_summary_spec import ROOT, _child_in_flight

import journaled
from journaled import Plan, Step
from journaled.actors.ownership import LEASE_MS, owner_alive, owner_stopped, this_process
from journaled.cli import main
from journaled.testing import ManualClock, wait_for

WAIT = 30.0


def _cli_statuses(url: str) -> dict[str, str]:
    done = CliRunner().invoke(main, ["--url", url, "runs", "list", "--json"])
    assert done.exit_code == 0, done.output
    return {row["run_id"]: row["status"] for row in json.loads(done.output)}


def test_the_command_line_in_the_owners_own_process_sees_its_live_run_running(
    tmp_path: Path,
) -> None:
    """T2, ADR 0088: the command line invoked inside the process that executes a run (a
    service embedding it, a test's CliRunner) judges this very process by the same rule as a
    runtime: a run one of its runtimes executes is running, however old its last event. It
    called it interrupted (its judge assumed nothing of this process executes anything)."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    inside, release = threading.Event(), threading.Event()

    def block(_: object) -> int:
        inside.set()
        release.wait(WAIT)
        return 1

    # The runtime's clock stamps the run's events far in the past (epoch + 1000 s), so the
    # wall clock of the command line is well past the lease after its last event.
    with journaled.open(url, clock=ManualClock(start=1_000_000)) as rt:
        rt.register_tool("block", block)
        handle = rt.runs.start(Plan(goal="live", steps=[Step("a", tool="block", input=1)]))
        try:
            assert inside.wait(WAIT)
            assert rt.runs.summary(handle.run_id).status == "running"
            assert _cli_statuses(url) == {handle.run_id: "running"}
            follow = CliRunner().invoke(
                main,
                ["--url", url, "runs", "follow", handle.run_id, "--json", "--max-seconds", "0.3"],
            )
            assert json.loads(follow.output.splitlines()[-1])["status"] == "running"
        finally:
            release.set()
        handle.result(WAIT)
        assert _cli_statuses(url) == {handle.run_id: "completed"}


def _state_of(pid: int) -> str:
    """The process state letter in /proc (R running, S sleeping, Z zombie...)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2 :].split()[0]


def test_a_killed_owner_not_reaped_yet_is_interrupted_and_taken_over(
    tmp_path: Path, sqlite_url: str
) -> None:
    """T2, E14, ADR 0011, ADR 0088: an owner SIGKILLed but not yet reaped by its parent (a
    zombie: a supervisor busy elsewhere, a container whose PID 1 reaps nothing) keeps its pid
    and start time in /proc, but executes nothing. The listing called it running for as long
    as it stayed unreaped (`runs follow` never settled) and a resume was refused with
    RunOwnedElsewhere."""
    with _child_in_flight(tmp_path, sqlite_url) as proc:
        assert (tmp_path / "b.inflight").exists(), "the child stopped before its step was in flight"
        os.kill(proc.pid, signal.SIGKILL)  # not proc.kill(): nothing may reap it yet
        wait_for(lambda: _state_of(proc.pid) == "Z", WAIT)
        with journaled.open(sqlite_url) as rt:
            [run_id] = rt.runs.ids()
            assert rt.runs.summary(run_id).status == "interrupted"
            assert rt.runs.why(run_id).splitlines()[0] == f"run {run_id} — interrupted:"
            rt.register_tool("ok", lambda x: x)
            rt.register_tool("block", lambda x: x)
            result = rt.resume(run_id)
            assert isinstance(result, journaled.ExecuteResult)
            assert result.ok
        assert _state_of(proc.pid) == "Z", "the owner was reaped during the test"


def test_runs_show_of_a_suspended_run_says_suspended(sqlite_url: str) -> None:
    """T2, R3: `runs show` of a run (or an orchestration's pass) suspended by a close said
    `state: running (or stopped mid-step)`, where runs list and runs why say suspended."""
    inside, release = threading.Event(), threading.Event()

    def slow(_: object) -> str:
        inside.set()
        release.wait(WAIT)
        return "done"

    rt = journaled.open(sqlite_url)
    rt.register_tool("slow", slow)
    handle = rt.runs.start(Plan(goal="closed", steps=[Step("s", tool="slow", input=1)]))
    try:
        assert inside.wait(WAIT)
        rt.close(drain=0.1)
    finally:
        release.set()
    with journaled.open(sqlite_url) as reader:
        assert reader.runs.summary(handle.run_id).status == "suspended"
    shown = CliRunner().invoke(main, ["--url", sqlite_url, "runs", "show", handle.run_id])
    assert shown.exit_code == 0, shown.output
    [state] = [line for line in shown.output.splitlines() if line.startswith("state:")]
    assert state.startswith("state: suspended"), state


# A process whose main thread ended while another thread still runs: /proc shows its leader in
# state Z, yet the process lives (an embedding program may end its main thread so).
LEADER_GONE = r"""
import ctypes, os, threading, time
threading.Thread(target=lambda: time.sleep(60)).start()
print(os.getpid(), flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


def test_a_live_process_whose_main_thread_ended_is_not_judged_gone() -> None:
    """ADR 0011, ADR 0088: the zombie rule above counts a process gone only when no thread of
    it is left; a live process whose leader thread ended (state Z, threads 2) still owns its
    runs, so they are neither interrupted nor taken over without take_over."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LEADER_GONE], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        wait_for(lambda: _state_of(pid) == "Z", WAIT)
        stat = Path(f"/proc/{pid}/stat").read_text()
        started = stat[stat.rfind(")") + 2 :].split()[19]
        here = this_process().rsplit("/", 2)[0]  # the host name and its PID namespace
        owner = f"{here}/{pid}/{started}"
        assert not owner_stopped(owner, 0, 10 * LEASE_MS)
        assert owner_alive(owner, 0, 10 * LEASE_MS)
    finally:
        proc.kill()
        proc.wait(WAIT)
        if proc.stdout is not None:
            proc.stdout.close()


def test_an_owner_hidden_from_this_reader_by_proc_is_not_judged_gone(
    tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0011, ADR 0088: with /proc mounted hidepid=2 (or systemd's ProtectProc=invisible),
    another user's live process has no /proc entry for this reader. It was judged gone: a run
    executing there listed interrupted (and a resume took it over without take_over). The
    kernel still knows it (kill 0): running while it lives, interrupted once it is gone."""
    with _child_in_flight(tmp_path, sqlite_url) as proc:
        assert proc.poll() is None, "the child stopped before its step was in flight"
        hidden = f"/proc/{proc.pid}/stat"
        read_text = Path.read_text

        def as_if_hidepid(self: Path, *args: Any, **kwargs: Any) -> str:
            if str(self) == hidden:
                raise FileNotFoundError(2, "No such file or directory", hidden)
            return read_text(self, *args, **kwargs)

        monkeypatch.setattr(Path, "read_text", as_if_hidepid)
        with journaled.open(sqlite_url) as rt:
            [run_id] = rt.runs.ids()
            assert rt.runs.summary(run_id).status == "running"
            with pytest.raises(journaled.RunOwnedElsewhere):
                rt.resume(run_id)
            proc.kill()
            proc.wait(WAIT)
            assert rt.runs.summary(run_id).status == "interrupted"


# A child that executes a -> b, where b (marker written) waits for a release file, then the run
# completes and the process exits.
ENDS_WHEN_RELEASED = r"""
import json, pathlib, sys, time
import journaled
from journaled import Plan, Step

cfg = json.loads(sys.argv[1])


def held(_):
    pathlib.Path(cfg["marker"]).write_text("in flight")
    while not pathlib.Path(cfg["release"]).exists():
        time.sleep(0.01)
    return 2


with journaled.open(cfg["url"]) as rt:
    rt.register_tool("ok", lambda x: x)
    rt.register_tool("held", held)
    rt.execute(Plan(goal="ends", steps=[
        Step("a", tool="ok", input=1),
        Step("b", tool="held", input=2, depends_on=["a"]),
    ]))
"""


def test_a_run_that_ends_as_its_owner_exits_between_fold_and_judgement_is_not_interrupted(
    tmp_path: Path, sqlite_url: str
) -> None:
    """T2, ADR 0088: a reader folds the run (still running), then its owner appends the run's
    end and exits, then the reader judges the owner: gone. It answered `interrupted` for a run
    the journal says completed (and `runs follow` would exit 8 for a run that completed). What
    an owner appended before it stopped is in the journal by the time it is judged gone: the
    read folds it and judges again."""
    release = tmp_path / "b.release"
    with _child_in_flight(tmp_path, sqlite_url, ENDS_WHEN_RELEASED, release=str(release)) as proc:
        assert proc.poll() is None, "the child stopped before its step was in flight"
        with journaled.open(sqlite_url) as rt:
            [run_id] = rt.runs.ids()
            judge = rt.runs.summaries.owner_gone
            assert judge is not None
            raced: list[str] = []

            def owner_ends_then_exits(run: str, owner: str, last_at: int) -> bool:
                if not raced:  # the first judgement, right after the fold saw it running
                    raced.append(run)
                    release.write_text("go")
                    assert proc.wait(WAIT) == 0
                return judge(run, owner, last_at)

            rt.runs.summaries.owner_gone = owner_ends_then_exits
            assert rt.runs.summary(run_id).status == "completed"
            assert raced == [run_id]
