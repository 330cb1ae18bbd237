"""Provenance (P1-P4), accounting (R6) and the tenant boundary (R1) at their edges: where a
read begins (ADR 0062), what a fork carries, retries that read nothing, reserve answers a journal
cannot hold, provenance that names no run, and run events seen by another organization."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import journaled
from journaled import AgentResult, Plan, Retry, RunNotFound, Step
from journaled.events.base import Event
from journaled.events.memory import FactRemembered, FactSuperseded
from journaled.events.plan_rules import ReserveFailed, reservation
from journaled.events.provenance import stale_reads
from journaled.events.runs import BudgetStopped, CallsOverrun, MemoryRead, StepWaiting
from journaled.testing import ManualClock

WAIT = 10.0
"""Seconds any thread may take before the test fails instead of hanging."""


@pytest.fixture
def srt(sqlite_url: str, clock: ManualClock) -> Iterator[journaled.Runtime]:
    """Yield a runtime on a real SQLite file with tool ``read`` (BM25 search through ctx)."""
    with journaled.open(sqlite_url, clock=clock) as runtime:
        runtime.register_tool("read", lambda q, ctx: [f.id for f in ctx.memory.search(q)])
        yield runtime


def _execute_while(
    rt: journaled.Runtime, plan: Plan, inside: threading.Event, during: Any
) -> journaled.ExecuteResult:
    """Execute ``plan`` in a thread; once ``inside`` is set, call ``during()``, then let it end."""
    results: list[journaled.ExecuteResult] = []
    thread = threading.Thread(target=lambda: results.append(rt.execute(plan)))
    thread.start()
    try:
        assert inside.wait(WAIT)
        during()
    finally:
        inside.set()
        thread.join(WAIT)
    assert not thread.is_alive(), "the run did not end"
    (result,) = results
    return result


def test_a_fact_superseded_while_its_reader_runs_is_stale(srt: journaled.Runtime) -> None:
    """P3: a supersession landing between a step's read and its result makes the step stale."""
    old = srt.memory.remember("deploy to eu-west", conflict_key="deploy")
    read_done, go = threading.Event(), threading.Event()

    def slow_read(query: str, ctx: Any) -> list[str]:
        found = [f.text for f in ctx.memory.search(query)]
        read_done.set()
        go.wait(WAIT)
        return found

    srt.register_tool("slow", slow_read)
    news: list[str] = []

    def supersede() -> None:
        news.append(srt.memory.remember("deploy to us-east", conflict_key="deploy").id)
        go.set()

    plan = Plan(goal="g", steps=[Step("a", tool="slow", input="deploy")])
    result = _execute_while(srt, plan, read_done, supersede)
    assert result.observations[0].output == ["deploy to eu-west"]
    assert [(s.step_id, s.fact_id, s.change, s.replacement) for s in srt.runs.stale()] == [
        ("a", old.id, "superseded", news[0])
    ]


def test_a_fact_that_expires_while_its_reader_runs_is_stale(
    srt: journaled.Runtime, clock: ManualClock
) -> None:
    """P3: a fact read while valid, expiring before the step's result, makes the step stale."""
    fact = srt.memory.remember("office open today", valid_until=clock.now + 1_000)

    def slow_read(query: str, ctx: Any) -> list[str]:
        found = [f.id for f in ctx.memory.search(query)]
        clock.advance(5_000)  # the step takes 5 s; the fact expires meanwhile
        return found

    srt.register_tool("slow", slow_read)
    result = srt.execute(Plan(goal="g", steps=[Step("a", tool="slow", input="office")]))
    assert result.observations[0].output == [fact.id]
    assert [(s.fact_id, s.change) for s in srt.runs.stale(result.run_id)] == [(fact.id, "expired")]


