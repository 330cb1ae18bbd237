"""``journaled runs``: list runs and orchestrations, and read why, then, diffs and history."""

from __future__ import annotations

import json
import math
import sys
from typing import TYPE_CHECKING

import click

import journaled
from journaled import cli_render as render
from journaled.cli_common import (
    NegativeArguments,
    call,
    check_interval,
    check_position,
    emit,
    fail,
    json_option,
    open_journal,
    open_runtime,
    organization,
    parse_time_option,
    reader_gone,
    run_summaries,
    wants_json,
)
from journaled.events.inputs import holds_infinity
from journaled.events.memory_audit import when
from journaled.events.plans import Step

if TYPE_CHECKING:
    from journaled.events.run_summaries import RunSummary


@click.group()
def runs() -> None:
    """Read runs and orchestrations: list, why, show (then), diff, history, compare; fork, purge."""


@runs.command("list")
@click.option(
    "--status",
    multiple=True,
    help="Only runs in this status (e.g. failed, running); repeat it for several.",
)
@click.option(
    "--since",
    default=None,
    help="Only runs active at or after this ISO-8601 time (a last event then, or running now).",
)
@click.option("--limit", type=int, default=None, help="Only the newest N runs.")
@json_option
@click.pass_context
def runs_list(
    ctx: click.Context, status: tuple[str, ...], since: str | None, limit: int | None
) -> None:
    """List runs and orchestrations at a glance (T2): the table newest first, JSON oldest first.

    Each with its status, goal, start, last event, steps done / total, calls used and what it
    is (a fork, a pass of an orchestration, a sub-agent's run). Reads the journal alone, from
    the run-summary projection; writes nothing.

    JSON: a list of RunSummary {run_id, kind (the first event: run.started, run.forked or
    orchestration.started), at (its time, as started_at), status, goal, started_at,
    started_position, last_event, last_at, last_position, steps_done, steps_total, calls_used,
    call_budget, wave, running, waiting, parent_run, parent_step, forked_from, forked_at,
    orchestration, pass_no, current_run}.
    """
    from journaled.events.run_summaries import check_filters, select

    after = None if since is None else parse_time_option(since)
    filters = call(lambda: check_filters(status or None, after, limit))
    with open_journal(ctx) as journal:
        found = select(run_summaries(journal).read(organization()).values(), filters)
    if wants_json(ctx):
        emit([row.as_dict() for row in found])
        return
    from rich.table import Table
    from rich.text import Text

    table = Table("goal")
    for column in ("status", "started", "last event", "steps", "calls", "what", "run"):
        table.add_column(column, no_wrap=True)
    for row in reversed(found):
        calls = f"{row.calls_used}" + ("" if row.call_budget is None else f"/{row.call_budget}")
        table.add_row(
            Text(render.one_line(render.safe(row.goal), 40)),
            Text(row.status, style=_STATUS_STYLE.get(row.status, "")),
            when(row.started_at),
            f"{row.last_event.partition('.')[2]} {when(row.last_at)}",
            f"{row.steps_done}/{row.steps_total}",
            calls,
            Text(render.safe(_what(row))),
            Text(render.safe(row.run_id)),
        )
    console = render.console()
    if not console.is_terminal:
        console.width = render.PIPED_WIDTH  # piped: whole rows for grep, never cut to 80 columns
    console.print(table)


_STATUS_STYLE = {
    "completed": "green",
    "failed": "red",
    "cancelled": "red",
    "running": "cyan",
    "interrupted": "yellow",
    "purged": "dim",
}
FOLLOW_EXIT = {
    "completed": 0,
    "dry_run": 0,
    "failed": 3,
    "cancelled": 4,
    "waiting_for_input": 5,
    "waiting_for_budget": 5,
    "waiting_for_clarification": 5,
    "waiting_for_approval": 5,
    "suspended": 6,
    "purged": 7,
    "interrupted": 8,
}
"""``runs follow`` exit status per settled status (1 and 2 stay click's: bad input, usage)."""


def _what(row: RunSummary) -> str:
    """Say what tells this run apart: a fork, a pass, a sub-agent's run, an orchestration."""
    if row.kind == "orchestration.started":
        passes = row.pass_no or 0
        return f"orchestration, {passes} pass{'' if passes == 1 else 'es'}"
    if row.forked_from is not None:
        return f"fork of {row.forked_from} at #{row.forked_at}"
    if row.orchestration is not None:
        return f"pass {row.pass_no} of {row.orchestration}"
    if row.parent_run is not None:
        return f"child of {row.parent_run} step {row.parent_step}"
    return "run"


