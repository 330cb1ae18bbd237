"""Trust in the executor's record: results at once, drain on close, honest accounting (SPEC 6).

R3 shutdown is not cancel, R4 no lost results, R5 child runs found again, R6 honest accounting,
R8 one executor per run inside one process.
"""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
from crash import kill_when_in_flight
from threads import in_thread

import journaled
from journaled import Plan, Step
from journaled.actors.directory import Inbox
from journaled.actors.run_args import find_policy, policy_name
from journaled.events.plans import ExecuteResult
from journaled.events.run_messages import RunEnded
from journaled.events.runs import CallsOverrun, RunResumed, RunStarted
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
        thread, out = in_thread(rt.execute, plan, max_parallel_steps=2)
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
                runs = reader.runs.ids()
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
        (run_id,) = rt.runs.ids()
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

        threads = [in_thread(resume) for _ in range(2)]
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
        # The cancel came while b, the last step, ran and ignored it: nothing was stopped, every
        # step succeeded, so the run completed (E5: done work is not reported otherwise).
        assert "run.cancel-requested" in [e.kind for e in history]
        assert rt.runs.state(run_id).run_status == "completed"


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
    thread, out = in_thread(rt.execute, plan)
    assert entered.wait(WAIT)
    (run_id,) = rt.runs.active()
    closer, closed = in_thread(rt.close, drain=WAIT)
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
    thread, out = in_thread(rt.execute, Plan(goal="g", steps=[Step("a", tool="stuck")]))
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
    (run_id,) = rt.runs.ids()
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
        (run_id,) = rt.runs.ids()
        state = rt.runs.state(run_id)
        assert state.suspended is not None
        assert state.suspended.cause == "exit"
        assert state.suspended.in_flight == ("b",)
        assert state.status == {"a": "succeeded", "b": "running"}
    resumed = child("resume")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == {"ok": True}


# -- R5: child runs are found again, never duplicated ---------------------------------------------


