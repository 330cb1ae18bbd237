"""The ``journaled`` command line: the demo, memory, runs, the journal and the schema.

Every command takes the global ``--url`` and ``--json``, before its name or after it, and after
its group's name (``journaled runs --json list``); a command's own ``--url`` wins over its
group's. Reading commands never create a journal; only ``memory remember``, ``runs purge``,
``memory scrub`` (and ``demo``) write. Bad input is one line on stderr and exit code 1, with
nothing written. JSON shapes are documented in each command's ``--help`` and defined in
:mod:`journaled.cli_render`.
"""

from __future__ import annotations

import logging
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from journaled import cli_render as render
from journaled.cli_common import (
    JSON_HELP,
    call,
    check_interval,
    check_position,
    emit,
    fail,
    fit_output,
    json_option,
    open_runtime,
    reader_gone,
    set_json,
    wants_json,
)
from journaled.cli_memory import memory
from journaled.cli_runs import runs
from journaled.cli_schema import schema
from journaled.events.errors import JournalFull, JournalReadOnly

if TYPE_CHECKING:
    from journaled.events.base import Event
    from journaled.subscriptions import Subscription

URL_HELP = "Journal URL (default: $JOURNALED_URL, then ./.journaled/journal.sqlite)."


@click.group()
@click.version_option(package_name="journaled")
@click.option(
    "--url", default=None, callback=lambda _ctx, _param, value: _given_url(value), help=URL_HELP
)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.pass_context
def main(ctx: click.Context, url: str | None, as_json: bool) -> None:
    """journaled: an event-sourced actor runtime for AI agents."""
    ctx.obj = {"url": url, "json": as_json}
    fit_output(as_json=as_json)


main.add_command(memory)
main.add_command(runs)
main.add_command(schema)


@main.command()
@click.option("--human-delay", default=1.5, hidden=True, help="Seconds the human takes.")
@json_option
@click.pass_context
def demo(ctx: click.Context, human_delay: float) -> None:
    """Tell a short story: memory, a budget pause, a question, why, and a stale fact refreshed.

    JSON: {run_id} of the story's orchestration; the story itself then goes to stderr.
    """
    from journaled import demo as demo_story

    console = render.console(stderr=wants_json(ctx))
    run_id = demo_story.run(ctx.obj["url"], console, human_delay=human_delay)
    if wants_json(ctx):
        emit(render.DemoDone(run_id=run_id))


def _given_url(value: str | None) -> str | None:
    """Refuse an empty ``--url`` wherever it is given: it would otherwise mean the default
    journal to some commands, an error to others, and hide a URL given earlier."""
    if value is not None and not value.strip():
        raise click.BadParameter(
            "is empty: give a journal URL, or leave --url out to use $JOURNALED_URL, then "
            "./.journaled/journal.sqlite"
        )
    return value


def _set_url(ctx: click.Context, _: click.Parameter, value: str | None) -> None:
    if _given_url(value) is not None:
        ctx.obj["url"] = value


@main.command("mcp")
@click.option("--url", expose_value=False, callback=_set_url, help=URL_HELP)
@json_option
@click.pass_context
def mcp_command(ctx: click.Context) -> None:
    """Serve memory and runs as Model Context Protocol tools over stdio (X2, ADR 0042).

    An MCP client starts this command and talks JSON-RPC on its stdin and stdout; logs go to
    stderr. Tools: memory_remember, memory_search, memory_why, memory_history, memory_as_of,
    runs_list, runs_why, runs_at, runs_stale; each result is the matching command's --json, so
    --json (accepted here as by every command) changes nothing.
    Creates the journal if needed (memory_remember writes). Ends when the client closes stdin
    (0), on Ctrl-C (130) or SIGTERM (143), once the requests already read are answered.
    Needs the extra: pip install 'journaled[mcp]'.
    """
    try:
        from journaled import mcp_server
    except ImportError as exc:
        fail(f"journaled mcp needs the mcp extra: pip install 'journaled[mcp]' ({exc})")
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="journaled mcp: %(message)s"
    )
    status = 0
    with open_runtime(ctx, create=True) as rt:
        try:
            status = mcp_server.serve(rt)
        except KeyboardInterrupt:  # Ctrl-C in a terminal: the runtime still closes, quietly
            status = 130
    if status:
        ctx.exit(status)


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
@click.option(
    "--compare",
    "other",
    metavar="RUN_B",
    default=None,
    help="Write a page comparing RUN_ID and RUN_B step by step instead (F3).",
)
@json_option
@click.pass_context
def timeline(ctx: click.Context, run_id: str, output: str, other: str | None) -> None:
    """Write a self-contained HTML timeline of a run (O7, F2), or of two compared (F3).

    JSON: {run_id, path}, with "compare": RUN_B for a compare page.
    """
    from journaled.timeline import write as write_timeline
    from journaled.timeline import write_compare

    with open_runtime(ctx) as rt:
        if other is not None:
            path = call(lambda: write_compare(rt, run_id, other, Path(output)))
            if wants_json(ctx):
                emit({"run_id": run_id, "compare": other, "path": str(path)})
            else:
                click.echo(f"wrote {path} — open it in a browser; differing steps are highlighted")
            return
        path = call(lambda: write_timeline(rt, run_id, Path(output)))
        if wants_json(ctx):
            emit({"run_id": run_id, "path": str(path)})
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

    Run it once before starting many processes on a new PostgreSQL journal. On a journal of an
    older release it also adds what the digest chain needs (R7); the events already there stay
    unchained, and `journal verify` says from which position the chain starts. JSON: {url,
    position}.
    """
    with open_runtime(ctx, create=True) as rt:
        if wants_json(ctx):
            emit({"url": rt.journal.url, "position": rt.journal.position()})
        else:
            click.echo(f"journal ready at {rt.journal.url} (position {rt.journal.position()})")


class _Unreadable(click.ClickException):
    """A journal that cannot be opened or read: exit status 2, apart from tampering's 1."""

    exit_code = 2


