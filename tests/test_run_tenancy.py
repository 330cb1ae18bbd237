"""Runs are their organization's own (R1, ADR 0074): to a runtime of another organization, or
of none, acme's runs, orchestrations, forks and child runs are unknown at every door — reads,
time travel, audit, fork, provenance, purge, resume, the log, subscriptions, the projection
and the command line — and nothing of theirs can be changed from there."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

import journaled
from journaled import AgentResult, NeedsInput, Plan, RunNotFound, Step
from journaled.actors.runs import Runs
from journaled.cli import main
from journaled.events.run_summaries import RunSummaries
from journaled.testing import ManualClock

WAIT = 20.0
SECRET_GOAL = "acme goal: quarterly merger with globex"


def ask(step: Step, ctx: journaled.AgentContext) -> AgentResult:
    """Wait for an answer (E10), then use it."""
    if ctx.answer is None:
        raise NeedsInput(f"which region for {step.id}?")
    return AgentResult(output=f"{step.id}={ctx.answer}", calls_used=0)


def parent_agent(step: Step, ctx: journaled.AgentContext) -> AgentResult:
    """Run a one-step child plan through ctx.execute (E9)."""
    child = ctx.execute(Plan(goal="child of acme", steps=[Step("c", tool="read", input="x")]))
    return AgentResult(output=child.observations[0].output, calls_used=0)


def _register(rt: journaled.Runtime) -> None:
    rt.register_tool("read", lambda q, ctx: [f.text for f in ctx.memory.search(q)])
    rt.register_agent("ask", ask)
    rt.register_agent("parent", parent_agent)


@dataclass
class Acme:
    """What acme's runtime left in the journal."""

    done: str
    waiting: str
    fork: str
    child: str
    parent: str
    orchestration: str
    shared_fact: str
    end: int


def _acme(url: str, clock: ManualClock) -> Acme:
    with journaled.open(url, organization="acme", clock=clock) as acme:
        _register(acme)
        shared = acme.memory.remember("shared rule: deploys need a review")
        acme.memory.remember("acme secret: globex target price", scope="organization")
        done = acme.execute(Plan(goal=SECRET_GOAL, steps=[Step("r", tool="read", input="rule")]))
        assert done.ok, done.observations
        waiting = acme.execute(Plan(goal=SECRET_GOAL, steps=[Step("q", agent="ask")]))
        assert waiting.waiting == ["q"]
        fork = acme.runs.fork(done.run_id)
        parent = acme.execute(Plan(goal=SECRET_GOAL, steps=[Step("p", agent="parent")]))
        assert parent.ok, parent.observations
        child = parent.observations[0].agent_task_id
        assert child is not None

        def planner(goal: str, observations: object, clarifications: object) -> Plan:
            return Plan(goal=goal, steps=[Step("o", tool="read", input="rule")])

        orchestration = acme.orchestrate(SECRET_GOAL, planner).run_id
        assert [u.run_id for u in acme.memory.used_by(shared.id)]
        acme.memory.delete(shared.id)  # so acme's runs that read it are stale
        assert {s.run_id for s in acme.runs.stale()} >= {done.run_id, fork}
        return Acme(
            done=done.run_id,
            waiting=waiting.run_id,
            fork=fork,
            child=child,
            parent=parent.run_id,
            orchestration=orchestration,
            shared_fact=shared.id,
            end=acme.journal.position(),
        )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1_767_225_600_000)


NEVER = "run_0000000000_000000000000"


def same_unknown(call: Callable[[str], object], run_id: str) -> None:
    """Assert ``call(run_id)`` raises RunNotFound with the text it gives for a never-used id."""
    with pytest.raises(RunNotFound) as hidden:
        call(run_id)
    with pytest.raises(RunNotFound) as unknown:
        call(NEVER)
    assert str(hidden.value) == str(unknown.value).replace(NEVER, run_id)


def _every_run(acme: Acme) -> list[str]:
    return [acme.done, acme.waiting, acme.fork, acme.child, acme.parent, acme.orchestration]


