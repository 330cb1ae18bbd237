"""Edge cases around cancellation, reservations, closing, secrets and following (E5-E9, M9, J3)."""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import pykka
import pytest

import journaled
from journaled import AgentResult, Plan, Step
from journaled.events.journal import Journal
from journaled.testing import wait_for

WAIT = 10.0


def test_child_run_of_a_cancelled_parent_is_cancelled_and_journaled(rt: journaled.Runtime) -> None:
    """E5/E9: a child started after its parent was cancelled ends cancelled, with its events."""
    inside = threading.Event()
    children: list[journaled.ExecuteResult] = []

    def parent(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        inside.set()
        wait_for(ctx.cancelled, WAIT)
        children.append(ctx.execute(Plan(goal="sub", steps=[Step("x", tool="echo")])))
        return AgentResult(ok=False, code="cancelled", error="stopped", calls_used=0)

    rt.register_tool("echo", lambda x: x)
    rt.register_agent("parent", parent)
    results: list[journaled.ExecuteResult] = []
    thread = threading.Thread(
        target=lambda: results.append(rt.execute(Plan(goal="g", steps=[Step("p", agent="parent")])))
    )
    thread.start()
    assert inside.wait(WAIT)
    rt.cancel(rt.runs.active()[0])
    thread.join(WAIT)
    [child] = children
    assert not child.ok
    assert rt.runs.state(child.run_id).run_status == "cancelled"
    assert results[0].observations[0].agent_task_id == child.run_id


def test_reservations_use_the_declining_remainder(rt: journaled.Runtime) -> None:
    """E6/E8: the reservation handed to an agent is the one the budget gate approved."""
    seen: list[int | None] = []

    def agent(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        seen.append(ctx.reservation)
        return AgentResult()  # reports nothing: charged its reservation

    rt.register_agent("a", agent)
    plan = Plan(goal="g", steps=[Step("x", agent="a"), Step("y", agent="a")])
    result = rt.execute(plan, call_budget=3, reserve=lambda s, remaining: min(2, remaining))
    assert sorted(s or 0 for s in seen) == [1, 2]
    assert result.calls_used == 3
    assert result.ok


@pytest.mark.parametrize(
    ("reserve", "words"),
    [
        (lambda s, remaining: math.nan, "reserve failed for agent 'a': it answered nan"),
        (lambda s, remaining: 1 / 0, "reserve failed for agent 'a': ZeroDivisionError"),
    ],
)
def test_a_bad_reserve_fails_its_step_only(rt: journaled.Runtime, reserve: Any, words: str) -> None:
    """E11: a reserve function that fails or answers NaN fails its agent step, not the run."""
    rt.register_agent("a", lambda step, ctx: AgentResult())
    rt.register_tool("t", lambda x: "ok")
    plan = Plan(goal="g", steps=[Step("x", agent="a"), Step("y", tool="t")])
    result = rt.execute(plan, reserve=reserve)
    obs = {o.step_id: o for o in result.observations}
    assert obs["x"].code == "agent-failed"
    assert words in (obs["x"].error or "")
    assert obs["y"].ok


def test_close_drains_and_suspends_running_runs(tmp_path: Path) -> None:
    """R3/E14: close() lets the step in flight finish, starts nothing more, and suspends."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    inside = threading.Event()
    release = threading.Event()

    def hold(_: object) -> str:
        inside.set()
        release.wait(WAIT)
        return "done"

    rt = journaled.open(url)
    rt.register_tool("hold", hold)
    plan = Plan(goal="g", steps=[Step("a", tool="hold"), Step("b", tool="hold", depends_on=["a"])])
    errors: list[BaseException] = []

    def run() -> None:
        try:
            rt.execute(plan)
        except Exception as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert inside.wait(WAIT)
    run_id = rt.runs.active()[0]
    threading.Timer(0.2, release.set).start()
    rt.close()
    thread.join(WAIT)
    assert errors == []
    assert not [r for r in pykka.ActorRegistry.get_all() if r.actor_class.__name__ == "Executor"]
    with journaled.open(url) as again:
        state = again.runs.state(run_id)
        assert state.suspended is not None
        assert state.status == {"a": "succeeded", "b": "pending"}


def test_secrets_in_source_are_redacted_and_in_keys_refused(rt: journaled.Runtime) -> None:
    """M9: a source's credentials are redacted; a conflict key or domain holding one is refused."""
    token = "ghp_" + "A1b2C3d4E5f6" * 3
    fact = rt.memory.remember("deploy notes", source="https://bob:hunter2pass@git.example/x")
    assert fact.source is not None
    assert "hunter2pass" not in fact.source
    before = rt.journal.position()
    with pytest.raises(journaled.InvalidFact, match="conflict_key"):
        rt.memory.remember("token holder", conflict_key=token)
    with pytest.raises(journaled.InvalidFact, match="domain"):
        rt.memory.remember("token holder", domain=token)
    assert rt.journal.position() == before
    assert all("hunter2pass" not in repr(e) and token not in repr(e) for e in rt.journal.read())


def test_follower_survives_a_failing_poll(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """J3: a transient database error in the follower is logged and following goes on."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    real = Journal.position
    failures = {"left": 3}

    def flaky(self: Journal) -> int:
        if failures["left"] and threading.current_thread().name == "journaled-follower":
            failures["left"] -= 1
            raise RuntimeError("database is locked")
        return real(self)

    with journaled.open(url, follow=None) as writer, journaled.open(url, follow=0.05) as reader:
        monkeypatch.setattr(Journal, "position", flaky)
        fact = writer.memory.remember("the follower keeps going")
        wait_for(lambda: reader.memory.get(fact.id) == fact, WAIT)
        assert failures["left"] == 0


def test_a_timed_out_agent_is_told_to_stop(rt: journaled.Runtime) -> None:
    """E5/E11: when an agent step times out, its ctx.cancelled() turns true so it can stop."""
    saw = threading.Event()

    def slow(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        if wait_for_cancel(ctx):
            saw.set()
        return AgentResult()

    def wait_for_cancel(ctx: journaled.AgentContext) -> bool:
        try:
            wait_for(ctx.cancelled, WAIT)
        except TimeoutError:
            return False
        return True

    rt.register_agent("slow", slow)
    result = rt.execute(Plan(goal="g", steps=[Step("s", agent="slow")]), step_timeout=0.2)
    assert result.observations[0].code == "agent-timeout"
    assert saw.wait(WAIT)
    wait_for(
        lambda: (
            not [r for r in pykka.ActorRegistry.get_all() if r.actor_class.__name__ == "StepWorker"]
        ),
        WAIT,
    )


@pytest.mark.parametrize(
    "args", [["runs", "list"], ["journal", "verify"], ["memory", "remember", "x"]]
)
def test_a_url_naming_a_directory_says_so(tmp_path: Path, args: list[str]) -> None:
    """J4, J5: a URL naming a folder (the file's name left out) is called a directory, with the
    fix, not a damaged journal to restore from a backup; nothing is made inside it."""
    from click.testing import CliRunner

    from journaled.cli import main

    folder = tmp_path / "journals"
    folder.mkdir()
    url = f"sqlite:///{folder}"
    with pytest.raises(journaled.JournalUnreadable, match="it is a directory") as info:
        journaled.open(url)
    assert "backup" not in str(info.value)
    result = CliRunner().invoke(main, ["--url", url, *args])
    assert result.exit_code not in (0, None), result.output
    assert "it is a directory; point the URL at a journal file" in result.output
    assert "backup" not in result.output
    assert list(folder.iterdir()) == []