@runs.command("follow")
@click.argument("run_id")
@click.option(
    "--interval",
    default=0.25,
    show_default=True,
    help="Longest wait between checks (a change shows as soon as it is appended).",
)
@click.option("--max-seconds", type=float, default=None, hidden=True, help="Stop after this.")
@json_option
@click.pass_context
def runs_follow(
    ctx: click.Context, run_id: str, interval: float, max_seconds: float | None
) -> None:
    """Show a run's progress live until it settles (T2): steps, calls, wave, last events.

    Follows the journal, so a run executing in any process is shown as it goes. It settles when
    it finishes, waits (for input, budget, approval or clarification), is suspended or purged,
    or is interrupted: its owner stopped without ending it (its process is gone, or silent
    past the lease); a resume carries it on (a fork not yet resumed is followed until it is
    resumed and settles).
    Exit status: 0 completed (or a dry run); 3 failed; 4 cancelled; 5 waiting; 6 suspended;
    7 purged; 8 interrupted; 1 for an unknown run; 130 when stopped by Ctrl-C before it
    settled; 0 when the reader of its output went away (`| head`).

    JSON: one RunSummary per line (JSON Lines), a line each time it changes; the last line is
    the settled state. Shape as in `runs list --json`.
    """
    from journaled.cli_follow import follow

    check_interval(interval)
    if max_seconds is not None and not 0 <= max_seconds < math.inf:
        fail(f"--max-seconds must be a finite number of seconds, 0 or more, got {max_seconds}")
    with open_journal(ctx) as journal:
        try:
            settled = follow(journal, run_id, interval, max_seconds, as_json=wants_json(ctx))
            sys.stdout.flush()  # what is still buffered meets a closed pipe here, not at exit
        except BrokenPipeError:  # the reader went away: stop quietly, as `journal tail` does
            reader_gone()
            ctx.exit(0)
    ctx.exit(130 if settled is None else FOLLOW_EXIT.get(settled.status, 1))


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
        render.render_run(render.console(), view)


# A and B as given: a negative position reaches check_position's error, not "no such option".
@runs.command("diff", cls=NegativeArguments)
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
            render.render_diff(render.console(), diff)


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
@click.argument("reason_text", metavar="[REASON]", required=False)
@click.option("--reason", default=None, help="Why the content is erased (kept in the journal).")
@json_option
@click.pass_context
def runs_purge(
    ctx: click.Context, run_id: str, reason_text: str | None, reason: str | None
) -> None:
    """Erase a finished run's content from storage, keeping its events' shape (R2).

    The reason is given as ``--reason TEXT`` or after the run id, as ``rt.runs.purge(run_id,
    reason)`` takes it. Goal, inputs, outputs, errors, questions and answers of the run and of
    every run started under it are deleted and scrubbed from the files; statuses, times and
    calls stay, so why, history, show and diff still read (the content as [purged]).
    JSON: {run_id, erased}.
    """
    if reason is not None and reason_text is not None:
        fail("give the reason once: after the run id or as --reason, not both")
    reason = reason if reason is not None else reason_text
    if reason is None:
        fail("runs purge needs a reason: `journaled runs purge RUN REASON` (or --reason REASON)")
    with open_runtime(ctx) as rt:
        erased = call(lambda: rt.runs.purge(run_id, reason))
        if wants_json(ctx):
            emit({"run_id": run_id, "erased": erased})
        else:
            render.echo(f"purged run {run_id}: the content of {erased} event(s) was erased")


