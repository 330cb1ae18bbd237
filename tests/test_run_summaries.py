"""Runs at a glance (SPEC T2): the run-summary projection, ``rt.runs.list`` and its filters."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import pickle
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner
from run_mix import build, expected, listed, register

import journaled
from journaled import Plan, Step
from journaled.cli import main
from journaled.events.catalog import codec
from journaled.events.compressed import deflate, inflate
from journaled.events.journal import Journal
from journaled.events.run_summaries import SUMMARIES_KEY, RunSummaries
from journaled.events.url import parse_url
from journaled.testing import ManualClock, wait_for

HERE = Path(__file__).resolve().parent
STATUSES = {
    "completed": "completed",
    "failed": "failed",
    "waiting": "waiting_for_input",
    "budget": "waiting_for_budget",
    "cancelled": "cancelled",
    "purged": "purged",
    "fork": "forked",
    "fork_resumed": "completed",
    "parent": "completed",
    "child": "completed",
    "orchestration": "completed",
    "clarify": "waiting_for_clarification",
    "suspended": "suspended",
}


@contextmanager
def _journal(url: str) -> Iterator[Journal]:
    journal = Journal(parse_url(url), codec(), create=False)
    try:
        yield journal
    finally:
        journal.close()


def test_summaries_equal_a_fold_of_every_run(durable_url: str) -> None:
    """T2: in a second runtime, each run's summary equals a fold of every event of every run."""
    url = durable_url
    ids = build(url, save_midway=True)
    with journaled.open(url) as rt:
        assert listed(rt) == expected(rt)
        by_id = {s.run_id: s for s in rt.runs.list()}
    assert {name: by_id[run].status for name, run in ids.items()} == STATUSES
    assert by_id[ids["purged"]].goal == ""
    assert by_id[ids["fork"]].forked_from == ids["failed"]
    assert by_id[ids["child"]].parent_run == ids["parent"]
    orchestration = by_id[ids["orchestration"]]
    assert orchestration.kind == "orchestration.started"
    assert by_id[ids["fork"]].kind == "run.forked"
    assert orchestration.current_run is not None
    assert by_id[orchestration.current_run].orchestration == ids["orchestration"]
    assert (orchestration.steps_done, orchestration.steps_total, orchestration.calls_used) == (
        2,
        2,
        1,
    )


def test_summaries_in_process_on_every_backend(journal_url: str) -> None:
    """T2: in the runtime that made them, on every backend, list() equals the fold of all runs."""
    ids = build_open(journal_url)
    rt, names = ids
    try:
        assert listed(rt) == expected(rt)
        statuses = {s.run_id: s.status for s in rt.runs.list()}
        assert statuses[names["failed"]] == "failed"
        assert statuses[names["budget"]] == "waiting_for_budget"
    finally:
        rt.close()


def build_open(url: str) -> tuple[journaled.Runtime, dict[str, str]]:
    """Run a small mix and leave the runtime open (an in-memory journal dies with it)."""
    rt = journaled.open(url)
    rt.register_tool("ok", lambda _: "done")
    rt.register_skill("think", lambda _: "thought")

    def boom(_: object) -> str:
        raise RuntimeError("disk full")

    rt.register_tool("boom", boom)
    step = journaled.Step
    names = {
        "failed": rt.execute(journaled.Plan(goal="f", steps=[step("a", tool="boom")])).run_id,
        "budget": rt.execute(
            journaled.Plan(
                goal="b",
                steps=[step("s1", skill="think"), step("s2", skill="think", depends_on=["s1"])],
            ),
            call_budget=1,
        ).run_id,
    }
    return rt, names


