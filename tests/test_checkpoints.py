"""Time travel through checkpoints: the nearest checkpoint plus a short tail (SPEC T1, O7, R2).

Every state the cache serves is compared with a plain fold of the stream's prefix that does not
use it, rebuilt here the way ``RunFold.result`` built it before the plan was kept (a step's
status replaced into its definition, ``ok`` from every status).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

import journaled
from journaled import AgentResult, NeedsInput, Observation, Plan, Step
from journaled.events.base import Event
from journaled.events.orchestration import OrchestrationStarted, PassStarted
from journaled.events.orchestration_state import fold_orchestration
from journaled.events.plans import ExecuteResult, StepStatus, diff_results
from journaled.events.run_checkpoints import KEYFRAME, RunCheckpoints, RunTimeline
from journaled.events.run_state import RunFold, fold_run
from journaled.events.runs import RunStarted, StepSucceeded
from journaled.testing import ManualClock

EVERY = 3
"""Events between checkpoints here: small, so that every run crosses many of them."""
SECRET_FREE = "kept-only-until-purged"


def _reference(events: list[Event]) -> ExecuteResult:
    """Fold a prefix with no cache and build its result step by step, as before checkpoints."""
    state = fold_run(events)
    assert state.started is not None
    steps = [msgspec.structs.replace(state.steps[i], status=state.status[i]) for i in state.order]
    ok = (
        not state.stopped_for_budget
        and not state.waiting
        and all(state.status[i] == "succeeded" for i in state.order)
    )
    return ExecuteResult(
        run_id=state.run_id,
        ok=ok,
        plan=Plan(goal=state.started.plan.goal, steps=steps, id=state.started.plan.id),
        observations=list(state.observations),
        calls_used=state.calls_used,
        stopped_for_budget=state.stopped_for_budget,
        waiting=list(state.waiting),
        suspended=state.suspended is not None,
    )


def _plain(rt: journaled.Runtime, run_id: str, position: int) -> ExecuteResult | None:
    """Return a run (an orchestration's current pass) at a position without the cache."""
    journal = rt._journal
    first = journal.first(run_id)
    assert first is not None
    if isinstance(first.data, OrchestrationStarted):
        then = fold_orchestration(journal.stream(run_id, upto=position))
        events = journal.stream(then.current_run, upto=position) if then.current_run else []
        # Before its pass's run began: the pass's plan, every step pending (O7).
        return _reference(events) if events else then.not_yet_run()
    events = journal.stream(run_id, upto=position)
    return _reference(events) if events else None


def _positions(rt: journaled.Runtime, run_id: str) -> list[int]:
    """Return every journal position of a run, its passes' included, and one before and after."""
    history = rt.runs.history(run_id)
    positions = [e.position for e in history]
    for e in history:
        if isinstance(e.data, PassStarted):
            positions += [p.position for p in rt.runs.history(e.data.run)]
    return sorted(set(positions))


def _check_every_position(rt: journaled.Runtime, run_id: str) -> int:
    """T1: the cache serves, at every position of the run and in any order, a plain fold's state.

    Returns how many positions were compared.
    """
    positions = _positions(rt, run_id)
    middle = positions[len(positions) // 2]
    orders = [
        [middle, *positions],
        positions[::-1],
        random.Random(7).sample(positions, len(positions)),
    ]
    for order in orders:
        rt.runs.checkpoints = RunCheckpoints(every=EVERY)  # cold: the first call reads a prefix
        for position in order:
            expected = _plain(rt, run_id, position)
            assert rt.runs.at(run_id, position) == expected, f"position {position}"
    return len(positions)


def _asker(step: Step, ctx: journaled.AgentContext) -> AgentResult:
    if ctx.answer is None:
        raise NeedsInput(f"which branch for {step.id}?")
    return AgentResult(output=f"{step.id} on {ctx.answer}", calls_used=1)


def _boom(x: Any) -> Any:
    raise RuntimeError(f"no route to {x}")


def _register(rt: journaled.Runtime) -> None:
    rt.register_tool("fetch", lambda x: x)
    rt.register_tool("boom", _boom)
    rt.register_skill("think", lambda x: f"thought about {x}")
    rt.register_agent("asker", _asker)


def _chain(n: int, tool: str = "fetch") -> list[Step]:
    return [
        Step(f"s{i}", tool=tool, input=i, depends_on=[f"s{i - 1}"] if i else []) for i in range(n)
    ]


def _chain_run(rt: journaled.Runtime) -> str:
    return rt.execute(Plan(goal="chain", steps=_chain(12))).run_id


def _waves_run(rt: journaled.Runtime) -> str:
    steps = [
        Step(
            f"w{k}-{j}",
            tool="boom" if (k, j) == (1, 1) else "fetch",
            input=j,
            depends_on=[f"w{k - 1}-{j}"] if k else [],
        )
        for k in range(3)
        for j in range(3)
    ]
    return rt.execute(Plan(goal="waves", steps=steps), max_parallel_steps=2).run_id


def _waiting_run(rt: journaled.Runtime) -> str:
    steps = [
        Step("a", tool="fetch", input=1),
        Step("p", agent="asker"),
        Step("q", agent="asker", depends_on=["a"]),
        Step("r", agent="asker"),
        Step("z", skill="think", depends_on=["q", "r"]),
    ]
    result = rt.execute(Plan(goal="ask", steps=steps))
    assert sorted(result.waiting) == ["p", "r"]
    result = rt.runs.resume(result.run_id, answers={"r": "right"})
    assert result.waiting == ["p"]  # p not answered: still waiting; q's wave did not start
    result = rt.runs.resume(result.run_id, answers={"p": "up"})
    assert result.waiting == ["q"]
    return rt.runs.resume(result.run_id, answers={"q": "left"}).run_id


def _budget_run(rt: journaled.Runtime) -> str:
    steps = [
        Step(f"k{i}", skill="think", input=i, depends_on=[f"k{i - 1}"] if i else [])
        for i in range(4)
    ]
    result = rt.execute(Plan(goal="budget", steps=steps), call_budget=1)
    assert result.stopped_for_budget
    result = rt.runs.resume(result.run_id, call_budget=3)
    assert result.stopped_for_budget
    return rt.runs.resume(result.run_id, call_budget=10).run_id


def _fork_run(rt: journaled.Runtime) -> str:
    source = rt.execute(
        Plan(goal="fork me", steps=[*_chain(3), Step("x", tool="boom", depends_on=["s2"])])
    )
    assert not source.ok
    history = rt.runs.history(source.run_id)
    fork = rt.runs.fork(
        source.run_id, replace={"x": Step("x", tool="fetch", input="fixed", depends_on=["s2"])}
    )
    assert rt.runs.resume(fork).ok
    refork = rt.runs.fork(fork, at=rt.runs.history(fork)[0].position)
    rt.runs.resume(refork)
    assert history == rt.runs.history(source.run_id)  # the source never changes
    return fork


def _replan_run(rt: journaled.Runtime) -> str:
    def planner(goal: str, observations: list[Observation], _: list[tuple[str, str]]) -> Plan:
        return Plan(
            goal=goal,
            steps=[
                Step("a", tool="fetch", input=len(observations)),
                Step("b", tool="boom", depends_on=["a"]),
            ],
        )

    out = rt.orchestrate("replan twice", planner, mode="orchestrate", max_passes=3)
    assert out.status == "failed"
    return out.run_id


STORIES: dict[str, Callable[[journaled.Runtime], str]] = {
    "chain": _chain_run,
    "waves": _waves_run,
    "waiting-and-answers": _waiting_run,
    "budget-stop-and-resume": _budget_run,
    "fork": _fork_run,
    "orchestration-with-replans": _replan_run,
}


@pytest.mark.parametrize("story", sorted(STORIES))
def test_every_position_through_the_cache_equals_a_plain_fold(
    story: str, sqlite_url: str, clock: ManualClock
) -> None:
    """T1/O7: at every position, cold or warm, in any order, runs.at equals a plain prefix fold."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        _register(rt)
        run_id = STORIES[story](rt)
        assert _check_every_position(rt, run_id) > EVERY
        if story != "orchestration-with-replans":
            # The kept plan survives a snapshot round trip (resume and runs.state use it).
            state = fold_run(rt.runs.history(run_id))
            restored = RunFold.restore(state.snapshot())
            assert restored is not None
            assert restored.result() == state.result() == _reference(rt.runs.history(run_id))


def test_every_position_on_every_backend(journal_url: str, clock: ManualClock) -> None:
    """T1/O7: the cache serves a plain fold's state on each backend (waiting, answers, resume)."""
    with journaled.open(journal_url, clock=clock) as rt:
        _register(rt)
        run_id = _waiting_run(rt)
        _check_every_position(rt, run_id)
        a, b = _positions(rt, run_id)[2], _positions(rt, run_id)[-2]
        diff = rt.runs.diff(run_id, a, b)
        before, after = _plain(rt, run_id, a), _plain(rt, run_id, b)
        assert before is not None
        assert after is not None
        assert diff == diff_results(run_id, a, b, before, after)
        assert diff.status_changes  # something did change, so the comparison means something


def test_a_past_state_folds_at_most_every_minus_one_events(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T1: a state is a checkpoint plus fewer than `every` events, never a replay from the start."""
    with journaled.open(sqlite_url) as rt:
        _register(rt)
        run_id = rt.execute(Plan(goal="chain", steps=_chain(40))).run_id
        events = rt.runs.history(run_id)
        every = 2  # 60 checkpoints: several keyframes, and changes on top of each
        timeline = RunTimeline(every=every)
        timeline.extend(events)
        folded: list[int] = []
        original = RunFold.apply

        def counting(state: RunFold, event: Event) -> None:
            folded.append(event.position)
            original(state, event)

        monkeypatch.setattr(RunFold, "apply", counting)
        for event in events:
            expected = _reference([e for e in events if e.position <= event.position])
            folded.clear()
            assert timeline.result_at(event.position) == expected
            assert len(folded) < every
        assert len(timeline.checkpoints) == (len(events) + every - 1) // every
        keyframes = sum(c.plan is not None for c in timeline.checkpoints)
        # One checkpoint in KEYFRAME holds the whole plan, the others what changed.
        assert keyframes == (len(timeline.checkpoints) + KEYFRAME - 1) // KEYFRAME


def _content_run(rt: journaled.Runtime) -> str:
    steps = [
        Step("a", tool="fetch", input=f"{SECRET_FREE}-input"),
        Step("b", tool="fetch", input=f"{SECRET_FREE}-b", depends_on=["a"]),
    ]
    return rt.execute(Plan(goal=f"{SECRET_FREE}-goal", steps=steps)).run_id


def test_purge_drops_the_runs_checkpoints(sqlite_url: str) -> None:
    """T1/R2: runs.purge drops the cache, so no past state served afterwards holds the content."""
    with journaled.open(sqlite_url) as rt:
        _register(rt)
        run_id = _content_run(rt)
        end = rt.journal.position()
        assert SECRET_FREE in msgspec.json.encode(rt.runs.at(run_id, end - 1)).decode()
        assert run_id in rt.runs.checkpoints
        assert rt.runs.purge(run_id, reason="erasure request") > 0
        assert run_id not in rt.runs.checkpoints
        for position in _positions(rt, run_id):
            served = rt.runs.at(run_id, position)
            assert SECRET_FREE not in msgspec.json.encode(served).decode()
            assert served == _plain(rt, run_id, position)


def test_purge_by_another_runtime_drops_what_this_one_held(sqlite_url: str) -> None:
    """T1/R2: a purge appended by another runtime is seen at the next call: nothing stale served."""
    with journaled.open(sqlite_url) as rt, journaled.open(sqlite_url) as other:
        _register(rt)
        run_id = _content_run(rt)
        positions = _positions(rt, run_id)
        for position in positions:
            assert rt.runs.at(run_id, position) == _plain(rt, run_id, position)
        assert SECRET_FREE in msgspec.json.encode(rt.runs.at(run_id, positions[-1])).decode()
        assert other.runs.purge(run_id, reason="erasure request") > 0
        for position in positions:
            served = rt.runs.at(run_id, position)
            assert SECRET_FREE not in msgspec.json.encode(served).decode(), position
            assert served == _plain(rt, run_id, position)


def test_a_live_run_extends_the_cache_with_its_new_events_only(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T1: after a cached runs.at, a resumed run's later positions read only the events since."""
    with journaled.open(sqlite_url) as rt:
        _register(rt)
        rt.runs.checkpoints = RunCheckpoints(every=EVERY)
        steps = [Step("a", tool="fetch", input=1), Step("q", agent="asker", depends_on=["a"])]
        waiting = rt.execute(Plan(goal="ask", steps=steps))
        run_id = waiting.run_id
        first_pass = _positions(rt, run_id)
        assert rt.runs.at(run_id, first_pass[-1]) == _plain(rt, run_id, first_pass[-1])
        reads: list[tuple[int, int | None]] = []
        original = rt.runs._read_after

        def spy(run: str, version: int, upto: int | None) -> list[Event]:
            reads.append((version, upto))
            return original(run, version, upto)

        monkeypatch.setattr(rt.runs, "_read_after", spy)
        done = rt.runs.resume(run_id, answers={"q": "yes"})
        assert done.ok
        end = rt.journal.position()
        assert rt.runs.at(run_id, end) == _plain(rt, run_id, end) == done
        assert reads == [(len(first_pass), None)]  # only what followed the held version
        for position in _positions(rt, run_id):
            assert rt.runs.at(run_id, position) == _plain(rt, run_id, position)


def test_positions_before_or_past_a_run_give_the_same_errors(
    sqlite_url: str, clock: ManualClock
) -> None:
    """T1/O7: before a run began or past the journal's end, cold or warm: the same ValueError."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        _register(rt)
        earlier = _chain_run(rt)
        run_id = _chain_run(rt)
        orchestration = _replan_run(rt)
        begin = rt.runs.history(run_id)[0].position
        end = rt.journal.position()
        for _ in ("cold", "warm"):
            with pytest.raises(ValueError, match=rf"position {begin - 1} is before run {run_id}"):
                rt.runs.at(run_id, begin - 1)
            with pytest.raises(
                ValueError, match=rf"position {end + 1} is past the end .*\({end}\)"
            ):
                rt.runs.at(run_id, end + 1)
            with pytest.raises(ValueError, match="before run"):
                rt.runs.diff(run_id, begin - 1, end)
            opening = rt.runs.history(orchestration)[0].position  # planning: no plan yet
            assert rt.runs.at(orchestration, opening).plan.steps == []
            assert rt.runs.at(run_id, begin).plan.steps[0].status == "pending"
            assert rt.runs.at(earlier, end) == _plain(rt, earlier, end)
        with pytest.raises(journaled.RunNotFound):
            rt.runs.at("run_nope", end)


def test_the_cache_bound_is_honoured_least_recently_used_first(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T1: past its bound the cache drops the least recently used runs, never the one in use."""
    with journaled.open(sqlite_url) as rt:
        _register(rt)
        runs = [rt.execute(Plan(goal=f"r{n}", steps=_chain(6))).run_id for n in range(3)]
        sizes = {run: len(rt.runs.history(run)) for run in runs}
        budget = sizes[runs[0]] + sizes[runs[1]]
        rt.runs.checkpoints = cache = RunCheckpoints(every=4, budget=budget)
        end = rt.journal.position()
        rt.runs.at(runs[0], end)
        rt.runs.at(runs[1], end)
        assert cache.runs() == runs[:2]
        assert cache.held == budget
        rt.runs.at(runs[0], end)  # used again: now the most recent
        rt.runs.at(runs[2], end)
        assert cache.runs() == [runs[0], runs[2]]
        assert cache.held <= budget
        tiny = rt.runs.checkpoints = RunCheckpoints(every=4, budget=1)
        assert rt.runs.at(runs[1], end) == _plain(rt, runs[1], end)
        assert tiny.runs() == [runs[1]]  # heavier than the bound alone: kept while in use
        rt.runs.at(runs[2], end)
        assert tiny.runs() == [runs[2]]
        assert tiny.held == sizes[runs[2]]


def test_bad_cache_settings_are_refused() -> None:
    """T1: a checkpoint spacing below 1 event or a negative bound is a one-line ValueError."""
    with pytest.raises(ValueError, match="every must be at least 1 event, got 0"):
        RunCheckpoints(every=0)
    with pytest.raises(ValueError, match="budget must be >= 0 units, got -1"):
        RunCheckpoints(budget=-1)


def test_time_travel_answers_from_events_never_from_a_snapshot(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T1/R7: runs.at and runs.diff never read a run's snapshot, cold or warm (ADR 0034)."""
    with journaled.open(sqlite_url) as rt:
        _register(rt)
        run_id = _waiting_run(rt)
        purged = _content_run(rt)
        assert rt.runs.purge(purged, reason="erasure request") > 0
    with journaled.open(sqlite_url) as rt:
        journal = rt.runs._journal
        assert journal.snapshot(run_id) is not None  # the executor wrote one: it goes unread

        def no_snapshot(stream: str) -> None:
            raise AssertionError(f"time travel read the snapshot of {stream}")

        monkeypatch.setattr(journal, "snapshot", no_snapshot)
        end = rt.journal.position()
        middle = _positions(rt, run_id)[3]
        assert rt.runs.at(run_id, end) == _plain(rt, run_id, end)  # cold, at the end
        assert rt.runs.at(run_id, middle) == _plain(rt, run_id, middle)
        assert rt.runs.diff(run_id, middle, end).b == end
        assert run_id in rt.runs.checkpoints
        served = rt.runs.at(purged, end)
        assert served == _plain(rt, purged, end)
        assert SECRET_FREE not in msgspec.json.encode(served).decode()


def test_diff_of_one_runs_plans_names_every_changed_status() -> None:
    """T1/O7: diff compares a long plan slice by slice, yet names every step whose status moved."""
    rng = random.Random(11)
    statuses: list[StepStatus] = ["pending", "running", "succeeded", "failed", "skipped"]
    base = [Step(f"s{i}", tool="fetch", status=rng.choice(statuses)) for i in range(700)]
    later = list(base)
    for n in rng.sample(range(700), 40):  # another object, with another status or the same one
        later[n] = msgspec.structs.replace(base[n], status=rng.choice(statuses))
    later[0] = msgspec.structs.replace(
        base[0], status="failed" if base[0].status != "failed" else "skipped"
    )
    later[699] = msgspec.structs.replace(
        base[699], status="running" if base[699].status != "running" else "pending"
    )

    def result(steps: list[Step]) -> ExecuteResult:
        return ExecuteResult(
            run_id="run_x",
            ok=False,
            plan=Plan(goal="g", steps=steps),
            observations=[],
            calls_used=0,
        )

    diff = diff_results("run_x", 1, 2, result(base), result(later))
    expected = [
        (a.id, a.status, b.status) for a, b in zip(base, later, strict=True) if a.status != b.status
    ]
    assert [(c.step_id, c.before, c.after) for c in diff.status_changes] == expected
    assert len(expected) > 2


def _cold(rt: journaled.Runtime) -> None:
    """Make the runtime's next time travel a first call, as in a new process."""
    rt.runs.checkpoints = RunCheckpoints(every=EVERY)


def test_cold_equals_warm_equals_a_plain_fold_at_every_position(
    journal_url: str, clock: ManualClock
) -> None:
    """T1/O7: a first call (cold), the second and a warm one all equal a plain fold, per backend."""
    with journaled.open(journal_url, clock=clock) as rt:
        _register(rt)
        run_id = _budget_run(rt)
        positions = _positions(rt, run_id)
        for position in positions:
            _cold(rt)
            expected = _plain(rt, run_id, position)
            assert rt.runs.at(run_id, position) == expected, f"cold at {position}"
            assert rt.runs.at(run_id, position) == expected, f"second at {position}"
            assert rt.runs.at(run_id, position) == expected, f"warm at {position}"
        a, b = positions[1], positions[-2]
        _cold(rt)
        before, after = _plain(rt, run_id, a), _plain(rt, run_id, b)
        assert before is not None
        assert after is not None
        assert rt.runs.diff(run_id, a, b) == diff_results(run_id, a, b, before, after)


def test_a_cold_call_folds_once_and_the_next_builds_checkpoints_from_it(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T1: a first call reads the prefix once and builds no checkpoint; the next reads the rest."""
    with journaled.open(sqlite_url) as rt:
        _register(rt)
        run_id = rt.execute(Plan(goal="chain", steps=_chain(20))).run_id
        positions = _positions(rt, run_id)
        middle = positions[len(positions) // 2]
        _cold(rt)
        reads: list[tuple[int, int | None]] = []
        original = rt.runs._read_after

        def spy(run: str, version: int, upto: int | None) -> list[Event]:
            reads.append((version, upto))
            return original(run, version, upto)

        def no_second_read(_: str) -> Event:
            raise AssertionError("the run's first event was read apart from its prefix")

        monkeypatch.setattr(rt.runs, "_read_after", spy)
        monkeypatch.setattr(rt.runs, "_first", no_second_read)
        assert rt.runs.at(run_id, middle) == _plain(rt, run_id, middle)
        assert reads == [(0, middle)]  # one read, of the prefix only
        timeline = rt.runs.checkpoints._timelines[run_id]
        assert timeline.checkpoints == []
        assert len(timeline.pending) == positions.index(middle) + 1
        end = positions[-1]
        assert rt.runs.at(run_id, end) == _plain(rt, run_id, end)
        assert reads[1:] == [(positions.index(middle) + 1, None)]  # only what followed
        assert timeline.pending == []
        assert len(timeline.checkpoints) == (len(positions) + EVERY - 1) // EVERY


def test_a_purge_after_a_cold_call_reaches_what_it_kept(sqlite_url: str) -> None:
    """T1/R2: a prefix kept by a first call is dropped when another runtime purges the run."""
    with journaled.open(sqlite_url) as rt, journaled.open(sqlite_url) as other:
        _register(rt)
        run_id = _content_run(rt)
        positions = _positions(rt, run_id)
        _cold(rt)
        kept = rt.runs.at(run_id, positions[-2])
        assert SECRET_FREE in msgspec.json.encode(kept).decode()
        assert other.runs.purge(run_id, reason="erasure request") > 0
        for position in positions:
            served = rt.runs.at(run_id, position)
            assert SECRET_FREE not in msgspec.json.encode(served).decode(), position
            assert served == _plain(rt, run_id, position)


def test_a_read_mixing_events_with_and_without_content_returns_each_whole(
    journal_url: str,
) -> None:
    """T1/J1: a stream whose events only some have a side row reads back whole, per backend."""
    with journaled.open(journal_url) as rt:
        rt.register_tool("half", lambda x: f"out-{x}" if x % 2 else None)
        # 70 steps: more side rows than a read looks up one by one (SQLite reads a range).
        live = rt.execute(Plan(goal="half of it has content", steps=_chain(70, tool="half")))
        outputs = [o.output for o in live.observations]
        assert outputs == [f"out-{i}" if i % 2 else None for i in range(70)]
        _cold(rt)
        end = rt.journal.position()
        # Before the run's last event: read from the stream, not served by the snapshot.
        run_id = live.run_id
        assert rt.runs.at(run_id, end - 1) == live
        read = [e.data for e in rt.runs.history(run_id)]
        assert [
            o.output for e in read if isinstance(e, StepSucceeded) for o in [e.observation]
        ] == (outputs)
        assert isinstance(read[0], RunStarted)
        assert read[0].plan.goal == "half of it has content"
