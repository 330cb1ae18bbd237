"""Attacks on fork and provenance: odd positions and replacements, races, tenants (F, P)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

import journaled
from journaled import Plan, Step
from journaled.testing import ManualClock

SECRET = "the vault code is 4242"


@pytest.fixture
def rt(sqlite_url: str, clock: ManualClock) -> Iterator[journaled.Runtime]:
    """Yield a runtime on a real SQLite file with tools ``t`` and ``read`` registered."""
    with journaled.open(sqlite_url, clock=clock, organization="acme") as runtime:
        ran: list[str] = []

        def t(x: Any) -> Any:
            ran.append(str(x))
            return {"v": x}

        runtime.register_tool("t", t)

        def read(query: str, ctx: Any) -> list[str]:
            return [f.text for f in ctx.memory.search(query)]

        runtime.register_tool("read", read)
        runtime.ran = ran  # type: ignore[attr-defined]
        yield runtime


def _plan() -> Plan:
    return Plan(
        goal="g",
        steps=[
            Step("a", tool="t", input="a"),
            Step("b", tool="t", input="b", depends_on=["a"]),
            Step("c", tool="t", input="c"),
        ],
    )


def _run(rt: journaled.Runtime) -> str:
    result = rt.runs.execute(_plan())
    assert result.ok, result
    return result.run_id


@pytest.mark.parametrize("at", [0, -1, True, False, "3", 1.5])
def test_fork_at_an_odd_position_is_refused_and_appends_nothing(
    rt: journaled.Runtime, at: Any
) -> None:
    """F1: `at` that is not a position inside the run is refused, naming `at`; nothing appended."""
    source = _run(rt)
    end = rt.journal.position()
    with pytest.raises(ValueError, match="at"):
        rt.runs.fork(source, at)
    assert rt.journal.position() == end


def test_fork_at_a_position_inside_another_runs_events_takes_the_source_state_then(
    rt: journaled.Runtime,
) -> None:
    """F1: a position inside another run's events forks the source as it stood at that point."""
    source = _run(rt)
    mid = rt.journal.position()
    _run(rt)
    fork = rt.runs.fork(source, mid - 1 if mid > 1 else mid)
    then = rt.runs.at(source, mid - 1 if mid > 1 else mid)
    kept = {s.id for s in then.plan.steps if s.status == "succeeded"}
    rt.ran.clear()  # type: ignore[attr-defined]
    result = rt.resume(fork)
    assert isinstance(result, journaled.ExecuteResult)
    assert result.ok
    assert sorted(rt.ran) == sorted({"a", "b", "c"} - kept)  # type: ignore[attr-defined]


def test_fork_at_the_runs_first_event_re_runs_every_step(rt: journaled.Runtime) -> None:
    """F1: a fork at the run's very first event keeps nothing: every step runs again."""
    source = _run(rt)
    first = rt.runs.history(source)[0].position
    fork = rt.runs.fork(source, first)
    rt.ran.clear()  # type: ignore[attr-defined]
    result = rt.resume(fork)
    assert isinstance(result, journaled.ExecuteResult)
    assert result.ok
    assert sorted(rt.ran) == ["a", "b", "c"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("replace", "field"),
    [
        ({"a": "not a step"}, "replace['a']"),
        ({"a": Step("zz", tool="t", input="a")}, "replace['a'].id"),
        ({"b": Step("b", tool="t", input="b", depends_on=["c"])}, "replace['b'].depends_on"),
        ({"nope": Step("nope", tool="t", input=1)}, "replace['nope']"),
        ({"a": Step("a", tool="t", input={"x": object()})}, "replace['a'].input"),
        (["a"], "replace"),
    ],
)
def test_fork_with_an_odd_replacement_is_refused_and_appends_nothing(
    rt: journaled.Runtime, replace: Any, field: str
) -> None:
    """F1: a replacement that is no Step, renames, rewires or names no step is refused."""
    source = _run(rt)
    end = rt.journal.position()
    with pytest.raises(ValueError, match=r"replace") as info:
        rt.runs.fork(source, replace=replace)
    assert str(info.value).startswith(field), str(info.value)
    assert "\n" not in str(info.value)
    assert rt.journal.position() == end