def test_a_crash_before_the_projection_is_stored_loses_nothing(sqlite_url: str) -> None:
    """T2: after a SIGKILL past the stored projection, a reader folds only the tail, correctly."""
    done = subprocess.run(
        [sys.executable, str(HERE / "run_mix.py"), sqlite_url, "--kill"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    ids = json.loads(done.stdout)
    with _journal(sqlite_url) as journal:
        stored = journal.snapshot(SUMMARIES_KEY)
        assert stored is not None
        assert stored[0] < journal.position()  # stored midway: the rest is a tail to fold
        reads: list[int] = []
        real = journal.read

        def counting(*args: object, **kwargs: object) -> Iterator[journaled.Event]:
            for event in real(*args, **kwargs):  # type: ignore[arg-type]
                reads.append(event.position)
                yield event

        journal.read = counting  # type: ignore[method-assign]
        tail = RunSummaries(journal).read()
        assert reads
        assert min(reads) > stored[0]  # nothing before the stored position was read again
    with journaled.open(sqlite_url) as rt:
        assert {
            r: (s.status, s.goal, s.steps_done, s.steps_total, s.calls_used)
            for r, s in tail.items()
        } == expected(rt, judge=False)
        # Killed mid-step, nobody suspended it: the fold says running, a listing interrupted.
        assert rt.runs.summary(ids["suspended"]).status == "interrupted"
        assert listed(rt) == expected(rt)
    assert tail[ids["suspended"]].status == "running"
    assert tail[ids["failed"]].status == "failed"


def test_the_stored_projection_plus_its_tail_equals_a_fold_from_the_start(sqlite_url: str) -> None:
    """T2: a projection stored, then caught up over resumes, equals a fold from position 0."""
    ids = build(sqlite_url)
    with journaled.open(sqlite_url) as rt:
        release = register(rt)
        release.set()
        assert rt.runs.summaries.save()
        stored_at = rt.runs.summaries.position
        rt.resume(ids["waiting"], answers={"q": "this one"})
        rt.resume(ids["budget"], call_budget=5)
        rt.resume(ids["fork"])
    with _journal(sqlite_url) as journal:
        stored = journal.snapshot(SUMMARIES_KEY)
        assert stored is not None
        assert stored[0] == stored_at < journal.position()  # the resumes are a tail to fold
        cached = RunSummaries(journal).read()
        journal.save_snapshot(SUMMARIES_KEY, 0, b"")  # no stored copy: a fold from the start
        assert RunSummaries(journal).read() == cached
    statuses = {name: cached[ids[name]].status for name in ("waiting", "budget", "fork")}
    assert statuses == {"waiting": "completed", "budget": "completed", "fork": "failed"}


def test_a_read_only_runtime_answers_without_writing(sqlite_url: str) -> None:
    """T2: a runtime opened for reading answers list() and stores nothing."""
    build(sqlite_url)
    with _journal(sqlite_url) as journal:
        stored = journal.snapshot(SUMMARIES_KEY)  # blanked by the mix's purge
    with journaled.Runtime(sqlite_url, create=False) as rt:
        before = rt.journal.position()
        runs = rt.runs.list()
        assert len(runs) == len(rt.runs.ids())
    with _journal(sqlite_url) as journal:
        assert journal.position() == before
        assert journal.snapshot(SUMMARIES_KEY) == stored


def test_a_purge_blanks_the_stored_projection(sqlite_url: str) -> None:
    """T2/R2: a purge erases the goal from the stored projection too, and list() hides it."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("ok", lambda _: "done")
        run_id = rt.execute(
            journaled.Plan(goal="the secret goal", steps=[journaled.Step("a", tool="ok")])
        ).run_id
        assert rt.runs.summaries.save()
        rt.runs.purge(run_id, "forget it")
        (summary,) = rt.runs.list()
        assert (summary.status, summary.goal) == ("purged", "")
    raw = Path(sqlite_url.removeprefix("sqlite:///")).read_bytes()
    assert b"the secret goal" not in raw


def test_filters_status_since_and_limit(clock: object) -> None:
    """T2: status keeps one status, since keeps runs active since a time, limit the newest N."""
    with journaled.open("memory://", clock=clock) as rt:  # type: ignore[arg-type]
        rt.register_tool("ok", lambda _: "done")

        def boom(_: object) -> str:
            raise RuntimeError("no")

        rt.register_tool("boom", boom)
        made = []
        for i, tool in enumerate(["ok", "boom", "ok", "boom"]):
            clock.set(1_000 * (i + 1))  # type: ignore[attr-defined]
            plan = journaled.Plan(goal=f"g{i}", steps=[journaled.Step("a", tool=tool)])
            made.append(rt.execute(plan).run_id)
        assert [s.run_id for s in rt.runs.list()] == made
        assert [s.run_id for s in rt.runs.list(status="failed")] == [made[1], made[3]]
        assert [s.run_id for s in rt.runs.list(since=3_000)] == [made[2], made[3]]
        assert [s.run_id for s in rt.runs.list(limit=1)] == [made[3]]
        assert [s.run_id for s in rt.runs.list(limit=2)] == [made[2], made[3]]
        assert rt.runs.list(status="completed", limit=1)[0].run_id == made[2]


def _boom(_: object) -> None:
    raise RuntimeError("boom")


def test_status_takes_several_and_since_takes_a_datetime_or_iso_text(
    sqlite_url: str, clock: ManualClock
) -> None:
    """T2: ``status`` takes one status or several (a run in any is kept); ``since`` takes epoch
    ms, a datetime (naive: UTC) or ISO-8601 text, alike; the CLI's --status repeats."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("ok", lambda x: x)
        rt.register_tool("bad", _boom)
        done = rt.execute(Plan(goal="ok", steps=[Step("a", tool="ok", input=1)])).run_id
        clock.advance(60_000)
        later = clock()
        failed = rt.execute(Plan(goal="bad", steps=[Step("a", tool="bad")])).run_id
        both = [s.run_id for s in rt.runs.list(status=["failed", "completed"])]
        assert both == [done, failed]
        assert [s.run_id for s in rt.runs.list(status={"failed"})] == [failed]
        # read once: an iterator of statuses is used up by the first look at it
        assert [s.run_id for s in rt.runs.list(status=(x for x in ["failed"]))] == [failed]
        stamp = dt.datetime.fromtimestamp(later / 1000, tz=dt.UTC)
        for since in (later, stamp, stamp.replace(tzinfo=None), stamp.isoformat()):
            assert [s.run_id for s in rt.runs.list(since=since)] == [failed], since
    runner = CliRunner()
    shown = runner.invoke(
        main,
        [
            "--url",
            sqlite_url,
            "--json",
            "runs",
            "list",
            "--status",
            "failed",
            "--status",
            "completed",
        ],
    )
    assert shown.exit_code == 0, shown.output
    assert [row["run_id"] for row in json.loads(shown.output)] == [done, failed]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"status": "done"}, "status: 'done' is no run status"),
        ({"since": -1}, "since: give a time as epoch milliseconds"),
        ({"since": "yesterday"}, "since: cannot read the time 'yesterday'"),
        ({"since": 1.5}, "since: give a time as epoch milliseconds"),
        ({"status": []}, "status: give at least one run status"),
        ({"status": ["failed", "done"]}, "status: 'done' is no run status"),
        ({"status": 3}, "status: give a run status or several"),
        ({"limit": 0}, "limit: give a number of runs >= 1"),
        ({"limit": True}, "limit: give a number of runs >= 1"),
    ],
)
def test_bad_filters_are_one_line_errors(kwargs: dict[str, object], message: str) -> None:
    """T2: a bad filter is a ValueError naming the argument; nothing is appended."""
    with journaled.open("memory://") as rt:
        before = rt.journal.position()
        with pytest.raises(ValueError, match=message):
            rt.runs.list(**kwargs)  # type: ignore[arg-type]
        assert rt.journal.position() == before


