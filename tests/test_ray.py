"""Steps on a real local Ray cluster (SPEC S1-S3): placement, loss, cancel, many drivers.

One cluster serves every Ray test of the session (the ``ray_address`` fixture of conftest); its
two CPU slots are the worker processes. Step functions defined in this module are sent by value,
as a user's own module on a real cluster would be installed on its hosts.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, cast

import pykka
import pytest
import ray
from crash import ROOT, kill_when_in_flight

import journaled
from journaled import Limits, Plan, Retry, Step
from journaled.events.runs import RunStarted, StepRetrying, StepSucceeded
from journaled.ray import RaySteps
from journaled.testing import wait_for

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]


@pytest.fixture
def steps(ray_address: str) -> RaySteps:
    """A placement on the session's cluster (already connected: it never shuts it down)."""
    placement = RaySteps()
    assert not placement.connected_here
    return placement


def where(value: Any) -> dict[str, Any]:
    """Say which process ran the step."""
    return {"pid": os.getpid(), "value": value}


async def where_async(value: Any) -> dict[str, Any]:
    """Say which process ran the step, from a coroutine."""
    await asyncio.sleep(0)
    return {"pid": os.getpid(), "value": value}


def agent_where(step: Step, ctx: Any) -> journaled.AgentResult:
    """An agent reporting its process and one model call."""
    return journaled.AgentResult(ok=True, output={"pid": os.getpid()}, calls_used=1)


def assigned(value: Any) -> dict[str, float]:
    """Return the Ray resources this task was given."""
    return dict(ray.get_runtime_context().get_assigned_resources())  # type: ignore[no-untyped-call]


def pid_then_sleep(value: dict[str, Any]) -> str:
    """Write this process's pid to ``value['pid_file']``, then sleep (a step to kill or cancel).

    With ``value['second']`` set, an attempt that finds that file already there answers at once.
    """
    second = value.get("second")
    if second is not None and Path(second).exists():
        return "second attempt"
    if second is not None:
        Path(second).write_text("x")
    Path(value["pid_file"]).write_text(str(os.getpid()))
    time.sleep(value.get("sleep", 60))
    return "slept"


def asks(step: Step, ctx: Any) -> journaled.AgentResult:
    """Wait for an answer, then return it (E10)."""
    if ctx.answer is None:
        raise journaled.NeedsInput("which file?")
    return journaled.AgentResult(ok=True, output=ctx.answer)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pid(path: Path) -> int:
    wait_for(lambda: path.exists() and path.read_text() != "", 60)
    return int(path.read_text())


def test_skill_tool_and_agent_steps_run_in_ray_workers(steps: RaySteps, sqlite_url: str) -> None:
    """S1: sync and async tools, a skill and an agent run in Ray worker processes; outputs come
    back, skills and agents are charged as locally, and the result is journaled here."""
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("where", where)
        rt.register_tool("where_async", where_async)
        rt.register_skill("think", where)
        rt.register_agent("agent", agent_where)
        plan = Plan(
            goal="g",
            steps=[
                Step("a", tool="where", input=1),
                Step("b", tool="where_async", input=2, depends_on=["a"]),
                Step("c", skill="think", input=3),
                Step("d", agent="agent", depends_on=["c"]),
            ],
        )
        result = rt.execute(plan)
        again = rt.runs.at(result.run_id, rt.journal.position())
    assert result.ok, result.observations
    outputs = {o.step_id: o.output for o in result.observations}
    assert [outputs[i]["value"] for i in "abc"] == [1, 2, 3]
    pids = {outputs[i]["pid"] for i in "abcd"}
    assert os.getpid() not in pids
    assert result.calls_used == 2  # the skill (1) and the agent's report (1)
    assert again.observations == result.observations


