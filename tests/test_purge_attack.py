"""Attacks on run erasure and redaction: each test is one defect found, and stays as its guard.

Fake secrets are assembled at run time so that no literal here looks like a live credential.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import journaled
from journaled import AgentResult, NeedsInput, Plan, Step
from journaled.events.journal import Journal
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
        before = set(rt.runs.list())

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
                wait_for(lambda: len(rt.runs.list()) > len(before), timeout=10)
                [child] = set(rt.runs.list()) - before
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