def test_a_fork_that_carried_a_stale_read_is_stale_and_refreshable(
    srt: journaled.Runtime,
) -> None:
    """P3/P4/F1: a step carried into a fork is stale there when the fact it read changes."""
    fact = srt.memory.remember("region is north", conflict_key="region")
    srt.register_tool("t", lambda x: x)
    plan = Plan(
        goal="g",
        steps=[Step("a", tool="read", input="region"), Step("c", tool="t", input=1)],
    )
    source = srt.execute(plan)
    fork = srt.runs.fork(source.run_id, replace={"c": Step("c", tool="t", input=2)})
    forked = srt.resume(fork)
    assert isinstance(forked, journaled.ExecuteResult)
    assert {o.step_id: o.output for o in forked.observations}["a"] == [fact.id]  # carried
    srt.memory.remember("region is south", conflict_key="region")
    assert [s.step_id for s in srt.runs.stale(source.run_id)] == ["a"]
    assert [(s.step_id, s.fact_id) for s in srt.runs.stale(fork)] == [("a", fact.id)]
    refreshed = srt.runs.refresh(fork)
    assert [lin.run_id for lin in srt.runs.lineage(refreshed)] == [source.run_id, fork, refreshed]
    everywhere = {(s.run_id, s.step_id) for s in srt.runs.stale()}
    assert {(source.run_id, "a"), (fork, "a")} <= everywhere  # every run's, forks included


def test_used_by_lists_the_forks_whose_kept_steps_rest_on_the_read(
    srt: journaled.Runtime,
) -> None:
    """P2/F1: a fork's kept step rests on its source's read: ``used_by`` lists it there (it
    listed only the source), with ``carried_from``; a fork of the fork too; a step the fork
    ran again, and a fork that kept nothing of the reader, are not listed."""
    fact = srt.memory.remember("region is north", conflict_key="region")
    srt.register_tool("t", lambda x: x)
    plan = Plan(
        goal="g",
        steps=[Step("a", tool="read", input="region"), Step("c", tool="t", input=1)],
    )
    source = srt.execute(plan)
    kept = srt.runs.fork(source.run_id, replace={"c": Step("c", tool="t", input=2)})
    again = srt.runs.fork(source.run_id, replace={"a": Step("a", tool="t", input=3)})
    deeper = srt.runs.fork(kept, replace={"c": Step("c", tool="t", input=4)})
    [read] = srt.memory.used_by(fact.id)[:1]
    assert (read.run_id, read.step_id, read.carried_from) == (source.run_id, "a", None)
    uses = [(u.run_id, u.step_id, u.position, u.carried_from) for u in srt.memory.used_by(fact.id)]
    assert uses == [
        (source.run_id, "a", read.position, None),
        *sorted((run, "a", read.position, source.run_id) for run in (kept, deeper)),
    ]
    assert again not in {u[0] for u in uses}
    why = srt.memory.why(fact.id)
    assert f"of run {kept} [#{read.position}] (a fork: its output is run {source.run_id}'s)" in why


def test_a_retry_whose_last_attempt_read_nothing_is_not_stale(srt: journaled.Runtime) -> None:
    """P3/S2: reads of a failed attempt that was redone do not make the step stale."""
    fact = srt.memory.remember("gamma setting", conflict_key="gamma")

    def flaky(query: str, ctx: Any) -> str:
        if ctx.attempt == 1:
            ctx.memory.search(query)
            raise RuntimeError("first attempt fails")
        return "done without memory"

    srt.register_tool("flaky", flaky, retry=Retry(attempts=3))
    result = srt.execute(Plan(goal="g", steps=[Step("a", tool="flaky", input="gamma")]))
    assert result.ok
    reads = [e.data for e in srt.runs.history(result.run_id) if isinstance(e.data, MemoryRead)]
    # The second attempt read nothing, and says so: the first one's reads were redone.
    assert [(r.attempt, r.fact_ids) for r in reads] == [(1, (fact.id,)), (2, ())]
    srt.memory.remember("gamma setting changed", conflict_key="gamma")
    assert srt.runs.stale(result.run_id) == []


