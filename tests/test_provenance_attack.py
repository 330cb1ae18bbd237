"""Attacks on provenance (P1-P4) and its tenant boundary (R1): retries, waits, crashes, forks.

Each probe runs the real runtime on a real SQLite file (some also on PostgreSQL): reads made by
steps that run many times, facts changed in every way after a read, refresh of runs that are
still running or are forks of forks, and runtimes of another organization asking about it all.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import journaled
from journaled import AgentResult, NeedsInput, Plan, Retry, Step
from journaled.events.runs import MemoryRead
from journaled.testing import ManualClock

WAIT = 10.0
"""Seconds any thread or child process may take before the test fails instead of hanging."""
ROOT = Path(__file__).resolve().parent.parent

SHARED = pytest.mark.parametrize("journal_url", ["sqlite", "postgresql"], indirect=True)
"""Backends a second runtime can open on the same journal."""


@pytest.fixture
def srt(sqlite_url: str, clock: ManualClock) -> Iterator[journaled.Runtime]:
    """Yield a runtime on a real SQLite file with tool ``read`` (BM25 search through ctx)."""
    with journaled.open(sqlite_url, clock=clock) as runtime:
        runtime.register_tool("read", _read)
        yield runtime


def _read(query: str, ctx: Any) -> list[str]:
    return [f.id for f in ctx.memory.search(query)]


def _reads(rt: journaled.Runtime, run_id: str) -> list[tuple[str, int, tuple[str, ...]]]:
    return [
        (e.data.step_id, e.data.attempt, e.data.fact_ids)
        for e in rt.runs.history(run_id)
        if isinstance(e.data, MemoryRead)
    ]


def _stale(rt: journaled.Runtime, run_id: str | None = None) -> list[tuple[str, str, str, Any]]:
    return [(s.step_id, s.fact_id, s.change, s.replacement) for s in rt.runs.stale(run_id)]


def _one_step(tool: str, query: str, step_id: str = "a") -> Plan:
    return Plan(goal="g", steps=[Step(step_id, tool=tool, input=query)])


# -- P1: reads of steps that run more than once --------------------------------------------------


def test_each_retried_attempt_journals_its_reads_and_stale_counts_the_last(
    srt: journaled.Runtime,
) -> None:
    """P1/P3 (S2): a retried step records each attempt's reads with its attempt number, once;
    used_by lists both; stale judges only the attempt whose result stands."""
    alpha = srt.memory.remember("alpha route", conflict_key="alpha")
    beta = srt.memory.remember("beta route", conflict_key="beta")

    def flaky(query: str, ctx: Any) -> list[str]:
        if ctx.attempt == 1:
            ctx.memory.search("alpha")
            ctx.memory.get(alpha.id)  # read twice: still one id
            raise RuntimeError("first attempt fails")
        return [f.id for f in ctx.memory.search("beta")]

    srt.register_tool("flaky", flaky, retry=Retry(attempts=3))
    result = srt.execute(_one_step("flaky", "x"))
    assert result.ok, result.observations
    assert _reads(srt, result.run_id) == [("a", 1, (alpha.id,)), ("a", 2, (beta.id,))]
    assert [(u.run_id, u.step_id) for u in srt.memory.used_by(alpha.id)] == [(result.run_id, "a")]
    srt.memory.remember("alpha route moved", conflict_key="alpha")
    assert srt.runs.stale(result.run_id) == []  # the attempt that read alpha was redone
    newer = srt.memory.remember("beta route moved", conflict_key="beta")
    assert _stale(srt, result.run_id) == [("a", beta.id, "superseded", newer.id)]


def test_a_waiting_agent_counts_the_reads_of_the_attempt_that_answered(
    srt: journaled.Runtime,
) -> None:
    """P1/P3 (E10): the reads before a question are journaled with the wait; after the answer
    the re-run's reads are the ones stale judges."""
    alpha = srt.memory.remember("alpha region", conflict_key="alpha")
    beta = srt.memory.remember("beta region", conflict_key="beta")

    def asker(step: Step, ctx: Any) -> AgentResult:
        if ctx.answer is None:
            ctx.memory.search("alpha")
            raise NeedsInput("which region?")
        return AgentResult(ok=True, output=[f.id for f in ctx.memory.search(ctx.answer)])

    srt.register_agent("asker", asker)
    waiting = srt.execute(Plan(goal="g", steps=[Step("q", agent="asker")]))
    assert waiting.waiting == ["q"]
    assert _reads(srt, waiting.run_id) == [("q", 1, (alpha.id,))]
    done = srt.resume(waiting.run_id, answers={"q": "beta"})
    assert isinstance(done, journaled.ExecuteResult)
    assert done.ok, done.observations
    assert _reads(srt, waiting.run_id) == [("q", 1, (alpha.id,)), ("q", 2, (beta.id,))]
    srt.memory.delete(alpha.id)
    assert srt.runs.stale(waiting.run_id) == []
    srt.memory.delete(beta.id)
    assert _stale(srt, waiting.run_id) == [("q", beta.id, "deleted", None)]