@pytest.mark.parametrize(
    ("data", "where"),
    [({(1,): 2}, "$"), ({"rows": [{None: 1}]}, "$['rows'][0]")],
    ids=["tuple-key", "none-key"],
)
def test_fork_with_a_replacement_input_keyed_by_no_text_is_refused_naming_the_path(
    rt: journaled.Runtime, data: Any, where: str
) -> None:
    """F1, ADR 0098: a replacement input holding a dict keyed by a tuple or None is refused,
    naming the step and the key's path, and nothing is appended; before, the fork was stored
    and ``why`` of it raised a bare TypeError."""
    source = _run(rt)
    end = rt.journal.position()
    with pytest.raises(ValueError, match=r"replace") as info:
        rt.runs.fork(source, replace={"a": Step("a", tool="t", input=data)})
    assert str(info.value).startswith(
        f"replace['a'].input: its input cannot be journaled: a key at {where} is"
    ), str(info.value)
    assert rt.journal.position() == end


def test_fork_with_a_huge_replacement_input_keeps_it_and_reruns_downstream(
    rt: journaled.Runtime,
) -> None:
    """F1: a large replaced input is kept whole; the step and its dependents re-run, c does not."""
    source = _run(rt)
    big = "x" * 200_000
    fork = rt.runs.fork(source, replace={"a": Step("a", tool="t", input=big)})
    rt.ran.clear()  # type: ignore[attr-defined]
    result = rt.resume(fork)
    assert isinstance(result, journaled.ExecuteResult)
    assert result.ok
    assert sorted(rt.ran, key=len) == ["b", big]  # type: ignore[attr-defined]


def test_answers_to_a_step_that_is_not_waiting_are_refused(rt: journaled.Runtime) -> None:
    """F1: `answers` for a step that is not waiting is refused, naming answers; nothing appended."""
    source = _run(rt)
    end = rt.journal.position()
    with pytest.raises(ValueError, match="answers"):
        rt.runs.fork(source, answers={"a": "yes"})
    with pytest.raises(ValueError, match="answers"):
        rt.runs.fork(source, answers={"nope": "yes"})
    assert rt.journal.position() == end


def test_refresh_of_a_run_with_nothing_stale_is_refused(rt: journaled.Runtime) -> None:
    """P4: refresh of a run with no stale step is a one-line error naming run_id; no run made."""
    source = _run(rt)
    before = rt.runs.ids()
    with pytest.raises(ValueError, match="run_id"):
        rt.runs.refresh(source)
    assert rt.runs.ids() == before


def test_stale_after_purge_says_purged_and_leaks_no_text(rt: journaled.Runtime) -> None:
    """P3/R2: a purged read fact makes its step stale with change 'purged'; no text shows."""
    fact = rt.memory.remember(SECRET, conflict_key="vault")
    result = rt.runs.execute(Plan(goal="g", steps=[Step("r", tool="read", input="vault code")]))
    assert result.ok, result
    rt.memory.purge(fact.id, reason="gdpr")
    found = rt.runs.stale(result.run_id)
    assert [(s.step_id, s.fact_id, s.change) for s in found] == [("r", fact.id, "purged")]
    assert "4242" not in repr(found)
    fork = rt.runs.refresh(result.run_id)
    assert "4242" not in repr(rt.runs.lineage(fork))


