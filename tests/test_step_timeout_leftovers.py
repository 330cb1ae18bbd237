"""A step that times out while its code runs on (E3, E9, R5, ADR 0008, ADR 0020).

The executor abandons the attempt and records its timeout; the call goes on in its worker
until it returns. What it started and what it holds stay accounted for meanwhile.
"""

from __future__ import annotations

import threading
import time

import pykka
import pytest

import journaled
from journaled import AgentResult, Limits, Plan, Step
from journaled.testing import wait_for

WAIT = 10.0


def _settle() -> None:
    # abandoned workers end when their user code returns
    wait_for(lambda: not pykka.ActorRegistry.get_all(), WAIT)


def test_a_retried_agent_gets_back_the_child_its_timed_out_attempt_started() -> None:
    """R5 / ADR 0020 / ADR 0046 / AgentContext.execute's docstring: a step run again "after an
    answer, a crash or a retry" finds its child again. Attempt 1 of the agent times out while
    its child runs; attempt 2's ctx.execute must get that child (wait for it), not fail with
    RunOwnedElsewhere and burn every retry in milliseconds."""
    release = threading.Event()
    children_tool_runs: list[str] = []

    def slow(x: object) -> str:
        children_tool_runs.append("c")
        release.wait(0.8)
        return "child-done"

    def boss(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        child = ctx.execute(Plan(goal="child", steps=[Step("c", tool="slow")]))
        return AgentResult(ok=child.ok, output=child.observations[-1].output, calls_used=0)

    try:
        with journaled.open("memory://") as rt:
            rt.register_tool("slow", slow)
            rt.register_agent("boss", boss, retry=journaled.Retry(attempts=3, backoff=0.01))
            result = rt.execute(Plan(goal="g", steps=[Step("a", agent="boss")]), step_timeout=0.3)
            assert result.ok, result.observations[0].error
            assert result.observations[0].output == "child-done"
            assert children_tool_runs == ["c"]  # one child, its step run once
            assert len(rt.runs.ids()) == 2
    finally:
        release.set()
        _settle()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_timed_out_agent_step_names_the_child_run_it_started(kind: str) -> None:
    """E9: the parent step's observation carries the child run id as agent_task_id. A cancelled
    agent's observation does (tests/test_async_steps.py); a timed-out one's does not: the
    executor builds the timeout observation without it, although the child run exists and
    keeps running under the failed parent."""
    release = threading.Event()
    entered = threading.Event()

    def slow(x: object) -> str:
        entered.set()
        release.wait(WAIT)
        return "late"

    child_plan = Plan(goal="child", steps=[Step("c", tool="slow")])

    def boss(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        ctx.execute(child_plan)
        return AgentResult(ok=True)

    async def aboss(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        await ctx.execute(child_plan)  # type: ignore[misc]
        return AgentResult(ok=True)

    try:
        with journaled.open("memory://", drain=0.5) as rt:
            rt.register_tool("slow", slow)
            rt.register_agent("boss", boss if kind == "sync" else aboss)
            result = rt.execute(Plan(goal="g", steps=[Step("a", agent="boss")]), step_timeout=0.3)
            assert entered.is_set()
            (obs,) = result.observations
            assert obs.code == "agent-timeout"
            children = [s.run_id for s in rt.runs.list() if s.parent_run == result.run_id]
            assert len(children) == 1
            assert obs.agent_task_id == children[0]
            release.set()
    finally:
        release.set()
        _settle()


def test_a_per_tool_cap_holds_while_a_timed_out_call_still_runs() -> None:
    """E3: per_tool={"api": 1} bounds how many steps using "api" run at once. A step that
    timed out on a sync function ignoring cancellation is abandoned with its code still
    running; the executor frees its cap slot at once and starts the next "api" step, so two
    calls of a capped tool run concurrently."""
    lock = threading.Lock()
    running = [0]
    peak = [0]

    def api(x: object) -> object:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            time.sleep(0.6 if x == 1 else 0.05)  # the first ignores its deadline
        finally:
            with lock:
                running[0] -= 1
        return x

    try:
        with journaled.open("memory://") as rt:
            rt.register_tool("api", api)
            plan = Plan(
                goal="g", steps=[Step("a", tool="api", input=1), Step("b", tool="api", input=2)]
            )
            result = rt.execute(
                plan, max_parallel_steps=2, limits=Limits(per_tool={"api": 1}), step_timeout=0.3
            )
            assert [s.status for s in result.plan.steps] == ["failed", "succeeded"]
            assert peak[0] == 1, f"{peak[0]} calls of the capped tool ran at once"
    finally:
        _settle()
