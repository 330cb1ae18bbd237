"""Run data is redacted before it is journaled, and a finished run's content can be erased (M9, R2).

Fake secrets are assembled at run time so that no literal here looks like a live credential.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

import journaled
from journaled import AgentResult, Clarify, NeedsInput, Observation, Plan, Step, timeline
from journaled.cli import main
from journaled.events.base import PURGED
from journaled.events.journal import PAYLOAD_TABLE
from journaled.events.redact import REDACTED
from journaled.testing import ManualClock, wait_for

GITHUB = "ghp_" + "R4nd0mT0k3n" * 4
PASSWORD = "hunter2-" + "Xy9" * 3
MARK = "quokka-7731"
"""Content that is no secret (redaction keeps it) but must leave storage when purged."""


def _journal_text(rt: journaled.Runtime) -> str:
    """Return every event of the journal as JSON text, content included while it exists."""
    return "".join(msgspec.json.encode(e).decode() for e in rt.journal.read())


def _bytes_on_disk(url: str) -> bytes:
    directory = Path(url.removeprefix("sqlite:///")).parent
    return b"".join(p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file())


def _asker(step: Step, ctx: journaled.AgentContext) -> AgentResult:
    if ctx.answer is None:
        raise NeedsInput(f"which key, {GITHUB} or the other? ({MARK}-question)")
    return AgentResult(output=f"went with {ctx.answer}", calls_used=0)


class _Planner:
    """Ask one question, then plan one step."""

    def __init__(self, question: str, step: Step) -> None:
        self.question, self.step = question, step

    def __call__(
        self, goal: str, observations: list[Observation], clarifications: list[tuple[str, str]]
    ) -> object:
        if not clarifications:
            return Clarify(self.question)
        return Plan(goal=goal, steps=[self.step])


def test_run_data_is_redacted_before_it_is_journaled(journal_url: str, clock: ManualClock) -> None:
    """M9: goal, inputs, outputs, errors, questions, answers and clarifications lose secrets."""
    seen: list[Any] = []

    def leak(data: Any) -> str:
        seen.append(data)
        return f"deployed with token {GITHUB}"

    def boom(data: Any) -> str:
        raise RuntimeError(f"login failed: password={PASSWORD}")

    with journaled.open(journal_url, clock=clock) as rt:
        rt.register_tool("leak", leak)
        rt.register_tool("boom", boom)
        rt.register_agent("asker", _asker)
        plan = Plan(
            goal=f"deploy using {GITHUB}",
            steps=[
                Step("a", tool="leak", input={"password": PASSWORD, "note": f"key {GITHUB}"}),
                Step("b", tool="boom"),
                Step("c", agent="asker"),
            ],
        )
        first = rt.execute(plan)
        assert first.waiting == ["c"]
        done = rt.resume(first.run_id, answers={"c": f"password={PASSWORD}"})
        outcome = rt.orchestrate(
            f"reach it with {GITHUB}", _Planner(f"is {GITHUB} right?", Step("x", tool="leak"))
        )
        assert outcome.status == "waiting_for_clarification"
        rt.resume(outcome.run_id, clarification=f"yes, password={PASSWORD}")
        text = _journal_text(rt)
        assert GITHUB not in text
        assert PASSWORD not in text
        assert REDACTED in text
        # The step receives what the journal holds, so a resume runs it the same way.
        assert seen[0] == {"password": REDACTED, "note": f"key {REDACTED}"}
        # Live and replayed state agree (R5): both hold the redacted values.
        replayed = rt.runs.at(first.run_id, rt.journal.position())
        assert replayed.observations == done.observations
    if journal_url.startswith("sqlite"):
        disk = _bytes_on_disk(journal_url)
        assert GITHUB.encode() not in disk
        assert PASSWORD.encode() not in disk


def _story(rt: journaled.Runtime) -> tuple[str, str]:
    """Run a plan with a child run and a question, and an orchestration; return their ids."""

    def child_agent(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        child = ctx.execute(
            Plan(goal=f"{MARK}-child-goal", steps=[Step("x", tool="echo", input=f"{MARK}-in")])
        )
        return AgentResult(output=child.observations[0].output, calls_used=0)

    def fail(data: Any) -> str:
        raise RuntimeError(f"{MARK}-error")

    rt.register_tool("echo", lambda data: f"{data}-out")
    rt.register_tool("fail", fail)
    rt.register_agent("asker", _asker)
    rt.register_agent("parent", child_agent)
    plan = Plan(
        goal=f"{MARK}-goal",
        steps=[
            Step("a", tool="echo", input={"text": f"{MARK}-input"}),
            Step("b", tool="fail"),
            Step("c", agent="asker"),
            Step("d", agent="parent", depends_on=["a"]),
        ],
    )
    first = rt.execute(plan)
    assert first.waiting == ["c"]
    rt.resume(first.run_id, answers={"c": f"{MARK}-answer"})
    outcome = rt.orchestrate(
        f"{MARK}-orchestration", _Planner(f"{MARK}-clarify?", Step("y", tool="echo", input=MARK))
    )
    rt.resume(outcome.run_id, clarification=f"{MARK}-clarification")
    return first.run_id, outcome.run_id


def test_purge_erases_content_and_keeps_shape(journal_url: str, clock: ManualClock) -> None:
    """R2: purge erases a run's content (child runs too); why, history, at, diff, timeline read."""
    with journaled.open(journal_url, clock=clock) as rt:
        run_id, orchestration = _story(rt)
        assert f"{MARK}-goal" in _journal_text(rt)
        child_id = rt.runs.at(run_id, rt.journal.position()).observations[-1].agent_task_id
        assert child_id is not None
        end = rt.journal.position()
        before = rt.runs.at(run_id, end)
        kinds = [e.kind for e in rt.runs.history(run_id)]

        assert rt.runs.purge(run_id, reason="erasure request 42") > 0

        text = "".join(msgspec.json.encode(rt.runs.history(s)).decode() for s in (run_id, child_id))
        assert MARK not in text
        assert [e.kind for e in rt.runs.history(run_id)] == [*kinds, "run.purged"]
        assert rt.runs.history(child_id)[-1].kind == "run.purged"
        after = rt.runs.at(run_id, end)
        assert [s.status for s in after.plan.steps] == [s.status for s in before.plan.steps]
        assert [s.id for s in after.plan.steps] == ["a", "b", "c", "d"]
        assert after.calls_used == before.calls_used
        assert after.plan.goal == PURGED
        assert {o.output for o in after.observations if o.output is not None} == {PURGED}
        why = rt.runs.why(run_id)
        assert "content purged: erasure request 42" in why
        assert MARK not in why
        start = rt.runs.history(run_id)[0].position
        assert MARK not in msgspec.json.encode(rt.runs.diff(run_id, start, end)).decode()
        with pytest.raises(journaled.RunNotResumable, match="purged"):
            rt.resume(run_id)
        assert rt.runs.purge(run_id, reason="again") == 0  # nothing left to erase

        page = timeline.render(rt, run_id)
        assert "content purged" in page
        assert MARK not in page

        assert rt.runs.purge(orchestration, reason="erasure request 43") > 0
        assert MARK not in _journal_text(rt)
        assert "content purged: erasure request 43" in rt.runs.why(orchestration)
        report = rt.journal.verify()  # R7: erasing content keeps the digest chain whole
        assert report.ok, report.problem
        assert report.events == len(rt.journal.read())
        assert report.unchained == 0
    if journal_url.startswith("memory"):
        return  # an in-memory journal ends with its runtime
    with journaled.open(journal_url, clock=clock) as rt:
        assert MARK not in _journal_text(rt)
        assert rt.runs.at(run_id, end).plan.goal == PURGED
    if journal_url.startswith("sqlite"):
        assert MARK.encode() not in _bytes_on_disk(journal_url)