def test_another_organization_sees_no_stale_or_use_of_acmes_facts(
    sqlite_url: str, clock: ManualClock, rt: journaled.Runtime
) -> None:
    """P2/P3/R1: another organization sees neither uses nor staleness of acme's facts."""
    fact = rt.memory.remember(SECRET, scope="organization", conflict_key="vault")
    result = rt.runs.execute(Plan(goal="g", steps=[Step("r", tool="read", input="vault code")]))
    assert result.ok, result
    assert [u.step_id for u in rt.memory.used_by(fact.id)] == ["r"]
    rt.memory.delete(fact.id)
    assert [s.fact_id for s in rt.runs.stale(result.run_id)] == [fact.id]
    with journaled.open(sqlite_url, clock=clock, organization="other") as other:
        assert other.memory.used_by(fact.id) == []
        with pytest.raises(journaled.RunNotFound):  # acme's run is unknown here (ADR 0074)
            other.runs.stale(result.run_id)
        assert other.runs.stale() == []


def test_two_threads_resuming_one_fork_run_it_once(rt: journaled.Runtime) -> None:
    """F1/R8: two threads resume one fork: one runs it, the other is refused; steps run once."""
    source = _run(rt)
    fork = rt.runs.fork(source, replace={"c": Step("c", tool="t", input="c2")})
    rt.ran.clear()  # type: ignore[attr-defined]
    barrier = threading.Barrier(2)
    outcomes: list[object] = []

    def go() -> None:
        barrier.wait()
        try:
            outcomes.append(rt.resume(fork))
        except Exception as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ok = [o for o in outcomes if isinstance(o, journaled.ExecuteResult)]
    assert len(outcomes) == 2
    assert ok
    assert all(o.ok for o in ok)
    assert rt.ran.count("c2") == 1, rt.ran  # type: ignore[attr-defined]


def _gated(rt: journaled.Runtime) -> tuple[threading.Event, threading.Event]:
    """Register tool ``gate``: it signals it entered, then waits for release."""
    entered, release = threading.Event(), threading.Event()

    def gate(x: Any) -> Any:
        entered.set()
        assert release.wait(60)
        return {"gate": x}

    rt.register_tool("gate", gate)
    return entered, release


def test_purge_of_a_source_while_its_fork_executes_is_refused_then_erases_both(
    rt: journaled.Runtime,
) -> None:
    """R2/F2: purging a fork's source while the fork executes is refused; later it erases both."""
    entered, release = _gated(rt)
    release.set()
    source = rt.runs.execute(
        Plan(
            goal=SECRET, steps=[Step("a", tool="t", input=SECRET), Step("g", tool="gate", input=1)]
        )
    )
    fork = rt.runs.fork(source.run_id, replace={"g": Step("g", tool="gate", input=2)})
    release.clear()
    entered.clear()
    done: list[object] = []
    worker = threading.Thread(target=lambda: done.append(rt.resume(fork)))
    worker.start()
    assert entered.wait(60)
    with pytest.raises(journaled.RunNotPurgeable):
        rt.runs.purge(source.run_id, reason="gdpr")
    release.set()
    worker.join(60)
    assert len(done) == 1
    assert isinstance(done[0], journaled.ExecuteResult)
    assert done[0].ok
    assert rt.runs.purge(source.run_id, reason="gdpr") > 0
    for run in (source.run_id, fork):
        assert "4242" not in repr(rt.runs.history(run)), run


def test_forking_a_fork_while_it_executes_keeps_only_what_had_succeeded(
    rt: journaled.Runtime,
) -> None:
    """F1/F2: a fork of an executing fork keeps its succeeded steps; lineage names both forks."""
    entered, release = _gated(rt)
    release.set()
    source = rt.runs.execute(
        Plan(goal="g", steps=[Step("a", tool="t", input="a"), Step("g", tool="gate", input=1)])
    )
    release.clear()
    first = rt.runs.fork(source.run_id, replace={"g": Step("g", tool="gate", input=2)})
    worker = threading.Thread(target=lambda: rt.resume(first))
    worker.start()
    assert entered.wait(60)
    second = rt.runs.fork(first)
    release.set()
    worker.join(60)
    assert [(x.run_id, x.forked_from) for x in rt.runs.lineage(second)] == [
        (source.run_id, None),
        (first, source.run_id),
        (second, first),
    ]
    rt.ran.clear()  # type: ignore[attr-defined]
    result = rt.resume(second)
    assert isinstance(result, journaled.ExecuteResult)
    assert result.ok
    assert rt.ran == []  # type: ignore[attr-defined]
    assert rt.runs.compare(first, second).differing == []