@SHARED
def test_a_step_sees_and_records_no_fact_of_another_organization(
    journal_url: str, clock: ManualClock
) -> None:
    """P1/R1: ctx.memory of another organization's runtime finds none of acme's facts, by id or
    by search, and journals only the ids it was given; acme's fact shows no use."""
    with journaled.open(journal_url, organization="acme", clock=clock) as acme:
        secret = acme.memory.remember("acme merger target globex", scope="organization")
        shared = acme.memory.remember("merger rules are public", scope="project")
    seen: list[Any] = []

    def snoop(_: Any, ctx: Any) -> int:
        seen.append(ctx.memory.get(secret.id))
        seen.extend(f.id for f in ctx.memory.search("merger globex"))
        seen.extend(f.id for f in ctx.memory.all())
        return len(seen)

    with journaled.open(journal_url, organization="other", clock=clock) as other:
        other.register_tool("snoop", snoop)
        result = other.execute(_one_step("snoop", "x"))
        assert result.ok, result.observations
        assert seen == [None, shared.id, shared.id]
        assert _reads(other, result.run_id) == [("a", 1, (shared.id,))]
        assert [u.run_id for u in other.memory.used_by(shared.id)] == [result.run_id]
    with journaled.open(journal_url, organization="acme", clock=clock) as acme:
        assert acme.memory.used_by(secret.id) == []
        assert acme.memory.used_by(shared.id) == []  # other's run is unknown here (ADR 0074)


_CRASH_SCRIPT = r"""
import json, sys, threading
import journaled
from journaled import Plan, Step

cfg = json.loads(sys.argv[1])


def work(query, ctx):
    ids = [f.id for f in ctx.memory.search(query)]
    note = ctx.memory.remember("note of attempt %d" % ctx.attempt, conflict_key="note")
    with open(cfg["marker"] + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"run": ctx.run_id, "note": note.id}, f)
    import os
    os.replace(cfg["marker"] + ".tmp", cfg["marker"])
    threading.Event().wait()
    return ids


with journaled.open(cfg["url"]) as rt:
    rt.register_tool("work", work)
    print(rt.execute(Plan(goal="g", steps=[Step("a", tool="work", input="deploy")])).ok)
"""


