"""R8 for orchestrations: of two resumes of one orchestration, one drives, the other is refused.

SPEC R8 and ADR 0011: a resume of a run another live process executes gets
``RunOwnedElsewhere`` (a ``RunNotResumable``) and appends nothing, and of two resumers that read
one version the one whose append conflicts gets it too. Plain runs did; an orchestration checked
what the caller asked (approve, answers, a clarification) before its owner, and said "not
waiting for approval (it is running)", and turned the conflict into a bare ``RunNotResumable``.

A child process (this checkout's code) takes the orchestration up and holds its step ``a``
until the test lets it go; the test resumes it meanwhile, or races it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import journaled
from journaled import Plan, Step
from journaled.events.base import Pending
from journaled.events.orchestration import OrchestrationResumed

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_SECONDS = 60.0

SCRIPT = r"""
import json, os, sys, time
from pathlib import Path
import journaled
from journaled import Plan, Step

cfg = json.loads(sys.argv[1])
W = Path(cfg["dir"])


def wait_for(name):
    deadline = time.monotonic() + 120
    while not (W / name).exists():
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting for " + name)
        time.sleep(0.01)


def planner(goal, observations, clarifications):
    return Plan(
        goal=goal,
        steps=[
            Step("a", tool="slow", input={"n": "a"}),
            Step("b", tool="quick", input={}, depends_on=["a"]),
        ],
    )


def slow(data):
    with open(W / "effects", "a", encoding="utf-8") as f:
        f.write("a\n")
    (W / "in-a").touch()
    wait_for("release-a")
    return "x"


if cfg["go"]:
    wait_for("go")
with journaled.open(cfg["url"], agents=False) as rt:
    rt.register_tool("slow", slow)
    rt.register_tool("quick", lambda data: "q")
    try:
        outcome = rt.resume(cfg["run_id"], approve=True, planner=planner)
        said = "OK " + outcome.status
    except journaled.RunOwnedElsewhere as exc:
        said = "OWNED " + str(exc)
    except Exception as exc:
        said = "ERR " + type(exc).__name__ + " " + str(exc)
tmp = W / (cfg["name"] + ".tmp")
tmp.write_text(said, encoding="utf-8")
tmp.replace(W / (cfg["name"] + ".result"))
"""


def planner(goal: str, observations: Sequence[Any], clarifications: Sequence[Any]) -> Plan:
    """Plan the slow step ``a``, then ``b`` after it (the plan the child plans too)."""
    return Plan(
        goal=goal,
        steps=[
            Step("a", tool="slow", input={"n": "a"}),
            Step("b", tool="quick", input={}, depends_on=["a"]),
        ],
    )


def _waiting_for_approval(url: str) -> str:
    """Orchestrate a goal that stops waiting for approval; return its id."""
    with journaled.open(url, agents=False) as rt:
        rt.register_tool("slow", lambda data: "x")
        rt.register_tool("quick", lambda data: "q")
        outcome = rt.orchestrate("approve me", planner, require_approval=True)
    assert outcome.status == "waiting_for_approval", outcome
    return outcome.run_id


def _open(url: str, slow: Callable[[Any], str] = lambda data: "x") -> journaled.Runtime:
    rt = journaled.open(url, agents=False)
    rt.register_tool("slow", slow)
    rt.register_tool("quick", lambda data: "q")
    return rt


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start children that approve an orchestration (``rt.resume(approve=True)``); reap them."""
    started: list[subprocess.Popen[bytes]] = []

    def start(
        url: str, run_id: str, *, name: str = "child", go: bool = False
    ) -> subprocess.Popen[bytes]:
        config = json.dumps(
            {"url": url, "dir": str(tmp_path), "run_id": run_id, "name": name, "go": go}
        )
        with (tmp_path / f"{name}.err").open("wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-c", SCRIPT, config],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        (tmp_path / "release-a").touch()
        for proc in started:
            try:
                proc.wait(timeout=DEADLINE_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=DEADLINE_SECONDS)


