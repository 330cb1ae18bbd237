"""The timeline page: a run's DAG and a scrubber over its journal positions, in one HTML file (O7).

Every position's state is computed here with ``rt.runs.at`` and embedded as JSON, so the page never
re-implements the fold: it only shows what the journal says the run was at that position. The page
makes no network request (a Content-Security-Policy forbids it) and works from ``file://``.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Literal

import msgspec

from events.base import Event
from events.orchestration import (
    ApprovalRequested,
    BudgetAwaited,
    BudgetGiven,
    ClarificationGiven,
    ClarificationRequested,
    OrchestrationStarted,
    PassStarted,
    PlanApproved,
    PlanningFailed,
    PlanProposed,
)
from events.plan_rules import waves
from events.plans import ExecuteResult, Plan
from events.run_audit import (
    describe_orchestration_event,
    describe_run_event,
    duration,
    explain_orchestration,
    explain_run,
)
from events.runs import (
    AnswersGiven,
    BudgetRaised,
    BudgetStopped,
    RunResumed,
    RunStarted,
    StepFailed,
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
    PlanningFailed: "failed",
    AnswersGiven: "answer",
    ClarificationGiven: "answer",
    BudgetRaised: "answer",
    BudgetGiven: "answer",
    RunResumed: "answer",
}


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
    """``rt.runs.at(run_id, position)``, reduced to what the page shows."""

    run: str
    statuses: dict[str, str]
    calls_used: int
    budget: int | None
    waiting: list[str]
    stopped_for_budget: bool
    ok: bool
    notes: dict[str, str]
    """Per step: the error of a failed step or the question of a waiting one."""
    children: dict[str, Child]


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
    """None when ``rt.runs.at`` has no run yet (an orchestration before its first pass)."""
    why: list[int]
    """Indices into ``Page.lines``: the run's why up to this position, line by line."""


