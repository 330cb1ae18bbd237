"""The retry policy at its edges: huge attempt counts, nonsense policies, crashes, closing (S2)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import msgspec
import pykka
import pytest
from crash import kill_when_in_flight

import journaled
from journaled import Plan, Retry, Step
from journaled.actors.executor import Executor
from journaled.events.base import Event
from journaled.events.catalog import codec
from journaled.events.compressed import deflate
from journaled.events.plans import Observation
from journaled.events.run_audit import describe_run_event
from journaled.events.run_state import RunFold, decode_snapshot
from journaled.events.runs import (
    CallsOverrun,
    RunStarted,
    RunSuspended,
    StepFailed,
    StepRetrying,
    StepStarted,
    StepSucceeded,
)
from journaled.testing import wait_for

WAIT = 30.0


class Flaky:
    """A step function that fails its first ``failures`` calls, then answers ``done``."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, value: Any) -> str:
        with self.lock:
            self.calls += 1
            calls = self.calls
        if calls <= self.failures:
            raise RuntimeError(f"flaky failure {calls}")
        return "done"


def _events(rt: journaled.Runtime, run_id: str) -> list[Any]:
    return [e.data for e in rt.runs.history(run_id)]


def _executor() -> Any:
    """Return the one live executor actor (to wait on its scheduling, never to drive it)."""
    refs = pykka.ActorRegistry.get_by_class(Executor)
    assert len(refs) == 1, refs
    executor = refs[0]._actor_weakref()
    assert executor is not None
    return executor


# -- the wait: grows to its cap, never overflows ---------------------------------------------


def test_the_wait_reaches_its_cap_and_stays_there_without_overflow() -> None:
    """S2: Retry.delay grows by the multiplier up to Retry.cap and stays there, for any count of
    failures: no power is computed past the cap, so a thousand failures raise no OverflowError."""
    policy = Retry(attempts=1000, backoff=0.5, multiplier=10.0, max_backoff=30.0)
    assert policy.cap == 30.0
    assert [policy.delay(n) for n in (1, 2, 3)] == [0.5, 5.0, 30.0]
    assert policy.delay(999) == 30.0
    assert policy.delay(10**9) == 30.0
    assert Retry(backoff=0.0, multiplier=10.0).delay(999) == 0.0
    assert Retry(backoff=1.0, multiplier=1.0).delay(10**9) == 1.0


def test_max_backoff_defaults_to_sixty_seconds_or_the_backoff_when_larger() -> None:
    """S2: max_backoff None means a cap of 60 s, or the backoff itself when it is larger."""
    assert Retry().max_backoff is None
    assert Retry().cap == 60.0
    assert Retry(backoff=0.5, multiplier=1000.0).delay(3) == 60.0
    assert Retry(backoff=120.0).cap == 120.0
    assert Retry(backoff=120.0).delay(1) == 120.0
    assert Retry(backoff=120.0).delay(5) == 120.0


def test_hundreds_of_failed_attempts_with_a_steep_multiplier_end_as_a_failed_step() -> None:
    """S2, E11: a step failing 400 times under Retry(attempts=400, multiplier=10) ends failed in
    attempt 400 of 400; the executor never raises computing a wait (10.0 ** 399 overflows)."""
    always = Flaky(failures=10_000)
    with journaled.open("memory://") as rt:
        rt.register_tool("t", always, retry=Retry(attempts=400, backoff=0.0, multiplier=10.0))
        result = rt.execute(Plan(goal="g", steps=[Step("a", tool="t")]))
        events = _events(rt, result.run_id)
    assert not result.ok
    assert always.calls == 400
    (failed,) = [e for e in events if isinstance(e, StepFailed)]
    assert (failed.attempt, failed.attempts) == (400, 400)
    assert {e.delay for e in events if isinstance(e, StepRetrying)} == {0.0}


# -- nonsense policies are refused -------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (
            Retry(multiplier=0.5),
            "retry of tool 't' multiplier must be at least 1 (below 1 each wait would be shorter "
            "than the one before), got 0.5",
        ),
        (
            Retry(backoff=5.0, max_backoff=1.0),
            "retry of tool 't' max_backoff must be at least backoff (5.0s), got 1.0",
        ),
        (Retry(max_backoff=-1.0), "retry of tool 't' max_backoff must be a non-negative"),
    ],
)
def test_a_policy_whose_wait_would_shrink_is_refused(policy: Retry, message: str) -> None:
    """S2: a multiplier below 1 or a max_backoff below the backoff is refused, naming the field
    and the registration; nothing is registered."""
    with journaled.open("memory://") as rt:
        with pytest.raises(ValueError, match="^" + _literal(message)):
            rt.register_tool("t", lambda value: value, retry=policy)
        with pytest.raises(journaled.PlanRejected, match="not registered"):
            rt.execute(Plan(goal="g", steps=[Step("a", tool="t")]))