@pytest.mark.parametrize("budget", [None, 10])
@pytest.mark.parametrize("answer", [1e30, 2**70])
def test_a_reserve_answering_more_than_a_journal_holds_fails_its_step(
    srt: journaled.Runtime, budget: int | None, answer: float
) -> None:
    """R6/E6/E11: a reserve too large to journal fails its agent step, uncharged, not the run."""
    ran: list[str] = []

    def agent(step: Step, ctx: Any) -> AgentResult:
        ran.append(step.id)
        return AgentResult(ok=True)

    srt.register_agent("ag", agent)
    srt.register_tool("t", lambda x: x)
    plan = Plan(goal="g", steps=[Step("x", agent="ag"), Step("y", tool="t", input=1)])
    result = srt.execute(plan, call_budget=budget, reserve=lambda s, r: answer)
    obs = {o.step_id: o for o in result.observations}
    assert obs["x"].code == "agent-failed"
    assert "reserve" in (obs["x"].error or "")
    assert ran == []
    assert obs["y"].ok
    assert result.calls_used == 0


def test_reserves_that_take_a_waves_estimate_past_what_a_journal_holds(
    srt: journaled.Runtime,
) -> None:
    """R6/E6: each answer fits, their sum does not: the agent that carries the wave's estimate
    past 2**63 - 1 fails, uncharged, and the budget gate journals the estimate that fits."""
    srt.register_agent("ag", lambda step, ctx: AgentResult(ok=True))
    plan = Plan(goal="g", steps=[Step(f"a{i}", agent="ag") for i in range(3)])
    result = srt.execute(plan, call_budget=10, reserve=lambda s, r: 2**62)
    assert result.stopped_for_budget
    assert result.calls_used == 0
    (stop,) = [e.data for e in srt.runs.history(result.run_id) if isinstance(e.data, BudgetStopped)]
    assert stop.estimate == 2**62  # a0 fits; a1 and a2 would take the sum past the bound
    resumed = srt.resume(result.run_id, call_budget=2**63 - 1, reserve=lambda s, r: 2**62)
    assert isinstance(resumed, journaled.ExecuteResult)
    obs = {o.step_id: o for o in resumed.observations}
    assert obs["a0"].ok
    assert "agent-failed" in {obs["a1"].code, obs["a2"].code}


@pytest.mark.parametrize("answer", [2**63, 1e19, 2**70])
def test_a_reservation_a_journal_cannot_hold_is_a_failed_reserve(answer: float) -> None:
    """E6/R6: ``reservation`` refuses a finite answer above 2**63 - 1, as it refuses NaN; the
    largest one a journal holds is kept as it is."""
    step = Step("x", agent="ag")
    with pytest.raises(ReserveFailed, match="more calls than a journal holds"):
        reservation(step, math.inf, lambda s, r: answer)
    assert reservation(step, math.inf, lambda s, r: 2**63 - 1) == 2**63 - 1


def test_stale_judges_an_earlier_releases_read_by_its_own_position() -> None:
    """P3, ADR 0062: a read event without ``read_position``/``read_at`` (an earlier release's)
    is judged from its own position and time; with them, from where the read began."""
    fact = Event(
        position=1,
        stream="f",
        version=1,
        data=FactRemembered(at=0, fact_id="f", scope="project", valid_until=50),
    )
    superseded = Event(
        position=3,
        stream="f",
        version=2,
        data=FactSuperseded(at=30, fact_id="f", by="g", conflict_key="k"),
    )

    def read(**moment: Any) -> Event:
        data = MemoryRead(at=40, step_id="s", attempt=1, fact_ids=("f",), **moment)
        return Event(position=5, stream="run", version=3, data=data)

    def changes(event: Event, history: list[Event], now: int = 45) -> list[str]:
        return [s.change for s in stale_reads([event], lambda _: history, now)]

    assert changes(read(), [fact, superseded]) == []  # superseded (3) before the event (5)
    assert changes(read(read_position=2, read_at=20), [fact, superseded]) == ["superseded"]
    assert changes(read(read_position=3, read_at=20), [fact, superseded]) == []
    assert changes(read(), [fact], now=60) == ["expired"]  # at 50, after the event's time (40)
    assert changes(read(read_position=2, read_at=20), [fact], now=60) == ["expired"]
    assert changes(read(read_position=2, read_at=55), [fact], now=60) == []


