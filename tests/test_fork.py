"""Forks of runs: fork, resume, lineage, compare, the CLI and bad input (SPEC F1-F3)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from crash import kill_when_in_flight

import journaled
from journaled import AgentResult, NeedsInput, Plan, Step
from journaled.cli import main
from journaled.events.orchestration import PassStarted
from journaled.events.run_state import RunFold
from journaled.testing import ManualClock


class Side:
    """A side log of which steps' code ran (a step's code runs only when it executes)."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.lock = threading.Lock()

    def note(self, name: str) -> None:
        with self.lock:
            self.ran.append(name)


def register(runtime: journaled.Runtime, side: Side) -> None:
    """Register the steps of :func:`small_plan`: each notes its step id in the side log."""

    def tool(x: Any) -> Any:
        side.note(x["id"])
        return {"tool": x["id"], "v": x.get("v", 0)}

    def skill(x: Any) -> Any:
        side.note(x["id"])
        return f"idea {x['id']}"

    def boom(x: Any) -> Any:
        side.note(x["id"])
        raise RuntimeError("disk full")

    def agent(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        side.note(step.id)
        return AgentResult(output=f"agent {step.id}", calls_used=2)

    runtime.register_tool("t", tool)
    runtime.register_tool("t2", lambda x: {"t2": x["id"], "v": x.get("v", 0)})
    runtime.register_tool("boom", boom)
    runtime.register_skill("s", skill)
    runtime.register_agent("ag", agent)


def small_plan() -> Plan:
    """A tool, a skill, an agent, a failure and steps downstream of each."""
    return Plan(
        goal="fork me",
        steps=[
            Step("a", tool="t", input={"id": "a"}),
            Step("b", skill="s", input={"id": "b"}, depends_on=["a"]),
            Step("c", agent="ag", input={"id": "c"}),
            Step("d", tool="t", input={"id": "d"}, depends_on=["b", "c"]),
            Step("e", tool="boom", input={"id": "e"}, depends_on=["a"]),
            Step("f", tool="t", input={"id": "f"}, depends_on=["e"]),
        ],
    )


@pytest.fixture
def runtime(journal_url: str, clock: ManualClock) -> Iterator[journaled.Runtime]:
    """Yield a runtime with agents on each backend."""
    with journaled.open(journal_url, clock=clock, agents=True) as rt:
        yield rt


def outcome(result: journaled.ExecuteResult) -> dict[str, tuple[str, Any, Any]]:
    """Return each step's status, last output and last error."""
    last = {o.step_id: o for o in result.observations}
    return {
        s.id: (
            s.status,
            last[s.id].output if s.id in last else None,
            last[s.id].error if s.id in last else None,
        )
        for s in result.plan.steps
    }


def resumed(rt: journaled.Runtime, run_id: str) -> journaled.ExecuteResult:
    """Resume a fork (a run, never an orchestration) and return its result."""
    result = rt.resume(run_id)
    assert isinstance(result, journaled.ExecuteResult)
    return result


def stored(rt: journaled.Runtime, run_id: str) -> bytes:
    """Return a run's stream exactly as read back, encoded."""
    return msgspec.json.encode(rt.runs.history(run_id))


def test_fork_at_every_position_equals_a_fresh_execution(runtime: journaled.Runtime) -> None:
    """F1: a fork at any position, resumed, ends as a fresh run; only unsucceeded steps run."""
    side = Side()
    register(runtime, side)
    fresh = runtime.execute(small_plan())
    assert not fresh.ok
    assert outcome(fresh)["e"][0] == "failed"
    source = fresh.run_id
    before = stored(runtime, source)
    positions = [e.position for e in runtime.runs.history(source)]
    for position in positions:
        then = runtime.runs.at(source, position)
        succeeded = {s.id for s in then.plan.steps if s.status == "succeeded"}
        side.ran.clear()
        fork = runtime.runs.fork(source, position)
        assert side.ran == [], "fork must not execute anything"
        result = resumed(runtime, fork)
        assert outcome(result) == outcome(fresh), position
        assert result.calls_used == fresh.calls_used, position
        assert sorted(side.ran) == sorted({s.id for s in small_plan().steps} - succeeded - {"f"})
    assert stored(runtime, source) == before


def test_replace_repends_exactly_the_downstream_set(runtime: journaled.Runtime) -> None:
    """F1: a replaced step and its dependents, transitively, run again; the rest are kept."""
    side = Side()
    register(runtime, side)
    plan = Plan(
        goal="g",
        steps=[
            Step("a", tool="t", input={"id": "a"}),
            Step("b", tool="t", input={"id": "b"}, depends_on=["a"]),
            Step("c", tool="t", input={"id": "c"}, depends_on=["b"]),
            Step("d", tool="t", input={"id": "d"}, depends_on=["a"]),
            Step("e", tool="t", input={"id": "e"}),
        ],
    )
    source = runtime.execute(plan)
    assert source.ok
    side.ran.clear()
    fork = runtime.runs.fork(
        source.run_id,
        replace={"b": Step("b", tool="t", input={"id": "b", "v": 7}, depends_on=["a"])},
    )
    result = resumed(runtime, fork)
    assert result.ok
    assert sorted(side.ran) == ["b", "c"]
    assert outcome(result)["b"][1] == {"tool": "b", "v": 7}
    # The kind and the target may change too.
    fork2 = runtime.runs.fork(
        source.run_id, replace={"d": Step("d", tool="t2", input={"id": "d"}, depends_on=["a"])}
    )
    side.ran.clear()
    assert outcome(resumed(runtime, fork2))["d"][1] == {"t2": "d", "v": 0}
    assert side.ran == []


def test_forks_of_forks_lineage_and_why(runtime: journaled.Runtime) -> None:
    """F2: lineage lists root to fork; why starts with where a fork comes from."""
    side = Side()
    register(runtime, side)
    source = runtime.execute(small_plan()).run_id
    at = runtime.runs.history(source)[2].position
    first = runtime.runs.fork(source, at)
    why = runtime.runs.why(first)
    assert why.startswith(f"forked from {source} at #{at} with no change: kept")
    assert "not run yet" in why
    assert f"rt.resume({first!r})" in why
    assert first in runtime.runs.ids()
    resumed(runtime, first)
    second = runtime.runs.fork(
        first, replace={"a": Step("a", tool="t", input={"id": "a", "v": 1})}, call_budget=50
    )
    why2 = runtime.runs.why(second)
    assert why2.startswith(f"forked from {first} at #")
    assert "step(s) 'a' (now tool 't'" in why2
    assert "replaced" in why2
    assert "call budget None -> 50" in why2
    lineage = runtime.runs.lineage(second)
    assert [(x.run_id, x.forked_from) for x in lineage] == [
        (source, None),
        (first, source),
        (second, first),
    ]
    assert lineage[1].at == at
    assert lineage[0].at is None
    assert runtime.runs.history(second)[0].kind == "run.forked"
    assert resumed(runtime, second).plan.steps[0].status == "succeeded"


def test_answers_and_budget_carry_into_the_fork(runtime: journaled.Runtime) -> None:
    """F1: answers pre-answer steps waiting at the position; the budget is the new total."""
    asked: list[str | None] = []

    def asker(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        asked.append(ctx.answer)
        if ctx.answer is None:
            raise NeedsInput("which branch?")
        return AgentResult(output=f"on {ctx.answer}", calls_used=1)

    runtime.register_agent("asker", asker)
    runtime.register_skill("s", lambda x: "idea")
    plan = Plan(goal="g", steps=[Step("k", skill="s"), Step("w", agent="asker")])
    waiting = runtime.execute(plan, call_budget=10)
    assert waiting.waiting == ["w"]
    fork = runtime.runs.fork(waiting.run_id, answers={"w": "left"}, call_budget=3)
    assert runtime.runs.state(fork).budget == 3
    result = resumed(runtime, fork)
    assert result.ok
    assert outcome(result)["w"][1] == "on left"
    assert asked[-1] == "left"
    assert result.calls_used == waiting.calls_used + 1
    assert runtime.runs.state(waiting.run_id).waiting == ["w"]  # the source is untouched


def test_compare_two_runs(runtime: journaled.Runtime) -> None:
    """F3: compare gives status and output per step in each run, what differs, calls used."""
    side = Side()
    register(runtime, side)
    source = runtime.execute(small_plan())
    fork = runtime.runs.fork(
        source.run_id, replace={"a": Step("a", tool="t", input={"id": "a", "v": 2})}
    )
    same = runtime.runs.compare(source.run_id, source.run_id)
    assert same.differing == []
    assert same.calls_used_a == same.calls_used_b
    before_run = runtime.runs.compare(source.run_id, fork)
    assert set(before_run.differing) == {"a", "b", "d", "e", "f"}  # pending in the fork
    resumed(runtime, fork)
    cmp = runtime.runs.compare(source.run_id, fork)
    assert cmp.differing == ["a"]
    row = cmp.steps[0]
    assert (row.output_a, row.output_b) == ({"tool": "a", "v": 0}, {"tool": "a", "v": 2})
    assert (row.status_a, row.status_b) == ("succeeded", "succeeded")
    assert cmp.calls_used_a == cmp.calls_used_b == source.calls_used
    assert cmp.only_in_a == []
    assert cmp.only_in_b == []


def test_bad_input_is_one_line_and_appends_nothing(runtime: journaled.Runtime) -> None:
    """F1: unknown run, bad position, unknown or changed step, bad answers: nothing appended."""
    side = Side()
    register(runtime, side)
    source = runtime.execute(small_plan()).run_id
    first = runtime.runs.history(source)[0].position
    end = runtime.journal.position()
    b = Step("b", skill="s", input={"id": "b"}, depends_on=["a"])
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"run_id": "run_nope"}, journaled.RunNotFound, "no run 'run_nope'"),
        ({"at": first - 1}, ValueError, "before run"),
        ({"at": end + 5}, ValueError, "past the end of the journal"),
        ({"at": "x"}, ValueError, "at must be"),
        ({"replace": {"zz": b}}, ValueError, r"replace\['zz'\]: run .* has no step 'zz'"),
        ({"replace": {"b": Step("x", skill="s", depends_on=["a"])}}, ValueError, r"\.id must"),
        (
            {"replace": {"b": Step("b", skill="s", depends_on=["c"])}},
            ValueError,
            r"\.depends_on must stay \['a'\], got \['c'\]: .* leave depends_on out",
        ),
        ({"replace": {"b": Step("b", depends_on=["a"])}}, ValueError, "exactly one of"),
        (
            {"replace": {"b": Step("b", skill="s", input=object(), depends_on=["a"])}},
            ValueError,
            r"replace\['b'\]\.input",
        ),
        ({"replace": {"b": "tool"}}, ValueError, "must be a journaled.Step"),
        ({"answers": {"a": "x"}}, ValueError, r"answers\['a'\]: .* not waiting"),
        ({"call_budget": -1}, ValueError, "call_budget"),
    ]
    for kwargs, error, match in cases:
        run_id = kwargs.pop("run_id", source)
        with pytest.raises(error, match=match) as caught:
            runtime.runs.fork(run_id, **kwargs)
        assert "\n" not in str(caught.value)
        assert runtime.journal.position() == end, kwargs


