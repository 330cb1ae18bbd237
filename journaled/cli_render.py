"""What the ``journaled`` command line prints: JSON shapes, times, and rich rendering for people.

The JSON shapes below are the command line's stable contract for scripts: fields are only ever
added. Human output goes through rich, which colours only when the terminal supports it and honours
``NO_COLOR``; JSON never goes through rich, so it never carries ANSI codes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click
import msgspec

import journaled
from journaled.events.base import DomainEvent, Event
from journaled.events.fork import Lineage
from journaled.events.inputs import iso_ms, json_bytes
from journaled.events.memory import ConflictKeyClaimed, Fact
from journaled.events.memory_audit import describe, when
from journaled.events.plan_rules import waves
from journaled.events.plans import SKIPPED_DEPENDENCY, ExecuteResult, Observation, RunDiff, Step
from journaled.events.run_audit import describe_orchestration_event, describe_run_event
from journaled.events.runs import BudgetStopped

if TYPE_CHECKING:  # rich loads only when something is rendered (T4)
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

_NOTE_WIDTH = 60

# -- JSON shapes -----------------------------------------------------------------------------------


class FactWhy(msgspec.Struct, frozen=True, kw_only=True):
    """``memory why``: a fact's life explained from its events."""

    fact_id: str
    why: str


class RunWhy(msgspec.Struct, frozen=True, kw_only=True):
    """``runs why``: why a run is in its state, from its events."""

    run_id: str
    why: str


class MemoryAsOf(msgspec.Struct, frozen=True, kw_only=True):
    """``memory as-of``: the store as it was at a journal position or a time."""

    position: int
    """The journal position the view reflects (the last event folded into it)."""
    at: int | None
    """The time asked for (epoch ms), or None when a position was asked for."""
    query: str | None
    """The search asked for, or None for every fact stored then."""
    facts: list[Fact]


class RunView(ExecuteResult, frozen=True, kw_only=True):
    """``runs show``: an ExecuteResult rebuilt at a position, plus what people need to read it."""

    position: int
    """The journal position the run was rebuilt at."""
    orchestration: str | None
    """When RUN is an orchestration, its id; ``run_id`` is then the pass shown."""
    status: str | None
    """How the run's last pass ended by then (``completed``, ``failed``, ``stopped_for_budget``,
    ``waiting``, ``cancelled``), or None while it was running."""
    budget: int | None
    """The call budget in force then (None: unbounded)."""
    budget_stop: BudgetStopped | None
    """The budget stop (wave, estimate, used, budget) when ``stopped_for_budget``."""
    questions: dict[str, str]
    """The question each waiting step asks."""
    waves: list[list[str]]
    """Step ids by dependency wave; wave 1 first."""
    last_at: int
    """When the run's last event up to ``position`` happened, epoch ms."""
    lineage: list[Lineage] = msgspec.field(default_factory=list)
    """For a fork: the chain of runs it was forked from, root first, ending with this run (F2)."""


class TailEvent(msgspec.Struct, frozen=True, kw_only=True):
    """``journal tail``: one event of the global log (printed one JSON object per line)."""

    position: int
    stream: str
    version: int
    kind: str
    at: int
    time: str
    """``at`` as an ISO-8601 UTC time."""
    description: str
    data: DomainEvent
    """The event's payload as stored, tagged with its kind in ``type``."""


class DemoDone(msgspec.Struct, frozen=True, kw_only=True):
    """``demo``: the orchestration the story ran."""

    run_id: str


def to_json(data: object) -> str:
    """Encode a Struct, a list of them, or builtins as compact JSON (keys JSON has none for,
    in runs stored before ADR 0098, written as their repr)."""
    return json_bytes(data).decode()


# -- times -----------------------------------------------------------------------------------------


def parse_time(text: str) -> int:
    """Parse an ISO-8601 time (``Z``, an offset, or none for UTC; or a date, at 00:00 UTC) to ms.

    Raises:
        ValueError: naming the text and the accepted forms.
    """
    ms = iso_ms(text)
    if ms is None:
        raise ValueError(
            f"cannot read the time {text!r}: use ISO 8601, e.g. 2026-11-30T07:00:00Z, "
            "2026-11-30T08:00:00+01:00 or 2026-11-30"
        )
    return ms


# -- what to show ---------------------------------------------------------------------------------


def position_at_time(rt: journaled.Runtime, run_id: str, at: int) -> int:
    """Return the position of the last event of a run (its passes included) recorded by ``at``.

    Raises:
        RunNotFound: no such run.
        ValueError: the run had not begun at ``at``.
    """
    from journaled.actors.run_reads import NotBegun  # here: loaded with the runtime, not at start

    try:
        return rt.runs.position_at(run_id, at)
    except NotBegun as exc:  # said in the command line's times
        raise ValueError(
            f"run {run_id} had not begun at {when(at)} (it began at {when(exc.began)})"
        ) from None


