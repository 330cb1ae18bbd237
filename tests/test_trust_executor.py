"""Trust in the executor's record: results at once, drain on close, honest accounting (SPEC 6).

R3 shutdown is not cancel, R4 no lost results, R5 child runs found again, R6 honest accounting,
R8 one executor per run inside one process.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
from crash import kill_when_in_flight

import journaled
from journaled import Plan, Step
from journaled.events.runs import RunResumed
from journaled.testing import ManualClock, wait_for

ROOT = Path(__file__).resolve().parent.parent
WAIT = 20.0
"""Upper bound of every wait: a test that needs it has failed."""


@contextlib.contextmanager
def _reader(rt: journaled.Runtime, url: str) -> Iterator[journaled.Runtime]:
    """Yield a second runtime on the same journal (the same one for ``memory://``)."""
    if url == "memory://":
        yield rt
        return
    with journaled.open(url) as other:
        yield other


def _in_thread(fn: Any, *args: Any, **kwargs: Any) -> tuple[threading.Thread, list[Any]]:
    """Run ``fn`` in a thread; the list receives its result or the exception it raised."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(fn(*args, **kwargs))
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, out


# -- R4: a result is journaled as soon as its step finishes ---------------------------------------


def test_a_result_is_journaled_while_its_sibling_still_runs(
    journal_url: str, clock: ManualClock
) -> None:
    """R4: in a batch of two, the fast step's success is in the journal while the slow one runs."""
    release = threading.Event()
    with journaled.open(journal_url, clock=clock) as rt:
        rt.register_tool("slow", lambda _: release.wait(WAIT) and "slow")
        rt.register_tool("fast", lambda _: "fast")
        plan = Plan(goal="g", steps=[Step("slow", tool="slow"), Step("fast", tool="fast")])
        thread, out = _in_thread(rt.execute, plan, max_parallel_steps=2)
        try:
            wait_for(lambda: bool(rt.runs.active()), WAIT)
            (run_id,) = rt.runs.active()
            with _reader(rt, journal_url) as reader:
                status = reader.runs.state
                wait_for(lambda: status(run_id).status["fast"] == "succeeded", 5.0)
                assert status(run_id).status["slow"] == "running"
        finally:
            release.set()
            thread.join(WAIT)
        assert out[0].ok


CRASH_SCRIPT = r"""
import json, os, sys, threading
import journaled

cfg = json.loads(sys.argv[1])


def note(step_id):
    with open(cfg["record"], "a", encoding="utf-8") as f:
        f.write(step_id + "\n")
        f.flush()
        os.fsync(f.fileno())


def fast(_):
    note("fast")
    return "fast"


def slow(_):
    note("slow")
    if cfg["mode"] == "execute":
        # Wait (less than a heartbeat, which would append it too) for the sibling's success to
        # be in the journal, read by another runtime; then be in flight and killed.
        with journaled.open(cfg["url"], follow=None) as reader:
            for _ in range(500):
                runs = reader.runs.list()
                if runs and reader.runs.state(runs[0]).status["fast"] == "succeeded":
                    break
                threading.Event().wait(0.01)
        open(os.path.join(cfg["markers"], "slow.inflight"), "w").close()
        threading.Event().wait()
    return "slow"


with journaled.open(cfg["url"]) as rt:
    rt.register_tool("fast", fast)
    rt.register_tool("slow", slow)
    if cfg["mode"] == "execute":
        steps = [journaled.Step("slow", tool="slow"), journaled.Step("fast", tool="fast")]
        plan = journaled.Plan(goal="g", steps=steps)
        result = rt.execute(plan, max_parallel_steps=2)
    else:
        result = rt.resume(cfg["run_id"])
    print(json.dumps({"ok": result.ok}))
"""


def test_sigkill_while_a_sibling_runs_reruns_only_that_sibling(tmp_path: Path) -> None:
    """R4/E14: SIGKILL while the slow step of a batch runs; resume re-runs only the slow step."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    record = tmp_path / "record.txt"
    cfg: dict[str, Any] = {
        "url": url,
        "record": str(record),
        "markers": str(tmp_path),
        "mode": "execute",
    }
    kill_when_in_flight(CRASH_SCRIPT, json.dumps(cfg), [tmp_path / "slow.inflight"], tmp_path)
    with journaled.open(url) as rt:
        (run_id,) = rt.runs.list()
        assert rt.runs.state(run_id).in_flight() == ["slow"]
    cfg.update(mode="resume", run_id=run_id)
    done = subprocess.run(
        [sys.executable, "-c", CRASH_SCRIPT, json.dumps(cfg)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"ok": True}
    assert sorted(record.read_text().split()) == ["fast", "slow", "slow"]


# -- R8: one executor per run, also inside one process ---------------------------------------------


def test_two_resumes_in_one_process_exactly_one_executes(journal_url: str) -> None:
    """R8: two threads resume one run at once: one executes, the other gets RunOwnedElsewhere."""
    for _ in range(3):
        _race_two_resumes(journal_url)


def _race_two_resumes(journal_url: str) -> None:
    with journaled.open(journal_url) as rt:
        entered = threading.Event()
        release = threading.Event()

        def hold(_: object) -> str:
            entered.set()
            release.wait(WAIT)
            return "held"

        rt.register_tool("free", lambda _: "free")
        rt.register_skill("hold", hold)
        plan = Plan(goal="g", steps=[Step("a", tool="free"), Step("b", skill="hold")])
        first = rt.execute(plan, call_budget=0)  # b costs 1: paused before it runs
        assert first.stopped_for_budget
        run_id = first.run_id
        barrier = threading.Barrier(2)

        def resume() -> journaled.ExecuteResult | journaled.Outcome:
            barrier.wait(WAIT)
            return rt.resume(run_id, call_budget=1)

        threads = [_in_thread(resume) for _ in range(2)]
        try:
            assert entered.wait(WAIT)
            wait_for(lambda: any(out for _, out in threads), WAIT)
            # The loser is done; the winner still runs and is still reachable.
            assert rt.runs.active() == [run_id]
            assert rt.cancel(run_id)
        finally:
            release.set()
            for thread, _ in threads:
                thread.join(WAIT)
        outcomes = [out[0] for _, out in threads]
        lost = [o for o in outcomes if isinstance(o, journaled.RunOwnedElsewhere)]
        won = [o for o in outcomes if isinstance(o, journaled.ExecuteResult)]
        assert (len(lost), len(won)) == (1, 1), outcomes
        assert rt.runs.active() == []
        history = rt.runs.history(run_id)
        assert [e.kind for e in history].count("run.resumed") == 1
        assert rt.runs.state(run_id).run_status == "cancelled"


# -- R3: shutdown is not cancel -------------------------------------------------------------------


@contextlib.contextmanager
def _reopened(url: str) -> Iterator[journaled.Runtime | None]:
    """Yield a new runtime on the journal of a closed one (None for ``memory://``, gone)."""
    if url == "memory://":
        yield None
        return
    with journaled.open(url) as again:
        yield again


def test_close_drains_the_step_in_flight_then_suspends(journal_url: str) -> None:
    """R3: close() takes no new work, lets the step in flight finish, then suspends the run."""
    entered = threading.Event()
    release = threading.Event()
    ran: list[str] = []

    def hold(x: str) -> str:
        ran.append(x)
        if x == "a":
            entered.set()
            release.wait(WAIT)
        return x

    rt = journaled.open(journal_url)
    rt.register_tool("hold", hold)
    plan = Plan(
        goal="g",
        steps=[
            Step("a", tool="hold", input="a"),
            Step("b", tool="hold", input="b", depends_on=["a"]),
        ],
    )
    thread, out = _in_thread(rt.execute, plan)
    assert entered.wait(WAIT)
    (run_id,) = rt.runs.active()
    closer, closed = _in_thread(rt.close, drain=WAIT)
    wait_for(lambda: rt.runs.closing, WAIT)
    with pytest.raises(journaled.RuntimeClosed):
        rt.execute(Plan(goal="late", steps=[Step("x", tool="hold", input="x")]))
    release.set()
    closer.join(WAIT)
    thread.join(WAIT)
    assert closed == [None]
    result = out[0]
    assert result.suspended
    assert not result.ok
    assert [(s.id, s.status) for s in result.plan.steps] == [("a", "succeeded"), ("b", "pending")]
    assert ran == ["a"]
    with _reopened(journal_url) as again:
        if again is None:
            return
        kinds = [e.kind for e in again.runs.history(run_id)]
        assert "run.suspended" in kinds
        assert "run.cancel-requested" not in kinds
        assert "run.finished" not in kinds
        why = again.runs.why(run_id)
        assert f"run {run_id} — suspended:" in why
        assert "now: suspended when its runtime closed" in why
        again.register_tool("hold", hold)
        resumed = again.resume(run_id)
        assert isinstance(resumed, journaled.ExecuteResult)
        assert resumed.ok
        assert ran == ["a", "b"]


def test_close_suspends_a_step_that_outlives_the_drain(journal_url: str) -> None:
    """R3/E14: a step still running when the drain ends is left in flight and runs again."""
    entered = threading.Event()
    release = threading.Event()

    def stuck(_: object) -> str:
        entered.set()
        release.wait(WAIT)
        return "late"

    rt = journaled.open(journal_url, drain=0.2)
    rt.register_tool("stuck", stuck)
    thread, out = _in_thread(rt.execute, Plan(goal="g", steps=[Step("a", tool="stuck")]))
    try:
        assert entered.wait(WAIT)
        (run_id,) = rt.runs.active()
        rt.close()  # the runtime's drain: 0.2 s
        thread.join(WAIT)
        assert out[0].suspended
        assert [s.status for s in out[0].plan.steps] == ["running"]
        with _reopened(journal_url) as again:
            if again is None:
                return
            state = again.runs.state(run_id)
            assert state.suspended is not None
            assert state.suspended.in_flight == ("a",)
            assert state.suspended.drain == 0.2
            again.register_tool("stuck", lambda _: "quick")
            resumed = again.resume(run_id)  # no take_over needed: the owner let it go
            assert isinstance(resumed, journaled.ExecuteResult)
            assert resumed.ok
            history = again.runs.history(run_id)
            rerun = [e.data.rerun for e in history if isinstance(e.data, RunResumed)]
            assert rerun == [("a",)]
    finally:
        release.set()
        wait_for(lambda: not pykka.ActorRegistry.get_all(), WAIT)


EXIT_SCRIPT = r"""
import json, os, sys, threading
import journaled

cfg = json.loads(sys.argv[1])
entered = threading.Event()


def stuck(_):
    if cfg["mode"] == "resume":
        return "quick"
    entered.set()
    threading.Event().wait()


rt = journaled.open(cfg["url"], drain=0.5)
rt.register_tool("stuck", stuck)
rt.register_tool("free", lambda _: "free")
steps = [journaled.Step("a", tool="free"), journaled.Step("b", tool="stuck", depends_on=["a"])]
plan = journaled.Plan(goal="g", steps=steps)
if cfg["mode"] == "resume":
    (run_id,) = rt.runs.list()
    print(json.dumps({"ok": rt.resume(run_id).ok}))
    rt.close()
else:
    worker = threading.Thread(target=rt.execute, args=(plan,))  # not a daemon
    worker.start()
    entered.wait()
    raise RuntimeError("the program fails with a run in flight and never calls close()")
"""


def test_a_program_that_never_closes_exits_and_its_run_resumes(tmp_path: Path) -> None:
    """R3: an uncaught exception with a run in flight: the process exits, the run resumes."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"

    def child(mode: str) -> subprocess.CompletedProcess[str]:
        cfg = json.dumps({"url": url, "mode": mode})
        return subprocess.run(
            [sys.executable, "-c", EXIT_SCRIPT, cfg],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,  # the bound: a hang at exit fails here
            check=False,
        )

    crashed = child("execute")
    assert crashed.returncode == 1
    assert "never calls close()" in crashed.stderr
    with journaled.open(url) as rt:
        (run_id,) = rt.runs.list()
        state = rt.runs.state(run_id)
        assert state.suspended is not None
        assert state.suspended.cause == "exit"
        assert state.suspended.in_flight == ("b",)
        assert state.status == {"a": "succeeded", "b": "running"}
    resumed = child("resume")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == {"ok": True}
