"""Exactly one executor per run; a dead owner's run can be taken over (J3, E14)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import journaled
from journaled import Plan, Step
from journaled.actors.executor import Executor
from journaled.actors.ownership import LEASE_MS, owner_alive, this_process
from journaled.testing import wait_for


def test_this_process_is_alive_and_a_dead_one_is_not() -> None:
    """J3: an owner on this host is alive exactly while its process runs."""
    me = this_process()
    assert owner_alive(me, last_seen=0, now=10**15)
    child = subprocess.run(
        [sys.executable, "-c", "from actors.ownership import this_process; print(this_process())"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    gone = child.stdout.strip()
    assert gone.split("/")[1] != str(os.getpid())
    assert not owner_alive(gone, last_seen=10**15, now=10**15)


def test_a_remote_owner_lives_for_the_lease() -> None:
    """J3: an owner on another host is presumed alive until its lease runs out."""
    remote = "some-other-host/123/456"
    assert owner_alive(remote, last_seen=1_000, now=1_000 + LEASE_MS - 1)
    assert not owner_alive(remote, last_seen=1_000, now=1_000 + LEASE_MS)


def test_a_live_owner_keeps_its_run(tmp_path: Path) -> None:
    """J3: resuming a run another live executor is running is refused, clearly; nothing appended."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    inside = threading.Event()
    release = threading.Event()
    with journaled.open(url) as one, journaled.open(url) as two:

        def hold(_: object) -> bool:
            inside.set()
            return release.wait(10)

        one.register_tool("hold", hold)
        results: list[journaled.ExecuteResult] = []
        plan = Plan(
            goal="g", steps=[Step("a", tool="hold"), Step("b", tool="hold", depends_on=["a"])]
        )
        thread = threading.Thread(target=lambda: results.append(one.execute(plan)))
        thread.start()
        try:
            assert inside.wait(10)
            [run_id] = one.runs.active()
            before = two.journal.position()
            with pytest.raises(
                journaled.RunOwnedElsewhere,
                match=r"being executed (by another process|in this process right now)",
            ):
                two.resume(run_id)
            assert two.journal.position() == before
        finally:
            release.set()
            thread.join(10)
        assert results[0].ok


def test_heartbeats_show_a_quiet_owner_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """J3: an executor busy in a long step appends heartbeats, so its lease never lapses."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    release = threading.Event()
    with journaled.open(url) as rt:
        rt.register_tool("slow", lambda x: release.wait(10))
        monkeypatch.setattr(Executor, "heartbeat_seconds", 0.05)
        try:
            results: list[journaled.ExecuteResult] = []
            thread = threading.Thread(
                target=lambda: results.append(
                    rt.execute(Plan(goal="g", steps=[Step("s", tool="slow")]))
                )
            )
            thread.start()
            wait_for(lambda: bool(rt.runs.active()), 5)
            run_id = rt.runs.active()[0]
            wait_for(
                lambda: sum(e.kind == "run.heartbeat" for e in rt.runs.history(run_id)) >= 2, 5
            )
        finally:
            release.set()
            thread.join(10)
        assert results[0].ok


def _race(url: str, run_id: str, record: object) -> list[object]:
    """Resume one run from two runtimes at the same moment; return both outcomes."""
    outcomes: list[object] = []
    barrier = threading.Barrier(2, timeout=10)

    def resume(rt: journaled.Runtime) -> None:
        barrier.wait()
        try:
            outcomes.append(rt.resume(run_id, call_budget=1))
        except journaled.RunNotResumable as exc:
            outcomes.append(exc)

    with journaled.open(url) as one, journaled.open(url) as two:
        for rt in (one, two):
            rt.register_skill("think", lambda x: "idea")
            rt.register_tool("record", record)  # type: ignore[arg-type]
        threads = [threading.Thread(target=resume, args=(rt,)) for rt in (one, two)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
    return outcomes


def _stopped_run(url: str, plan: Plan) -> str:
    with journaled.open(url) as rt:
        rt.register_skill("think", lambda x: "idea")
        rt.register_tool("record", lambda x: x)
        stopped = rt.execute(plan, call_budget=0)
    assert stopped.stopped_for_budget
    return stopped.run_id


def test_two_resumers_race_and_exactly_one_executes(tmp_path: Path) -> None:
    """J3/E14: two runtimes resuming one run at once: one runs every step once, one is refused."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    ran: list[str] = []
    lock = threading.Lock()

    def record(step_id: str) -> str:
        with lock:
            ran.append(step_id)
        return step_id

    plan = Plan(
        goal="g",
        steps=[
            Step("think", skill="think"),
            Step("a", tool="record", input="a", depends_on=["think"]),
            Step("b", tool="record", input="b", depends_on=["a"]),
        ],
    )
    for _ in range(5):  # several races, since either side may win each time
        ran.clear()
        outcomes = _race(url, _stopped_run(url, plan), record)
        wins = [o for o in outcomes if isinstance(o, journaled.ExecuteResult)]
        losses = [o for o in outcomes if isinstance(o, journaled.RunNotResumable)]
        assert len(wins) == 1, outcomes
        assert wins[0].ok
        assert len(losses) == 1
        assert any(
            words in str(losses[0])
            for words in ("another process", "in this process right now", "already finished")
        )
        assert sorted(ran) == ["a", "b"]


def test_take_over_forces_and_the_old_owner_stops(tmp_path: Path) -> None:
    """J3: take_over=True resumes anyway; the old owner's next append fails and it stops."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    inside = threading.Event()
    release = threading.Event()

    def hold(_: object) -> bool:
        inside.set()
        return release.wait(10)

    with journaled.open(url) as one, journaled.open(url) as two:
        for rt in (one, two):
            rt.register_tool("hold", hold)
        plan = Plan(
            goal="g", steps=[Step("a", tool="hold"), Step("b", tool="hold", depends_on=["a"])]
        )
        errors: list[BaseException] = []

        def first() -> None:
            try:
                one.execute(plan)
            except journaled.RunOwnedElsewhere as exc:
                errors.append(exc)

        thread = threading.Thread(target=first)
        thread.start()
        assert inside.wait(10)
        [run_id] = one.runs.active()
        outcome: list[object] = []
        taker = threading.Thread(target=lambda: outcome.append(two.resume(run_id, take_over=True)))
        taker.start()
        wait_for(lambda: any(e.kind == "run.resumed" for e in two.runs.history(run_id)), 10)
        release.set()
        taker.join(10)
        thread.join(10)
        [taken] = outcome
        assert isinstance(taken, journaled.ExecuteResult)
        assert taken.ok
        assert len(errors) == 1
        resumed = [e.data for e in two.runs.history(run_id) if e.kind == "run.resumed"]
        assert resumed[0].took_over_from == this_process()  # type: ignore[attr-defined]