@pytest.mark.parametrize("field", ["run_id", "step_id"])
def test_remember_with_provenance_that_is_no_text_is_refused(
    sqlite_url: str, clock: ManualClock, field: str
) -> None:
    """M2/P1: a run_id or step_id that is not text is refused and the journal stays readable."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        end = rt.journal.position()
        options: dict[str, Any] = {field: 5}
        with pytest.raises(journaled.InvalidFact, match=field):
            rt.memory.remember("a fact", **options)
        assert rt.journal.position() == end
    with journaled.open(sqlite_url, clock=clock) as rt:
        assert rt.memory.all() == []


def test_remember_naming_a_run_that_does_not_exist_is_refused(srt: journaled.Runtime) -> None:
    """P1: provenance naming no run, or a step without a run, is refused; nothing appended."""
    end = srt.journal.position()
    with pytest.raises(journaled.InvalidFact, match="run_id"):
        srt.memory.remember("forged", run_id="run_fake", step_id="s")
    with pytest.raises(journaled.InvalidFact, match="run_id"):
        srt.memory.remember("forged", step_id="s")
    assert srt.journal.position() == end


def test_another_organization_reads_no_fact_id_of_acme_in_run_events(
    sqlite_url: str, clock: ManualClock
) -> None:
    """R1/P1: another organization sees none of acme's run, so no fact id of acme in its
    events either (ADR 0074: the run itself is unknown there)."""
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        secret = acme.memory.remember("acme target globex", scope="organization")
        acme.register_tool("count", lambda q, ctx: len(ctx.memory.search(q)))
        run = acme.execute(Plan(goal="g", steps=[Step("a", tool="count", input="globex")]))
        assert run.observations[0].output == 1
    with journaled.open(sqlite_url, organization="other", clock=clock) as other:
        with pytest.raises(RunNotFound):
            other.runs.history(run.run_id)
        with pytest.raises(RunNotFound):
            other.runs.why(run.run_id)
        seen = other.journal.read()
        assert secret.id not in repr(seen)
        assert run.run_id not in {e.stream for e in seen}


def test_a_waiting_agent_is_charged_the_calls_it_reported(srt: journaled.Runtime) -> None:
    """R6/E8/E10: calls an agent reports with agent-waiting are charged at the wait."""

    def asker(step: Step, ctx: Any) -> AgentResult:
        if ctx.answer is None:
            return AgentResult(ok=False, code="agent-waiting", error="which region?", calls_used=3)
        return AgentResult(ok=True, output=ctx.answer, calls_used=1)

    srt.register_agent("asker", asker)
    waiting = srt.execute(
        Plan(goal="g", steps=[Step("q", agent="asker")]), call_budget=10, reserve=lambda s, r: 5
    )
    assert waiting.waiting == ["q"]
    (wait,) = [e.data for e in srt.runs.history(waiting.run_id) if isinstance(e.data, StepWaiting)]
    assert wait.charged == 3
    assert waiting.calls_used == 3
    done = srt.resume(waiting.run_id, answers={"q": "eu"}, reserve=lambda s, r: 5)
    assert isinstance(done, journaled.ExecuteResult)
    assert done.calls_used == 4
    assert [e for e in srt.runs.history(waiting.run_id) if isinstance(e.data, CallsOverrun)] == []


def test_refresh_of_none_does_not_depend_on_other_runs(srt: journaled.Runtime) -> None:
    """P4: refresh(None) is refused as naming no run, whether or not other runs are stale."""
    srt.memory.remember("deploy to eu-west", conflict_key="deploy")
    srt.execute(Plan(goal="g", steps=[Step("a", tool="read", input="deploy")]))
    with pytest.raises(journaled.RunNotFound):
        srt.runs.refresh(None)  # type: ignore[arg-type]