def test_purged_run_cannot_fork(runtime: journaled.Runtime) -> None:
    """F1: a purged run's inputs are gone: forking it is refused, nothing appended."""
    side = Side()
    register(runtime, side)
    source = runtime.execute(small_plan()).run_id
    runtime.runs.purge(source, "gdpr")
    end = runtime.journal.position()
    with pytest.raises(journaled.RunNotResumable, match="purged"):
        runtime.runs.fork(source)
    assert runtime.journal.position() == end


def test_a_fork_is_purged_like_any_run(runtime: journaled.Runtime) -> None:
    """F2: the fork's carried outputs are run content: purging the fork erases them."""
    runtime.register_tool("secret", lambda x: "the launch code")
    source = runtime.execute(Plan(goal="g", steps=[Step("a", tool="secret")])).run_id
    fork = runtime.runs.fork(source)
    runtime.runs.purge(fork, "gdpr")
    assert "the launch code" not in runtime.runs.why(fork)
    assert "the launch code" in json.dumps(msgspec.to_builtins(runtime.runs.current(source)))


def test_fork_of_a_run_executing_elsewhere(sqlite_url: str, clock: ManualClock) -> None:
    """F1: a run still executing in another runtime forks from the journal alone."""
    gate = threading.Event()
    in_b = threading.Event()

    def slow(x: Any) -> Any:
        in_b.set()
        assert gate.wait(30)
        return "slow"

    plan = Plan(
        goal="g",
        steps=[Step("a", tool="fast", input=1), Step("b", tool="slow", depends_on=["a"])],
    )
    with journaled.open(sqlite_url, clock=clock) as one, journaled.open(sqlite_url) as two:
        one.register_tool("fast", lambda x: "fast")
        one.register_tool("slow", slow)
        two.register_tool("fast", lambda x: "fast again")
        two.register_tool("slow", lambda x: "slow here")
        handle = one.runs.start(plan)
        assert in_b.wait(30)
        fork = two.runs.fork(handle.run_id)
        result = resumed(two, fork)
        assert outcome(result) == {
            "a": ("succeeded", "fast", None),
            "b": ("succeeded", "slow here", None),
        }
        gate.set()
        assert handle.result(30).ok
        assert outcome(one.runs.current(handle.run_id))["b"][1] == "slow"


