"""Attacks on the message channels: addresses, inboxes, failures, handles, async steps (A2, A4).

Each test races, crashes or abuses one channel of ADR 0024/0027/0031 and states the behaviour
that must hold (SPEC A2, A4, R3, R4, R8). A test marked ``xfail(strict=True)`` pins a defect
still open; it turns into a failure once the defect is fixed, and its mark is then removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from threads import in_thread

import journaled
from journaled import Plan, Step
from journaled.actors.directory import Directory, failure, rebuild_error
from journaled.actors.errors import InvalidFact, RunOwnedElsewhere, RuntimeClosed
from journaled.actors.executor import Executor
from journaled.actors.runs import Runs
from journaled.events.errors import ConcurrencyConflict, CorruptEvent, PlanRejected
from journaled.testing import wait_for

WAIT = 20.0
"""Upper bound of every wait: a test that needs it has failed."""


@pytest.fixture
def runtime(sqlite_url: str) -> Iterator[journaled.Runtime]:
    with journaled.open(sqlite_url) as rt:
        yield rt


def _status(rt: journaled.Runtime, run_id: str) -> str:
    status: str = rt.runs.history(run_id)[-1].data.status  # type: ignore[attr-defined]
    return status


def _idle(rt: journaled.Runtime) -> bool:
    return not rt.runs._active and not rt._services.cancellations._tokens


# -- Failure replies: the error a caller gets is the error that was raised ------------------------


def test_a_rebuilt_key_error_reads_as_the_original() -> None:
    """A4: a KeyError crossing a Failure reads (str) as it did where it was raised."""
    original = KeyError("missing")
    rebuilt = rebuild_error(failure("c1", original))
    assert isinstance(rebuilt, KeyError)
    assert str(rebuilt) == str(original)


def test_a_rebuilt_plan_rejected_keeps_its_text_and_class() -> None:
    """A4: PlanRejected crossing a Failure keeps its class and its one-line text."""
    original = PlanRejected("a", "tool 'x' is not registered")
    rebuilt = rebuild_error(failure("c1", original))
    assert isinstance(rebuilt, PlanRejected)
    assert str(rebuilt) == str(original)


def test_a_rebuilt_plan_rejected_still_names_its_step() -> None:
    """A4: PlanRejected crossing a Failure still names the step it rejects (step_id)."""
    rebuilt = rebuild_error(failure("c1", PlanRejected("a", "bad")))
    assert isinstance(rebuilt, PlanRejected)
    assert getattr(rebuilt, "step_id", None) == "a"


def test_a_rebuilt_concurrency_conflict_still_names_its_streams() -> None:
    """A4: ConcurrencyConflict crossing a Failure still names the streams that conflicted."""
    rebuilt = rebuild_error(failure("c1", ConcurrencyConflict(["run-1"], "version 3 taken")))
    assert isinstance(rebuilt, ConcurrencyConflict)
    assert getattr(rebuilt, "streams", None) == ["run-1"]


def test_an_error_whose_text_is_not_its_first_argument_keeps_its_text() -> None:
    """A4: an error with its own __str__ crosses a Failure with the text it showed."""

    class Odd(ValueError):
        def __str__(self) -> str:
            return "odd text"

    rebuilt = rebuild_error(failure("c1", Odd("args[0]")))
    assert isinstance(rebuilt, journaled.errors.ActorsError)  # a class the receiver lacks
    assert "odd text" in str(rebuilt)


def test_an_unknown_error_class_arrives_as_an_actors_error_naming_it() -> None:
    """A4: an error class the receiver does not know arrives named, with its text."""

    class Strange(Exception):
        pass

    rebuilt = rebuild_error(failure("c1", Strange("boom")))
    assert isinstance(rebuilt, journaled.errors.ActorsError)
    assert "Strange" in str(rebuilt)
    assert "boom" in str(rebuilt)


def test_a_mailbox_that_raises_never_fails_its_sender() -> None:
    """A4: a reply to a mailbox whose tell raises is dropped (False); the sender never fails."""

    class Broken:
        def tell(self, message: Any) -> None:
            raise RuntimeError("foreign adapter is down")

    directory = Directory("rt-test")
    directory.register("rt-test/foreign", Broken())
    assert directory.tell("rt-test/foreign", failure("c1", ValueError("x"))) is False


# -- the executor crashes ----------------------------------------------------------------------


def test_an_executor_crash_fails_the_handle_releases_the_claim_and_resume_works(
    runtime: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A2/R8: an executor that raises fails its handle with that error; the run resumes after."""
    started = threading.Event()  # the crash comes after start returned, not during it
    runtime.register_tool("echo", lambda x: started.wait(WAIT) and x)
    real = Executor._on_done

    def crash(self: Executor, msg: Any) -> None:
        raise KeyError("crashed on purpose")

    monkeypatch.setattr(Executor, "_on_done", crash)
    handle = runtime.start(Plan(goal="g", steps=[Step("a", tool="echo", input=1)]))
    started.set()
    with pytest.raises(KeyError, match="crashed on purpose"):
        handle.result(timeout=WAIT)
    assert handle.run_id not in runtime.runs._active
    wait_for(lambda: _idle(runtime), WAIT)
    monkeypatch.setattr(Executor, "_on_done", real)
    result = runtime.resume(handle.run_id, take_over=True)
    assert isinstance(result, journaled.ExecuteResult)
    assert result.ok
    assert result.observations[0].output == 1