def test_the_asyncio_runtime_places_steps_on_ray(steps: RaySteps) -> None:
    """S1, A1: journaled.aio.open(..., steps=RaySteps()) runs its async tools on Ray too."""

    async def main() -> journaled.ExecuteResult:
        async with journaled.aio.open("memory://", steps=steps) as rt:
            rt.register_tool("where_async", where_async, resources={"num_cpus": 1})
            return await rt.execute(Plan(goal="g", steps=[Step("a", tool="where_async", input=5)]))

    result = asyncio.run(main())
    assert result.ok, result.observations
    assert result.observations[0].output["value"] == 5
    assert result.observations[0].output["pid"] != os.getpid()


def test_registered_resources_reach_the_task(steps: RaySteps, sqlite_url: str) -> None:
    """S1: a registration's resources are what the Ray task is given."""
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool(
            "special", assigned, resources={"num_cpus": 1, "resources": {"special": 1}}
        )
        rt.register_tool("plain", assigned)
        result = rt.execute(
            Plan(goal="g", steps=[Step("a", tool="special"), Step("b", tool="plain")])
        )
    assert result.ok, result.observations
    outputs = {o.step_id: o.output for o in result.observations}
    assert outputs["a"] == {"CPU": 1.0, "special": 1.0}
    assert outputs["b"] == {"CPU": 1.0}


def test_resources_ray_refuses_fail_the_step_not_the_run(steps: RaySteps, sqlite_url: str) -> None:
    """S1, E11: resources Ray refuses when the task is submitted fail that step, named; the run
    ends and its other steps run."""
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("odd", where, resources={"resources": {"CPU": 1}})
        rt.register_tool("where", where)
        result = rt.execute(Plan(goal="g", steps=[Step("a", tool="odd"), Step("b", tool="where")]))
    errors = {o.step_id: o.error for o in result.observations}
    assert (errors["a"] or "").startswith("step 'a' could not be submitted to Ray: ")
    assert errors["b"] is None


def test_caps_and_budget_hold_on_ray(steps: RaySteps, sqlite_url: str, tmp_path: Path) -> None:
    """S1, E3, E7: a per-tool cap of 1 keeps Ray tasks of that tool apart; a budget stop still
    pauses before the wave that does not fit."""

    def stamp(value: Any) -> list[float]:
        began = time.time()
        time.sleep(0.2)
        return [began, time.time()]

    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("stamp", stamp)
        rt.register_skill("think", where)
        capped = rt.execute(
            Plan(goal="g", steps=[Step(f"s{i}", tool="stamp") for i in range(3)]),
            max_parallel_steps=3,
            limits=Limits(per_tool={"stamp": 1}),
        )
        budget = rt.execute(
            Plan(
                goal="g",
                steps=[Step("a", skill="think"), Step("b", skill="think", depends_on=["a"])],
            ),
            call_budget=1,
        )
    assert capped.ok, capped.observations
    spans = sorted(o.output for o in capped.observations)
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))
    assert budget.stopped_for_budget
    assert budget.calls_used == 1
    assert [s.status for s in budget.plan.steps] == ["succeeded", "pending"]


def test_cancel_stops_the_ray_task(steps: RaySteps, sqlite_url: str, tmp_path: Path) -> None:
    """S1, E5: cancelling a run cancels its running Ray task (the worker process is stopped);
    the step is observed cancelled and its dependent cancelled too."""
    pid_file = tmp_path / "pid"
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("sleep", pid_then_sleep)
        rt.register_tool("where", where)
        handle = rt.start(
            Plan(
                goal="g",
                steps=[
                    Step("a", tool="sleep", input={"pid_file": str(pid_file)}),
                    Step("b", tool="where", depends_on=["a"]),
                ],
            )
        )
        pid = _pid(pid_file)
        rt.cancel(handle.run_id)
        result = handle.result(timeout=60)
    assert not result.ok
    first = result.observations[0]
    assert (first.step_id, first.code) == ("a", "cancelled")
    assert [s.status for s in result.plan.steps] == ["failed", "skipped"]
    wait_for(lambda: not _alive(pid), 30)