def test_purge_refuses_an_unfinished_run(journal_url: str, clock: ManualClock) -> None:
    """R2: a run with a step in flight cannot be purged; nothing is appended, content stays."""
    release = threading.Event()
    entered = threading.Event()

    def slow(data: Any) -> str:
        entered.set()
        release.wait(10)
        return f"{MARK}-late"

    with journaled.open(journal_url, clock=clock) as rt:
        rt.register_tool("slow", slow)
        results: list[Any] = []
        worker = threading.Thread(
            target=lambda: results.append(
                rt.execute(Plan(goal=f"{MARK}-goal", steps=[Step("s", tool="slow")]))
            )
        )
        worker.start()
        try:
            assert entered.wait(10)
            wait_for(lambda: bool(rt.runs.active()))
            [run_id] = rt.runs.active()
            position = rt.journal.position()
            with pytest.raises(journaled.RunNotPurgeable, match="not finished"):
                rt.runs.purge(run_id, reason="too early")
            assert rt.journal.position() == position
        finally:
            release.set()
            worker.join(10)
        assert results[0].ok
        assert rt.runs.purge(run_id, reason="now it is done") == 2
        with pytest.raises(ValueError, match="reason"):
            rt.runs.purge(run_id, reason=" ")


def test_old_inline_run_events_still_read_and_refuse_purge(
    sqlite_url: str, clock: ManualClock
) -> None:
    """J6, R2: run events an older release stored inline decode; purging them is refused."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("echo", lambda data: f"{data}-out")
        run_id = rt.execute(Plan(goal=f"{MARK}-goal", steps=[Step("a", tool="echo", input=MARK)]))
        run_id_text = run_id.run_id
        # Release 1 stored the whole event, tag included, in the row.
        whole = {
            f"{e.stream}@{e.version}": msgspec.msgpack.encode(e.data)
            for e in rt.runs.history(run_id_text)
        }
    # Rewrite the rows as release 1 stored them: content inline, at version 1, no side row.
    path = sqlite_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT originator_id, originator_version, topic FROM stored_events "
            "WHERE topic LIKE '%@2'"
        ).fetchall()
        assert rows
        for stream, version, topic in rows:
            key = f"{stream}@{version}"
            conn.execute(
                "UPDATE stored_events SET topic = ?, state = ? "
                "WHERE originator_id = ? AND originator_version = ?",
                [topic.replace("@2", "@1"), whole[key], stream, version],
            )
            conn.execute(f"DELETE FROM {PAYLOAD_TABLE} WHERE stream = ?", [key])  # noqa: S608
        conn.execute("DELETE FROM journaled_snapshots")
    with journaled.open(sqlite_url, clock=clock) as rt:
        assert rt.runs.ids() == [run_id_text]
        state = rt.runs.at(run_id_text, rt.journal.position())
        assert state.plan.goal == f"{MARK}-goal"
        assert state.observations[0].output == f"{MARK}-out"
        assert f"{MARK}-goal" in rt.runs.why(run_id_text)
        position = rt.journal.position()
        with pytest.raises(journaled.RunNotPurgeable, match="older release"):
            rt.runs.purge(run_id_text, reason="old")
        assert rt.journal.position() == position


def test_cli_runs_purge(sqlite_url: str) -> None:
    """R2: journaled runs purge RUN --reason erases content; an unknown run is a one-line error."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("echo", lambda data: f"{data}-out")
        run_id = rt.execute(Plan(goal=f"{MARK}-goal", steps=[Step("a", tool="echo")])).run_id
    runner = CliRunner()
    out = runner.invoke(main, ["--url", sqlite_url, "runs", "purge", run_id, "--reason", "gdpr"])
    assert out.exit_code == 0, out.output
    assert "purged run" in out.output
    why = runner.invoke(main, ["--url", sqlite_url, "runs", "why", run_id])
    assert "content purged: gdpr" in why.output
    assert MARK not in why.output
    tail = runner.invoke(main, ["--url", sqlite_url, "journal", "tail"])
    assert tail.exit_code == 0, tail.output
    assert MARK not in tail.output
    missing = runner.invoke(
        main, ["--url", sqlite_url, "runs", "purge", "run_nope", "--reason", "x"]
    )
    assert missing.exit_code != 0
    assert "no run 'run_nope'" in missing.output
    assert MARK.encode() not in _bytes_on_disk(sqlite_url)


