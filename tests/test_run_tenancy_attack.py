"""Attack probes on ADR 0074 (R1): a runtime of another organization (or of none) sharing acme's
SQLite journal tries every door the change may have missed; acme must keep all of its own."""

from __future__ import annotations

import asyncio
import json
import queue
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
from test_run_tenancy import (
    NEVER,
    SECRET_GOAL,
    _acme,
    _cli,
    _every_run,
    _register,
    same_unknown,
)

import journaled
import journaled.aio
from journaled import AgentResult, Plan, RunNotFound, Step
from journaled.actors.runs import Runs
from journaled.events.gateway_messages import (
    ListRuns,
    ReadJournal,
    ResumeRun,
    RunAt,
    RunWhy,
)
from journaled.mcp_tools import TOOLS, ToolError
from journaled.mcp_tools import answer as mcp_answer
from journaled.testing import ManualClock

ORG_SECRET = "acme secret: globex target price"
WAIT = 20.0
ORGS = ["other", None]
_ORG_ATTR = "_organization" if hasattr(Runs, "_organization") else "organization"
"""The property a runtime's runs record as their organization (renamed while probing)."""


def _passes(url: str, clock: ManualClock, orchestration: str) -> list[str]:
    with journaled.open(url, organization="acme", clock=clock) as acme:
        return [
            e.data.run  # type: ignore[attr-defined]
            for e in acme.runs.history(orchestration)
            if e.kind == "orchestration.pass-started"
        ]


def _planner(goal: str, observations: object, clarifications: object) -> Plan:
    return Plan(goal=goal, steps=[Step("o", tool="read", input="globex")])


# -- the asyncio runtime ---------------------------------------------------------------------------