def test_a_step_timeout_cancels_the_ray_task(
    steps: RaySteps, sqlite_url: str, tmp_path: Path
) -> None:
    """S1, E*: a step past its timeout fails as locally, and its Ray task is stopped."""
    pid_file = tmp_path / "pid"
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("sleep", pid_then_sleep)
        handle = rt.start(
            Plan(goal="g", steps=[Step("a", tool="sleep", input={"pid_file": str(pid_file)})]),
            step_timeout=3,
        )
        pid = _pid(pid_file)
        result = handle.result(timeout=60)
    assert result.observations[0].error == "timed out after 3.0s"
    wait_for(lambda: not _alive(pid), 30)
    # The abandoned step worker ends once Ray reports the task cancelled.
    wait_for(lambda: not pykka.ActorRegistry.get_all(), 30)


def test_a_killed_worker_fails_its_step_naming_the_loss(
    steps: RaySteps, sqlite_url: str, tmp_path: Path
) -> None:
    """S2: a Ray worker SIGKILLed mid-step fails that step with an observation naming the
    loss; the run ends consistent (its dependent skipped) and the runtime carries on."""
    pid_file = tmp_path / "pid"
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("sleep", pid_then_sleep)
        rt.register_tool("where", where)
        handle = rt.start(
            Plan(
                goal="g",
                steps=[
                    Step("a", tool="sleep", input={"pid_file": str(pid_file)}),
                    Step("b", tool="where", depends_on=["a"]),
                ],
            )
        )
        os.kill(_pid(pid_file), signal.SIGKILL)
        result = handle.result(timeout=60)
        after = rt.execute(Plan(goal="g", steps=[Step("c", tool="where", input=1)]))
    error = result.observations[0].error or ""
    assert error.startswith("lost: the Ray worker running step 'a' died (WorkerCrashedError")
    assert [s.status for s in result.plan.steps] == ["failed", "skipped"]
    assert after.ok


def test_a_killed_worker_is_retried_under_the_retry_policy(
    steps: RaySteps, sqlite_url: str, tmp_path: Path
) -> None:
    """S2: with Retry(attempts=2), the attempt whose worker was killed is journaled as
    retrying (naming the loss) and the second attempt's result is the step's."""
    pid_file = tmp_path / "pid"
    value = {"pid_file": str(pid_file), "second": str(tmp_path / "tried")}
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("sleep", pid_then_sleep, retry=Retry(attempts=2, backoff=0.1))
        handle = rt.start(Plan(goal="g", steps=[Step("a", tool="sleep", input=value)]))
        os.kill(_pid(pid_file), signal.SIGKILL)
        result = handle.result(timeout=60)
        events = [e.data for e in rt.runs.history(result.run_id)]
    assert result.ok, result.observations
    assert [o.output for o in result.observations] == ["second attempt"]
    retrying = [e for e in events if isinstance(e, StepRetrying)]
    assert len(retrying) == 1
    assert "lost: the Ray worker running step 'a' died" in (retrying[0].observation.error or "")


def test_a_worker_terminated_by_sigterm_is_a_lost_worker(
    steps: RaySteps, sqlite_url: str, tmp_path: Path
) -> None:
    """S2: Ray turns a SIGTERM of its worker (ray stop, a node drained, a pod pre-empted) into
    a SystemExit in the task's thread; the step does not observe it as its own failure: the
    worker exits and the step fails naming the loss."""
    pid_file = tmp_path / "pid"
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("sleep", pid_then_sleep)
        handle = rt.start(
            Plan(goal="g", steps=[Step("a", tool="sleep", input={"pid_file": str(pid_file)})])
        )
        pid = _pid(pid_file)
        os.kill(pid, signal.SIGTERM)
        result = handle.result(timeout=60)
    error = result.observations[0].error or ""
    assert error.startswith("lost: the Ray worker running step 'a' died"), error
    wait_for(lambda: not _alive(pid), 30)


def exits(value: int) -> int:
    """Call sys.exit, as user code may."""
    sys.exit(value)


def exits_agent(step: Step, ctx: Any) -> journaled.AgentResult:
    """An agent calling sys.exit."""
    sys.exit(4)