def run_view(rt: journaled.Runtime, run_id: str, position: int) -> RunView:
    """Rebuild a run (or an orchestration's current pass) at a journal position (O7).

    Raises:
        RunNotFound: no such run.
        ValueError: the run had not begun (or not started executing) at ``position``.
    """
    result = rt.runs.at(run_id, position)
    state = rt.runs.state(result.run_id, position)
    return RunView(
        **{f: getattr(result, f) for f in result.__struct_fields__},
        position=position,
        orchestration=run_id if result.run_id != run_id else None,
        status=state.run_status,
        budget=state.budget,
        budget_stop=state.budget_stop if result.stopped_for_budget else None,
        questions={s: state.questions[s] for s in result.waiting if s in state.questions},
        waves=[[s.id for s in wave] for wave in waves(result.plan.steps)],
        last_at=state.last_at,
        lineage=rt.runs.lineage(result.run_id) if state.forked is not None else [],
    )


def events_after(rt: journaled.Runtime, after: int, end: int, limit: int) -> list[Event]:
    """Return the first ``limit`` events after a position, reading no more than needed."""
    events: list[Event] = []
    start = after
    while len(events) < limit and start < end:
        upto = min(end, start + limit - len(events))
        events += rt.journal.read(after=start, upto=upto)
        start = upto
    return events


def last_events(rt: journaled.Runtime, end: int, limit: int) -> list[Event]:
    """Return the last ``limit`` events up to ``end`` (positions may have gaps on PostgreSQL)."""
    start = max(0, end - limit)
    events = rt.journal.read(after=start, upto=end)
    while len(events) < limit and start > 0:
        start = max(0, start - 2 * limit)
        events = rt.journal.read(after=start, upto=end)
    return events[-limit:]


# -- plain lines -----------------------------------------------------------------------------------


_UNSAFE: dict[int, int] = {
    **{c: 0x2400 + c for c in range(0x20)},  # C0 controls (ESC, BEL, CR…) as control pictures
    0x7F: 0x2421,
    **dict.fromkeys(range(128, 160), 65533),  # C1 controls: CSI and OSC in one byte
    # Bidi embeddings, overrides and isolates, and line separators, can reorder or forge lines.
    **dict.fromkeys((1564, 8206, 8207, 8232, 8233), 65533),
    **dict.fromkeys(range(8234, 8239), 65533),
    **dict.fromkeys(range(8294, 8298), 65533),
}
_UNSAFE_KEEP_LINES = {k: v for k, v in _UNSAFE.items() if k not in (0x0A, 0x09)}


def safe(text: str, *, lines: bool = False) -> str:
    """Neutralise what a terminal would obey in stored text: controls, bidi overrides.

    Each such character becomes one visible stand-in (``ESC`` shows as ``␛``), so the length and
    any styling spans stay put. ``lines=True`` keeps newlines and tabs, for text whose lines are
    our own structure (stored text inside a line is flattened where it is described).
    """
    return text.translate(_UNSAFE_KEEP_LINES if lines else _UNSAFE)


def one_line(text: object, width: int | None = None) -> str:
    """Render any value on one line, cut to ``width`` characters with an ellipsis."""
    flat = safe(" ".join(str(text).split()))
    if width is not None and len(flat) > width:
        return flat[: width - 1] + "…"
    return flat


def error_message(exc: BaseException) -> str:
    """Say what an error says: a bare KeyError's key as given, not its repr; any other error
    as ``str()`` renders it (the first argument alone of a UnicodeEncodeError is ``'utf-8'``)."""
    if type(exc).__str__ is KeyError.__str__ and len(exc.args) == 1:
        return str(exc.args[0])
    return str(exc) or type(exc).__name__


def describe_event(event: Event) -> str:
    """Say in one line what any journal event records (memory, run or orchestration)."""
    data = event.data
    if isinstance(data, ConflictKeyClaimed):
        return f"fact {data.fact_id} claimed conflict key {data.conflict_key!r}"
    if event.kind.startswith("memory."):
        return one_line(describe(event).replace(f" at {when(data.at)}", "", 1))
    text = describe_run_event(event) or describe_orchestration_event(event) or event.kind
    return one_line(text)


def tail_line(event: Event) -> str:
    """Render one event as ``#position  ISO-time  stream  description``."""
    return (
        f"#{event.position:<6} {when(event.data.at)}  {event.stream:<30}  {describe_event(event)}"
    )