def _run_until_marker(
    script: Path, config: str, marker: Path, log: Path
) -> subprocess.Popen[bytes]:
    """Start ``python script config`` (its output to ``log``); return once ``marker`` exists."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(script), config], cwd=ROOT, stdout=out, stderr=out
        )
    deadline = time.monotonic() + 30
    while not marker.exists():
        if proc.poll() is not None:
            pytest.fail(f"the child exited ({proc.returncode}) early:\n{log.read_text()}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait(timeout=WAIT)
            pytest.fail("the child's step never started")
        time.sleep(0.01)  # polling for the marker the step writes, not synchronisation
    return proc


def test_a_step_killed_after_reading_resumes_with_one_read_and_true_provenance(
    sqlite_url: str, tmp_path: Path
) -> None:
    """P1/P2/R8/E14: a step SIGKILLed after reading and remembering records no read for the lost
    attempt; while its process lives another process cannot resume the run; the resumed
    attempt's read is journaled once (attempt 2), and both remembered notes name the step."""
    with journaled.open(sqlite_url) as rt:
        fact = rt.memory.remember("deploy to eu-west", conflict_key="deploy")
    script = tmp_path / "child.py"
    script.write_text(_CRASH_SCRIPT, encoding="utf-8")
    marker = tmp_path / "in-flight.json"
    config = json.dumps({"url": sqlite_url, "marker": str(marker)})
    proc = _run_until_marker(script, config, marker, tmp_path / "child.log")
    try:
        started = json.loads(marker.read_text(encoding="utf-8"))
        run_id, first_note = started["run"], started["note"]
        with journaled.open(sqlite_url) as rt:
            rt.register_tool("work", lambda q, ctx: [f.id for f in ctx.memory.search(q)])
            end = rt.journal.position()
            with pytest.raises(journaled.RunOwnedElsewhere):
                rt.resume(run_id)
            assert rt.journal.position() == end  # the refused resume appended nothing
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=WAIT)
    assert proc.returncode == -signal.SIGKILL
    with journaled.open(sqlite_url) as rt:
        notes: list[str] = []

        def work(query: str, ctx: Any) -> list[str]:
            notes.append(ctx.memory.remember("note again", conflict_key="note").id)
            return [f.id for f in ctx.memory.search(query)]

        rt.register_tool("work", work)
        assert _reads(rt, run_id) == []  # the killed attempt's read was never journaled
        result = rt.resume(run_id)
        assert isinstance(result, journaled.ExecuteResult)
        assert result.ok, result.observations
        assert _reads(rt, run_id) == [("a", 2, (fact.id,))]
        assert [(u.run_id, u.step_id) for u in rt.memory.used_by(fact.id)] == [(run_id, "a")]
        for note in (first_note, *notes):
            remembered = rt.memory.remembered(note)
            assert remembered is not None
            assert (remembered.run_id, remembered.step_id) == (run_id, "a")
            assert f"by step 'a' of run {run_id}" in rt.memory.why(note)
        again = rt.memory.get(notes[0])
        assert again is not None
        assert again.supersedes == (first_note,)


def test_reads_of_a_child_run_belong_to_the_child_step(srt: journaled.Runtime) -> None:
    """P1/P2 (E9): a read made in a plan an agent runs through ctx.execute is journaled on the
    child run's step, not on the agent's; stale names the child run."""
    fact = srt.memory.remember("deploy to eu-west", conflict_key="deploy")

    def boss(step: Step, ctx: Any) -> AgentResult:
        child = ctx.execute(_one_step("read", "deploy", "look"))
        return AgentResult(ok=child.ok, output=child.run_id, calls_used=0)

    srt.register_agent("boss", boss)
    parent = srt.execute(Plan(goal="g", steps=[Step("p", agent="boss")]))
    assert parent.ok, parent.observations
    child_id = parent.observations[0].output
    assert isinstance(child_id, str)
    assert _reads(srt, parent.run_id) == []
    assert _reads(srt, child_id) == [("look", 1, (fact.id,))]
    assert [(u.run_id, u.step_id) for u in srt.memory.used_by(fact.id)] == [(child_id, "look")]
    newer = srt.memory.remember("deploy to us-east", conflict_key="deploy")
    assert [(s.run_id, s.step_id, s.replacement) for s in srt.runs.stale()] == [
        (child_id, "look", newer.id)
    ]


# -- P3: every way a read fact can change ---------------------------------------------------------


def test_stale_follows_the_supersession_chain_through_delete_and_purge(
    srt: journaled.Runtime,
) -> None:
    """P3/M3/M8: superseded twice names the fact that superseded the one read; a delete of that
    superseder re-links the read fact and stale names the new superseder; a purge of the last
    one makes the first fact current again, so its read is no longer stale."""
    red = srt.memory.remember("colour red", conflict_key="colour")
    first = srt.execute(_one_step("read", "colour", "r1"))
    blue = srt.memory.remember("colour blue", conflict_key="colour")
    second = srt.execute(_one_step("read", "colour", "r2"))
    green = srt.memory.remember("colour green", conflict_key="colour")
    assert _reads(srt, first.run_id) == [("r1", 1, (red.id,))]
    assert _reads(srt, second.run_id) == [("r2", 1, (blue.id,))]
    assert _stale(srt, first.run_id) == [("r1", red.id, "superseded", blue.id)]
    assert _stale(srt, second.run_id) == [("r2", blue.id, "superseded", green.id)]
    srt.memory.delete(blue.id)  # red <- blue <- green heals to red <- green
    assert _stale(srt, first.run_id) == [("r1", red.id, "superseded", green.id)]
    assert _stale(srt, second.run_id) == [("r2", blue.id, "deleted", None)]
    assert srt.memory.purge(green.id, reason="wrong colour")
    current = srt.memory.get(red.id)
    assert current is not None
    assert current.superseded_by is None
    assert srt.runs.stale(first.run_id) == []
    assert _stale(srt, second.run_id) == [("r2", blue.id, "deleted", None)]