def test_a_multiplier_of_one_and_an_equal_cap_are_usable() -> None:
    """S2: multiplier 1 (a constant wait) and max_backoff equal to backoff are accepted."""
    with journaled.open("memory://") as rt:
        rt.register_tool("t", Flaky(1), retry=Retry(backoff=0.0, multiplier=1.0, max_backoff=0.0))
        assert rt.execute(Plan(goal="g", steps=[Step("a", tool="t")])).ok


def _literal(text: str) -> str:
    return "".join("\\" + c if c in "().[]*+?" else c for c in text)


# -- attempts bound failed attempts, not starts --------------------------------------------------

CRASH_SCRIPT = r"""
import json, os, sys, threading
import journaled
from journaled import Plan, Retry, Step

cfg = json.loads(sys.argv[1])


def hangs(value):
    with open(cfg["marker"], "w", encoding="utf-8") as f:
        f.flush()
        os.fsync(f.fileno())
    threading.Event().wait()


rt = journaled.open(cfg["url"])
rt.register_tool("t", hangs, retry=Retry(attempts=2))
result = rt.execute(Plan(goal="g", steps=[Step("a", tool="t")]))
print(result)
"""


def test_an_attempt_cut_short_by_a_crash_does_not_use_up_the_retry_budget(
    tmp_path: Path,
) -> None:
    """S2, E14: under Retry(attempts=2), a crash during attempt 1 is not a failure: on resume
    attempt 2 fails and is still retried, and attempt 3 succeeds."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    marker = tmp_path / "a.inflight"
    config = json.dumps({"url": url, "marker": str(marker)})
    kill_when_in_flight(CRASH_SCRIPT, config, [marker], tmp_path)
    flaky = Flaky(failures=1)
    with journaled.open(url) as rt:
        (run_id,) = rt.runs.ids()
        rt.register_tool("t", flaky, retry=Retry(attempts=2))
        result = rt.resume(run_id)
        events = _events(rt, run_id)
        state = rt.runs.state(run_id)
    assert isinstance(result, journaled.ExecuteResult)
    assert result.ok, result.observations
    assert flaky.calls == 2
    assert [e.attempt for e in events if isinstance(e, StepStarted)] == [1, 2, 3]
    assert [e.attempt for e in events if isinstance(e, StepRetrying)] == [2]
    assert [e.attempt for e in events if isinstance(e, StepSucceeded)] == [3]
    assert state.retried == {"a": 1}
    assert state.attempts == {"a": 3}


def test_failed_attempts_are_folded_and_kept_by_the_run_snapshot() -> None:
    """S2, E14: run.step-retrying events count into RunFold.retried, which the run snapshot
    carries (schema 2); a snapshot of schema 1, which has no such count, is not restored, so
    the state is folded from the journal instead of being misread."""
    state = RunFold()
    observation = Observation(step_id="a", tool="t", ok=False, error="boom")
    started = RunStarted(at=1, run_id="r", plan=Plan(goal="g", steps=[Step("a", tool="t")]))
    state.fold(started)
    for attempt in (1, 2):
        state.fold(StepStarted(at=2, step_id="a", attempt=attempt, wave=1))
        state.fold(StepRetrying(at=3, step_id="a", attempt=attempt, observation=observation))
    assert state.retried == {"a": 2}
    restored = RunFold.restore(state.snapshot())
    assert restored is not None
    assert restored.retried == {"a": 2}
    older = msgspec.structs.replace(decode_snapshot(state.snapshot()), schema=1)
    assert RunFold.restore(deflate(msgspec.msgpack.encode(older))) is None


# -- a closing runtime does not turn a failure into the step's result ------------------------


def _close_mid_step(
    url: str, retry: Retry | None
) -> tuple[journaled.ExecuteResult, list[Any], Flaky]:
    """Run one tool step that fails once the runtime is draining; return the suspended or
    ended result, the run's events and the tool."""
    inside = threading.Event()
    release = threading.Event()
    flaky = Flaky(failures=1)

    def fails_when_released(value: Any) -> str:
        inside.set()
        assert release.wait(WAIT)
        return flaky(value)

    rt = journaled.open(url)
    try:
        rt.register_tool("t", fails_when_released, retry=retry)
        handle = rt.start(Plan(goal="g", steps=[Step("a", tool="t")]))
        assert inside.wait(WAIT)
        executor = _executor()
        closing = threading.Thread(target=rt.close, kwargs={"drain": WAIT})
        closing.start()
        wait_for(lambda: executor._draining, WAIT)  # the drain is under way: now it fails
        release.set()
        result = handle.result(timeout=WAIT)
        closing.join(WAIT)
        assert not closing.is_alive()
    finally:
        release.set()
        rt.close()
    with journaled.open(url) as again:
        events = _events(again, result.run_id)
    return result, events, flaky


