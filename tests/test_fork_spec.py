"""Forks as SPEC F1, F2 and P4 word them: calls carried, replacements, lineage, refresh's `at`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

import journaled
from journaled import AgentResult, Plan, Retry, Step
from journaled.actors.run_forks import RunForks
from journaled.cli import main
from journaled.events.runs import RunForked, StepStarted, StepSucceeded
from journaled.testing import ManualClock


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, sqlite_url: str) -> str:
    """A journal on a real SQLite file, and the in-process one."""
    return "memory://" if request.param == "memory" else sqlite_url


@pytest.fixture
def rt(url: str) -> Iterator[journaled.Runtime]:
    with journaled.open(url, clock=ManualClock(step=1)) as runtime:
        yield runtime


def _result(rt: journaled.Runtime, run_id: str, **kwargs: Any) -> journaled.ExecuteResult:
    result = rt.resume(run_id, **kwargs)
    assert isinstance(result, journaled.ExecuteResult)
    return result


def _charged(rt: journaled.Runtime, ran: list[str]) -> Plan:
    """Register a skill (1 call), an agent reporting 3 calls and a tool; return a plan of them."""

    def skill(x: Any) -> str:
        ran.append(f"s:{x}")
        return f"s({x})"

    def agent(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        ran.append(f"ag:{step.input}")
        return AgentResult(output=f"ag({step.input})", calls_used=3)

    rt.register_skill("s", skill)
    rt.register_skill("s2", lambda x: f"s2({x})")
    rt.register_agent("ag", agent)
    rt.register_tool("t", lambda x: f"t({x})")
    return Plan(
        goal="g",
        steps=[
            Step("a", skill="s", input=1),
            Step("g", agent="ag", input=2),
            Step("b", skill="s", input=3, depends_on=["a"]),
            Step("c", tool="t", input=4, depends_on=["b"]),
        ],
    )


# -- F1/R6: calls used carry over through forks of forks -----------------------------------------


def test_a_fork_of_a_fork_carries_the_calls_its_source_carried(rt: journaled.Runtime) -> None:
    """F1, R6 (ADR 0032, 0083): calls used carry over at any depth: state, compare, summary, why."""
    source = rt.execute(_charged(rt, []))
    assert source.ok
    assert source.calls_used == 5
    chain = [source.run_id]
    for _ in range(3):  # a fork, a fork of it, and one more
        chain.append(rt.runs.fork(chain[-1]))
    end = rt.journal.position()
    for fork in chain[1:]:
        assert rt.runs.state(fork).calls_used == 5, fork
        assert rt.runs.at(fork, end).calls_used == 5, fork
        assert rt.runs.compare(source.run_id, fork).calls_used_b == 5
        assert rt.runs.summary(fork).calls_used == 5
        assert "kept a, g, b, c (5 model call(s))" in rt.runs.why(fork)
    assert {r: r.calls_used for r in rt.runs.list() if r in chain} == dict.fromkeys(chain, 5)
    result = _result(rt, chain[-1])  # nothing pending: nothing runs, nothing more is charged
    assert result.ok
    assert result.calls_used == 5


def test_the_budget_gate_counts_calls_carried_through_a_fork_of_a_fork(
    rt: journaled.Runtime,
) -> None:
    """F1, E7, R6 (ADR 0083): a fork of a fork's budget counts the calls carried in turn."""
    ran: list[str] = []
    source = rt.execute(_charged(rt, ran))
    fork = rt.runs.fork(source.run_id)
    new_b = Step("b", skill="s", input=30, depends_on=["a"])
    tight = rt.runs.fork(fork, replace={"b": new_b}, call_budget=4)  # a and g carried: 4 calls
    ran.clear()
    stopped = _result(rt, tight)
    assert stopped.stopped_for_budget
    assert ran == []
    assert stopped.calls_used == 4
    enough = rt.runs.fork(fork, replace={"b": new_b}, call_budget=5)
    done = _result(rt, enough)
    assert done.ok
    assert ran == ["s:30"]
    assert done.calls_used == 5


