"""Attacks on run erasure and redaction: each test is one defect found, and stays as its guard.

Fake secrets are assembled at run time so that no literal here looks like a live credential.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import journaled
from journaled import AgentResult, Gap, Gaps, NeedsInput, Plan, Step
from journaled.events.journal import Journal
from journaled.events.redact import _RULES, REDACTED, redact
from journaled.testing import ManualClock, wait_for

GITHUB = "ghp_" + "R4nd0mT0k3n" * 4
MARK = "wombat-5519"
"""Content that is no secret (redaction keeps it) but must leave storage when purged."""


def _bytes_on_disk(url: str) -> bytes:
    directory = Path(url.removeprefix("sqlite:///")).parent
    return b"".join(p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file())


def test_purge_racing_a_resume_in_another_runtime_leaves_no_child_content(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2: a resume that starts between purge's checks and its append makes the purge refuse.

    The purge used to check that the run was finished, then read the stream's last version
    again to append ``run.purged``: a resume by another runtime in between (which started a
    child run) was absorbed, the purge succeeded on an executing run, and the child run it
    had not seen kept its content on disk.
    """
    release = threading.Event()

    def asker(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        if ctx.answer is None:
            raise NeedsInput("which one?")
        child = ctx.execute(
            Plan(goal=f"{MARK}-child-goal", steps=[Step("x", tool="echo", input=f"{MARK}-in")])
        )
        release.wait(10)
        return AgentResult(output=str(child.ok), calls_used=0)

    with (
        journaled.open(sqlite_url, clock=clock) as rt,
        journaled.open(sqlite_url, clock=clock) as other,
    ):
        for runtime in (rt, other):
            runtime.register_tool("echo", lambda data: f"{data}-out")
            runtime.register_agent("asker", asker)
        first = rt.execute(Plan(goal="ask", steps=[Step("c", agent="asker")]))
        assert first.waiting == ["c"]
        run_id = first.run_id
        before = set(rt.runs.ids())

        resumed: list[Any] = []

        def resume() -> None:
            try:
                resumed.append(other.resume(run_id, answers={"c": "this one"}))
            except Exception as exc:  # the loser of the race gets an error; either is fine
                resumed.append(exc)

        worker = threading.Thread(target=resume)
        original = Journal.content_keys
        fired = threading.Event()

        def content_keys(self: Journal, stream: str) -> tuple[list[str], list[int], int]:
            if not fired.is_set():
                fired.set()
                # The purge has checked the run is finished; now the other runtime resumes it
                # and its agent step starts (and finishes) a child run.
                worker.start()
                wait_for(lambda: len(rt.runs.ids()) > len(before), timeout=10)
                [child] = set(rt.runs.ids()) - before
                wait_for(lambda: rt.runs.state(child).is_finished, timeout=10)
            return original(self, stream)

        monkeypatch.setattr(Journal, "content_keys", content_keys)
        try:
            with pytest.raises(journaled.RunNotPurgeable, match="changed while"):
                rt.runs.purge(run_id, reason="erase it")
        finally:
            release.set()
            if fired.is_set():
                worker.join(10)
        monkeypatch.undo()
        # The resume was not disturbed; once it is done the whole family is purged.
        assert isinstance(resumed[0], journaled.ExecuteResult), resumed
        assert resumed[0].ok
        assert rt.runs.purge(run_id, reason="erase it") > 0
    assert MARK.encode() not in _bytes_on_disk(sqlite_url)


def test_a_secret_used_as_a_dict_key_never_reaches_disk(
    sqlite_url: str, clock: ManualClock
) -> None:
    """M9: a secret that is a key of step input or output (a token-to-user map) is redacted."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("owners", lambda data: {f"{GITHUB}out": "alice", "n": 1})
        result = rt.execute(
            Plan(goal="g", steps=[Step("a", tool="owners", input={f"{GITHUB}in": {"x": 1}})])
        )
        assert result.ok
        assert result.observations[0].output == {REDACTED: "alice", "n": 1}
    assert GITHUB.encode() not in _bytes_on_disk(sqlite_url)


def test_a_secret_in_a_planners_gap_name_never_reaches_disk(
    sqlite_url: str, clock: ManualClock
) -> None:
    """M9, R2: the capability names of a planner's gaps are redacted and purged like its reasons."""

    def planner(goal: str, observations: object, clarifications: object) -> Gaps:
        return Gaps([Gap(kind="tool", name=f"{MARK} deploy with {GITHUB}", reason="none")])

    with journaled.open(sqlite_url, clock=clock) as rt:
        outcome = rt.orchestrate("ship it", planner)
        assert outcome.status == "failed"
        assert GITHUB.encode() not in _bytes_on_disk(sqlite_url)
        rt.runs.purge(outcome.run_id, reason="erase")
    assert MARK.encode() not in _bytes_on_disk(sqlite_url)


def _nested(depth: int) -> list[Any]:
    root: list[Any] = []
    current = root
    for _ in range(depth):
        inner: list[Any] = [f"password={GITHUB}"]
        current.append(inner)
        current = inner
    return root


def test_deeply_nested_step_data_is_redacted_without_blowing_up(
    sqlite_url: str, clock: ManualClock
) -> None:
    """M9: step input and output nested as deep as the journal encodes are redacted, no crash."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("deep", lambda data: _nested(600))
        result = rt.execute(Plan(goal="g", steps=[Step("a", tool="deep", input=_nested(600))]))
        assert result.ok
        assert not rt.runs.active()
    assert GITHUB.encode() not in _bytes_on_disk(sqlite_url)


def test_command_password_scan_stops_at_the_next_command() -> None:
    """M9: a command's password option is searched only up to the next command on the line.

    Each ``mysql``/``sshpass``/``docker login``/``redis-cli`` used to rescan up to 200
    characters, past the commands that follow it, so a line repeating ``mysql `` took over a
    second per megabyte. The match now starts at the command nearest the option, which bounds
    the scan; what is redacted is unchanged.
    """
    [rule] = [r for r in _RULES if r.kind == "command-password"]
    text = "mysql mysql -ph4rdPa55 && sshpass sshpass -p h4rdPa55 x"
    assert [m.start() for m in rule.pattern.finditer(text)] == [6, 34]
    assert redact(text) == f"mysql mysql -p{REDACTED} && sshpass sshpass -p {REDACTED} x"


def test_a_runtime_that_did_not_see_a_purge_cannot_snapshot_the_text_back(
    sqlite_url: str, clock: ManualClock
) -> None:
    """R2: a memory snapshot by a runtime that loaded a fact before another purged it omits it.

    A runtime opened with ``follow=None`` still held the fact; its ``checkpoint()`` (or its close,
    past 500 events) wrote its stale projection, text included, back into storage.
    """
    stale = journaled.open(sqlite_url, clock=clock, follow=None)
    try:
        fact = stale.memory.remember(f"{MARK} lives at the old mill")
        stale.memory.remember("a fact that stays")
        with journaled.open(sqlite_url, clock=clock) as rt:
            rt.memory.purge(fact.id, reason="asked to forget")
        assert MARK.encode() not in _bytes_on_disk(sqlite_url)
        stale.memory.checkpoint()
        assert MARK.encode() not in _bytes_on_disk(sqlite_url)
    finally:
        stale.close()
    assert MARK.encode() not in _bytes_on_disk(sqlite_url)
    with journaled.open(sqlite_url, clock=clock) as rt:
        assert rt.memory.get(fact.id) is None
        assert [f.text for f in rt.memory.all()] == ["a fact that stays"]


def test_a_child_run_is_purged_through_its_root(sqlite_url: str, clock: ManualClock) -> None:
    """R2: purging an orchestration's pass alone is refused: its plan is also the parent's.

    The pass run's goal and step inputs are a copy of the orchestration's ``plan-proposed``
    (and an agent step's child run feeds its parent's observation), so erasing the child alone
    returned success while its inputs stayed in storage. The error names the run to purge.
    """

    def planner(goal: str, observations: object, clarifications: object) -> Plan:
        return Plan(goal=goal, steps=[Step("x", tool="echo", input=f"{MARK}-in")])

    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("echo", lambda data: "done")
        outcome = rt.orchestrate("tidy up", planner)
        assert outcome.status == "completed"
        assert outcome.pass_run is not None
        with pytest.raises(journaled.RunNotPurgeable, match=outcome.run_id):
            rt.runs.purge(outcome.pass_run, reason="erase")
        assert MARK.encode() in _bytes_on_disk(sqlite_url)
        assert rt.runs.purge(outcome.run_id, reason="erase") > 0
    assert MARK.encode() not in _bytes_on_disk(sqlite_url)
