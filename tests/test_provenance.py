"""Provenance: memory reads journaled with their step, used-by, stale and refresh (P1-P4)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

import journaled
from journaled import AgentResult, Plan, Step
from journaled.cli import main
from journaled.events.memory import Fact, FactRemembered
from journaled.events.runs import MemoryRead, StepFailed, StepStarted, StepSucceeded
from journaled.testing import ManualClock

SHARED = pytest.mark.parametrize("journal_url", ["sqlite", "postgresql"], indirect=True)
"""Backends a second runtime can open after the first closed (an in-memory journal cannot)."""


def _reads(rt: journaled.Runtime, run_id: str) -> list[MemoryRead]:
    return [e.data for e in rt.runs.history(run_id) if isinstance(e.data, MemoryRead)]


def _reader(rt: journaled.Runtime, log: list[str] | None = None) -> None:
    """Register tool ``read`` (searches memory through ctx) and tool ``plain`` (no ctx)."""

    def read(query: str, ctx: Any) -> list[str]:
        if log is not None:
            log.append(ctx.step_id)
        return [f.text for f in ctx.memory.search(query)]

    def plain(value: Any) -> Any:
        if log is not None:
            log.append(f"plain:{value}")
        return value

    rt.register_tool("read", read)
    rt.register_tool("plain", plain)


def _plan() -> Plan:
    return Plan(
        goal="deploy",
        steps=[
            Step("a", tool="read", input="deploy"),
            Step("b", tool="plain", input=1, depends_on=["a"]),
            Step("c", tool="plain", input=2),
        ],
    )


def test_reads_are_journaled_as_ids_with_the_result(rt: journaled.Runtime) -> None:
    """P1: a tool's ctx.memory reads record the fact ids returned, next to the step's result."""
    one = rt.memory.remember("deploy to eu-west", conflict_key="deploy")
    two = rt.memory.remember("deploy needs a ticket")
    rt.memory.remember("lunch is at noon")

    def look(query: str, ctx: Any) -> int:
        found = ctx.memory.search(query)
        assert ctx.memory.get(two.id) is not None
        assert ctx.memory.get("mem_missing") is None
        return len(found)

    rt.register_tool("look", look)
    result = rt.runs.execute(Plan(goal="g", steps=[Step("a", tool="look", input="deploy")]))
    assert result.ok, result
    events = rt.runs.history(result.run_id)
    kinds = [type(e.data) for e in events]
    read_at = kinds.index(MemoryRead)
    assert kinds[read_at + 1] is StepSucceeded  # staged together, read first
    read = events[read_at].data
    assert isinstance(read, MemoryRead)
    assert read.step_id == "a"
    assert read.attempt == 1
    assert set(read.fact_ids) == {one.id, two.id}
    assert read.ops == ("search", "get")
    assert "deploy to eu-west" not in json.dumps(msgspec.to_builtins(read))


def test_a_failing_step_keeps_its_reads(rt: journaled.Runtime) -> None:
    """P1: a step that reads then raises records its reads with its failure."""
    fact = rt.memory.remember("deploy to eu-west")

    def boom(query: str, ctx: Any) -> None:
        ctx.memory.all()
        raise RuntimeError("no")

    rt.register_tool("boom", boom)
    result = rt.runs.execute(Plan(goal="g", steps=[Step("a", tool="boom", input="x")]))
    assert not result.ok
    kinds = [type(e.data) for e in rt.runs.history(result.run_id)]
    assert kinds[kinds.index(MemoryRead) + 1] is StepFailed
    assert _reads(rt, result.run_id)[0].fact_ids == (fact.id,)


def test_a_step_that_reads_nothing_journals_no_read(rt: journaled.Runtime) -> None:
    """P1: a tool without a ctx parameter is called with its input alone and records no read."""
    seen: list[Any] = []

    def plain(value: Any) -> Any:
        seen.append(value)
        return value

    rt.register_tool("plain", plain)
    result = rt.runs.execute(Plan(goal="g", steps=[Step("a", tool="plain", input=7)]))
    assert result.ok
    assert seen == [7]
    assert _reads(rt, result.run_id) == []


def test_async_tool_and_agent_get_ctx_memory(rt: journaled.Runtime) -> None:
    """P1: an async tool declaring ctx, and an agent, read through ctx.memory; both journaled."""
    fact = rt.memory.remember("deploy to eu-west")

    async def look(query: str, *, ctx: Any) -> list[str]:
        return [f.id for f in ctx.memory.search(query)]

    def agent(step: Step, ctx: Any) -> AgentResult:
        return AgentResult(ok=True, output=[f.id for f in ctx.memory.all()], calls_used=0)

    rt.register_tool("look", look)
    rt.register_agent("helper", agent)
    result = rt.runs.execute(
        Plan(
            goal="g",
            steps=[Step("a", tool="look", input="deploy"), Step("b", agent="helper")],
        )
    )
    assert result.ok, result
    reads = {r.step_id: r for r in _reads(rt, result.run_id)}
    assert reads["a"].fact_ids == (fact.id,)
    assert reads["a"].ops == ("search",)
    assert reads["b"].fact_ids == (fact.id,)
    assert reads["b"].ops == ("all",)


def test_remembered_through_ctx_names_its_step_in_why(rt: journaled.Runtime) -> None:
    """P1: a fact remembered through ctx.memory records its run and step; why names them."""
    made: list[Fact] = []

    def note(text: str, ctx: Any) -> str:
        fact: Fact = ctx.memory.remember(text, conflict_key="note")
        made.append(fact)
        return fact.id

    rt.register_tool("note", note)
    result = rt.runs.execute(Plan(goal="g", steps=[Step("s", tool="note", input="eu-west")]))
    assert result.ok, result
    (fact,) = made
    remembered = rt.memory.remembered(fact.id)
    assert isinstance(remembered, FactRemembered)
    assert (remembered.run_id, remembered.step_id) == (result.run_id, "s")
    assert f"by step 's' of run {result.run_id}" in rt.memory.why(fact.id)
    plain = rt.memory.remember("by hand")
    assert "by step" not in rt.memory.why(plain.id)


def test_used_by_lists_every_reading_step_and_why_shows_them(rt: journaled.Runtime) -> None:
    """P2: used_by lists each step that read a fact, with its position; why lists them too."""
    fact = rt.memory.remember("deploy to eu-west")
    other = rt.memory.remember("lunch at noon")
    _reader(rt)
    first = rt.runs.execute(_plan())
    second = rt.runs.execute(_plan())
    uses = rt.memory.used_by(fact.id)
    assert [(u.run_id, u.step_id) for u in uses] == [(first.run_id, "a"), (second.run_id, "a")]
    assert all(u.position > 0 for u in uses)
    assert uses[0].position < uses[1].position
    assert rt.memory.used_by(other.id) == []
    assert rt.memory.used_by("mem_unknown") == []
    why = rt.memory.why(fact.id)
    assert f"read by step 'a' of run {first.run_id}" in why
    assert f"read by step 'a' of run {second.run_id}" in why


@SHARED
def test_used_by_and_stale_from_a_fresh_runtime(journal_url: str) -> None:
    """P2/P3: a runtime that never saw the reads answers used_by and stale from the journal."""
    clock = ManualClock(step=1)
    with journaled.open(journal_url, clock=clock) as rt:
        fact = rt.memory.remember("deploy to eu-west", conflict_key="deploy")
        _reader(rt)
        run = rt.runs.execute(_plan())
        newer = rt.memory.remember("deploy to us-east", conflict_key="deploy")
        live_uses = rt.memory.used_by(fact.id)
        live_stale = rt.runs.stale()
    with journaled.open(journal_url, clock=clock) as fresh:
        assert fresh.memory.used_by(fact.id) == live_uses
        assert [u.run_id for u in live_uses] == [run.run_id]
        assert fresh.runs.stale() == live_stale
        assert [(s.step_id, s.replacement) for s in live_stale] == [("a", newer.id)]


@pytest.mark.parametrize("change", ["superseded", "deleted", "purged", "expired"])
def test_stale_after_each_change(journal_url: str, change: str) -> None:
    """P3: a read fact superseded, deleted, purged or expired makes its step stale, saying which."""
    clock = ManualClock(step=1)
    with journaled.open(journal_url, clock=clock) as rt:
        until = clock() + 1_000 if change == "expired" else None
        fact = rt.memory.remember("deploy to eu-west", conflict_key="deploy", valid_until=until)
        _reader(rt)
        run = rt.runs.execute(_plan())
        assert rt.runs.stale(run.run_id) == []
        replacement = None
        if change == "superseded":
            replacement = rt.memory.remember("deploy to us-east", conflict_key="deploy").id
        elif change == "deleted":
            rt.memory.delete(fact.id)
        elif change == "purged":
            rt.memory.purge(fact.id, reason="wrong")
        else:
            clock.advance(2_000)
        (stale,) = rt.runs.stale(run.run_id)
        assert (stale.run_id, stale.step_id, stale.fact_id) == (run.run_id, "a", fact.id)
        assert stale.change == change
        assert stale.replacement == replacement
        assert stale.position == rt.memory.used_by(fact.id)[0].position
        assert rt.runs.stale() == [stale]


def test_a_fact_changed_before_the_read_is_not_stale(rt: journaled.Runtime) -> None:
    """P3: only changes after the read count: a fact already superseded when read is not stale."""
    old = rt.memory.remember("deploy to eu-west", conflict_key="deploy")
    rt.memory.remember("deploy to us-east", conflict_key="deploy")
    rt.register_tool("every", lambda _, ctx: len(ctx.memory.all()))
    run = rt.runs.execute(Plan(goal="g", steps=[Step("a", tool="every")]))
    assert old.id in _reads(rt, run.run_id)[0].fact_ids  # it did read the superseded fact
    assert rt.runs.stale(run.run_id) == []
    rt.memory.delete(old.id)
    assert [s.change for s in rt.runs.stale(run.run_id)] == ["deleted"]


def test_stale_of_an_unknown_run_is_an_error(rt: journaled.Runtime) -> None:
    """P3: stale of an id that names no run raises RunNotFound."""
    with pytest.raises(journaled.RunNotFound):
        rt.runs.stale("run_nope")


@SHARED
def test_another_organizations_fact_is_unknown(journal_url: str) -> None:
    """P2/P3 R1: used_by, why and stale of another organization never show its facts or reads."""
    clock = ManualClock(step=1)
    with journaled.open(journal_url, organization="acme", clock=clock) as rt:
        fact = rt.memory.remember("acme: deploy to eu-west", scope="organization", conflict_key="d")
        _reader(rt)
        rt.runs.execute(_plan())
        rt.memory.remember("acme: deploy to us-east", scope="organization", conflict_key="d")
        assert len(rt.memory.used_by(fact.id)) == 1
        assert len(rt.runs.stale()) == 1
    with journaled.open(journal_url, organization="other", clock=clock) as other:
        assert other.memory.used_by(fact.id) == []
        assert "read by" not in other.memory.why(fact.id)
        assert other.runs.stale() == []


def test_memory_read_bytes_for_ten_facts(sqlite_url: str) -> None:
    """P1: a read of 10 facts adds one small event to the step (ids only), measured on SQLite."""
    with journaled.open(sqlite_url, clock=ManualClock(step=1)) as rt:
        for i in range(10):
            rt.memory.remember(f"deploy fact number {i} " + "with a long body of text " * 20)
        rt.register_tool("look", lambda q, ctx: len(ctx.memory.search(q, limit=10)))
        result = rt.runs.execute(Plan(goal="g", steps=[Step("a", tool="look", input="deploy")]))
        assert result.ok, result
        assert len(_reads(rt, result.run_id)[0].fact_ids) == 10
    path = sqlite_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        state, row = db.execute(
            "SELECT length(state), length(originator_id) + 8 + length(topic) + length(state)"
            " + coalesce(length(chain_hashes), 0) + coalesce(length(chain_entries), 0)"
            " + coalesce(length(chain_digest), 0)"
            " FROM stored_events WHERE topic LIKE 'run.memory-read@%'"
        ).fetchone()
    print(f"\nrun.memory-read of 10 facts: {state} payload bytes, {row} bytes per stored row")
    assert state < 600  # 10 ids of ~30 characters and the event's frame; no fact text
    assert row < 1_000


def test_refresh_reruns_from_just_before_the_stale_step(rt: journaled.Runtime) -> None:
    """P4 (ADR 0086): refresh re-runs the stale step, its dependents and what had not succeeded."""
    rt.memory.remember("deploy to eu-west", conflict_key="deploy")
    log: list[str] = []
    _reader(rt, log)
    run = rt.runs.execute(_plan())
    assert sorted(log) == ["a", "plain:1", "plain:2"]
    rt.memory.remember("deploy to us-east", conflict_key="deploy")
    log.clear()
    new_id = rt.runs.refresh(run.run_id)
    assert new_id != run.run_id
    result = rt.resume(new_id)
    assert isinstance(result, journaled.ExecuteResult)
    assert result.ok
    # c read nothing, but it started after a began (same wave): it had not succeeded (F1).
    assert sorted(log) == ["a", "plain:1", "plain:2"]
    assert rt.runs.stale(new_id) == []


def test_refresh_of_a_fresh_run_is_refused(rt: journaled.Runtime) -> None:
    """P4: refresh of a run with nothing stale raises, naming the run, and creates no run."""
    rt.memory.remember("deploy to eu-west")
    _reader(rt)
    run = rt.runs.execute(_plan())
    before = rt.runs.ids()
    with pytest.raises(ValueError, match="no stale step"):
        rt.runs.refresh(run.run_id)
    assert rt.runs.ids() == before


def test_cli_used_by_and_stale(sqlite_url: str) -> None:
    """P2/P3: `memory used-by` and `runs stale` print the uses and stale reads, also as JSON."""
    with journaled.open(sqlite_url, clock=ManualClock(step=1)) as rt:
        fact = rt.memory.remember("deploy to eu-west", conflict_key="deploy")
        _reader(rt)
        run = rt.runs.execute(_plan())
        newer = rt.memory.remember("deploy to us-east", conflict_key="deploy")
    cli = CliRunner()
    out = cli.invoke(main, ["--url", sqlite_url, "memory", "used-by", fact.id])
    assert out.exit_code == 0, out.output
    assert run.run_id in out.output
    assert "a" in out.output
    out = cli.invoke(main, ["--url", sqlite_url, "memory", "used-by", fact.id, "--json"])
    assert out.exit_code == 0, out.output
    assert [u["run_id"] for u in json.loads(out.output)] == [run.run_id]
    out = cli.invoke(main, ["--url", sqlite_url, "runs", "stale", "--json"])
    assert out.exit_code == 0, out.output
    (stale,) = json.loads(out.output)
    assert stale["change"] == "superseded"
    assert stale["replacement"] == newer.id
    out = cli.invoke(main, ["--url", sqlite_url, "runs", "stale", run.run_id])
    assert out.exit_code == 0, out.output
    assert "superseded" in out.output
    assert newer.id in out.output
    out = cli.invoke(main, ["--url", sqlite_url, "runs", "stale", "run_nope"])
    assert out.exit_code != 0
    assert "run_nope" in out.output


def test_cli_refresh_refuses_a_run_with_nothing_stale(sqlite_url: str) -> None:
    """P4: `runs refresh` of a run with no stale step is a one-line error and appends nothing."""
    with journaled.open(sqlite_url, clock=ManualClock(step=1)) as rt:
        rt.memory.remember("deploy to eu-west")
        _reader(rt)
        run = rt.runs.execute(_plan())
        end = rt.journal.position()
    out = CliRunner().invoke(main, ["--url", sqlite_url, "runs", "refresh", run.run_id])
    assert out.exit_code != 0
    assert "no stale step" in out.output
    assert len(out.output.strip().splitlines()) == 1
    with journaled.open(sqlite_url) as rt:
        assert rt.journal.position() == end


def test_async_runtime_answers_used_by_and_stale(sqlite_url: str) -> None:
    """P2/P3 A1: journaled.aio awaits used_by and stale, with the sync runtime's answers."""
    import asyncio

    import journaled.aio

    async def main() -> None:
        async with journaled.aio.open(sqlite_url, clock=ManualClock(step=1)) as rt:
            fact = await rt.memory.remember("deploy to eu-west", conflict_key="deploy")
            rt.register_tool("read", lambda q, ctx: [f.id for f in ctx.memory.search(q)])
            run = await rt.execute(Plan(goal="g", steps=[Step("a", tool="read", input="deploy")]))
            assert [u.run_id for u in await rt.memory.used_by(fact.id)] == [run.run_id]
            newer = await rt.memory.remember("deploy to us-east", conflict_key="deploy")
            (stale,) = await rt.runs.stale(run.run_id)
            assert stale.replacement == newer.id

    asyncio.run(main())


