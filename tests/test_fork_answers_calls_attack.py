"""Attacks on forks, forks of forks and refresh: answers, replacement names, calls (F1, P4, R6)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from test_fork_spec import _result

import journaled
from journaled import AgentResult, NeedsInput, Plan, Retry, Step
from journaled.cli import main
from journaled.events.run_state import RunFold
from journaled.events.runs import RunForked, StepStarted
from journaled.testing import ManualClock


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, sqlite_url: str) -> str:
    """A journal on a real SQLite file, on PostgreSQL, and the in-process one."""
    if request.param == "postgresql":
        pg: str = request.getfixturevalue("pg_url")
        return pg
    return "memory://" if request.param == "memory" else sqlite_url


@pytest.fixture
def rt(url: str) -> Iterator[journaled.Runtime]:
    with journaled.open(url, clock=ManualClock(step=1)) as runtime:
        yield runtime


def _asker(rt: journaled.Runtime, asked: list[str | None]) -> None:
    """Register ``asker``: an agent that asks once, and ``s``, a skill."""

    def asker(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        asked.append(ctx.answer)
        if ctx.answer is None:
            raise NeedsInput("which branch?")
        return AgentResult(output=f"on {ctx.answer}", calls_used=1)

    rt.register_agent("asker", asker)
    rt.register_skill("s", lambda x: f"s({x})")


# -- answers given before the position are part of the state a fork copies (F1) -------------------


def test_a_fork_of_a_fork_keeps_the_answer_its_source_was_given(rt: journaled.Runtime) -> None:
    """F1: a fork of a fork that pre-answered a waiting step runs that step with the answer."""
    asked: list[str | None] = []
    _asker(rt, asked)
    plan = Plan(goal="g", steps=[Step("k", skill="s", input=1), Step("w", agent="asker")])
    source = rt.execute(plan)
    assert source.waiting == ["w"]
    answered = rt.runs.fork(source.run_id, answers={"w": "left"})
    again = rt.runs.fork(answered)  # no change: it is the answered fork's state
    assert rt.runs.state(again).answers == {"w": "left"}
    asked.clear()
    result = _result(rt, again)
    assert result.ok, result.waiting
    assert asked == ["left"]


def test_a_fork_after_an_answer_was_given_keeps_it(rt: journaled.Runtime) -> None:
    """F1: a fork at a position after a step was answered, before it finished, keeps the answer."""
    asked: list[str | None] = []
    _asker(rt, asked)
    plan = Plan(goal="g", steps=[Step("w", agent="asker")])
    source = rt.execute(plan)
    assert _result(rt, source.run_id, answers={"w": "right"}).ok
    restart = next(
        e.position
        for e in rt.runs.history(source.run_id)
        if isinstance(e.data, StepStarted) and e.data.attempt == 2
    )
    fork = rt.runs.fork(source.run_id, at=restart)  # w in flight with its answer
    asked.clear()
    result = _result(rt, fork)
    assert result.ok, result.waiting
    assert asked == ["right"]


def test_refresh_keeps_an_answer_a_fork_held_for_a_step_that_is_not_stale(
    rt: journaled.Runtime,
) -> None:
    """P4, F1 (ADR 0086): a refresh keeps the answers its run held for steps not stale."""
    asked: list[str | None] = []
    _asker(rt, asked)

    def region(query: str, ctx: Any) -> str:
        return str(ctx.memory.search(query)[0].text)

    rt.register_tool("region", region)
    rt.memory.remember("The deploy region is eu-west", conflict_key="region")
    plan = Plan(
        goal="g", steps=[Step("b", tool="region", input="deploy region"), Step("w", agent="asker")]
    )
    source = rt.execute(plan)
    assert source.waiting == ["w"]
    answered = rt.runs.fork(source.run_id, answers={"w": "left"})  # b carried, w answered
    rt.memory.remember("The deploy region is us-east", conflict_key="region")
    assert [s.step_id for s in rt.runs.stale(answered)] == ["b"]
    fresh = rt.runs.refresh(answered)
    asked.clear()
    result = _result(rt, fresh)
    assert result.ok, result.waiting
    assert asked == ["left"]
    assert rt.runs.stale(fresh) == []


def test_refresh_asks_a_stale_step_again(rt: journaled.Runtime) -> None:
    """P4 (ADR 0086): a stale step answered before it read asks again: its question rested on
    what it read then."""
    asked: list[str | None] = []

    def reader(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        assert ctx.memory is not None
        region = ctx.memory.search("deploy region")[0].text
        asked.append(ctx.answer)
        if ctx.answer is None:
            raise NeedsInput(f"{region}: ship it?")
        return AgentResult(output=f"{ctx.answer} to {region}", calls_used=1)

    rt.register_agent("reader", reader)
    rt.memory.remember("The deploy region is eu-west", conflict_key="region")
    run = rt.execute(Plan(goal="g", steps=[Step("w", agent="reader")]))
    assert run.waiting == ["w"]
    assert _result(rt, run.run_id, answers={"w": "yes"}).ok
    rt.memory.remember("The deploy region is us-east", conflict_key="region")
    fresh = rt.runs.refresh(run.run_id)
    asked.clear()
    result = _result(rt, fresh)
    assert result.waiting == ["w"]
    assert asked == [None]
    assert result.observations[-1].error == "The deploy region is us-east: ship it?"


def test_a_fork_refuses_an_empty_answer_as_resume_does(rt: journaled.Runtime) -> None:
    """F1, O4: a fork's answer is a clarification as a resume's is: an empty one is refused."""
    asked: list[str | None] = []
    _asker(rt, asked)
    source = rt.execute(Plan(goal="g", steps=[Step("w", agent="asker")]))
    with pytest.raises(journaled.RunNotResumable):
        rt.resume(source.run_id, answers={"w": "  "})
    end = rt.journal.position()
    with pytest.raises(ValueError, match="answers\\['w'\\] is empty"):
        rt.runs.fork(source.run_id, answers={"w": "  "})
    assert rt.journal.position() == end


# -- a replacement's name is checked as a plan's is (E1, F1) -------------------------------------


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"skill": 5}, "the skill name must be a non-empty string"),
        ({"skill": ""}, "the skill name must be a non-empty string"),
        ({"tool": "x" * 2000}, "the tool name is 2000 bytes"),
        ({"agent": "a\udc80"}, "the agent name holds a lone surrogate"),
        ({"skill": "s", "depends_on": 7}, "depends_on must be a list of step ids"),
    ],
)
def test_a_replacement_with_a_bad_name_is_refused_and_appends_nothing(
    rt: journaled.Runtime, fields: dict[str, Any], said: str
) -> None:
    """F1, E1: a name a plan may not have is refused before the append; the journal stays sound."""
    rt.register_skill("s", lambda x: f"s({x})")
    plan = Plan(goal="g", steps=[Step("a", skill="s", input=1), Step("b", skill="s", input=2)])
    source = rt.execute(plan).run_id
    end = rt.journal.position()
    with pytest.raises(ValueError, match=f"replace\\['b'\\]: {said}"):
        rt.runs.fork(source, replace={"b": Step("b", **fields)})
    assert rt.journal.position() == end
    assert rt.journal.verify().ok


def test_cli_replacement_with_a_number_for_a_name_is_refused(sqlite_url: str) -> None:
    """F1, E1: `runs fork --replace b='{"skill": 5}'` says why and stores nothing."""
    with journaled.open(sqlite_url, clock=ManualClock(step=1)) as rt:
        rt.register_skill("s", lambda x: f"s({x})")
        source = rt.execute(Plan(goal="g", steps=[Step("b", skill="s", input=1)])).run_id
        end = rt.journal.position()
    out = CliRunner().invoke(
        main, ["--url", sqlite_url, "runs", "fork", source, "--replace", 'b={"skill": 5}']
    )
    assert out.exit_code != 0
    assert "the skill name must be a non-empty string" in out.output
    verified = CliRunner().invoke(main, ["--url", sqlite_url, "journal", "verify"])
    assert verified.exit_code == 0, verified.output
    with journaled.open(sqlite_url) as rt:
        assert rt.journal.position() == end


# -- a kept step carries all it was charged (F1, R6) ---------------------------------------------


def _flaky_skill(rt: journaled.Runtime) -> None:
    tries: list[int] = []

    def flaky(x: Any) -> str:
        tries.append(1)
        if len(tries) == 1:
            raise RuntimeError("once")
        return f"f({x})"

    rt.register_skill("flaky", flaky, retry=Retry(attempts=3, backoff=0))
    rt.register_skill("s", lambda x: f"s({x})")


def test_a_fork_at_a_budget_stop_stops_again_when_a_kept_step_was_retried(
    rt: journaled.Runtime,
) -> None:
    """F1, R6, E7: the calls of a kept step's retried attempt carry over; the gate stops."""
    _flaky_skill(rt)
    plan = Plan(
        goal="g",
        steps=[Step("a", skill="flaky", input=1), Step("b", skill="s", input=2, depends_on=["a"])],
    )
    source = rt.execute(plan, call_budget=2)
    assert source.stopped_for_budget
    assert source.calls_used == 2
    fork = rt.runs.fork(source.run_id)  # the budget it had there: 2, all of it used
    assert rt.runs.state(fork).calls_used == 2
    result = _result(rt, fork)
    assert result.stopped_for_budget
    assert result.calls_used == 2
    assert rt.runs.compare(source.run_id, fork).calls_used_b == 2
    assert rt.runs.summary(fork).calls_used == 2
    again = rt.runs.fork(fork)
    assert rt.runs.state(again).calls_used == 2