class Page(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the page embeds."""

    run_id: str
    orchestration: bool
    title: str
    plans: list[Layout]
    lines: list[str]
    frames: list[Frame]


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
    """
    out = Path(path)
    text = render(rt, run_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out


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
    for event in events:
        result = _at(rt, run_id, event.position)
        if isinstance(event.data, PlanProposed):
            proposed = _intern_plan(event.data.plan, plans, plan_keys)
        plan = proposed if result is None else _intern_plan(result.plan, plans, plan_keys)
        why = _why(run_id, orchestration, own, streams, event.position)
        frames.append(
            Frame(
                position=event.position,
                stream=event.stream,
                kind=event.kind,
                text=_describe(event),
                offset="+" + duration(event.data.at - start),
                flag=_FLAGS.get(type(event.data)),
                plan=plan,
                state=None if result is None else _state(rt, result, event.position, children),
                why=[line_ids.setdefault(line, len(line_ids)) for line in why.splitlines()],
            )
        )
    return Page(
        run_id=run_id,
        orchestration=orchestration,
        title=rt.runs.why(run_id).splitlines()[0].rstrip(":"),
        plans=plans,
        lines=list(line_ids),
        frames=frames,
    )


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
    except ValueError:  # an orchestration that has not started a pass yet
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
) -> dict[tuple[str, str], list[tuple[int, str]]]:
    """Map (parent run, step) to the (position, child run) of each child run it started."""
    out: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for e in rt.journal.read(after=events[0].position - 1, upto=events[-1].position):
        data = e.data
        if isinstance(data, RunStarted) and data.parent_run in parents and data.parent_step:
            out.setdefault((data.parent_run, data.parent_step), []).append((e.position, e.stream))
    return out


def _state(
    rt: Runtime,
    result: ExecuteResult,
    position: int,
    starts: dict[tuple[str, str], list[tuple[int, str]]],
) -> State:
    notes: dict[str, str] = {}
    linked: dict[str, str] = {}
    for obs in result.observations:
        notes.pop(obs.step_id, None)
        if not obs.ok and obs.error:
            notes[obs.step_id] = obs.error
        if obs.agent_task_id:
            linked[obs.step_id] = obs.agent_task_id
    for step in result.plan.steps:
        started = [run for at, run in starts.get((result.run_id, step.id), ()) if at <= position]
        if started:
            linked[step.id] = started[-1]
    children = {
        step_id: Child(run=child, summary=_summary(_at(rt, child, position)))
        for step_id, child in linked.items()
    }
    return State(
        run=result.run_id,
        statuses={s.id: s.status for s in result.plan.steps},
        calls_used=result.calls_used,
        budget=rt.runs.state(result.run_id, position).budget,
        waiting=list(result.waiting),
        stopped_for_budget=result.stopped_for_budget,
        ok=result.ok,
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


_TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
  content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
:root { color-scheme: light dark; }
:root {
  --bg: #f5f6f8; --panel: #fff; --ink: #1c2128; --muted: #57606a; --line: #d8dee4;
  --pending: #6e7781; --pending-bg: #f6f8fa; --running: #0969da; --running-bg: #ddf4ff;
  --succeeded: #1a7f37; --succeeded-bg: #dafbe1; --failed: #cf222e; --failed-bg: #ffebe9;
  --skipped: #8c959f; --skipped-bg: #eaeef2; --budget: #bc4c00; --budget-bg: #fff1e5;
  --wait: #8250df; --wait-bg: #fbefff; --approval: #0969da; --answer: #1b7c83;
  --edge: #afb8c1; --focus: #0969da;
}
@media (prefers-color-scheme: dark) {
  :root {
    --bg: #0d1117; --panel: #161b22; --ink: #e6edf3; --muted: #9198a1; --line: #30363d;
    --pending: #9198a1; --pending-bg: #1c2128; --running: #4493f8; --running-bg: #0c2d6b;
    --succeeded: #3fb950; --succeeded-bg: #0f2e1a; --failed: #f85149; --failed-bg: #3a1214;
    --skipped: #6e7681; --skipped-bg: #1c2128; --budget: #f0883e; --budget-bg: #3a2210;
    --wait: #bc8cff; --wait-bg: #2a1a45; --approval: #4493f8; --answer: #39c5cf;
    --edge: #484f58; --focus: #4493f8;
  }
}
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
  sans-serif; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono",
  monospace; font-size: 12.5px; }
header.top { padding: 14px 24px 10px; border-bottom: 1px solid var(--line);
  background: var(--panel); }
.brand { color: var(--muted); font-size: 12px; letter-spacing: .06em; text-transform: uppercase; }
h1 { margin: 2px 0 4px; font-size: 20px; font-weight: 650; }
.meta { color: var(--muted); }
.meta code { color: var(--ink); }
.scrub { position: sticky; top: 0; z-index: 5; padding: 12px 24px 8px; background: var(--panel);
  border-bottom: 1px solid var(--line); box-shadow: 0 2px 6px rgba(0,0,0,.04); }
.scrub-row { display: flex; align-items: center; gap: 12px; }
button.nav { width: 34px; height: 34px; border-radius: 8px; border: 1px solid var(--line);
  background: var(--pending-bg); color: var(--ink); font-size: 14px; cursor: pointer; }
button.nav:hover { border-color: var(--focus); }
.track { position: relative; flex: 1; height: 34px; }
#scrubber { -webkit-appearance: none; appearance: none; width: 100%; height: 34px; margin: 0;
  background: transparent; position: relative; z-index: 2; cursor: pointer; }
#scrubber::-webkit-slider-runnable-track { height: 6px; border-radius: 3px;
  background: var(--line); }
#scrubber::-webkit-slider-thumb { -webkit-appearance: none; width: 18px; height: 18px;
  margin-top: -6px; border-radius: 50%; background: var(--focus); border: 3px solid var(--panel);
  box-shadow: 0 0 0 1px var(--focus); }