def test_refresh_asks_fork_for_the_position_before_the_stale_step(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """P4 (ADR 0086): refresh asks fork (F1) for `at` just before the stale step and its budget."""
    from journaled.actors.runs import Runs

    calls: list[tuple[str, int | None, Any, Any, Any]] = []

    def fork(
        self: Runs,
        run_id: str,
        at: int | None,
        replace: dict[str, Step] | None,
        answers: dict[str, str] | None,
        call_budget: int | None,
        unheld: Any = (),
        *,
        carried_budget: bool = False,
    ) -> str:
        assert carried_budget  # the run's own budget, not the caller's (an overrun forks too)
        calls.append((run_id, at, replace, call_budget, sorted(unheld)))
        return "run_forked"

    monkeypatch.setattr(Runs, "_fork", fork, raising=False)
    rt.memory.remember("deploy to eu-west", conflict_key="deploy")
    _reader(rt)
    run = rt.runs.execute(_plan(), call_budget=7)
    rt.memory.remember("deploy to us-east", conflict_key="deploy")
    assert rt.runs.refresh(run.run_id) == "run_forked"
    started = next(
        e.position
        for e in rt.runs.history(run.run_id)
        if isinstance(e.data, StepStarted) and e.data.step_id == "a"
    )
    assert calls == [(run.run_id, started - 1, None, 7, ["a"])]


def test_a_superseder_that_expired_leaves_the_read_current(sqlite_url: str) -> None:
    """P3/M5: a fact whose superseder has expired is visible again: its read is not stale."""
    clock = ManualClock(step=1)
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.memory.remember("deploy to eu-west", conflict_key="deploy")
        _reader(rt)
        run = rt.runs.execute(_plan())
        rt.memory.remember("deploy to us-east", conflict_key="deploy", valid_until=clock() + 1_000)
        assert [s.change for s in rt.runs.stale(run.run_id)] == ["superseded"]
        clock.advance(2_000)
        assert rt.runs.stale(run.run_id) == []
