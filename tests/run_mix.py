"""A journal holding one run of every kind `runs list` tells apart (T2), and a brute-force answer.

``build`` runs it in this process or in a child (``python run_mix.py URL [--kill]``); ``expected``
folds every event of every run from the journal with the per-run folds (RunFold,
OrchestrationState), independently of the run-summary projection, and judges an unsettled run's
owner as a listing does (``interrupted``, ADR 0088).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

import journaled
from journaled.actors.ownership import owner_stopped
from journaled.events.orchestration_state import fold_orchestration
from journaled.events.run_state import fold_run
from journaled.testing import wait_for

WAIT = 20.0
_FINISHED = {"waiting": "waiting_for_input", "stopped_for_budget": "waiting_for_budget"}


def _plan(goal: str, *steps: journaled.Step) -> journaled.Plan:
    return journaled.Plan(goal=goal, steps=list(steps))


def register(rt: journaled.Runtime) -> threading.Event:
    """Register the tools, skills and agents of the mix; return the event that frees `stuck`."""
    release = threading.Event()

    def boom(_: object) -> str:
        raise RuntimeError("disk full")

    def ask(_: journaled.Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        if ctx.answer is None:
            raise journaled.NeedsInput("which one?")
        return journaled.AgentResult(output=ctx.answer)

    def patient(_: journaled.Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        # Waits on the cancel token itself (a threading.Event), not on a sleep.
        wait_for(ctx.cancelled, WAIT)
        return journaled.AgentResult(ok=False, error="stopped", code="cancelled")

    def parent(_: journaled.Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        child = ctx.execute(_plan("child goal", journaled.Step("c1", tool="ok")))
        return journaled.AgentResult(output=child.ok, calls_used=0)

    rt.register_tool("ok", lambda _: "done")
    rt.register_tool("boom", boom)
    rt.register_tool("stuck", lambda _: release.wait(WAIT) and "late")
    rt.register_skill("think", lambda _: "thought")
    rt.register_agent("ask", ask)
    rt.register_agent("patient", patient)
    rt.register_agent("parent", parent)
    return release


def _planner(goal: str, _observations: object, _clarifications: object) -> object:
    if goal == "unclear":
        return journaled.Clarify("unclear how?")
    return _plan(goal, journaled.Step("p1", tool="ok"), journaled.Step("p2", skill="think"))


def build(url: str, *, save_midway: bool = False, kill: bool = False) -> dict[str, str]:
    """Make the mix; return {name: run id}. With ``kill``, SIGKILL this process at the end."""
    rt = journaled.open(url, drain=0.2)
    release = register(rt)
    try:
        return _mix(rt, release, save_midway=save_midway, kill=kill)
    finally:
        rt.close()  # the drain ends with `x` in flight: suspended (R3)
        release.set()


def _mix(
    rt: journaled.Runtime, release: threading.Event, *, save_midway: bool, kill: bool
) -> dict[str, str]:
    ids: dict[str, str] = {}
    ids["completed"] = rt.execute(_plan("all good", journaled.Step("a", tool="ok"))).run_id
    failed = rt.execute(
        _plan(
            "will fail",
            journaled.Step("a", tool="ok"),
            journaled.Step("b", tool="boom", depends_on=["a"]),
            journaled.Step("c", skill="think", depends_on=["b"]),
        )
    )
    ids["failed"] = failed.run_id
    ids["waiting"] = rt.execute(_plan("needs input", journaled.Step("q", agent="ask"))).run_id
    budget = rt.execute(
        _plan(
            "too dear",
            journaled.Step("s1", skill="think"),
            journaled.Step("s2", skill="think", depends_on=["s1"]),
        ),
        call_budget=1,
    )
    ids["budget"] = budget.run_id
    handle = rt.start(_plan("to cancel", journaled.Step("w", agent="patient")))
    wait_for(lambda: rt.runs.state(handle.run_id).status.get("w") == "running", WAIT)
    handle.cancel()
    handle.result(WAIT)
    ids["cancelled"] = handle.run_id
    if save_midway:
        assert rt.runs.summaries.save()
    purged = rt.execute(_plan("secret goal", journaled.Step("a", tool="ok"))).run_id
    rt.runs.purge(purged, "asked to forget")
    ids["purged"] = purged
    ids["fork"] = rt.runs.fork(ids["failed"])
    ids["fork_resumed"] = rt.runs.fork(
        ids["failed"], replace={"b": journaled.Step("b", tool="ok", depends_on=["a"])}
    )
    rt.resume(ids["fork_resumed"])
    ids["parent"] = rt.execute(_plan("with a child", journaled.Step("p", agent="parent"))).run_id
    ids["child"] = next(r for r in rt.runs.ids() if r not in ids.values())
    ids["orchestration"] = rt.orchestrate("orchestrated", _planner).run_id
    ids["clarify"] = rt.orchestrate("unclear", _planner).run_id
    started = threading.Event()

    def stuck_now(_: object) -> str:
        started.set()
        release.wait(WAIT)
        return "late"

    rt.register_tool("stuck_now", stuck_now)
    suspended = rt.start(_plan("left mid-step", journaled.Step("x", tool="stuck_now")))
    ids["suspended"] = suspended.run_id
    assert started.wait(WAIT)
    if kill:
        print(json.dumps(ids), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return ids


def running_or_interrupted(rt: journaled.Runtime, run_id: str, owner: str, last_at: int) -> str:
    """Judge an unsettled run as the runtime's listing does: its owner stopped or not (0088)."""
    here = rt.runs.executing_here(run_id)
    return "interrupted" if owner_stopped(owner, last_at, rt.runs._clock(), here) else "running"