def test_fork_of_an_agent_keeps_its_child_run(runtime: journaled.Runtime) -> None:
    """F1: a carried-over agent step keeps its child run's id; the child run forks too."""
    runtime.register_tool("t", lambda x: x)

    def boss(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        child = ctx.execute(Plan(goal="sub", steps=[Step("s1", tool="t", input=5)]))
        return AgentResult(output=child.observations[0].output, calls_used=0)

    runtime.register_agent("boss", boss)
    runtime.register_tool("after", lambda x: "after")
    plan = Plan(goal="g", steps=[Step("x", agent="boss"), Step("y", tool="after")])
    source = runtime.execute(plan)
    task = outcome(source)["x"]
    kept = next(o for o in source.observations if o.step_id == "x").agent_task_id
    assert kept is not None
    assert task[1] == 5
    fork = runtime.runs.fork(source.run_id, replace={"y": Step("y", tool="t", input=6)})
    result = resumed(runtime, fork)
    assert next(o for o in result.observations if o.step_id == "x").agent_task_id == kept
    assert outcome(result)["y"][1] == 6
    child_fork = runtime.runs.fork(kept, replace={"s1": Step("s1", tool="t", input=9)})
    assert outcome(resumed(runtime, child_fork))["s1"][1] == 9
    assert runtime.runs.lineage(child_fork)[0].run_id == kept


def cli(url: str, *args: str) -> Any:
    """Invoke the command line on a journal."""
    return CliRunner().invoke(main, ["--url", url, *args])


def test_cli_fork_compare_and_show(sqlite_url: str, clock: ManualClock) -> None:
    """F1-F3: runs fork prints the new id, --json says how to run it; compare; show's lineage."""
    with journaled.open(sqlite_url, clock=clock, agents=True) as runtime:
        register(runtime, Side())
        source = runtime.execute(small_plan()).run_id
    out = cli(
        sqlite_url, "runs", "fork", source, "--replace", 'a={"tool": "t2", "input": {"id": "a"}}'
    )
    assert out.exit_code == 0, out.output
    fork = out.output.strip()
    with journaled.open(sqlite_url) as reader:
        assert reader.runs.lineage(fork)[-1].forked_from == source
        assert reader.runs.state(fork).steps["a"].tool == "t2"
        assert reader.runs.state(fork).steps["b"].depends_on == ["a"]
    out = cli(sqlite_url, "--json", "runs", "fork", source, "--budget", "4", "--run")
    assert out.exit_code == 0, out.output
    made = json.loads(out.output)
    assert made["forked_from"] == source
    assert made["ran"] is False
    assert f"rt.resume({made['run_id']!r})" in made["how"]
    assert "not registered" in made["how"] or "unknown" in made["how"]
    with journaled.open(sqlite_url, clock=clock, agents=True) as runtime:
        register(runtime, Side())
        resumed(runtime, fork)
    out = cli(sqlite_url, "--json", "runs", "compare", source, fork)
    assert out.exit_code == 0, out.output
    cmp = json.loads(out.output)
    assert [s["step_id"] for s in cmp["steps"] if s["differs"]] == ["a"]
    assert cmp["steps"][0]["output_b"] == {"t2": "a", "v": 0}
    text = cli(sqlite_url, "runs", "compare", source, fork)
    assert text.exit_code == 0
    assert "calls used: A" in text.output
    show = cli(sqlite_url, "--json", "runs", "show", fork)
    assert [x["run_id"] for x in json.loads(show.output)["lineage"]] == [source, fork]
    shown = cli(sqlite_url, "runs", "show", fork)
    assert f"forked from {source} at #" in shown.output
    bad = cli(sqlite_url, "runs", "fork", source, "--replace", "zz={}")
    assert bad.exit_code != 0
    assert "zz" in bad.output
    assert len(bad.output.strip().splitlines()) == 1
    bad_json = cli(sqlite_url, "runs", "fork", source, "--replace", "a=nope")
    assert bad_json.exit_code != 0
    assert "not JSON" in bad_json.output


_CRASH_SCRIPT = r"""
import json, os, sys, threading
import journaled

cfg = json.loads(sys.argv[1])


def tool(data):
    with open(cfg["record"], "a", encoding="utf-8") as f:
        f.write(data["id"] + "\n")
    if data["id"] == "b":
        with open(cfg["marker"], "w", encoding="utf-8") as f:
            f.flush()
            os.fsync(f.fileno())
        threading.Event().wait()
    return data["id"]


with journaled.open(cfg["url"]) as rt:
    rt.register_tool("t", tool)
    result = rt.resume(cfg["fork"])
    print(result.ok)
"""


def test_a_fork_killed_mid_execution_resumes_like_any_run(sqlite_url: str, tmp_path: Path) -> None:
    """F1: a fork whose execution is SIGKILLed mid-step resumes from its own stream."""
    plan = Plan(
        goal="g",
        steps=[
            Step("a", tool="t", input={"id": "a"}),
            Step("b", tool="t", input={"id": "b"}, depends_on=["a"]),
            Step("c", tool="t", input={"id": "c"}, depends_on=["b"]),
        ],
    )
    with journaled.open(sqlite_url) as runtime:
        runtime.register_tool("t", lambda x: {"first": x["id"]})
        source = runtime.execute(plan).run_id
        fork = runtime.runs.fork(
            source, replace={"b": Step("b", tool="t", input={"id": "b"}, depends_on=["a"])}
        )
    record, marker = tmp_path / "record", tmp_path / "b.inflight"
    config = json.dumps(
        {"url": sqlite_url, "fork": fork, "record": str(record), "marker": str(marker)}
    )
    (tmp_path / "child").mkdir()
    kill_when_in_flight(_CRASH_SCRIPT, config, [marker], tmp_path / "child")
    assert record.read_text().split() == ["b"]  # a was carried over, never ran
    with journaled.open(sqlite_url) as runtime:
        assert runtime.runs.state(fork).in_flight() == ["b"]
        runtime.register_tool("t", lambda x: {"again": x["id"]})
        result = resumed(runtime, fork)
        assert result.ok
        assert outcome(result)["a"][1] == {"first": "a"}
        assert outcome(result)["b"][1] == {"again": "b"}
        assert outcome(result)["c"][1] == {"again": "c"}
        assert runtime.runs.state(fork).attempts["b"] == 2


def test_orchestration_refused_its_pass_run_forks(runtime: journaled.Runtime) -> None:
    """F1: forking an orchestration is refused naming its pass runs; a pass run forks."""
    side = Side()
    register(runtime, side)

    def planner(goal: str, observations: Any, clarifications: Any) -> Plan:
        return Plan(goal=goal, steps=[Step("a", tool="t", input={"id": "a"})])

    out = runtime.orchestrate("g", planner)
    end = runtime.journal.position()
    with pytest.raises(ValueError, match="is an orchestration: fork one of its pass runs"):
        runtime.runs.fork(out.run_id)
    assert runtime.journal.position() == end
    pass_run = next(
        e.data.run for e in runtime.runs.history(out.run_id) if isinstance(e.data, PassStarted)
    )
    fork = runtime.runs.fork(pass_run, replace={"a": Step("a", tool="t2", input={"id": "a"})})
    opening = runtime.runs.state(fork).started
    assert opening is not None
    assert opening.parent_run is None  # a run of its own, not a pass
    assert outcome(resumed(runtime, fork))["a"][1] == {"t2": "a", "v": 0}


def test_a_forks_snapshot_keeps_its_origin(runtime: journaled.Runtime) -> None:
    """F2: a fork's state rebuilt from a snapshot still knows where it was forked from."""
    side = Side()
    register(runtime, side)
    source = runtime.execute(small_plan()).run_id
    state = runtime.runs.state(runtime.runs.fork(source))
    assert state.forked is not None
    restored = RunFold.restore(state.snapshot())
    assert restored is not None
    assert restored.forked == state.forked
    assert restored.status == state.status
    assert restored.calls_used == state.calls_used


def test_fork_lineage_compare_through_asyncio(sqlite_url: str) -> None:
    """F1-F3: the asyncio runtime forks, resumes, traces lineage and compares as the sync one."""

    async def story() -> tuple[list[str | None], list[str]]:
        async with journaled.aio.open(sqlite_url) as rt:
            rt.register_tool("t", lambda x: x)
            plan = Plan(goal="g", steps=[Step("a", tool="t", input=1), Step("b", tool="t")])
            source = await rt.runs.execute(plan)
            fork = await rt.runs.fork(source.run_id, replace={"b": Step("b", tool="t", input=2)})
            await rt.runs.resume(fork)
            lineage = await rt.runs.lineage(fork)
            cmp = await rt.runs.compare(source.run_id, fork)
            return [x.forked_from for x in lineage], cmp.differing

    forked_from, differing = asyncio.run(story())
    assert differing == ["b"]
    assert forked_from[0] is None
    assert forked_from[1] is not None


def test_purging_a_source_erases_what_its_forks_kept(sqlite_url: str) -> None:
    """R2/F1: a fork keeps copies of its source's outputs: purging the source erases them too."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("secret", lambda x: "the launch code 7431")
        source = rt.execute(Plan(goal="g", steps=[Step("a", tool="secret")])).run_id
        fork = rt.runs.fork(source)
        fork_of_fork = rt.runs.fork(fork)
        rt.runs.purge(source, "gdpr")
        for run_id in (source, fork, fork_of_fork):
            assert "7431" not in json.dumps(msgspec.to_builtins(rt.runs.current(run_id)))
            assert "7431" not in rt.runs.why(run_id)
        rt.memory.scrub()
    path = sqlite_url.removeprefix("sqlite:///")
    for name in (path, path + "-wal"):
        with contextlib.suppress(FileNotFoundError), open(name, "rb") as stored:
            assert b"7431" not in stored.read()