def test_sys_exit_of_user_code_on_ray_fails_only_its_step(steps: RaySteps, sqlite_url: str) -> None:
    """S2, E11: a tool's or agent's own sys.exit() on Ray fails its step as on a local worker
    (SystemExit named), not as a lost worker: only Ray's SIGTERM exit ends the worker."""
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("exits", exits)
        rt.register_agent("exits_agent", exits_agent)
        result = rt.execute(
            Plan(goal="g", steps=[Step("a", tool="exits", input=3), Step("b", agent="exits_agent")])
        )
    errors = {o.step_id: o.error for o in result.observations}
    assert errors == {"a": "SystemExit(3)", "b": "SystemExit(4)"}


def test_an_unpicklable_function_fails_its_step_by_name(steps: RaySteps, sqlite_url: str) -> None:
    """S1: a function that cannot be pickled fails its step with an error naming the step and
    the tool; the run is not harmed."""
    lock = threading.Lock()

    def holds_a_lock(value: Any) -> bool:
        return lock.locked()

    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("locked", holds_a_lock)
        rt.register_tool("where", where)
        result = rt.execute(
            Plan(goal="g", steps=[Step("a", tool="locked"), Step("b", tool="where")])
        )
    errors = {o.step_id: o.error for o in result.observations}
    assert (errors["a"] or "").startswith(
        "tool 'locked' of step 'a' cannot be sent to Ray: its function must pickle"
    )
    assert errors["b"] is None


def test_a_module_missing_on_the_workers_fails_the_step_saying_so(
    steps: RaySteps, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S1: a step whose function's module is not installed where Ray runs it fails with one
    line naming the missing module; the run ends."""
    (tmp_path / "only_here.py").write_text("def f(value):\n    return value\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # importable here, not in the Ray workers
    only_here = importlib.import_module("only_here")
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("f", only_here.f)
        result = rt.execute(Plan(goal="g", steps=[Step("a", tool="f", input=1)]))
    error = result.observations[0].error or ""
    assert error.startswith("the Ray task of step 'a' failed: "), error
    assert "No module named 'only_here'" in error
    assert "\n" not in error
    assert "\x1b" not in error


def test_a_waiting_agent_on_ray_resumes_with_its_answer(steps: RaySteps, sqlite_url: str) -> None:
    """S1, E10: an agent on Ray that needs input leaves the run waiting; resume gives it the
    answer."""
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_agent("asks", asks)
        first = rt.execute(Plan(goal="g", steps=[Step("a", agent="asks")]))
        second = rt.resume(first.run_id, answers={"a": "notes.txt"})
    assert isinstance(second, journaled.ExecuteResult)
    assert first.waiting == ["a"]
    assert second.ok
    assert second.observations[-1].output == "notes.txt"


def spawns_a_child(step: Step, ctx: Any) -> journaled.AgentResult:
    """Try to run a child plan (not possible on Ray)."""
    ctx.execute(Plan(goal="child", steps=[Step("x", tool="where")]))
    return journaled.AgentResult(ok=True)


def test_an_agent_on_ray_cannot_start_a_child_run(steps: RaySteps, sqlite_url: str) -> None:
    """S1, E9: ctx.execute on Ray fails the agent step with an error saying why and what to do;
    no child run is journaled."""
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_agent("spawns", spawns_a_child)
        rt.register_tool("where", where)
        result = rt.execute(Plan(goal="g", steps=[Step("a", agent="spawns")]))
        runs = rt.runs.list()
    (obs,) = result.observations
    assert obs.code == "agent-failed"
    assert (obs.error or "").startswith("ctx.execute is not available to an agent running on Ray")
    assert len(runs) == 1


PROBE = """
import sys
import journaled
with journaled.open("memory://") as rt:
    rt.register_tool("t", print, resources={"num_cpus": 1})
assert "ray" not in sys.modules, "import journaled imported ray"
assert journaled.ray.RaySteps.__name__ == "RaySteps"
assert "ray" in sys.modules
print("ok")
"""


def test_import_journaled_never_imports_ray() -> None:
    """S1: `import journaled`, a runtime and resources on a registration leave Ray unimported;
    `journaled.ray` imports it."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: RaySteps(""), "address must be a non-empty string or None, got ''"),
        (lambda: RaySteps(resources={"gpus": 1}), "resources has an unknown key 'gpus'"),
        (
            lambda: journaled.open("memory://", steps=cast(Any, object())),
            "steps must be a placement",
        ),
    ],
)
def test_a_bad_placement_is_refused_by_name(make: Any, message: str) -> None:
    """S1: a bad address, bad default resources or a steps= that is no placement raise one line
    naming what is wrong."""
    with pytest.raises(journaled.ConfigurationError, match="^" + message):
        make()


