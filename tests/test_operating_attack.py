"""Probes of operating journaled: runs at a glance and `runs follow` (SPEC T2), spans (T3) and
the optional extra staying optional (T4), from an operator's side: other processes, SIGKILL,
purges, retries, resumes elsewhere, collectors that fail."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from run_mix import expected, listed
from test_timetravel_attack import _journal

import journaled
import journaled.otel
from journaled import AgentContext, AgentResult, NeedsInput, Plan, Step
from journaled.events.journal import Journal
from journaled.events.run_summaries import SUMMARIES_KEY, TOPICS, RunSummaries, _summaries, fold
from journaled.testing import ManualClock, wait_for

WAIT = 20.0
CLI = [sys.executable, "-m", "journaled.cli"]
SECRET = "sk-" + "Q9w8E7r6T5y4U3i2O1p0A9s8D7f6G5h4"


# -- helpers -------------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_url(request: pytest.FixtureRequest, sqlite_url: str) -> str:
    """A journal several processes share: a SQLite file or a PostgreSQL database."""
    if request.param == "sqlite":
        return sqlite_url
    url: str = request.getfixturevalue("pg_url")
    return url


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "--url", url, *args], capture_output=True, text=True, timeout=WAIT, check=False
    )


def _cli_all(url: str, calls: Sequence[Sequence[str]]) -> list[tuple[int, str, str]]:
    """Run several CLI commands at once; return (exit status, stdout, stderr) of each."""
    procs = [_popen([*CLI, "--url", url, *args]) for args in calls]
    out = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=WAIT)
            out.append((proc.returncode, stdout, stderr))
    finally:
        for proc in procs:
            _stop(proc)
    return out


def _popen(args: Sequence[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
    )


def _follow(url: str, run_id: str, *args: str) -> subprocess.Popen[str]:
    return _popen([*CLI, "--url", url, "runs", "follow", run_id, "--json", *args])


def _stop(proc: subprocess.Popen[str]) -> None:
    """Kill a process this test started, if it still runs, and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(WAIT)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _line(proc: subprocess.Popen[str], timeout: float = WAIT) -> str:
    """Read one line of a child's stdout, failing instead of hanging past ``timeout``."""
    got: list[str] = []
    assert proc.stdout is not None
    stdout = proc.stdout
    reader = threading.Thread(target=lambda: got.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    assert got, f"no line from the child within {timeout}s"
    assert got[0], "the child closed its output"
    return got[0]


def _chain(goal: str, *tools: str) -> Plan:
    return Plan(
        goal=goal,
        steps=[
            Step(f"s{i}", tool=tool, depends_on=[f"s{i - 1}"] if i else [])
            for i, tool in enumerate(tools)
        ],
    )


def _fold_all(journal: Journal) -> dict[str, Any]:
    """Every run's summary folded from position 0, with no stored projection."""
    runs: dict[str, Any] = {}
    for event in journal.read(topics=TOPICS):
        fold(runs, event)
    return _summaries(runs)


class Traced:
    """A runtime's spans, through a real SDK provider and an in-memory exporter."""

    def __init__(self, rt: journaled.Runtime) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("the application")
        journaled.otel.instrument(rt, tracer_provider=self.provider)

    def spans(self, name: str | None = None, **attributes: Any) -> list[ReadableSpan]:
        return [
            s
            for s in self.exporter.get_finished_spans()
            if (name is None or s.name == name)
            and all(_attrs(s).get(k) == v for k, v in attributes.items())
        ]

    def one(self, name: str, **attributes: Any) -> ReadableSpan:
        found = self.spans(name, **attributes)
        assert len(found) == 1, [_attrs(s) for s in self.spans(name)]
        return found[0]


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _sid(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def _tid(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.trace_id)


def _parent(span: ReadableSpan) -> int | None:
    return None if span.parent is None else int(span.parent.span_id)


def _register_mix(rt: journaled.Runtime) -> None:
    """Tools, skills and agents the child processes below use too."""
    rt.register_tool("ok", lambda _: "done")
    rt.register_skill("think", lambda _: "thought")

    def ask(_: Step, ctx: AgentContext) -> AgentResult:
        if ctx.answer is None:
            raise NeedsInput("which one?")
        return AgentResult(output=ctx.answer, calls_used=1)

    rt.register_agent("ask", ask)


_MIX = """
import journaled
from journaled import AgentResult, NeedsInput

def register(rt):
    rt.register_tool("ok", lambda _: "done")
    rt.register_skill("think", lambda _: "thought")
    def ask(_, ctx):
        if ctx.answer is None:
            raise NeedsInput("which one?")
        return AgentResult(output=ctx.answer, calls_used=1)
    rt.register_agent("ask", ask)
"""


# -- T2: a lister beside a writer in another process --------------------------------------------

_APPENDER = (
    _MIX
    + """
import sys
url, n = sys.argv[1], int(sys.argv[2])
with journaled.open(url) as rt:
    register(rt)
    chain = lambda i: journaled.Plan(goal=f"g{i}", steps=[
        journaled.Step("a", tool="ok"), journaled.Step("b", skill="think", depends_on=["a"])])
    for i in range(n):
        if i == n // 2:
            w = rt.execute(journaled.Plan(goal="asks", steps=[journaled.Step("q", agent="ask")]))
            print("waiting", w.run_id, flush=True)
        print("done", rt.execute(chain(i)).run_id, flush=True)
    rt.resume(w.run_id, answers={"q": "that one"})
    print("resumed", w.run_id, flush=True)
"""
)


def test_a_lister_never_misses_repeats_or_lags_runs_another_process_appends(
    shared_url: str,
) -> None:
    """T2/J1/J3: while another process appends runs (and resumes one), every runs.list() of a
    warm runtime is a prefix-extension of the one before, holds no run twice, shows each run the
    other process reported finished as completed, never takes back a completed status, and ends
    equal to a fold of every run's events."""
    with journaled.open(shared_url) as rt:
        _register_mix(rt)
        seed = rt.execute(_chain("seed", "ok")).run_id
        assert [s.run_id for s in rt.runs.list()] == [seed]  # warm from here on
        writer = _popen([sys.executable, "-c", _APPENDER, shared_url, "8"])
        reported: list[tuple[str, str]] = []

        def read() -> None:
            assert writer.stdout is not None
            for line in writer.stdout:
                kind, run_id = line.split()
                reported.append((kind, run_id))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        problems: list[object] = []
        completed: set[str] = set()
        before: list[str] = []
        lists = 0
        deadline = time.monotonic() + 60
        try:
            while (writer.poll() is None or reader.is_alive()) and time.monotonic() < deadline:
                known = list(reported)  # taken before the list: all of it must show
                got = rt.runs.list()
                lists += 1
                ids = [s.run_id for s in got]
                by_id = {s.run_id: s for s in got}
                if len(set(ids)) != len(ids):
                    problems.append(("twice", ids))
                if ids[: len(before)] != before:
                    problems.append(("reordered or lost", before, ids))
                for kind, run_id in known:
                    status = by_id[run_id].status if run_id in by_id else "missing"
                    allowed = {
                        "done": {"completed"},
                        "resumed": {"completed"},
                        "waiting": {"waiting_for_input", "running", "completed"},
                    }[kind]
                    if status not in allowed:
                        problems.append(("stale", kind, run_id, status))
                for s in got:
                    if s.run_id in completed and s.status != "completed":
                        problems.append(("went back", s.run_id, s.status))
                    if s.status == "completed":
                        completed.add(s.run_id)
                before = ids
        finally:
            _stop(writer)
        reader.join(WAIT)
        assert writer.returncode == 0
        assert len(reported) == 10, reported
        assert lists > 3
        assert problems == []
        assert listed(rt) == expected(rt)
        assert len(rt.runs.list()) == 10


_RESUMER = (
    _MIX
    + """
import sys
url, waiting, budget, fork = sys.argv[1:5]
with journaled.open(url) as rt:
    register(rt)
    rt.resume(waiting, answers={"q": "the left one"})
    rt.resume(budget, call_budget=5)
    rt.resume(fork)
"""
)


def test_a_warm_projection_shows_runs_resumed_by_another_process(sqlite_url: str) -> None:
    """T2/E14/F1: runs resumed in another process (answers, a raised budget, a fork) show in a
    warm runs.list() with their new status, calls used and call budget, as a fold says."""
    with journaled.open(sqlite_url) as rt:
        _register_mix(rt)
        waiting = rt.execute(Plan(goal="asks", steps=[Step("q", agent="ask")])).run_id
        budget = rt.execute(
            Plan(
                goal="dear",
                steps=[Step("t1", skill="think"), Step("t2", skill="think", depends_on=["t1"])],
            ),
            call_budget=1,
        ).run_id
        fork = rt.runs.fork(budget, call_budget=4)
        before = {s.run_id: s for s in rt.runs.list()}
        assert (before[waiting].status, before[budget].status, before[fork].status) == (
            "waiting_for_input",
            "waiting_for_budget",
            "forked",
        )
        assert (before[fork].forked_from, before[fork].call_budget) == (budget, 4)
        done = subprocess.run(
            [sys.executable, "-c", _RESUMER, sqlite_url, waiting, budget, fork],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        after = {s.run_id: s for s in rt.runs.list()}
        assert listed(rt) == expected(rt)
        for run_id in (waiting, budget, fork):
            assert after[run_id].status == "completed"
            state = rt.runs.state(run_id)
            assert after[run_id].call_budget == state.budget
            assert after[run_id].calls_used == state.calls_used
            assert after[run_id].waiting == ()
        assert after[budget].call_budget == 5
        assert after[waiting].calls_used == 1


# -- T2: a writer SIGKILLed mid-run after it stored the projection -----------------------------

_KILLED = (
    _MIX
    + """
import sys, threading
url = sys.argv[1]
rt = journaled.open(url)
register(rt)
started = threading.Event()
def gate(_):
    started.set()
    threading.Event().wait(120)
rt.register_tool("gate", gate)
done = rt.execute(journaled.Plan(goal="earlier", steps=[journaled.Step("a", tool="ok")])).run_id
plan = journaled.Plan(goal="killed mid-run", steps=[
    journaled.Step("s0", tool="ok"), journaled.Step("s1", skill="think", depends_on=["s0"]),
    journaled.Step("s2", tool="gate", depends_on=["s1"]),
    journaled.Step("s3", tool="ok", depends_on=["s2"])])
handle = rt.start(plan)
assert started.wait(30)
assert rt.runs.summaries.save()
print(done, handle.run_id, flush=True)
threading.Event().wait(120)
"""
)


def test_a_writer_killed_mid_run_after_storing_the_projection(sqlite_url: str) -> None:
    """T2/E14: SIGKILLed mid-step right after storing the projection, a run folds as running
    with its steps done so far and lists as interrupted, its owner gone (ADR 0088); after a
    resume in another process every reader (a warm runtime, the CLI, a cold projection from the
    stored copy) shows it completed, equal to a fold."""
    child = _popen([sys.executable, "-c", _KILLED, sqlite_url])
    try:
        done, run_id = _line(child, 60).split()
    finally:
        child.send_signal(signal.SIGKILL)
        _stop(child)
    with _journal(sqlite_url) as journal:
        stored = journal.snapshot(SUMMARIES_KEY)
        assert stored is not None
        cold = RunSummaries(journal).read()
        assert cold == _fold_all(journal)
    row = cold[run_id]
    assert (row.status, row.steps_done, row.steps_total, row.running) == ("running", 2, 4, ("s2",))
    assert (row.calls_used, row.goal) == (1, "killed mid-run")
    listing = _cli(sqlite_url, "runs", "list", "--json")
    assert listing.returncode == 0, listing.stderr
    assert {r["run_id"]: r["status"] for r in json.loads(listing.stdout)} == {
        done: "completed",
        run_id: "interrupted",
    }
    with journaled.open(sqlite_url) as warm:
        assert {s.run_id: s.status for s in warm.runs.list()}[run_id] == "interrupted"
        with journaled.open(sqlite_url) as rt:
            _register_mix(rt)
            rt.register_tool("gate", lambda _: "through")
            result = rt.resume(run_id)
            assert isinstance(result, journaled.ExecuteResult)
            assert result.ok
        now = {s.run_id: s for s in warm.runs.list()}[run_id]
        assert (now.status, now.steps_done, now.running, now.calls_used) == (
            "completed",
            4,
            (),
            1,
        )
        assert listed(warm) == expected(warm)
    with _journal(sqlite_url) as journal:
        assert RunSummaries(journal).read() == _fold_all(journal)
    follow = _cli(sqlite_url, "runs", "follow", run_id, "--json")
    assert follow.returncode == 0, follow.stderr
    assert json.loads(follow.stdout.splitlines()[-1])["status"] == "completed"


# -- T2/R2: an orchestration purged with its passes and their child runs ------------------------


def test_an_orchestration_purge_reaches_every_pass_and_child_summary(sqlite_url: str) -> None:
    """T2/R2/ADR 0010: purging an orchestration shows it, each of its passes and the child run
    a pass's agent started as purged with no goal, in list(), the CLI and the stored
    projection; the goals are gone from the journal file."""
    passes = []

    def planner(goal: str, observations: object, clarifications: object) -> Plan:
        passes.append(goal)
        tool = "boom" if len(passes) == 1 else "ok"
        return Plan(
            goal="pass plan goal: orbital-laser-zeta",
            steps=[Step("a", tool=tool), Step("p", agent="parent", depends_on=["a"])],
        )

    def boom(_: object) -> str:
        raise RuntimeError("first pass fails")

    def parent(_: Step, ctx: AgentContext) -> AgentResult:
        child = ctx.execute(
            Plan(goal="child goal: quantum-heron-kappa", steps=[Step("c", tool="ok")])
        )
        return AgentResult(output=child.ok, calls_used=0)

    with journaled.open(sqlite_url) as rt:
        _register_mix(rt)
        rt.register_tool("boom", boom)
        rt.register_agent("parent", parent)
        out = rt.orchestrate("orchestration goal: velvet-comet-sigma", planner, mode="orchestrate")
        assert out.status == "completed"
        family = {s.run_id: s for s in rt.runs.list()}
        assert len(family) == 4  # the orchestration, two passes, one child run
        orchestration = family[out.run_id]
        assert orchestration.pass_no == 2
        pass_runs = [s for s in family.values() if s.orchestration == out.run_id]
        assert sorted(s.pass_no or 0 for s in pass_runs) == [1, 2]
        [child] = [s for s in family.values() if s.parent_run in {p.run_id for p in pass_runs}]
        assert child.goal == "child goal: quantum-heron-kappa"
        assert rt.runs.summaries.save()  # the stored projection holds every goal now
        assert rt.runs.purge(out.run_id, "asked to forget") > 0
        after = {s.run_id: s for s in rt.runs.list()}
        assert set(after) == set(family)
        assert {s.status for s in after.values()} == {"purged"}
        assert {s.goal for s in after.values()} == {""}
    listing = _cli(sqlite_url, "runs", "list", "--json")
    table = _cli(sqlite_url, "runs", "list")
    with _journal(sqlite_url) as journal:
        assert {s.goal for s in RunSummaries(journal).read().values()} == {""}
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    raw = b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
    for word in ("velvet-comet-sigma", "orbital-laser-zeta", "quantum-heron-kappa"):
        assert word not in listing.stdout
        assert word not in table.stdout
        assert word.encode() not in raw


# -- T2: summary fields beside the run projection ----------------------------------------------


def test_summaries_of_retries_overruns_forks_and_raised_budgets_equal_the_run_state() -> None:
    """T2/E8/R6/S2/F1: a summary's calls used, call budget, steps done / total, running,
    waiting and wave equal the run's own projection for retried skills (each attempt charged),
    an exhausted retry, an agent overrunning its reservation, a fork carrying charges with a
    new budget, and a budget raised on resume."""
    with journaled.open("memory://") as rt:
        _register_mix(rt)
        tries: dict[str, int] = {}

        def flaky(x: str) -> str:
            tries[x] = tries.get(x, 0) + 1
            if x == "never" or tries[x] < 3:
                raise RuntimeError(f"attempt {tries[x]} failed")
            return "fine"

        def greedy(_: Step, ctx: AgentContext) -> AgentResult:
            return AgentResult(output="spent", calls_used=(ctx.reservation or 0) + 3)

        rt.register_skill("flaky", flaky, retry=journaled.Retry(attempts=3, backoff=0.0))
        rt.register_agent("greedy", greedy)
        runs = [
            rt.execute(Plan(goal="retried", steps=[Step("f", skill="flaky", input="soon")])),
            rt.execute(Plan(goal="exhausted", steps=[Step("f", skill="flaky", input="never")])),
            rt.execute(
                Plan(goal="overrun", steps=[Step("g", agent="greedy"), Step("t", skill="think")]),
                reserve=lambda step, remaining: 2,
            ),
        ]
        source = rt.execute(
            Plan(
                goal="to fork",
                steps=[
                    Step("t1", skill="think"),
                    Step("t2", skill="think", depends_on=["t1"]),
                    Step("t3", skill="think", depends_on=["t2"]),
                ],
            ),
            call_budget=1,
        )
        fork = rt.runs.fork(source.run_id, call_budget=9)
        raised = rt.resume(source.run_id, call_budget=2)
        assert isinstance(raised, journaled.ExecuteResult)
        ids = [r.run_id for r in runs] + [source.run_id, fork]
        by_id = {s.run_id: s for s in rt.runs.list()}
        for run_id in ids:
            state = rt.runs.state(run_id)
            row = by_id[run_id]
            done = sum(1 for v in state.status.values() if v in ("succeeded", "failed", "skipped"))
            assert (
                row.calls_used,
                row.call_budget,
                row.steps_done,
                row.steps_total,
                row.running,
                row.waiting,
                row.wave,
            ) == (
                state.calls_used,
                state.budget,
                done,
                len(state.order),
                tuple(state.in_flight()),
                tuple(state.waiting),
                state.wave,
            ), run_id
        assert [by_id[r.run_id].calls_used for r in runs] == [3, 3, 6]
        assert [by_id[r.run_id].status for r in runs] == ["completed", "failed", "completed"]
        assert (by_id[fork].status, by_id[fork].call_budget, by_id[fork].calls_used) == (
            "forked",
            9,
            1,
        )
        assert (by_id[source.run_id].call_budget, by_id[source.run_id].calls_used) == (2, 2)
        assert listed(rt) == expected(rt)


# -- T2: since and limit at their edges --------------------------------------------------------


def test_since_is_inclusive_to_the_millisecond_and_follows_a_resume() -> None:
    """T2: since keeps a run whose last event is at exactly that time and drops it one
    millisecond later; a resume moves a run's last event, so an old run shows again; an
    orchestration is as recent as its passes; limit keeps the newest by start."""
    clock = ManualClock(start=1_000_000)
    with journaled.open("memory://", clock=clock) as rt:
        _register_mix(rt)
        waiting = rt.execute(Plan(goal="asks", steps=[Step("q", agent="ask")])).run_id
        clock.set(2_000_000)
        later = rt.execute(_chain("later", "ok")).run_id
        assert [s.run_id for s in rt.runs.list(since=1_000_000)] == [waiting, later]
        assert [s.run_id for s in rt.runs.list(since=1_000_001)] == [later]
        assert [s.run_id for s in rt.runs.list(since=2_000_000)] == [later]
        assert rt.runs.list(since=2_000_001) == []
        clock.set(3_000_000)
        rt.resume(waiting, answers={"q": "ok"})
        assert [s.run_id for s in rt.runs.list(since=3_000_000)] == [waiting]
        assert [s.run_id for s in rt.runs.list(limit=1)] == [later]  # newest by start
        assert [s.run_id for s in rt.runs.list(limit=1, since=3_000_000)] == [waiting]

        def planner(goal: str, observations: object, clarifications: object) -> Plan:
            clock.set(4_000_000)  # the pass starts after the orchestration did
            return _chain(goal, "ok")

        clock.set(3_500_000)
        orchestration = rt.orchestrate("o", planner).run_id
        row = {s.run_id: s for s in rt.runs.list()}[orchestration]
        assert (row.started_at, row.last_at) == (3_500_000, 4_000_000)
        assert orchestration in rt.runs.list(since=4_000_000)


def test_cli_since_reads_offsets_as_the_same_instant(sqlite_url: str) -> None:
    """T2: `runs list --since` reads Z, an offset and no zone (UTC) as one instant, to the
    millisecond, and a time in the future lists nothing."""
    clock = ManualClock(start=1_767_225_600_000)  # 2026-01-01T00:00:00Z
    with journaled.open(sqlite_url, clock=clock) as rt:
        _register_mix(rt)
        first = rt.execute(_chain("first", "ok")).run_id
        clock.set(1_767_225_600_000 + 3_600_000)  # one hour later
        second = rt.execute(_chain("second", "ok")).run_id
    cases: tuple[tuple[str, list[str]], ...] = (
        ("2026-01-01T00:00:00Z", [first, second]),
        ("2026-01-01T01:00:00+01:00", [first, second]),
        ("2026-01-01T00:00:00.001", [second]),
        ("2026-01-01T02:00:00+01:00", [second]),
        ("2026-01-01T01:00:00.001Z", []),
        ("2999-01-01", []),
    )
    answers = _cli_all(sqlite_url, [("runs", "list", "--json", "--since", c) for c, _ in cases])
    for (since, want), (code, stdout, stderr) in zip(cases, answers, strict=True):
        assert code == 0, (since, stderr)
        assert [r["run_id"] for r in json.loads(stdout)] == want, since


def test_follow_of_a_settled_run_answers_at_once_with_its_exit_status(sqlite_url: str) -> None:
    """T2: `runs follow` of a run or orchestration that has already settled prints its state
    once and exits with the status's code: completed 0, cancelled 4, budget 5, suspended 6,
    waiting for approval 5, a dry run 0."""
    started = threading.Event()
    release = threading.Event()

    def hold(_: object) -> str:
        started.set()
        release.wait(WAIT)
        return "late"

    def patient(_: Step, ctx: AgentContext) -> AgentResult:
        wait_for(ctx.cancelled, WAIT)
        return AgentResult(ok=False, error="stopped", code="cancelled")

    rt = journaled.open(sqlite_url, drain=0.1)
    try:
        _register_mix(rt)
        rt.register_tool("hold", hold)
        rt.register_agent("patient", patient)
        ids = {"completed": rt.execute(_chain("fine", "ok")).run_id}
        handle = rt.start(Plan(goal="to cancel", steps=[Step("w", agent="patient")]))
        wait_for(lambda: rt.runs.state(handle.run_id).status.get("w") == "running", WAIT)
        handle.cancel()
        handle.result(WAIT)
        ids["cancelled"] = handle.run_id
        ids["waiting_for_budget"] = rt.execute(
            Plan(goal="dear", steps=[Step("t", skill="think")]), call_budget=0
        ).run_id
        ids["waiting_for_approval"] = rt.orchestrate(
            "approve me", lambda g, o, c: _chain(g, "ok"), require_approval=True
        ).run_id
        ids["dry_run"] = rt.orchestrate(
            "plan only", lambda g, o, c: _chain(g, "ok"), mode="plan"
        ).run_id
        ids["suspended"] = rt.start(_chain("left", "hold")).run_id
        assert started.wait(WAIT)
    finally:
        rt.close()
        release.set()
    codes = {
        "completed": 0,
        "cancelled": 4,
        "waiting_for_budget": 5,
        "waiting_for_approval": 5,
        "dry_run": 0,
        "suspended": 6,
    }
    answers = _cli_all(
        sqlite_url,
        [("runs", "follow", r, "--json", "--interval", "3600") for r in ids.values()],
    )
    for status, (code, stdout, stderr) in zip(ids, answers, strict=True):
        assert code == codes[status], (status, stdout, stderr)
        lines = stdout.splitlines()
        assert len(lines) == 1, (status, lines)
        assert json.loads(lines[0])["status"] == status


def test_follow_with_a_long_interval_settles_when_another_process_finishes(
    shared_url: str,
) -> None:
    """T2: `runs follow --interval 3600` of a run another process drives wakes on that
    process's appends (SQLite file changes, PostgreSQL notifications) and exits as the run
    settles, not after its interval."""
    gate = threading.Event()
    with journaled.open(shared_url) as rt:
        rt.register_tool("gate", lambda _: gate.wait(WAIT) and "through")
        rt.register_tool("ok", lambda _: "done")
        handle = rt.start(_chain("followed", "gate", "ok", "ok"))
        wait_for(lambda: rt.runs.state(handle.run_id).status.get("s0") == "running", WAIT)
        follower = _follow(shared_url, handle.run_id, "--interval", "3600")
        try:
            first = json.loads(_line(follower))
            assert first["status"] == "running"
            gate.set()
            assert handle.result(WAIT).ok
            began = time.monotonic()
            out, err = follower.communicate(timeout=WAIT)
            took = time.monotonic() - began
        finally:
            gate.set()
            _stop(follower)
    assert follower.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["status"] == "completed"
    assert json.loads(out.splitlines()[-1])["steps_done"] == 3
    assert took < 10


_DRIVER = """
import sys, threading
import journaled
url = sys.argv[1]
rt = journaled.open(url)
started = threading.Event()
def gate(_):
    started.set()
    threading.Event().wait(120)
rt.register_tool("gate", gate)
rt.register_tool("ok", lambda _: "done")
plan = journaled.Plan(goal="driven elsewhere", steps=[
    journaled.Step("s0", tool="ok"), journaled.Step("s1", tool="gate", depends_on=["s0"]),
    journaled.Step("s2", tool="ok", depends_on=["s1"])])
handle = rt.start(plan)
assert started.wait(30)
print(handle.run_id, flush=True)
threading.Event().wait(120)
"""


def test_follow_of_a_killed_driver_settles_interrupted_then_completed_once_resumed(
    sqlite_url: str,
) -> None:
    """T2/E14/ADR 0088: `runs follow` of a run whose driving process is SIGKILLed settles on
    interrupted (exit 8: unsettled and resumable, not failed), and a follow after a third
    process resumed it to the end exits 0 (completed)."""
    driver = _popen([sys.executable, "-c", _DRIVER, sqlite_url])
    follower: subprocess.Popen[str] | None = None
    try:
        run_id = _line(driver, 60).strip()
        follower = _follow(sqlite_url, run_id, "--interval", "0.1")
        assert json.loads(_line(follower))["status"] == "running"
        driver.send_signal(signal.SIGKILL)
        driver.wait(WAIT)
        out, err = follower.communicate(timeout=WAIT)
        assert follower.returncode == 8, err
        last = json.loads(out.splitlines()[-1])
        assert (last["status"], last["running"]) == ("interrupted", ["s1"])
        with journaled.open(sqlite_url) as rt:
            rt.register_tool("gate", lambda _: "through")
            rt.register_tool("ok", lambda _: "done")
            result = rt.resume(run_id)
            assert isinstance(result, journaled.ExecuteResult)
            assert result.ok
        follower = _follow(sqlite_url, run_id, "--interval", "0.1")
        out, err = follower.communicate(timeout=WAIT)
    finally:
        _stop(driver)
        if follower is not None:
            _stop(follower)
    assert follower.returncode == 0, err
    last = json.loads(out.splitlines()[-1])
    assert (last["status"], last["steps_done"], last["running"]) == ("completed", 3, [])


def test_follow_of_a_fork_ends_when_a_purge_of_its_source_reaches_it(sqlite_url: str) -> None:
    """T2/R2/F1: `runs follow` of a fork not yet resumed settles as purged (exit 7) when its
    source is purged while it is followed, and its last line holds no goal."""
    with journaled.open(sqlite_url) as rt:
        _register_mix(rt)
        source = rt.execute(_chain("goal: amber-falcon-omega", "ok", "ok")).run_id
        fork = rt.runs.fork(source)
    follower = _follow(sqlite_url, fork, "--interval", "0.2")
    try:
        first = json.loads(_line(follower))
        assert (first["status"], first["goal"]) == ("forked", "goal: amber-falcon-omega")
        with journaled.open(sqlite_url) as rt:
            assert rt.runs.purge(source, "asked to forget") > 0
        out, err = follower.communicate(timeout=WAIT)
    finally:
        _stop(follower)
    assert follower.returncode == 7, err
    last = json.loads(out.splitlines()[-1])
    assert (last["status"], last["goal"]) == ("purged", "")


# -- T3: spans of retries, failures and redacted errors -----------------------------------------


def test_retried_attempts_are_sibling_spans_of_one_wave_and_the_last_decides(
    sqlite_url: str,
) -> None:
    """T3/S2/ADR 0046: each attempt of a retried skill is its own step span under the run span,
    linked to the same wave span, numbered 1..n, each charged its call; failed attempts are
    ERROR (retrying), an exhausted step's last is ERROR (failed), a timed-out attempt is retried
    too, and the run span is ERROR naming the failed step."""
    tries: dict[str, int] = {}
    late = threading.Event()

    def flaky(x: str) -> str:
        tries[x] = tries.get(x, 0) + 1
        if x == "slow":
            if tries[x] == 1:
                late.wait(WAIT)  # past the step timeout: abandoned, then retried
            return "fine"
        if x == "never" or tries[x] < 3:
            raise RuntimeError(f"{x} attempt {tries[x]} failed")
        return "fine"

    with journaled.open(sqlite_url) as rt:
        t = Traced(rt)
        rt.register_skill("flaky", flaky, retry=journaled.Retry(attempts=3, backoff=0.01))
        result = rt.execute(
            Plan(
                goal="g",
                steps=[
                    Step("soon", skill="flaky", input="soon"),
                    Step("never", skill="flaky", input="never"),
                    Step("slow", skill="flaky", input="slow"),
                ],
            ),
            max_parallel_steps=3,
            step_timeout=0.3,
        )
        late.set()
    assert not result.ok
    assert result.calls_used == 3 + 3 + 2
    [wave] = t.spans(journaled.otel.WAVE_SPAN)
    [run] = t.spans(journaled.otel.RUN_SPAN)
    assert _parent(wave) == _sid(run)
    for step_id, outcomes in (
        ("soon", ["retrying", "retrying", "succeeded"]),
        ("never", ["retrying", "retrying", "failed"]),
        ("slow", ["retrying", "succeeded"]),
    ):
        spans = sorted(
            t.spans(journaled.otel.STEP_SPAN, **{"journaled.step.id": step_id}),
            key=lambda s: _attrs(s)["journaled.step.attempt"],
        )
        assert [_attrs(s)["journaled.step.attempt"] for s in spans] == list(
            range(1, len(outcomes) + 1)
        )
        assert [_attrs(s)["journaled.step.outcome"] for s in spans] == outcomes
        assert {_parent(s) for s in spans} == {_sid(run)}  # T3: parent = run
        assert {link.context.span_id for s in spans for link in s.links} == {_sid(wave)}
        assert {_tid(s) for s in spans} == {_tid(run)}
        assert [_attrs(s)["journaled.step.calls"] for s in spans] == [1] * len(outcomes)
        codes = [s.status.status_code for s in spans]
        want = [StatusCode.ERROR] * (len(outcomes) - 1)
        want.append(StatusCode.ERROR if outcomes[-1] == "failed" else StatusCode.OK)
        assert codes == want, step_id
    slow_first = t.one(
        journaled.otel.STEP_SPAN, **{"journaled.step.id": "slow", "journaled.step.attempt": 1}
    )
    assert slow_first.status.description == "timed out after 0.3s"
    assert run.status.status_code is StatusCode.ERROR
    assert run.status.description == "steps failed: never"
    assert _attrs(run)["journaled.run.calls_used"] == 8


def test_spans_carry_only_redacted_errors(sqlite_url: str) -> None:
    """T3/M9: a secret in a failed attempt's error, a retried attempt's error, a waiting
    agent's question or a goal reaches no span: not its attributes, events, status or name."""
    tries: list[int] = []

    def leaky(_: object) -> str:
        tries.append(1)
        raise RuntimeError(f"auth failed for token={SECRET} (try {len(tries)})")

    def ask(_: Step, ctx: AgentContext) -> AgentResult:
        raise NeedsInput(f"is {SECRET} the right key?")

    with journaled.open(sqlite_url) as rt:
        t = Traced(rt)
        rt.register_tool("leaky", leaky, retry=journaled.Retry(attempts=2, backoff=0.0))
        rt.register_agent("ask", ask)
        result = rt.execute(
            Plan(goal=f"use {SECRET}", steps=[Step("l", tool="leaky"), Step("q", agent="ask")])
        )
        journaled_errors = [o.error or "" for o in result.observations]
    assert not result.ok
    spans = t.spans()
    assert len(spans) == 5  # run, wave, two attempts of l, q
    failed = [s for s in spans if s.status.status_code is StatusCode.ERROR]
    assert len(failed) == 2  # both attempts of l (the run waits: not an error)
    seen = []
    for s in spans:
        seen += [s.name, repr(_attrs(s)), s.status.description or ""]
        seen += [e.name + repr(dict(e.attributes or {})) for e in s.events]
    text = "\n".join(seen)
    assert SECRET not in text
    assert "auth failed for token=" in text  # the error is there, redacted as journaled
    assert any(e and e in text for e in journaled_errors)


class _Hanging(SpanExporter):
    """An exporter whose collector never answers (until the test lets it go)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        self.release.wait(WAIT)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


def test_a_hanging_collector_behind_a_batch_processor_costs_the_run_nothing(
    sqlite_url: str,
) -> None:
    """T3/R4: with the SDK's batch processor in front of an exporter that never returns (its
    queue full, spans dropped), a 40-step run completes with every event journaled and the
    runtime closes promptly."""
    exporter = _Hanging()
    provider = TracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter, max_queue_size=4, max_export_batch_size=2, schedule_delay_millis=1
        )
    )
    try:
        began = time.monotonic()
        with journaled.open(sqlite_url) as rt:
            journaled.otel.instrument(rt, tracer_provider=provider)
            rt.register_tool("ok", lambda x: x)
            result = rt.execute(_chain("many", *["ok"] * 40))
            assert result.ok
            kinds = [e.kind for e in rt.runs.history(result.run_id)]
        took = time.monotonic() - began
        assert kinds.count("run.step-succeeded") == 40
        assert kinds[-1] == "run.finished"
        assert exporter.calls >= 1  # the collector was reached, and hangs
        assert took < 10
    finally:
        exporter.release.set()
        provider.shutdown()


# -- T3: spans of runs resumed in a new process ------------------------------------------------

_PARALLEL_KILLED = """
import sys, threading, time
import journaled
url = sys.argv[1]
rt = journaled.open(url)
rt.register_tool("block", lambda _: threading.Event().wait(120))
rt.register_tool("ok", lambda _: "done")
plan = journaled.Plan(goal="g", steps=[journaled.Step("a", tool="block"),
    journaled.Step("b", tool="ok"), journaled.Step("c", tool="ok", depends_on=["a", "b"])])
handle = rt.start(plan)
while rt.runs.state(handle.run_id).status.get("b") != "succeeded":
    time.sleep(0.01)
print(handle.run_id, flush=True)
threading.Event().wait(120)
"""


def test_a_run_resumed_in_a_new_process_after_a_kill_has_a_whole_span_tree(
    sqlite_url: str,
) -> None:
    """T3/E14: resumed after its process was SIGKILLed mid-wave, a run's new pass is one trace:
    a run span (resumed, resumption 1) holding a span per wave left and the step attempts that
    ran (the interrupted step as attempt 2), each linked to its wave; the step that had succeeded
    has no span."""
    child = _popen([sys.executable, "-c", _PARALLEL_KILLED, sqlite_url])
    try:
        run_id = _line(child, 60).strip()
    finally:
        child.send_signal(signal.SIGKILL)
        _stop(child)
    with journaled.open(sqlite_url) as rt:
        t = Traced(rt)
        rt.register_tool("block", lambda _: "unblocked")
        rt.register_tool("ok", lambda _: "done")
        result = rt.resume(run_id)
    assert isinstance(result, journaled.ExecuteResult)
    assert result.ok
    run = t.one(journaled.otel.RUN_SPAN)
    assert _parent(run) is None
    assert _attrs(run)["journaled.run.id"] == run_id
    assert _attrs(run)["journaled.run.resumed"] is True
    assert _attrs(run)["journaled.run.resumptions"] == 1
    assert run.status.status_code is StatusCode.OK
    waves = {_attrs(w)["journaled.wave.number"]: w for w in t.spans(journaled.otel.WAVE_SPAN)}
    assert sorted(waves) == [1, 2]
    assert {_parent(w) for w in waves.values()} == {_sid(run)}
    a = t.one(journaled.otel.STEP_SPAN, **{"journaled.step.id": "a"})
    c = t.one(journaled.otel.STEP_SPAN, **{"journaled.step.id": "c"})
    assert t.spans(journaled.otel.STEP_SPAN, **{"journaled.step.id": "b"}) == []
    assert (_attrs(a)["journaled.step.attempt"], _parent(a)) == (2, _sid(run))  # parent = run
    assert (_attrs(c)["journaled.step.attempt"], _parent(c)) == (1, _sid(run))
    assert [link.context.span_id for link in a.links] == [_sid(waves[1])]
    assert [link.context.span_id for link in c.links] == [_sid(waves[2])]
    assert len({_tid(s) for s in t.spans()}) == 1


_CHILD_KILLED = """
import sys, threading, time
import journaled
url = sys.argv[1]
rt = journaled.open(url)
rt.register_tool("block", lambda _: threading.Event().wait(120))
def parent(step, ctx):
    child = ctx.execute(journaled.Plan(goal="sub", steps=[journaled.Step("x", tool="block")]))
    return journaled.AgentResult(output=child.ok, calls_used=0)
rt.register_agent("parent", parent)
handle = rt.start(journaled.Plan(goal="g", steps=[journaled.Step("p", agent="parent")]))
def child_running():
    kids = [r for r in rt.runs.ids() if r != handle.run_id]
    return kids and rt.runs.state(kids[0]).status.get("x") == "running"
while not child_running():
    time.sleep(0.01)
print(handle.run_id, flush=True)
threading.Event().wait(120)
"""


def test_a_child_run_found_again_in_a_new_process_nests_under_the_re_run_step(
    sqlite_url: str,
) -> None:
    """T3/R5/E9: after a kill, resuming the parent in a new process re-runs its agent step,
    which finds its child run again (not a second one); the child's resumed run span is a
    child of the re-run step's span, in its trace."""
    child = _popen([sys.executable, "-c", _CHILD_KILLED, sqlite_url])
    try:
        parent_id = _line(child, 60).strip()
    finally:
        child.send_signal(signal.SIGKILL)
        _stop(child)

    def parent(_: Step, ctx: AgentContext) -> AgentResult:
        sub = ctx.execute(Plan(goal="sub", steps=[Step("x", tool="block")]))
        return AgentResult(output=sub.ok, calls_used=0)

    with journaled.open(sqlite_url) as rt:
        t = Traced(rt)
        rt.register_tool("block", lambda _: "unblocked")
        rt.register_agent("parent", parent)
        result = rt.resume(parent_id)
        assert isinstance(result, journaled.ExecuteResult)
        assert result.ok
        assert len(rt.runs.ids()) == 2  # the child was found again, never duplicated
    child_id = result.observations[0].agent_task_id
    assert child_id is not None
    step = t.one(journaled.otel.STEP_SPAN, **{"journaled.step.id": "p"})
    assert _attrs(step)["journaled.step.attempt"] == 2
    assert _attrs(step)["journaled.step.child_run"] == child_id
    sub = t.one(journaled.otel.RUN_SPAN, **{"journaled.run.id": child_id})
    assert _parent(sub) == _sid(step)
    assert _tid(sub) == _tid(step)
    assert _attrs(sub)["journaled.run.resumed"] is True
    assert _attrs(sub)["journaled.run.parent_id"] == parent_id
    assert _attrs(sub)["journaled.run.parent_step"] == "p"
    x = t.one(journaled.otel.STEP_SPAN, **{"journaled.step.id": "x"})
    assert _tid(x) == _tid(step)


def test_each_orchestration_pass_is_a_run_span_naming_its_orchestration(
    sqlite_url: str,
) -> None:
    """T3/ADR 0010/O2: each pass of an orchestration that replans is its own run span, naming
    the orchestration and the pass as its parent; the failed pass is ERROR, the next OK."""
    calls: list[int] = []

    def planner(goal: str, observations: object, clarifications: object) -> Plan:
        calls.append(1)
        return _chain(goal, "boom" if len(calls) == 1 else "ok")

    def boom(_: object) -> str:
        raise RuntimeError("no")

    with journaled.open(sqlite_url) as rt:
        t = Traced(rt)
        _register_mix(rt)
        rt.register_tool("boom", boom)
        out = rt.orchestrate("o", planner, mode="orchestrate")
        assert out.status == "completed"
        passes = {s.pass_no or 0: s.run_id for s in rt.runs.list() if s.orchestration == out.run_id}
    assert sorted(passes) == [1, 2]
    for number, run_id in passes.items():
        span = t.one(journaled.otel.RUN_SPAN, **{"journaled.run.id": run_id})
        assert _attrs(span)["journaled.run.parent_id"] == out.run_id
        assert _attrs(span)["journaled.run.parent_step"] == f"pass-{number}"
        want = StatusCode.ERROR if number == 1 else StatusCode.OK
        assert span.status.status_code is want
        assert _attrs(span)["journaled.run.status"] == ("failed" if number == 1 else "completed")


# -- T3/T4: the extra stays optional ------------------------------------------------------------

_NO_OTEL = (
    _MIX
    + """
import asyncio, sys, threading
import journaled.aio
from journaled.cli import main
url = sys.argv[1]
with journaled.open(url) as rt:
    register(rt)
    rt.register_tool("flaky", lambda _: 1 / 0, retry=journaled.Retry(attempts=2, backoff=0.0))
    def parent(step, ctx):
        sub = ctx.execute(journaled.Plan(goal="sub", steps=[journaled.Step("x", tool="ok")]))
        return journaled.AgentResult(output=sub.ok, calls_used=0)
    rt.register_agent("parent", parent)
    rt.execute(journaled.Plan(goal="g", steps=[journaled.Step("p", agent="parent"),
        journaled.Step("f", tool="flaky")]))
    run_id = rt.orchestrate("o", lambda g, o, c: journaled.Plan(goal=g, steps=[
        journaled.Step("a", tool="ok")])).run_id
    rt.runs.list(); rt.runs.why(run_id)
async def aio():
    async with journaled.aio.open(url) as art:
        art.register_tool("ok", lambda _: "done")
        await art.execute(journaled.Plan(goal="a", steps=[journaled.Step("a", tool="ok")]))
        await art.runs.list()
asyncio.run(aio())
for args in (["runs", "list", "--json"], ["runs", "follow", run_id, "--json"]):
    try:
        main(["--url", url, *args])
    except SystemExit:
        pass
print(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))
"""
)


def test_a_whole_untraced_session_never_imports_opentelemetry(sqlite_url: str) -> None:
    """T3/T4: in a fresh interpreter with the SDK installed, runs with retries, child runs, an
    orchestration, the asyncio runtime, runs.list and the CLI's list and follow import no
    OpenTelemetry module at all."""
    done = subprocess.run(
        [sys.executable, "-c", _NO_OTEL, sqlite_url],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-2000:]