#scrubber::-moz-range-track { height: 6px; border-radius: 3px; background: var(--line); }
#scrubber::-moz-range-thumb { width: 14px; height: 14px; border-radius: 50%;
  background: var(--focus); border: 3px solid var(--panel); }
#scrubber:focus-visible { outline: 2px solid var(--focus); outline-offset: 2px;
  border-radius: 6px; }
.marks { position: absolute; left: 9px; right: 9px; top: 0; bottom: 0; pointer-events: none; }
.mark { position: absolute; top: 3px; width: 4px; height: 28px; margin-left: -2px;
  border-radius: 2px; z-index: 3; opacity: .9; }
.posbox { min-width: 150px; text-align: right; }
.pos { font-size: 20px; font-weight: 700; font-variant-numeric: tabular-nums; }
.count { color: var(--muted); font-size: 12px; }
.legend { display: flex; flex-wrap: wrap; gap: 14px; margin-top: 4px; color: var(--muted);
  font-size: 12px; }
.legend .sw { display: inline-block; width: 10px; height: 10px; border-radius: 2px;
  margin-right: 5px; vertical-align: -1px; }
.legend .keys { margin-left: auto; }
kbd { border: 1px solid var(--line); border-bottom-width: 2px; border-radius: 4px;
  padding: 0 4px; font: 11px ui-monospace, monospace; background: var(--pending-bg); }
.flag-budget { background: var(--budget); } .flag-wait { background: var(--wait); }
.flag-approval { background: var(--approval); } .flag-failed { background: var(--failed); }
.flag-answer { background: var(--answer); }
.now { display: flex; flex-wrap: wrap; gap: 10px 24px; align-items: center; padding: 12px 24px; }
.event { flex: 1 1 480px; font-size: 15px; }
.kind { display: inline-block; padding: 1px 8px; margin-right: 8px; border-radius: 10px;
  background: var(--pending-bg); border: 1px solid var(--line);
  font: 12px ui-monospace, monospace; }
