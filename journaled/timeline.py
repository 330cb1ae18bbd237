"""The timeline page: a run's DAG and a scrubber over its journal positions, in one HTML file (O7).

Every position's state is computed here with ``rt.runs.at`` and embedded as JSON, so the page never
re-implements the fold: it only shows what the journal says the run was at that position. The page
makes no network request (a Content-Security-Policy forbids it) and works from ``file://``.
"""

from __future__ import annotations

import html
import os
import re
from importlib import resources
from pathlib import Path
from typing import Literal

import msgspec

from journaled.events.base import Event
from journaled.events.fork import Lineage, RunComparison
from journaled.events.orchestration import (
    ApprovalRequested,
    BudgetAwaited,
    BudgetGiven,
    ClarificationGiven,
    ClarificationRequested,
    OrchestrationResumed,
    OrchestrationStarted,
    PassStarted,
    PlanApproved,
    PlanningFailed,
    PlanProposed,
    ReplanDecided,
)
from journaled.events.plan_rules import waves
from journaled.events.plans import ExecuteResult, Plan
from journaled.events.run_audit import (
    RunWhy,
    Touched,
    describe_fork,
    describe_lineage,
    describe_orchestration_event,
    describe_run_event,
    duration,
    explain_orchestration,
    explain_run,
)
from journaled.events.run_state import RunFold
from journaled.events.runs import (
    AnswersGiven,
    BudgetRaised,
    BudgetStopped,
    RunForked,
    RunResumed,
    RunStarted,
    StepFailed,
    StepRetrying,
    StepWaiting,
)
from journaled.runtime import Runtime

Flag = Literal["budget", "wait", "approval", "failed", "answer"]
_FLAGS: dict[type, Flag] = {
    BudgetStopped: "budget",
    BudgetAwaited: "budget",
    StepWaiting: "wait",
    ClarificationRequested: "wait",
    ApprovalRequested: "approval",
    PlanApproved: "approval",
    StepFailed: "failed",
    StepRetrying: "failed",
    PlanningFailed: "failed",
    AnswersGiven: "answer",
    ClarificationGiven: "answer",
    BudgetRaised: "answer",
    BudgetGiven: "answer",
    RunResumed: "answer",
}


def _flag(event: Event) -> Flag | None:
    if isinstance(event.data, OrchestrationResumed):
        return "approval" if event.data.approved is not None else "answer"
    return _FLAGS.get(type(event.data))


class Box(msgspec.Struct, frozen=True, kw_only=True):
    """One step as the graph draws it."""

    id: str
    kind: str
    target: str
    depends_on: list[str]


class Layout(msgspec.Struct, frozen=True, kw_only=True):
    """A plan split into waves: column ``i`` is wave ``i + 1``."""

    goal: str
    waves: list[list[Box]]


class Child(msgspec.Struct, frozen=True, kw_only=True):
    """The child run an agent step started, as it was at the position."""

    run: str
    summary: str


class State(msgspec.Struct, frozen=True, kw_only=True):
    """``rt.runs.at(run_id, position)``, reduced to what the page shows.

    In a :class:`Frame` the three per-step tables hold only what changed since the previous
    frame's state (``null`` where an entry went away), unless ``fresh``: then they are whole. So
    a page grows with the events, not with events times steps.
    """

    run: str
    fresh: bool = True
    """The tables are whole (the first state of a run), not changes since the previous frame."""
    statuses: dict[str, str | None]
    calls_used: int
    budget: int | None
    waiting: list[str]
    stopped_for_budget: bool
    ok: bool
    notes: dict[str, str | None]
    """Per step: the error of a failed step or the question of a waiting one."""
    children: dict[str, Child | None]


class Frame(msgspec.Struct, frozen=True, kw_only=True):
    """One journal position of the run: its event, the state after it, and the why so far."""

    position: int
    stream: str
    kind: str
    text: str
    offset: str
    """Time since the run began, e.g. ``+1.5s``."""
    flag: Flag | None
    plan: int | None
    """Index into ``Page.plans``; None before any plan was proposed."""
    state: State | None
    """None while the current pass has no run yet (an orchestration planning or waiting before
    a pass): ``rt.runs.at`` then shows the proposed plan, every step pending, nothing run."""
    keep: int = 0
    """How many leading lines of the previous frame's why this frame's why keeps."""
    why: list[int]
    """Indices into ``Page.lines``: the lines of the run's why at this position that follow the
    ``keep`` lines kept from the previous frame's."""