def test_an_attempt_failing_while_the_runtime_closes_is_left_for_resume(tmp_path: Path) -> None:
    """S2, R3: a step with a retry policy whose attempt fails while the runtime drains is not
    failed: the attempt is journaled run.step-retrying, the run is suspended with the step in
    flight, and a resume in a new runtime runs it again to success."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    result, events, _ = _close_mid_step(url, Retry(attempts=3, backoff=600.0))
    assert result.suspended
    assert not [e for e in events if isinstance(e, StepFailed)]
    assert [e.attempt for e in events if isinstance(e, StepRetrying)] == [1]
    (suspended,) = [e for e in events if isinstance(e, RunSuspended)]
    assert suspended.in_flight == ("a",)
    with journaled.open(url) as rt:
        rt.register_tool("t", Flaky(failures=0), retry=Retry(attempts=3, backoff=600.0))
        resumed = rt.resume(result.run_id)
        events = _events(rt, result.run_id)
    assert isinstance(resumed, journaled.ExecuteResult)
    assert resumed.ok
    assert [e.attempt for e in events if isinstance(e, StepStarted)] == [1, 2]


def test_without_a_policy_a_failure_during_the_drain_is_the_steps_result(tmp_path: Path) -> None:
    """R3, R4: with no retry policy the drain lets the step finish, and its own failure is its
    result, journaled as soon as it comes; nothing is left to resume."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    result, events, _ = _close_mid_step(url, None)
    assert not result.ok
    assert not result.suspended
    (failed,) = [e for e in events if isinstance(e, StepFailed)]
    assert (failed.attempt, failed.attempts, failed.observation.error) == (1, 0, "flaky failure 1")


# -- every attempt's overrun and timeout is told -----------------------------------------------


def test_a_retried_agent_attempt_that_overran_its_reservation_is_journaled(
    sqlite_url: str,
) -> None:
    """S2, R6: an agent attempt that reports more calls than reserved and is retried is charged
    what it reported and journaled run.calls-overrun, as the final attempt would be."""
    calls: list[int] = []

    def agent(step: Step, ctx: Any) -> journaled.AgentResult:
        calls.append(1)
        if len(calls) == 1:
            return journaled.AgentResult(ok=False, error="half done", calls_used=3)
        return journaled.AgentResult(ok=True, output="done", calls_used=0)

    with journaled.open(sqlite_url) as rt:
        rt.register_agent("ag", agent, retry=Retry(attempts=2))
        result = rt.execute(Plan(goal="g", steps=[Step("a", agent="ag")]))
        events = _events(rt, result.run_id)
        why = rt.runs.why(result.run_id)
    assert result.ok
    assert result.calls_used == 3
    overruns = [e for e in events if isinstance(e, CallsOverrun)]
    assert [(e.attempt, e.reserved, e.reported) for e in overruns] == [(1, 0, 3)]
    assert "step 'a' overran its reservation: it reported 3 model call(s)" in why


def test_why_tells_every_timed_out_attempt_and_the_attempt_that_failed(sqlite_url: str) -> None:
    """S2, O6: each attempt past its deadline is in the why, the last as "failed in attempt 2 of
    2"; the run's state names the failure."""
    release = threading.Event()

    def hangs(value: Any) -> str:
        release.wait(WAIT)
        return "late"

    try:
        with journaled.open(sqlite_url) as rt:
            rt.register_tool("t", hangs, retry=Retry(attempts=2))
            result = rt.execute(Plan(goal="g", steps=[Step("a", tool="t")]), step_timeout=0.2)
            why = rt.runs.why(result.run_id)
    finally:
        release.set()
    wait_for(lambda: not pykka.ActorRegistry.get_all(), WAIT)
    assert not result.ok
    assert "step 'a' attempt 1 failed: timed out after 0.2s; retrying in 0s" in why
    assert "step 'a' failed in attempt 2 of 2: timed out after 0.2s" in why


# -- run.step-failed says how many attempts the policy allowed --------------------------------


