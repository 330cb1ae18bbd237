"""The per-step retry policy on the local placement: attempts, backoff, journaled (S2, E*)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pykka
import pytest

import journaled
from journaled import Plan, Retry, Step
from journaled.events.runs import StepFailed, StepRetrying, StepStarted, StepSucceeded
from journaled.testing import wait_for


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


def _types(rt: journaled.Runtime, run_id: str) -> list[Any]:
    return [e.data for e in rt.runs.history(run_id)]


def test_a_failed_attempt_is_retried_and_each_attempt_is_journaled(sqlite_url: str) -> None:
    """S2: a step failing twice under Retry(attempts=3) succeeds on its third attempt; each
    failed attempt is journaled run.step-retrying, and only the last result is observed."""
    flaky = Flaky(failures=2)
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("flaky", flaky, retry=Retry(attempts=3, backoff=0.01))
        result = rt.execute(Plan(goal="g", steps=[Step("a", tool="flaky")]))
        events = _types(rt, result.run_id)
    assert result.ok
    assert flaky.calls == 3
    assert [o.output for o in result.observations] == ["done"]
    retrying = [e for e in events if isinstance(e, StepRetrying)]
    assert [(e.attempt, e.observation.error) for e in retrying] == [
        (1, "flaky failure 1"),
        (2, "flaky failure 2"),
    ]
    assert [e.delay for e in retrying] == [0.01, 0.02]
    assert [e.attempt for e in events if isinstance(e, StepStarted)] == [1, 2, 3]
    assert [e.attempt for e in events if isinstance(e, StepSucceeded)] == [3]


def test_why_tells_each_retried_attempt(sqlite_url: str) -> None:
    """S2, O6: the run's why names each failed attempt, its error and the wait before the next."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("flaky", Flaky(failures=1), retry=Retry(attempts=2, backoff=0.0))
        result = rt.execute(Plan(goal="g", steps=[Step("a", tool="flaky")]))
        why = rt.runs.why(result.run_id)
    assert result.ok
    assert (
        "step 'a' attempt 1 failed: flaky failure 1; retrying in 0s (at most 2 attempt(s))" in why
    )
    assert "step 'a' started (attempt 2)" in why


def test_retries_stop_at_the_policy_attempts_and_skills_are_charged_each_attempt(
    sqlite_url: str,
) -> None:
    """S2, E8: a skill that always fails under Retry(attempts=2) fails at attempt 2; both
    attempts made a model call and are charged."""
    always = Flaky(failures=99)
    with journaled.open(sqlite_url) as rt:
        rt.register_skill("s", always, retry=Retry(attempts=2))
        result = rt.execute(Plan(goal="g", steps=[Step("a", skill="s")]))
        events = _types(rt, result.run_id)
        summary = rt.runs.list()[0]
    assert not result.ok
    assert always.calls == 2
    assert result.calls_used == 2
    assert summary.calls_used == 2
    assert [e.attempt for e in events if isinstance(e, StepRetrying)] == [1]
    failed = [e for e in events if isinstance(e, StepFailed)]
    assert [(e.attempt, e.observation.error) for e in failed] == [(2, "flaky failure 2")]


def test_a_timed_out_attempt_is_retried(sqlite_url: str) -> None:
    """S2, E*: an attempt past the step timeout is retried like any failed attempt."""
    release = threading.Event()
    calls: list[int] = []

    def slow_once(value: Any) -> str:
        calls.append(1)
        if len(calls) == 1:
            release.wait(30)  # the first attempt hangs past its deadline
        return "in time"

    try:
        with journaled.open(sqlite_url) as rt:
            rt.register_tool("slow", slow_once, retry=Retry(attempts=2))
            result = rt.execute(Plan(goal="g", steps=[Step("a", tool="slow")]), step_timeout=0.3)
            events = _types(rt, result.run_id)
    finally:
        release.set()
    # The abandoned first attempt's worker ends once its user code returns.
    wait_for(lambda: not pykka.ActorRegistry.get_all(), 10)
    assert result.ok
    assert [o.output for o in result.observations] == ["in time"]
    retrying = [e for e in events if isinstance(e, StepRetrying)]
    assert [e.observation.error for e in retrying] == ["timed out after 0.3s"]


