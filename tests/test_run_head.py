"""Resume and a run's latest state read its first event's head only, never its plan (E14).

A run's first event holds its whole plan: on a 5,000-step run, decoding it took about 15 ms,
and a resume decoded it three times (does the run exist, is it an orchestration, is it a run)
before reading the snapshot that holds the same plan.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import journaled
from journaled.events.journal import Journal


def _stopped_run(url: str, steps: int) -> str:
    """Journal a chain of ``steps`` tool steps and a skill step, stopped for budget."""
    plan = [
        journaled.Step(f"c{i}", tool="noop", depends_on=(f"c{i - 1}",) if i else ())
        for i in range(steps)
    ]
    plan.append(journaled.Step("final", skill="think", depends_on=(plan[-1].id,)))
    with journaled.open(url) as rt:
        rt.register_tool("noop", lambda x: None)
        rt.register_skill("think", lambda x: "ok")
        result = rt.execute(journaled.Plan(goal="stops", steps=plan), call_budget=0)
        assert result.stopped_for_budget
        return result.run_id


def test_a_resume_from_the_snapshot_never_reads_the_first_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    run_id = _stopped_run(url, 300)
    firsts: list[str] = []
    real = Journal.first

    def counted(self: Journal, stream: str) -> object:
        firsts.append(stream)
        return real(self, stream)

    monkeypatch.setattr(Journal, "first", counted)
    with journaled.open(url) as rt:
        rt.register_tool("noop", lambda x: None)
        rt.register_skill("think", lambda x: "ok")
        assert rt.runs.state(run_id).version > 0
        result = rt.resume(run_id, call_budget=1)
        assert isinstance(result, journaled.ExecuteResult)
        assert result.ok
        assert [s.status for s in result.plan.steps][-1] == "succeeded"
    assert run_id not in firsts, firsts


def test_state_of_a_stream_that_is_not_a_run_says_so(tmp_path: Path) -> None:
    """The head's tag names what the stream holds, as the decoded first event did."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url) as rt:
        fact = rt.memory.remember("not a run")
        with pytest.raises(journaled.RunNotFound, match=r"no run .* name facts, not runs"):
            rt.runs.state(fact.id)
        with pytest.raises(journaled.RunNotFound, match="no run"):
            rt.runs.state("run_missing")
        with pytest.raises(journaled.RunNotFound):
            rt.resume(fact.id)
