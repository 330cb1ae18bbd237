"""Run summaries tell the truth (SPEC T2, R3, R5; ADR 0088, ADR 0087): interrupted runs,
settled plans, suspended orchestrations, in ``rt.runs.list``, ``runs.why`` and the command line,
on real SQLite files and real child processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from crash import kill_when_in_flight

import journaled
from journaled import Plan, Step
from journaled.actors.ownership import LEASE_MS, owner_stopped, this_process
from journaled.events.orchestration import OrchestrationSuspended
from journaled.events.orchestration_state import OrchestrationState, fold_orchestration
from journaled.events.runs import RunHeartbeat
from journaled.testing import ManualClock, wait_for

ROOT = Path(__file__).resolve().parent.parent
WAIT = 30.0
CLI = [sys.executable, "-m", "journaled.cli"]
FOLLOW_INTERRUPTED = 8
"""``runs follow``'s exit status for an interrupted run (``cli_runs.FOLLOW_EXIT``)."""

# A child that executes a -> b -> c, where b blocks (marker written) until it is killed. With
# "elsewhere" it claims to run on another host, and heartbeats every 0.1 s.
CHILD = r"""
import json, pathlib, sys, threading
import journaled
from journaled import Plan, Step

cfg = json.loads(sys.argv[1])
if cfg.get("elsewhere"):
    import journaled.actors.ownership as ownership
    from journaled.actors.executor import Executor

    ownership._host = lambda: "another-host.example"
    Executor.heartbeat_seconds = 0.1


def block(_):
    pathlib.Path(cfg["marker"]).write_text("in flight")
    threading.Event().wait()


with journaled.open(cfg["url"]) as rt:
    rt.register_tool("ok", lambda x: x)
    rt.register_tool("block", block)
    plan = Plan(goal="killed mid-step", steps=[
        Step("a", tool="ok", input=1),
        Step("b", tool="block", input=2, depends_on=["a"]),
        Step("c", tool="ok", input=3, depends_on=["b"]),
    ])
    rt.execute(plan)
    print("finished")  # never reached: the test kills this process first
"""


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "--url", url, *args], capture_output=True, text=True, timeout=WAIT, check=False
    )


def _listed(url: str) -> dict[str, dict[str, Any]]:
    done = _cli(url, "runs", "list", "--json")
    assert done.returncode == 0, done.stderr
    return {row["run_id"]: row for row in json.loads(done.stdout)}


def _only_run(url: str) -> str:
    with journaled.open(url) as rt:
        [run_id] = rt.runs.ids()
    return run_id


def _kill_mid_step(tmp_path: Path, url: str, **extra: object) -> str:
    marker = tmp_path / "b.inflight"
    cfg = json.dumps({"url": url, "marker": str(marker), **extra})
    kill_when_in_flight(CHILD, cfg, [marker], tmp_path)
    return _only_run(url)


@contextmanager
def _child_in_flight(
    tmp_path: Path, url: str, script: str = CHILD, **extra: object
) -> Iterator[subprocess.Popen[bytes]]:
    """A child process executing the blocking plan (or ``script``, given the same config), once
    its step b is in flight (or it exited first); killed at the end."""
    marker = tmp_path / "b.inflight"
    cfg = json.dumps({"url": url, "marker": str(marker), **extra})
    proc = subprocess.Popen(
        [sys.executable, "-c", script, cfg],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: marker.exists() or proc.poll() is not None, WAIT)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(WAIT)


