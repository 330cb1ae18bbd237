"""The ``journaled`` command line: the demo, memory, runs and the journal, for people and scripts.

Every command takes the global ``--url`` and ``--json`` (``--json`` is accepted after the command
too). Reading commands never create a journal; only ``memory remember`` (and ``demo``) write. Bad
input is one line on stderr and exit code 1, with nothing written. JSON shapes are documented in
each command's ``--help`` and defined in :mod:`journaled.cli_render`.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TypeVar

import click
import msgspec
from rich.console import Console
from rich.table import Table

import journaled
from events.base import Event
from events.memory_audit import when
from journaled import cli_render as render
from journaled import demo as demo_story
from journaled.timeline import write as write_timeline

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
URL_HELP = "Journal URL (default: $JOURNALED_URL, then ./.journaled/journal.sqlite)."
JSON_HELP = "Print machine-readable JSON (shape in each command's help)."


@click.group()
@click.version_option(package_name="journaled")
@click.option("--url", default=None, help=URL_HELP)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.pass_context
def main(ctx: click.Context, url: str | None, as_json: bool) -> None:
    """journaled: an event-sourced actor runtime for AI agents."""
    ctx.obj = {"url": url, "json": as_json}


def _set_json(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value:
        ctx.obj["json"] = True


def json_option(command: F) -> F:
    """Accept ``--json`` after a command as well as before it."""
    return click.option(
        "--json", is_flag=True, expose_value=False, callback=_set_json, help=JSON_HELP
    )(command)


def _fail(message: str) -> NoReturn:
    raise click.ClickException(render.one_line(message))


def _call(read: Callable[[], T]) -> T:
    """Run a library call, turning its errors about bad input into a one-line CLI error."""
    try:
        return read()
    except (KeyError, ValueError) as exc:
        _fail(str(exc.args[0]) if exc.args else str(exc))


@contextmanager
def _runtime(ctx: click.Context, *, create: bool = False) -> Iterator[journaled.Runtime]:
    """Open the journal; for reading (the default) a journal that does not exist is an error."""
    try:
        rt = journaled.Runtime(ctx.obj["url"], create=create)
    except (ValueError, OSError, sqlite3.Error) as exc:  # sqlite3: a file that is no journal
        _fail(f"cannot open the journal: {exc}" if isinstance(exc, sqlite3.Error) else str(exc))
    try:
        yield rt
    finally:
        rt.close()


def _json(ctx: click.Context) -> bool:
    return bool(ctx.obj["json"])


def _emit(data: object) -> None:
    click.echo(render.to_json(data))


def _check_position(rt: journaled.Runtime, position: int, name: str = "position") -> int:
    end = rt.journal.position()
    if position < 0:
        _fail(f"{name} {position} is negative: give a journal position, 0 or more")
    if position > end:
        _fail(f"{name} {position} is past the end of the journal (its last position is {end})")
    return position


def _time(text: str) -> int:
    return _call(lambda: render.parse_time(text))


@main.command()
@click.option("--human-delay", default=1.5, hidden=True, help="Seconds the human takes.")
@json_option
@click.pass_context
def demo(ctx: click.Context, human_delay: float) -> None:
    """Tell a short story: memory, a budget pause, a question, and why each happened.

    JSON: {run_id} of the story's orchestration; the story itself then goes to stderr.
    """
    console = Console(stderr=_json(ctx))
    run_id = demo_story.run(ctx.obj["url"], console, human_delay=human_delay)
    if _json(ctx):
        _emit(render.DemoDone(run_id=run_id))


# -- memory ----------------------------------------------------------------------------------------


@main.group()
def memory() -> None:
    """Remember facts, and read the memory store now or as it was."""


@memory.command("remember")
@click.argument("text")
@click.option("--scope", default="project", show_default=True, help="Logical scope.")
@click.option("--domain", default=None, help="Domain, for search filters.")
@click.option("--key", "conflict_key", default=None, help="Conflict key: supersedes older facts.")
@click.option("--source", default=None, help="Where the fact comes from.")
@click.option("--confidence", type=float, default=None, help="Confidence in [0, 1] (default 1).")
@json_option
@click.pass_context
def memory_remember(
    ctx: click.Context,
    text: str,
    scope: str,
    domain: str | None,
    conflict_key: str | None,
    source: str | None,
    confidence: float | None,
) -> None:
    """Remember a fact (secrets redacted), superseding older facts with its conflict key.

    Creates the journal if needed.

    JSON: the stored Fact {id, scope, text, domain, confidence, conflict_key, source,
    valid_from, valid_until, created_at, superseded_by, supersedes}.
    """
    with _runtime(ctx, create=True) as rt:
        fact = _call(
            lambda: rt.memory.remember(
                text,
                scope=scope,
                domain=domain,
                confidence=confidence,
                conflict_key=conflict_key,
                source=source,
            )
        )
        if _json(ctx):
            _emit(fact)
            return
        line = f"remembered {fact.id} in scope {fact.scope!r}"
        if fact.supersedes:
            line += f", superseding {', '.join(fact.supersedes)}"
        if fact.text != text:
            line += " (secrets were redacted)"
        click.echo(line)


@memory.command("search")
@click.argument("query")
@click.option("--limit", default=10, show_default=True)
@click.option("--scope", "scopes", multiple=True, help="Logical scope to keep (repeatable).")
@json_option
@click.pass_context
def memory_search(ctx: click.Context, query: str, limit: int, scopes: tuple[str, ...]) -> None:
    """Search facts valid now by BM25. JSON: a list of Fact, best first."""
    with _runtime(ctx) as rt:
        facts = _call(lambda: rt.memory.search(query, scopes=list(scopes) or None, limit=limit))
        if _json(ctx):
            _emit(facts)
            return
        Console().print(render.facts_table(facts))


@memory.command("as-of")
@click.argument("query", required=False)
@click.option("--position", type=int, default=None, help="Journal position to view the store at.")
@click.option("--at-time", default=None, help="ISO-8601 time (2026-11-30T07:00:00Z, or a date).")
@click.option("--limit", default=10, show_default=True, help="Most search results to show.")
@json_option
@click.pass_context
def memory_as_of(
    ctx: click.Context, query: str | None, position: int | None, at_time: str | None, limit: int
) -> None:
    """Show every fact stored then, or search as the store would have then (M12).

    Give exactly one of --position and --at-time.

    JSON: {position, at, query, facts: [Fact]}.
    """
    if (position is None) == (at_time is None):
        _fail("memory as-of takes exactly one of --position N and --at-time ISO-TIME")
    at = None if at_time is None else _time(at_time)
    with _runtime(ctx) as rt:
        if position is not None:
            _check_position(rt, position)
        view = _call(lambda: rt.memory.as_of(position=position, at=at))
        facts = view.all() if query is None else _call(lambda: view.search(query, limit=limit))
        if _json(ctx):
            _emit(render.MemoryAsOf(position=view.position, at=at, query=query, facts=facts))
            return
        then = f"#{view.position}" + ("" if at is None else f" ({when(at)})")
        title = f"memory as of {then}" + ("" if query is None else f": search {query!r}")
        Console().print(render.facts_table(facts, title=title))


@memory.command("show")
@click.argument("fact_id")
@json_option
@click.pass_context
def memory_show(ctx: click.Context, fact_id: str) -> None:
    """Show one fact. JSON: the Fact."""
    with _runtime(ctx) as rt:
        fact = rt.memory.get(fact_id)
        if fact is None:
            _fail(f"no fact {fact_id} in this journal (deleted or unknown)")
        text = render.to_json(fact)
        click.echo(text if _json(ctx) else msgspec.json.format(text))


@memory.command("why")
@click.argument("fact_id")
@json_option
@click.pass_context
def memory_why(ctx: click.Context, fact_id: str) -> None:
    """Explain a fact's life from its events (M11). JSON: {fact_id, why}."""
    with _runtime(ctx) as rt:
        if not rt.memory.history(fact_id):
            _fail(f"no fact {fact_id} in this journal")
        why = rt.memory.why(fact_id)
        if _json(ctx):
            _emit(render.FactWhy(fact_id=fact_id, why=why))
        else:
            click.echo(why)


