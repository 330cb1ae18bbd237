"""The ``journaled`` command line: the demo, and reading memory and runs from a journal."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
import msgspec
from rich.console import Console
from rich.table import Table

import journaled
from events.memory_audit import describe, when
from events.run_audit import describe_orchestration_event, describe_run_event
from journaled import demo as demo_story

URL_HELP = "Journal URL (default: $JOURNALED_URL, then ./.journaled/journal.sqlite)."


@click.group()
@click.version_option(package_name="journaled")
@click.option("--url", default=None, help=URL_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.pass_context
def main(ctx: click.Context, url: str | None, as_json: bool) -> None:
    """journaled: an event-sourced actor runtime for AI agents."""
    ctx.obj = {"url": url, "json": as_json}


@contextmanager
def _runtime(ctx: click.Context) -> Iterator[journaled.Runtime]:
    """Open the journal for reading; a journal that does not exist is an error, not created."""
    try:
        rt = journaled.Runtime(ctx.obj["url"], create=False)
    except (journaled.JournalUrlError, journaled.CorruptEvent) as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        yield rt
    finally:
        rt.close()


def _emit(ctx: click.Context, data: Any, human: str | None = None) -> None:
    if ctx.obj["json"] or human is None:
        click.echo(msgspec.json.encode(data).decode())
    else:
        click.echo(human)


@main.command()
@click.pass_context
def demo(ctx: click.Context) -> None:
    """Tell a short story: memory, a budget pause, a question, and why each happened."""
    demo_story.run(ctx.obj["url"], Console())


# -- memory ----------------------------------------------------------------------------------------


@main.group()
def memory() -> None:
    """Read the memory store."""


@memory.command("search")
@click.argument("query")
@click.option("--limit", default=10, show_default=True)
@click.option("--scope", "scopes", multiple=True, help="Logical scope to keep (repeatable).")
@click.pass_context
def memory_search(ctx: click.Context, query: str, limit: int, scopes: tuple[str, ...]) -> None:
    """Search facts by BM25."""
    with _runtime(ctx) as rt:
        facts = rt.memory.search(query, scopes=list(scopes) or None, limit=limit)
        if ctx.obj["json"]:
            _emit(ctx, facts)
            return
        table = Table("fact", "scope", "text")
        for fact in facts:
            table.add_row(fact.id, fact.scope, fact.text)
        Console().print(table)


@memory.command("show")
@click.argument("fact_id")
@click.pass_context
def memory_show(ctx: click.Context, fact_id: str) -> None:
    """Show one fact."""
    with _runtime(ctx) as rt:
        fact = rt.memory.get(fact_id)
        if fact is None:
            raise click.ClickException(f"no fact {fact_id} in this journal (deleted or unknown)")
        _emit(ctx, fact, msgspec.json.format(msgspec.json.encode(fact).decode()))


@memory.command("why")
@click.argument("fact_id")
@click.pass_context
def memory_why(ctx: click.Context, fact_id: str) -> None:
    """Explain a fact's life from its events."""
    with _runtime(ctx) as rt:
        history = rt.memory.history(fact_id)
        if not history:
            raise click.ClickException(f"no fact {fact_id} in this journal")
        _emit(ctx, {"fact_id": fact_id, "why": rt.memory.why(fact_id)}, rt.memory.why(fact_id))


@memory.command("history")
@click.argument("fact_id")
@click.pass_context
def memory_history(ctx: click.Context, fact_id: str) -> None:
    """List a fact's events with their positions."""
    with _runtime(ctx) as rt:
        history = rt.memory.history(fact_id)
        if not history:
            raise click.ClickException(f"no fact {fact_id} in this journal")
        lines = [f"#{e.position:<6} {when(e.data.at)}  {describe(e)}" for e in history]
        _emit(ctx, history, "\n".join(lines))


# -- runs ------------------------------------------------------------------------------------------


@main.group()
def runs() -> None:
    """Read runs and orchestrations."""


@runs.command("list")
@click.pass_context
def runs_list(ctx: click.Context) -> None:
    """List every run and orchestration, oldest first."""
    with _runtime(ctx) as rt:
        ids = rt.runs.list()
        rows: list[tuple[str, str, int]] = []
        for run_id in ids:
            first = rt.runs.history(run_id)[0]
            rows.append((run_id, first.kind, first.data.at))
        if ctx.obj["json"]:
            _emit(ctx, [{"run_id": r, "kind": k, "at": at} for r, k, at in rows])
            return
        table = Table("run", "kind", "started")
        for run_id, kind, at in rows:
            table.add_row(run_id, kind, when(at))
        Console().print(table)


@runs.command("why")
@click.argument("run_id")
@click.pass_context
def runs_why(ctx: click.Context, run_id: str) -> None:
    """Explain why a run is in its state, from its events."""
    with _runtime(ctx) as rt:
        text = _or_exit(lambda: rt.runs.why(run_id))
        _emit(ctx, {"run_id": run_id, "why": text}, text)


@runs.command("show")
@click.argument("run_id")
@click.option("--at", "position", type=int, default=None, help="Journal position to rebuild at.")
@click.pass_context
def runs_show(ctx: click.Context, run_id: str, position: int | None) -> None:
    """Show a run's plan statuses, observations and calls (now, or at a position)."""
    with _runtime(ctx) as rt:
        at = position if position is not None else rt.journal.position()
        result = _or_exit(lambda: rt.runs.at(run_id, at))
        if ctx.obj["json"]:
            _emit(ctx, result)
            return
        table = Table("step", "kind", "status", "observation", title=f"{result.run_id} at #{at}")
        observed = {o.step_id: o for o in result.observations}
        for step in result.plan.steps:
            obs = observed.get(step.id)
            note = "" if obs is None else (str(obs.output) if obs.ok else str(obs.error))
            table.add_row(step.id, f"{step.kind} {step.target}", step.status, note[:60])
        console = Console()
        console.print(table)
        console.print(
            f"calls used: {result.calls_used}; stopped for budget: {result.stopped_for_budget}; "
            f"waiting: {', '.join(result.waiting) or 'none'}",
            highlight=False,
        )


@runs.command("history")
@click.argument("run_id")
@click.pass_context
def runs_history(ctx: click.Context, run_id: str) -> None:
    """List a run's events with their positions."""
    with _runtime(ctx) as rt:
        events = _or_exit(lambda: rt.runs.history(run_id))
        lines = []
        for e in events:
            text = describe_run_event(e) or describe_orchestration_event(e) or e.kind
            lines.append(f"#{e.position:<6} {when(e.data.at)}  {text}")
        _emit(ctx, events, "\n".join(lines))


def _or_exit(read: Any) -> Any:
    try:
        return read()
    except (KeyError, ValueError) as exc:
        raise click.ClickException(str(exc).strip("'\"")) from exc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
