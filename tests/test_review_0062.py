"""Probes of ADR 0062 (where a read begins, reads a fork carries, reads another organization
must not see) and ADR 0063 (subscriptions and handles at their edges) that hold.

Real SQLite files, real threads and real processes; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

import journaled
import journaled.aio
from journaled import Plan, Step
from journaled.actors.run_recorder import reporting
from journaled.actors.runs import Runs
from journaled.cli import main
from journaled.errors import InvalidArgument
from journaled.events.base import Event
from journaled.events.memory import FactSuperseded
from journaled.events.provenance import stale_reads
from journaled.events.runs import MemoryRead

WAIT = 10.0
"""Seconds any thread or process may take before the test fails instead of hanging."""

SUPERSEDE_ELSEWHERE = """
import sys
import journaled
url, key, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
with journaled.open(url, follow=None) as rt:
    for i in range(rounds):
        rt.memory.remember(f"value {i} from elsewhere", conflict_key=key)
"""


@pytest.fixture
def srt(sqlite_url: str) -> Iterator[journaled.Runtime]:
    """Yield a runtime on a real SQLite file with tool ``read`` (BM25 search through ctx)."""
    with journaled.open(sqlite_url) as runtime:
        runtime.register_tool("read", lambda q, ctx: [f.id for f in ctx.memory.search(q)])
        runtime.register_tool("t", lambda x: x)
        yield runtime


def _reads(rt: journaled.Runtime, run_id: str) -> list[MemoryRead]:
    return [e.data for e in rt.runs.history(run_id) if isinstance(e.data, MemoryRead)]


def _superseded_at(rt: journaled.Runtime, fact_id: str) -> int | None:
    for event in rt.memory.history(fact_id):
        if isinstance(event.data, FactSuperseded):
            return event.position
    return None


def _missed(rt: journaled.Runtime, run_ids: list[str]) -> list[tuple[str, int, int]]:
    """Return (fact, superseded at, read began) for each fact a read returned as current
    although its supersession was at or before where the read says it began."""
    missed = []
    for run_id in run_ids:
        for read in _reads(rt, run_id):
            assert read.read_position is not None
            for fact_id in read.fact_ids:
                at = _superseded_at(rt, fact_id)
                if at is not None and at <= read.read_position:
                    missed.append((fact_id, at, read.read_position))
    return missed


# -- P3: the FoldMark under concurrent writers ---------------------------------------------------


def test_a_read_never_begins_past_a_change_it_did_not_see_with_callers_storing(
    srt: journaled.Runtime,
) -> None:
    """P3 (ADR 0062): with threads remembering on their own threads (the desk) while steps
    search, no read returns a fact as current whose supersession lies at or before the position
    its ``run.memory-read`` says the read began: the FoldMark is set only after those folds."""
    keys = [f"k{i}" for i in range(6)]
    for key in keys:
        srt.memory.remember(f"value start of {key}", conflict_key=key)
    stop = threading.Event()

    def write(offset: int) -> None:
        i = 0
        while not stop.is_set() and i < 400:
            srt.memory.remember(f"value {i} {offset}", conflict_key=keys[(i + offset) % len(keys)])
            i += 1

    srt.register_tool("scan", lambda q, ctx: [f.id for f in ctx.memory.search(q, limit=50)])
    writers = [threading.Thread(target=write, args=(n,)) for n in range(3)]
    for w in writers:
        w.start()
    runs: list[str] = []
    try:
        for _ in range(15):
            steps = [Step(f"s{j}", tool="scan", input="value") for j in range(4)]
            runs.append(srt.execute(Plan(goal="g", steps=steps), max_parallel_steps=4).run_id)
    finally:
        stop.set()
        for w in writers:
            w.join(WAIT)
    assert not any(w.is_alive() for w in writers)
    assert _missed(srt, runs) == []
    assert all(_reads(srt, r) for r in runs)


def test_a_read_never_begins_past_a_change_another_process_appended(sqlite_url: str) -> None:
    """P3 (ADR 0062): while another process supersedes facts and this runtime's follower
    catches up, no read of this runtime claims to have begun after a change it missed."""
    with journaled.open(sqlite_url, follow=0.01) as rt:
        rt.memory.remember("value first", conflict_key="shared")
        rt.register_tool("scan", lambda q, ctx: [f.id for f in ctx.memory.search(q, limit=50)])
        proc = subprocess.Popen(
            [sys.executable, "-c", SUPERSEDE_ELSEWHERE, sqlite_url, "shared", "150"]
        )
        runs: list[str] = []
        try:
            while proc.poll() is None and len(runs) < 200:
                steps = [Step(f"s{j}", tool="scan", input="value") for j in range(3)]
                runs.append(rt.execute(Plan(goal="g", steps=steps), max_parallel_steps=3).run_id)
        finally:
            proc.wait(30)
        assert proc.returncode == 0
        assert runs
        assert _missed(rt, runs) == []


def test_a_read_of_a_fact_superseded_by_another_process_not_yet_folded_is_stale(
    sqlite_url: str,
) -> None:
    """P3: a fact another process superseded, read here before memory folded that change, is
    stale: the mark is where this memory had folded, not the journal's head."""
    with journaled.open(sqlite_url, follow=None) as rt:
        old = rt.memory.remember("region value north", conflict_key="region")
        rt.register_tool("get", lambda fact_id, ctx: ctx.memory.get(fact_id).text)
        subprocess.run(
            [sys.executable, "-c", SUPERSEDE_ELSEWHERE, sqlite_url, "region", "1"],
            check=True,
            timeout=30,
        )
        result = rt.execute(Plan(goal="g", steps=[Step("a", tool="get", input=old.id)]))
        assert result.observations[0].output == "region value north"  # not folded here yet
        assert [(s.fact_id, s.change) for s in rt.runs.stale(result.run_id)] == [
            (old.id, "superseded")
        ]


