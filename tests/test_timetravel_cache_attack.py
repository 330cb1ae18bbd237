"""Attack probes of time travel's caches against a plain fold of the journal (SPEC T1, O7, M12, R2).

Every answer served through the run checkpoint cache (ADR 0034) is compared with a plain fold of
the events up to the position, built without it; every memory view with the events that were
journaled then. Journals are real SQLite files.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import journaled
from journaled import AgentResult, NeedsInput, Plan, Step
from journaled.events.base import DomainEvent, Event
from journaled.events.plans import ExecuteResult, Observation
from journaled.events.run_checkpoints import RunCheckpoints, RunTimeline, fold_at
from journaled.events.runs import (
    AnswersGiven,
    BudgetRaised,
    BudgetStopped,
    CancelRequested,
    RunFinished,
    RunResumed,
    RunStarted,
    RunSuspended,
    StepFailed,
    StepRetrying,
    StepsSkipped,
    StepStarted,
    StepSucceeded,
    StepWaiting,
    WavePartitioned,
)
from journaled.testing import ManualClock

STEPS = ["a", "b", "c", "d"]


def _obs(step_id: str, ok: bool, code: str | None = None) -> Observation:
    return Observation(step_id=step_id, ok=ok, output=None if not ok else step_id, code=code)  # type: ignore[arg-type]


def _event(kind: int, step: str, n: int) -> DomainEvent:
    """One run event of a random kind about a step (the fold takes any order)."""
    at = 1_000 + n
    match kind:
        case 0:
            return StepStarted(at=at, step_id=step, attempt=n, wave=n % 3)
        case 1:
            return StepSucceeded(
                at=at, step_id=step, attempt=n, observation=_obs(step, True), charged=1
            )
        case 2:
            return StepFailed(
                at=at, step_id=step, attempt=n, observation=_obs(step, False), charged=1
            )
        case 3:
            return StepRetrying(at=at, step_id=step, attempt=n, observation=_obs(step, False))
        case 4:
            return StepWaiting(
                at=at, step_id=step, attempt=n, question=f"q{n}", observation=_obs(step, False)
            )
        case 5:
            return StepsSkipped(at=at, observations=(_obs(step, False, "cancelled"),))
        case 6:
            return StepsSkipped(at=at, unobserved=(step,))
        case 7:
            return RunResumed(at=at, resumption=n, rerun=(step,))
        case 8:
            return BudgetStopped(at=at, wave=n, estimate=1, used=n, budget=n)
        case 9:
            return RunFinished(at=at, status="completed", ok=True, calls_used=n)
        case 10:
            return AnswersGiven(at=at, answers={step: f"ans{n}"})
        case 11:
            return WavePartitioned(
                at=at, wave=n, runnable=(step,), skipped=(_obs(step, False, "cancelled"),)
            )
        case 12:
            return RunSuspended(at=at, in_flight=(step,))
        case 13:
            return CancelRequested(at=at)
        case _:
            return BudgetRaised(at=at, previous=None, budget=n)


_EVENTS = st.lists(
    st.tuples(st.integers(0, 14), st.sampled_from(STEPS), st.integers(1, 3)), max_size=40
)


def _stream(spec: list[tuple[int, str, int]]) -> list[Event]:
    """A run's stream; ``gap`` leaves positions to other streams between its events."""
    plan = Plan(goal="g", steps=[Step(s, tool="t", input=s) for s in STEPS])
    events = [
        Event(position=5, stream="r", version=1, data=RunStarted(at=1_000, run_id="r", plan=plan))
    ]
    for n, (kind, step, gap) in enumerate(spec, start=1):
        events.append(
            Event(
                position=events[-1].position + gap,
                stream="r",
                version=n + 1,
                data=_event(kind, step, n),
            )
        )
    return events


def _plain(events: list[Event], position: int) -> ExecuteResult | None:
    return fold_at([e for e in events if e.position <= position], [position])[0]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=_EVENTS, every=st.integers(1, 5), seed=st.integers(0, 2**16), cut=st.integers(0, 40))