@pytest.mark.parametrize("organization", ORGS)
def test_aio_runtime_treats_acmes_runs_as_unknown(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/ADR 0074: journaled.aio.open of another organization lists none of acme's runs and
    refuses history, why, at_time, fork, purge and resume as for a never-used id."""
    acme = _acme(sqlite_url, clock)

    async def attack() -> None:
        async with journaled.aio.open(sqlite_url, organization=organization, clock=clock) as rt:
            assert set(_every_run(acme)).isdisjoint(await rt.runs.list())
            assert set(_every_run(acme)).isdisjoint(await rt.runs.ids())
            end = await rt.journal.position()
            for run_id in _every_run(acme):
                for call in (
                    rt.runs.history,
                    rt.runs.why,
                    lambda r: rt.runs.at_time(r, clock()),
                    rt.runs.lineage,
                    rt.runs.fork,
                    lambda r: rt.runs.purge(r, "erase a rival's"),
                    rt.resume,
                ):
                    with pytest.raises(RunNotFound) as hidden:
                        await call(run_id)
                    with pytest.raises(RunNotFound) as unknown:
                        await call(NEVER)
                    assert str(hidden.value) == str(unknown.value).replace(NEVER, run_id)
            with pytest.raises(RunNotFound):
                await rt.resume(acme.waiting, answers={"q": "eu"})
            seen = await rt.journal.read()
            assert set(_every_run(acme)).isdisjoint(e.stream for e in seen)
            assert await rt.runs.stale() == []
            assert await rt.journal.position() == end

    asyncio.run(attack())


def test_aio_runtime_of_acme_sees_and_resumes_its_own(sqlite_url: str, clock: ManualClock) -> None:
    """R1/ADR 0074: acme's asyncio runtime lists every run of acme's and resumes its waiting run."""
    acme = _acme(sqlite_url, clock)

    async def own() -> None:
        async with journaled.aio.open(sqlite_url, organization="acme", clock=clock) as rt:
            _register(rt)  # type: ignore[arg-type]
            assert set(_every_run(acme)) <= set(await rt.runs.list())
            assert (await rt.runs.history(acme.done))[0].data.plan.goal == SECRET_GOAL  # type: ignore[attr-defined]
            resumed = await rt.resume(acme.waiting, answers={"q": "eu"})
            assert resumed.ok  # type: ignore[union-attr]

    asyncio.run(own())


# -- resume's argument checks ----------------------------------------------------------------------


@pytest.mark.parametrize("organization", ORGS)
def test_resume_with_approve_of_acmes_run_is_unknown(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/ADR 0074: rt.resume(acme_run, approve=True) of another organization says RunNotFound,
    as for an id never used (else the answer tells the run exists, and that execute started it)."""
    acme = _acme(sqlite_url, clock)
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        same_unknown(lambda r: rt.resume(r, approve=True), acme.done)


@pytest.mark.parametrize("organization", ORGS)
def test_resume_with_clarification_of_acmes_waiting_run_is_unknown(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/ADR 0074: rt.resume(acme_waiting, clarification=...) is refused as an unknown run."""
    acme = _acme(sqlite_url, clock)
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        same_unknown(lambda r: rt.resume(r, clarification="eu"), acme.waiting)


@pytest.mark.parametrize("organization", ORGS)
def test_resume_of_acmes_orchestration_with_approve_or_clarification_is_unknown(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/ADR 0074: approving or clarifying acme's orchestration from elsewhere is RunNotFound."""
    acme = _acme(sqlite_url, clock)
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        end = rt.journal.position()
        same_unknown(lambda r: rt.resume(r, approve=True), acme.orchestration)
        same_unknown(lambda r: rt.resume(r, clarification="eu"), acme.orchestration)
        same_unknown(lambda r: rt.resume(r, call_budget=99, planner=_planner), acme.orchestration)
        assert rt.journal.position() == end


@pytest.mark.parametrize("organization", ORGS)
def test_acmes_child_and_pass_runs_are_unknown_to_resume_and_fork(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/ADR 0074: acme's ctx.execute child run and orchestration pass runs cannot be resumed,
    forked, refreshed or read at a time from another organization."""
    acme = _acme(sqlite_url, clock)
    passes = _passes(sqlite_url, clock, acme.orchestration)
    assert passes
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        _register(rt)
        end = rt.journal.position()
        for run_id in [acme.child, *passes]:
            same_unknown(lambda r: rt.resume(r, take_over=True), run_id)
            same_unknown(rt.runs.fork, run_id)
            same_unknown(rt.runs.refresh, run_id)
            same_unknown(lambda r: rt.runs.at_time(r, clock()), run_id)
            same_unknown(rt.runs.summary, run_id)
        assert set(passes).isdisjoint(rt.runs.list())
        assert rt.journal.position() == end


@pytest.mark.parametrize("organization", ORGS)
def test_runs_state_and_check_free_of_acmes_orchestration_are_unknown(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/ADR 0074: rt.runs.state / check_free of acme's orchestration say RunNotFound."""
    acme = _acme(sqlite_url, clock)
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        same_unknown(rt.runs.state, acme.orchestration)
        same_unknown(rt.runs.check_free, acme.orchestration)


@pytest.mark.parametrize("organization", ORGS)
def test_resume_of_acmes_run_executing_in_this_process_is_unknown(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/ADR 0074: while acme's run executes in another runtime of the same process, another
    organization's resume of it still says RunNotFound (no RunOwnedElsewhere oracle)."""
    gate = threading.Event()

    def block(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        gate.wait(WAIT)
        return AgentResult(output="done", calls_used=0)

    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        acme.register_agent("block", block)
        handle = acme.start(Plan(goal=SECRET_GOAL, steps=[Step("b", agent="block")]))
        try:
            with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
                rt.register_agent("block", block)
                try:
                    same_unknown(rt.resume, handle.run_id)
                finally:
                    gate.set()
        finally:
            gate.set()
            assert handle.result(WAIT).ok


@pytest.mark.parametrize("organization", ORGS)
def test_cancel_of_acmes_run_at_rest_changes_nothing(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/ADR 0074 (with ADR 0075's cancel at rest): rt.cancel of acme's waiting run, child or
    orchestration from another organization returns False and appends nothing; acme resumes."""
    acme = _acme(sqlite_url, clock)
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        _register(rt)
        end = rt.journal.position()
        for run_id in (acme.waiting, acme.child, acme.orchestration, acme.fork):
            assert rt.cancel(run_id) is False
        assert rt.journal.position() == end
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        _register(rt)
        assert rt.resume(acme.waiting, answers={"q": "eu"}).ok  # type: ignore[union-attr]


# -- the protocol door -----------------------------------------------------------------------------


class Box:
    """A mailbox for the protocol door's replies (A4): what it is told, taken in order."""

    def __init__(self) -> None:
        self.got: queue.Queue[Any] = queue.Queue()

    def tell(self, message: Any) -> None:
        self.got.put(message)

    def take(self) -> Any:
        return self.got.get(timeout=WAIT)


@pytest.mark.parametrize("organization", ORGS)
def test_protocol_door_treats_acmes_runs_as_unknown(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/ADR 0074: through rt.protocol, run-at, run-why and run-resume of acme's runs fail as
    RunNotFound, run-list and journal-read leave them out."""
    acme = _acme(sqlite_url, clock)
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        _register(rt)
        box = Box()
        rt.protocol.register("attacker/1", box)
        end = rt.journal.position()
        for run_id in _every_run(acme):
            for request in (
                RunAt(reply_to="attacker/1", correlation="at", run_id=run_id),
                RunAt(reply_to="attacker/1", correlation="p", run_id=run_id, position=end),
                RunWhy(reply_to="attacker/1", correlation="w", run_id=run_id),
                ResumeRun(reply_to="attacker/1", correlation="r", run_id=run_id),
            ):
                rt.protocol.send(request)
                reply = box.take()
                assert type(reply).__name__ == "Failure", (request, reply)
                assert reply.error == "RunNotFound", reply
                assert SECRET_GOAL not in repr(reply)
        rt.protocol.send(
            ResumeRun(
                reply_to="attacker/1", correlation="a", run_id=acme.waiting, answers={"q": "x"}
            )
        )
        reply = box.take()
        assert reply.error == "RunNotFound", reply
        rt.protocol.send(ListRuns(reply_to="attacker/1", correlation="l"))
        assert set(_every_run(acme)).isdisjoint(box.take().run_ids)
        after = 0
        while after < end:
            rt.protocol.send(ReadJournal(reply_to="attacker/1", correlation="j", after=after))
            page = box.take()
            assert set(_every_run(acme)).isdisjoint(e.stream for e in page.events)
            assert SECRET_GOAL not in repr(page)
            after = page.position
        assert rt.journal.position() == end
        rt.protocol.unregister("attacker/1")


@pytest.mark.parametrize("organization", ORGS)
def test_protocol_resume_with_approve_of_acmes_run_is_unknown(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/ADR 0074: gateway.run-resume approve=True of acme's run fails as RunNotFound."""
    acme = _acme(sqlite_url, clock)
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        box = Box()
        rt.protocol.register("attacker/2", box)
        try:
            rt.protocol.send(
                ResumeRun(reply_to="attacker/2", correlation="a", run_id=acme.done, approve=True)
            )
            reply = box.take()
            assert reply.error == "RunNotFound", reply
        finally:
            rt.protocol.unregister("attacker/2")


# -- MCP tools (no mcp extra needed) ---------------------------------------------------------------


@pytest.mark.parametrize("organization", ORGS)
def test_mcp_tools_treat_acmes_runs_as_unknown(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/ADR 0074: the MCP tools runs_list, runs_why, runs_at, runs_stale and memory_why show
    nothing of acme's runs, with the unknown-run refusal for each id."""
    acme = _acme(sqlite_url, clock)
    tools = {t.name: t for t in TOOLS}
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        listed, _ = mcp_answer(rt, tools["runs_list"], {})
        assert set(_every_run(acme)).isdisjoint(row["run_id"] for row in listed)  # type: ignore[attr-defined]
        stale, _ = mcp_answer(rt, tools["runs_stale"], {})
        assert stale == []
        why, _ = mcp_answer(rt, tools["memory_why"], {"fact_id": acme.shared_fact})
        assert "read by" not in repr(why)
        for run_id in _every_run(acme):
            for name, args in (
                ("runs_why", {"run_id": run_id}),
                ("runs_at", {"run_id": run_id}),
                ("runs_at", {"run_id": run_id, "position": 1}),
                ("runs_at", {"run_id": run_id, "at_time": "2030-01-01"}),
                ("runs_stale", {"run_id": run_id}),
            ):
                with pytest.raises(ToolError) as hidden:
                    mcp_answer(rt, tools[name], args)
                with pytest.raises(ToolError) as unknown:
                    mcp_answer(rt, tools[name], {**args, "run_id": NEVER})
                assert str(hidden.value) == str(unknown.value).replace(NEVER, run_id), name


# -- the HTML timeline -----------------------------------------------------------------------------


@pytest.mark.parametrize("organization", ORGS)
def test_timeline_of_acmes_run_is_unknown(
    sqlite_url: str, clock: ManualClock, organization: str | None, tmp_path: Path
) -> None:
    """R1/ADR 0074: journaled.timeline.write / write_compare of acme's runs raise RunNotFound
    and write no page."""
    from journaled.timeline import write, write_compare

    acme = _acme(sqlite_url, clock)
    page = tmp_path / "t.html"
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        for run_id in _every_run(acme):
            same_unknown(lambda r: write(rt, r, page), run_id)
        same_unknown(lambda r: write_compare(rt, r, r, page), acme.done)
        same_unknown(lambda r: write_compare(rt, r, acme.fork, page), acme.done)
    assert not page.exists()


# -- the command line ------------------------------------------------------------------------------


@pytest.mark.parametrize("organization", ORGS)
def test_cli_run_commands_treat_acmes_runs_as_unknown(
    sqlite_url: str, clock: ManualClock, organization: str | None, tmp_path: Path
) -> None:
    """R1/ADR 0074: runs compare, stale, refresh, fork, purge, show --at/--at-time, diff,
    history and timeline with JOURNALED_ORGANIZATION=other (or unset) refuse acme's runs as
    unknown and append nothing."""
    acme = _acme(sqlite_url, clock)
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        end = rt.journal.position()
    page = str(tmp_path / "t.html")
    for run_id in _every_run(acme):
        for command in (
            ("runs", "compare", run_id, acme.done),
            ("runs", "stale", run_id),
            ("runs", "refresh", run_id),
            ("runs", "fork", run_id),
            ("runs", "purge", run_id, "--reason", "erase a rival's"),
            ("runs", "show", run_id, "--at", str(end)),
            ("runs", "show", run_id, "--at-time", "2030-01-01"),
            ("runs", "diff", run_id, "1", str(end)),
            ("runs", "history", run_id, "--json"),
            ("timeline", run_id, "-o", page),
        ):
            out = _cli(sqlite_url, organization, *command)
            assert out.exit_code != 0, (command, out.output)
            assert f"no run {run_id!r}" in out.output, (command, out.output)
            assert SECRET_GOAL not in out.output
            assert ORG_SECRET not in out.output
    stale = _cli(sqlite_url, organization, "runs", "stale", "--json")
    assert stale.exit_code == 0, stale.output
    assert set(_every_run(acme)).isdisjoint(row["run_id"] for row in json.loads(stale.output))
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        assert rt.journal.position() == end


@pytest.mark.parametrize("organization", ORGS)
def test_cli_memory_why_and_used_by_name_none_of_acmes_runs(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/ADR 0074: `memory why` and `memory used-by` of a shared fact acme's runs read name
    none of those runs; `journal tail --after 0` shows none of their events."""
    acme = _acme(sqlite_url, clock)
    why = _cli(sqlite_url, organization, "memory", "why", acme.shared_fact)
    assert why.exit_code == 0, why.output
    assert "read by" not in why.output
    used = _cli(sqlite_url, organization, "memory", "used-by", acme.shared_fact, "--json")
    assert used.exit_code == 0, used.output
    assert json.loads(used.output) == []
    tail = _cli(
        sqlite_url, organization, "journal", "tail", "--after", "0", "--limit", "1000", "--json"
    )
    assert tail.exit_code == 0, tail.output
    streams = {json.loads(line)["stream"] for line in tail.output.splitlines() if line}
    assert set(_every_run(acme)).isdisjoint(streams)
    assert SECRET_GOAL not in tail.output
    assert ORG_SECRET not in tail.output


def test_cli_acme_reads_all_of_its_own(sqlite_url: str, clock: ManualClock) -> None:
    """R1/ADR 0074: with JOURNALED_ORGANIZATION=acme, compare, stale, history, show --at, diff,
    memory used-by and journal tail all show acme's runs."""
    acme = _acme(sqlite_url, clock)
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        end = rt.journal.position()
        begun = rt.runs.history(acme.done)[0].position
    for command in (
        ("runs", "compare", acme.done, acme.fork),
        ("runs", "stale", acme.done),
        ("runs", "history", acme.done),
        ("runs", "show", acme.done, "--at", str(end)),
        ("runs", "diff", acme.done, str(begun), str(end)),
        ("runs", "why", acme.orchestration),
    ):
        out = _cli(sqlite_url, "acme", *command)
        assert out.exit_code == 0, (command, out.output)
    used = _cli(sqlite_url, "acme", "memory", "used-by", acme.shared_fact, "--json")
    assert acme.done in {u["run_id"] for u in json.loads(used.output)}
    tail = _cli(sqlite_url, "acme", "journal", "tail", "--after", "0", "--limit", "1000", "--json")
    assert acme.done in tail.output


# -- subscriptions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("organization", ORGS)
def test_topic_and_named_subscriptions_deliver_none_of_acmes_run_events(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/ADR 0074: a subscription to later run topics only (no run.started in the page) and a
    named subscription resumed in a new runtime deliver none of acme's run events."""
    acme = _acme(sqlite_url, clock)
    topics = ["run.step-succeeded", "run.memory-read", "run.forked", "orchestration.pass-started"]
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        with rt.journal.subscribe(topics=topics) as sub:
            assert sub.poll(0.5) is None
        with rt.journal.subscribe(name="attacker-feed") as sub:
            first = sub.poll(0.5)
            assert first is None or first.stream not in _every_run(acme)
            if first is not None:
                sub.ack(first.position)
    with (
        journaled.open(sqlite_url, organization=organization, clock=clock) as rt,
        rt.journal.subscribe(name="attacker-feed") as sub,
    ):
        while (event := sub.poll(0.3)) is not None:
            assert event.stream not in _every_run(acme)
            assert SECRET_GOAL not in repr(event)


# -- the run-summary projection --------------------------------------------------------------------


@pytest.mark.parametrize("organization", ORGS)
def test_the_runtimes_summaries_attribute_shows_none_of_acmes_runs(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/ADR 0074: rt.runs.summaries, the projection behind rt.runs.list, read with no argument
    from another organization's runtime, holds none of acme's runs or goals."""
    acme = _acme(sqlite_url, clock)
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        found = rt.runs.summaries.read()
        assert set(_every_run(acme)).isdisjoint(found)
        assert SECRET_GOAL not in repr(list(found.values()))


@pytest.mark.parametrize("organization", ORGS)
def test_the_projection_after_acmes_purge_still_hides_acmes_runs(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/ADR 0074: after acme purges a run (which blanks the stored projection), another
    organization still lists none of acme's runs, and acme lists the purged one as purged."""
    acme = _acme(sqlite_url, clock)
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        assert rt.runs.summaries.save()
        assert rt.runs.purge(acme.done, "no longer needed") > 0
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        assert set(_every_run(acme)).isdisjoint(rt.runs.list())
        assert set(_every_run(acme)).isdisjoint(rt.runs.list(status="purged"))
        same_unknown(rt.runs.summary, acme.done)
        same_unknown(rt.runs.history, acme.done)
        assert rt.runs.summaries.save() in (True, False)
    with journaled.open(sqlite_url, organization="other", clock=clock) as rt:
        assert set(_every_run(acme)).isdisjoint(rt.runs.list())
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        listed = rt.runs.list()
        assert set(_every_run(acme)) <= set(listed)
        assert rt.runs.summary(acme.done).status == "purged"


# -- runs of an earlier release (no organization recorded) -----------------------------------------


def _legacy_run(url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> str:
    """Have acme journal a finished run as an earlier release would (no organization)."""
    with journaled.open(url, organization="acme", clock=clock) as acme:
        _register(acme)
        acme.memory.remember(ORG_SECRET, scope="organization")
        monkeypatch.setattr(Runs, _ORG_ATTR, property(lambda _: msgspec.UNSET))
        old = acme.execute(Plan(goal="old", steps=[Step("r", tool="read", input="x")])).run_id
        monkeypatch.undo()
        return old


@pytest.mark.parametrize("organization", ORGS)
def test_purge_of_a_legacy_run_leaves_acmes_fork_of_it_alone(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, organization: str | None
) -> None:
    """R1/R2/ADR 0074: another organization's purge of a run of an earlier release (everyone's)
    that acme forked is refused, naming no run of acme's, with nothing appended: erasing the
    source alone would leave its content in acme's fork, erasing the fork would change acme's."""
    old = _legacy_run(sqlite_url, clock, monkeypatch)
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        fork = acme.runs.fork(old)
        before = len(acme.runs.history(fork))
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        assert old in rt.runs.list()
        end = rt.journal.position()
        with pytest.raises(journaled.RunNotPurgeable, match="another organization") as refused:
            rt.runs.purge(old, "erase an old run")
        assert fork not in str(refused.value)
        assert rt.journal.position() == end
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        kinds = [e.kind for e in acme.runs.history(fork)]
        assert "run.purged" not in kinds
        assert len(kinds) == before


@pytest.mark.parametrize("organization", ORGS)
def test_purge_of_a_legacy_run_leaves_acmes_waiting_fork_resumable(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, organization: str | None
) -> None:
    """R1/ADR 0074: another organization's purge of a legacy run neither erases nor names acme's
    waiting fork of it; acme then answers and resumes that fork."""
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        _register(acme)
        monkeypatch.setattr(Runs, _ORG_ATTR, property(lambda _: msgspec.UNSET))
        old = acme.execute(Plan(goal="old", steps=[Step("q", agent="ask")]))
        monkeypatch.undo()
        assert old.waiting == ["q"]
    with journaled.open(sqlite_url, clock=clock) as plain:  # as the earlier release resumed it
        _register(plain)
        assert plain.resume(old.run_id, answers={"q": "eu"}).ok  # type: ignore[union-attr]
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        _register(acme)
        waited = [e for e in acme.runs.history(old.run_id) if e.kind == "run.step-waiting"]
        fork = acme.runs.fork(old.run_id, at=waited[0].position)
        assert acme.resume(fork).waiting == ["q"]  # type: ignore[union-attr]
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        with pytest.raises(journaled.RunNotPurgeable) as refused:
            rt.runs.purge(old.run_id, "erase an old run")
        assert fork not in str(refused.value)
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        _register(acme)
        assert "run.purged" not in [e.kind for e in acme.runs.history(fork)]
        assert acme.resume(fork, answers={"q": "us"}).ok  # type: ignore[union-attr]


@pytest.mark.parametrize("organization", ORGS)
def test_stale_over_forks_of_a_legacy_run_leaves_out_acmes_forks(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, organization: str | None
) -> None:
    """R1/ADR 0074: rt.runs.stale() and memory.used_by of a fact a legacy run read leave out
    acme's fork (whose carried reads rest on the legacy run's), while acme sees it."""
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        _register(acme)
        fact = acme.memory.remember("shared rule: deploys need a review")
        monkeypatch.setattr(Runs, _ORG_ATTR, property(lambda _: msgspec.UNSET))
        old = acme.execute(Plan(goal="old", steps=[Step("r", tool="read", input="rule")])).run_id
        monkeypatch.undo()
        fork = acme.runs.fork(old)
        acme.memory.delete(fact.id)
        assert fork in {s.run_id for s in acme.runs.stale()}
        assert fork in {u.run_id for u in acme.memory.used_by(fact.id)}
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        stale = {s.run_id for s in rt.runs.stale()}
        assert old in stale
        assert fork not in stale
        assert fork not in {u.run_id for u in rt.memory.used_by(fact.id)}
        assert fork not in rt.memory.why(fact.id)
        assert rt.runs.lineage(old)[-1].run_id == old
        same_unknown(lambda r: rt.runs.compare(old, r), fork)


def test_acme_does_not_carry_on_an_orchestration_of_an_earlier_release(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R1/ADR 0074: an orchestration of an earlier release (everyone's) is not resumed by a
    runtime of an organization: refused naming the fork advice, nothing appended (its pass
    would read acme's scope into what everyone reads); a runtime with none resumes it."""
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        _register(acme)
        acme.memory.remember(ORG_SECRET, scope="organization")
        monkeypatch.setattr(Runs, _ORG_ATTR, property(lambda _: msgspec.UNSET))
        waiting = acme.orchestrate("old goal", _planner, require_approval=True)
        monkeypatch.undo()
        orch = waiting.run_id
        end = acme.journal.position()
        with pytest.raises(journaled.RunNotResumable, match="earlier release"):
            acme.resume(orch, approve=True, planner=_planner)
        assert acme.journal.position() == end
    with journaled.open(sqlite_url, clock=clock) as plain:
        _register(plain)
        done = plain.resume(orch, approve=True, planner=_planner)
        assert done.status == "completed", done  # type: ignore[union-attr]
        assert ORG_SECRET not in repr(plain.runs.current(orch))


@pytest.mark.parametrize("organization", ORGS)
def test_acmes_resume_of_a_legacy_run_does_not_publish_acmes_scope(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, organization: str | None
) -> None:
    """R1/ADR 0074: acme may not carry on a run of an earlier release (everyone's), whose step
    would read acme's organization scope: refused, nothing appended; acme forks it and resumes
    the fork, which is acme's alone, so no other runtime reads acme's text through it."""
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        _register(acme)
        acme.memory.remember(ORG_SECRET, scope="organization")
        monkeypatch.setattr(Runs, _ORG_ATTR, property(lambda _: msgspec.UNSET))
        old = acme.execute(
            Plan(
                goal="old",
                steps=[
                    Step("q", agent="ask"),
                    Step("r", tool="read", input="globex", depends_on=["q"]),
                ],
            )
        )
        monkeypatch.undo()
        assert old.waiting == ["q"]
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        _register(acme)
        end = acme.journal.position()
        with pytest.raises(journaled.RunNotResumable, match="Fork it"):
            acme.resume(old.run_id, answers={"q": "eu"})
        assert acme.journal.position() == end
        fork = acme.runs.fork(old.run_id, answers={"q": "eu"})
        assert acme.resume(fork).ok  # type: ignore[union-attr]
        assert ORG_SECRET in repr(acme.runs.current(fork))
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        assert ORG_SECRET not in repr(rt.runs.current(old.run_id))
        same_unknown(rt.runs.current, fork)


# -- acme keeps all of its own ---------------------------------------------------------------------


def test_acme_after_reopen_reads_forks_children_passes_and_resumes_all(
    sqlite_url: str, clock: ManualClock
) -> None:
    """R1/ADR 0074: acme, reopened (with a stored projection and without), reads every door of
    its runs, forks, child and pass runs; resumes its fork and an orchestration for approval."""
    acme = _acme(sqlite_url, clock)
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        _register(rt)
        approval = rt.orchestrate(SECRET_GOAL, _planner, require_approval=True).run_id
        assert rt.runs.summaries.save()
    passes = _passes(sqlite_url, clock, acme.orchestration)
    for _ in range(2):
        with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
            _register(rt)
            end = rt.journal.position()
            listed = set(rt.runs.list())
            assert {*_every_run(acme), *passes, approval} <= listed
            assert {*_every_run(acme), approval} <= set(rt.runs.ids())
            for run_id in [*_every_run(acme), *passes]:
                rt.runs.history(run_id)
                rt.runs.why(run_id)
                rt.runs.summary(run_id)
                rt.runs.lineage(run_id)
                rt.runs.stale(run_id)
                rt.runs.at_time(run_id, clock())
                rt.runs.at(run_id, end)
            assert rt.runs.lineage(acme.fork)[0].run_id == acme.done
            rt.runs.compare(acme.done, acme.fork)
            assert {acme.done, acme.fork} <= {s.run_id for s in rt.runs.stale()}
            assert acme.done in {u.run_id for u in rt.memory.used_by(acme.shared_fact)}
            assert "read by" in rt.memory.why(acme.shared_fact)
            seen = {e.stream for e in rt.journal.read()}
            assert set(_every_run(acme)) <= seen
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        _register(rt)
        assert rt.resume(acme.fork).ok  # type: ignore[union-attr]
        outcome = rt.resume(approval, approve=True, planner=_planner)
        assert outcome.status == "completed", outcome  # type: ignore[union-attr]
        refreshed = rt.runs.refresh(acme.done)
        assert refreshed in rt.runs.list()
        assert rt.resume(refreshed).ok  # type: ignore[union-attr]
        assert rt.runs.purge(acme.parent, "done with it") > 0


def test_acme_keeps_its_subscription_events(sqlite_url: str, clock: ManualClock) -> None:
    """R1/ADR 0074: acme's subscription to later run topics (pages without run.started)
    delivers its own run events."""
    acme = _acme(sqlite_url, clock)
    with (
        journaled.open(sqlite_url, organization="acme", clock=clock) as rt,
        rt.journal.subscribe(topics=["run.step-succeeded"]) as sub,
    ):
        streams = set()
        while (event := sub.poll(0.5)) is not None:
            streams.add(event.stream)
        assert {acme.done, acme.child, acme.parent} <= streams


# -- answers that told a hidden id from an unused one ----------------------------------------------

NEVER_FACT = "mem_0mjuohs00_0000000000000000"
"""A fact-shaped id never used: the run doors answer a hidden fact's id exactly as this one."""

FACT_DOORS: dict[str, Any] = {
    "history": lambda rt, i: rt.runs.history(i),
    "why": lambda rt, i: rt.runs.why(i),
    "fork": lambda rt, i: rt.runs.fork(i),
    "resume": lambda rt, i: rt.resume(i),
    "resume-approve": lambda rt, i: rt.resume(i, approve=True),
    "at": lambda rt, i: rt.runs.at(i, 1),
    "state": lambda rt, i: rt.runs.state(i),
    "stale": lambda rt, i: rt.runs.stale(i),
    "lineage": lambda rt, i: rt.runs.lineage(i),
    "position-at": lambda rt, i: rt.runs.position_at(i, 0),
    "purge": lambda rt, i: rt.runs.purge(i, "erase"),
}


def _outcome(call: Any, rt: journaled.Runtime, some_id: str) -> tuple[str, str]:
    try:
        result = call(rt, some_id)
    except Exception as exc:  # the answer itself is what is compared
        return type(exc).__name__, str(exc).replace(some_id, "<id>")
    return "returned", repr(result).replace(some_id, "<id>")


@pytest.mark.parametrize("door", sorted(FACT_DOORS))
@pytest.mark.parametrize("organization", ORGS)
def test_run_doors_answer_for_a_hidden_fact_id_as_for_an_id_never_used(
    tmp_path: Path, clock: ManualClock, organization: str | None, door: str
) -> None:
    """R1, ADR 0017: acme's organization fact id, given to a run door, behaves exactly as an
    unknown id. Before, every door said "'<id>' is not a run: its stream holds
    memory.fact-remembered events" (purge: a TypeError), telling the fact exists."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, organization="acme", clock=clock) as acme:
        hidden = acme.memory.remember(ORG_SECRET, scope="organization").id
    with journaled.open(url, organization=organization, clock=clock) as b:
        _register(b)
        before = b.journal.position()
        call = FACT_DOORS[door]
        assert _outcome(call, b, hidden) == _outcome(call, b, NEVER_FACT)
        assert _outcome(call, b, hidden)[0] == "RunNotFound"
        assert b.journal.position() == before


def test_a_run_door_given_an_own_fact_id_names_no_run_and_hints_at_memory(
    tmp_path: Path, clock: ManualClock
) -> None:
    """R2: purging a fact's id as a run is RunNotFound, nothing appended (before: a bare
    TypeError from the fold); the hint comes from the id's shape alone."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, clock=clock) as rt:
        fact = rt.memory.remember("a shared fact")
        before = rt.journal.position()
        with pytest.raises(RunNotFound, match="name facts, not runs") as caught:
            rt.runs.purge(fact.id, "erase it")
        assert "no run" in str(caught.value)
        assert rt.journal.position() == before
        kept = rt.memory.get(fact.id)
        assert kept is not None
        assert kept.text == "a shared fact"


@pytest.mark.parametrize("organization", ORGS)
def test_state_at_a_position_before_a_hidden_run_began_is_unknown(
    tmp_path: Path, clock: ManualClock, organization: str | None
) -> None:
    """ADR 0074: ``runs.state(run, position)`` checked the position against the run's first
    event before the organization, answering "position 1 is before run … began (its first
    event is at 3)": the run exists, and where it begins. Now as for an id never used."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, organization="acme", clock=clock) as acme:
        _register(acme)
        acme.memory.remember("a filler fact so the run does not begin at position 1")
        done = acme.execute(Plan(goal=SECRET_GOAL, steps=[Step("r", tool="read", input="x")]))
    with journaled.open(url, organization=organization, clock=clock) as b:
        same_unknown(lambda i: b.runs.state(i, 1), done.run_id)

    async def attack() -> None:
        async with journaled.aio.open(url, organization="other", clock=clock) as b:
            with pytest.raises(RunNotFound, match="no run"):
                await b.runs.state(done.run_id, 0)

    asyncio.run(attack())


@pytest.mark.parametrize("organization", ORGS)
def test_purge_with_a_bad_reason_answers_alike_for_a_hidden_run_and_an_unused_id(
    tmp_path: Path, clock: ManualClock, organization: str | None
) -> None:
    """ADR 0074: the reason is checked before the run is looked at. Before, an empty reason got
    ValueError for an unused id and RunNotFound for acme's run: an oracle for guessed ids."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, organization="acme", clock=clock) as acme:
        _register(acme)
        done = acme.execute(Plan(goal=SECRET_GOAL, steps=[Step("r", tool="read", input="x")]))
    with journaled.open(url, organization=organization, clock=clock) as b:
        answers = []
        for run_id in (NEVER, done.run_id):
            with pytest.raises(ValueError, match="reason must be a non-empty string") as caught:
                b.runs.purge(run_id, "")
            answers.append(str(caught.value))
        assert answers[0] == answers[1]