def _wait_for(path: Path, *procs: subprocess.Popen[bytes]) -> None:
    """Poll for a file a child writes; fail if every child exited first or it takes too long."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not path.exists():
        if procs and all(p.poll() is not None for p in procs):
            errors = [f.read_text() for f in sorted(path.parent.glob("*.err"))]
            pytest.fail(f"the child exited before {path.name} appeared:\n" + "\n".join(errors))
        if time.monotonic() > deadline:
            pytest.fail(f"{path.name} did not appear within {DEADLINE_SECONDS}s")
        time.sleep(0.01)  # polling interval, not synchronisation: the file decides


def _recorder(ran: list[str]) -> Callable[[Any], str]:
    """Return a ``slow`` tool that notes each call in ``ran`` and returns at once."""

    def slow(data: Any) -> str:
        ran.append("a")
        return "x"

    return slow


def _resumptions(rt: journaled.Runtime, run_id: str) -> int:
    return sum(isinstance(e.data, OrchestrationResumed) for e in rt.runs.history(run_id))


REQUESTS: dict[str, dict[str, Any]] = {
    "approve": {"approve": True},
    "answers": {"answers": {"a": "yes"}},
    "clarification": {"clarification": "yes"},
}


@pytest.mark.parametrize("request_kind", sorted(REQUESTS))
def test_a_resume_of_an_orchestration_another_process_drives_is_owned_elsewhere(
    durable_url: str,
    tmp_path: Path,
    children: Callable[..., subprocess.Popen[bytes]],
    request_kind: str,
) -> None:
    """R8: the owner is checked before what the caller asks; a live one refuses, nothing appended.

    The child approved the orchestration and is inside step ``a``: it is no longer waiting for
    approval, an answer or a clarification, but the refusal names its owner, not that.
    """
    oid = _waiting_for_approval(durable_url)
    child = children(durable_url, oid)
    _wait_for(tmp_path / "in-a", child)
    with _open(durable_url) as rt:
        position = rt.journal.position()
        with pytest.raises(journaled.RunOwnedElsewhere, match="another process"):
            rt.resume(oid, planner=planner, **REQUESTS[request_kind])
        assert rt.journal.position() == position
    (tmp_path / "release-a").touch()
    _wait_for(tmp_path / "child.result", child)
    assert (tmp_path / "child.result").read_text() == "OK completed"


def test_the_loser_of_a_resume_race_gets_owned_elsewhere(
    durable_url: str,
    tmp_path: Path,
    children: Callable[..., subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """R8, ADR 0011: two resumers read one version; the other process appends first.

    This one's append conflicts: RunOwnedElsewhere, its step never runs, one resumption.
    """
    oid = _waiting_for_approval(durable_url)
    (tmp_path / "release-a").touch()  # the winner runs through
    ran: list[str] = []
    with _open(durable_url, slow=_recorder(ran)) as rt:
        journal = rt._orchestrations._journal
        real = journal.append
        raced: list[int] = []

        def append(pending: list[Pending], *args: Any, **kwargs: Any) -> list[int]:
            if not raced:  # the resume read the orchestration; another process takes it now
                child = children(durable_url, oid)
                assert child.wait(timeout=DEADLINE_SECONDS) == 0, (
                    tmp_path / "child.err"
                ).read_text()
                raced.append(child.returncode)
            return real(pending, *args, **kwargs)

        monkeypatch.setattr(journal, "append", append)
        with pytest.raises(journaled.RunOwnedElsewhere, match="orchestrated by another process"):
            rt.resume(oid, approve=True, planner=planner)
        monkeypatch.undo()
        assert raced
        assert (tmp_path / "child.result").read_text() == "OK completed"
        assert ran == []
        assert _resumptions(rt, oid) == 1
        assert (tmp_path / "effects").read_text().split() == ["a"]


def test_two_processes_approve_one_orchestration_at_once(
    durable_url: str, tmp_path: Path, children: Callable[..., subprocess.Popen[bytes]]
) -> None:
    """R8: two processes approve one orchestration together; one drives, the other is refused.

    The one that drives holds step ``a`` until the other has answered, so the other meets it
    either at the owner check or at the conflicting append: RunOwnedElsewhere both ways.
    """
    oid = _waiting_for_approval(durable_url)
    procs = [children(durable_url, oid, name=f"c{i}", go=True) for i in range(2)]
    (tmp_path / "go").touch()
    results = [tmp_path / f"c{i}.result" for i in range(2)]
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not any(r.exists() for r in results):  # the loser answers while the winner is in `a`
        assert time.monotonic() < deadline, [p.poll() for p in procs]
        assert not all(p.poll() is not None for p in procs), [r.exists() for r in results]
        time.sleep(0.01)
    (tmp_path / "release-a").touch()
    for proc in procs:
        assert proc.wait(timeout=DEADLINE_SECONDS) == 0
    said = [r.read_text() for r in results]
    assert sorted(s.split()[0] for s in said) == ["OK", "OWNED"], said
    assert "OK completed" in said
    assert (tmp_path / "effects").read_text().split() == ["a"]
    with _open(durable_url) as rt:
        assert _resumptions(rt, oid) == 1


def test_a_purge_that_wins_the_race_is_not_an_owner(
    durable_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R8: a conflict is RunOwnedElsewhere only when another process resumed the orchestration.

    A purge appended between this resume's read and its append: nobody drives it, so the
    refusal is a plain RunNotResumable naming what was appended (R2).
    """
    oid = _waiting_for_approval(durable_url)
    with _open(durable_url) as rt:
        journal = rt._orchestrations._journal
        real = journal.append
        purged: list[int] = []

        def append(pending: list[Pending], *args: Any, **kwargs: Any) -> list[int]:
            if not purged:
                purged.append(1)
                rt.runs.purge(oid, "erasure request")
            return real(pending, *args, **kwargs)

        monkeypatch.setattr(journal, "append", append)
        with pytest.raises(journaled.RunNotResumable, match=r"appended run\.purged") as caught:
            rt.resume(oid, approve=True, planner=planner)
        monkeypatch.undo()
        assert not isinstance(caught.value, journaled.RunOwnedElsewhere)
        assert _resumptions(rt, oid) == 0


def test_an_orchestration_whose_driver_died_is_not_owned_elsewhere(
    durable_url: str, tmp_path: Path, children: Callable[..., subprocess.Popen[bytes]]
) -> None:
    """R8, E14: a dead owner drives nothing; a resume asking the wrong thing says why.

    The child approved it and was SIGKILLed inside ``a``: approving again is RunNotResumable
    (it is not waiting for approval), never RunOwnedElsewhere; a plain resume carries it on.
    """
    oid = _waiting_for_approval(durable_url)
    child = children(durable_url, oid)
    _wait_for(tmp_path / "in-a", child)
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=DEADLINE_SECONDS) == -signal.SIGKILL
    ran: list[str] = []
    with _open(durable_url, slow=_recorder(ran)) as rt:
        with pytest.raises(journaled.RunNotResumable, match="not waiting for approval") as caught:
            rt.resume(oid, approve=True, planner=planner)
        assert not isinstance(caught.value, journaled.RunOwnedElsewhere)
        outcome = rt.resume(oid, planner=planner)
        assert isinstance(outcome, journaled.Outcome)
        assert outcome.status == "completed", outcome
    assert ran == ["a"]