def test_every_position_of_a_random_stream_through_the_cache_is_a_plain_fold(
    spec: list[tuple[int, str, int]], every: int, seed: int, cut: int
) -> None:
    """T1: at every position (a run's, between its events, before and after it), in random
    order, cold, warm and while the run grows, the cache serves exactly a plain fold."""
    events = _stream(spec)
    end = events[-1].position
    positions = list(range(end + 3))
    random.Random(seed).shuffle(positions)
    visible = min(len(events), 1 + cut)  # the run's events appended so far

    def read(run_id: str, version: int, upto: int | None) -> list[Event]:
        assert run_id == "r"
        return [
            e
            for e in events[:visible]
            if e.version > version and (upto is None or e.position <= upto)
        ]

    cache = RunCheckpoints(every=every, budget=10_000)
    for k, position in enumerate(positions):
        if k % 7 == 3 and visible < len(events):
            visible += 1 + k % 3  # the run goes on between two reads
            visible = min(visible, len(events))
        shown = events[:visible]
        if position < events[0].position:
            assert cache.result_at("r", position, read) is None
            continue
        upto = min(position, shown[-1].position)
        assert cache.result_at("r", upto, read) == _plain(shown, upto), f"position {upto}"
    timeline = RunTimeline(every)
    timeline.extend(events)
    got = timeline.results_at(sorted(positions))
    assert got == [_plain(events, p) for p in sorted(positions)]


# -- times that are not monotonic (two processes, two clocks) ------------------------------------


def _asker(step: Step, ctx: journaled.AgentContext) -> AgentResult:
    if ctx.answer is None:
        raise NeedsInput(f"which way for {step.id}?")
    return AgentResult(output=f"{step.id}: {ctx.answer}", calls_used=1)


def _open(url: str, now: int) -> journaled.Runtime:
    rt = journaled.open(url, clock=ManualClock(start=now))
    rt.register_tool("fetch", lambda x: x)
    rt.register_agent("asker", _asker)
    return rt


def test_at_time_never_shows_an_event_recorded_after_that_time(sqlite_url: str) -> None:
    """O7: a run begun at 1,000 (waiting), answered by a process whose clock says 5,000, then
    finished by one whose clock says 2,000. As it was at 3,000 it was still waiting for its first
    answer: the state then never holds the event recorded at 5,000."""
    plan = Plan(
        goal="two clocks",
        steps=[
            Step("a", tool="fetch", input=1),
            Step("p", agent="asker", depends_on=["a"]),
            Step("q", agent="asker", depends_on=["p"]),
        ],
    )
    with _open(sqlite_url, 1_000) as rt:
        run_id = rt.execute(plan).run_id
        first_end = rt.journal.position()
    with _open(sqlite_url, 5_000) as rt:
        assert rt.runs.resume(run_id, answers={"p": "left"}).waiting == ["q"]
    with _open(sqlite_url, 2_000) as rt:
        assert rt.runs.resume(run_id, answers={"q": "right"}).ok
        history = rt.runs.history(run_id)
        assert sorted({e.data.at for e in history}) == [1_000, 2_000, 5_000]
        then = rt.runs.at_time(run_id, 3_000)
        assert all(
            e.data.at <= 3_000 for e in history if e.position <= rt.runs.position_at(run_id, 3_000)
        )
        assert then == rt.runs.at(run_id, first_end)
        assert then.waiting == ["p"]


def test_as_of_a_time_is_not_cut_short_by_another_organizations_clock(sqlite_url: str) -> None:
    """M12/R1: organization a remembers at 1,000 and 1,100; between them a process of
    organization b, whose clock runs ahead (9,000), remembers and runs a plan. As of 2,000, a's
    memory holds both of its facts: b's events neither show nor cut a's view short."""
    with journaled.open(sqlite_url, organization="a", clock=ManualClock(start=1_000)) as ra:
        first = ra.memory.remember("the first plan of a", scope="organization")
    with journaled.open(sqlite_url, organization="b", clock=ManualClock(start=9_000)) as rb:
        rb.register_tool("fetch", lambda x: x)
        rb.memory.remember("a plan of b", scope="organization")
        rb.execute(Plan(goal="b's own", steps=[Step("x", tool="fetch", input=1)]))
    with journaled.open(sqlite_url, organization="a", clock=ManualClock(start=1_100)) as ra:
        second = ra.memory.remember("the second plan of a", scope="organization")
        view = ra.memory.as_of(at=2_000)
        assert {f.id for f in view.all()} == {first.id, second.id}
        assert view.get(second.id) is not None
        assert {f.id for f in view.search("plan")} == {first.id, second.id}
        assert view.all() == ra.memory.as_of(position=ra.journal.position()).all()
