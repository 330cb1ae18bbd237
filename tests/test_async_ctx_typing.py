"""An async agent's ``ctx`` is typed as its loop sees it (A1, E9): with ``ctx`` annotated
``journaled.AsyncAgentContext``, ``result = await ctx.execute(plan)`` checks under mypy --strict
as an ExecuteResult, a forgotten ``await`` is reported, and both kinds of agent register."""

from __future__ import annotations

import subprocess
from pathlib import Path

from typecheck import mypy_strict

HEADER = [
    "import journaled",
    "from journaled import AgentResult, Plan, Step",
    "from journaled.aio import AsyncRuntime",
    "",
    "PLAN = Plan(goal='child', steps=[Step('c', tool='echo', input='x')])",
    "",
]


def _mypy(tmp_path: Path, lines: list[str]) -> subprocess.CompletedProcess[str]:
    return mypy_strict(tmp_path, HEADER + lines)


def test_await_ctx_execute_in_an_async_agent_is_an_execute_result(tmp_path: Path) -> None:
    """A1/E9: ``await ctx.execute(plan)`` in an async agent type-checks as an ExecuteResult,
    a sync agent's ``ctx.execute(plan)`` still is one, and each registers on either runtime."""
    done = _mypy(
        tmp_path,
        [
            "async def parent(step: Step, ctx: journaled.AsyncAgentContext) -> AgentResult:",
            "    result = await ctx.execute(PLAN)",
            "    reveal_type(result)",
            "    also = await ctx.execute_async(PLAN)",
            "    return AgentResult(output=[result.run_id, also.run_id], calls_used=0)",
            "",
            "",
            "def sync_parent(step: Step, ctx: journaled.AgentContext) -> AgentResult:",
            "    result = ctx.execute(PLAN)",
            "    reveal_type(result)",
            "    return AgentResult(output=result.run_id, calls_used=0)",
            "",
            "",
            "async def register(rt: journaled.Runtime, art: AsyncRuntime) -> None:",
            "    rt.register_agent('parent', parent)",
            "    rt.register_agent('sync_parent', sync_parent)",
            "    await art.register_agent('parent', parent)",
        ],
    )
    revealed = [line for line in done.stdout.splitlines() if "Revealed type is" in line]
    assert len(revealed) == 2, done.stdout + done.stderr
    assert all(line.endswith('"journaled.events.plans.ExecuteResult"') for line in revealed), (
        revealed
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_forgotten_await_is_reported(tmp_path: Path) -> None:
    """A1/E9: reading the result of an unawaited ``ctx.execute(plan)`` in an async agent is a
    type error, as it is an AttributeError when the agent runs."""
    done = _mypy(
        tmp_path,
        [
            "async def parent(step: Step, ctx: journaled.AsyncAgentContext) -> AgentResult:",
            "    return AgentResult(output=ctx.execute(PLAN).run_id, calls_used=0)",
        ],
    )
    assert done.returncode == 1, done.stdout
    assert 'has no attribute "run_id"' in done.stdout, done.stdout
