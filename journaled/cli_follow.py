"""``journaled runs follow RUN``: a run's progress, live, until it settles (SPEC T2).

Reads the journal alone (no runtime, no actors): the run-summary projection caught up after
every append, by this or any other process, and the run's latest events.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

import click

from journaled import cli_render as render
from journaled.cli_common import organization, run_summaries
from journaled.events.memory_audit import when
from journaled.events.run_summaries import RunSummary

if TYPE_CHECKING:
    from rich.console import RenderableType

    from journaled.events.base import Event
    from journaled.events.journal import Journal

LAST_EVENTS = 5
"""How many of the run's latest events the display shows."""
_BAR_WIDTH = 40
UNSETTLED = frozenset({"running", "forked"})
"""Statuses ``runs follow`` keeps following: a fork is followed until it is resumed and settles.
``interrupted`` settles it: the run's owner stopped, and nothing more comes until a resume
(judged at each check, so it settles without an append, ADR 0088)."""


class _Events:
    """The latest events of a run (and, for an orchestration, of its current pass)."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._versions: dict[str, int] = {}
        self.lines: deque[tuple[int, str]] = deque(maxlen=LAST_EVENTS)

    def catch_up(self, summary: RunSummary) -> None:
        streams = [summary.run_id]
        if summary.current_run is not None:
            streams.append(summary.current_run)
        fresh = []
        for stream in streams:
            events = self._journal.stream(stream, after_version=self._versions.get(stream, 0))
            if events:
                self._versions[stream] = events[-1].version
            fresh += [(e.position, _line(e, e.stream != summary.run_id)) for e in events]
        self.lines.extend(sorted(fresh)[-LAST_EVENTS:])


def _line(event: Event, of_pass: bool) -> str:
    where = "pass: " if of_pass else ""
    text = f"#{event.position:<6} {when(event.data.at)}  {where}{render.describe_event(event)}"
    return render.safe(text)


def view(summary: RunSummary, lines: list[str]) -> RenderableType:
    """Build the progress display of one summary and its latest event lines."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    head = Text(f"{summary.kind.partition('.')[0]} {summary.run_id}  ", style="bold")
    head.append(summary.status, style="green" if summary.status == "completed" else "yellow")
    bar = Table.grid(padding=(0, 1))
    bar.add_row(
        ProgressBar(
            total=max(summary.steps_total, 1), completed=summary.steps_done, width=_BAR_WIDTH
        ),
        f"{summary.steps_done}/{summary.steps_total} steps",
    )
    budget = "" if summary.call_budget is None else f" of {summary.call_budget}"
    running = ", ".join(summary.running) or "none"
    waiting = ", ".join(summary.waiting) or "none"
    parts: list[RenderableType] = [
        head,
        Text(f"goal: {render.one_line(render.safe(summary.goal), 70)}"),
        bar,
        Text(f"calls used: {summary.calls_used}{budget}"),
        Text(f"wave {summary.wave}; running: {running}; waiting: {waiting}"),
    ]
    if summary.current_run is not None:
        parts.append(Text(f"pass {summary.pass_no}: {summary.current_run}", style="dim"))
    parts.append(Text("last events:", style="bold"))
    parts += [Text(f"  {line}", style="dim", no_wrap=True, overflow="ellipsis") for line in lines]
    return Group(*parts)


def follow(
    journal: Journal, run_id: str, interval: float, max_seconds: float | None, *, as_json: bool
) -> RunSummary | None:
    """Show the run until it settles; return its settled summary (None if stopped before).

    Raises:
        click.ClickException: no run or orchestration has that id.
    """
    summaries = run_summaries(journal)
    mark = journal.append_mark()  # before the read: an append in between is never missed
    mine = organization()  # another organization's run is unknown (ADR 0074)
    current = summaries.read(mine).get(run_id)
    if current is None:
        raise click.ClickException(f"no run {run_id!r} in this journal")
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    events = _Events(journal)
    console = None if as_json else render.console()
    live = None
    if console is not None and console.is_terminal:
        from rich.live import Live

        live = Live(console=console, auto_refresh=False)
        live.start()
    shown: RunSummary | None = None
    try:
        while True:
            if current != shown:
                shown = current
                if console is None:
                    click.echo(render.to_json(current.as_dict()))
                elif live is not None:
                    events.catch_up(current)
                    live.update(view(current, [line for _, line in events.lines]), refresh=True)
            if current.status not in UNSETTLED:
                if console is not None and live is None:
                    # Piped: no live display to redraw, so print the settled state once.
                    events.catch_up(current)
                    console.print(view(current, [line for _, line in events.lines]))
                return current
            wait = interval if deadline is None else min(interval, deadline - time.monotonic())
            if wait <= 0:
                return None
            journal.wait_for_appends(wait, since=mark)
            mark = journal.append_mark()
            current = summaries.read(mine)[run_id]
    except KeyboardInterrupt:
        return None
    finally:
        if live is not None:
            live.stop()