@memory.command("history")
@click.argument("fact_id")
@json_option
@click.pass_context
def memory_history(ctx: click.Context, fact_id: str) -> None:
    """List a fact's events with their positions (M11).

    JSON: a list of Event {position, stream, version, data: {type, at, ...}}.
    """
    with _runtime(ctx) as rt:
        history = rt.memory.history(fact_id)
        if not history:
            _fail(f"no fact {fact_id} in this journal")
        if _json(ctx):
            _emit(history)
        else:
            click.echo(render.history_lines(history))


# -- runs ------------------------------------------------------------------------------------------


@main.group()
def runs() -> None:
    """Read runs and orchestrations: list, why, show (then), diff, history."""


@runs.command("list")
@json_option
@click.pass_context
def runs_list(ctx: click.Context) -> None:
    """List every run and orchestration, oldest first. JSON: a list of {run_id, kind, at}."""
    with _runtime(ctx) as rt:
        rows = []
        for run_id in rt.runs.list():
            first = rt.runs.history(run_id)[0]
            rows.append(render.RunListed(run_id=run_id, kind=first.kind, at=first.data.at))
        if _json(ctx):
            _emit(rows)
            return
        table = Table("kind", "started")
        table.add_column("run", no_wrap=True)
        for row in rows:
            table.add_row(row.kind.split(".")[0], when(row.at), row.run_id)
        Console().print(table)