def tail_event(event: Event) -> TailEvent:
    """Return the JSON shape of one event of the global log."""
    return TailEvent(
        position=event.position,
        stream=event.stream,
        version=event.version,
        kind=event.kind,
        at=event.data.at,
        time=when(event.data.at),
        description=describe_event(event),
        data=event.data,
    )


def verify_lines(report: journaled.VerifyReport) -> list[str]:
    """Say in plain lines what ``journal verify`` found (R7)."""
    if report.chained_from is None:
        chain = "no digest chain yet (written by an older release): nothing is chain-checked"
    elif report.unchained:
        chain = (
            f"chain starts at position {report.chained_from}; the {report.unchained} events "
            "before it (older release) were decoded but not chain-checked"
        )
    else:
        chain = f"chain covers every event from position {report.chained_from}"
    lines = [
        f"{report.events} events read, {report.payloads} payloads checked, "
        f"{report.snapshots} snapshots checked against their events; {chain}"
    ]
    if report.problem is not None:
        problem = report.problem
        lines.append(
            f"FAILED at position {problem.position} ({problem.kind}): {one_line(problem.reason)}"
        )
    else:
        lines.append(f"ok: head digest {report.head}" if report.head else "ok")
    return lines


def history_lines(events: Sequence[Event]) -> str:
    """Render events as ``#position  ISO-time  description`` lines."""
    return "\n".join(f"#{e.position:<6} {when(e.data.at)}  {describe_event(e)}" for e in events)


def echo(text: str) -> None:
    """Print plain text for people: its lines kept, what a terminal would obey neutralised."""
    click.echo(safe(text, lines=True))


# -- rich rendering --------------------------------------------------------------------------------

_GLYPHS = {
    "succeeded": ("✓", "green"),
    "failed": ("✗", "red"),
    "skipped": ("⊘", "dim"),
    "running": ("▶", "cyan"),
    "pending": ("·", "blue"),
    "waiting": ("?", "yellow"),
}


def console(*, stderr: bool = False, soft_wrap: bool = False) -> Console:
    """Return a rich console, importing rich on first use (T4: ``--json`` never loads it).

    When the reader of its output goes away (``| head``), it raises BrokenPipeError, as
    ``click.echo`` does, instead of rich's own ``SystemExit(1)``: the commands whose exit
    status means something (``runs follow``, ``journal verify``) then keep it.
    """
    return _console_class()(stderr=stderr, soft_wrap=soft_wrap)


PIPED_WIDTH = 400
"""Width of a console whose output is piped: whole rows for grep, never cut to 80 columns."""


def table_console() -> Console:
    """Return a console for tables: on a terminal its width; piped, :data:`PIPED_WIDTH`."""
    out = console()
    if not out.is_terminal:
        out.width = PIPED_WIDTH
    return out


@functools.cache
def _console_class() -> type[Console]:
    from rich.console import Console

    class PipeAwareConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True  # nothing more is written; the caller decides how to end
            raise BrokenPipeError

    return PipeAwareConsole


def _glyph(status: str) -> tuple[str, str]:
    return _GLYPHS.get(status, ("·", ""))


def _out(console: Console, line: Text) -> None:
    """Print one line: cut with an ellipsis on a terminal, whole when piped."""
    line.plain = safe(line.plain)  # same length: the styles' spans stay where they were
    if console.is_terminal:
        console.print(line, no_wrap=True, overflow="ellipsis")
    else:
        console.print(line, soft_wrap=True)