@pytest.fixture
def child(tmp_path: Path, sqlite_url: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A child process executing the blocking plan, its step b in flight; killed at the end."""
    with _child_in_flight(tmp_path, sqlite_url) as proc:
        assert proc.poll() is None, "the child exited before its step was in flight"
        yield proc, _only_run(sqlite_url)


# -- 1. a run whose process died is interrupted, not running ----------------------------------


def test_a_run_whose_process_was_killed_lists_as_interrupted_everywhere(
    tmp_path: Path, sqlite_url: str
) -> None:
    """T2, E14, ADR 0088: SIGKILLed mid-step, a run is `interrupted` in runs.list (and its
    status filter), runs.summary, runs.why's head, `runs list` and `runs follow` (exit 8); a
    resume carries it on to completed."""
    run_id = _kill_mid_step(tmp_path, sqlite_url)
    with journaled.open(sqlite_url) as rt:
        assert rt.runs.summary(run_id).status == "interrupted"
        assert [s.status for s in rt.runs.list()] == ["interrupted"]
        assert rt.runs.list(status="interrupted") == [run_id]
        assert rt.runs.list(status="running") == []
        why = rt.runs.why(run_id).splitlines()
        assert why[0] == f"run {run_id} — interrupted:"
        assert why[-1].startswith("now: interrupted: its owner (")
        assert "step(s) b were in flight and run again" in why[-1]
    assert _listed(sqlite_url)[run_id]["status"] == "interrupted"
    follow = _cli(sqlite_url, "runs", "follow", run_id, "--json")
    assert follow.returncode == FOLLOW_INTERRUPTED, follow.stderr
    assert json.loads(follow.stdout.splitlines()[-1])["status"] == "interrupted"
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("ok", lambda x: x)
        rt.register_tool("block", lambda x: x)
        result = rt.resume(run_id)
        assert isinstance(result, journaled.ExecuteResult)
        assert result.ok
        assert rt.runs.summary(run_id).status == "completed"
    assert _listed(sqlite_url)[run_id]["status"] == "completed"


def test_a_run_in_a_live_process_stays_running_then_follow_settles_when_it_is_killed(
    sqlite_url: str, child: tuple[subprocess.Popen[bytes], str]
) -> None:
    """T2, ADR 0088: a slow step of a live process on this host is `running` whatever the
    reader's clock says (no false alarm); `runs follow` keeps following, and settles on
    `interrupted` (exit 8) once the process is SIGKILLed, though nothing is appended."""
    proc, run_id = child
    an_hour_on = ManualClock(start=time.time_ns() // 1_000_000 + 3_600_000)
    with journaled.open(sqlite_url, clock=an_hour_on) as rt:
        position = rt.journal.position()
        assert rt.runs.summary(run_id).status == "running"
        assert rt.runs.list(status="interrupted") == []
        assert (
            rt.runs.why(run_id).splitlines()[0] == f"run {run_id} — running (or stopped mid-step):"
        )
    assert _listed(sqlite_url)[run_id]["status"] == "running"
    follow = subprocess.Popen(
        [*CLI, "--url", sqlite_url, "runs", "follow", run_id, "--json", "--interval", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout is not None
        assert json.loads(follow.stdout.readline())["status"] == "running"
        assert follow.poll() is None, "a live run is followed, not settled"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(WAIT) == -signal.SIGKILL
        out, err = follow.communicate(timeout=WAIT)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait(WAIT)
    assert follow.returncode == FOLLOW_INTERRUPTED, err
    assert json.loads(out.splitlines()[-1])["status"] == "interrupted"
    with journaled.open(sqlite_url) as rt:
        assert rt.journal.position() == position  # judged from the clock: nothing appended
        assert rt.runs.summary(run_id).status == "interrupted"


def test_an_owner_on_another_host_is_interrupted_once_silent_past_the_lease(
    tmp_path: Path, sqlite_url: str
) -> None:
    """T2, ADR 0011, ADR 0088: an owner whose process cannot be checked (another host) is
    judged by its last heartbeat and the reader's clock: `running` up to the lease after it,
    `interrupted` from then on (ManualClock)."""
    with _child_in_flight(tmp_path, sqlite_url, elsewhere=True) as proc:
        run_id = _only_run(sqlite_url)
        with journaled.open(sqlite_url) as rt:
            wait_for(lambda: any(e.kind == "run.heartbeat" for e in rt.runs.history(run_id)), WAIT)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(WAIT) == -signal.SIGKILL
    clock = ManualClock()
    with journaled.open(sqlite_url, clock=clock) as rt:
        beat = rt.runs.history(run_id)[-1].data
        assert isinstance(beat, RunHeartbeat)
        assert beat.owner.startswith("another-host.example/")
        last = beat.at
        clock.set(last + LEASE_MS - 1)
        assert rt.runs.summary(run_id).status == "running"
        assert rt.runs.list(status="running") == [run_id]
        clock.set(last + LEASE_MS)
        assert rt.runs.summary(run_id).status == "interrupted"
        assert rt.runs.list(status="interrupted") == [run_id]
        assert rt.runs.why(run_id).splitlines()[0] == f"run {run_id} — interrupted:"


def test_a_run_of_this_process_is_interrupted_only_when_no_runtime_executes_it() -> None:
    """T2, ADR 0011, ADR 0088: an owner that is this very process is stopped only when none of
    its runtimes executes the run and the run was silent for the lease; no owner, never."""
    me = this_process()
    assert not owner_stopped(me, 0, 10 * LEASE_MS, executing_here=True)
    assert not owner_stopped(me, 0, LEASE_MS - 1)
    assert owner_stopped(me, 0, LEASE_MS)
    assert not owner_stopped("", 0, 10 * LEASE_MS)


# -- 2. an orchestration waiting on a settled plan shows that plan's steps ---------------------


def _two_steps(goal: str, observations: object, clarifications: object) -> Plan:
    return Plan(goal=goal, steps=[Step("x", skill="s"), Step("y", skill="s", depends_on=["x"])])


def test_an_orchestration_waiting_on_its_settled_plan_shows_its_steps(sqlite_url: str) -> None:
    """T2, O3, O4, O5: waiting for approval, for budget (notify-and-wait) or a dry run, an
    orchestration's journaled 2-step plan is 0/2 in runs.list and `runs list`, 2/2 once run."""
    with journaled.open(sqlite_url) as rt:
        rt.register_skill("s", lambda x: x)
        approval = rt.orchestrate("approve me", _two_steps, require_approval=True)
        budget = rt.orchestrate("fund me", _two_steps, call_budget=1)
        dry = rt.orchestrate("plan me", _two_steps, mode="plan")
        assert (approval.status, budget.status, dry.status) == (
            "waiting_for_approval",
            "waiting_for_budget",
            "dry_run",
        )
        for outcome in (approval, budget, dry):
            summary = rt.runs.summary(outcome.run_id)
            assert (summary.steps_done, summary.steps_total) == (0, 2), summary
            assert (summary.running, summary.waiting, summary.wave) == ((), (), 0)
        listed = _listed(sqlite_url)
        for outcome in (approval, budget, dry):
            row = listed[outcome.run_id]
            assert (row["steps_done"], row["steps_total"]) == (0, 2)
        done = rt.resume(approval.run_id, approve=True)
        assert isinstance(done, journaled.Outcome)
        assert done.status == "completed"
        summary = rt.runs.summary(approval.run_id)
        assert (summary.steps_done, summary.steps_total) == (2, 2)


def test_a_replanned_pass_waiting_for_approval_shows_its_own_plan(sqlite_url: str) -> None:
    """T2, O2, O4: after a failed pass of 1 step, the replanned 3-step pass waiting for approval
    is 0/3, not the failed pass's 1/1."""

    def planner(goal: str, observations: list[Any], clarifications: object) -> Plan:
        if not observations:
            return Plan(goal=goal, steps=[Step("boom", tool="boom")])
        return Plan(
            goal=goal,
            steps=[Step("p", tool="ok"), Step("q", tool="ok"), Step("r", tool="ok")],
        )

    def boom(_: object) -> object:
        raise RuntimeError("no route")

    with journaled.open(sqlite_url) as rt:
        rt.register_tool("boom", boom)
        rt.register_tool("ok", lambda x: x)
        first = rt.orchestrate("retry me", planner, mode="orchestrate", require_approval=True)
        assert first.status == "waiting_for_approval"
        second = rt.resume(first.run_id, approve=True)
        assert isinstance(second, journaled.Outcome)
        assert second.status == "waiting_for_approval"
        summary = rt.runs.summary(first.run_id)
        assert (summary.pass_no, summary.steps_done, summary.steps_total) == (1, 0, 3)


# -- 3. an orchestration let go by a close is suspended, in its own stream --------------------


def _one_slow_step(goal: str, observations: object, clarifications: object) -> Plan:
    return Plan(goal=goal, steps=[Step("slow", tool="slow", input=1)])


def test_a_close_during_a_pass_journals_the_orchestrations_suspension(sqlite_url: str) -> None:
    """R3, R5, ADR 0087: closed mid-pass, the orchestration's own stream records
    `orchestration.suspended` (its pass's run named), folded at every position as it was live;
    runs.list and runs.why's head both say suspended; a new runtime resumes it to completed."""
    inside, release = threading.Event(), threading.Event()

    def slow(_: object) -> str:
        inside.set()
        release.wait(WAIT)
        return "done"

    traced: list[tuple[int, OrchestrationState]] = []
    rt = journaled.open(sqlite_url)
    rt.register_tool("slow", slow)
    handle = rt._orchestrations.start(
        "survive a close", _one_slow_step, trace=lambda p, s: traced.append((p, s))
    )
    assert inside.wait(WAIT)
    rt.close(drain=0.1)
    release.set()
    with pytest.raises(journaled.RuntimeClosed):
        handle.result(WAIT)
    with journaled.open(sqlite_url) as rt2:
        orch = handle.run_id
        events = rt2.runs.history(orch)
        assert [e.kind for e in events][-1] == "orchestration.suspended"
        suspended = events[-1].data
        assert isinstance(suspended, OrchestrationSuspended)
        pass_run = rt2.runs.summary(orch).current_run
        assert (suspended.phase, suspended.run, suspended.pass_no, suspended.cause) == (
            "running",
            pass_run,
            1,
            "close",
        )
        for position, live in traced:
            assert fold_orchestration([e for e in events if e.position <= position]) == live
        assert traced[-1][1].suspended == suspended
        assert rt2.runs.summary(orch).status == "suspended"
        assert rt2.runs.list(status="suspended") == [orch, pass_run]
        why = rt2.runs.why(orch).splitlines()
        assert why[0] == f"orchestration {orch} — suspended:"
        assert any("suspended when its runtime closed (pass 1 was running" in w for w in why)
        rt2.register_tool("slow", lambda _: "done")
        position = rt2.journal.position()
        with pytest.raises(journaled.RunNotResumable, match="it is suspended by a close"):
            rt2.resume(orch, planner=_one_slow_step, approve=True)
        assert rt2.journal.position() == position
        outcome = rt2.resume(orch, planner=_one_slow_step)
        assert isinstance(outcome, journaled.Outcome)
        assert outcome.status == "completed"
        assert rt2.runs.summary(orch).status == "completed"
        assert rt2.runs.why(orch).splitlines()[0] == f"orchestration {orch} — completed:"


CLOSE_WHILE_PLANNING = r"""
import sys, threading
import journaled
from journaled import Plan, Step

thinking, release = threading.Event(), threading.Event()


def planner(goal, observations, clarifications):
    thinking.set()
    release.wait(60)
    return Plan(goal=goal, steps=[Step("a", tool="ok")])


rt = journaled.open(sys.argv[1])
handle = rt.orchestrate_start("let go while planning", planner)
assert thinking.wait(30)
rt.close(drain=0)
try:
    handle.result(30)
except journaled.RuntimeClosed:
    pass
print(handle.run_id, flush=True)
threading.Event().wait()  # stays alive: its runtime let the orchestration go
"""


def test_an_orchestration_let_go_while_planning_is_suspended_and_resumable_elsewhere(
    sqlite_url: str,
) -> None:
    """R3, R5, ADR 0022, ADR 0087: a close while the planner thinks journals the suspension
    (phase planning), so runs.list and why say suspended, not running, and another process
    resumes it at once though the closing process still lives (no RunOwnedElsewhere)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CLOSE_WHILE_PLANNING, sqlite_url],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        orch = proc.stdout.readline().strip()
        assert orch, proc.stderr.read() if proc.stderr is not None else ""
        assert proc.poll() is None
        with journaled.open(sqlite_url) as rt:
            kinds = [e.kind for e in rt.runs.history(orch)]
            assert kinds == ["orchestration.started", "orchestration.suspended"]
            assert rt.runs.summary(orch).status == "suspended"
            assert rt.runs.why(orch).splitlines()[0] == f"orchestration {orch} — suspended:"
            rt.register_tool("ok", lambda x: x)
            outcome = rt.resume(
                orch, planner=lambda g, o, c: Plan(goal=g, steps=[Step("a", tool="ok")])
            )
            assert isinstance(outcome, journaled.Outcome)
            assert outcome.status == "completed"
            assert rt.runs.summary(orch).status == "completed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(WAIT)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


# -- 3. a fork waiting on answers lists the steps it waits on ----------------------------------


def _asker(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
    if ctx.answer is None:
        raise journaled.NeedsInput("which branch?")
    return journaled.AgentResult(output=f"on {ctx.answer}", calls_used=1)


def _waiting_on_w(rt: journaled.Runtime) -> Plan:
    """Register a skill and an asking agent; return a plan whose step ``w`` waits (E10)."""
    rt.register_agent("asker", _asker)
    rt.register_skill("s", lambda x: "idea")
    return Plan(goal="g", steps=[Step("k", skill="s"), Step("w", agent="asker", depends_on=["k"])])


def test_a_fork_of_a_waiting_run_lists_the_steps_it_waits_on(sqlite_url: str) -> None:
    """T2, F1, E10: a fork taken where its source waited, without answers, waits on the same
    steps: its summary lists them as ``runs.state`` does, live and after a reopen (the stored
    projection included)."""

    with journaled.open(sqlite_url) as rt:
        plan = _waiting_on_w(rt)
        source = rt.execute(plan, call_budget=10)
        fork = rt.runs.fork(source.run_id)
        answered = rt.runs.fork(source.run_id, answers={"w": "left"})
        assert rt.runs.state(fork).waiting == ["w"]
        live = {s.run_id: s for s in rt.runs.list()}
        assert rt.runs.summaries.save()  # the reopen reads the stored projection
    with journaled.open(sqlite_url) as rt:
        reopened = {s.run_id: s for s in rt.runs.list()}
    for summaries in (live, reopened):
        assert (summaries[fork].status, summaries[fork].waiting) == ("forked", ("w",))
        assert summaries[answered].waiting == ()
        assert summaries[source.run_id].waiting == ("w",)


def test_a_fork_of_an_earlier_release_lists_the_steps_its_questions_tell(sqlite_url: str) -> None:
    """T2, E10, ADR 0032: a ``run.forked`` of an earlier release holds no ``waiting``; its
    summary lists the steps its questions and answers tell, as ``runs.state`` does."""
    import msgspec

    from journaled.events.run_state import fold_run
    from journaled.events.run_summaries import _summaries, fold

    with journaled.open(sqlite_url) as rt:
        plan = _waiting_on_w(rt)
        fork = rt.runs.fork(rt.execute(plan, call_budget=10).run_id)
        stream = rt.runs.history(fork)
    first = stream[0]
    old = msgspec.structs.replace(first, data=msgspec.structs.replace(first.data, waiting=None))
    assert fold_run([old, *stream[1:]]).waiting == ["w"]
    runs: dict[str, Any] = {}
    for event in (old, *stream[1:]):
        fold(runs, event)
    assert _summaries(runs)[fork].waiting == ("w",)