def test_a_fork_of_an_earlier_releases_fork_of_a_fork_finds_the_lost_charges(
    rt: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F1, R6 (ADR 0083): a fork of an old fork of a fork finds the charges it recorded as 0."""
    source = rt.execute(_charged(rt, []))
    fork = rt.runs.fork(source.run_id)
    with monkeypatch.context() as patch:  # the earlier release: carried steps charged nothing
        patch.setattr(RunForks, "_carried_charges", lambda self, forked, seen: {})
        old = rt.runs.fork(fork)
    first = rt.runs.history(old)[0].data
    assert isinstance(first, RunForked)
    assert [c.charged for c in first.carried] == [0, 0, 0, 0]
    assert rt.runs.state(old).calls_used == 0  # its own record stays as it was written
    again = rt.runs.fork(old)
    assert rt.runs.state(again).calls_used == 5
    forked = rt.runs.history(again)[0].data
    assert isinstance(forked, RunForked)
    assert {c.observation.step_id: c.charged for c in forked.carried} == {
        "a": 1,
        "g": 3,
        "b": 1,
        "c": 0,
    }


# -- F1: a replacement keeps the step's dependencies ---------------------------------------------


def test_a_replacement_without_dependencies_keeps_the_steps(rt: journaled.Runtime) -> None:
    """F1 (ADR 0084): a replacement that names no dependencies keeps the step's; it re-runs."""
    ran: list[str] = []
    source = rt.execute(_charged(rt, ran))
    fork = rt.runs.fork(source.run_id, replace={"b": Step("b", skill="s2", input=7)})
    state = rt.runs.state(fork)
    assert list(state.steps["b"].depends_on) == ["a"]
    assert (state.steps["b"].skill, state.steps["b"].input) == ("s2", 7)
    assert {i: state.status[i] for i in ("a", "g", "b", "c")} == {
        "a": "succeeded",
        "g": "succeeded",
        "b": "pending",
        "c": "pending",
    }
    ran.clear()
    result = _result(rt, fork)
    assert result.ok
    assert {o.step_id: o.output for o in result.observations}["b"] == "s2(7)"
    assert [s.depends_on for s in result.plan.steps if s.id == "b"] == [["a"]]


def test_a_replacement_with_other_dependencies_is_refused_saying_how(
    rt: journaled.Runtime,
) -> None:
    """F1 (ADR 0084): other dependencies are refused, saying to leave them out; nothing appended."""
    source = rt.execute(_charged(rt, []))
    end = rt.journal.position()
    with pytest.raises(ValueError, match="depends_on must stay") as caught:
        rt.runs.fork(source.run_id, replace={"b": Step("b", skill="s2", depends_on=["g"])})
    assert str(caught.value) == (
        "replace['b'].depends_on must stay ['a'], got ['g']: a fork keeps a step's "
        "dependencies; leave depends_on out to keep them"
    )
    assert rt.journal.position() == end


def test_cli_replacement_without_dependencies_keeps_them(sqlite_url: str) -> None:
    """F1 (ADR 0084): `runs fork --replace` keeps the dependencies it leaves out, refuses others."""
    with journaled.open(sqlite_url, clock=ManualClock(step=1)) as rt:
        source = rt.execute(_charged(rt, [])).run_id
    cli = CliRunner()
    out = cli.invoke(
        main,
        ["--url", sqlite_url, "runs", "fork", source, "--replace", 'b={"skill": "s2"}', "--json"],
    )
    assert out.exit_code == 0, out.output
    fork = json.loads(out.output)["run_id"]
    with journaled.open(sqlite_url) as rt:
        b = rt.runs.state(fork).steps["b"]
    assert (b.skill, list(b.depends_on)) == ("s2", ["a"])
    bad = '{"skill": "s2", "depends_on": ["g"]}'
    out = cli.invoke(main, ["--url", sqlite_url, "runs", "fork", source, "--replace", f"b={bad}"])
    assert out.exit_code != 0
    assert "leave depends_on out" in out.output
    assert len(out.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "text",
    [
        '{"skill": "s2", "input": {"x": NaN}}',
        '{"skill": "s2", "input": [Infinity]}',
        '{"skill": "s2", "input": {"x": -Infinity}}',
        '{"skill": "s2", "input": {"x": [1e999]}}',
    ],
)
def test_cli_replacement_that_is_no_json_is_refused(sqlite_url: str, text: str) -> None:
    """F1: `runs fork --replace STEP=JSON` with NaN, Infinity or a number out of range (which
    Python's reader takes, as NaN and infinity) is refused in one line; no fork is made, where
    one was made with its input journaled as null."""
    with journaled.open(sqlite_url, clock=ManualClock(step=1)) as rt:
        source = rt.execute(_charged(rt, [])).run_id
        before = rt.journal.position()
    out = CliRunner().invoke(
        main, ["--url", sqlite_url, "runs", "fork", source, "--replace", f"b={text}"]
    )
    assert out.exit_code == 1, out.output
    assert "--replace b: the definition is not JSON" in out.output
    assert len(out.output.strip().splitlines()) == 1
    with journaled.open(sqlite_url) as rt:
        assert rt.journal.position() == before


# -- F2: why shows the lineage --------------------------------------------------------------------


def _chain(rt: journaled.Runtime) -> list[str]:
    """A run, a fork of it, a fork of that and a fork of that, each run; root first."""
    rt.register_tool("t", lambda x: f"t({x})")
    root = rt.execute(
        Plan(goal="g", steps=[Step("a", tool="t", input=1), Step("b", tool="t", depends_on=["a"])])
    ).run_id
    chain = [root]
    for n in range(3):
        chain.append(rt.runs.fork(chain[-1], replace={"b": Step("b", tool="t", input=n)}))
        _result(rt, chain[-1])
    return chain


def test_why_of_a_fork_of_a_fork_names_its_lineage_root_first(rt: journaled.Runtime) -> None:
    """F2 (ADR 0085): `runs.why` of a fork of a fork lists the chain from the root to the run."""
    chain = _chain(rt)
    links = rt.runs.lineage(chain[-1])
    assert [link.run_id for link in links] == chain
    lines = rt.runs.why(chain[-1]).splitlines()
    assert lines[0].startswith(f"forked from {chain[2]} at #{links[-1].at}")
    assert lines[1:6] == [
        "lineage, root first:",
        f"  {chain[0]} — the root run",
        f"  {chain[1]} — forked from {chain[0]} at #{links[1].at}",
        f"  {chain[2]} — forked from {chain[1]} at #{links[2].at}",
        f"  {chain[3]} — forked from {chain[2]} at #{links[3].at}",
    ]
    assert lines[6] == f"run {chain[-1]} — completed:"
    # A fork of a root run: its first line is its whole lineage.
    assert "lineage" not in rt.runs.why(chain[1])


def test_cli_why_of_a_fork_of_a_fork_names_its_lineage(sqlite_url: str) -> None:
    """F2 (ADR 0085): `journaled runs why` prints the same chain, in a process of its own."""
    with journaled.open(sqlite_url, clock=ManualClock(step=1)) as rt:
        chain = _chain(rt)
        why = rt.runs.why(chain[-1])
    out = CliRunner().invoke(main, ["--url", sqlite_url, "runs", "why", chain[-1]])
    assert out.exit_code == 0, out.output
    assert out.output.strip() == why
    told = out.output.split("lineage, root first:", 1)[1]
    assert [told.index(run_id) for run_id in chain] == sorted(told.index(r) for r in chain)


# -- P4: refresh forks just before the earliest stale step ----------------------------------------


def _reading(rt: journaled.Runtime, ran: list[str]) -> None:
    """Register ``region`` (reads memory through ctx) and ``t`` (does not)."""

    def region(query: str, ctx: Any) -> str:
        ran.append(f"region:{query}")
        return str(ctx.memory.search(query)[0].text.rsplit(" ", 1)[-1])

    def tool(x: Any) -> str:
        ran.append(f"t:{x}")
        return f"t({x})"

    rt.register_tool("region", region)
    rt.register_tool("t", tool)
    rt.register_skill("s", lambda x: f"s({x})")


def _release(
    rt: journaled.Runtime, ran: list[str], *steps: Step, **execute: Any
) -> journaled.ExecuteResult:
    """Register ``_reading``'s tools, remember that the deploy region is eu-west and execute a
    release plan of ``steps``."""
    _reading(rt, ran)
    rt.memory.remember("The deploy region is eu-west", conflict_key="region")
    return rt.execute(Plan(goal="release", steps=list(steps)), **execute)


def _region_moves(rt: journaled.Runtime) -> None:
    """The deploy region becomes us-east: a step that read it is stale."""
    rt.memory.remember("The deploy region is us-east", conflict_key="region")


_A_B_C = (
    Step("a", tool="t", input=0),
    Step("b", tool="region", input="deploy region", depends_on=["a"]),
    Step("c", tool="t", input=1, depends_on=["b"]),
)
"""a reads nothing, b reads the deploy region after a, c follows b."""


def _position(
    rt: journaled.Runtime,
    run_id: str,
    event: type[StepStarted | StepSucceeded],
    step_id: str,
    attempt: int | None = None,
) -> int:
    """The position of the run's first ``event`` of ``step_id`` (of that attempt, if named)."""
    return next(
        e.position
        for e in rt.runs.history(run_id)
        if isinstance(e.data, event)
        and e.data.step_id == step_id
        and attempt in (None, e.data.attempt)
    )


def test_refresh_forks_just_before_the_earliest_stale_step(rt: journaled.Runtime) -> None:
    """P4, F1 (ADR 0086): refresh forks just before the stale step began; d, done later, re-runs."""
    ran: list[str] = []
    run = _release(rt, ran, *_A_B_C, Step("d", tool="t", input=2, depends_on=["a"])).run_id
    _region_moves(rt)
    b_began = _position(rt, run, StepStarted, "b")
    assert _position(rt, run, StepSucceeded, "d") > b_began
    fresh = rt.runs.refresh(run)
    assert rt.runs.lineage(fresh)[-1].at == b_began - 1
    state = rt.runs.state(fresh)
    assert state.status == {"a": "succeeded", "b": "pending", "c": "pending", "d": "pending"}
    ran.clear()
    result = _result(rt, fresh)
    assert result.ok
    assert sorted(ran) == ["region:deploy region", "t:1", "t:2"]
    assert rt.runs.compare(run, fresh).differing == ["b"]
    assert rt.runs.stale(fresh) == []


def test_refresh_is_before_the_stale_step_that_began_first(rt: journaled.Runtime) -> None:
    """P4 (ADR 0086): of two stale steps, refresh forks just before the one that began first."""
    ran: list[str] = []
    again = Step("e", tool="region", input="region again", depends_on=["c"])
    run = _release(rt, ran, *_A_B_C, again).run_id
    _region_moves(rt)
    assert sorted(s.step_id for s in rt.runs.stale(run)) == ["b", "e"]
    fresh = rt.runs.refresh(run)
    assert rt.runs.lineage(fresh)[-1].at == _position(rt, run, StepStarted, "b") - 1
    ran.clear()
    assert _result(rt, fresh).ok
    assert "t:0" not in ran
    assert rt.runs.stale(fresh) == []


def test_refresh_is_before_the_attempt_whose_reads_stand(rt: journaled.Runtime) -> None:
    """P4 (ADR 0033, 0086): a retried stale step is refreshed from the attempt that stands."""
    tries: list[str] = []

    def flaky(query: str, ctx: Any) -> str:
        text = str(ctx.memory.search(query)[0].text)
        tries.append(text)
        if len(tries) == 1:
            raise RuntimeError("flaky")
        return text

    rt.register_tool("flaky", flaky, retry=Retry(attempts=3, backoff=0.3))
    run = _release(
        rt,
        [],
        Step("a", tool="t", input=0),
        Step("b", tool="flaky", input="deploy region", depends_on=["a"]),
        Step("z", tool="t", input=9, depends_on=["a"]),
    )
    assert run.ok
    _region_moves(rt)
    second = _position(rt, run.run_id, StepStarted, "b", attempt=2)
    assert _position(rt, run.run_id, StepSucceeded, "z") < second
    fresh = rt.runs.refresh(run.run_id)
    assert rt.runs.lineage(fresh)[-1].at == second - 1
    assert rt.runs.state(fresh).status == {"a": "succeeded", "b": "pending", "z": "succeeded"}


def test_refresh_of_a_fork_whose_stale_step_was_carried(rt: journaled.Runtime) -> None:
    """P4, F1 (ADR 0062, 0086): a carried stale step is re-pended at the fork's first event."""
    ran: list[str] = []
    run = _release(
        rt,
        ran,
        Step("b", tool="region", input="deploy region"),
        Step("c", tool="t", input=1, depends_on=["b"]),
        Step("x", tool="t", input=2),
    ).run_id
    fork = rt.runs.fork(run)
    _region_moves(rt)
    fresh = rt.runs.refresh(fork)
    link = rt.runs.lineage(fresh)[-1]
    assert (link.forked_from, link.at) == (fork, rt.runs.history(fork)[0].position)
    forked = rt.runs.history(fresh)[0].data
    assert isinstance(forked, RunForked)
    assert (forked.replaced, forked.repended) == (("b",), ("b", "c"))
    ran.clear()
    assert _result(rt, fresh).ok
    assert sorted(ran) == ["region:deploy region", "t:1"]
    assert rt.runs.stale(fresh) == []


def test_refresh_keeps_the_runs_latest_budget(rt: journaled.Runtime) -> None:
    """P4, F1, E14 (ADR 0086): a budget raised after the stale step began carries over."""
    first = _release(
        rt,
        [],
        Step("b", tool="region", input="deploy region"),
        Step("c", skill="s", input=1, depends_on=["b"]),
        Step("d", skill="s", input=2, depends_on=["c"]),
        call_budget=1,
    )
    assert first.stopped_for_budget
    assert _result(rt, first.run_id, call_budget=2).ok
    _region_moves(rt)
    fresh = rt.runs.refresh(first.run_id)
    assert rt.runs.state(fresh).budget == 2
    result = _result(rt, fresh)
    assert result.ok
    assert not result.stopped_for_budget
    assert result.calls_used == 2


@pytest.mark.parametrize(
    ("a", "b", "differs"),
    [
        (1, True, True),
        (1, 1.0, True),
        (0.0, -0.0, True),
        ({"x": 1, "y": 2}, {"y": 2, "x": 1}, False),  # a dict's order is not its content
        ({1: "a"}, {1: "a"}, False),
        ({1: "a", 2: "b"}, {2: "b", 1: "a"}, False),  # number keys, another order
        ({"x": 1, "y": {1: "a"}}, {"y": {1: "a"}, "x": 1}, False),
        ({1: "a"}, {"1": "a"}, True),
        (float("nan"), float("nan"), False),  # ADR 0097
    ],
)
def test_compare_tells_values_apart_by_value_and_type(
    rt: journaled.Runtime, a: object, b: object, differs: bool
) -> None:
    """F3: outputs Python's ``==`` calls equal (1, 1.0, True; 0.0, -0.0) differ in a
    comparison, as they do to a reader of either run; the same value does not."""
    outputs = iter([a, b])
    rt.register_tool("t", lambda _: next(outputs))
    first = rt.execute(Plan(goal="g", steps=[Step("s", tool="t")]))
    second = rt.execute(Plan(goal="g", steps=[Step("s", tool="t")]))
    comparison = rt.runs.compare(first.run_id, second.run_id)
    assert comparison.differing == (["s"] if differs else [])