def test_a_fork_carries_the_calls_a_kept_step_used_before_it_waited(
    rt: journaled.Runtime,
) -> None:
    """F1, R6: an agent charged before it asked, then answered: the fork keeps both charges."""

    def agent(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        if ctx.answer is None:
            return AgentResult(ok=False, code="agent-waiting", error="which?", calls_used=2)
        return AgentResult(output=f"on {ctx.answer}", calls_used=1)

    rt.register_agent("ag", agent)
    source = rt.execute(Plan(goal="g", steps=[Step("w", agent="ag")]))
    assert source.waiting == ["w"]
    assert source.calls_used == 2
    done = _result(rt, source.run_id, answers={"w": "left"})
    assert done.ok
    assert done.calls_used == 3
    fork = rt.runs.fork(source.run_id)
    assert rt.runs.state(fork).calls_used == 3
    assert rt.runs.state(rt.runs.fork(fork)).calls_used == 3


# -- a fork taken where a step waits for an answer waits on it (E10, F1, ADR 0032) ---------------


def _ask_region(rt: journaled.Runtime, asked: list[str | None], times: int = 1) -> Plan:
    """Register ``ask``, an agent asking ``times`` times, and ``t``; return a plan a -> w -> c."""

    questions: list[str] = []

    def ask(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        asked.append(ctx.answer)
        if ctx.answer is None or len(questions) < times:
            questions.append(f"which region? ({len(questions) + 1})")
            raise NeedsInput(questions[-1])
        return AgentResult(output=f"ans:{ctx.answer}", calls_used=1)

    rt.register_agent("ask", ask)
    rt.register_tool("t", lambda x: f"t({x})")
    return Plan(
        goal="g",
        steps=[
            Step("a", tool="t", input=1),
            Step("w", agent="ask"),
            Step("c", tool="t", input=2, depends_on=["w"]),
        ],
    )


@pytest.mark.timeout(60)
def test_a_fork_of_a_waiting_run_waits_and_takes_the_answer(rt: journaled.Runtime) -> None:
    """E10, F1 (ADR 0032's update of 2026-12-08): a fork where a step waits is waiting on it, as
    its source was; resume(answers=) answers it without running the agent to ask again."""
    asked: list[str | None] = []
    source = rt.execute(_ask_region(rt, asked))
    assert source.waiting == ["w"]
    fork = rt.runs.fork(source.run_id)
    state = rt.runs.state(fork)
    assert state.waiting == ["w"]
    assert state.status["w"] == "pending"
    assert state.questions == {"w": "which region? (1)"}
    assert rt.runs.current(fork).waiting == ["w"]
    asked.clear()
    result = _result(rt, fork, answers={"w": "eu"})
    assert result.ok, result.waiting
    assert asked == ["eu"]
    assert [o.output for o in result.observations if o.step_id in ("w", "c")] == [
        "ans:eu",
        "t(2)",
    ]
    # Its first position, read after the resume, still shows it waiting (T1).
    first = rt.runs.history(fork)[0].position
    assert rt.runs.at(fork, first).waiting == ["w"]


@pytest.mark.timeout(60)
def test_a_fork_of_a_waiting_fork_can_pre_answer_it(rt: journaled.Runtime) -> None:
    """E10, F1: a fork of a waiting fork may answer its step; a fork answered waits no more."""
    asked: list[str | None] = []
    source = rt.execute(_ask_region(rt, asked))
    fork = rt.runs.fork(source.run_id)
    again = rt.runs.fork(fork, answers={"w": "eu"})
    state = rt.runs.state(again)
    assert state.waiting == []
    assert state.answers == {"w": "eu"}
    with pytest.raises(journaled.RunNotResumable, match="waiting steps: none"):
        rt.resume(again, answers={"w": "us"})
    asked.clear()
    assert _result(rt, again).ok
    assert asked == ["eu"]


@pytest.mark.timeout(60)
def test_a_waiting_fork_resumed_without_an_answer_asks_again_as_its_source(
    rt: journaled.Runtime,
) -> None:
    """E10, E14: resumed with no answer, a waiting fork runs its step again, as its source
    would: the agent asks again and the fork waits."""
    asked: list[str | None] = []
    source = rt.execute(_ask_region(rt, asked, times=2))
    fork = rt.runs.fork(source.run_id)
    result = _result(rt, fork)
    assert result.waiting == ["w"]
    assert asked == [None, None]
    assert rt.runs.state(fork).questions == {"w": "which region? (2)"}


@pytest.mark.timeout(60)
def test_a_fork_waits_only_where_its_source_waited(rt: journaled.Runtime) -> None:
    """E10, F1: before the question, after its answer, or with the step replaced, a fork is
    not waiting; asked again after an answer, it is, holding that answer until another."""
    asked: list[str | None] = []
    source = rt.execute(_ask_region(rt, asked, times=2))
    before = rt.runs.history(source.run_id)[0].position
    assert rt.runs.state(rt.runs.fork(source.run_id, at=before)).waiting == []
    replaced = rt.runs.fork(source.run_id, replace={"w": Step("w", tool="t", input=3)})
    assert rt.runs.state(replaced).waiting == []
    assert _result(rt, replaced).ok
    again = _result(rt, source.run_id, answers={"w": "eu"})
    assert again.waiting == ["w"]  # it asked a second time
    twice = rt.runs.fork(source.run_id)
    state = rt.runs.state(twice)
    assert state.waiting == ["w"]
    assert state.answers == {"w": "eu"}
    assert state.questions == {"w": "which region? (2)"}
    result = _result(rt, twice, answers={"w": "eu-west-1"})
    assert result.ok, result.waiting
    assert asked[-1] == "eu-west-1"
    done = _result(rt, source.run_id, answers={"w": "eu-west-2"})
    assert done.ok
    assert rt.runs.state(rt.runs.fork(source.run_id)).waiting == []


def test_a_fork_stored_without_its_waiting_steps_reads_them_from_its_questions(
    rt: journaled.Runtime,
) -> None:
    """E10, ADR 0032's update of 2026-12-08: a ``run.forked`` stored before it named its
    waiting steps waits on those with a question, no answer and no replacement."""
    asked: list[str | None] = []
    source = rt.execute(_ask_region(rt, asked))
    forks = [
        rt.runs.fork(source.run_id),
        rt.runs.fork(source.run_id, answers={"w": "eu"}),
        rt.runs.fork(source.run_id, replace={"w": Step("w", tool="t", input=3)}),
    ]
    for fork, waiting in zip(forks, (["w"], [], []), strict=True):
        first = rt.runs.history(fork)[0].data
        assert isinstance(first, RunForked)
        assert list(first.waiting or ()) == waiting
        state = RunFold()
        state.fold(msgspec.structs.replace(first, waiting=None))
        assert state.waiting == waiting


# -- lineage of no run (F2) -----------------------------------------------------------------------


@pytest.mark.parametrize("run_id", [None, "", "run_nope"])
def test_lineage_of_no_run_says_so(rt: journaled.Runtime, run_id: Any) -> None:
    """F2: `runs.lineage` of something that is no run raises RunNotFound, as `why` does."""
    with pytest.raises(journaled.RunNotFound):
        rt.runs.why(run_id)
    with pytest.raises(journaled.RunNotFound):
        rt.runs.lineage(run_id)