DRIVER = """
import json, os, sys, time
from pathlib import Path
import journaled
from journaled import Plan, Step
from journaled.ray import RaySteps

config = json.loads(sys.argv[1])

def work(value):
    if "mark" in value:
        Path(value["mark"]).write_text(str(os.getpid()))
        time.sleep(120)
    return {"pid": os.getpid(), "step": value["step"]}

rt = journaled.open(config["url"], steps=RaySteps(config["address"]))
rt.register_tool("work", work)
steps = [Step(f"s{i}", tool="work", input={"step": i}) for i in range(config["steps"])]
if config.get("mark"):
    steps.append(Step("slow", tool="work", input={"step": -1, "mark": config["mark"]}))
result = rt.execute(Plan(goal=config["goal"], steps=steps))
print(json.dumps({"run_id": result.run_id, "ok": result.ok, "driver": os.getpid()}))
rt.close()
"""


def _driver(config: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, json.dumps(config)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_two_runtimes_in_two_processes_share_a_postgresql_journal_and_the_cluster(
    ray_address: str, pg_url: str
) -> None:
    """S3: two runtimes in two processes, one PostgreSQL journal, one Ray cluster: each owns its
    run, every step runs in a Ray worker, and every result is journaled exactly once."""
    drivers = [
        _driver({"url": pg_url, "address": ray_address, "goal": f"g{n}", "steps": 4})
        for n in range(2)
    ]
    reports = []
    for proc in drivers:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["ok"] for r in reports)
    driver_pids = {r["driver"] for r in reports}
    with journaled.open(pg_url) as rt:
        owners = set()
        for report in reports:
            events = [e.data for e in rt.runs.history(report["run_id"])]
            done = [e for e in events if isinstance(e, StepSucceeded)]
            assert sorted(e.step_id for e in done) == [f"s{i}" for i in range(4)]
            pids = {e.observation.output["pid"] for e in done}
            assert not pids & driver_pids
            assert os.getpid() not in pids
            owners.add(next(e.owner for e in events if isinstance(e, RunStarted)))
    assert len(owners) == 2


@pytest.mark.slow
def test_a_driver_killed_mid_step_resumes_on_the_cluster(
    ray_address: str, steps: RaySteps, sqlite_url: str, tmp_path: Path
) -> None:
    """S2, E14: a driver SIGKILLed while its step runs on Ray leaves a resumable run; a resume
    in another process re-runs only that step, on the cluster."""
    mark = tmp_path / "in-flight"
    config = {
        "url": sqlite_url,
        "address": ray_address,
        "goal": "g",
        "steps": 2,
        "mark": str(mark),
    }
    kill_when_in_flight(DRIVER, json.dumps(config), [mark], tmp_path)

    def quick(value: dict[str, Any]) -> dict[str, Any]:
        return {"pid": os.getpid(), "step": value["step"]}

    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("work", quick)
        (summary,) = rt.runs.list()
        result = rt.resume(summary.run_id)
        assert isinstance(result, journaled.ExecuteResult)
        events = [e.data for e in rt.runs.history(summary.run_id)]
    assert result.ok, result.observations
    done = [e.step_id for e in events if isinstance(e, StepSucceeded)]
    assert sorted(done) == ["s0", "s1", "slow"]
    assert done.count("slow") == 1
    slow = next(o for o in result.observations if o.step_id == "slow")
    assert slow.output["pid"] != os.getpid()