@journal.command("verify")
@click.option(
    "--head",
    default=None,
    help="Head digest of an earlier check, kept elsewhere: fail unless it is still in the chain.",
)
@json_option
@click.pass_context
def journal_verify(ctx: click.Context, head: str | None) -> None:
    """Check the whole journal against its digest chain (R7); exit 1 if anything is wrong.

    Exit status 2 (with a one-line error) when the journal cannot be opened or read at all: a
    missing file, a file that is not a journal, a server that refuses the connection.

    Reports the first position whose event was altered, removed, reordered or cannot be decoded,
    or whose payload was changed or deleted without an erasure; then compares every snapshot
    with the fold of the events it claims to cover (snapshot-altered). Events written by a release
    without digests come before the chain's start: they are decoded, not chain-checked, and the
    output says where the chain starts. Opens the journal alone (no runtime), creates nothing.

    JSON: {ok, events, chained_from, unchained, payloads, head, problem: {position, kind, reason}
    or null, snapshots}.
    """
    from journaled.runtime import verify as verify_journal

    try:
        report = verify_journal(ctx.obj["url"], head)
    # A full disk or a file that cannot be written: the open could not make what it needs.
    except (ValueError, OSError, sqlite3.Error, JournalFull, JournalReadOnly) as exc:
        message = f"cannot open the journal: {exc}" if isinstance(exc, sqlite3.Error) else str(exc)
        raise _Unreadable(render.one_line(message)) from exc
    try:
        if wants_json(ctx):
            emit(report)
        else:
            for line in render.verify_lines(report):
                click.echo(line)
        sys.stdout.flush()  # what is still buffered meets a closed pipe here, not at exit
    except BrokenPipeError:  # the reader went away: the exit status still tells (R7)
        reader_gone()
    if not report.ok:
        ctx.exit(1)