def test_cli_runs_purge_takes_the_reason_after_the_run_id(sqlite_url: str) -> None:
    """R2: `runs purge RUN REASON`, as rt.runs.purge(run_id, reason) takes it, or --reason;
    both at once, or none, is a one-line error that purges nothing."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("echo", lambda data: f"{data}-out")
        first = rt.execute(Plan(goal=f"{MARK}-goal", steps=[Step("a", tool="echo")])).run_id
        second = rt.execute(Plan(goal="kept", steps=[Step("a", tool="echo")])).run_id
    runner = CliRunner()
    for args in (["--reason", "x", "y"], []):
        refused = runner.invoke(main, ["--url", sqlite_url, "runs", "purge", second, *args])
        assert refused.exit_code == 1, refused.output
        assert "reason" in refused.output
        assert len(refused.output.strip().splitlines()) == 1
    out = runner.invoke(main, ["--url", sqlite_url, "runs", "purge", first, "gdpr request"])
    assert out.exit_code == 0, out.output
    why = runner.invoke(main, ["--url", sqlite_url, "runs", "why", first])
    assert "content purged: gdpr request" in why.output
    with journaled.open(sqlite_url) as rt:
        assert rt.runs.summary(second).goal == "kept"


def test_purged_run_content_leaves_postgresql_pages_and_files(pg_url: str) -> None:
    """R2: after runs.purge the content is in no row, no page and no data file of PostgreSQL."""
    psycopg = pytest.importorskip("psycopg")
    from required import unavailable
    from test_postgres import _files_holding, _pageinspect, _pages_holding

    marker = MARK.encode()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        inspect = _pageinspect(conn)
        files = _files_holding(conn, marker) is not None
        if not (inspect or files):
            unavailable("POSTGRES", "neither pageinspect nor the server's data files are readable")
        with journaled.open(pg_url, clock=ManualClock(step=1)) as rt:
            run_id, orchestration = _story(rt)
            rows = conn.execute(
                f"SELECT count(*) FROM {PAYLOAD_TABLE} WHERE position(%s::bytea IN payload) > 0",  # noqa: S608
                [marker],
            ).fetchone()
            assert rows is not None
            assert rows[0] > 0
            if inspect:
                assert _pages_holding(conn, marker)
            assert rt.runs.purge(run_id, reason="erasure") > 0
            assert rt.runs.purge(orchestration, reason="erasure") > 0
        rows = conn.execute(
            f"SELECT count(*) FROM {PAYLOAD_TABLE} WHERE position(%s::bytea IN payload) > 0",  # noqa: S608
            [marker],
        ).fetchone()
        assert rows is not None
        assert rows[0] == 0
        if inspect:
            assert _pages_holding(conn, marker) == []
        if files:
            assert _files_holding(conn, marker) == []


def test_purge_reason_of_a_fact_is_redacted(rt: journaled.Runtime) -> None:
    """M9: the reason given to memory.purge is journaled without the secrets it quotes."""
    fact = rt.memory.remember("the deploy key moved to the vault")
    assert rt.memory.purge(fact.id, reason=f"it quoted {GITHUB}")
    assert GITHUB not in _journal_text(rt)
    assert f"it quoted {REDACTED}" in rt.memory.why(fact.id)
