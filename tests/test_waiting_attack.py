"""Runs that pause and resume, attacked as a demanding operator would: waits for a human answer
(E10), budget stops (E7, E8, R6) and resumes as a projection in a new process (E14, R8).

Answers of odd shapes, answers racing from two threads and two processes, SIGKILL while a run
waits and while an answered step is in flight, budgets of 0, exactly the cost, raised and
lowered, and what ``runs.state``, ``runs.list``, ``runs.why``, the summaries projection (T2) and
``journaled runs list`` say about each state. Every refusal is checked to leave the journal's
storage exactly as it was.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pykka
import pytest

import journaled
from journaled import AgentResult, Clarify, NeedsInput, Observation, Plan, Step
from journaled.actors.ownership import owner_stopped
from journaled.events.run_state import RunFold
from journaled.events.runs import StepWaiting
from journaled.testing import wait_for

WAIT = 20.0
ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "journaled.cli"]


# -- helpers -------------------------------------------------------------------------------------


def ask(step: Step, ctx: journaled.AgentContext) -> AgentResult:
    """Wait for an answer (E10), then use it."""
    if ctx.answer is None:
        raise NeedsInput(f"which colour for {step.id}?")
    return AgentResult(output=f"{step.id}={ctx.answer}", calls_used=0)


def reserve_two(step: Step, remaining: float) -> float:
    """Reserve two calls per agent step, never more than what is left (E6)."""
    return min(2, remaining)


def reserve_fixed_two(step: Step, remaining: float) -> float:
    """Reserve two calls per agent step, whatever is left (E6)."""
    return 2


def _path(url: str) -> str:
    return url.removeprefix("sqlite:///")


def stored(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of a SQLite journal, read through a connection of its own."""
    con = sqlite3.connect(_path(url))
    try:
        tables = [n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        query = 'SELECT * FROM "{}"'  # table names read from the file itself
        return {t: sorted(con.execute(query.format(t)).fetchall(), key=repr) for t in tables}
    finally:
        con.close()


def events(rt: journaled.Runtime) -> list[tuple[int, str, int, str, bytes]]:
    """Every event of the journal as (position, stream, version, kind, encoded data)."""
    return [
        (e.position, e.stream, e.version, e.kind, msgspec.msgpack.encode(e.data))
        for e in rt.journal.read()
    ]


def kinds(rt: journaled.Runtime, run_id: str) -> list[str]:
    return [e.kind for e in rt.runs.history(run_id)]


def summary_status(state: RunFold, interrupted: bool = False) -> str:
    """The T2 status a run's folded state stands for (ADR 0037); ``interrupted``: its owner
    was judged stopped (ADR 0088)."""
    if state.purged is not None:
        return "purged"
    if state.finished is not None:
        status = state.finished.status
        return {"waiting": "waiting_for_input", "stopped_for_budget": "waiting_for_budget"}.get(
            status, status
        )
    if state.suspended is not None:
        return "suspended"
    return "interrupted" if interrupted else "running"


def why_head(state: RunFold, interrupted: bool = False) -> str:
    if state.suspended is not None:
        return "suspended"
    if state.finished is None:
        return "interrupted" if interrupted else "running (or stopped mid-step)"
    return state.finished.status.replace("_", " ")


def assert_views_agree(rt: journaled.Runtime, run_id: str) -> RunFold:
    """runs.state, runs.summary, runs.list(status=...) and runs.why say one thing (T2, O6)."""
    state = rt.runs.state(run_id)
    summary = rt.runs.summary(run_id)
    interrupted = owner_stopped(
        state.owner, state.last_at, rt.runs._clock(), rt.runs.executing_here(run_id)
    )
    expected = summary_status(state, interrupted)
    assert summary.status == expected, (summary, state.run_status)
    assert summary.waiting == tuple(state.waiting)
    assert summary.calls_used == state.calls_used
    assert summary.call_budget == state.budget
    settled = sum(1 for s in state.order if state.status[s] in ("succeeded", "failed", "skipped"))
    assert (summary.steps_done, summary.steps_total) == (settled, len(state.order))
    assert run_id in rt.runs.list(status=expected)
    others = ("running", "interrupted", "completed", "failed", "cancelled", "suspended")
    for status in (*others, "waiting_for_input", "waiting_for_budget"):
        if status != expected:
            assert run_id not in rt.runs.list(status=status)
    why = rt.runs.why(run_id)
    assert why.splitlines()[0] == f"run {run_id} — {why_head(state, interrupted)}:", why
    now = why.splitlines()[-1]
    if state.finished is not None and state.waiting and state.suspended is None:
        for step_id in state.waiting:
            assert f"step {step_id!r} waits for an answer to {state.questions[step_id]!r}" in now
    # A new fold from the journal alone (E14) equals the state read through the snapshot.
    fresh = journaled_fold(rt, run_id)
    assert fresh.result() == state.result()
    assert fresh.answers == state.answers
    assert fresh.questions == state.questions
    return state


def journaled_fold(rt: journaled.Runtime, run_id: str) -> RunFold:
    state = RunFold()
    state.apply_all(rt.runs.history(run_id))
    return state


@pytest.fixture
def rt(sqlite_url: str) -> Iterator[journaled.Runtime]:
    """A runtime with an asking agent, a tool and a one-call skill on a fresh SQLite file."""
    with journaled.open(sqlite_url) as runtime:
        runtime.register_agent("ask", ask)
        runtime.register_tool("echo", lambda x: x)
        runtime.register_skill("think", lambda x: f"thought about {x}")
        yield runtime


def _waiting_run(rt: journaled.Runtime, *extra: Step) -> journaled.ExecuteResult:
    plan = Plan(
        goal="paint the fence",
        steps=[Step("a", agent="ask"), Step("t", tool="echo", input=1), *extra],
    )
    result = rt.execute(plan)
    assert result.waiting == ["a"]
    return result


# -- odd answers -----------------------------------------------------------------------------------


BAD_ANSWERS: list[tuple[str, object, str]] = [
    ("unknown-step", {"zz": "red"}, "step 'zz' is not waiting for an answer (waiting steps: a)"),
    ("not-waiting-step", {"t": "red"}, "step 't' is not waiting"),
    ("none", {"a": None}, "the answer for step 'a' must be a string, got NoneType"),
    ("int", {"a": 7}, "the answer for step 'a' must be a string, got int"),
    ("bytes", {"a": b"red"}, "the answer for step 'a' must be a string, got bytes"),
    ("dict-value", {"a": {"colour": "red"}}, "must be a string, got dict"),
    ("huge", {"a": "r" * ((1 << 20) + 1)}, "over the 1048576-byte bound"),
    ("surrogate", {"a": "red\ud800"}, "lone surrogate"),
    ("int-key", {1: "red"}, "step 1 is not waiting"),
    ("list-of-pairs", [("a", "red")], "answers must be a dict {step_id: answer}, got list"),
    ("string", "red", "answers must be a dict {step_id: answer}, got str"),
    ("set", {"a"}, "answers must be a dict {step_id: answer}, got set"),
]


@pytest.mark.parametrize(
    ("name", "answers", "message"), BAD_ANSWERS, ids=[b[0] for b in BAD_ANSWERS]
)
def test_odd_answers_are_refused_by_name_and_leave_storage_as_it_was(
    rt: journaled.Runtime, sqlite_url: str, name: str, answers: object, message: str
) -> None:
    """E10/E14: an answer of an odd shape, or one for a step that is not waiting, is refused
    with a RunNotResumable naming the step and the problem; every row of the journal's file is
    as it was, and the run still waits for its answer, which still resumes it."""
    first = _waiting_run(rt)
    before, rows = events(rt), stored(sqlite_url)
    with pytest.raises(journaled.RunNotResumable) as refused:
        rt.resume(first.run_id, answers=answers)  # type: ignore[arg-type]
    assert message in str(refused.value)
    assert events(rt) == before
    assert stored(sqlite_url) == rows
    assert assert_views_agree(rt, first.run_id).waiting == ["a"]
    done = rt.resume(first.run_id, answers={"a": "red"})
    assert isinstance(done, journaled.ExecuteResult)
    assert done.ok
    assert {o.step_id: o.output for o in done.observations if o.ok}["a"] == "a=red"


def test_an_answer_of_exactly_the_bound_is_taken_whole(rt: journaled.Runtime) -> None:
    """E10: the largest answer a journal takes (1 MiB of UTF-8) reaches the step whole and is
    folded back the same from the journal alone (E14)."""
    answer = "é" * (1 << 19)  # two bytes each: exactly 1 MiB

    def measure(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        if ctx.answer is None:
            raise NeedsInput("how long?")
        return AgentResult(output=[len(ctx.answer), ctx.answer == answer])

    rt.register_agent("measure", measure)
    first = rt.execute(Plan(goal="g", steps=[Step("a", agent="measure")]))
    done = rt.resume(first.run_id, answers={"a": answer})
    assert isinstance(done, journaled.ExecuteResult)
    assert done.ok
    assert done.observations[-1].output == [1 << 19, True]
    assert journaled_fold(rt, first.run_id).answers == {"a": answer}


@pytest.mark.parametrize("how", ["completed", "failed", "cancelled"])
def test_answering_a_finished_run_is_refused_and_appends_nothing(
    rt: journaled.Runtime, sqlite_url: str, how: str
) -> None:
    """E14/E10: answers for a run that completed, failed or was cancelled are refused with an
    error naming its status; the journal's storage is untouched."""
    gate = threading.Event()

    def boom(_: object) -> object:
        raise RuntimeError("no paint left")

    rt.register_tool("boom", boom)
    rt.register_tool("slow", lambda x: gate.wait(WAIT) and x)
    if how == "completed":
        first = _waiting_run(rt)
        run_id = first.run_id
        rt.resume(run_id, answers={"a": "red"})
    elif how == "failed":
        run_id = rt.execute(Plan(goal="g", steps=[Step("b", tool="boom")])).run_id
    else:
        handle = rt.start(
            Plan(
                goal="g",
                steps=[Step("s", tool="slow", input=1), Step("n", tool="echo", depends_on=["s"])],
            )
        )
        wait_for(lambda: rt.runs.state(handle.run_id).status["s"] == "running", WAIT)
        assert rt.cancel(handle.run_id)
        gate.set()
        handle.result(WAIT)
        run_id = handle.run_id
    assert rt.runs.state(run_id).run_status == how
    before, rows = events(rt), stored(sqlite_url)
    for answers in ({"a": "red"}, {"b": "x"}, None):
        with pytest.raises(journaled.RunNotResumable, match=f"already finished \\({how}\\)"):
            rt.resume(run_id, answers=answers)
    with pytest.raises(journaled.RunNotResumable, match="already finished"):
        rt.resume(run_id, call_budget=100)
    assert events(rt) == before
    assert stored(sqlite_url) == rows
    assert_views_agree(rt, run_id)


def test_answers_to_an_unknown_run_name_it_and_append_nothing(
    rt: journaled.Runtime, sqlite_url: str
) -> None:
    """E14: resuming a run the journal does not hold, with answers, is RunNotFound naming it."""
    _waiting_run(rt)
    rows = stored(sqlite_url)
    with pytest.raises(journaled.RunNotFound, match="no run 'run_nope'"):
        rt.resume("run_nope", answers={"a": "red"})
    assert stored(sqlite_url) == rows


def test_answering_a_run_still_executing_is_refused_and_its_answer_waits(
    rt: journaled.Runtime,
) -> None:
    """R8/E10: while a run's wave still executes (one step already waits, a sibling is in
    flight), an answer for the waiting step is refused with RunOwnedElsewhere; once the pass
    ends waiting, the same answer resumes it."""
    gate = threading.Event()
    rt.register_tool("slow", lambda x: gate.wait(WAIT) and x)
    handle = rt.start(
        Plan(goal="g", steps=[Step("a", agent="ask"), Step("s", tool="slow", input=1)])
    )
    wait_for(lambda: rt.runs.state(handle.run_id).waiting == ["a"], WAIT)
    position = rt.journal.position()
    with pytest.raises(journaled.RunOwnedElsewhere, match="being executed in this process"):
        rt.resume(handle.run_id, answers={"a": "red"})
    assert rt.journal.position() == position
    gate.set()
    first = handle.result(WAIT)
    assert first.waiting == ["a"]
    assert not first.ok
    done = rt.resume(handle.run_id, answers={"a": "red"})
    assert isinstance(done, journaled.ExecuteResult)
    assert done.ok


# -- two steps waiting, answered one at a time -----------------------------------------------------


def test_two_waiting_steps_answered_one_at_a_time(rt: journaled.Runtime) -> None:
    """E10/E14: two steps of one wave wait; answering one re-runs both (the other, unanswered,
    asks again), the run waits for the other alone, and its dependent runs only once both are
    answered. State, summary, list filter and why agree at every stop; each answer is
    journaled once."""
    asked: list[tuple[str, str | None]] = []

    def counting(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        asked.append((step.id, ctx.answer))
        return ask(step, ctx)

    rt.register_agent("counting", counting)
    plan = Plan(
        goal="two questions",
        steps=[
            Step("a", agent="counting"),
            Step("b", agent="counting"),
            Step("after", tool="echo", input="done", depends_on=["a", "b"]),
        ],
    )
    first = rt.execute(plan)
    assert sorted(first.waiting) == ["a", "b"]  # in the order they came back
    assert assert_views_agree(rt, first.run_id).questions == {
        "a": "which colour for a?",
        "b": "which colour for b?",
    }
    second = rt.resume(first.run_id, answers={"a": "red"})
    assert isinstance(second, journaled.ExecuteResult)
    assert second.waiting == ["b"]
    assert not second.ok
    assert {s.id: s.status for s in second.plan.steps} == {
        "a": "succeeded",
        "b": "pending",
        "after": "pending",
    }
    state = assert_views_agree(rt, first.run_id)
    assert state.answers == {"a": "red"}
    with pytest.raises(journaled.RunNotResumable, match="step 'a' is not waiting"):
        rt.resume(first.run_id, answers={"a": "blue"})
    third = rt.resume(first.run_id, answers={"b": "green"})
    assert isinstance(third, journaled.ExecuteResult)
    assert third.ok
    outputs = {o.step_id: o.output for o in third.observations if o.ok}
    assert outputs == {"a": "a=red", "b": "b=green", "after": "done"}
    assert sorted(asked, key=repr) == sorted(
        [("a", None), ("b", None), ("a", "red"), ("b", None), ("b", "green")], key=repr
    )
    assert kinds(rt, first.run_id).count("run.answers-given") == 2
    assert_views_agree(rt, first.run_id)


def test_a_step_that_waits_again_gets_the_latest_answer(rt: journaled.Runtime) -> None:
    """E10: an agent that asks a second question after its first answer waits again (pending,
    not failed); the run's question is the new one, and the next answer is what it gets."""
    got: list[str | None] = []

    def twice(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        got.append(ctx.answer)
        if ctx.answer is None:
            raise NeedsInput("which colour?")
        if ctx.answer == "red":
            raise NeedsInput("which shade of red?")
        return AgentResult(output=ctx.answer, calls_used=0)

    rt.register_agent("twice", twice)
    first = rt.execute(Plan(goal="g", steps=[Step("w", agent="twice")]))
    again = rt.resume(first.run_id, answers={"w": "red"})
    assert isinstance(again, journaled.ExecuteResult)
    assert again.waiting == ["w"]
    state = assert_views_agree(rt, first.run_id)
    assert state.questions == {"w": "which shade of red?"}
    assert state.status["w"] == "pending"
    assert not state.failures
    done = rt.resume(first.run_id, answers={"w": "crimson"})
    assert isinstance(done, journaled.ExecuteResult)
    assert done.ok
    assert done.observations[-1].output == "crimson"
    assert got == [None, "red", "crimson"]
    assert_views_agree(rt, first.run_id)


def test_an_answer_given_with_a_budget_stop_is_kept_for_the_raise(rt: journaled.Runtime) -> None:
    """E10/E7/E14: an answer given by a resume whose wave then stops for budget is not lost:
    the raise that follows runs the step with it, and the answer is journaled once."""
    got: list[str | None] = []

    def costly(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        got.append(ctx.answer)
        if ctx.answer is None:
            raise NeedsInput("go ahead?")
        return AgentResult(output=ctx.answer)

    rt.register_agent("costly", costly)
    plan = Plan(goal="g", steps=[Step("c", agent="costly")])
    first = rt.execute(plan, call_budget=2, reserve=reserve_fixed_two)
    assert first.waiting == ["c"]
    assert first.calls_used == 0
    stopped = rt.resume(first.run_id, call_budget=1, answers={"c": "yes"})
    assert isinstance(stopped, journaled.ExecuteResult)
    assert stopped.stopped_for_budget
    assert stopped.waiting == []
    assert got == [None]
    state = assert_views_agree(rt, first.run_id)
    assert state.answers == {"c": "yes"}
    done = rt.resume(first.run_id, call_budget=2)
    assert isinstance(done, journaled.ExecuteResult)
    assert done.ok
    assert got == [None, "yes"]
    assert done.calls_used == 2  # its reservation, charged when it finished (ADR 0013)
    assert kinds(rt, first.run_id).count("run.answers-given") == 1


# -- races: threads and processes ------------------------------------------------------------------


def test_two_threads_answering_one_waiting_run_exactly_one_executes(
    rt: journaled.Runtime, sqlite_url: str
) -> None:
    """R8/E10: two threads resume one waiting run at once with different answers: exactly one
    executes, the other gets RunOwnedElsewhere naming the run; the journal holds one answer,
    the winner's, and the step ran once with it."""
    gate = threading.Event()
    ran: list[str] = []

    def slow(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        if ctx.answer is None:
            raise NeedsInput("colour?")
        ran.append(ctx.answer)
        gate.wait(WAIT)
        return AgentResult(output=ctx.answer, calls_used=0)

    rt.register_agent("slow", slow)
    first = rt.execute(Plan(goal="g", steps=[Step("a", agent="slow")]))
    barrier = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def answer(colour: str) -> None:
        barrier.wait(WAIT)
        try:
            outcomes[colour] = rt.resume_start(first.run_id, answers={"a": colour})
        except journaled.RunNotResumable as exc:
            outcomes[colour] = exc

    threads = [threading.Thread(target=answer, args=(c,)) for c in ("red", "blue")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    gate.set()
    handles = {c: o for c, o in outcomes.items() if isinstance(o, journaled.RunHandle)}
    refused = {c: o for c, o in outcomes.items() if isinstance(o, Exception)}
    assert (len(handles), len(refused)) == (1, 1), outcomes
    (winner, handle), (_, error) = next(iter(handles.items())), next(iter(refused.items()))
    assert isinstance(error, journaled.RunOwnedElsewhere)
    assert first.run_id in str(error)
    done = handle.result(WAIT)
    assert done.ok
    assert done.observations[-1].output == winner
    assert ran == [winner]
    given = [e.data for e in rt.runs.history(first.run_id) if e.kind == "run.answers-given"]
    assert [g.answers for g in given] == [{"a": winner}]  # type: ignore[attr-defined]
    assert kinds(rt, first.run_id).count("run.resumed") == 1
    assert rt.journal.verify().ok
    assert_views_agree(rt, first.run_id)


CHILD = r"""
import os, sys, time, pathlib
import journaled
from journaled import AgentResult, NeedsInput, Plan, Step

url, work, mode = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]

def ask(step, ctx):
    if ctx.answer is None:
        raise NeedsInput(f"which colour for {step.id}?")
    (work / f"ran-{step.id}-{os.getpid()}").write_text(ctx.answer)
    if mode == "resume-and-hang":
        (work / "in-flight").write_text(str(os.getpid()))
        time.sleep(60)
    if mode == "race":
        time.sleep(0.5)  # still executing when the other process tries
    return AgentResult(output=f"{step.id}={ctx.answer}", calls_used=1)

rt = journaled.open(url)
rt.register_agent("ask", ask)
rt.register_tool("echo", lambda x: x)
if mode == "start-and-hang":
    steps = [Step("a", agent="ask"), Step("t", tool="echo", depends_on=["a"])]
    result = rt.execute(Plan(goal="paint", steps=steps))
    (work / "run_id").write_text(result.run_id)
    time.sleep(60)
elif mode == "resume-and-hang":
    rt.resume((work / "run_id").read_text(), answers={"a": sys.argv[4]})
    print("finished")  # never: killed while the step is in flight
elif mode == "race":
    (work / f"ready-{sys.argv[4]}").touch()
    deadline = time.monotonic() + 20
    while not (work / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.002)
    try:
        result = rt.resume((work / "run_id").read_text(), answers={"a": sys.argv[4]})
        print("RESUMED", result.ok, result.observations[-1].output)
    except journaled.RunNotResumable as exc:
        print("REFUSED", type(exc).__name__, exc)
rt.close()
"""


def _child(url: str, work: Path, mode: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, url, str(work), mode, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _kill(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGKILL the child if it still runs; return what it printed (its pipes closed)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=WAIT)
    return out or "", err or ""


def _wait_for_file(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + WAIT
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"the child exited ({proc.returncode}) early: {_kill(proc)[1]}")
        if time.monotonic() > deadline:
            pytest.fail(f"{path.name} did not appear within {WAIT}s: {_kill(proc)[1]}")
        time.sleep(0.01)


def test_a_run_waiting_in_a_killed_process_is_answered_in_a_new_one(
    sqlite_url: str, tmp_path: Path
) -> None:
    """E14/E10: a process that left a run waiting is SIGKILLed; a new process rebuilds the run
    from the journal alone, sees it waiting with its question, answers it, and the run
    completes with the answer; the killed owner is nobody to wait for."""
    proc = _child(sqlite_url, tmp_path, "start-and-hang")
    try:
        _wait_for_file(tmp_path / "run_id", proc)
        run_id = (tmp_path / "run_id").read_text()
        time.sleep(0.05)  # the pass has ended by the time execute returned: nothing in flight
    finally:
        _kill(proc)
    assert proc.returncode == -signal.SIGKILL
    with journaled.open(sqlite_url) as rt:
        rt.register_agent("ask", ask)
        rt.register_tool("echo", lambda x: x)
        state = assert_views_agree(rt, run_id)
        assert state.waiting == ["a"]
        assert state.questions == {"a": "which colour for a?"}
        done = rt.resume(run_id, answers={"a": "red"})
        assert isinstance(done, journaled.ExecuteResult)
        assert done.ok
        assert [o.output for o in done.observations if o.ok] == ["a=red", None]
        assert_views_agree(rt, run_id)
        assert rt.journal.verify().ok


def test_killed_while_the_answered_step_runs_the_answer_survives(
    sqlite_url: str, tmp_path: Path
) -> None:
    """E14/R4: a process resumes a waiting run with an answer and is SIGKILLed while the
    answered step is in flight. A new process sees the run interrupted (ADR 0088) with that
    step in flight and the answer journaled; answering it again is refused (it no longer
    waits), and a plain resume re-runs the step with the journaled answer (at-least-once),
    never asking again."""
    with journaled.open(sqlite_url) as rt:
        rt.register_agent("ask", ask)
        rt.register_tool("echo", lambda x: x)
        run_id = rt.execute(
            Plan(
                goal="paint",
                steps=[Step("a", agent="ask"), Step("t", tool="echo", depends_on=["a"])],
            )
        ).run_id
    (tmp_path / "run_id").write_text(run_id)
    proc = _child(sqlite_url, tmp_path, "resume-and-hang", "red")
    try:
        _wait_for_file(tmp_path / "in-flight", proc)
    finally:
        out, _ = _kill(proc)
    assert proc.returncode == -signal.SIGKILL
    assert out == ""  # killed before the run could end
    with journaled.open(sqlite_url) as rt:
        got: list[str | None] = []

        def remember_answer(step: Step, ctx: journaled.AgentContext) -> AgentResult:
            got.append(ctx.answer)
            return ask(step, ctx)

        rt.register_agent("ask", remember_answer)
        rt.register_tool("echo", lambda x: x)
        state = assert_views_agree(rt, run_id)
        assert state.answers == {"a": "red"}
        assert state.in_flight() == ["a"]
        assert rt.runs.summary(run_id).running == ("a",)
        assert rt.runs.summary(run_id).status == "interrupted"
        before = events(rt)
        with pytest.raises(journaled.RunNotResumable, match="step 'a' is not waiting"):
            rt.resume(run_id, answers={"a": "blue"})
        assert events(rt) == before
        done = rt.resume(run_id)
        assert isinstance(done, journaled.ExecuteResult)
        assert done.ok
        assert got == ["red"]
        assert [o.output for o in done.observations if o.ok] == ["a=red", None]
        assert kinds(rt, run_id).count("run.answers-given") == 1
        assert_views_agree(rt, run_id)


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_url(request: pytest.FixtureRequest, sqlite_url: str) -> str:
    """A journal two processes share: a SQLite file or a PostgreSQL database (J3)."""
    if request.param == "sqlite":
        return sqlite_url
    url: str = request.getfixturevalue("pg_url")
    return url


def test_two_processes_answering_one_waiting_run_exactly_one_executes(
    shared_url: str, tmp_path: Path
) -> None:
    """R8/J3/E10: two processes resume one waiting run at the same instant, each with its own
    answer: exactly one executes it, the other is refused with a RunNotResumable naming the
    run; the journal holds one answer and one resume, the step ran once, the chain verifies."""
    with journaled.open(shared_url) as rt:
        rt.register_agent("ask", ask)
        rt.register_tool("echo", lambda x: x)
        run_id = rt.execute(Plan(goal="paint", steps=[Step("a", agent="ask")])).run_id
    (tmp_path / "run_id").write_text(run_id)
    procs = {c: _child(shared_url, tmp_path, "race", c) for c in ("red", "blue")}
    try:
        for colour, proc in procs.items():
            _wait_for_file(tmp_path / f"ready-{colour}", proc)
        (tmp_path / "go").touch()
        for proc in procs.values():
            proc.wait(WAIT)
    finally:
        outs = {c: _kill(p) for c, p in procs.items()}
    lines = {c: out.strip() for c, (out, _) in outs.items()}
    assert all(p.returncode == 0 for p in procs.values()), outs
    resumed = [c for c, line in lines.items() if line.startswith("RESUMED")]
    refused = [c for c, line in lines.items() if line.startswith("REFUSED")]
    assert (len(resumed), len(refused)) == (1, 1), lines
    winner, loser = resumed[0], refused[0]
    assert lines[winner] == f"RESUMED True a={winner}"
    assert run_id in lines[loser]
    ran = sorted(p.name for p in tmp_path.glob("ran-a-*"))
    assert len(ran) == 1
    assert (tmp_path / ran[0]).read_text() == winner
    with journaled.open(shared_url) as rt:
        history = rt.runs.history(run_id)
        given = [e.data for e in history if e.kind == "run.answers-given"]
        assert [g.answers for g in given] == [{"a": winner}]  # type: ignore[attr-defined]
        assert [e.kind for e in history].count("run.resumed") == 1
        assert rt.journal.verify().ok
        assert_views_agree(rt, run_id)


# -- budgets ---------------------------------------------------------------------------------------


def test_budget_zero_runs_free_waves_and_stops_before_a_model_call(
    rt: journaled.Runtime, sqlite_url: str
) -> None:
    """E7/E8/O6: with call_budget=0 a tool-only wave runs and the first wave that costs stops
    before it: its steps stay pending, the stop names wave, estimate, used and budget, the
    summary says waiting_for_budget; resuming with 0 again stops again without a budget
    event, and a budget of exactly the cost completes."""
    plan = Plan(
        goal="g",
        steps=[Step("t", tool="echo", input=1), Step("k", skill="think", depends_on=["t"])],
    )
    first = rt.execute(plan, call_budget=0)
    assert first.stopped_for_budget
    assert not first.ok
    assert first.calls_used == 0
    assert {s.id: s.status for s in first.plan.steps} == {"t": "succeeded", "k": "pending"}
    state = assert_views_agree(rt, first.run_id)
    stop = state.budget_stop
    assert stop is not None
    assert (stop.wave, stop.estimate, stop.used, stop.budget, stop.pending) == (2, 1, 0, 0, ("k",))
    assert rt.runs.why(first.run_id).splitlines()[-1] == (
        "now: paused for budget before wave 2: it needs 1 model call(s), 0 of 0 used — resume "
        "with a call_budget of at least 1"
    )
    again = rt.resume(first.run_id, call_budget=0)
    assert isinstance(again, journaled.ExecuteResult)
    assert again.stopped_for_budget
    assert "run.budget-raised" not in kinds(rt, first.run_id)
    assert_views_agree(rt, first.run_id)
    done = rt.resume(first.run_id, call_budget=1)
    assert isinstance(done, journaled.ExecuteResult)
    assert done.ok
    assert done.calls_used == 1
    raised = [e.data for e in rt.runs.history(first.run_id) if e.kind == "run.budget-raised"]
    assert [(r.previous, r.budget) for r in raised] == [(0, 1)]  # type: ignore[attr-defined]
    assert_views_agree(rt, first.run_id)


def test_a_budget_of_exactly_the_cost_runs_every_wave(rt: journaled.Runtime) -> None:
    """E7/E6: a wave whose cost brings the calls used to exactly the budget runs (the gate
    stops only what would exceed it), agent reservations included."""
    rt.register_agent("paid", lambda step, ctx: AgentResult(output=ctx.reservation))
    plan = Plan(
        goal="g",
        steps=[
            Step("k1", skill="think"),
            Step("p", agent="paid", depends_on=["k1"]),
            Step("k2", skill="think", depends_on=["p"]),
        ],
    )
    done = rt.execute(plan, call_budget=4, reserve=reserve_two)
    assert done.ok
    assert done.calls_used == 4
    assert not done.stopped_for_budget
    assert {o.step_id: o.output for o in done.observations}["p"] == 2
    short = rt.execute(plan, call_budget=3, reserve=reserve_two)
    assert not short.ok
    assert {s.id: s.status for s in short.plan.steps} == {
        "k1": "succeeded",
        "p": "succeeded",  # reserved min(2, 2) = 2, charged 2: used 3 of 3
        "k2": "pending",
    }
    assert short.stopped_for_budget
    assert short.calls_used == 3


def test_waits_are_charged_what_they_report_and_answers_their_reservation(
    rt: journaled.Runtime,
) -> None:
    """E8/R6/ADR 0013: a NeedsInput wait is charged nothing; an agent-waiting result that
    reports calls is charged them (an overrun of its reservation journaled and shown by why);
    the answered re-run is charged its reservation. Charges sum to calls_used in the state,
    the summary and every step event."""

    def reports(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        if ctx.answer is None:
            return AgentResult(ok=False, code="agent-waiting", error="how many?", calls_used=3)
        return AgentResult(output=ctx.answer)

    rt.register_agent("reports", reports)
    plan = Plan(goal="g", steps=[Step("a", agent="ask"), Step("r", agent="reports")])
    first = rt.execute(plan, call_budget=10, reserve=reserve_two)
    assert sorted(first.waiting) == ["a", "r"]  # in the order they came to wait: either
    assert first.calls_used == 3
    charged = [
        e.data.charged for e in rt.runs.history(first.run_id) if isinstance(e.data, StepWaiting)
    ]
    assert sorted(charged) == [0, 3]
    why = rt.runs.why(first.run_id)
    assert "step 'r' overran its reservation: it reported 3 model call(s) against 2 reserved" in why
    assert_views_agree(rt, first.run_id)
    done = rt.resume(first.run_id, answers={"a": "red", "r": "4"})
    assert isinstance(done, journaled.ExecuteResult)
    assert done.ok
    assert done.calls_used == 3 + 0 + 2  # ask reports 0; reports reports nothing: reserved 2
    total = sum(getattr(e.data, "charged", 0) for e in rt.runs.history(first.run_id))
    assert total == done.calls_used
    assert_views_agree(rt, first.run_id)


@pytest.mark.parametrize("reported", [-1, -(1 << 70), 2.5, True, "3"])
def test_a_wait_reporting_garbage_calls_fails_and_is_charged_its_reservation(
    rt: journaled.Runtime, reported: object
) -> None:
    """E8/R6: an agent-waiting result whose calls_used is negative, huge-negative, a float, a
    bool or a string is no report: the step fails (agent-failed, naming calls_used), is never
    made free (charged its reservation), and nothing waits."""

    def liar(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        return AgentResult(ok=False, code="agent-waiting", error="?", calls_used=reported)  # type: ignore[arg-type]

    rt.register_agent("liar", liar)
    done = rt.execute(
        Plan(goal="g", steps=[Step("l", agent="liar")]), call_budget=5, reserve=reserve_two
    )
    assert done.waiting == []
    assert not done.ok
    (obs,) = done.observations
    assert obs.code == "agent-failed"
    assert "calls_used" in (obs.error or "")
    assert done.calls_used == 2
    assert_views_agree(rt, done.run_id)


def test_raising_the_budget_and_answering_in_one_resume(rt: journaled.Runtime) -> None:
    """E14/E10/E7: one resume may answer and raise the budget: both are journaled before the
    resume (answers, budget raise, resume, in that order, adjacent), and the run completes."""
    plan = Plan(
        goal="g",
        steps=[Step("a", agent="ask"), Step("k", skill="think", depends_on=["a"])],
    )
    first = rt.execute(plan, call_budget=0)
    assert first.waiting == ["a"]
    done = rt.resume(first.run_id, answers={"a": "red"}, call_budget=1)
    assert isinstance(done, journaled.ExecuteResult)
    assert done.ok
    assert done.calls_used == 1
    history = rt.runs.history(first.run_id)
    tail = [
        e for e in history if e.kind in ("run.answers-given", "run.budget-raised", "run.resumed")
    ]
    assert [e.kind for e in tail] == ["run.answers-given", "run.budget-raised", "run.resumed"]
    assert [e.position for e in tail] == list(range(tail[0].position, tail[0].position + 3))
    assert_views_agree(rt, first.run_id)


def test_refused_budgets_on_resume_leave_storage_as_it_was(
    rt: journaled.Runtime, sqlite_url: str
) -> None:
    """E14/E7: a resume budget that is negative, a float, a bool, a string or past 64 bits is
    refused with a ValueError naming call_budget; nothing is written anywhere."""
    first = _waiting_run(rt)
    rows = stored(sqlite_url)
    for bad in (-1, 1.5, True, "10", 1 << 63):
        with pytest.raises(ValueError, match="call_budget"):
            rt.resume(first.run_id, call_budget=bad, answers={"a": "red"})  # type: ignore[arg-type]
    assert stored(sqlite_url) == rows
    assert assert_views_agree(rt, first.run_id).waiting == ["a"]


# -- close while waiting ---------------------------------------------------------------------------


def test_a_run_suspended_with_a_step_waiting_keeps_the_wait(sqlite_url: str) -> None:
    """R3/E10/E14: the runtime closes while one step of a wave waits and a sibling is in
    flight: the run is suspended (not finished), its waiting step and question are kept; a new
    runtime answers it, re-runs the sibling, and the run completes."""
    gate = threading.Event()
    rt = journaled.open(sqlite_url)
    rt.register_agent("ask", ask)
    rt.register_tool("slow", lambda x: gate.wait(WAIT) and x)
    try:
        handle = rt.start(
            Plan(goal="g", steps=[Step("a", agent="ask"), Step("s", tool="slow", input=1)])
        )
        wait_for(lambda: rt.runs.state(handle.run_id).waiting == ["a"], WAIT)
        rt.close(drain=0.1)
        suspended = handle.result(WAIT)
        assert suspended.suspended
        assert suspended.waiting == ["a"]
    finally:
        gate.set()
        rt.close()
    wait_for(lambda: not pykka.ActorRegistry.get_all(), WAIT)
    with journaled.open(sqlite_url) as again:
        again.register_agent("ask", ask)
        again.register_tool("slow", lambda x: x)
        state = assert_views_agree(again, handle.run_id)
        assert state.suspended is not None
        assert state.suspended.in_flight == ("s",)
        assert state.waiting == ["a"]
        assert (
            again.runs.why(handle.run_id)
            .splitlines()[-1]
            .startswith("now: suspended when its runtime closed")
        )
        done = again.resume(handle.run_id, answers={"a": "red"})
        assert isinstance(done, journaled.ExecuteResult)
        assert done.ok
        assert {o.step_id: o.output for o in done.observations if o.ok} == {"a": "a=red", "s": 1}
        assert_views_agree(again, handle.run_id)


# -- orchestrations waiting for approval and clarification -------------------------------------


def _approval_planner(
    goal: str, observations: list[Observation], clarifications: list[tuple[str, str]]
) -> Plan:
    return Plan(goal=goal, steps=[Step("a", agent="ask"), Step("t", tool="echo", depends_on=["a"])])


def test_two_threads_approving_one_orchestration_approve_it_once(
    rt: journaled.Runtime, sqlite_url: str
) -> None:
    """O4/R8: two threads approve one orchestration waiting for approval at once: one drives
    it (its pass then waits for the step's answer), the other gets RunOwnedElsewhere; the
    approval is journaled once, and the summary, list and why say waiting_for_clarification."""
    first = rt.orchestrate("paint", _approval_planner, require_approval=True)
    assert first.status == "waiting_for_approval"
    assert rt.runs.summary(first.run_id).status == "waiting_for_approval"
    barrier = threading.Barrier(2)
    outcomes: list[object] = []

    def approve() -> None:
        barrier.wait(WAIT)
        try:
            outcomes.append(rt.resume(first.run_id, approve=True))
        except journaled.RunNotResumable as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=approve) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    done = [o for o in outcomes if isinstance(o, journaled.Outcome)]
    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert (len(done), len(refused)) == (1, 1), outcomes
    assert isinstance(refused[0], journaled.RunOwnedElsewhere)
    assert done[0].status == "waiting_for_clarification"
    resumed = [e.data for e in rt.runs.history(first.run_id) if e.kind == "orchestration.resumed"]
    assert [r.approved for r in resumed] == [1]  # type: ignore[attr-defined]
    summary = rt.runs.summary(first.run_id)
    assert summary.status == "waiting_for_clarification"
    assert summary.waiting == ("a",)
    assert first.run_id in rt.runs.list(status="waiting_for_clarification")
    assert "step 'a' waits for an answer to 'which colour for a?'" in rt.runs.why(first.run_id)
    rows = stored(sqlite_url)
    with pytest.raises(journaled.RunNotResumable, match="not waiting for approval"):
        rt.resume(first.run_id, approve=True)
    assert stored(sqlite_url) == rows
    final = rt.resume(first.run_id, clarification="red")
    assert isinstance(final, journaled.Outcome)
    assert final.status == "completed"
    assert rt.runs.summary(first.run_id).status == "completed"


@pytest.mark.parametrize(
    ("clarification", "message"),
    [("", "the clarification is empty"), ("   ", "is empty"), (5, "must be a string, got int")],
)
def test_odd_clarifications_are_refused_and_append_nothing(
    rt: journaled.Runtime, sqlite_url: str, clarification: object, message: str
) -> None:
    """O4: a clarification that is empty, blank or not a string is refused naming the
    clarification; the orchestration still waits for its planner's question."""

    def planner(
        goal: str, observations: list[Observation], clarifications: list[tuple[str, str]]
    ) -> Plan | Clarify:
        if not clarifications:
            return Clarify("which city?")
        return Plan(goal=goal, steps=[Step("t", tool="echo", input=clarifications[-1][1])])

    first = rt.orchestrate("travel", planner)
    assert first.status == "waiting_for_clarification"
    rows = stored(sqlite_url)
    with pytest.raises(journaled.RunNotResumable, match=message):
        rt.resume(first.run_id, clarification=clarification)  # type: ignore[arg-type]
    with pytest.raises(journaled.RunNotResumable, match="not waiting for an answer"):
        rt.resume(first.run_id, answers={"t": "Paris"})
    assert stored(sqlite_url) == rows
    assert rt.runs.summary(first.run_id).status == "waiting_for_clarification"
    done = rt.resume(first.run_id, clarification="Paris")
    assert isinstance(done, journaled.Outcome)
    assert done.status == "completed"
    assert [o.output for o in done.observations] == ["Paris"]


# -- the command line agrees -----------------------------------------------------------------------


def test_runs_list_on_the_command_line_agrees_with_the_library(
    rt: journaled.Runtime, sqlite_url: str
) -> None:
    """T2: ``journaled runs list --json`` (the journal alone, another process) gives every
    run the status, waiting steps, calls and steps done the library gives, for runs waiting
    for input, for budget, answered, cancelled and failed; ``--status`` filters the same."""

    def boom(_: object) -> object:
        raise RuntimeError("no paint left")

    rt.register_tool("boom", boom)
    waiting = _waiting_run(rt).run_id
    budget = rt.execute(Plan(goal="g", steps=[Step("k", skill="think")]), call_budget=0).run_id
    answered = _waiting_run(rt).run_id
    rt.resume(answered, answers={"a": "red"})
    failed = rt.execute(Plan(goal="g", steps=[Step("b", tool="boom")])).run_id
    done = subprocess.run(
        [*CLI, "--url", sqlite_url, "runs", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=True,
    )
    listed = {r["run_id"]: r for r in json.loads(done.stdout)}
    assert {
        waiting: "waiting_for_input",
        budget: "waiting_for_budget",
        answered: "completed",
        failed: "failed",
    } == {r: listed[r]["status"] for r in (waiting, budget, answered, failed)}
    for run_id in (waiting, budget, answered, failed):
        summary = rt.runs.summary(run_id)
        row = listed[run_id]
        assert row["status"] == summary.status
        assert tuple(row["waiting"]) == summary.waiting
        assert (row["calls_used"], row["steps_done"], row["steps_total"]) == (
            summary.calls_used,
            summary.steps_done,
            summary.steps_total,
        )
        assert_views_agree(rt, run_id)
    only = subprocess.run(
        [*CLI, "--url", sqlite_url, "runs", "list", "--json", "--status", "waiting_for_input"],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=True,
    )
    assert [r["run_id"] for r in json.loads(only.stdout)] == [waiting]
    assert os.path.exists(_path(sqlite_url))