@journal.command("tail")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events until Ctrl-C.")
@click.option("--after", type=int, default=None, help="Start after this position (default: tail).")
@click.option("--limit", default=20, show_default=True, help="Most events to print at first.")
@click.option(
    "--name",
    default=None,
    help="With --follow: a named subscription; resume after its last printed event, and "
    "acknowledge each event once printed.",
)
@click.option(
    "--interval",
    default=0.25,
    show_default=True,
    help="Longest wait between checks for Ctrl-C (new events print as soon as appended).",
)
@click.option("--until", type=int, default=None, hidden=True, help="Stop after this position.")
@click.option("--max-seconds", type=float, default=None, hidden=True, help="Stop after this.")
@json_option
@click.pass_context
def journal_tail(
    ctx: click.Context,
    follow: bool,
    after: int | None,
    limit: int,
    name: str | None,
    interval: float,
    until: int | None,
    max_seconds: float | None,
) -> None:
    """Print the global log, one line per event: #position  time  stream  description.

    Without --after, the last --limit events; with it, the first --limit events after that
    position. --follow then subscribes to the journal (A3) and prints every new event as it is
    appended, by this or any other process (none is skipped), until Ctrl-C, which exits with
    status 0.

    --follow --name NAME is a durable consumer: it prints every event after the position NAME
    last acknowledged (or after --after, if larger), with no --limit, and acknowledges each
    event in the journal's database once printed; stopped and started again, it goes on where
    it stopped. `journal subscriptions` lists the names (ADR 0026).

    JSON: one object per line (JSON Lines): {position, stream, version, kind, at, time,
    description, data}.
    """
    if limit < 1:
        fail(f"--limit must be at least 1, got {limit}")
    check_interval(interval)
    if name is not None and not follow:
        fail("--name needs --follow: a named subscription follows the journal")
    as_json = wants_json(ctx)
    with open_runtime(ctx) as rt, _stop_signals() as stop:

        def show(event: Event) -> None:
            line = (
                render.to_json(render.tail_event(event))
                if as_json
                else render.safe(render.tail_line(event))
            )
            try:
                click.echo(line)
            except BrokenPipeError:  # the reader (`| head`) went away: stop quietly
                reader_gone()
                stop.set()

        end = rt.journal.position()
        if name is not None:
            start = 0 if after is None else check_position(rt, after, "--after")
            with call(lambda: rt.journal.subscribe(after=start, name=name)) as sub:
                _follow(sub, interval, until, max_seconds, stop, show, ack=True)
            return
        if after is None:
            backlog = render.last_events(rt, end, limit)
        else:
            backlog = render.events_after(rt, check_position(rt, after, "--after"), end, limit)
        for event in backlog:
            if until is not None and event.position > until:
                return
            show(event)
            if stop.is_set():
                return
        if follow:
            cursor = backlog[-1].position if backlog else (end if after is None else after)
            with rt.journal.subscribe(after=cursor) as sub:
                _follow(sub, interval, until, max_seconds, stop, show)


@journal.command("subscriptions")
@json_option
@click.pass_context
def journal_subscriptions(ctx: click.Context) -> None:
    """List the named subscriptions and the position each acknowledged last (A3).

    JSON: [{name, position}].
    """
    with open_runtime(ctx) as rt:
        stored = rt.journal.subscriptions()
        if wants_json(ctx):
            emit(stored)
        elif not stored:
            click.echo("no named subscriptions")
        for s in [] if wants_json(ctx) else stored:
            click.echo(f"{render.safe(s.name)}  #{s.position}")


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
    sub: Subscription,
    interval: float,
    until: int | None,
    max_seconds: float | None,
    stop: threading.Event,
    show: Callable[[Event], None],
    *,
    ack: bool = False,
) -> None:
    """Show the subscription's events until ``stop``, ``until`` or the deadline.

    Each wait lasts at most ``interval``, so a stop (Ctrl-C) is seen within it; an event is shown
    as soon as the subscription delivers it. With ``ack``, each is acknowledged once shown: a
    consumer stopped between the two shows that event again next time (at-least-once).
    """
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    while not stop.is_set() and (until is None or sub.position < until):
        wait = interval if deadline is None else min(interval, deadline - time.monotonic())
        if wait <= 0:
            return
        event = sub.poll(wait)
        if event is None:
            continue
        if until is not None and event.position > until:
            return
        show(event)
        if ack:
            sub.ack(event.position)


GROUP_URL_HELP = "Journal URL for the subcommand (its own --url wins when both are given)."
GROUP_JSON_HELP = "Print machine-readable JSON, as the subcommand's own --json does."


def _url_and_json_everywhere(group: click.Group) -> None:
    """Give every group and command ``--url`` and ``--json``, so both go after a group's name
    (``journaled runs --json list``) and after a command's (``journaled journal migrate --url
    ...``) as well as before them; a command that declares its own keeps that one. A later
    ``--url`` wins: a command's own over its group's, its group's over ``journaled --url``."""
    for command in group.commands.values():
        if isinstance(command, click.Group):
            _add_url_and_json(command, GROUP_URL_HELP, GROUP_JSON_HELP)
            _url_and_json_everywhere(command)
        else:
            _add_url_and_json(command, URL_HELP, JSON_HELP)


def _add_url_and_json(command: click.Command, url_help: str, json_help: str) -> None:
    # Each callback writes ctx.obj, the one dict every context shares; the commands' parameters
    # are processed after their group's, so the value nearest the end of the line is kept.
    names = {opt for param in command.params for opt in getattr(param, "opts", ())}
    if "--url" not in names:
        command.params.append(
            click.Option(["--url"], expose_value=False, callback=_set_url, help=url_help)
        )
    if "--json" not in names:
        command.params.append(
            click.Option(
                ["--json"], is_flag=True, expose_value=False, callback=set_json, help=json_help
            )
        )


_url_and_json_everywhere(main)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