def test_after_an_executor_crash_this_process_resumes_without_take_over(
    runtime: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R8: a run whose executor crashed here is not owned elsewhere: resume needs no take_over."""
    started = threading.Event()
    runtime.register_tool("echo", lambda x: started.wait(WAIT) and x)
    real = Executor._on_done

    def crash(self: Executor, msg: Any) -> None:
        raise RuntimeError("crashed on purpose")

    monkeypatch.setattr(Executor, "_on_done", crash)
    handle = runtime.start(Plan(goal="g", steps=[Step("a", tool="echo", input=1)]))
    started.set()
    with pytest.raises(RuntimeError, match="crashed on purpose"):
        handle.result(timeout=WAIT)
    wait_for(lambda: _idle(runtime), WAIT)
    monkeypatch.setattr(Executor, "_on_done", real)
    result = runtime.resume(handle.run_id)
    assert isinstance(result, journaled.ExecuteResult)
    assert result.ok


@pytest.mark.parametrize(
    "error",
    [
        PlanRejected("a", "rejected late"),
        ConcurrencyConflict(["run-1"], "version 3 taken"),
        CorruptEvent(3, "run.started", "bad bytes"),
        InvalidFact("text", "is empty"),
    ],
    ids=type,
)
def test_an_executor_crash_surfaces_with_its_class_text_and_field(
    runtime: journaled.Runtime, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    """A4: an error raised in the executor reaches result() with its class, its text, its field."""
    started = threading.Event()  # the crash comes after start returned, not during it
    runtime.register_tool("echo", lambda x: started.wait(WAIT) and x)

    def crash(self: Executor, msg: Any) -> None:
        raise error

    monkeypatch.setattr(Executor, "_on_done", crash)
    handle = runtime.start(Plan(goal="g", steps=[Step("a", tool="echo", input=1)]))
    started.set()
    with pytest.raises(type(error)) as caught:
        handle.result(timeout=WAIT)
    assert str(caught.value) == str(error)
    assert getattr(caught.value, "field", None) == getattr(error, "field", None)


def test_start_hands_back_a_run_whose_opening_committed_even_if_it_then_crashed(
    runtime: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A2: a run in the journal is handed back by start, so its id is known, crash or not."""
    runtime.register_tool("echo", lambda x: x)

    def crash(self: Executor) -> None:
        raise ValueError("crashed after the opening commit")

    class LateWaker(threading.Event):
        """The starting thread wakes only once the crashed executor has answered."""

        def wait(self, timeout: float | None = None) -> bool:
            super().wait(timeout)
            wait_for(lambda: not runtime.runs._active, WAIT)
            return True

    real_claim = Runs._claim

    def claim(self: Runs, run_id: str) -> Any:
        held = real_claim(self, run_id)
        held.opened = LateWaker()
        return held

    monkeypatch.setattr(Executor, "_arm_heartbeat", crash)  # runs once Begin has committed
    monkeypatch.setattr(Runs, "_claim", claim)
    before = runtime.journal.position()
    try:
        handle = runtime.start(Plan(goal="g", steps=[Step("a", tool="echo", input=1)]))
    finally:
        wait_for(lambda: _idle(runtime), WAIT)
        assert runtime.journal.position() > before  # the run is in the journal
    with pytest.raises(ValueError, match="crashed after the opening commit"):
        handle.result(timeout=WAIT)
    assert runtime.runs.history(handle.run_id)[0].kind == "run.started"


# -- cancel against start, end and deadlines ---------------------------------------------------


def test_cancel_after_the_run_ended_answers_false_and_leaves_it_completed(
    runtime: journaled.Runtime,
) -> None:
    """A2/E5: cancelling a finished run (or an unknown id) answers False and appends nothing."""
    runtime.register_tool("echo", lambda x: x)
    handle = runtime.start(Plan(goal="g", steps=[Step("a", tool="echo", input=1)]))
    assert handle.result(timeout=WAIT).ok
    before = runtime.journal.position()
    assert handle.cancel() is False
    assert runtime.cancel("run-that-never-was") is False
    assert runtime.journal.position() == before
    assert _status(runtime, handle.run_id) == "completed"


def test_cancel_right_after_start_cancels_every_time(runtime: journaled.Runtime) -> None:
    """A2/E5: a cancel told as soon as start returns (racing Begin) always cancels the run."""
    gate = threading.Event()
    runtime.register_tool("hold", lambda x: gate.wait(WAIT) and x)
    plan = Plan(
        goal="g",
        steps=[Step("a", tool="hold", input=1), Step("b", tool="hold", input=2, depends_on=["a"])],
    )
    for _ in range(20):
        handle = runtime.start(plan)
        assert handle.cancel() is True
        gate.set()
        result = handle.result(timeout=WAIT)
        gate.clear()
        assert not result.ok
        assert _status(runtime, handle.run_id) == "cancelled"
    wait_for(lambda: _idle(runtime), WAIT)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_deadline_racing_its_step_done_journals_one_outcome(
    runtime: journaled.Runtime, kind: str
) -> None:
    """A4/R4: a step ending just at its deadline gets exactly one outcome; no token is left."""
    barrier = threading.Event()

    async def edge_async(x: object) -> object:
        await asyncio.sleep(0.02)
        return x

    runtime.register_tool(
        "edge", edge_async if kind == "async" else lambda x: barrier.wait(0.02) or x
    )
    for _ in range(15):
        handle = runtime.start(
            Plan(goal="g", steps=[Step("a", tool="edge", input=1)]), step_timeout=0.02
        )
        handle.result(timeout=WAIT)
        ends = [
            e
            for e in runtime.runs.history(handle.run_id)
            if e.kind in ("run.step-succeeded", "run.step-failed")
        ]
        assert len(ends) == 1, [e.kind for e in ends]
    wait_for(lambda: _idle(runtime), WAIT)


# -- R8: two resumes of one run --------------------------------------------------------------


def test_two_resumes_from_threads_one_executes_the_other_is_refused(
    runtime: journaled.Runtime,
) -> None:
    """R8: two resume_start of one run from threads: one executes, one gets RunOwnedElsewhere."""
    gate = threading.Event()
    entered = threading.Event()

    def hold(x: object) -> object:
        entered.set()
        gate.wait(WAIT)
        return x

    runtime.register_tool("hold", hold)
    runtime.register_skill("think", lambda x: "idea")
    stopped = runtime.execute(
        Plan(goal="g", steps=[Step("s", skill="think"), Step("h", tool="hold", depends_on=["s"])]),
        call_budget=0,
    )
    assert stopped.stopped_for_budget
    barrier = threading.Barrier(2)

    def resume() -> Any:
        barrier.wait(WAIT)
        return runtime.resume_start(stopped.run_id, call_budget=5)

    (t1, out1), (t2, out2) = in_thread(resume), in_thread(resume)
    t1.join(WAIT)
    t2.join(WAIT)
    outcomes = out1 + out2
    refused = [o for o in outcomes if isinstance(o, RunOwnedElsewhere)]
    handles = [o for o in outcomes if isinstance(o, journaled.RunHandle)]
    assert len(refused) == 1, outcomes
    assert len(handles) == 1, outcomes
    gate.set()
    assert handles[0].result(timeout=WAIT).ok
    wait_for(lambda: _idle(runtime), WAIT)
    kinds = [e.kind for e in runtime.runs.history(stopped.run_id)]
    assert kinds.count("run.resumed") == 1, kinds
    assert kinds.count("run.finished") == 2, kinds  # the budget stop, then the completion


def test_resumes_while_the_first_executor_is_still_stopping_are_refused(
    runtime: journaled.Runtime,
) -> None:
    """R8: while a cancelled run waits for its step in flight, resumes from threads are refused."""
    gate = threading.Event()
    entered = threading.Event()

    def hold(x: object) -> object:
        entered.set()
        gate.wait(WAIT)  # ignores the cancel: the executor stops only once this returns
        return x

    runtime.register_tool("hold", hold)
    steps = [Step("a", tool="hold", input=1), Step("b", tool="hold", depends_on=["a"])]
    handle = runtime.start(Plan(goal="g", steps=steps))
    assert entered.wait(WAIT)
    assert handle.cancel()
    barrier = threading.Barrier(3)

    def resume() -> Any:
        barrier.wait(WAIT)
        return runtime.resume_start(handle.run_id)

    racers = [in_thread(resume) for _ in range(3)]
    for thread, _ in racers:
        thread.join(WAIT)
    outcomes = [out[0] for _, out in racers]
    assert all(isinstance(o, RunOwnedElsewhere) for o in outcomes), outcomes
    gate.set()
    assert not handle.result(timeout=WAIT).ok
    assert _status(runtime, handle.run_id) == "cancelled"
    kinds = [e.kind for e in runtime.runs.history(handle.run_id)]
    assert kinds.count("run.started") == 1
    assert "run.resumed" not in kinds
    wait_for(lambda: _idle(runtime), WAIT)


def test_an_executor_crash_before_the_opening_commit_raises_from_start(
    runtime: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A2/R8: an executor that fails on Begin makes start raise that error; the claim is freed."""
    runtime.register_tool("echo", lambda x: x)

    def crash(self: Executor) -> None:
        raise ValueError("cannot begin")

    monkeypatch.setattr(Executor, "_advance", crash)
    starter, out = in_thread(runtime.start, Plan(goal="g", steps=[Step("a", tool="echo")]))
    starter.join(WAIT)
    assert not starter.is_alive()
    (got,) = out
    if isinstance(got, journaled.RunHandle):  # the opening was committed before the crash
        with pytest.raises(ValueError, match="cannot begin"):
            got.result(timeout=WAIT)
    else:
        assert isinstance(got, ValueError), repr(got)
        assert "cannot begin" in str(got)
    wait_for(lambda: _idle(runtime), WAIT)


# -- close against handles and start -----------------------------------------------------------


def test_result_after_close_answers_at_once(sqlite_url: str) -> None:
    """A2/R3: a handle's result() after close answers (suspended), never waits forever."""
    gate = threading.Event()
    rt = journaled.open(sqlite_url)
    rt.register_tool("hold", lambda x: gate.wait(WAIT) and x)
    handle = rt.start(Plan(goal="g", steps=[Step("a", tool="hold", input=1)]))
    closer, _ = in_thread(rt.close, drain=0)
    gate.set()
    closer.join(WAIT)
    assert not closer.is_alive()
    result = handle.result(timeout=WAIT)
    assert result.suspended or result.ok
    assert handle.result(timeout=0) is result  # answered once, kept


def test_close_while_starts_race_it_never_hangs(sqlite_url: str) -> None:
    """A2/R3: starts racing close each return a handle or raise RuntimeClosed; none hangs."""
    rt = journaled.open(sqlite_url)
    rt.register_tool("echo", lambda x: x)
    plan = Plan(goal="g", steps=[Step("a", tool="echo", input=1)])
    go = threading.Barrier(5)

    def start() -> Any:
        go.wait(WAIT)
        return [rt.start(plan) for _ in range(10)]

    starters = [in_thread(start) for _ in range(4)]
    go.wait(WAIT)
    rt.close(drain=1)
    for thread, out in starters:
        thread.join(WAIT)
        assert not thread.is_alive()
        (got,) = out
        if isinstance(got, list):
            for handle in got:
                handle.result(timeout=WAIT)
        else:
            assert isinstance(got, RuntimeClosed), repr(got)


def test_a_step_may_close_its_own_runtime(sqlite_url: str) -> None:
    """R3: a tool that closes its own runtime does not deadlock; its run is suspended."""
    rt = journaled.open(sqlite_url)

    def closer(x: object) -> object:
        rt.close(drain=0)
        return x

    rt.register_tool("closer", closer)
    handle = rt.start(Plan(goal="g", steps=[Step("a", tool="closer", input=1)]))
    assert handle.result(timeout=WAIT).suspended
    rt.close()


def test_remember_after_close_raises_runtime_closed(sqlite_url: str) -> None:
    """R3/A4: remember on a closed runtime raises RuntimeClosed, not an actor library error."""
    rt = journaled.open(sqlite_url)
    rt.close()
    with pytest.raises(RuntimeClosed):
        rt.memory.remember("too late")


# -- async user code ---------------------------------------------------------------------------


def test_an_async_step_that_ignores_cancellation_does_not_hold_the_run(
    runtime: journaled.Runtime,
) -> None:
    """A1/E5: an async tool that swallows CancelledError still lets its cancelled run end."""
    started = threading.Event()
    stop = threading.Event()

    async def stubborn(_: object) -> str:
        started.set()
        while not stop.is_set():
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                continue
        return "done"

    runtime.register_tool("stubborn", stubborn)
    handle = runtime.start(Plan(goal="g", steps=[Step("a", tool="stubborn")]))
    assert started.wait(WAIT)
    assert handle.cancel()
    result = handle.result(timeout=WAIT)
    stop.set()
    assert not result.ok
    assert _status(runtime, handle.run_id) == "cancelled"


def test_an_async_step_raising_cancelled_error_itself_fails_without_cancelling_the_run(
    runtime: journaled.Runtime,
) -> None:
    """A1/E11: an async tool that raises CancelledError on its own fails its step, not the run."""

    async def gives_up(_: object) -> None:
        raise asyncio.CancelledError

    runtime.register_tool("gives_up", gives_up)
    runtime.register_tool("echo", lambda x: x)
    plan = Plan(goal="g", steps=[Step("a", tool="gives_up"), Step("b", tool="echo", input=1)])
    result = runtime.start(plan).result(WAIT)
    assert not result.ok
    assert _status(runtime, result.run_id) == "failed"
    assert {o.step_id: o.ok for o in result.observations} == {"a": False, "b": True}


def test_an_async_generator_or_a_coroutine_of_a_coroutine_fails_its_step_clearly(
    runtime: journaled.Runtime,
) -> None:
    """A1/E11: a tool returning an async generator or a nested coroutine fails, naming why."""

    async def gen(_: object) -> AsyncIterator[int]:
        yield 1

    async def inner() -> int:
        return 1

    async def nested(_: object) -> Any:
        return inner()

    runtime.register_tool("gen", gen)
    runtime.register_tool("nested", nested)
    for tool in ("gen", "nested"):
        with pytest.warns(RuntimeWarning) if tool == "nested" else contextlib.nullcontext():
            result = runtime.start(Plan(goal="g", steps=[Step("a", tool=tool)])).result(WAIT)
        assert not result.ok
        (obs,) = result.observations
        assert obs.error is not None
        assert "cannot be journaled" in obs.error, obs.error


def test_an_async_agent_calling_sync_execute_gets_a_clear_error(
    runtime: journaled.Runtime,
) -> None:
    """A1/E9: an async agent calling blocking ctx.execute fails its step saying what to use."""
    runtime.register_tool("echo", lambda x: x)

    async def agent(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        ctx.execute(Plan(goal="child", steps=[Step("c", tool="echo", input=1)]))
        return journaled.AgentResult(ok=True, output="unreachable")

    runtime.register_agent("bad", agent)
    result = runtime.start(Plan(goal="g", steps=[Step("a", agent="bad")])).result(WAIT)
    assert not result.ok
    (obs,) = result.observations
    assert obs.error is not None
    assert "execute_async" in obs.error


def test_an_async_agent_awaits_a_child_plan_of_async_steps(runtime: journaled.Runtime) -> None:
    """A1/E9: an async agent awaiting ctx.execute_async of an async child plan gets its result."""

    async def aecho(x: object) -> object:
        await asyncio.sleep(0)
        return x

    async def agent(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        child = await ctx.execute_async(Plan(goal="c", steps=[Step("c", tool="aecho", input=5)]))
        return journaled.AgentResult(ok=child.ok, output=child.observations[0].output)

    runtime.register_tool("aecho", aecho)
    runtime.register_agent("parent", agent)
    result = runtime.start(Plan(goal="g", steps=[Step("a", agent="parent")])).result(WAIT)
    assert result.ok, result.observations
    assert result.observations[0].output == 5
    wait_for(lambda: _idle(runtime), WAIT)


def test_a_sync_tool_may_execute_another_plan_in_the_same_runtime(
    runtime: journaled.Runtime,
) -> None:
    """A2/E9: a sync tool calling rt.execute of another plan gets its result; both complete."""
    runtime.register_tool("echo", lambda x: x)

    def outer(x: object) -> object:
        inner = runtime.execute(Plan(goal="inner", steps=[Step("i", tool="echo", input=x)]))
        return inner.observations[0].output

    runtime.register_tool("outer", outer)
    result = runtime.start(Plan(goal="g", steps=[Step("o", tool="outer", input=7)])).result(WAIT)
    assert result.ok
    assert result.observations[0].output == 7
    wait_for(lambda: _idle(runtime), WAIT)


def test_an_async_tool_executing_a_plan_with_an_async_tool_does_not_deadlock(
    runtime: journaled.Runtime,
) -> None:
    """A1: an async tool calling blocking rt.execute of an async plan ends (error or result)."""

    async def aecho(x: object) -> object:
        return x

    async def outer(x: object) -> object:
        # Blocks the runtime's loop thread; the inner step needs that same loop.
        inner = runtime.execute(Plan(goal="inner", steps=[Step("i", tool="aecho", input=x)]))
        return inner.observations[0].output

    runtime.register_tool("aecho", aecho)
    runtime.register_tool("outer", outer)
    handle = runtime.start(Plan(goal="g", steps=[Step("o", tool="outer", input=7)]))
    try:
        handle.result(timeout=5.0)
    except TimeoutError:
        runtime.cancel(handle.run_id)
        raise


def test_a_tool_error_whose_text_cannot_be_read_still_fails_its_step(
    runtime: journaled.Runtime,
) -> None:
    """A4/E11: a tool raising an error whose __str__ raises fails its step; the run ends."""

    class Unreadable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    def bad(_: object) -> None:
        raise Unreadable()

    runtime.register_tool("bad", bad)
    handle = runtime.start(Plan(goal="g", steps=[Step("a", tool="bad")]))
    try:
        result = handle.result(timeout=5.0)
    except TimeoutError:
        runtime.cancel(handle.run_id)
        raise
    assert not result.ok
    (obs,) = result.observations
    assert obs.error is not None
    assert "Unreadable" in obs.error


def test_a_tool_calling_sys_exit_fails_its_step_and_the_runtime_lives_on(
    runtime: journaled.Runtime,
) -> None:
    """A4/R4: a tool raising SystemExit fails its step; the runtime's other actors keep serving."""

    def leave(_: object) -> None:
        raise SystemExit(3)

    runtime.register_tool("leave", leave)
    result = runtime.start(Plan(goal="g", steps=[Step("a", tool="leave")])).result(WAIT)
    assert not result.ok
    assert _status(runtime, result.run_id) == "failed"
    assert runtime.memory.remember("still serving").text == "still serving"


# -- leaks ----------------------------------------------------------------------------------


def test_many_runs_leave_no_address_and_no_token_behind(runtime: journaled.Runtime) -> None:
    """A4: after many runs (ok, failing, timed out, cancelled) the directory and tokens are back."""
    runtime.register_tool("echo", lambda x: x)

    def boom(_: object) -> None:
        raise ValueError("no")

    async def slow(_: object) -> None:
        await asyncio.sleep(1)

    runtime.register_tool("boom", boom)
    runtime.register_tool("slow", slow)
    runtime.execute(Plan(goal="warm", steps=[Step("a", tool="echo", input=0)]))
    wait_for(lambda: _idle(runtime), WAIT)
    before = runtime._directory.addresses()
    for i in range(30):
        runtime.execute(Plan(goal="g", steps=[Step("a", tool="echo", input=i)]))
        runtime.execute(Plan(goal="g", steps=[Step("a", tool="boom", input=i)]))
        runtime.execute(Plan(goal="g", steps=[Step("a", tool="slow")]), step_timeout=0.01)
        handle = runtime.start(Plan(goal="g", steps=[Step("a", tool="slow")]))
        handle.cancel()
        handle.result(timeout=WAIT)
    wait_for(lambda: _idle(runtime), WAIT)
    assert runtime._directory.addresses() == before
    assert not runtime.runs._inbox._pending


def test_an_executor_crash_between_start_and_dispatch_leaves_no_token(
    runtime: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A4: an executor dying after opening its steps' tokens, before telling them, frees them."""
    runtime.register_tool("echo", lambda x: x)

    def crash(self: Executor) -> None:
        raise RuntimeError("crashed before dispatch")

    monkeypatch.setattr(Executor, "_flush_and_dispatch", crash)
    with contextlib.suppress(RuntimeError):
        runtime.start(Plan(goal="g", steps=[Step("a", tool="echo")])).result(WAIT)
    wait_for(lambda: not runtime.runs._active, WAIT)
    assert not runtime._services.cancellations._tokens


# -- memory's remember by address ---------------------------------------------------------------


def test_thousands_of_concurrent_remembers_are_all_answered(runtime: journaled.Runtime) -> None:
    """A4/M2: 2,000 remembers from 16 threads each get their own fact; none is lost."""
    texts = [f"fact number {i}" for i in range(2000)]
    with ThreadPoolExecutor(16) as pool:
        facts = list(pool.map(runtime.memory.remember, texts))
    assert [f.text for f in facts] == texts
    assert len({f.id for f in facts}) == len(texts)
    assert not runtime.memory._inbox._pending


def test_a_remember_answered_after_its_caller_gave_up_is_dropped_and_stored(
    runtime: journaled.Runtime,
) -> None:
    """A4: a remember whose caller stopped waiting is still stored; its late answer is dropped."""
    from journaled.events.messages import Remember

    correlation, future = runtime.memory.request_remember(Remember(text="late fact"))
    runtime.memory._inbox.forget(correlation)  # the caller timed out before the answer
    fact = runtime.memory.remember("after it")
    assert fact.text == "after it"
    assert not future.done()
    assert any(f.text == "late fact" for f in runtime.memory.search("late fact"))
    assert not runtime.memory._inbox._pending