def test_an_agent_step_that_runs_again_finds_its_child_run(journal_url: str) -> None:
    """R5/E9: after an answer, the agent's ctx.execute gets its first child back, not a new one."""
    child_steps: list[str] = []

    def work(x: str) -> str:
        child_steps.append(x)
        return x

    def agent(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        child = ctx.execute(Plan(goal="child", steps=[Step("c1", tool="work", input="c1")]))
        if ctx.answer is None:
            raise journaled.NeedsInput("go on?")
        return journaled.AgentResult(output={"child": child.run_id, "ok": child.ok})

    with journaled.open(journal_url) as rt:
        rt.register_tool("work", work)
        rt.register_agent("boss", agent)
        first = rt.execute(Plan(goal="g", steps=[Step("s", agent="boss")]))
        assert first.waiting == ["s"]
        [child_id] = [r for r in rt.runs.ids() if r != first.run_id]
        done = rt.resume(first.run_id, answers={"s": "yes"})
        assert isinstance(done, journaled.ExecuteResult)
        assert done.ok
        assert rt.runs.ids() == [first.run_id, child_id]
        assert child_steps == ["c1"]
        assert done.observations[-1].output == {"child": child_id, "ok": True}
        assert done.observations[-1].agent_task_id == child_id
        started = rt.runs.history(child_id)[0].data
        assert isinstance(started, RunStarted)
        assert (started.parent_run, started.parent_step, started.parent_call) == (
            first.run_id,
            "s",
            1,
        )


def test_a_child_suspended_by_close_is_resumed_with_its_parent(sqlite_url: str) -> None:
    """R5/R3: close suspends parent and child; resuming the parent resumes that same child."""
    entered = threading.Event()
    release = threading.Event()
    ran: list[str] = []

    def work(x: str) -> str:
        ran.append(x)
        if x == "c2" and not release.is_set():
            entered.set()
            release.wait(WAIT)
        return x

    def agent(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        steps = [Step("c1", tool="work", input="c1"), Step("c2", tool="work", input="c2")]
        child = ctx.execute(Plan(goal="child", steps=steps), max_parallel_steps=1)
        return journaled.AgentResult(output=child.ok)

    rt = journaled.open(sqlite_url, drain=0.2)
    rt.register_tool("work", work)
    rt.register_agent("boss", agent)
    thread, out = in_thread(rt.execute, Plan(goal="g", steps=[Step("s", agent="boss")]))
    try:
        assert entered.wait(WAIT)
        rt.close()
        thread.join(WAIT)
        assert out[0].suspended
    finally:
        release.set()
        wait_for(lambda: not pykka.ActorRegistry.get_all(), WAIT)
    with journaled.open(sqlite_url) as again:
        parent_id = out[0].run_id
        [child_id] = [r for r in again.runs.ids() if r != parent_id]
        assert again.runs.state(child_id).suspended is not None
        suspended = again.runs.state(parent_id).suspended
        assert suspended is not None
        assert suspended.in_flight == ("s",)
        again.register_tool("work", work)
        again.register_agent("boss", agent)
        done = again.resume(parent_id)
        assert isinstance(done, journaled.ExecuteResult)
        assert done.ok
        assert again.runs.ids() == [parent_id, child_id]
        assert again.runs.state(child_id).run_status == "completed"
        assert ran == ["c1", "c2", "c2"]  # c1 succeeded before the close: never again


# -- R6: honest accounting ------------------------------------------------------------------------


def reserve_three(step: Step, remaining: float) -> float:
    """A reserve policy importable by name (R6): three model calls per agent step."""
    return 3


def test_a_skill_missing_on_resume_is_not_charged(sqlite_url: str) -> None:
    """R6/E8: a skill that is not registered on resume fails without being charged."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("t", lambda _: "t")
        rt.register_skill("s", lambda _: "s")
        plan = Plan(goal="g", steps=[Step("a", tool="t"), Step("b", skill="s", depends_on=["a"])])
        run_id = rt.execute(plan, call_budget=0).run_id
    with journaled.open(sqlite_url) as again:
        again.register_tool("t", lambda _: "t")
        result = again.resume(run_id, call_budget=5)
        assert isinstance(result, journaled.ExecuteResult)
        assert "skill 's' is not registered" in (result.observations[-1].error or "")
        assert result.calls_used == 0


def test_an_unbounded_reservation_runs_and_charges_what_it_reports(rt: journaled.Runtime) -> None:
    """R6/E6: with no budget, reserve answering ``remaining`` (infinity) reserves without limit."""
    seen: list[int | None] = []

    def agent(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        seen.append(ctx.reservation)
        return journaled.AgentResult(calls_used=4)

    rt.register_agent("a", agent)
    result = rt.execute(Plan(goal="g", steps=[Step("x", agent="a")]), reserve=lambda s, r: r)
    assert result.ok, result.observations
    assert seen == [None]
    assert result.calls_used == 4


def test_an_overrun_is_journaled_and_explained(rt: journaled.Runtime) -> None:
    """R6/E8: an agent reporting 9 calls against a reservation of 2 is journaled as an overrun."""
    rt.register_agent("a", lambda step, ctx: journaled.AgentResult(calls_used=9))
    plan = Plan(goal="g", steps=[Step("x", agent="a")])
    result = rt.execute(plan, call_budget=10, reserve=lambda s, r: 2)
    assert result.calls_used == 9
    overruns = [e.data for e in rt.runs.history(result.run_id) if isinstance(e.data, CallsOverrun)]
    assert [(o.step_id, o.reserved, o.reported) for o in overruns] == [("x", 2, 9)]
    why = rt.runs.why(result.run_id)
    assert "step 'x' overran its reservation: it reported 9 model call(s) against 2" in why


def test_the_reserve_policy_is_journaled_and_used_on_resume(sqlite_url: str) -> None:
    """R6/E7: a resume without reserve= costs agent steps with the journaled policy."""
    agent_ran: list[str] = []

    def agent(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        agent_ran.append(step.id)
        return journaled.AgentResult()

    plan = Plan(goal="g", steps=[Step("t", tool="t"), Step("x", agent="a", depends_on=["t"])])
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("t", lambda _: "t")
        rt.register_agent("a", agent)
        named = rt.execute(plan, call_budget=2, reserve=reserve_three)
        anonymous = rt.execute(plan, call_budget=2, reserve=lambda s, r: 3)
        assert named.stopped_for_budget
        assert anonymous.stopped_for_budget
    with journaled.open(sqlite_url) as again:
        again.register_agent("a", agent)
        resumed = again.resume(named.run_id, call_budget=2)
        assert isinstance(resumed, journaled.ExecuteResult)
        assert resumed.stopped_for_budget  # x still costs 3: not free at the gate
        assert agent_ran == []
        with pytest.raises(journaled.RunNotResumable, match="pass reserve= to resume"):
            again.resume(anonymous.run_id, call_budget=2)
        resumed = again.resume(named.run_id, call_budget=3)
        assert isinstance(resumed, journaled.ExecuteResult)
        assert resumed.ok
        assert resumed.calls_used == 3


def test_the_runtime_handed_a_lambda_reserve_resumes_with_it(journal_url: str) -> None:
    """R6, E7, E10, E14, O3: a reserve that is a lambda cannot be found by its journaled name,
    but the runtime it was handed keeps it: SPEC's ``resume(run_id, call_budget, answers)``
    (no ``reserve``) costs the agent steps the same after a budget stop, a wait, and for an
    orchestration's partial pass; a fork of such a run too. Another runtime still refuses."""

    def asks(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        if step.id == "w" and ctx.answer is None:
            raise journaled.NeedsInput("which region?")
        return journaled.AgentResult(output=ctx.answer or "done", calls_used=1)

    chain = [Step("a", skill="s"), Step("b", agent="ag", depends_on=["a"])]
    with journaled.open(journal_url) as rt:
        rt.register_skill("s", lambda i: i)
        rt.register_agent("ag", asks)
        stopped = rt.execute(Plan(goal="g", steps=chain), call_budget=2, reserve=lambda s, r: 2)
        assert stopped.stopped_for_budget
        assert stopped.calls_used == 1
        fork = rt.runs.fork(stopped.run_id, call_budget=3)
        short = rt.resume(stopped.run_id, call_budget=2)
        assert isinstance(short, journaled.ExecuteResult)
        assert short.stopped_for_budget  # b still costs 2
        resumed = rt.resume(stopped.run_id, call_budget=3)
        assert isinstance(resumed, journaled.ExecuteResult)
        assert (resumed.ok, resumed.calls_used) == (True, 2)
        forked = rt.resume(fork)
        assert isinstance(forked, journaled.ExecuteResult)
        assert forked.ok
        waiting = rt.execute(
            Plan(goal="g", steps=[Step("w", agent="ag")]), call_budget=10, reserve=lambda s, r: 2
        )
        assert waiting.waiting == ["w"]
        answered = rt.resume(waiting.run_id, answers={"w": "eu-west"})
        assert isinstance(answered, journaled.ExecuteResult)
        assert (answered.ok, answered.observations[-1].output) == (True, "eu-west")
        outcome = rt.orchestrate(
            "g",
            lambda goal, obs, clar: Plan(goal=goal, steps=chain),
            call_budget=2,
            partial=True,
            reserve=lambda s, r: 2,
        )
        assert outcome.status == "waiting_for_budget"
        finished = rt.resume(outcome.run_id, call_budget=3)
        assert isinstance(finished, journaled.Outcome)
        assert finished.status == "completed"
        again = rt.execute(Plan(goal="g", steps=chain), call_budget=2, reserve=lambda s, r: 2)
    if journal_url.startswith("memory://"):
        return  # one process's journal: no other runtime opens it
    with journaled.open(journal_url) as other:
        other.register_skill("s", lambda i: i)
        other.register_agent("ag", asks)
        with pytest.raises(journaled.RunNotResumable, match="pass reserve= to resume"):
            other.resume(again.run_id, call_budget=3)


def test_a_raising_reserve_fails_the_orchestration_without_raising(journal_url: str) -> None:
    """R6/O1: a reserve that raises becomes a failed step and outcome, never an exception."""

    def reserve(step: Step, remaining: float) -> float:
        raise RuntimeError("no reservation today")

    def planner(goal: str, observations: Any, clarifications: Any) -> Plan:
        return Plan(goal=goal, steps=[Step("x", agent="a")])

    with journaled.open(journal_url) as rt:
        rt.register_agent("a", lambda step, ctx: journaled.AgentResult())
        outcome = rt.orchestrate("g", planner, call_budget=5, reserve=reserve)
        assert outcome.status == "failed"
        assert "no reservation today" in outcome.summary
        assert outcome.observations[-1].code == "agent-failed"


def test_close_suspends_an_orchestration_pass_and_it_resumes(sqlite_url: str) -> None:
    """R3/O5: close during a pass raises RuntimeClosed to orchestrate; the orchestration resumes."""
    entered = threading.Event()
    release = threading.Event()
    ran: list[str] = []

    def work(x: str) -> str:
        ran.append(x)
        if not release.is_set():
            entered.set()
            release.wait(WAIT)
        return x

    def planner(goal: str, observations: Any, clarifications: Any) -> Plan:
        return Plan(goal=goal, steps=[Step("a", tool="work", input="a")])

    rt = journaled.open(sqlite_url, drain=0.2)
    rt.register_tool("work", work)
    thread, out = in_thread(rt.orchestrate, "g", planner)
    try:
        assert entered.wait(WAIT)
        rt.close()
        thread.join(WAIT)
        assert isinstance(out[0], journaled.RuntimeClosed)
    finally:
        release.set()
        wait_for(lambda: not pykka.ActorRegistry.get_all(), WAIT)
    with journaled.open(sqlite_url) as again:
        again.register_tool("work", work)
        [orchestration] = [r for r in again.runs.ids() if "orchestration" in again.runs.why(r)]
        outcome = again.resume(orchestration, planner=planner)
        assert isinstance(outcome, journaled.Outcome)
        assert outcome.status == "completed"
        assert ran == ["a", "a"]


def test_a_suspension_and_an_overrun_rebuild_to_the_live_state(sqlite_url: str) -> None:
    """R5/O7: at every appended position, including overrun and suspension, rebuilt == live."""
    entered = threading.Event()
    release = threading.Event()
    trace: list[tuple[int, journaled.ExecuteResult]] = []

    def stuck(_: object) -> str:
        entered.set()
        release.wait(WAIT)
        return "late"

    rt = journaled.open(sqlite_url, drain=0.1)
    rt.register_agent("greedy", lambda step, ctx: journaled.AgentResult(calls_used=5))
    rt.register_tool("stuck", stuck)
    plan = Plan(
        goal="g",
        steps=[Step("x", agent="greedy"), Step("y", tool="stuck", depends_on=["x"])],
    )
    thread, out = in_thread(
        rt.runs.execute,
        plan,
        call_budget=10,
        reserve=lambda s, r: 1,
        trace=lambda position, live: trace.append((position, live)),
    )
    try:
        assert entered.wait(WAIT)
        rt.close()
        thread.join(WAIT)
    finally:
        release.set()
        wait_for(lambda: not pykka.ActorRegistry.get_all(), WAIT)
    result = out[0]
    assert result.suspended
    with journaled.open(sqlite_url) as again:
        kinds = [e.kind for e in again.runs.history(result.run_id)]
        assert "run.calls-overrun" in kinds
        assert kinds[-1] == "run.suspended"
        assert len(trace) == len(kinds)
        for position, live in trace:
            assert again.runs.at(result.run_id, position) == live
        assert again.runs.state(result.run_id).result() == result


def test_a_bad_drain_is_refused_naming_it() -> None:
    """R3: drain must be a non-negative number of seconds; the error names it."""
    with pytest.raises(journaled.ConfigurationError, match="drain must be a non-negative"):
        journaled.open("memory://", drain=-1)
    with journaled.open("memory://") as rt, pytest.raises(journaled.ConfigurationError):
        rt.close(drain=float("nan"))


CHILD_CRASH_SCRIPT = r"""
import json, os, sys, threading
import journaled

cfg = json.loads(sys.argv[1])


def work(x):
    with open(cfg["record"], "a", encoding="utf-8") as f:
        f.write(x + "\n")
        f.flush()
        os.fsync(f.fileno())
    if x == "c2" and cfg["mode"] == "execute":
        open(os.path.join(cfg["markers"], "c2.inflight"), "w").close()
        threading.Event().wait()
    return x


def boss(step, ctx):
    steps = [journaled.Step("c1", tool="work", input="c1"),
             journaled.Step("c2", tool="work", input="c2", depends_on=["c1"])]
    child = ctx.execute(journaled.Plan(goal="child", steps=steps))
    return journaled.AgentResult(output={"child": child.run_id, "ok": child.ok})


with journaled.open(cfg["url"]) as rt:
    rt.register_tool("work", work)
    rt.register_agent("boss", boss)
    if cfg["mode"] == "execute":
        result = rt.execute(journaled.Plan(goal="g", steps=[journaled.Step("s", agent="boss")]))
    else:
        result = rt.resume(cfg["run_id"])
    print(json.dumps({"ok": result.ok, "output": result.observations[-1].output}))
"""


def test_a_child_run_in_flight_at_sigkill_is_found_again(tmp_path: Path) -> None:
    """R5/E14: SIGKILL inside a child run; on resume the parent step resumes that same child."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    record = tmp_path / "record.txt"
    cfg: dict[str, Any] = {
        "url": url,
        "record": str(record),
        "markers": str(tmp_path),
        "mode": "execute",
    }
    kill_when_in_flight(CHILD_CRASH_SCRIPT, json.dumps(cfg), [tmp_path / "c2.inflight"], tmp_path)
    with journaled.open(url) as rt:
        parent, child = rt.runs.ids()
        assert rt.runs.state(parent).in_flight() == ["s"]
        assert rt.runs.state(child).in_flight() == ["c2"]
    cfg.update(mode="resume", run_id=parent)
    done = subprocess.run(
        [sys.executable, "-c", CHILD_CRASH_SCRIPT, json.dumps(cfg)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"ok": True, "output": {"child": child, "ok": True}}
    assert record.read_text().split() == ["c1", "c2", "c2"]
    with journaled.open(url) as rt:
        assert rt.runs.ids() == [parent, child]
        assert rt.runs.state(child).run_status == "completed"


def test_a_policy_object_is_named_but_never_imported_back() -> None:
    """R6: a partial or callable object is journaled by name and not mistaken for its class."""
    policy = functools.partial(reserve_three)
    name = policy_name(policy)
    assert name == "functools:<partial object>"
    assert find_policy(name) is None
    found = find_policy(policy_name(reserve_three) or "")
    assert found is reserve_three


def test_a_journaled_policy_name_never_imports_a_module(tmp_path: Path) -> None:
    """R6: a policy name read from a journal is looked up, never imported: journals are data."""
    module = tmp_path / "planted_policy.py"
    marker = tmp_path / "imported"
    module.write_text(
        f"open({str(marker)!r}, 'w').close()\n\ndef reserve(step, remaining):\n    return 1\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        assert find_policy("planted_policy:reserve") is None
        assert not marker.exists()
        assert "planted_policy" not in sys.modules
    finally:
        sys.path.remove(str(tmp_path))


def test_an_orchestration_resumed_without_reserve_costs_agents_the_same(sqlite_url: str) -> None:
    """R6/O3: approving an orchestration without reserve= estimates with the journaled policy."""

    def planner(goal: str, observations: Any, clarifications: Any) -> Plan:
        return Plan(goal=goal, steps=[Step("x", agent="a")])

    with journaled.open(sqlite_url) as rt:
        rt.register_agent("a", lambda step, ctx: journaled.AgentResult(calls_used=1))
        outcome = rt.orchestrate(
            "g", planner, call_budget=2, require_approval=True, reserve=reserve_three
        )
        assert outcome.status == "waiting_for_approval"
    with journaled.open(sqlite_url) as again:
        again.register_agent("a", lambda step, ctx: journaled.AgentResult(calls_used=1))
        resumed = again.resume(outcome.run_id, approve=True, planner=planner)
        assert isinstance(resumed, journaled.Outcome)
        # reserve_three estimates 3 calls for the agent: over the budget of 2, so it waits.
        assert resumed.status == "waiting_for_budget", resumed.summary


def test_an_orchestration_policy_not_loaded_refuses_a_resume_without_reserve(
    sqlite_url: str,
) -> None:
    """R6: a journaled policy this process cannot find is never silently replaced by none: a
    runtime that was not handed it (here another one on the same file) refuses the resume."""

    def planner(goal: str, obs: object, cl: object) -> Plan:
        return Plan(goal=goal, steps=[Step("x", agent="a")])

    with journaled.open(sqlite_url) as rt:
        rt.register_agent("a", lambda step, ctx: journaled.AgentResult(calls_used=1))
        started = rt.orchestrate(
            "g", planner, require_approval=True, reserve=lambda step, remaining: 3
        )
    with journaled.open(sqlite_url) as other:
        other.register_agent("a", lambda step, ctx: journaled.AgentResult(calls_used=1))
        with pytest.raises(journaled.RunNotResumable, match="reserve="):
            other.resume(started.run_id, approve=True, planner=planner)
        assert other.runs.history(started.run_id)[-1].kind == "orchestration.ended"


def test_close_waits_for_a_drained_runs_answer_not_only_its_executor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """R3: a run drained by close() is answered as suspended, even when its answer is slow.

    The executor answers from ``on_stop``, after its actor counts as stopped: close() waited for
    the actor alone and could fail the caller with RuntimeClosed before the answer arrived.
    """
    slow = threading.Event()
    deliver = Inbox.tell

    def late(self: Inbox, message: object) -> None:
        if isinstance(message, RunEnded):
            slow.set()
            time.sleep(0.3)  # the answer is on its way while close() goes on
        deliver(self, message)

    monkeypatch.setattr(Inbox, "tell", late)
    entered, release = threading.Event(), threading.Event()

    def hold(x: str) -> str:
        if x == "a":
            entered.set()
            release.wait(WAIT)
        return x

    rt = journaled.open("memory://")
    rt.register_tool("hold", hold)
    plan = Plan(
        goal="g",
        steps=[
            Step("a", tool="hold", input="a"),
            Step("b", tool="hold", input="b", depends_on=["a"]),
        ],
    )
    thread, out = in_thread(rt.execute, plan)
    assert entered.wait(WAIT)
    closer, closed = in_thread(rt.close, drain=WAIT)
    wait_for(lambda: rt.runs.closing, WAIT)
    release.set()
    closer.join(WAIT)
    thread.join(WAIT)
    assert slow.is_set()
    assert closed == [None]
    assert isinstance(out[0], ExecuteResult), out[0]
    assert out[0].suspended