def test_expiry_counts_only_when_it_comes_after_the_read(
    srt: journaled.Runtime, clock: ManualClock
) -> None:
    """P3/M5: a fact already expired when all() returned it is not stale; one that expires after
    the read is 'expired', with the read's position."""
    now = clock.now
    gone = srt.memory.remember("old office hours", valid_until=now + 5)
    later = srt.memory.remember("new office hours", valid_until=now + 10_000)
    clock.advance(100)
    srt.register_tool("every", lambda _, ctx: [f.id for f in ctx.memory.all()])
    run = srt.execute(_one_step("every", "x"))
    assert _reads(srt, run.run_id) == [("a", 1, (gone.id, later.id))]
    assert srt.runs.stale(run.run_id) == []
    clock.advance(20_000)
    (stale,) = srt.runs.stale(run.run_id)
    assert (stale.fact_id, stale.change, stale.replacement) == (later.id, "expired", None)
    assert stale.position == srt.memory.used_by(later.id)[0].position


def test_a_purged_run_still_reports_its_stale_reads_but_is_not_refreshed(
    srt: journaled.Runtime,
) -> None:
    """P3/P4/R2: after runs.purge the reads' ids (not content) still answer stale and used_by;
    refresh refuses the purged run with RunNotResumable and creates no run."""
    fact = srt.memory.remember("deploy to eu-west", conflict_key="deploy")
    run = srt.execute(_one_step("read", "deploy"))
    newer = srt.memory.remember("deploy to us-east", conflict_key="deploy")
    srt.runs.purge(run.run_id, "erase the run")
    assert _stale(srt, run.run_id) == [("a", fact.id, "superseded", newer.id)]
    assert [u.run_id for u in srt.memory.used_by(fact.id)] == [run.run_id]
    before, end = srt.runs.ids(), srt.journal.position()
    with pytest.raises(journaled.RunNotResumable, match="purged"):
        srt.runs.refresh(run.run_id)
    assert srt.runs.ids() == before
    assert srt.journal.position() == end


@pytest.mark.parametrize("bad", [5, "", "mem_nope", "key:deploy"])
def test_stale_and_refresh_of_what_is_no_run_raise_run_not_found(
    srt: journaled.Runtime, bad: Any
) -> None:
    """P3/P4: an id that names no run (an int, the empty text, a fact, a conflict key) raises
    RunNotFound naming it; used_by of such an id is empty; nothing is appended."""
    srt.memory.remember("deploy to eu-west", conflict_key="deploy")
    fact = srt.memory.remember("a fact", conflict_key="other")
    name = fact.id if bad == "mem_nope" else bad
    end = srt.journal.position()
    with pytest.raises(journaled.RunNotFound, match=str(name) if name else "no run"):
        srt.runs.stale(name)
    with pytest.raises(journaled.RunNotFound):
        srt.runs.refresh(name)
    if not isinstance(name, str) or not name.startswith("mem_"):
        assert srt.memory.used_by(name) == []
    assert srt.journal.position() == end


# -- P4: refresh of runs that are running, and of forks of forks --------------------------------


def test_refresh_of_a_running_run_forks_what_had_succeeded_and_leaves_the_source(
    srt: journaled.Runtime,
) -> None:
    """P4/F1: refresh of a run whose stale step succeeded while a later step still runs makes a
    fork re-pending the stale step and its dependents; the source finishes untouched."""
    fact = srt.memory.remember("deploy to eu-west", conflict_key="deploy")
    inside, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def hold(value: Any) -> Any:
        ran.append(f"hold:{value}")
        inside.set()
        release.wait(WAIT)
        return value

    srt.register_tool("hold", hold)
    plan = Plan(
        goal="g",
        steps=[Step("a", tool="read", input="deploy"), Step("b", tool="hold", depends_on=["a"])],
    )
    results: list[journaled.ExecuteResult] = []
    thread = threading.Thread(target=lambda: results.append(srt.execute(plan)))
    thread.start()
    try:
        assert inside.wait(WAIT)
        (run_id,) = srt.runs.active()
        newer = srt.memory.remember("deploy to us-east", conflict_key="deploy")
        fork = srt.runs.refresh(run_id)
    finally:
        release.set()
        thread.join(WAIT)
    assert not thread.is_alive()
    (source,) = results
    assert source.ok
    assert source.run_id == run_id
    assert [lin.run_id for lin in srt.runs.lineage(fork)] == [run_id, fork]
    ran.clear()
    again = srt.resume(fork)
    assert isinstance(again, journaled.ExecuteResult)
    assert again.ok, again.observations
    assert ran == ["hold:None"]  # b re-ran after a
    assert {o.step_id: o.output for o in again.observations}["a"] == [newer.id]
    assert srt.runs.stale(fork) == []
    assert _stale(srt, run_id) == [("a", fact.id, "superseded", newer.id)]  # source untouched


