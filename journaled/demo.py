"""``journaled demo``: one short, offline story of why journaled exists.

A scripted model stands in for an LLM. The story remembers project facts (one supersedes another),
orchestrates a plan of tool, skill and agent steps under a call budget that is too small, pauses,
resumes with a bigger budget, waits for a human answer to an agent's question, completes — and then
asks the journal why each of those things happened. A last act acts on the past: a fact a run read
is superseded, the journal names the stale step, and a refreshed fork, taken just before that
step began, re-runs it and what depends on it and keeps what was done before it (P1-P4, F1, F3).
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

import journaled
from journaled.events.memory_audit import when
from journaled.events.run_audit import describe_run_event, duration, waits
from journaled.testing import ScriptedModel

MODEL = ScriptedModel(
    {
        "summarize": "3 incidents last week; 2 share a root cause: the staging API port changed.",
        "draft": "Patch: point the health check at port 9090 and add a regression test.",
        "report": "Fixed the staging health check (port 9090); deployed; incidents should stop.",
    }
)
QUESTION = "Which region should the fix be deployed to?"
ANSWER = "eu-west-1"


def _register(rt: journaled.Runtime) -> None:
    def fetch_incidents(_: Any) -> list[dict[str, str]]:
        return [
            {"id": "INC-101", "title": "staging health check failing"},
            {"id": "INC-102", "title": "deploy blocked by red staging"},
            {"id": "INC-107", "title": "flaky smoke test"},
        ]

    def skill(name: str) -> Any:
        return lambda data: MODEL.complete(f"{name}: {data}")

    def deployer(step: journaled.Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        if ctx.answer is None:
            raise journaled.NeedsInput(QUESTION)
        child = ctx.execute(
            journaled.Plan(
                goal=f"deploy the fix to {ctx.answer}",
                steps=[journaled.Step("ship", tool="deploy", input={"region": ctx.answer})],
            )
        )
        return journaled.AgentResult(
            output=f"deployed to {ctx.answer}", calls_used=1, data={"child_ok": child.ok}
        )

    rt.register_tool("fetch_incidents", fetch_incidents)
    rt.register_tool("deploy", lambda data: f"released to {data['region']}")
    rt.register_skill("summarize", skill("summarize"))
    rt.register_skill("draft_fix", skill("draft"))
    rt.register_skill("write_report", skill("report"))
    rt.register_agent("deployer", deployer)


def _planner(goal: str, observations: list[Any], clarifications: list[Any]) -> journaled.Plan:
    return journaled.Plan(
        goal=goal,
        steps=[
            journaled.Step("incidents", tool="fetch_incidents"),
            journaled.Step("summary", skill="summarize", depends_on=["incidents"]),
            journaled.Step("fix", skill="draft_fix", depends_on=["summary"]),
            journaled.Step("deploy", agent="deployer", depends_on=["fix"]),
            journaled.Step("report", skill="write_report", depends_on=["deploy"]),
        ],
    )


def _reserve(step: journaled.Step, remaining: float) -> int:
    return 2  # the deployer agent reserves two model calls


def run(url: str | None, console: Console, human_delay: float = 1.5) -> str:
    """Tell the story on the journal at ``url``; return the orchestration's run id.

    ``human_delay`` is how long the scripted human takes to answer the agent's question.
    """
    with journaled.open(url) as rt:
        start = rt.journal.position()
        console.print(
            Panel.fit(
                f"journal [bold]{rt.journal.url}[/]\nstarting at position {start}",
                title="journaled demo",
            )
        )
        _register(rt)

        console.rule("1. Memory: every change is an event")
        old = rt.memory.remember(
            "The staging API listens on port 8080",
            conflict_key="staging-api-port",
            source="docs/runbook.md",
        )
        rt.memory.remember("Deploys go through the staging cluster first", domain="ops")
        rt.memory.remember("Prefers short reports with the fix first", scope="user")
        new = rt.memory.remember(
            "The staging API moved to port 9090 (token=abc123-rotated)",
            conflict_key="staging-api-port",
            source="incident INC-101",
        )
        table = Table("fact", "scope", "text", title="search: 'staging api port'")
        for fact in rt.memory.search("staging api port"):
            table.add_row(fact.id, fact.scope, fact.text)
        console.print(table)
        console.print(f"[dim]{old.id} no longer shows up: {new.id} superseded it.[/]")

        console.rule("2. A plan under a call budget that is too small")

        def progress(
            at: str, delta: list[journaled.Observation], calls: int, waiting: list[str]
        ) -> None:
            for obs in delta:
                mark = (
                    "[green]✓[/]"
                    if obs.ok
                    else ("[yellow]…[/]" if obs.code == "agent-waiting" else "[red]✗[/]")
                )
                console.print(
                    f"  {mark} {obs.step_id:<10} {obs.error or ''}[dim] ({calls} call(s) used)[/]"
                )

        outcome = rt.orchestrate(
            "stop the staging incidents",
            _planner,
            call_budget=2,
            partial=True,
            reserve=_reserve,
            on_progress=progress,
        )
        run_id = outcome.run_id
        _status(console, outcome)

        console.rule("3. Resume with a bigger budget: the agent asks a human")
        outcome = _as_outcome(
            rt.resume(run_id, call_budget=6, reserve=_reserve, on_progress=progress)
        )
        _status(console, outcome)
        with console.status(f"[bold]a human reads the question: {QUESTION}[/]"):
            time.sleep(human_delay)
        console.print(f"  answer: [bold]{ANSWER}[/]")
        outcome = _as_outcome(
            rt.resume(run_id, answers={"deploy": ANSWER}, reserve=_reserve, on_progress=progress)
        )
        _status(console, outcome)

        console.rule("4. Ask the journal why")
        console.print("[bold]Why is the old port fact gone?[/]")
        console.print(rt.memory.why(old.id), markup=False, highlight=False)
        console.print("\n[bold]Why did the run pause, and for how long did it wait?[/]")
        pass_run = outcome.pass_run or run_id
        events = rt.runs.history(pass_run)
        for what, since, until in waits(events):
            span = f"{duration(until - since)}" if until is not None else "still waiting"
            console.print(f"  waited for {what}: from {when(since)} — {span}", highlight=False)
        stop = next(e for e in events if e.kind == "run.budget-stopped")
        console.print(f"  {_describe(stop)}", highlight=False, markup=False)
        console.print(f"\n{rt.memory.why(new.id)}", markup=False, highlight=False)
        stale_run, fork_id = _provenance_act(rt, console)
        end = rt.journal.position()
        console.rule("Look further")
        console.print(
            f"{end - start} events appended (positions {start + 1} to {end}). Try:\n"
            f"  journaled runs why {run_id}\n"
            f"  journaled runs show {pass_run} --at {stop.position}\n"
            f"  journaled runs history {pass_run}\n"
            f"  journaled memory history {old.id}\n"
            f"  journaled runs stale {stale_run}\n"
            f"  journaled runs why {fork_id}",
            highlight=False,
        )
        return run_id


REGION_KEY = "deploy-region"


def _provenance_act(rt: journaled.Runtime, console: Console) -> tuple[str, str]:
    """Supersede a fact a run read, show the stale step, refresh and compare; return both ids."""
    console.rule("5. A fact a run relied on changes: stale, refresh, compare")
    ran: list[str] = []

    def region(query: str, ctx: Any) -> str:
        ran.append("region")
        fact = next(f for f in ctx.memory.search(query) if f.conflict_key == REGION_KEY)
        return str(fact.text.rsplit(" ", 1)[-1])

    def release(_: Any) -> str:
        ran.append("release")
        return "release planned"

    def notes(_: Any) -> str:
        ran.append("notes")
        return "notes written"

    rt.register_tool("read_region", region)
    rt.register_tool("plan_release", release)
    rt.register_tool("write_notes", notes)
    plan = journaled.Plan(
        goal="plan the release",
        steps=[
            journaled.Step("notes", tool="write_notes"),
            journaled.Step(
                "region", tool="read_region", input="deploy region", depends_on=["notes"]
            ),
            journaled.Step("release", tool="plan_release", depends_on=["region"]),
        ],
    )
    rt.memory.remember("The deploy region is eu-west", conflict_key=REGION_KEY, domain="ops")
    first = rt.execute(plan)
    order = [s.id for s in plan.steps]
    console.print(
        f"  run {first.run_id}: ran {', '.join(sorted(ran, key=order.index))}", highlight=False
    )
    newer = rt.memory.remember(
        "The deploy region is us-east", conflict_key=REGION_KEY, domain="ops"
    )
    console.print(f"  remembered {newer.id}: [bold]{newer.text}[/]", highlight=False)
    console.print(f"  [bold]runs stale {first.run_id}[/]", highlight=False)
    for stale in rt.runs.stale(first.run_id):
        by = f" by {stale.replacement}" if stale.replacement else ""
        console.print(
            f"    step {stale.step_id} read {stale.fact_id}\n      {stale.change}{by}",
            highlight=False,
        )
    fork_id = rt.runs.refresh(first.run_id)
    ran.clear()
    rt.resume(fork_id)
    console.print(f"  [bold]runs refresh[/] → {fork_id}", highlight=False)
    console.print(
        f"    resumed it: re-ran {', '.join(sorted(ran, key=order.index))}; "
        f"kept {', '.join(s for s in order if s not in ran)}",
        highlight=False,
    )
    comparison = rt.runs.compare(first.run_id, fork_id)
    table = Table("step", "before", "after", title="runs compare: before → after")
    for step in comparison.steps:
        mark = "≠ " if step.differs else "  "
        table.add_row(mark + step.step_id, repr(step.output_a), repr(step.output_b))
    console.print(table)
    return first.run_id, fork_id


def _describe(event: journaled.Event) -> str:
    return describe_run_event(event) or event.kind


def _as_outcome(result: object) -> journaled.Outcome:
    assert isinstance(result, journaled.Outcome)
    return result


def _status(console: Console, outcome: journaled.Outcome) -> None:
    colour = {"completed": "green", "failed": "red"}.get(outcome.status, "yellow")
    console.print(f"  → [bold {colour}]{outcome.status}[/]: {outcome.summary}", highlight=False)
    if outcome.budget is not None:
        b = outcome.budget
        console.print(
            f"    budget: {b.est_calls} call(s) needed for the rest, {b.max_calls} allowed; "
            f"{b.completed_steps}/{b.total_steps} steps done",
            highlight=False,
        )
