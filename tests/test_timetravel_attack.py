"""Attack probes of time travel and runs at a glance that hold (SPEC O7, M12, T1, T2, R1, R2, J3).

Every answer served by ``runs.at``/``runs.diff`` is compared with a plain fold of the run's
stream prefix (``fold_run(journal.stream(run, upto=p))``), built without the checkpoint cache;
every listing with a fold of the run-summary projection from position 0. Journals are real SQLite
files or the PostgreSQL fixture; other processes are ``sys.executable`` running a script written
to ``tmp_path``.
"""

from __future__ import annotations

import hashlib
import json
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest

import journaled
from journaled import AgentResult, Plan, Step
from journaled.events.catalog import codec
from journaled.events.journal import Journal
from journaled.events.orchestration import OrchestrationStarted, PassStarted
from journaled.events.orchestration_state import fold_orchestration
from journaled.events.plans import ExecuteResult, diff_results
from journaled.events.run_checkpoints import RunCheckpoints
from journaled.events.run_state import fold_run
from journaled.events.run_summaries import SUMMARIES_KEY, RunSummaries, check_stored
from journaled.events.url import parse_url
from journaled.testing import ManualClock

WAIT = 30.0
CLI = [sys.executable, "-m", "journaled.cli"]
SECRET = "tt-attack-confidential"


@contextmanager
def _journal(url: str) -> Iterator[Journal]:
    journal = Journal(parse_url(url), codec(), create=False)
    try:
        yield journal
    finally:
        journal.close()


def _chain(n: int, tool: str = "fetch", prefix: str = "s") -> list[Step]:
    return [
        Step(f"{prefix}{i}", tool=tool, input=i, depends_on=[f"{prefix}{i - 1}"] if i else [])
        for i in range(n)
    ]


def _slow(x: object) -> object:
    time.sleep(0.002)
    return x


def _plain(journal: Journal, run_id: str, position: int) -> ExecuteResult | None:
    """A run (an orchestration: its current pass) at a position, folded without any cache."""
    first = journal.first(run_id)
    assert first is not None
    if isinstance(first.data, OrchestrationStarted):
        then = fold_orchestration(journal.stream(run_id, upto=position))
        events = journal.stream(then.current_run, upto=position) if then.current_run else []
        # Before its pass's run began: the pass's plan, every step pending (O7).
        return fold_run(events).result() if events else then.not_yet_run()
    events = journal.stream(run_id, upto=position)
    return fold_run(events).result() if events else None


def _positions(rt: journaled.Runtime, run_id: str) -> list[int]:
    """Every position of a run and of its passes."""
    history = rt.runs.history(run_id)
    found = [e.position for e in history]
    for e in history:
        if isinstance(e.data, PassStarted):
            found += [p.position for p in rt.runs.history(e.data.run)]
    return sorted(set(found))


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _run(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(path), *args],
        capture_output=True,
        text=True,
        timeout=WAIT * 2,
        check=False,
    )


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "--url", url, *args], capture_output=True, text=True, timeout=WAIT, check=False
    )


# -- positions of every odd shape ----------------------------------------------------------------