def expected(rt: journaled.Runtime, *, judge: bool = True) -> dict[str, tuple[object, ...]]:
    """Fold every event of every run: (status, goal, steps done, total, calls used) by run id.

    ``judge``: an unsettled run whose owner stopped is ``interrupted``, as ``runs.list`` says;
    without it, ``running``, as a projection read without a judge says.
    """
    out: dict[str, tuple[object, ...]] = {}
    for run_id in rt.runs.ids():
        history = rt.runs.history(run_id)
        if history[0].kind == "orchestration.started":
            orch = fold_orchestration(history)
            assert orch.started is not None
            runs = [fold_run(rt.runs.history(r)) for r in orch.pass_runs.values()]
            last = runs[-1] if runs else None
            orch_status: str = orch.status or (
                "waiting_for_clarification" if orch.question else "running"
            )
            let_go = orch.suspended is not None or (
                last is not None and last.suspended is not None and last.finished is None
            )
            if orch_status == "running" and let_go:
                orch_status = "suspended"
            elif orch_status == "running" and judge:
                last_at = max([orch.last_at, *(r.last_at for r in runs)])
                orch_status = running_or_interrupted(rt, run_id, orch.owner, last_at)
            planned = orch.plans[max(orch.plans)] if orch.plans else None
            if planned is not None and (max(orch.plans) > len(runs) or last is None):
                done, total = 0, len(planned.steps)  # a settled plan not started yet (T2)
            else:
                done = 0 if last is None else _done(last.status)
                total = 0 if last is None else len(last.order)
            calls = sum(r.calls_used for r in runs)
            out[run_id] = (orch_status, orch.started.goal, done, total, calls)
            continue
        state = fold_run(history)
        assert state.started is not None
        status: str
        if state.purged is not None:
            status = "purged"
        elif state.finished is not None:
            status = _FINISHED.get(state.finished.status, state.finished.status)
        elif state.suspended is not None:
            status = "suspended"
        elif state.forked is not None and state.resumptions == 0:
            status = "forked"
        elif judge:
            status = running_or_interrupted(rt, run_id, state.owner, state.last_at)
        else:
            status = "running"
        goal = "" if state.purged else state.started.plan.goal
        out[run_id] = (status, goal, _done(state.status), len(state.order), state.calls_used)
    return out


def _done(status: Mapping[str, str]) -> int:
    return sum(1 for s in status.values() if s in ("succeeded", "failed", "skipped"))


def listed(rt: journaled.Runtime) -> dict[str, tuple[object, ...]]:
    """Return what ``runs.list()`` says, in the shape of :func:`expected`."""
    return {
        s.run_id: (s.status, s.goal, s.steps_done, s.steps_total, s.calls_used)
        for s in rt.runs.list()
    }


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    build(sys.argv[1], save_midway=True, kill="--kill" in sys.argv)