@runs.command("why")
@click.argument("run_id")
@json_option
@click.pass_context
def runs_why(ctx: click.Context, run_id: str) -> None:
    """Explain why a run is in its state, from its events (O6). JSON: {run_id, why}."""
    with _runtime(ctx) as rt:
        text = _call(lambda: rt.runs.why(run_id))
        if _json(ctx):
            _emit(render.RunWhy(run_id=run_id, why=text))
        else:
            click.echo(text)


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
        _fail("runs show takes at most one of --at POSITION and --at-time ISO-TIME")
    at = None if at_time is None else _time(at_time)
    with _runtime(ctx) as rt:
        if at is not None:
            position = _call(lambda: render.position_at_time(rt, run_id, at))
        elif position is None:
            position = rt.journal.position()
        position = _check_position(rt, position, "--at")
        view = _call(lambda: render.run_view(rt, run_id, position))
        if _json(ctx):
            _emit(view)
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
    with _runtime(ctx) as rt:
        _check_position(rt, a, "A")
        _check_position(rt, b, "B")
        diff = _call(lambda: rt.runs.diff(run_id, a, b))
        if _json(ctx):
            _emit(diff)
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
    with _runtime(ctx) as rt:
        events = _call(lambda: rt.runs.history(run_id))
        if _json(ctx):
            _emit(events)
        else:
            click.echo(render.history_lines(events))


# -- journal ---------------------------------------------------------------------------------------


@main.command()
@click.argument("run_id")
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(dir_okay=False),
    required=True,
    help="The HTML file to write.",
)
@json_option
@click.pass_context
def timeline(ctx: click.Context, run_id: str, output: str) -> None:
    """Write a self-contained HTML timeline of a run (O7). JSON: {run_id, path}."""
    with _runtime(ctx) as rt:
        path = _call(lambda: write_timeline(rt, run_id, Path(output)))
        if _json(ctx):
            _emit({"run_id": run_id, "path": str(path)})
        else:
            click.echo(f"wrote {path} — open it in a browser; arrows move through the journal")


@main.group()
def journal() -> None:
    """Read the journal's one global log."""


@journal.command("migrate")
@json_option
@click.pass_context
def journal_migrate(ctx: click.Context) -> None:
    """Create the journal's tables if missing (idempotent; safe from many processes at once).

    Run it once before starting many processes on a new PostgreSQL journal. JSON: {url, position}.
    """
    with _runtime(ctx, create=True) as rt:
        if _json(ctx):
            _emit({"url": rt.journal.url, "position": rt.journal.position()})
        else:
            click.echo(f"journal ready at {rt.journal.url} (position {rt.journal.position()})")


@journal.command("tail")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events until Ctrl-C.")
@click.option("--after", type=int, default=None, help="Start after this position (default: tail).")
@click.option("--limit", default=20, show_default=True, help="Most events to print at first.")
@click.option("--interval", default=1.0, show_default=True, help="Seconds between polls.")
@click.option("--until", type=int, default=None, hidden=True, help="Stop after this position.")
@click.option("--max-seconds", type=float, default=None, hidden=True, help="Stop after this.")
@json_option
@click.pass_context
def journal_tail(
    ctx: click.Context,
    follow: bool,
    after: int | None,
    limit: int,
    interval: float,
    until: int | None,
    max_seconds: float | None,
) -> None:
    """Print the global log, one line per event: #position  time  stream  description.

    Without --after, the last --limit events; with it, the first --limit events after that
    position. --follow then polls every --interval seconds and prints every new event (none is
    skipped) until Ctrl-C.

    JSON: one object per line (JSON Lines): {position, stream, version, kind, at, time,
    description, data}.
    """
    if limit < 1:
        _fail(f"--limit must be at least 1, got {limit}")
    if interval <= 0:
        _fail(f"--interval must be a positive number of seconds, got {interval}")
    as_json = _json(ctx)
    with _runtime(ctx) as rt, _stop_signals() as stop:

        def show(event: Event) -> None:
            line = render.to_json(render.tail_event(event)) if as_json else render.tail_line(event)
            try:
                click.echo(line)
            except BrokenPipeError:  # the reader (`| head`) went away: stop quietly
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                stop.set()

        end = rt.journal.position()
        if after is None:
            backlog = render.last_events(rt, end, limit)
        else:
            backlog = render.events_after(rt, _check_position(rt, after, "--after"), end, limit)
        for event in backlog:
            if until is not None and event.position > until:
                return
            show(event)
            if stop.is_set():
                return
        if follow:
            cursor = backlog[-1].position if backlog else (end if after is None else after)
            _follow(rt, cursor, interval, until, max_seconds, stop, show)


@contextmanager
def _stop_signals() -> Iterator[threading.Event]:
    """Yield an event set by SIGINT or SIGTERM (main thread only); restore the handlers."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handle(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _follow(
    rt: journaled.Runtime,
    last: int,
    interval: float,
    until: int | None,
    max_seconds: float | None,
    stop: threading.Event,
    show: Callable[[Event], None],
) -> None:
    """Poll for events after ``last`` and show them until ``stop``, ``until`` or the deadline."""
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    while not stop.is_set() and (until is None or last < until):
        for event in rt.journal.read(after=last, upto=until):
            show(event)
            last = event.position
            if stop.is_set():
                return
        wait = interval if deadline is None else min(interval, deadline - time.monotonic())
        if wait <= 0:
            return
        stop.wait(wait)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