.kind[data-flag] { color: #fff; border-color: transparent; background: var(--flag); }
.where { color: var(--muted); font-size: 12px; margin-top: 2px; }
.stats { display: flex; flex-wrap: wrap; gap: 8px; }
.chip { padding: 3px 10px; border-radius: 12px; border: 1px solid var(--line);
  background: var(--panel); font-size: 13px; white-space: nowrap; }
.chip b { font-variant-numeric: tabular-nums; }
.chip.warn { color: var(--budget); border-color: var(--budget); background: var(--budget-bg);
  font-weight: 600; }
.chip.wait { color: var(--wait); border-color: var(--wait); background: var(--wait-bg);
  font-weight: 600; }
.chip.good { color: var(--succeeded); border-color: var(--succeeded); }
.chip.bad { color: var(--failed); border-color: var(--failed); }
main.grid { display: grid; gap: 16px; padding: 0 24px 24px;
  grid-template-columns: minmax(0, 1fr) minmax(0, 1fr);
  grid-template-areas: "graph graph" "events why"; align-items: start; }
@media (max-width: 1000px) { main.grid { grid-template-columns: 1fr;
  grid-template-areas: "graph" "why" "events"; } }
.panel { background: var(--panel); border: 1px solid var(--line); border-radius: 10px;
  padding: 12px 14px; min-width: 0; }
.panel h2 { margin: 0 0 10px; font-size: 13px; text-transform: uppercase; letter-spacing: .05em;
  color: var(--muted); font-weight: 650; }
.panel h2 span { text-transform: none; letter-spacing: 0; color: var(--ink); font-weight: 500; }
.graph-panel { grid-area: graph; } .why-panel { grid-area: why; }
.events-panel { grid-area: events; }
.notice { display: none; margin: 0 0 10px; padding: 8px 10px; border-radius: 8px;
  background: var(--pending-bg); border: 1px dashed var(--line); color: var(--muted); }
.notice.on { display: block; }
.dag { overflow-x: auto; overflow-y: hidden; padding-bottom: 4px; }
.canvas { position: relative; display: inline-flex; gap: 44px; min-width: 100%; }
.canvas svg { position: absolute; left: 0; top: 0; pointer-events: none; overflow: visible; }
.canvas svg path { fill: none; stroke: var(--edge); stroke-width: 1.6; }
.canvas svg path.from-failed { stroke: var(--failed); stroke-dasharray: 4 3; }
.canvas svg path.from-succeeded { stroke: var(--succeeded); opacity: .6; }
.col { display: flex; flex-direction: column; gap: 12px; width: 210px; flex: none; z-index: 1; }
.col h3 { margin: 0; font-size: 12px; color: var(--muted); font-weight: 600; }
.step { position: relative; border: 1px solid var(--line); border-left: 5px solid var(--pending);
  border-radius: 8px; padding: 8px 10px; background: var(--panel); }
.step .head { display: flex; justify-content: space-between; gap: 8px; align-items: baseline; }
.step .sid { font-weight: 650; overflow-wrap: anywhere; }
.pill { font-size: 11px; font-weight: 650; padding: 1px 7px; border-radius: 9px;
  text-transform: uppercase; letter-spacing: .03em; white-space: nowrap;
  color: var(--pending); background: var(--pending-bg); }
.target { color: var(--muted); font-size: 12px; }
.note, .child, .waitmark { margin-top: 6px; font-size: 12px; overflow-wrap: anywhere; }
.note { color: var(--failed); }
.child { padding: 4px 6px; border-radius: 6px; background: var(--pending-bg);
  border: 1px solid var(--line); }
.child code { font-size: 11.5px; }
.waitmark { color: var(--wait); font-weight: 650; }
.pause { display: inline-block; width: 9px; height: 10px; margin-right: 5px; vertical-align: -1px;
  border-left: 3px solid currentColor; border-right: 3px solid currentColor; }
.step[data-status="running"] { border-left-color: var(--running); background: var(--running-bg); }
.step[data-status="running"] .pill { color: #fff; background: var(--running); }
.step[data-status="succeeded"] { border-left-color: var(--succeeded); }
.step[data-status="succeeded"] .pill { color: var(--succeeded); background: var(--succeeded-bg); }
.step[data-status="failed"] { border-left-color: var(--failed); background: var(--failed-bg); }
.step[data-status="failed"] .pill { color: #fff; background: var(--failed); }
.step[data-status="skipped"] { border-left-color: var(--skipped); border-style: dashed;
  border-left-style: solid; opacity: .75; }
.step[data-status="skipped"] .sid { text-decoration: line-through; }
.step[data-status="skipped"] .pill { color: var(--skipped); background: var(--skipped-bg); }
.step[data-status="skipped"] .note { color: var(--muted); }
.step[data-waiting="true"] { box-shadow: 0 0 0 2px var(--wait); background: var(--wait-bg); }
.step[data-waiting="true"] .note { color: var(--wait); }
.step.changed { animation: flash .6s ease-out; }
@keyframes flash { from { box-shadow: 0 0 0 4px var(--focus); } }
@media (prefers-reduced-motion: reduce) { .step.changed { animation: none; } }
#why { margin: 0; max-height: 420px; overflow: auto; white-space: pre-wrap;
  overflow-wrap: anywhere; position: relative; line-height: 1.5; }
#why .line { display: block; padding: 0 4px; border-radius: 4px; }
#why .line.current { background: var(--running-bg); outline: 1px solid var(--focus); }
#why .line.head { font-weight: 700; }
#why .line.nowline { font-weight: 650; color: var(--ink); border-top: 1px solid var(--line);
  margin-top: 2px; }
.events { list-style: none; margin: 0; padding: 0; max-height: 420px; overflow: auto;
  position: relative; }
.events li { display: grid; grid-template-columns: 48px 58px 190px minmax(0, 1fr); gap: 8px;
  padding: 3px 6px; border-radius: 6px; cursor: pointer; align-items: baseline; }
.events li:hover { background: var(--pending-bg); }
.events li.future { opacity: .45; }
.events li.current { background: var(--running-bg); outline: 1px solid var(--focus); opacity: 1; }
.events li[data-flag] { box-shadow: inset 4px 0 0 var(--flag); }
.events .p { font-weight: 650; font-variant-numeric: tabular-nums; text-align: right; }
.events .o, .events .k { color: var(--muted); font: 12px ui-monospace, monospace; }
.events .k { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.events li.orch .k::before { content: "◆ "; color: var(--approval); }
</style>
</head>
<body>
<header class="top">
  <div class="brand">journaled · timeline</div>
  <h1 id="goal"></h1>
  <div class="meta" id="title"></div>
</header>
<section class="scrub" aria-label="journal position">
  <div class="scrub-row">
    <button class="nav" id="prev" type="button" title="previous event (←)">◀</button>
    <div class="track">
      <input type="range" id="scrubber" min="0" max="0" step="1" value="0"
        aria-label="journal position">
      <div class="marks" id="marks" aria-hidden="true"></div>
    </div>
    <button class="nav" id="next" type="button" title="next event (→)">▶</button>
    <div class="posbox"><div class="pos" id="pos"></div><div class="count" id="count"></div></div>
  </div>
  <div class="legend">
    <span><i class="sw flag-budget"></i>budget stop / budget wait</span>
    <span><i class="sw flag-wait"></i>waits for an answer</span>
    <span><i class="sw flag-approval"></i>approval</span>
    <span><i class="sw flag-failed"></i>failure</span>
    <span><i class="sw flag-answer"></i>answer / resume</span>
    <span class="keys"><kbd>←</kbd> <kbd>→</kbd> step · <kbd>Shift</kbd>+<kbd>←</kbd>
      <kbd>→</kbd> previous / next highlight · <kbd>Home</kbd> <kbd>End</kbd></span>
  </div>
</section>
<section class="now">
  <div class="event">
    <div><span class="kind" id="kind"></span><span id="text"></span></div>
    <div class="where" id="where"></div>
  </div>
  <div class="stats" id="stats"></div>
</section>
<main class="grid">
  <section class="panel graph-panel">
    <h2>Plan by wave <span id="plangoal"></span></h2>
    <div class="notice" id="notice"></div>
    <div class="dag"><div class="canvas" id="canvas"></div></div>
  </section>
  <section class="panel why-panel"><h2>Why, up to <span id="whypos"></span></h2>
    <pre id="why"></pre></section>
  <section class="panel events-panel"><h2>Events <span id="eventcount"></span></h2>
    <ol class="events" id="events"></ol></section>
</main>
<script type="application/json" id="timeline-data">__DATA__</script>
<script>
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("timeline-data").textContent);
  const frames = data.frames;
  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  };
  const scrubber = $("scrubber");
  const canvas = $("canvas");
  const boxes = new Map();
  const items = [];
  let shownPlan;
  let index = -1;

  const isOrch = (f) => data.orchestration && f.stream === data.run_id;
  $("title").textContent = data.title;
  $("goal").textContent = data.plans.length ? data.plans[data.plans.length - 1].goal : data.run_id;
  $("eventcount").textContent = "(" + frames.length + ")";
  scrubber.max = String(frames.length - 1);

  frames.forEach((f, i) => {
    if (f.flag) {
      const mark = el("span", "mark flag-" + f.flag);
      mark.style.left = (frames.length > 1 ? (100 * i) / (frames.length - 1) : 0) + "%";
      $("marks").appendChild(mark);
    }
    const li = el("li", isOrch(f) ? "orch" : "");
    li.dataset.position = String(f.position);
    if (f.flag) {
      li.dataset.flag = f.flag;
      li.style.setProperty("--flag", "var(--" + f.flag + ")");
    }
    li.append(el("span", "p", "#" + f.position), el("span", "o", f.offset),
      el("span", "k", f.kind), el("span", "t", f.text));
    li.title = f.kind;
    li.addEventListener("click", () => go(i));
    $("events").appendChild(li);
    items.push(li);
  });

  function renderPlan(p) {
    shownPlan = p;
    boxes.clear();
    canvas.replaceChildren();
    canvas.innerHTML = "<svg aria-hidden=\\"true\\"><g></g></svg>";
    if (p === null) {
      $("plangoal").textContent = "";
      return;
    }
    const layout = data.plans[p];
    $("plangoal").textContent = "— " + layout.goal;
    layout.waves.forEach((wave, w) => {
      const col = el("div", "col");
      col.appendChild(el("h3", null, "Wave " + (w + 1)));
      for (const step of wave) {
        const node = el("div", "step");
        node.dataset.step = step.id;
        node.dataset.status = "pending";
        node.dataset.waiting = "false";
        const head = el("div", "head");
        const pill = el("span", "pill", "pending");
        head.append(el("span", "sid", step.id), pill);
        const note = el("div", "note");
        const child = el("div", "child");
        const wait = el("div", "waitmark");
        wait.append(el("span", "pause"), "waits for an answer");
        node.append(head, el("div", "target", step.kind + " · " + step.target), wait, note, child);
        col.appendChild(node);
        boxes.set(step.id, { node, pill, note, child, wait, deps: step.depends_on });
      }
      canvas.appendChild(col);
    });
  }

  function drawEdges() {
    const g = canvas.querySelector("svg g");
    if (!g) return;
    const svg = g.parentNode;
    const base = canvas.getBoundingClientRect();
    svg.setAttribute("width", String(canvas.scrollWidth));
    svg.setAttribute("height", String(canvas.offsetHeight));
    const paths = [];
    for (const box of boxes.values()) {
      const to = box.node.getBoundingClientRect();
      for (const dep of box.deps) {
        const source = boxes.get(dep);
        if (!source) continue;
        const from = source.node.getBoundingClientRect();
        const x1 = from.right - base.left, y1 = from.top + from.height / 2 - base.top;
        const x2 = to.left - base.left, y2 = to.top + to.height / 2 - base.top;
        const mx = (x1 + x2) / 2;
        const cls = "from-" + source.node.dataset.status;
        paths.push("<path class=\\"" + cls + "\\" d=\\"M" + x1 + " " + y1 + " C" + mx + " " + y1 +
          " " + mx + " " + y2 + " " + x2 + " " + y2 + "\\"></path>");
      }
    }
    g.innerHTML = paths.join("");
  }

  function chip(cls, label, value) {
    const node = el("span", "chip " + cls, label);
    if (value !== undefined) node.appendChild(el("b", null, value));
    return node;
  }

  function paused(cls, label) {
    const node = el("span", "chip " + cls);
    node.append(el("span", "pause"), label);
    return node;
  }

  function render(i) {
    const f = frames[i];
    if (f.plan !== shownPlan) renderPlan(f.plan);
    const st = f.state;
    for (const [id, box] of boxes) {
      const status = st ? st.statuses[id] || "pending" : "pending";
      const waiting = !!st && st.waiting.includes(id);
      if (box.node.dataset.status !== status && index !== -1) {
        box.node.classList.remove("changed");
        void box.node.offsetWidth;
        box.node.classList.add("changed");
      }
      box.node.dataset.status = status;
      box.node.dataset.waiting = String(waiting);
      box.pill.textContent = status;
      box.wait.hidden = !waiting;
      const note = st && st.notes[id];
      box.note.hidden = !note;
      box.note.textContent = note || "";
      const child = st && st.children[id];
      box.child.hidden = !child;
      box.child.replaceChildren();
      if (child) {
        box.child.append("↳ child run ", el("code", null, child.run), el("br"), child.summary);
        box.child.title = "journaled timeline " + child.run + " -o " + child.run + ".html";
      }
    }
    drawEdges();
    const notice = $("notice");
    notice.classList.toggle("on", !st);
    notice.textContent = st ? "" : f.plan === null
      ? "No plan yet at this position."
      : "No pass is executing at this position: the plan below is proposed, not running.";

    $("pos").textContent = "#" + f.position;
    $("count").textContent = "event " + (i + 1) + " of " + frames.length;
    const kind = $("kind");
    kind.textContent = f.kind;
    if (f.flag) kind.dataset.flag = f.flag; else delete kind.dataset.flag;
    kind.style.setProperty("--flag", f.flag ? "var(--" + f.flag + ")" : "");
    $("text").textContent = f.text;
    $("where").textContent = f.offset + " after the start · " +
      (isOrch(f) ? "orchestration " : "run ") + f.stream;

    const stats = $("stats");
    stats.replaceChildren();
    if (st) {
      stats.append(chip("", "calls used ", st.calls_used + (st.budget === null
        ? " (no budget)" : " of " + st.budget)));
      if (st.stopped_for_budget) stats.append(paused("warn", "stopped for budget"));
      if (st.waiting.length) stats.append(paused("wait", "waiting: " + st.waiting.join(", ")));
      const statuses = Object.values(st.statuses);
      if (st.ok) stats.append(chip("good", "✓ all steps succeeded"));
      else if (statuses.includes("failed")) stats.append(chip("bad", "✗ a step failed"));
      if (data.orchestration) stats.append(chip("", "pass run ", st.run));
    } else {
      stats.append(chip("", "no run executing"));
    }

    $("whypos").textContent = "#" + f.position;
    const why = $("why");
    why.replaceChildren();
    let current = null;
    const tag = "[#" + f.position + " ";
    f.why.forEach((k, n) => {
      const text = data.lines[k];
      const line = el("span", "line", text);
      if (n === 0) line.classList.add("head");
      if (/^\\s*now: /.test(text)) line.classList.add("nowline");
      if (text.includes(tag)) { line.classList.add("current"); current = line; }
      why.append(line);
    });
    if (current) why.scrollTop = current.offsetTop - why.clientHeight / 2;

    items.forEach((li, n) => {
      li.classList.toggle("current", n === i);
      li.classList.toggle("future", n > i);
    });
    const list = $("events");
    const row = items[i];
    if (row.offsetTop < list.scrollTop || row.offsetTop + row.offsetHeight >
      list.scrollTop + list.clientHeight) list.scrollTop = row.offsetTop - list.clientHeight / 2;
    document.body.dataset.position = String(f.position);
    index = i;
  }

  function go(i) {
    const n = Math.max(0, Math.min(frames.length - 1, i));
    scrubber.value = String(n);
    render(n);
    return frames[n].position;
  }

  function jump(direction) {
    for (let n = index + direction; n >= 0 && n < frames.length; n += direction) {
      if (frames[n].flag) return go(n);
    }
    return go(direction < 0 ? 0 : frames.length - 1);
  }

  window.setPosition = function (position) {
    let n = 0;
    frames.forEach((f, k) => { if (f.position <= position) n = k; });
    return go(n);
  };
  window.timeline = { positions: frames.map((f) => f.position), jump };

  scrubber.addEventListener("input", () => render(Number(scrubber.value)));
  $("prev").addEventListener("click", () => go(index - 1));
  $("next").addEventListener("click", () => go(index + 1));
  document.addEventListener("keydown", (e) => {
    if (e.altKey || e.ctrlKey || e.metaKey) return;
    const back = e.key === "ArrowLeft" || e.key === "ArrowUp";
    const forth = e.key === "ArrowRight" || e.key === "ArrowDown";
    if (e.shiftKey && (back || forth)) jump(back ? -1 : 1);
    else if (e.target === scrubber) return;
    else if (back || forth) go(index + (back ? -1 : 1));
    else if (e.key === "Home") go(0);
    else if (e.key === "End") go(frames.length - 1);
    else return;
    e.preventDefault();
  });
  window.addEventListener("resize", drawEdges);
  go(frames.length - 1);
})();
</script>
</body>
</html>
"""