def test_refresh_of_a_fork_of_a_fork_reruns_the_fork_s_own_step(srt: journaled.Runtime) -> None:
    """P4/F1/F2: a fork whose replaced step read a fact that changed is refreshed with that
    step's definition in the fork (not the source's); lineage runs root to the new run."""
    alpha = srt.memory.remember("alpha region", conflict_key="alpha")
    beta = srt.memory.remember("beta region", conflict_key="beta")
    plan = Plan(
        goal="g",
        steps=[Step("a", tool="read", input="alpha"), Step("b", tool="read", input="nothing")],
    )
    source = srt.execute(plan)
    fork = srt.runs.fork(source.run_id, replace={"a": Step("a", tool="read", input="beta")})
    forked = srt.resume(fork)
    assert isinstance(forked, journaled.ExecuteResult)
    assert forked.ok
    assert _reads(srt, fork) == [("a", 1, (beta.id,))]
    newer = srt.memory.remember("beta region moved", conflict_key="beta")
    assert srt.runs.stale(source.run_id) == []
    assert _stale(srt, fork) == [("a", beta.id, "superseded", newer.id)]
    second = srt.runs.refresh(fork)
    assert [lin.run_id for lin in srt.runs.lineage(second)] == [source.run_id, fork, second]
    done = srt.resume(second)
    assert isinstance(done, journaled.ExecuteResult)
    assert done.ok
    assert {o.step_id: o.output for o in done.observations}["a"] == [newer.id]
    assert _reads(srt, second) == [("a", 1, (newer.id,))]
    assert srt.runs.stale(second) == []
    assert alpha.id not in {u for r in _reads(srt, second) for u in r[2]}


@SHARED
@pytest.mark.parametrize("organization", ["other", None])
def test_another_organization_cannot_refresh_or_see_changes_of_acmes_facts(
    journal_url: str, clock: ManualClock, organization: str | None
) -> None:
    """P2/P3/P4/R1: for a runtime of another organization (or none) acme's stale run is
    unknown (ADR 0074): stale and refresh refuse it naming no fact of acme, and no run is made;
    used_by and why of acme's fact answer as for an unknown id. Acme still sees it all."""
    with journaled.open(journal_url, organization="acme", clock=clock) as acme:
        secret = acme.memory.remember("acme target globex", scope="organization", conflict_key="t")
        acme.register_tool("read", _read)
        run = acme.execute(_one_step("read", "globex"))
        newer = acme.memory.remember("acme target initech", scope="organization", conflict_key="t")
    with journaled.open(journal_url, organization=organization, clock=clock) as rt:
        with pytest.raises(journaled.RunNotFound):  # acme's run is unknown here (ADR 0074)
            rt.runs.stale(run.run_id)
        assert rt.runs.stale() == []
        before, end = rt.runs.ids(), rt.journal.position()
        assert run.run_id not in before
        with pytest.raises(journaled.RunNotFound) as refused:
            rt.runs.refresh(run.run_id)
        assert secret.id not in str(refused.value)
        assert newer.id not in str(refused.value)
        assert (rt.runs.ids(), rt.journal.position()) == (before, end)
        assert rt.memory.used_by(secret.id) == []
        assert rt.memory.why(secret.id) == f"no fact {secret.id} in this journal"
    with journaled.open(journal_url, organization="acme", clock=clock) as acme:
        assert _stale(acme, run.run_id) == [("a", secret.id, "superseded", newer.id)]