@pytest.mark.parametrize("organization", ["other", None])
def test_another_organizations_runs_are_unknown_at_every_read(
    durable_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1 (ADR 0074): to a runtime of another organization, or of none, acme's runs, forks,
    child runs and orchestrations are unknown: every read raises RunNotFound as for an id never
    used, listings and the log leave them out, and none of their text shows anywhere."""
    acme = _acme(durable_url, clock)
    with journaled.open(durable_url, organization=organization, clock=clock) as rt:
        _register(rt)
        assert set(_every_run(acme)).isdisjoint(rt.runs.list())
        assert set(_every_run(acme)).isdisjoint(rt.runs.ids())
        for run_id in _every_run(acme):
            reads: tuple[Callable[[str], object], ...] = (
                rt.runs.history,
                rt.runs.why,
                rt.runs.summary,
                rt.runs.current,
                lambda r: rt.runs.at(r, acme.end),
                lambda r: rt.runs.diff(r, 1, acme.end),
                lambda r: rt.runs.position_at(r, clock()),
                rt.runs.lineage,
                rt.runs.stale,
                lambda r: rt.runs.compare(r, r),
            )
            for read in reads:
                same_unknown(read, run_id)
        for run_id in (acme.done, acme.waiting, acme.fork, acme.child, acme.parent):
            with pytest.raises(RunNotFound):
                rt.runs.state(run_id)
        seen = rt.journal.read()
        assert set(_every_run(acme)).isdisjoint({e.stream for e in seen})
        assert SECRET_GOAL not in repr(seen)
        assert rt.runs.stale() == []
        assert rt.memory.used_by(acme.shared_fact) == []
        assert "read by" not in rt.memory.why(acme.shared_fact)
        with rt.journal.subscribe(topics=["run.started", "orchestration.started"]) as sub:
            assert sub.poll(0.5) is None


@pytest.mark.parametrize("organization", ["other", None])
def test_another_organization_can_change_nothing_of_acmes_runs(
    durable_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1 (ADR 0074): a runtime of another organization (or none) can neither resume, answer,
    fork, refresh nor purge acme's runs: each is refused as an unknown run, nothing is appended,
    and acme then resumes its waiting run and reads every run whole."""
    acme = _acme(durable_url, clock)
    with journaled.open(durable_url, organization=organization, clock=clock) as rt:
        _register(rt)
        end = rt.journal.position()
        attempts = (
            lambda: rt.resume(acme.waiting, answers={"q": "eu"}),
            lambda: rt.resume(acme.orchestration),
            lambda: rt.resume(acme.fork),
            lambda: rt.resume_start(acme.waiting, answers={"q": "eu"}),
            lambda: rt.runs.fork(acme.done),
            lambda: rt.runs.refresh(acme.done),
            lambda: rt.runs.purge(acme.done, "erase a rival's run"),
            lambda: rt.runs.purge(acme.orchestration, "erase a rival's run"),
        )
        for attempt in attempts:
            with pytest.raises(RunNotFound):
                attempt()
        assert rt.runs.cancel(acme.waiting) is False
        assert rt.journal.position() == end
    with journaled.open(durable_url, organization="acme", clock=clock) as again:
        _register(again)
        assert set(_every_run(acme)) <= set(again.runs.list())
        assert again.runs.history(acme.done)[0].data.plan.goal == SECRET_GOAL  # type: ignore[attr-defined]
        resumed = again.runs.resume(acme.waiting, answers={"q": "eu"})
        assert resumed.ok
        assert resumed.observations[-1].output == "q=eu"


def test_acme_sees_none_of_the_runs_of_a_runtime_with_no_organization(
    sqlite_url: str, clock: ManualClock
) -> None:
    """R1 (ADR 0074): runs started with no organization are that runtime's: a runtime of acme
    does not see them (they could have read nothing of acme's, but a resume by acme would let
    acme's facts into a run everyone sees)."""
    with journaled.open(sqlite_url, clock=clock) as plain:
        _register(plain)
        run = plain.execute(Plan(goal="plain", steps=[Step("q", agent="ask")])).run_id
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        _register(acme)
        assert run not in acme.runs.list()
        with pytest.raises(RunNotFound):
            acme.resume(run, answers={"q": "eu"})
    with journaled.open(sqlite_url, clock=clock) as plain:
        _register(plain)
        assert plain.runs.resume(run, answers={"q": "eu"}).ok


def test_runs_record_the_organization_that_started_them(
    sqlite_url: str, clock: ManualClock
) -> None:
    """R1 (ADR 0074): a run, its child runs, a fork and an orchestration and its passes record
    the organization of the runtime that started them; a runtime with none records None."""
    acme = _acme(sqlite_url, clock)
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        for run_id in _every_run(acme):
            first = rt.runs.history(run_id)[0].data
            started = getattr(first, "started", first)
            assert getattr(started, "organization", None) == "acme", (run_id, first)
        passes = [
            e.data.run  # type: ignore[attr-defined]
            for e in rt.runs.history(acme.orchestration)
            if e.kind == "orchestration.pass-started"
        ]
        assert passes
        for run_id in passes:
            assert getattr(rt.runs.history(run_id)[0].data, "organization", None) == "acme"
    with journaled.open(sqlite_url, clock=clock) as plain:
        _register(plain)
        run = plain.execute(Plan(goal="g", steps=[Step("r", tool="read", input="x")])).run_id
        assert plain.runs.history(run)[0].data.organization is None  # type: ignore[attr-defined]


def test_a_fork_of_a_run_of_an_earlier_release_is_the_forkers(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R1 (ADR 0074): a run journaled by an earlier release (no organization recorded) is seen
    by every runtime, as it was; a fork of it is the forking runtime's alone."""
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        _register(acme)
        monkeypatch.setattr(Runs, "_organization", property(lambda _: msgspec.UNSET))
        old = acme.execute(Plan(goal="old", steps=[Step("r", tool="read", input="x")])).run_id
        monkeypatch.undo()
        fork = acme.runs.fork(old)
        assert {old, fork} <= set(acme.runs.list())
    for organization in ("other", None):
        with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
            assert old in rt.runs.list()
            assert rt.runs.history(old)[0].data.plan.goal == "old"  # type: ignore[attr-defined]
            assert fork not in rt.runs.list()
            with pytest.raises(RunNotFound):
                rt.runs.history(fork)


def test_the_stored_run_projection_keeps_each_runs_organization(
    sqlite_url: str, clock: ManualClock
) -> None:
    """T2/R1 (ADR 0074): once the run-summary projection is stored, a runtime of another
    organization that restores it still lists none of acme's runs, and acme lists them all."""
    acme = _acme(sqlite_url, clock)
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        assert rt.runs.summaries.save()
    with journaled.open(sqlite_url, organization="other", clock=clock) as rt:
        assert set(_every_run(acme)).isdisjoint(rt.runs.list())
        assert rt.runs.summaries.unsaved == 0  # answered from the stored copy
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        assert set(_every_run(acme)) <= set(rt.runs.list())


def _cli(url: str, organization: str | None, *args: str) -> Any:
    env = {"JOURNALED_ORGANIZATION": organization or ""}
    return CliRunner().invoke(main, ["--url", url, *args], env=env)


def test_the_command_line_acts_for_the_organization_of_its_environment(
    sqlite_url: str, clock: ManualClock
) -> None:
    """R1/T2 (ADR 0074): with JOURNALED_ORGANIZATION=other (or unset) `runs list`, `runs show`,
    `runs why`, `runs follow` and `journal tail` show nothing of acme's runs; with acme they do."""
    acme = _acme(sqlite_url, clock)
    for organization in ("other", None):
        listed = _cli(sqlite_url, organization, "runs", "list", "--json")
        assert listed.exit_code == 0, listed.output
        assert set(_every_run(acme)).isdisjoint(row["run_id"] for row in json.loads(listed.output))
        for command in (
            ("runs", "show", acme.done),
            ("runs", "why", acme.done),
            ("runs", "history", acme.done),
            ("runs", "follow", acme.waiting, "--max-seconds", "0"),
        ):
            out = _cli(sqlite_url, organization, *command)
            assert out.exit_code != 0, (command, out.output)
            assert f"no run {command[2]!r}" in out.output
            assert SECRET_GOAL not in out.output
        tail = _cli(sqlite_url, organization, "journal", "tail", "--json")
        assert tail.exit_code == 0, tail.output
        assert SECRET_GOAL not in tail.output
        assert acme.done not in tail.output
    mine = _cli(sqlite_url, "acme", "runs", "list", "--json")
    assert set(_every_run(acme)) <= {row["run_id"] for row in json.loads(mine.output)}
    shown = _cli(sqlite_url, "acme", "runs", "show", acme.done)
    assert shown.exit_code == 0, shown.output


@pytest.fixture
def two(sqlite_url: str, clock: ManualClock) -> Iterator[tuple[Acme, RunSummaries]]:
    acme = _acme(sqlite_url, clock)
    with journaled.open(sqlite_url, clock=clock) as rt:
        yield acme, RunSummaries(rt._journal)


def test_the_projection_itself_holds_every_organizations_runs(
    two: tuple[Acme, RunSummaries],
) -> None:
    """T2 (ADR 0074): the projection folds every run (its stored copy is one for the journal);
    ``read(organization)`` keeps that organization's, ``read()`` all of them."""
    acme, summaries = two
    assert set(_every_run(acme)) <= set(summaries.read())
    assert set(_every_run(acme)) <= set(summaries.read("acme"))
    assert set(_every_run(acme)).isdisjoint(summaries.read(None))
    assert set(_every_run(acme)).isdisjoint(summaries.read("other"))


@pytest.mark.parametrize("organization", ["   ", "\t"])
@pytest.mark.parametrize(
    "command",
    [("runs", "list", "--json"), ("runs", "follow", "run_x", "--max-seconds", "0")],
    ids=["runs list", "runs follow"],
)
def test_journal_only_commands_refuse_an_organization_the_runtime_refuses(
    sqlite_url: str, clock: ManualClock, organization: str, command: tuple[str, ...]
) -> None:
    """R1 (ADR 0074): a blank JOURNALED_ORGANIZATION is refused in one line
    naming it by the commands that read the journal alone, as by those that open a runtime;
    it never lists nothing with exit 0 (which hid every run)."""
    _acme(sqlite_url, clock)
    refused = _cli(sqlite_url, organization, "runs", "why", "run_x")
    assert "JOURNALED_ORGANIZATION" in refused.output
    out = _cli(sqlite_url, organization, *command)
    assert out.exit_code != 0, out.output
    assert "Traceback" not in out.output
    assert len(out.output.strip().splitlines()) == 1, out.output
    assert "JOURNALED_ORGANIZATION" in out.output