def test_call_budget_below_calls_used_is_refused_or_never_overspent(
    rt: journaled.Runtime,
) -> None:
    """F1, ADR 0083: a call_budget below the calls the fork carries is refused, as resume
    refuses one below the calls used, and nothing is appended; the carried calls themselves
    are a budget the fork takes."""

    def agent(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        return journaled.AgentResult(output=step.id, calls_used=2)

    rt.register_agent("ag", agent)
    rt.register_skill("s", lambda x: f"idea {x}")
    source = rt.runs.execute(
        Plan(goal="g", steps=[Step("x", agent="ag", input=1), Step("y", skill="s", input=2)])
    )
    assert source.calls_used == 3
    end = rt.journal.position()
    new_y = {"y": Step("y", skill="s", input=3)}
    with pytest.raises(ValueError, match=r"at least the 2 model call\(s\) the fork carries"):
        rt.runs.fork(source.run_id, replace=new_y, call_budget=1)
    assert rt.journal.position() == end
    fork = rt.runs.fork(source.run_id, replace=new_y, call_budget=2)
    result = rt.resume(fork)
    assert isinstance(result, journaled.ExecuteResult)
    assert result.calls_used == 2, result.calls_used
    assert result.stopped_for_budget


def test_a_second_runtime_forks_a_run_the_first_just_extended(
    sqlite_url: str, clock: ManualClock, rt: journaled.Runtime
) -> None:
    """F1: a runtime opened before a run was extended forks it with every step it now holds."""
    with journaled.open(sqlite_url, clock=clock, organization="acme") as late:
        late.register_tool("t", lambda x: {"late": x})
        source = rt.runs.execute(Plan(goal="g", steps=[Step("a", tool="t", input="a")]))
        fork = rt.runs.fork(source.run_id, replace={"a": Step("a", tool="t", input="a2")})
        rt.ran.clear()  # type: ignore[attr-defined]
        assert rt.resume(fork).ok  # type: ignore[union-attr]
        again = late.runs.fork(fork)
        result = late.resume(again)
        assert isinstance(result, journaled.ExecuteResult)
        assert result.ok
        assert [o.output for o in result.observations] == [{"v": "a2"}]


# -- refresh, stale, compare and the command line at their edges -----------------------------------


def _region(query: str, ctx: Any) -> str:
    return str(ctx.memory.search(query)[0].text.rsplit(" ", 1)[-1])


def test_refresh_of_a_run_whose_kept_agent_overran_its_budget(tmp_path: Any) -> None:
    """P4, R6, ADR 0086: the run overran its budget of 3 (an agent reserved 1 and used 5), then
    a free step read a fact since superseded. refresh forks just before that step, as a plain
    fork there does, carrying the run's own budget. Before, it passed that budget on as if the
    caller had, and the fork refused it: "call_budget must be at least the 5 model call(s)"."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, clock=ManualClock(step=1)) as rt:
        rt.register_tool("region", _region)
        rt.register_agent("over", lambda step, ctx: journaled.AgentResult(output="o", calls_used=5))
        rt.memory.remember("The deploy region is eu-west", conflict_key="region")
        steps = [
            Step("a", agent="over"),
            Step("b", tool="region", input="deploy", depends_on=["a"]),
        ]
        run = rt.execute(
            Plan(goal="g", steps=steps), call_budget=3, reserve=lambda step, remaining: 1
        )
        assert run.ok
        assert run.calls_used == 5
        rt.memory.remember("The deploy region is us-east", conflict_key="region")
        fresh = rt.runs.refresh(run.run_id)
        state = rt.runs.state(fresh)
        assert state.status == {"a": "succeeded", "b": "pending"}
        assert state.budget == 3
        assert rt.journal.verify().ok


def test_stale_of_an_orchestration_is_its_pass_runs_and_refresh_names_them(
    tmp_path: Any,
) -> None:
    """P3, P4, O: an orchestration's steps run and read in its pass runs. ``stale`` of the
    orchestration's id lists its pass runs' stale steps; ``refresh`` of it refuses, naming the
    pass run to refresh, as ``fork`` and ``compare`` refuse an orchestration. Before, both
    answered that nothing was stale."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, clock=ManualClock(step=1)) as rt:
        rt.register_tool("region", _region)
        rt.memory.remember("The deploy region is eu-west", conflict_key="region")
        out = rt.orchestrate(
            "g",
            lambda goal, obs, cl: Plan(goal=goal, steps=[Step("a", tool="region", input="deploy")]),
        )
        assert out.status == "completed"
        assert rt.runs.stale(out.run_id) == []
        with pytest.raises(ValueError, match="none has a stale step"):
            rt.runs.refresh(out.run_id)
        rt.memory.remember("The deploy region is us-east", conflict_key="region")
        [stale] = rt.runs.stale()
        assert rt.runs.stale(out.run_id) == [stale]
        assert stale.run_id != out.run_id  # the pass run's
        with pytest.raises(ValueError, match=f"is an orchestration.*{stale.run_id}"):
            rt.runs.refresh(out.run_id)
        assert rt.runs.state(rt.runs.refresh(stale.run_id)).status == {"a": "pending"}


def test_compare_finds_a_kept_nan_output_the_same(tmp_path: Any) -> None:
    """F3, ADR 0097: a step whose output holds a NaN does not differ from itself: not in a run
    compared with itself, not in a fork that kept it. Before, nan != nan made it differ."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, clock=ManualClock(step=1)) as rt:
        rt.register_tool("nan", lambda x: {"score": float("nan")})
        rt.register_tool("t", lambda x: f"t({x})")
        run = rt.execute(
            Plan(goal="g", steps=[Step("n", tool="nan"), Step("m", tool="t", input=3)])
        )
        assert run.ok
        assert rt.runs.compare(run.run_id, run.run_id).differing == []
        fork = rt.runs.fork(run.run_id, replace={"m": Step("m", tool="t", input=4)})
        resumed = rt.resume(fork)
        assert isinstance(resumed, journaled.ExecuteResult)
        assert resumed.ok
        assert rt.runs.compare(run.run_id, fork).differing == ["m"]


@pytest.mark.parametrize("option", ["--replace", "--answer"])
def test_cli_fork_refuses_a_step_given_twice(tmp_path: Any, option: str) -> None:
    """F1: ``runs fork --replace b=… --replace b=…`` (or two ``--answer`` for one step) is
    refused naming the step, nothing appended. Before, the last silently won."""
    from click.testing import CliRunner

    from journaled.cli import main

    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, clock=ManualClock(step=1)) as rt:
        rt.register_tool("t", lambda x: f"t({x})")
        steps = [Step("a", tool="t", input=1), Step("b", tool="t", input=2, depends_on=["a"])]
        run = rt.execute(Plan(goal="g", steps=steps))
        end = rt.journal.position()
    values = ['b={"tool": "t", "input": 10}', 'b={"tool": "t", "input": 20}']
    if option == "--answer":
        values = ["b=yes", "b=no"]
    args = ["--url", url, "runs", "fork", run.run_id]
    for value in values:
        args += [option, value]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert f"{option} b: given more than once" in result.stderr
    with journaled.open(url) as rt:
        assert rt.journal.position() == end