def facts_table(facts: Sequence[Fact], title: str | None = None) -> Table:
    """Tabulate facts: id, scope, text (and what superseded it), ids never cut."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    # The id is what a reader copies into `memory why`: its column never shrinks below the
    # longest one, however narrow the screen; the text folds instead.
    longest = max((len(safe(f.id)) for f in facts), default=0)
    table.add_column("fact", no_wrap=True, min_width=longest)
    table.add_column("scope", no_wrap=True)
    table.add_column("text", overflow="fold")
    for fact in facts:
        text = Text(safe(fact.text, lines=True))
        if fact.superseded_by:
            text.append(f"\nsuperseded by {safe(fact.superseded_by)}", style="dim")
        table.add_row(Text(safe(fact.id)), Text(safe(fact.scope)), text)
    return table


def _note(obs: Observation | None, question: str | None) -> str:
    if question is not None:
        return f"waits: {question}"
    if obs is None:
        return ""
    child = f" → child run {obs.agent_task_id}" if obs.agent_task_id else ""
    if not obs.ok or obs.output is None:
        return (obs.error or "") + child
    return (obs.output if isinstance(obs.output, str) else to_json(obs.output)) + child


def _obs_status(obs: Observation) -> str:
    if obs.ok:
        return "succeeded"
    if obs.code == "agent-waiting":
        return "waiting"
    if obs.code == "cancelled" or obs.error == SKIPPED_DEPENDENCY:
        return "skipped"
    return "failed"


def _state_line(view: RunView) -> str:
    stop = view.budget_stop
    if view.stopped_for_budget and stop is not None:
        return (
            f"stopped for budget before wave {stop.wave}: it needs {stop.estimate} call(s), "
            f"{stop.used} of {stop.budget} used"
        )
    if view.waiting:
        return f"waiting for an answer: {', '.join(view.waiting)}"
    if view.suspended and view.status is None:
        return "suspended when its runtime closed — resume it to carry on"
    if view.status is None:
        return "running (or stopped mid-step)"
    return view.status.replace("_", " ")


def render_run(console: Console, view: RunView) -> None:
    """Print a run as its DAG by wave: each step with a status glyph, then calls and budget."""
    from rich.text import Text

    head = Text(f"run {view.run_id}", style="bold")
    head.append(f"  at #{view.position} (last event {when(view.last_at)})", style="dim")
    _out(console, head)
    if view.orchestration:
        _out(console, Text(f"pass of orchestration {view.orchestration}", style="dim"))
    for link in view.lineage:
        if link.forked_from is not None:
            line = f"{link.run_id} forked from {link.forked_from} at #{link.at}"
            _out(console, Text(line, style="dim"))
    _out(console, Text(f"goal: {view.plan.goal}"))
    _out(console, Text(f"state: {_state_line(view)}"))
    steps = {s.id: s for s in view.plan.steps}
    observed = {o.step_id: o for o in view.observations}
    id_width = max((len(s.id) for s in view.plan.steps), default=0)
    what_width = max((len(f"{s.kind} {s.target}") for s in view.plan.steps), default=0)
    stop_wave = view.budget_stop.wave if view.stopped_for_budget and view.budget_stop else None
    for number, wave in enumerate(view.waves, 1):
        if number == stop_wave:
            stop = f"needs {view.budget_stop.estimate} call(s)" if view.budget_stop else ""
            _out(console, Text(f"── stopped for budget here: wave {number} {stop}", style="yellow"))
        _out(console, Text(f"wave {number}", style="bold"))
        for step_id in wave:
            _out(console, _step_line(view, steps[step_id], observed, id_width, what_width))
    budget = "no budget" if view.budget is None else f"a budget of {view.budget}"
    waiting = ", ".join(view.waiting) or "none"
    _out(console, Text(f"calls used: {view.calls_used} of {budget}; waiting: {waiting}"))


def _step_line(
    view: RunView,
    step: Step,
    observed: dict[str, Observation],
    id_width: int,
    what_width: int,
) -> Text:
    from rich.text import Text

    status = "waiting" if step.id in view.waiting else step.status
    glyph, style = _glyph(status)
    note = one_line(_note(observed.get(step.id), view.questions.get(step.id)), _NOTE_WIDTH)
    line = Text("  ")
    line.append(glyph, style=style)
    line.append(f" {step.id:<{id_width}}  {f'{step.kind} {step.target}':<{what_width}}  ")
    line.append(f"{status:<9}" if note else status, style=style)
    if note:
        line.append(f"  {note}", style="dim")
    return line


def render_diff(console: Console, diff: RunDiff) -> None:
    """Print what changed in a run between two positions."""
    from rich.text import Text

    _out(console, Text(f"run {diff.run_id}: #{diff.a} → #{diff.b}", style="bold"))
    _out(console, Text(f"calls used: {diff.calls_used_before} → {diff.calls_used_after}"))
    before = ", ".join(diff.waiting_before) or "none"
    after = ", ".join(diff.waiting_after) or "none"
    _out(console, Text(f"waiting: {before} → {after}"))
    _out(console, Text("status changes:", style="bold"))
    if not diff.status_changes:
        _out(console, Text("  none", style="dim"))
    width = max((len(c.step_id) for c in diff.status_changes), default=0)
    for change in diff.status_changes:
        line = Text(f"  {change.step_id:<{width}}  ")
        line.append(change.before, style=_glyph(change.before)[1])
        line.append(" → ")
        line.append(change.after, style=_glyph(change.after)[1])
        _out(console, line)
    _out(console, Text("new observations:", style="bold"))
    if not diff.new_observations:
        _out(console, Text("  none", style="dim"))
    width = max((len(o.step_id) for o in diff.new_observations), default=0)
    for obs in diff.new_observations:
        glyph, style = _glyph(_obs_status(obs))
        line = Text("  ")
        line.append(glyph, style=style)
        line.append(f" {obs.step_id:<{width}}  {one_line(_note(obs, None), _NOTE_WIDTH)}")
        _out(console, line)