class Link(msgspec.Struct, frozen=True, kw_only=True):
    """One run of a fork's lineage, root first: the run and where it was forked from (F2)."""

    run_id: str
    forked_from: str | None = None
    at: int | None = None


class Fork(msgspec.Struct, frozen=True, kw_only=True):
    """Where a fork comes from and what it kept (F2): the page's lineage block and marker."""

    source: str
    at: int
    """The journal position the source was read at."""
    first: int
    """The fork's own first position (its ``run.forked``): the scrubber marks it."""
    text: str
    """The fork's ``run.forked`` described in one line."""
    carried: list[str]
    """Steps carried over from the source: succeeded there, never run here."""
    replaced: list[str]
    lineage: list[Link]


class Page(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Everything the page embeds (``fork`` only for a fork: a plain run's page is unchanged)."""

    run_id: str
    orchestration: bool
    title: str
    plans: list[Layout]
    lines: list[str]
    frames: list[Frame]
    fork: Fork | None = None


def render(rt: Runtime, run_id: str) -> str:
    """Render a run's (or an orchestration's) timeline as one self-contained HTML document.

    Args:
        rt: An open runtime whose journal holds the run.
        run_id: The run or orchestration to show.

    Returns:
        The HTML text: scripts, styles and data inline; it loads nothing from anywhere.

    Raises:
        RunNotFound: no run ``run_id`` in the journal.
    """
    page = build(rt, run_id)
    data = msgspec.json.encode(page).replace(b"<", b"\\u003c").decode()
    before, after = _TEMPLATE.split("__DATA__")  # one slot each: data cannot fill the title's
    return before.replace("__TITLE__", html.escape(page.title)) + data + after


def write(rt: Runtime, run_id: str, path: str | os.PathLike[str]) -> Path:
    """Write a run's timeline page to ``path`` (creating its folder) and return the path.

    Raises:
        RunNotFound: no run ``run_id`` in the journal.
        ValueError: the page cannot be written there.
    """
    out = Path(path)
    text = render(rt, run_id)
    _store(out, text)
    return out


def _store(out: Path, text: str) -> None:
    """Write a page, creating its folder.

    Raises:
        ValueError: it cannot be written there (a file where a folder is needed, no permission,
            a full disk), saying where and why.
    """
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot write the page to {out}: {exc.strerror or exc}") from None


def build(rt: Runtime, run_id: str) -> Page:
    """Compute every position's state, event and why for the page (what ``render`` embeds)."""
    own = rt.runs.history(run_id)
    orchestration = isinstance(own[0].data, OrchestrationStarted)
    passes = [e.data.run for e in own if isinstance(e.data, PassStarted)]
    streams = {s: rt.runs.history(s) for s in passes}
    events = sorted([*own, *(e for s in streams.values() for e in s)], key=lambda e: e.position)
    children = _child_starts(rt, {run_id, *passes}, events)
    plans: list[Layout] = []
    plan_keys: dict[tuple[object, ...], int] = {}
    line_ids: dict[str, int] = {}
    frames: list[Frame] = []
    proposed: int | None = None
    start = events[0].data.at
    # Every state and why is folded forward one event at a time, never from the start again, so
    # building the page is linear in the run's events (bar the per-step tables of each frame).
    folds = {s: RunFold() for s in (passes if orchestration else [run_id])}
    current = None if orchestration else run_id
    current_pass = 0
    lineage = rt.runs.lineage(run_id) if isinstance(own[0].data, RunForked) else []
    fork = _fork(own[0], lineage)
    chain = describe_lineage(lineage)
    why = _Why(run_id, orchestration, own, streams, line_ids, chain)
    run_plans: dict[str, int] = {}
    tables: dict[str, _Tables] = {}
    for event in events:
        if event.stream in folds:
            folds[event.stream].apply(event)
        if orchestration and event.stream == run_id:
            if isinstance(event.data, PassStarted):
                current, current_pass = event.data.run, event.data.pass_no
            elif isinstance(event.data, ReplanDecided | PlanProposed) and (
                event.data.pass_no != current_pass
            ):
                current = None  # a new pass is planned: the failed one is history (O7, R5)
        fold = folds[current] if current is not None else None
        if isinstance(event.data, PlanProposed):
            proposed = _intern_plan(event.data.plan, plans, plan_keys)
        plan, state = proposed, None
        if current is not None and fold is not None and fold.started is not None:
            if current not in run_plans:  # a run's layout never changes, only its statuses
                run_plans[current] = _intern_plan(fold.plan(), plans, plan_keys)
            plan = run_plans[current]
            if current not in tables:
                tables[current] = _Tables(fold, children.get(current, []))
            state = tables[current].frame(rt, event.position)
        keep, added = why.add(event)
        frames.append(
            Frame(
                position=event.position,
                stream=event.stream,
                kind=event.kind,
                text=_describe(event),
                offset="+" + duration(event.data.at - start),
                flag=_flag(event),
                plan=plan,
                state=state,
                keep=keep,
                why=added,
            )
        )
    # A fork's why opens with its origin, then its lineage when it is a fork of a fork (F2).
    head = rt.runs.why(run_id).splitlines()[0 if fork is None else 1 + len(chain)]
    return Page(
        run_id=run_id,
        orchestration=orchestration,
        title=head.rstrip(":"),
        plans=plans,
        lines=list(line_ids),
        frames=frames,
        fork=fork,
    )


def _fork(first: Event, lineage: list[Lineage]) -> Fork | None:
    """Describe the fork whose first event is ``first`` (``lineage``: its chain, root first),
    or None for a run started afresh."""
    data = first.data
    if not isinstance(data, RunForked):
        return None
    return Fork(
        source=data.source,
        at=data.position,
        first=first.position,
        text=_describe(first),
        carried=[c.observation.step_id for c in data.carried],
        replaced=list(data.replaced),
        lineage=[
            Link(run_id=link.run_id, forked_from=link.forked_from, at=link.at) for link in lineage
        ],
    )


class _Why:
    """The run's why after each event, as (lines kept from the previous, line ids added)."""

    def __init__(
        self,
        run_id: str,
        orchestration: bool,
        own: list[Event],
        passes: dict[str, list[Event]],
        line_ids: dict[str, int],
        lineage: list[str],
    ) -> None:
        self._run_id = run_id
        self._lineage = lineage
        """A fork of a fork's lineage lines, told after its origin (F2)."""
        self._orchestration = orchestration
        self._own = own
        self._passes = passes
        self._ids = line_ids
        self._plain = RunWhy(run_id)
        self._shown: list[int] = []
        self._told = 0
        """Timeline lines of a plain run already sent."""

    def _id(self, line: str) -> int:
        return self._ids.setdefault(line, len(self._ids))

    def add(self, event: Event) -> tuple[int, list[int]]:
        if self._orchestration:  # passes nest inside: recompute, send what differs at the end
            text = _why(self._run_id, True, self._own, self._passes, event.position)
            lines = [self._id(line) for line in text.splitlines()]
            keep = _common_prefix(self._shown, lines)
            self._shown = lines
            return keep, lines[keep:]
        self._plain.add(event)
        forked = self._plain.state.forked  # a fork's why starts with where it comes from (F2)
        top = [self._id(describe_fork(forked))] if forked is not None else []
        top += [self._id(line) for line in self._lineage] if forked is not None else []
        top.append(self._id(self._plain.head()))
        timeline = self._plain.timeline
        if self._shown == top:
            keep = len(top) + self._told
            added = [self._id(line) for line in timeline[self._told :]]
        else:
            keep, added = 0, [*top, *(self._id(line) for line in timeline)]
        self._told = len(timeline)
        added.append(self._id(self._plain.now()))
        self._shown = top  # only its top lines are compared next time; the rest is by count
        return keep, added


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _why(
    run_id: str,
    orchestration: bool,
    own: list[Event],
    passes: dict[str, list[Event]],
    position: int,
) -> str:
    """Explain the run as ``rt.runs.why`` would have, had it been asked at ``position``."""
    upto = [e for e in own if e.position <= position]
    if not orchestration:
        return explain_run(run_id, upto)

    def pass_events(stream: str) -> list[Event]:
        return [e for e in passes.get(stream, ()) if e.position <= position]

    return explain_orchestration(run_id, upto, pass_events)


def _at(rt: Runtime, run_id: str, position: int) -> ExecuteResult | None:
    try:
        return rt.runs.at(run_id, position)
    except ValueError:  # a child run not begun at this position
        return None


def _describe(event: Event) -> str:
    text = describe_run_event(event)
    if text is None:
        text = describe_orchestration_event(event)
    return text or event.kind


def _intern_plan(plan: Plan, plans: list[Layout], keys: dict[tuple[object, ...], int]) -> int:
    key = (plan.goal, *((s.id, s.target, tuple(s.depends_on)) for s in plan.steps))
    if key not in keys:
        columns = [
            [
                Box(id=s.id, kind=s.kind or "?", target=s.target, depends_on=list(s.depends_on))
                for s in wave
            ]
            for wave in waves(plan.steps)
        ]
        keys[key] = len(plans)
        plans.append(Layout(goal=plan.goal, waves=columns))
    return keys[key]


def _child_starts(
    rt: Runtime, parents: set[str], events: list[Event]
) -> dict[str, list[tuple[int, str, str]]]:
    """Map each parent run to the (position, step, child run) of the child runs it started."""
    out: dict[str, list[tuple[int, str, str]]] = {}
    for e in rt.journal.read(after=events[0].position - 1, upto=events[-1].position):
        data = e.data
        if isinstance(data, RunStarted) and data.parent_run in parents and data.parent_step:
            out.setdefault(data.parent_run, []).append((e.position, data.parent_step, e.stream))
    return out


class _Tables:
    """A run's per-step tables as the page shows them, emitted as changes frame after frame.

    The fold only ever sets single steps' statuses and appends observations (a status table
    replaced whole, as at the run's start, is taken whole), so each frame costs what its event
    changed, not the number of steps.
    """

    def __init__(self, fold: RunFold, starts: list[tuple[int, str, str]]) -> None:
        self._fold = fold
        self._starts = starts
        """(position, step, child run) of the child runs this run's steps started, in order."""
        self._next_start = 0
        self._seen = 0
        self._statuses: dict[str, str] = {}
        self._succeeded = 0
        self._notes: dict[str, str] = {}
        self._links: dict[str, str] = {}
        self._started: dict[str, str] = {}
        self._children: dict[str, Child] = {}
        self._fresh = True

    def frame(self, rt: Runtime, position: int) -> State:
        fold = self._fold
        status = fold.status
        if not isinstance(status, Touched):
            status = fold.status = Touched(status)
        statuses: dict[str, str | None] = {}
        for step_id in status.take():
            now, before = status.get(step_id), self._statuses.get(step_id)
            if now is None or now == before:
                continue
            self._succeeded += (now == "succeeded") - (before == "succeeded")
            statuses[step_id] = self._statuses[step_id] = now
        notes: dict[str, str | None] = {}
        for obs in fold.observations[self._seen :]:
            note = obs.error if not obs.ok and obs.error else None
            if self._notes.get(obs.step_id) != note:
                notes[obs.step_id] = note
                if note is None:
                    del self._notes[obs.step_id]
                else:
                    self._notes[obs.step_id] = note
            if obs.agent_task_id:
                self._links[obs.step_id] = obs.agent_task_id
        self._seen = len(fold.observations)
        starts = self._starts
        while self._next_start < len(starts) and starts[self._next_start][0] <= position:
            _, step_id, child_run = starts[self._next_start]
            self._started[step_id] = child_run
            self._next_start += 1
        children: dict[str, Child | None] = {}
        for step_id in {**self._links, **self._started}:
            run = self._started.get(step_id) or self._links[step_id]
            child = Child(run=run, summary=_summary(_at(rt, run, position)))
            if self._children.get(step_id) != child:
                children[step_id] = self._children[step_id] = child
        fresh, self._fresh = self._fresh, False
        return State(
            run=fold.run_id,
            fresh=fresh,
            statuses=statuses,
            calls_used=fold.calls_used,
            budget=fold.budget,
            waiting=list(fold.waiting),
            stopped_for_budget=fold.stopped_for_budget,
            ok=not fold.stopped_for_budget
            and not fold.waiting
            and self._succeeded == len(fold.order),
            notes=notes,
            children=children,
        )


def _summary(result: ExecuteResult | None) -> str:
    if result is None:
        return "not started yet"
    statuses = [s.status for s in result.plan.steps]
    done = f"{statuses.count('succeeded')}/{len(statuses)} steps succeeded"
    if result.waiting:
        return f"waiting for an answer · {done}"
    if result.stopped_for_budget:
        return f"stopped for budget · {done}"
    if "failed" in statuses:
        return f"failed · {done}"
    if result.ok:
        return f"completed · {done}"
    return f"in progress · {done}"


def render_compare(rt: Runtime, run_a: str, run_b: str) -> str:
    """Render two runs side by side, step by step, as one self-contained HTML document (F3).

    Per step id: the status and output in each run, the rows that differ highlighted; the calls
    used in each. The data is ``rt.runs.compare(run_a, run_b)``; the page has no script at all.

    Raises:
        RunNotFound: either run is not in the journal.
        ValueError: either run is an orchestration (compare its pass runs).
    """
    comparison = rt.runs.compare(run_a, run_b)
    relation = _relation(rt, run_a, run_b)
    return _compare_html(comparison, relation)


def write_compare(rt: Runtime, run_a: str, run_b: str, path: str | os.PathLike[str]) -> Path:
    """Write the compare page of two runs to ``path`` (creating its folder) and return the path.

    Raises:
        RunNotFound: either run is not in the journal.
        ValueError: either run is an orchestration, or the page cannot be written there.
    """
    out = Path(path)
    text = render_compare(rt, run_a, run_b)
    _store(out, text)
    return out


def _relation(rt: Runtime, run_a: str, run_b: str) -> str:
    """Say how two runs are related through forks, or "" when neither descends from the other."""
    for this, other in ((run_b, run_a), (run_a, run_b)):
        chain = rt.runs.lineage(this)
        ids = [link.run_id for link in chain]
        if other in ids[:-1]:
            steps = chain[ids.index(other) + 1 :]
            return " → ".join([other, *(f"{link.run_id} (forked at #{link.at})" for link in steps)])
    return ""


def _shown(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return msgspec.json.format(msgspec.json.encode(value), indent=2).decode()


def _cell(status: str | None, output: object, error: str | None) -> str:
    if status is None:
        return '<td class="absent" colspan="2">not in this run</td>'
    note = f'<div class="note">{html.escape(error)}</div>' if error else ""
    return (
        f'<td><span class="pill" data-status="{html.escape(status)}">{html.escape(status)}'
        f"</span></td><td><pre>{html.escape(_shown(output))}</pre>{note}</td>"
    )


def _compare_html(c: RunComparison, relation: str) -> str:
    rows = []
    for s in c.steps:
        mark = "≠" if s.differs else "="
        cls = ' class="differs"' if s.differs else ""
        rows.append(
            f'<tr data-step="{html.escape(s.step_id)}" data-differs="{str(s.differs).lower()}"'
            f"{cls}>"
            f'<th scope="row"><span class="eq">{mark}</span> {html.escape(s.step_id)}</th>'
            f"{_cell(s.status_a, s.output_a, s.error_a)}{_cell(s.status_b, s.output_b, s.error_b)}"
            "</tr>"
        )
    differing = c.differing
    summary = (
        f"{len(differing)} of {len(c.steps)} step(s) differ: {', '.join(differing)}"
        if differing
        else f"all {len(c.steps)} step(s) agree"
    )
    a, b = html.escape(c.run_a), html.escape(c.run_b)
    lineage = f'<div class="meta" id="relation">lineage: {html.escape(relation)}</div>'
    values = {
        "__TITLE__": f"compare {a} and {b}",
        "__RUN_A__": a,
        "__RUN_B__": b,
        "__CALLS_A__": str(c.calls_used_a),
        "__CALLS_B__": str(c.calls_used_b),
        "__SUMMARY__": html.escape(summary),
        "__RELATION__": lineage if relation else "",
        "__ROWS__": "\n".join(rows),
    }
    return re.sub("|".join(values), lambda m: values[m.group(0)], _COMPARE)


_COMPARE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
:root { color-scheme: light dark; --bg: #f5f6f8; --panel: #fff; --ink: #1c2128; --muted: #57606a;
  --line: #d8dee4; --succeeded: #1a7f37; --failed: #cf222e; --pending: #6e7781;
  --differs: #fff8c5; --differs-edge: #bf8700; }
@media (prefers-color-scheme: dark) { :root { --bg: #0d1117; --panel: #161b22; --ink: #e6edf3;
  --muted: #9198a1; --line: #30363d; --succeeded: #3fb950; --failed: #f85149;
  --pending: #9198a1; --differs: #3b2e05; --differs-edge: #d29922; } }
body { margin: 0; background: var(--bg); color: var(--ink);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif; }
header { padding: 14px 24px 10px; border-bottom: 1px solid var(--line); background: var(--panel); }
.brand { color: var(--muted); font-size: 12px; letter-spacing: .06em; text-transform: uppercase; }
h1 { margin: 2px 0 4px; font-size: 20px; font-weight: 650; }
.meta { color: var(--muted); }
.chips { display: flex; flex-wrap: wrap; gap: 8px; margin-top: 8px; }
.chip { padding: 3px 10px; border-radius: 12px; border: 1px solid var(--line); font-size: 13px; }
main { padding: 16px 24px 24px; }
table { width: 100%; border-collapse: collapse; background: var(--panel);
  border: 1px solid var(--line); table-layout: fixed; }
th, td { border-bottom: 1px solid var(--line); padding: 6px 8px; text-align: left;
  vertical-align: top; overflow-wrap: anywhere; }
thead th { font-size: 12px; text-transform: uppercase; letter-spacing: .05em; color: var(--muted); }
thead code { text-transform: none; letter-spacing: 0; color: var(--ink); }
col.step { width: 16%; } col.status { width: 10%; } col.out { width: 32%; }
tr.differs { background: var(--differs); box-shadow: inset 5px 0 0 var(--differs-edge); }
tr.differs .eq { color: var(--differs-edge); font-weight: 700; }
.eq { color: var(--muted); font-family: ui-monospace, monospace; }
pre { margin: 0; white-space: pre-wrap; font: 12.5px ui-monospace, SFMono-Regular, Menlo,
  Consolas, monospace; }
.pill { font-size: 11px; font-weight: 650; text-transform: uppercase; color: var(--pending); }
.pill[data-status="succeeded"] { color: var(--succeeded); }
.pill[data-status="failed"] { color: var(--failed); }
.note { color: var(--failed); font-size: 12px; margin-top: 4px; }
.absent { color: var(--muted); font-style: italic; }
</style>
</head>
<body>
<header>
  <div class="brand">journaled · compare</div>
  <h1><code>__RUN_A__</code> ↔ <code>__RUN_B__</code></h1>
  __RELATION__
  <div class="chips">
    <span class="chip" id="summary">__SUMMARY__</span>
    <span class="chip" id="calls-a">calls used in <code>__RUN_A__</code>: <b>__CALLS_A__</b></span>
    <span class="chip" id="calls-b">calls used in <code>__RUN_B__</code>: <b>__CALLS_B__</b></span>
  </div>
</header>
<main>
<table id="compare">
<colgroup><col class="step"><col class="status"><col class="out"><col class="status">
<col class="out"></colgroup>
<thead>
<tr><th scope="col">step</th><th scope="col" colspan="2"><code>__RUN_A__</code></th>
<th scope="col" colspan="2"><code>__RUN_B__</code></th></tr>
<tr><th></th><th scope="col">status</th><th scope="col">output</th><th scope="col">status</th>
<th scope="col">output</th></tr>
</thead>
<tbody>
__ROWS__
</tbody>
</table>
</main>
</body>
</html>
"""
"""The compare page, with ``__NAME__`` slots filled in one pass (so no value fills another)."""


_TEMPLATE = resources.files("journaled").joinpath("timeline.html").read_text(encoding="utf-8")
"""The page: markup, styles and script, with ``__TITLE__`` and ``__DATA__`` slots."""