def test_step_failed_carries_the_policys_attempts_and_why_words_it(sqlite_url: str) -> None:
    """S2, O6: run.step-failed records the attempts its policy allowed (0 without one); why says
    "failed in attempt N of M", and a step without a policy "failed" as before."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("retried", Flaky(99), retry=Retry(attempts=2))
        rt.register_tool("once", Flaky(99))
        plan = Plan(goal="g", steps=[Step("a", tool="retried"), Step("b", tool="once")])
        result = rt.execute(plan)
        events = _events(rt, result.run_id)
        why = rt.runs.why(result.run_id)
    failed = {e.step_id: (e.attempt, e.attempts) for e in events if isinstance(e, StepFailed)}
    assert failed == {"a": (2, 2), "b": (1, 0)}
    assert "step 'a' failed in attempt 2 of 2: flaky failure 2" in why
    assert "step 'b' failed: flaky failure 1" in why


def test_an_attempt_number_past_the_policy_is_worded_as_such() -> None:
    """S2, O6: a final attempt numbered past the policy's attempts (earlier ones were cut short
    by a crash) is told without claiming "3 of 2"."""
    obs = Observation(step_id="a", tool="t", ok=False, error="boom")
    data = StepFailed(at=1, step_id="a", attempt=3, observation=obs, attempts=2)
    text = describe_run_event(Event(position=9, stream="r", version=5, data=data))
    assert text == (
        "step 'a' failed in attempt 3 (its retry policy allows 2 failed attempt(s); attempts cut "
        "short by a crash or a closing runtime do not count): boom"
    )


def test_a_step_failed_without_attempts_reads_as_before() -> None:
    """J6, S2: run.step-failed with attempts 0 is stored exactly as before the field existed
    (trailing default left out), and decodes to 0; a set count round-trips."""
    obs = Observation(step_id="a", tool="t", ok=False, error="boom")
    events = codec()
    plain = StepFailed(at=1, step_id="a", attempt=1, observation=obs, charged=1)
    counted = msgspec.structs.replace(plain, attempts=3)
    topic = events.topic(plain)
    assert events.decode(topic, events.encode(plain)).attempts == 0  # type: ignore[attr-defined]
    assert events.decode(topic, events.encode(counted)) == counted
    assert len(events.encode(counted)) > len(events.encode(plain))


# -- a queued retry is among the steps in flight when the run suspends ------------------------


def test_a_retry_queued_for_its_cap_is_in_flight_when_the_run_suspends(tmp_path: Path) -> None:
    """S2, E3, R3: a retried attempt waiting for room under its tool's cap when the runtime
    closes is named among the steps in flight by run.suspended and why, and runs on resume."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    b_inside = threading.Event()
    release = threading.Event()
    failed_once: set[str] = set()

    def capped(value: dict[str, Any]) -> str:
        if value["name"] == "a" and "a" not in failed_once:
            failed_once.add("a")
            raise RuntimeError("first attempt fails")
        if value["name"] == "b":
            b_inside.set()
            assert release.wait(WAIT)
        return str(value["name"])

    plan = Plan(
        goal="g",
        steps=[
            Step("a", tool="t", input={"name": "a"}),
            Step("b", tool="t", input={"name": "b"}),
        ],
    )
    rt = journaled.open(url)
    try:
        rt.register_tool("t", capped, retry=Retry(attempts=2, backoff=0.0))
        handle = rt.start(plan, limits=journaled.Limits(per_tool={"t": 1}))
        assert b_inside.wait(WAIT)
        executor = _executor()
        # a failed, its wait is over and it is queued behind b, which holds the only slot.
        wait_for(lambda: [s.id for s in executor._batch_queue] == ["a"], WAIT)
        closing = threading.Thread(target=rt.close, kwargs={"drain": WAIT})
        closing.start()
        wait_for(lambda: executor._draining, WAIT)
        release.set()
        result = handle.result(timeout=WAIT)
        closing.join(WAIT)
        assert not closing.is_alive()
    finally:
        release.set()
        rt.close()
    assert result.suspended
    with journaled.open(url) as rt:
        events = _events(rt, result.run_id)
        (suspended,) = [e for e in events if isinstance(e, RunSuspended)]
        assert suspended.in_flight == ("a",)
        assert "step(s) a run again" in rt.runs.why(result.run_id)
        rt.register_tool("t", capped, retry=Retry(attempts=2, backoff=0.0))
        resumed = rt.resume(result.run_id)
    assert isinstance(resumed, journaled.ExecuteResult)
    assert resumed.ok, resumed.observations