def test_cancel_during_a_backoff_does_not_wait_for_it(sqlite_url: str) -> None:
    """S2, E5: cancelling a run whose step waits out a long backoff ends the run at once; the
    step is not tried again."""
    flaky = Flaky(failures=99)
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("flaky", flaky, retry=Retry(attempts=5, backoff=600))
        handle = rt.start(Plan(goal="g", steps=[Step("a", tool="flaky")]))
        wait_for(lambda: any(isinstance(e, StepRetrying) for e in _types(rt, handle.run_id)), 10)
        began = time.monotonic()
        rt.cancel(handle.run_id)
        result = handle.result(timeout=30)
        waited = time.monotonic() - began
    assert not result.ok
    assert flaky.calls == 1
    assert result.plan.steps[0].status == "skipped"
    assert waited < 60  # far below the 600 s backoff: the cancel did not wait for it


def test_a_step_in_backoff_runs_again_on_resume(tmp_path: Any) -> None:
    """S2, R3, E14: closing the runtime while a step waits out its backoff suspends the run
    with that step in flight; a resume in a new runtime runs it again and the run completes."""
    url = f"sqlite:///{tmp_path / 'j.sqlite'}"
    with journaled.open(url) as rt:
        rt.register_tool("flaky", Flaky(failures=99), retry=Retry(attempts=5, backoff=600))
        handle = rt.start(Plan(goal="g", steps=[Step("a", tool="flaky")]))
        wait_for(lambda: any(isinstance(e, StepRetrying) for e in _types(rt, handle.run_id)), 10)
        rt.close(drain=5)
        suspended = handle.result(timeout=30)
    assert suspended.suspended
    with journaled.open(url) as rt:
        rt.register_tool("flaky", Flaky(failures=0), retry=Retry(attempts=5, backoff=600))
        resumed = rt.resume(suspended.run_id)
        assert isinstance(resumed, journaled.ExecuteResult)
        events = _types(rt, suspended.run_id)
    assert resumed.ok
    assert [e.attempt for e in events if isinstance(e, StepStarted)] == [1, 2]
    assert [e.attempt for e in events if isinstance(e, StepSucceeded)] == [2]


def test_a_waiting_agent_is_not_retried(sqlite_url: str) -> None:
    """S2, E10: an agent asking for input waits; its retry policy does not run it again."""
    calls: list[int] = []

    def asks(step: Step, ctx: Any) -> journaled.AgentResult:
        calls.append(1)
        raise journaled.NeedsInput("which one?")

    with journaled.open(sqlite_url) as rt:
        rt.register_agent("asks", asks, retry=Retry(attempts=3))
        result = rt.execute(Plan(goal="g", steps=[Step("a", agent="asks")]))
    assert result.waiting == ["a"]
    assert calls == [1]


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"retry": Retry(attempts=0)}, "retry of tool 't' attempts must be between 1 and 1000"),
        ({"retry": Retry(backoff=-1)}, "retry of tool 't' backoff must be a non-negative"),
        ({"retry": 3}, "retry of tool 't' must be a journaled.Retry, got int"),
        ({"resources": {"cpus": 1}}, "resources of tool 't' has an unknown key 'cpus'"),
        ({"resources": {"num_cpus": -1}}, "resources of tool 't' num_cpus must be a non-negative"),
        ({"resources": [1]}, "resources of tool 't' must be a dict"),
    ],
)
def test_a_bad_retry_or_resources_is_refused_and_nothing_registered(
    keywords: dict[str, Any], message: str
) -> None:
    """S1, S2: a bad retry policy or resources raise one line naming the field; the tool is not
    registered."""
    with journaled.open("memory://") as rt:
        with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")) as info:
            rt.register_tool("t", lambda value: value, **keywords)
        assert "\n" not in str(info.value)
        with pytest.raises(journaled.PlanRejected, match="not registered"):
            rt.execute(Plan(goal="g", steps=[Step("a", tool="t")]))


def test_a_retried_attempt_waits_for_room_under_its_cap(sqlite_url: str) -> None:
    """S2, E3: a retried attempt starts only when its tool's cap has room again."""
    running = 0
    most = 0
    failed_once: set[str] = set()
    lock = threading.Lock()

    def capped(value: dict[str, Any]) -> str:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            if value["name"] == "flaky" and "flaky" not in failed_once:
                failed_once.add("flaky")
                raise RuntimeError("first attempt fails")
            time.sleep(value["sleep"])
            return str(value["name"])
        finally:
            with lock:
                running -= 1

    plan = Plan(
        goal="g",
        steps=[
            Step("a", tool="t", input={"name": "flaky", "sleep": 0.0}),
            Step("b", tool="t", input={"name": "slow", "sleep": 0.5}),
        ],
    )
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("t", capped, retry=Retry(attempts=2, backoff=0.01))
        result = rt.execute(plan, limits=journaled.Limits(per_tool={"t": 1}))
    assert result.ok, result.observations
    assert most == 1