@pytest.mark.parametrize("odd", [True, False, 1.5, "3", None, 3.0])
def test_a_position_that_is_no_int_is_a_type_error_naming_the_argument(
    sqlite_url: str, odd: object
) -> None:
    """O7: runs.at/diff (and state) refuse a bool, float, str or None position, naming it;
    nothing is appended and the cache holds nothing of the run."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("fetch", lambda x: x)
        run_id = rt.execute(Plan(goal="g", steps=_chain(3))).run_id
        first = rt.runs.history(run_id)[0].position
        end = rt.journal.position()
        rt.runs.checkpoints = RunCheckpoints(every=2)
        with pytest.raises(TypeError, match=r"^position: a journal position is an int"):
            rt.runs.at(run_id, odd)  # type: ignore[arg-type]
        if odd is not None:  # state(run, None) is its latest state
            with pytest.raises(TypeError, match=r"^position: a journal position is an int"):
                rt.runs.state(run_id, odd)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"^a: a journal position is an int"):
            rt.runs.diff(run_id, odd, end)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"^b: a journal position is an int"):
            rt.runs.diff(run_id, first, odd)  # type: ignore[arg-type]
        assert rt.runs.checkpoints.runs() == []
        assert rt.journal.position() == end


def test_every_position_of_the_journal_is_a_plain_fold_or_a_clear_error(
    journal_url: str, clock: ManualClock
) -> None:
    """O7/T1: at 0, negatives, the run's first event, another run's event, a memory event, the
    end exactly, past it: runs.at is a plain prefix fold or a ValueError that says why; diff of
    a > b is refused and diff of a == b names no change; on every backend."""
    with journaled.open(journal_url, clock=clock) as rt:
        rt.register_tool("fetch", lambda x: x)
        rt.memory.remember("a fact before the run")
        run_id = rt.execute(Plan(goal="g", steps=_chain(4))).run_id
        rt.memory.remember("a fact after the run")
        fact_position = rt.journal.position()
        other = rt.execute(Plan(goal="other", steps=_chain(2))).run_id
        other_position = rt.runs.history(other)[1].position
        first = rt.runs.history(run_id)[0].position
        end = rt.journal.position()
        journal = rt._journal
        for label in ("cold", "warm"):
            if label == "cold":
                rt.runs.checkpoints = RunCheckpoints(every=2)
            for bad in (0, -1, -(2**63), first - 1):
                with pytest.raises(ValueError, match=rf"position {bad} is before run {run_id}"):
                    rt.runs.at(run_id, bad)
            for past in (end + 1, 2**63 - 1):
                with pytest.raises(ValueError, match=rf"position {past} is past the end"):
                    rt.runs.at(run_id, past)
                with pytest.raises(ValueError, match=rf"position {past} is past the end"):
                    rt.runs.diff(run_id, first, past)
            for position in (first, fact_position, other_position, end, *range(first, end + 1)):
                assert rt.runs.at(run_id, position) == _plain(journal, run_id, position), (
                    label,
                    position,
                )
            start = rt.runs.at(run_id, first)
            assert [s.status for s in start.plan.steps] == ["pending"] * 4
            assert start.observations == []
            with pytest.raises(ValueError, match=rf"diff needs a <= b, got a={end}, b={first}"):
                rt.runs.diff(run_id, end, first)
            same = rt.runs.diff(run_id, end, end)
            assert (same.status_changes, same.new_observations) == ([], [])
            assert same.calls_used_before == same.calls_used_after
        with pytest.raises(journaled.RunNotFound):
            rt.runs.at(rt.memory.all()[0].id, end)  # a fact's stream is no run


def test_at_times_before_the_run_and_in_the_future(sqlite_url: str, clock: ManualClock) -> None:
    """O7: at_time before the run's first event is a ValueError naming its start; at a time in
    the future it is the run's last state; at its first event's time, that event's state."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("fetch", lambda x: x)
        clock.advance(5)
        run_id = rt.execute(Plan(goal="g", steps=_chain(3))).run_id
        history = rt.runs.history(run_id)
        began = history[0].data.at
        with pytest.raises(ValueError, match=rf"had not begun at {began - 1} \(it began at"):
            rt.runs.at_time(run_id, began - 1)
        end = rt.journal.position()
        future = rt.runs.at_time(run_id, clock.now + 10**9)
        assert future == _plain(rt._journal, run_id, end)
        assert future.ok
        assert rt.runs.position_at(run_id, began) == max(
            e.position for e in history if e.data.at <= began
        )


# -- the cache under concurrency -----------------------------------------------------------------