def test_a_read_after_a_snapshot_restore_begins_at_the_restored_position(
    sqlite_url: str,
) -> None:
    """P3 (ADR 0062): memory reopened from its snapshot marks its reads from the snapshot's
    position, not 0: a fact superseded before the reopen and read by ``get`` is not stale."""
    with journaled.open(sqlite_url) as rt:
        old = rt.memory.remember("colour value red", conflict_key="colour")
        rt.memory.remember("colour value blue", conflict_key="colour")
        assert rt.memory.checkpoint()
        last = rt.journal.position()
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("get", lambda fact_id, ctx: ctx.memory.get(fact_id).superseded_by)
        result = rt.execute(Plan(goal="g", steps=[Step("a", tool="get", input=old.id)]))
        assert result.observations[0].output is not None  # read as superseded already
        (read,) = _reads(rt, result.run_id)
        assert read.read_position is not None
        assert read.read_position >= last
        assert rt.runs.stale(result.run_id) == []


def test_an_older_release_read_is_judged_from_its_own_position() -> None:
    """P3 (ADR 0062): a ``run.memory-read`` without ``read_position``/``read_at`` (an earlier
    release's) counts only changes after its own position, as before."""
    read = MemoryRead(at=100, step_id="a", attempt=1, fact_ids=("f",))
    assert read.read_position is None
    assert read.read_at is None
    events = [Event(position=10, stream="run_x", version=3, data=read)]
    before = [Event(position=8, stream="f", version=2, data=_sup())]
    after = [Event(position=12, stream="f", version=2, data=_sup())]
    assert stale_reads(events, lambda _: before, now=200) == []
    assert [s.position for s in stale_reads(events, lambda _: after, now=200)] == [10]
    marked = MemoryRead(at=100, step_id="a", attempt=1, fact_ids=("f",), read_position=5)
    events = [Event(position=10, stream="run_x", version=3, data=marked)]
    assert [s.change for s in stale_reads(events, lambda _: before, now=200)] == ["superseded"]


def _sup() -> FactSuperseded:
    return FactSuperseded(at=1, fact_id="f", by="g", conflict_key="k")


# -- P3/P4/F1: what forks carry ------------------------------------------------------------------


def test_a_fork_of_a_fork_carries_the_root_read_and_refreshes(srt: journaled.Runtime) -> None:
    """P3/P4/F1: a step carried twice (root -> fork -> fork of it) is stale in the last fork
    once the fact its root read changes, and only there and upstream; refresh re-pends it."""
    fact = srt.memory.remember("region value north", conflict_key="region")
    plan = Plan(
        goal="g", steps=[Step("a", tool="read", input="region"), Step("c", tool="t", input=1)]
    )
    root = srt.execute(plan).run_id
    middle = srt.runs.fork(root, replace={"c": Step("c", tool="t", input=2)})
    srt.resume(middle)
    leaf = srt.runs.fork(middle, replace={"c": Step("c", tool="t", input=3)})
    srt.resume(leaf)
    assert srt.runs.stale(leaf) == []
    srt.memory.remember("region value south", conflict_key="region")
    for run_id in (root, middle, leaf):
        assert [(s.run_id, s.step_id, s.fact_id) for s in srt.runs.stale(run_id)] == [
            (run_id, "a", fact.id)
        ]
    every = sorted((s.run_id, s.step_id) for s in srt.runs.stale())
    assert every == sorted([(root, "a"), (middle, "a"), (leaf, "a")])
    refreshed = srt.runs.refresh(leaf)
    assert "a" in {
        s
        for s in srt.runs.state(refreshed).status
        if srt.runs.state(refreshed).status[s] == "pending"
    }
    assert srt.runs.stale(refreshed) == []


