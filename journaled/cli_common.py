"""What every ``journaled`` command shares: opening the journal, ``--json``, one-line errors."""

from __future__ import annotations

import contextlib
import difflib
import os
import sqlite3
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

import journaled
from journaled import cli_render as render
from journaled.errors import ConfigurationError
from journaled.events.errors import EventsError
from journaled.organization import resolve_organization

if TYPE_CHECKING:
    from journaled.events.journal import Journal
    from journaled.events.run_summaries import RunSummaries

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
JSON_HELP = "Print machine-readable JSON (shape in each command's help)."


def set_json(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value:
        ctx.obj["json"] = True
        fit_output(as_json=True)


def fit_output(*, as_json: bool) -> None:
    """Fit the output streams when they are not UTF-8 (``PYTHONIOENCODING=ascii``, a C locale
    without Python's UTF-8 mode), instead of failing with a traceback on the first glyph,
    arrow or stored character they cannot encode (ADR 0023): JSON, which is UTF-8 by its
    definition, is written in UTF-8 whole; plain text shows such a character as ``?``."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        reconfigure = getattr(stream, "reconfigure", None)
        if encoding in ("utf8", "") or reconfigure is None:
            continue
        with contextlib.suppress(ValueError, OSError):  # a stream that cannot be changed
            if as_json and stream is sys.stdout:
                reconfigure(encoding="utf-8")
            else:
                reconfigure(errors="replace")


def json_option(command: F) -> F:
    """Accept ``--json`` after a command as well as before it."""
    return click.option(
        "--json", is_flag=True, expose_value=False, callback=set_json, help=JSON_HELP
    )(command)


class NegativeArguments(click.Command):
    """A command whose arguments may be negative numbers (``runs diff RUN -1 2``).

    Click reads ``-1`` as an unknown option; here a word of a dash and a digit goes to the
    arguments, whose own check then names it (``A -1 is negative: ...``). Any other word that
    looks like an option and is none of the command's is still refused by name, with click's
    suggestion, instead of landing in an argument (``'--jsn' is not a valid integer``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.context_settings.setdefault("ignore_unknown_options", True)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        unknown = [] if ctx.resilient_parsing else self._unknown_options(ctx, args)
        if unknown:
            name = unknown[0].partition("=")[0]
            raise click.NoSuchOption(
                name,
                possibilities=difflib.get_close_matches(name, self._long_options(ctx)),
                ctx=ctx,
            )
        return super().parse_args(ctx, args)

    def _unknown_options(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Return the words before any ``--`` that look like options, are none of the command's
        and are not negative numbers (a dry run of the parser, which calls no callback)."""
        before = args[: args.index("--")] if "--" in args else args
        try:
            opts, rest, _ = self.make_parser(ctx).parse_args(args=list(before))
        except click.UsageError:  # e.g. an option missing its value: click's own parse says so
            return []
        words = list(rest)
        for param in self.get_params(ctx):
            if isinstance(param, click.Argument) and param.name in opts:
                value = opts[param.name]
                words += value if isinstance(value, (list, tuple)) else [value]
        return [
            word
            for word in words
            if isinstance(word, str) and len(word) > 1 and word[0] == "-" and not word[1].isdigit()
        ]

    def _long_options(self, ctx: click.Context) -> list[str]:
        return [
            opt
            for param in self.get_params(ctx)
            if isinstance(param, click.Option)
            for opt in (*param.opts, *param.secondary_opts)
            if opt.startswith("--")
        ]


def fail(message: str) -> NoReturn:
    raise click.ClickException(render.one_line(message))


LONGEST_INTERVAL = 3600.0
"""The longest wait a follower's ``--interval`` takes between checks for Ctrl-C (an hour)."""


def check_interval(interval: float) -> None:
    """Refuse an ``--interval`` that is not a number of seconds above 0 and at most an hour.

    Also refuses nan and inf: a longer wait would leave Ctrl-C unseen for that long.
    """
    if not 0 < interval <= LONGEST_INTERVAL:  # also refuses nan
        fail(
            f"--interval must be a number of seconds above 0 and at most {LONGEST_INTERVAL:g}, "
            f"got {interval}"
        )


def call(read: Callable[[], T]) -> T:
    """Run a library call, turning its errors about bad input into a one-line CLI error."""
    try:
        return read()
    except (KeyError, ValueError) as exc:
        fail(render.error_message(exc))


@contextmanager
def open_runtime(
    ctx: click.Context, *, create: bool = False, embedder: Any = None
) -> Iterator[journaled.Runtime]:
    """Open the journal; for reading (the default) a journal that does not exist is an error."""
    try:
        rt = journaled.Runtime(ctx.obj["url"], create=create, embedder=embedder)
    except (ValueError, OSError, sqlite3.Error) as exc:  # sqlite3: a file that is no journal
        fail(f"cannot open the journal: {exc}" if isinstance(exc, sqlite3.Error) else str(exc))
    except EventsError as exc:  # a full disk, a busy journal
        fail(str(exc))
    try:
        yield rt
    except EventsError as exc:  # a full disk, a busy journal, an unreadable event: one line
        fail(str(exc))
    finally:
        rt.close()


@contextmanager
def open_journal(ctx: click.Context) -> Iterator[Journal]:
    """Open the journal alone, for reading: no runtime, no actors (T4); nothing is created."""
    from journaled.events.catalog import codec
    from journaled.events.journal import Journal
    from journaled.events.url import default_url, parse_url

    url = ctx.obj["url"] or os.environ.get("JOURNALED_URL") or default_url()
    try:
        journal = Journal(parse_url(url), codec(), create=False)
    except (ValueError, OSError, sqlite3.Error) as exc:  # sqlite3: a file that is no journal
        fail(f"cannot open the journal: {exc}" if isinstance(exc, sqlite3.Error) else str(exc))
    except EventsError as exc:  # a full disk, a busy journal
        fail(str(exc))
    try:
        yield journal
    except EventsError as exc:  # a damaged or unreadable event: one line naming where, as
        fail(str(exc))  # the commands that open a runtime say it
    finally:
        journal.close()


def run_summaries(journal: Journal) -> RunSummaries:
    """Return the run-summary projection of a journal opened alone (T2), judging with the wall
    clock whether a ``running`` run's owner still executes it (``interrupted``, ADR 0088)."""
    from journaled.actors.clock import system_clock
    from journaled.actors.ownership import owner_judge
    from journaled.events.run_summaries import RunSummaries

    summaries = RunSummaries(journal)
    summaries.owner_gone = owner_judge(system_clock, _executing_here)
    return summaries


def _executing_here(run_id: str) -> bool:
    """Tell whether a runtime of this process executes or drives a run now, as a runtime's
    judge asks (ADR 0088): the command line may run inside the process that owns a run (a
    service that embeds it, a test). None does unless the actor modules were loaded, and the
    command line alone never loads them (T4)."""
    runs = sys.modules.get("journaled.actors.runs")
    orchestrator = sys.modules.get("journaled.actors.orchestrator")
    return bool(
        (runs is not None and runs.executing_in_process(run_id))
        or (orchestrator is not None and orchestrator.driven_in_process(run_id))
    )


def organization() -> str | None:
    """Return the organization the command acts for, as ``journaled.open`` takes it from the
    environment (``JOURNALED_ORGANIZATION``): the journal-only commands show only its runs."""
    try:
        return resolve_organization()
    except ConfigurationError as exc:
        fail(str(exc))


def reader_gone() -> None:
    """Point standard output at the null device once its reader went away (``| head``): what
    is still printed, and the interpreter's last flush, then go nowhere instead of raising
    BrokenPipeError again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def wants_json(ctx: click.Context) -> bool:
    return bool(ctx.obj["json"])


def emit(data: object) -> None:
    click.echo(render.to_json(data))


def check_position(rt: journaled.Runtime, position: int, name: str = "position") -> int:
    end = rt.journal.position()
    if position < 0:
        fail(f"{name} {position} is negative: give a journal position, 0 or more")
    if position > end:
        fail(f"{name} {position} is past the end of the journal (its last position is {end})")
    return position


def parse_time_option(text: str) -> int:
    return call(lambda: render.parse_time(text))