def test_the_projection_is_stored_off_the_append_path(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T2: executing stores no projection; list() and close() store it once far enough behind."""
    monkeypatch.setattr("journaled.actors.run_reads.SAVE_AFTER", 3)
    monkeypatch.setattr("journaled.runtime.SAVE_AFTER", 3)
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("ok", lambda _: "done")
        plan = journaled.Plan(goal="g", steps=[journaled.Step("a", tool="ok")])
        first = rt.execute(plan).run_id
        with _journal(sqlite_url) as journal:
            assert journal.snapshot(SUMMARIES_KEY) is None  # appends never write it
        rt.runs.list()
        with _journal(sqlite_url) as journal:
            stored = journal.snapshot(SUMMARIES_KEY)
            assert stored is not None
            assert stored[0] == journal.position()  # the reader stored what it folded
        second = rt.execute(plan).run_id
    with _journal(sqlite_url) as journal:
        stored = journal.snapshot(SUMMARIES_KEY)
        assert stored is not None
        assert stored[0] == journal.position()  # close stored the runs since
        assert set(RunSummaries(journal).read()) == {first, second}


def test_journal_verify_reports_a_forged_projection(sqlite_url: str) -> None:
    """T2/R7: a stored run-summary projection that differs from the fold is reported, named."""
    with journaled.open(sqlite_url) as rt:
        rt.register_skill("think", lambda _: "thought")
        plan = journaled.Plan(goal="g", steps=[journaled.Step("a", skill="think")])
        run_id = rt.execute(plan).run_id
        assert rt.runs.summaries.save()
    assert journaled.runtime.verify(sqlite_url).ok
    with _journal(sqlite_url) as journal:
        position, state = journal.snapshot(SUMMARIES_KEY) or (0, b"")
        forged = msgspec.msgpack.decode(inflate(state))
        forged["runs"][run_id]["calls_used"] = 0  # hide the call it used
        journal.save_snapshot(SUMMARIES_KEY, position, deflate(msgspec.msgpack.encode(forged)))
    report = journaled.runtime.verify(sqlite_url)
    assert report.problem is not None
    assert report.problem.kind == "snapshot-altered"
    assert SUMMARIES_KEY in report.problem.reason
    assert run_id in report.problem.reason


def test_the_asyncio_runtime_lists_the_same_summaries(sqlite_url: str) -> None:
    """T2/A1: await rt.runs.list(...), summary(...) and ids() answer as the sync runtime does."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("ok", lambda _: "done")
        plan = journaled.Plan(goal="g", steps=[journaled.Step("a", tool="ok")])
        made = [rt.execute(plan).run_id for _ in range(3)]
        sync = rt.runs.list(status="completed", limit=2)

    async def read() -> tuple[list[journaled.RunSummary], journaled.RunSummary, list[str]]:
        async with journaled.aio.open(sqlite_url) as art:
            listed = await art.runs.list(status="completed", limit=2)
            return listed, await art.runs.summary(made[0]), await art.runs.ids()

    listed, first, ids = asyncio.run(read())
    assert [s.as_dict() for s in listed] == [s.as_dict() for s in sync]
    assert [s.run_id for s in listed] == made[1:]
    assert (first.run_id, first.status) == (made[0], "completed")
    assert ids == made


def test_a_summary_is_its_run_id(tmp_path: Path) -> None:
    """T2/§5: runs.list() still serves as the list of run ids, oldest first, summaries attached."""
    with journaled.open(f"sqlite:///{tmp_path / 'j.sqlite'}") as rt:
        rt.register_tool("ok", lambda _: "done")
        plan = journaled.Plan(goal="g", steps=[journaled.Step("a", tool="ok")])
        made = [rt.execute(plan).run_id for _ in range(2)]
        listed = rt.runs.list()
        assert listed == made
        assert made[0] in listed
        assert rt.runs.why(listed[0]) == rt.runs.why(made[0])
        assert {s: s.status for s in listed} == dict.fromkeys(made, "completed")
        first = listed[0]
        assert isinstance(first, str)
        assert first.run_id == made[0]
        assert first.as_dict()["goal"] == "g"
        with pytest.raises(AttributeError, match="read-only"):
            first.status = "failed"
        again = pickle.loads(pickle.dumps(first))  # noqa: S301 -- our own bytes
        assert again == first
        assert again.as_dict() == first.as_dict()
        fields = {k: v for k, v in first.as_dict().items() if k not in ("run_id", "at")}
        later = journaled.RunSummary(first.run_id, **{**fields, "status": "failed"})
        assert later != first  # two summaries compare by what they say ...
        assert later == first.run_id  # ... and each by its id against a plain string
        assert len({first, later, first.run_id}) == 2
        assert "status='completed'" in repr(first)
        with pytest.raises(TypeError, match="no field 'colour'"):
            journaled.RunSummary("run_x", colour="red")


def test_since_keeps_a_run_that_is_running_now(sqlite_url: str, clock: ManualClock) -> None:
    """T2: a run inside one long step appends nothing, yet it is active now: ``since`` keeps
    it, while a run that settled before ``since`` is left out."""
    gate = threading.Event()
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("ok", lambda x: x)
        rt.register_tool("slow", lambda x: gate.wait(30))
        settled = rt.execute(Plan(goal="ok", steps=[Step("a", tool="ok", input=1)])).run_id
        handle = rt.start(Plan(goal="slow", steps=[Step("a", tool="slow")]))
        try:
            wait_for(lambda: rt.runs.state(handle.run_id).status.get("a") == "running", 30)
            clock.advance(3_600_000)
            kept = [s.run_id for s in rt.runs.list(since=clock())]
            assert kept == [handle.run_id]
            assert settled not in kept
        finally:
            gate.set()
        assert handle.result(30).ok