def test_many_threads_time_travel_live_runs_through_a_tiny_cache(durable_url: str) -> None:
    """T1/O7: 8 threads call runs.at and runs.diff on one runtime while two runs still append,
    through a cache bounded far below what the runs hold (constant eviction): every answer
    equals a plain fold of the prefix."""
    with journaled.open(durable_url) as rt:
        rt.register_tool("fetch", lambda x: x)
        rt.register_tool("slow", _slow)
        done = [rt.execute(Plan(goal=f"d{k}", steps=_chain(12))).run_id for k in range(4)]
        rt.runs.checkpoints = RunCheckpoints(every=3, budget=60)
        handles = [
            rt.start(Plan(goal=f"live{k}", steps=_chain(120, "slow")), max_parallel_steps=1)
            for k in range(2)
        ]
        runs = [h.run_id for h in handles] + done
        journal = rt._journal
        stop = threading.Event()
        wrong: list[object] = []
        served = [0]
        lock = threading.Lock()

        def explore(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                run_id = rng.choice(runs)
                first = journal.first(run_id)
                if first is None:
                    continue
                end = rt.journal.position()
                a = rng.randint(first.position, end)
                try:
                    if rng.random() < 0.3:
                        b = rng.randint(a, end)
                        got: object = rt.runs.diff(run_id, a, b)
                        before, after = _plain(journal, run_id, a), _plain(journal, run_id, b)
                        assert before is not None
                        assert after is not None
                        want: object = diff_results(run_id, a, b, before, after)
                    else:
                        got, want = rt.runs.at(run_id, a), _plain(journal, run_id, a)
                except Exception as exc:  # a wrong error is a finding too
                    got, want = repr(exc), "an answer"
                with lock:
                    served[0] += 1
                    if got != want:
                        wrong.append((run_id, a, got, want))

        threads = [threading.Thread(target=explore, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        try:
            for h in handles:
                assert h.result(timeout=WAIT).ok
        finally:
            stop.set()
            for t in threads:
                t.join(WAIT)
        assert not any(t.is_alive() for t in threads)
        assert wrong == []
        assert served[0] > 50
        assert rt.runs.checkpoints.held <= 60 or len(rt.runs.checkpoints.runs()) == 1


# -- runs resumed several times after SIGKILLs -------------------------------------------------


_KILLED = """
    import os, signal, sys
    import journaled
    url, mode = sys.argv[1], sys.argv[2]
    rt = journaled.open(url)
    rt.register_tool("fetch", lambda x: x)
    def die(x):
        print("dying", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    rt.register_tool("die", die)
    steps = [
        journaled.Step("a", tool="fetch", input="one"),
        journaled.Step("b", tool="fetch", input="two"),
        journaled.Step("c", tool="die", depends_on=["a", "b"]),
        journaled.Step("d", tool="fetch", depends_on=["c"]),
    ]
    if mode == "start":
        handle = rt.start(journaled.Plan(goal="killed twice", steps=steps))
        print(handle.run_id, flush=True)
        handle.result(timeout=30)
    else:
        rt.resume(mode)
    print("not killed", flush=True)
"""


def test_a_run_killed_mid_step_twice_time_travels_and_lists_right(
    durable_url: str, tmp_path: Path
) -> None:
    """O7/R5/T2: a run SIGKILLed mid-step, resumed and killed again, then resumed to the end:
    at every position runs.at is a plain fold, the fold says running and runs.list interrupted
    while nobody runs it (ADR 0088), completed once it did; the step that was in flight ran
    again (E14, at-least-once)."""
    script = _script(tmp_path, "killed.py", _KILLED)
    started = _run(script, durable_url, "start")
    assert started.returncode == -signal.SIGKILL, started.stderr
    run_id = started.stdout.split()[0]
    with _journal(durable_url) as journal:
        assert RunSummaries(journal).read()[run_id].status == "running"
    again = _run(script, durable_url, run_id)
    assert again.returncode == -signal.SIGKILL, again.stderr
    with journaled.open(durable_url) as rt:
        assert rt.runs.summary(run_id).status == "interrupted"
        rt.register_tool("fetch", lambda x: x)
        rt.register_tool("die", lambda x: "survived")
        result = rt.resume(run_id)
        assert isinstance(result, ExecuteResult)
        assert result.ok
        summary = rt.runs.summary(run_id)
        assert (summary.status, summary.steps_done, summary.steps_total) == ("completed", 4, 4)
        journal = rt._journal
        positions = _positions(rt, run_id)
        for order in (positions, positions[::-1]):
            rt.runs.checkpoints = RunCheckpoints(every=2)
            for position in order:
                assert rt.runs.at(run_id, position) == _plain(journal, run_id, position)
        started_c = [e.position for e in rt.runs.history(run_id) if e.kind.endswith("started")]
        assert len(started_c) >= 3  # c started in each of the three processes
        a, b = positions[0], positions[-1]
        diff = rt.runs.diff(run_id, a, b)
        assert {c.step_id for c in diff.status_changes} == {"a", "b", "c", "d"}


# -- orchestrations, child runs, forks and purges -------------------------------------------------


def _child_agent(step: Step, ctx: journaled.AgentContext) -> AgentResult:
    child = ctx.execute(Plan(goal=f"{SECRET} child", steps=_chain(3, prefix="c")))
    return AgentResult(output=f"{SECRET} {child.ok}", calls_used=0)


def test_a_purge_by_another_runtime_reaches_cached_passes_and_child_runs(
    durable_url: str,
) -> None:
    """O7/R2/T1: after time travel warmed the cache with an orchestration's passes and the run
    its agent started, a purge by another runtime is seen at the next call: no answer at any
    position holds the erased text, and each equals a plain fold of what the journal holds."""
    attempts = [0]

    def planner(goal: str, observations: object, _: object) -> Plan:
        attempts[0] += 1
        last = "boom" if attempts[0] == 1 else "fetch"
        return Plan(
            goal=goal,
            steps=[
                Step("a", tool="fetch", input=f"{SECRET} input"),
                Step("k", agent="kid", depends_on=["a"]),
                Step("z", tool=last, input=SECRET, depends_on=["k"]),
            ],
        )

    def boom(x: object) -> object:
        raise RuntimeError(f"{SECRET} failure")

    with journaled.open(durable_url) as rt, journaled.open(durable_url) as other:
        rt.register_tool("fetch", lambda x: x)
        rt.register_tool("boom", boom)
        rt.register_agent("kid", _child_agent)
        out = rt.orchestrate(f"{SECRET} goal", planner, mode="orchestrate", max_passes=3)
        assert out.status == "completed"
        summaries = rt.runs.list()
        children = [s.run_id for s in summaries if s.orchestration is None and s.parent_run]
        assert len(children) == 2  # the agent's run, one per pass
        streams = [s.run_id for s in summaries]  # the orchestration, its passes, their children
        assert len(streams) == 5
        journal = rt._journal
        rt.runs.checkpoints = RunCheckpoints(every=2)
        for stream in streams:
            for position in _positions(rt, stream):
                if _plain(journal, stream, position) is not None:
                    rt.runs.at(stream, position)
        assert (
            SECRET
            in msgspec.json.encode(
                rt.runs.at(children[0], _positions(rt, children[0])[-1])
            ).decode()
        )
        assert other.runs.purge(out.run_id, reason="erasure request") > 0
        for stream in streams:
            for position in _positions(rt, stream):
                served = rt.runs.at(stream, position)
                assert SECRET not in msgspec.json.encode(served).decode(), (stream, position)
                assert served == _plain(journal, stream, position), (stream, position)
        assert {rt.runs.summary(s).status for s in streams} == {"purged"}


def test_a_fork_travels_from_its_own_first_event_on(sqlite_url: str) -> None:
    """O7/F1: a fork's past before its run.forked is refused as before it began (the source's
    past is the source's); from there on, every position is a plain fold, and so is a fork of
    the fork; the source's answers never change."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("fetch", lambda x: x)
        rt.register_tool("boom", lambda x: 1 / 0)
        source = rt.execute(Plan(goal="src", steps=[*_chain(3), Step("x", tool="boom")])).run_id
        journal = rt._journal
        src_positions = _positions(rt, source)
        before = [rt.runs.at(source, p) for p in src_positions]
        fork = rt.runs.fork(source, at=src_positions[2])
        fork_first = rt.runs.history(fork)[0].position
        for position in src_positions:
            with pytest.raises(ValueError, match=rf"before run {fork} began"):
                rt.runs.at(fork, position)
        at_fork = rt.runs.at(fork, fork_first)
        assert at_fork == _plain(journal, fork, fork_first)
        assert rt.runs.summary(fork).status == "forked"
        rt.resume(fork)
        refork = rt.runs.fork(fork, at=fork_first)
        rt.resume(refork)
        for run_id in (fork, refork):
            for position in _positions(rt, run_id):
                assert rt.runs.at(run_id, position) == _plain(journal, run_id, position)
        assert [rt.runs.at(source, p) for p in src_positions] == before


# -- memory.as_of ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"position": -1}, "must be a journal position >= 0"),
        ({"position": True}, "must be a journal position >= 0"),
        ({"position": 1.5}, "must be a journal position >= 0"),
        ({"position": "3"}, "must be a journal position >= 0"),
        ({"position": 2**63}, "past the end of the journal"),
        ({"at": True}, "at must be epoch milliseconds"),
        ({"at": float("nan")}, "at must be epoch milliseconds"),
        ({"at": "3"}, "at must be epoch milliseconds"),
        ({"at": 2**63}, "outside"),
        ({"position": 1, "at": 1}, "one of position= or at=, not both"),
    ],
)
def test_as_of_refuses_odd_positions_and_times_naming_them(
    sqlite_url: str, kwargs: dict[str, object], message: str
) -> None:
    """M12: as_of refuses a position that is no journal position and a time that is no epoch
    ms, with a ValueError saying which; nothing is appended."""
    with journaled.open(sqlite_url) as rt:
        rt.memory.remember("a fact")
        end = rt.journal.position()
        with pytest.raises(ValueError, match=message):
            rt.memory.as_of(**kwargs)  # type: ignore[arg-type]
        assert rt.journal.position() == end
        assert rt.memory.as_of(position=0).all() == []
        assert [f.text for f in rt.memory.as_of(position=end).all()] == ["a fact"]


def test_as_of_never_shows_another_organizations_facts(sqlite_url: str) -> None:
    """R1/M12: at every position and at a future time, a runtime of organization a sees none
    of organization b's facts in get, all or search, though they share the journal."""
    with journaled.open(sqlite_url, organization="b") as rb:
        theirs = rb.memory.remember(f"{SECRET} plan of b", scope="organization", conflict_key="k")
    with journaled.open(sqlite_url, organization="a") as ra:
        mine = ra.memory.remember("the plan of a", scope="organization", conflict_key="k")
        end = ra.journal.position()
        for view in [
            *(ra.memory.as_of(position=p) for p in range(end + 1)),
            ra.memory.as_of(at=2**62),
        ]:
            assert view.get(theirs.id) is None
            assert all(f.id != theirs.id for f in view.all())
            assert SECRET not in msgspec.json.encode(view.all()).decode()
            assert all(f.id != theirs.id for f in view.search("plan"))
        kept = ra.memory.as_of(position=end).get(mine.id)
        assert kept is not None
        assert kept.superseded_by is None  # b's fact of key k supersedes nothing


_PURGER = """
    import sys
    import journaled
    with journaled.open(sys.argv[1]) as rt:
        assert rt.memory.purge(sys.argv[2])
"""


def test_as_of_after_a_purge_by_another_process_never_returns_the_text(
    durable_url: str, tmp_path: Path, clock: ManualClock
) -> None:
    """R2/M12: once another process purged a fact, no view of this runtime (by position or
    time, searched or not) holds its text, while the fact it superseded is still there."""
    with journaled.open(durable_url, clock=clock) as rt:
        old = rt.memory.remember("the door code is old", conflict_key="door")
        clock.advance(10)
        fact = rt.memory.remember(f"{SECRET} door code", conflict_key="door")
        clock.advance(10)
        assert SECRET in msgspec.json.encode(rt.memory.as_of(at=clock.now).all()).decode()
        done = _run(_script(tmp_path, "purge.py", _PURGER), durable_url, fact.id)
        assert done.returncode == 0, done.stderr
        end = rt.journal.position()
        views = [rt.memory.as_of(position=p) for p in range(end + 1)]
        views += [rt.memory.as_of(at=t) for t in (0, clock.now - 10, clock.now)]
        for view in views:
            assert SECRET not in msgspec.json.encode(view.all()).decode()
            assert all(SECRET not in f.text for f in view.search("door code confidential"))
        assert rt.memory.as_of(position=end).get(old.id) is not None


# -- runs.list ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"status": ""}, "status: '' is no run status"),
        ({"status": ["running", "Running"]}, "status: 'Running' is no run status"),
        ({"status": "Running"}, "status: 'Running' is no run status"),
        ({"since": 1.5}, "since: give a time as epoch milliseconds"),
        ({"since": True}, "since: give a time as epoch milliseconds"),
        ({"limit": -1}, "limit: give a number of runs >= 1"),
        ({"limit": 2.0}, "limit: give a number of runs >= 1"),
        ({"limit": "3"}, "limit: give a number of runs >= 1"),
    ],
)
def test_odd_list_filters_are_refused_naming_them(
    sqlite_url: str, kwargs: dict[str, object], message: str
) -> None:
    """T2: a filter of the wrong kind or value is a ValueError naming it; nothing is written."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("fetch", lambda x: x)
        rt.execute(Plan(goal="g", steps=_chain(1)))
        end = rt.journal.position()
        with pytest.raises(ValueError, match=message):
            rt.runs.list(**kwargs)  # type: ignore[arg-type]
        assert rt.journal.position() == end


def test_extreme_list_filters_answer(sqlite_url: str, clock: ManualClock) -> None:
    """T2: since far in the future lists nothing, since 0 and a huge limit list everything."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("fetch", lambda x: x)
        made = [rt.execute(Plan(goal=f"g{n}", steps=_chain(1))).run_id for n in range(3)]
        assert rt.runs.list(since=2**63) == []
        assert [s.run_id for s in rt.runs.list(since=0, limit=2**63)] == made
        assert [s.run_id for s in rt.runs.list(status="completed", limit=1)] == made[-1:]


_BUSY_WRITER = """
    import sys
    import journaled
    url, rounds = sys.argv[1], int(sys.argv[2])
    with journaled.open(url) as rt:
        rt.register_tool("fetch", lambda x: x)
        rt.register_tool("boom", lambda x: 1 / 0)
        for n in range(rounds):
            steps = [journaled.Step("a", tool="fetch", input=n),
                     journaled.Step("b", tool="boom" if n % 2 else "fetch", depends_on=["a"])]
            goal = ("SECRET-GOAL-%d" % n) if n % 3 == 0 else "plain goal %d" % n
            run = rt.execute(journaled.Plan(goal=goal, steps=steps))
            if n % 2:
                rt.runs.fork(run.run_id)
            if n % 3 == 0:
                rt.runs.purge(run.run_id, "erasure request")
    print("done", flush=True)
"""


def _fresh(journal: Journal) -> dict[str, tuple[object, ...]]:
    """Every run's summary folded from position 0, the stored projection ignored."""
    summaries = RunSummaries(journal)
    summaries._restore = lambda: setattr(summaries, "_runs", {})  # type: ignore[method-assign]
    return {r: tuple(s.as_dict().values()) for r, s in summaries.read().items()}


def test_list_and_save_while_another_process_runs_forks_and_purges(
    durable_url: str, tmp_path: Path
) -> None:
    """T2/R2/J3: while another process executes, forks and purges runs, this one lists and
    stores the projection over and over: afterwards the stored projection matches the journal
    (journal verify's check), holds no purged goal, and every listing equals a fold from 0."""
    with journaled.open(durable_url):
        pass  # the journal exists before the writer and the reader race
    writer = subprocess.Popen(
        [sys.executable, str(_script(tmp_path, "w.py", _BUSY_WRITER)), durable_url, "24"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    saved = 0
    try:
        with _journal(durable_url) as journal:
            summaries = RunSummaries(journal)
            while writer.poll() is None:
                summaries.read()
                saved += summaries.save()
            _, err = writer.communicate(timeout=WAIT)
            assert writer.returncode == 0, err
            assert summaries.save()
            final = {r: tuple(s.as_dict().values()) for r, s in summaries.read().items()}
            assert final == _fresh(journal)
            stored = journal.snapshot(SUMMARIES_KEY)
            assert stored is not None
            assert check_stored(journal, stored[1]) is None
            assert b"SECRET-GOAL" not in stored[1]
            purged = [r for r, s in summaries.read().items() if s.status == "purged"]
            assert len(purged) >= 8
            assert all(summaries.read()[r].goal == "" for r in purged)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.communicate(timeout=WAIT)
    assert saved > 0


_SAVER = """
    import sys
    import journaled
    from journaled.events.run_summaries import RunSummaries
    url = sys.argv[1]
    rt = journaled.open(url)
    rt.register_tool("fetch", lambda x: x)
    n = 0
    print("ready", flush=True)
    while True:
        rt.execute(journaled.Plan(goal="g%d" % n, steps=[journaled.Step("a", tool="fetch")]))
        rt.runs.summaries.save()
        n += 1
"""


def test_a_sigkill_while_the_projection_is_being_stored_leaves_it_right(
    sqlite_url: str, tmp_path: Path
) -> None:
    """T2/R7: a process SIGKILLed while it executes runs and stores the projection in a loop
    leaves a stored projection that journal verify accepts, and listings equal a fold from 0
    (the run it was executing when killed lists as running)."""
    script = _script(tmp_path, "saver.py", _SAVER)
    for delay in (0.6, 0.9, 1.3):  # killed at three moments of the execute-and-store loop
        saver = subprocess.Popen(
            [sys.executable, str(script), sqlite_url],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert saver.stdout is not None
            assert saver.stdout.readline().strip() == "ready"
            time.sleep(delay)
            saver.send_signal(signal.SIGKILL)
            saver.wait(WAIT)
        finally:
            if saver.poll() is None:
                saver.kill()
                saver.wait(WAIT)
            if saver.stdout is not None:
                saver.stdout.close()
        _check_projection(sqlite_url)


def _check_projection(url: str) -> None:
    with _journal(url) as journal:
        stored = journal.snapshot(SUMMARIES_KEY)
        assert stored is not None
        assert check_stored(journal, stored[1]) is None
        listed = {r: tuple(s.as_dict().values()) for r, s in RunSummaries(journal).read().items()}
        assert listed == _fresh(journal)
        assert len(listed) > 3
        assert {s[2] for s in listed.values()} <= {"completed", "running"}
        assert journal.verify().ok


# -- the command line ---------------------------------------------------------------------------


def _files(path: Path) -> str:
    digest = hashlib.sha256()
    for f in sorted(path.parent.glob(path.name + "*")):
        digest.update(f.name.encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()


def test_cli_odd_arguments_are_one_line_errors_and_reads_write_nothing(
    sqlite_url: str, clock: ManualClock
) -> None:
    """T2/O7/T4: runs list/follow/show/diff with odd arguments exit 1 (2 for click's own type
    errors) with one line naming the argument, and --json reads of a settled journal leave
    its files byte for byte as they were."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("fetch", lambda x: x)
        run_id = rt.execute(Plan(goal="g", steps=_chain(3))).run_id
        first = rt.runs.history(run_id)[0].position
        end = rt.journal.position()
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    before = _files(path)
    bad: list[tuple[list[str], int, str]] = [
        (["runs", "list", "--limit", "0"], 1, "limit: give a number of runs >= 1, got 0"),
        (["runs", "list", "--limit", "x"], 2, "Invalid value for '--limit'"),
        (["runs", "list", "--status", "done"], 1, "status: 'done' is no run status"),
        (["runs", "list", "--since", "yesterday"], 1, "cannot read the time 'yesterday'"),
        (["runs", "show", run_id, "--at", "-3"], 1, "--at -3 is negative"),
        (["runs", "show", run_id, "--at", str(2**64)], 1, f"--at {2**64} is past the end"),
        (["runs", "show", run_id, "--at", "0"], 1, f"position 0 is before run {run_id}"),
        (["runs", "show", run_id, "--at", "1.5"], 2, "Invalid value for '--at'"),
        (["runs", "show", run_id, "--at-time", "1990-01-01"], 1, "had not begun at"),
        (["runs", "show", run_id, "--at", "1", "--at-time", "2000-01-01"], 1, "at most one of"),
        (["runs", "show", "run_nope"], 1, "no run 'run_nope'"),
        (["runs", "diff", run_id, str(end), str(first)], 1, "diff needs a <= b"),
        (["runs", "diff", run_id, str(first), str(end + 1)], 1, f"B {end + 1} is past the end"),
        (["runs", "follow", "run_nope"], 1, "no run 'run_nope'"),
        (["runs", "follow", run_id, "--interval", "0"], 1, "--interval must be"),
        (["runs", "follow", run_id, "--interval", "nan"], 1, "--interval must be"),
        (["runs", "follow", run_id, "--max-seconds", "-1"], 1, "--max-seconds must be"),
    ]
    for args, code, message in bad:
        done = _cli(sqlite_url, *args, "--json")
        assert done.returncode == code, (args, done.stdout, done.stderr)
        assert message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr, args
        assert done.stdout == "", args
        if code == 1:
            assert done.stderr.strip().count("\n") == 0, (args, done.stderr)
    listed = _cli(sqlite_url, "runs", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["run_id"] for r in json.loads(listed.stdout)] == [run_id]
    followed = _cli(sqlite_url, "runs", "follow", run_id, "--json", "--max-seconds", "5")
    assert followed.returncode == 0, followed.stderr
    assert json.loads(followed.stdout.splitlines()[-1])["status"] == "completed"
    future = _cli(sqlite_url, "runs", "show", run_id, "--at-time", "2999-01-01", "--json")
    assert future.returncode == 0, future.stderr
    assert json.loads(future.stdout)["position"] == end
    assert _files(path) == before


def test_as_of_without_a_position_or_a_time_is_the_journal_now(sqlite_url: str) -> None:
    """M12, SPEC section 5 (``as_of(position=None, at=None)``): with neither, the view is of the
    journal's last position: what memory holds now, the superseded fact hidden from search as
    live memory hides it."""
    with journaled.open(sqlite_url) as rt:
        rt.memory.remember("deploys go through staging", conflict_key="deploy")
        now = rt.memory.remember("deploys go straight to production", conflict_key="deploy")
        view = rt.memory.as_of()
        assert view.position == rt.journal.position()
        assert view.all() == rt.memory.all()
        assert len(view.all()) == 2  # all() includes the superseded fact (M4)
        assert [f.id for f in view.search("deploys")] == [now.id]
        assert [f.id for f in rt.memory.search("deploys")] == [now.id]