def test_a_fork_of_a_fork_carries_the_middle_read_when_the_middle_re_ran_the_step(
    srt: journaled.Runtime,
) -> None:
    """P3/F1: when the middle fork re-ran a step (replaced) and read another fact, the fork of
    it carries that read, not the root's."""
    first = srt.memory.remember("alpha value one", conflict_key="alpha")
    second = srt.memory.remember("beta value one", conflict_key="beta")
    root = srt.execute(Plan(goal="g", steps=[Step("a", tool="read", input="alpha")])).run_id
    middle = srt.runs.fork(root, replace={"a": Step("a", tool="read", input="beta")})
    srt.resume(middle)
    leaf = srt.runs.fork(middle)
    srt.memory.remember("alpha value two", conflict_key="alpha")
    assert [s.fact_id for s in srt.runs.stale(root)] == [first.id]
    assert srt.runs.stale(leaf) == []  # its step rests on the middle's read of beta
    srt.memory.remember("beta value two", conflict_key="beta")
    assert [(s.step_id, s.fact_id) for s in srt.runs.stale(leaf)] == [("a", second.id)]


def test_a_fork_at_a_position_before_the_read_carries_nothing(srt: journaled.Runtime) -> None:
    """P3/F1: a fork at a position where the reading step had not yet succeeded carries neither
    its output nor its read: the fork is not stale when the fact changes."""
    srt.memory.remember("zone value a", conflict_key="zone")
    plan = Plan(
        goal="g",
        steps=[
            Step("x", tool="t", input=1),
            Step("a", tool="read", input="zone", depends_on=["x"]),
        ],
    )
    root = srt.execute(plan).run_id
    x_done = next(
        e.position
        for e in srt.runs.history(root)
        if getattr(e.data, "step_id", None) == "x" and type(e.data).__name__ == "StepSucceeded"
    )
    early = srt.runs.fork(root, at=x_done)
    srt.memory.remember("zone value b", conflict_key="zone")
    assert [s.step_id for s in srt.runs.stale(root)] == ["a"]
    assert srt.runs.stale(early) == []
    assert early not in {s.run_id for s in srt.runs.stale()}


def test_remember_through_ctx_in_a_fork_and_a_child_run_names_an_existing_run(
    srt: journaled.Runtime,
) -> None:
    """P1 (ADR 0062): provenance must name a run; a fork's step and a child run's step (their
    streams open with run.forked and run.started) may remember through ctx.memory."""
    srt.register_tool("note", lambda text, ctx: ctx.memory.remember(text).id)

    def parent(step: Step, ctx: Any) -> journaled.AgentResult:
        child = ctx.execute(Plan(goal="child", steps=[Step("n", tool="note", input="from child")]))
        return journaled.AgentResult(ok=child.ok, output=child.observations[0].output)

    srt.register_agent("parent", parent)
    plan = Plan(goal="g", steps=[Step("p", agent="parent"), Step("n", tool="note", input="root")])
    root = srt.execute(plan)
    assert root.ok, root.observations
    fork = srt.runs.fork(root.run_id, replace={"n": Step("n", tool="note", input="in fork")})
    forked = srt.resume(fork)
    assert isinstance(forked, journaled.ExecuteResult)
    assert forked.ok
    fact_id = {o.step_id: o.output for o in forked.observations}["n"]
    remembered = srt.memory.remembered(fact_id)
    assert remembered is not None
    assert remembered.run_id == fork
    with pytest.raises(ValueError, match="run_id"):
        srt.memory.remember("claims a run", run_id="run_nope")


# -- R1: reads another organization must not see ------------------------------------------------


