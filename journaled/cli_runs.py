"""``journaled runs``: list runs and orchestrations, and read why, then, diffs and history."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from journaled import cli_render as render
from journaled.cli_common import (
    call,
    check_position,
    emit,
    fail,
    json_option,
    open_runtime,
    parse_time_option,
    wants_json,
)
from journaled.events.memory_audit import when


@click.group()
def runs() -> None:
    """Read runs and orchestrations: list, why, show (then), diff, history; purge one."""


@runs.command("list")
@json_option
@click.pass_context
def runs_list(ctx: click.Context) -> None:
    """List every run and orchestration, oldest first. JSON: a list of {run_id, kind, at}."""
    with open_runtime(ctx) as rt:
        rows = []
        for run_id in rt.runs.list():
            first = rt.runs.history(run_id)[0]
            rows.append(render.RunListed(run_id=run_id, kind=first.kind, at=first.data.at))
        if wants_json(ctx):
            emit(rows)
            return
        table = Table("kind", "started")
        table.add_column("run", no_wrap=True)
        for row in rows:
            table.add_row(row.kind.split(".")[0], when(row.at), Text(render.safe(row.run_id)))
        Console().print(table)


@runs.command("why")
@click.argument("run_id")
@json_option
@click.pass_context
def runs_why(ctx: click.Context, run_id: str) -> None:
    """Explain why a run is in its state, from its events (O6). JSON: {run_id, why}."""
    with open_runtime(ctx) as rt:
        text = call(lambda: rt.runs.why(run_id))
        if wants_json(ctx):
            emit(render.RunWhy(run_id=run_id, why=text))
        else:
            render.echo(text)


@runs.command("show")
@click.argument("run_id")
@click.option("--at", "position", type=int, default=None, help="Journal position to rebuild at.")
@click.option("--at-time", default=None, help="ISO-8601 time to rebuild at (or a date).")
@json_option
@click.pass_context
def runs_show(ctx: click.Context, run_id: str, position: int | None, at_time: str | None) -> None:
    """Show a run's DAG by wave: step statuses, observations, calls and budget (O7).

    Now, at a journal position (--at), or at a time (--at-time). For an orchestration, the pass
    current then.

    JSON: an ExecuteResult {run_id, ok, plan, observations, calls_used, stopped_for_budget,
    waiting} plus {position, orchestration, status, budget, budget_stop, questions, waves,
    last_at}.
    """
    if position is not None and at_time is not None:
        fail("runs show takes at most one of --at POSITION and --at-time ISO-TIME")
    at = None if at_time is None else parse_time_option(at_time)
    with open_runtime(ctx) as rt:
        if at is not None:
            position = call(lambda: render.position_at_time(rt, run_id, at))
        elif position is None:
            position = rt.journal.position()
        position = check_position(rt, position, "--at")
        view = call(lambda: render.run_view(rt, run_id, position))
        if wants_json(ctx):
            emit(view)
            return
        render.render_run(Console(), view)


@runs.command("diff")
@click.argument("run_id")
@click.argument("a", type=int)
@click.argument("b", type=int)
@json_option
@click.pass_context
def runs_diff(ctx: click.Context, run_id: str, a: int, b: int) -> None:
    """Say what changed in a run from journal position A to B (O7).

    JSON: a RunDiff {run_id, a, b, status_changes: [{step_id, before, after}],
    new_observations: [Observation], calls_used_before, calls_used_after, waiting_before,
    waiting_after}.
    """
    with open_runtime(ctx) as rt:
        check_position(rt, a, "A")
        check_position(rt, b, "B")
        diff = call(lambda: rt.runs.diff(run_id, a, b))
        if wants_json(ctx):
            emit(diff)
        else:
            render.render_diff(Console(), diff)


@runs.command("history")
@click.argument("run_id")
@json_option
@click.pass_context
def runs_history(ctx: click.Context, run_id: str) -> None:
    """List a run's events with their positions (O6).

    JSON: a list of Event {position, stream, version, data: {type, at, ...}}.
    """
    with open_runtime(ctx) as rt:
        events = call(lambda: rt.runs.history(run_id))
        if wants_json(ctx):
            emit(events)
        else:
            render.echo(render.history_lines(events))


@runs.command("purge")
@click.argument("run_id")
@click.option("--reason", required=True, help="Why the content is erased (kept in the journal).")
@json_option
@click.pass_context
def runs_purge(ctx: click.Context, run_id: str, reason: str) -> None:
    """Erase a finished run's content from storage, keeping its events' shape (R2).

    Goal, inputs, outputs, errors, questions and answers of the run and of every run started
    under it are deleted and scrubbed from the files; statuses, times and calls stay, so why,
    history, show and diff still read (the content as [purged]). JSON: {run_id, erased}.
    """
    with open_runtime(ctx) as rt:
        erased = call(lambda: rt.runs.purge(run_id, reason))
        if wants_json(ctx):
            emit({"run_id": run_id, "erased": erased})
        else:
            render.echo(f"purged run {run_id}: the content of {erased} event(s) was erased")


@runs.command("stale")
@click.argument("run_id", required=False)
@json_option
@click.pass_context
def runs_stale(ctx: click.Context, run_id: str | None) -> None:
    """List steps whose read facts changed since (P3): superseded, deleted, purged, expired.

    Of one run, or of every run. JSON: [{run_id, step_id, fact_id, change, position,
    replacement}].
    """
    with open_runtime(ctx) as rt:
        found = call(lambda: rt.runs.stale(run_id))
        if wants_json(ctx):
            emit(found)
            return
        if not found:
            render.echo("no stale step")
        for s in found:
            by = f" by {s.replacement}" if s.replacement else ""
            render.echo(
                f"[#{s.position}] step {s.step_id!r} of run {s.run_id} read {s.fact_id}, "
                f"since {s.change}{by}"
            )


@runs.command("refresh")
@click.argument("run_id")
@json_option
@click.pass_context
def runs_refresh(ctx: click.Context, run_id: str) -> None:
    """Fork a run so its stale steps and their dependents run again (P4); print the new id.

    The new run is not executed here: `journaled` cannot call the run's tools from the command
    line; resume it with `rt.resume(NEW_ID)` in a process that registers them. JSON: {run_id,
    refreshed_from}.
    """
    with open_runtime(ctx) as rt:
        new_id = call(lambda: rt.runs.refresh(run_id))
        if wants_json(ctx):
            emit({"run_id": new_id, "refreshed_from": run_id})
        else:
            render.echo(new_id)