def _parse_pairs(pairs: tuple[str, ...], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        step_id, sep, value = pair.partition("=")
        if not sep or not step_id:
            fail(f"{option} takes STEP=VALUE, got {pair!r}")
        if step_id in out:  # the last would win without a word: which one was meant?
            fail(f"{option} {step_id}: given more than once; give each step once")
        out[step_id] = value
    return out


_STEP_FIELDS = ("skill", "tool", "agent", "input", "depends_on")


def _replacement(step_id: str, text: str) -> Step:
    """Build the Step a ``--replace STEP=JSON`` names; without depends_on it keeps the run's."""

    def constant(name: str) -> object:
        raise ValueError(f"{name} is no JSON value")

    try:
        # Strict JSON: Python's reader takes NaN and Infinity, and reads 1e999 as infinity,
        # which the fork would journal as an input nobody gave (JSON has no such number).
        fields = json.loads(text, parse_constant=constant)
        if holds_infinity(fields):
            raise ValueError("a number out of range (JSON has no infinity)")
    except json.JSONDecodeError as exc:
        fail(f"--replace {step_id}: the definition is not JSON ({exc.msg} at {exc.pos})")
    except ValueError as exc:
        fail(f"--replace {step_id}: the definition is not JSON ({exc})")
    if not isinstance(fields, dict):
        fail(f'--replace {step_id}: the definition must be a JSON object, e.g. \'{{"tool": "t"}}\'')
    unknown = sorted(set(fields) - set(_STEP_FIELDS))
    if unknown:
        fail(
            f"--replace {step_id}: unknown field(s) {', '.join(unknown)} "
            f"(use {', '.join(_STEP_FIELDS)})"
        )
    # rt.runs.fork keeps the step's dependencies when the replacement names none (F1).
    return Step(step_id, **fields)


@runs.command("fork")
@click.argument("run_id")
@click.option("--at", "position", type=int, default=None, help="Journal position to fork at.")
@click.option("--replace", "replace", multiple=True, help="STEP=JSON: a step's new definition.")
@click.option("--answer", "answers", multiple=True, help="STEP=TEXT: answer a waiting step.")
@click.option("--budget", type=int, default=None, help="The fork's total model-call budget.")
@click.option("--run", "run_it", is_flag=True, help="Also execute it (needs its steps' code).")
@json_option
@click.pass_context
def runs_fork(
    ctx: click.Context,
    run_id: str,
    position: int | None,
    replace: tuple[str, ...],
    answers: tuple[str, ...],
    budget: int | None,
    run_it: bool,
) -> None:
    """Fork a run at a journal position into a new run, not executed; print its id (F1).

    Steps succeeded at --at keep their outputs; every other step, and each --replace'd step
    with everything downstream of it, is pending. --replace b='{"tool": "t", "input": {...}}'
    (kind, name and input may change; id and depends_on stay, kept when left out). Run the
    fork with ``rt.resume(ID)`` from the program that registers its steps' code: this command's
    process registers none, so --run only says so. JSON: {run_id, forked_from, at, ran, how}.
    """
    with open_runtime(ctx) as rt:
        if position is not None:
            check_position(rt, position, "--at")
        given = _parse_pairs(answers, "--answer")
        steps = {
            step_id: _replacement(step_id, text)
            for step_id, text in _parse_pairs(replace, "--replace").items()
        }
        new_id = call(
            lambda: rt.runs.fork(
                run_id,
                position,
                replace=steps or None,
                answers=given or None,
                call_budget=budget,
            )
        )
        at = rt.runs.lineage(new_id)[-1].at
        how = f"run it with rt.resume({new_id!r}) from the program that registers its steps"
        ran = False
        if run_it:
            state = rt.runs.state(new_id)
            try:
                rt.runs.validate(state.plan())
            except journaled.PlanRejected as exc:
                how = f"not run: {exc}; {how}"
            else:
                rt.resume(new_id)
                ran, how = True, "ran in this process"
        if wants_json(ctx):
            emit({"run_id": new_id, "forked_from": run_id, "at": at, "ran": ran, "how": how})
            return
        render.echo(new_id)
        if run_it and not ran:
            click.echo(how, err=True)


@runs.command("compare")
@click.argument("run_a")
@click.argument("run_b")
@json_option
@click.pass_context
def runs_compare(ctx: click.Context, run_a: str, run_b: str) -> None:
    """Compare two runs step by step: status and output in each, and calls used (F3).

    JSON: a RunComparison {run_a, run_b, steps: [{step_id, status_a, status_b, output_a,
    output_b, error_a, error_b, differs}], calls_used_a, calls_used_b, only_in_a, only_in_b}.
    """
    with open_runtime(ctx) as rt:
        cmp = call(lambda: rt.runs.compare(run_a, run_b))
        if wants_json(ctx):
            emit(cmp)
            return
        from rich.table import Table
        from rich.text import Text

        table = Table("step", "A", "B", "differs")
        for row in cmp.steps:
            a = f"{row.status_a or '-'} {render.one_line(_shown(row.output_a, row.error_a), 40)}"
            b = f"{row.status_b or '-'} {render.one_line(_shown(row.output_b, row.error_b), 40)}"
            table.add_row(
                Text(render.safe(row.step_id)), Text(a), Text(b), "yes" if row.differs else ""
            )
        console = render.console()
        console.print(Text(f"A: {cmp.run_a}\nB: {cmp.run_b}"))
        console.print(table)
        console.print(Text(f"calls used: A {cmp.calls_used_a}, B {cmp.calls_used_b}"))


def _shown(output: object, error: str | None) -> str:
    if error is not None:
        return f"error: {error}"
    return "" if output is None else json.dumps(output, default=str)


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
    """Fork a run just before its earliest stale step, to run again from there (P4); print its id.

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