def test_a_runtime_with_no_organization_sees_no_organization_fact_ids(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R1 (ADR 0062, 0074): in a run of an earlier release (which recorded no organization, so
    every runtime sees it), a runtime with no organization sees no organization-scope fact id
    in run reads (history, journal.read, subscriptions), while ids of shared facts, deleted and
    purged ones included, stay; a purged organization fact stays hidden."""
    with journaled.open(sqlite_url, organization="acme") as org:
        # the run is journaled as an earlier release did: with no organization recorded
        monkeypatch.setattr(Runs, "_organization", property(lambda _: msgspec.UNSET))
        secret = org.memory.remember("acme plan value", scope="organization")
        gone = org.memory.remember("acme old value", scope="organization")
        shared = org.memory.remember("shared plan value")
        deleted = org.memory.remember("shared deleted value")
        purged = org.memory.remember("shared purged value")
        ids = [secret.id, gone.id, shared.id, deleted.id, purged.id]
        org.register_tool("get", lambda ids, ctx: [ctx.memory.get(i).id for i in ids])
        run = org.execute(Plan(goal="g", steps=[Step("a", tool="get", input=ids)])).run_id
        monkeypatch.undo()
        assert org.memory.purge(gone.id)
        assert org.memory.delete(deleted.id).primary
        assert org.memory.purge(purged.id)
        assert set(_reads(org, run)[0].fact_ids) == set(ids)  # its own organization sees all
    visible = {shared.id, deleted.id, purged.id}
    with journaled.open(sqlite_url) as rt:
        assert set(_reads(rt, run)[0].fact_ids) == visible
        in_log = [e.data for e in rt.journal.read() if isinstance(e.data, MemoryRead)]
        assert [set(r.fact_ids) for r in in_log] == [visible]
        with rt.journal.subscribe(topics=["run.memory-read"]) as sub:
            event = sub.poll(WAIT)
        assert event is not None
        assert isinstance(event.data, MemoryRead)
        assert set(event.data.fact_ids) == visible
        assert secret.id not in rt.runs.why(run)
        assert shared.id in rt.runs.why(run)
    with journaled.open(sqlite_url, organization="other") as other:
        assert set(_reads(other, run)[0].fact_ids) == visible


# -- A3: `after` up to the head ------------------------------------------------------------------


def test_a_named_subscription_restarted_at_the_head_resumes(sqlite_url: str) -> None:
    """A3 (ADR 0063): a consumer that acknowledged the head and restarts with ``after`` = its
    acknowledged position is accepted and gets the next append; one past the head is refused
    and stores nothing."""
    with journaled.open(sqlite_url) as rt:
        rt.memory.remember("first value")
        with rt.journal.subscribe(name="mailer") as sub:
            event = sub.poll(WAIT)
            assert event is not None
            sub.ack(event.position)
        head = rt.journal.position()
        with pytest.raises(InvalidArgument, match="after"):
            rt.journal.subscribe(after=head + 1, name="mailer")
        assert [(s.name, s.position) for s in rt.journal.subscriptions()] == [("mailer", head)]
        with rt.journal.subscribe(after=head, name="mailer") as sub:
            rt.memory.remember("second value")
            event = sub.poll(WAIT)
        assert event is not None
        assert event.position == head + 1


def test_journal_tail_follow_from_the_head_and_a_named_restart(sqlite_url: str) -> None:
    """A3/T (ADR 0063): ``journal tail --follow --after HEAD`` and a named tail restarted after
    it acknowledged the head both start; neither is refused as past the end."""
    with journaled.open(sqlite_url) as rt:
        rt.memory.remember("one value")
        head = rt.journal.position()
    runner = CliRunner()
    for args in (
        ["journal", "tail", "--follow", "--after", str(head), "--max-seconds", "0.3"],
        ["journal", "tail", "--follow", "--name", "n", "--max-seconds", "0.3"],
        [
            "journal",
            "tail",
            "--follow",
            "--name",
            "n",
            "--after",
            str(head),
            "--max-seconds",
            "0.3",
        ],
    ):
        result = runner.invoke(main, ["--url", sqlite_url, *args])
        assert result.exit_code == 0, (args, result.output)
        assert "past the end" not in result.output


def test_a_position_another_process_appended_is_accepted_on_postgresql(pg_url: str) -> None:
    """A3 (ADR 0063) on PostgreSQL: ``after`` = the position another process just appended at
    is within this runtime's head, and the next append (by that process) is delivered."""
    with journaled.open(pg_url) as rt:
        rt.memory.remember("before value")
        subprocess.run(
            [sys.executable, "-c", SUPERSEDE_ELSEWHERE, pg_url, "k", "1"], check=True, timeout=60
        )
        with journaled.open(pg_url) as second:
            theirs = second.journal.position()
        with rt.journal.subscribe(after=theirs, topics=["memory.fact-remembered"]) as sub:
            subprocess.run(
                [sys.executable, "-c", SUPERSEDE_ELSEWHERE, pg_url, "k2", "1"],
                check=True,
                timeout=60,
            )
            event = sub.poll(WAIT)
        assert event is not None
        assert event.position > theirs


def test_a_subscription_on_memory_backend_accepts_its_head() -> None:
    """A3 (ADR 0063) on memory://: ``after`` = the head is accepted, one past it refused."""
    with journaled.open("memory://") as rt:
        rt.memory.remember("a value")
        head = rt.journal.position()
        with pytest.raises(InvalidArgument, match="past the end"):
            rt.journal.subscribe(after=head + 1)
        with rt.journal.subscribe(after=head) as sub:
            rt.memory.remember("b value")
            event = sub.poll(WAIT)
        assert event is not None
        assert event.position == head + 1


# -- A1/A2: async on_progress and the reporting marker ------------------------------------------


def test_an_async_on_progress_on_the_asyncio_runtime_survives_a_close_mid_run(
    tmp_path: Path,
) -> None:
    """A1/R3 (ADR 0063): closing the asyncio runtime while a run with an async on_progress has a
    step in flight neither deadlocks (the callback needs the loop the close is awaited on) nor
    loses the run: it is suspended, and its points up to then were reported."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    points: list[str] = []
    started = threading.Event()

    async def main() -> str:
        rt = await journaled.aio.open(url, drain=0.5)

        async def slow(x: int) -> int:
            started.set()
            await asyncio.sleep(3)
            return x

        rt.register_tool("slow", slow)

        async def progress(at: str, delta: Any, calls: int, waiting: Any) -> None:
            await asyncio.sleep(0)
            points.append(at)

        handle = await rt.start(
            Plan(goal="g", steps=[Step("a", tool="slow", input=1)]),
            on_progress=progress,
        )
        while not started.is_set():
            await asyncio.sleep(0.01)
        await asyncio.wait_for(rt.close(), WAIT)
        return handle.run_id

    run_id = asyncio.run(asyncio.wait_for(main(), 2 * WAIT))
    assert points
    assert points[0] == "wave-partition"
    with journaled.open(url) as rt:
        assert rt.runs.state(run_id).suspended is not None


def test_an_async_on_progress_of_a_child_run_started_from_an_async_agent(
    srt: journaled.Runtime,
) -> None:
    """A1/E9 (ADR 0063): an async agent's ``await ctx.execute_async(plan, on_progress=async)``
    completes: the child's callback runs on the loop the agent awaits on, without deadlock."""
    points: list[str] = []

    async def progress(at: str, delta: Any, calls: int, waiting: Any) -> None:
        points.append(at)

    async def agent(step: Step, ctx: Any) -> journaled.AgentResult:
        child = await ctx.execute_async(
            Plan(goal="child", steps=[Step("c", tool="t", input=5)]),
            on_progress=progress,
        )
        return journaled.AgentResult(ok=child.ok, output=child.observations[0].output)

    srt.register_agent("parent", agent)
    handle = srt.start(Plan(goal="g", steps=[Step("p", agent="parent")]))
    result = handle.result(WAIT)
    assert result.ok
    assert result.observations[0].output == 5
    assert points
    assert points[-1] == "plan-end"


def test_the_reporting_marker_is_cleared_after_an_on_progress_raised(
    srt: journaled.Runtime,
) -> None:
    """A2 (ADR 0063): after an on_progress raised, neither step code nor a later callback of
    another run is taken for the run's own callback: waiting for a finished run from it works,
    and waiting for its own run is still refused."""
    marks: list[str | None] = []

    def mark(x: int) -> int:
        marks.append(reporting())
        return x

    srt.register_tool("mark", mark)
    calls: list[str] = []

    def failing(at: str, delta: Any, used: int, waiting: Any) -> None:
        calls.append(at)
        raise ValueError("callback failed")

    plan = Plan(
        goal="g",
        steps=[Step("a", tool="t", input=1), Step("b", tool="mark", input=2, depends_on=["a"])],
    )
    first = srt.execute(plan, on_progress=failing)
    assert first.ok
    assert len(calls) >= 3
    assert marks == [None]
    outcomes: list[str] = []
    handles: list[Any] = []

    def waits(at: str, delta: Any, used: int, waiting: Any) -> None:
        if at != "plan-end" or not handles:
            return
        try:
            outcomes.append(
                str(srt.start(Plan(goal="h", steps=[Step("h", tool="t", input=0)])).result(WAIT).ok)
            )
        except Exception as exc:
            outcomes.append(type(exc).__name__)
        try:
            handles[0].result(0)
        except RuntimeError:
            outcomes.append("own refused")

    ready = threading.Event()

    def waits_when_ready(at: str, delta: Any, used: int, waiting: Any) -> None:
        ready.wait(WAIT)
        waits(at, delta, used, waiting)

    handle = srt.start(plan, on_progress=waits_when_ready)
    handles.append(handle)
    ready.set()
    assert handle.result(WAIT).ok
    assert outcomes == ["True", "own refused"]
    assert marks == [None, None]
