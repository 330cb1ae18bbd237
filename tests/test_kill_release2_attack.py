"""SIGKILL at many points of release 2's operations, then a new process opens the journal.

Each probe prepares a journal in this process, starts a child (this file run as a script) that
performs one operation in a loop or blocks at a chosen point, SIGKILLs it after a seeded random
delay (counted from the moment the child is ready, so the kill lands inside the operation) or
once it signals the point, then opens the journal again and checks: the digest chain and the
snapshots verify (R7); the operation took effect whole or not at all; a retry completes; the
run-summary projection equals a plain fold of each run (T2); a purged text is in no table (R2).
Release 1's execution and memory writes are covered by test_crash_matrix.py; not repeated here.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # run as the child script
    sys.path.insert(0, str(HERE))

from run_mix import expected, listed, running_or_interrupted  # noqa: E402

import journaled  # noqa: E402
from journaled import AgentResult, NeedsInput, Plan, Step  # noqa: E402
from journaled.events.run_state import fold_run  # noqa: E402

ROOT = HERE.parent
WAIT = 30.0
REASON = "erasure request 42"


# -- step code shared by this process and the child ---------------------------------------------


def _echo(x: object) -> object:
    return x


def _slow(x: object) -> object:
    time.sleep(0.02)
    return x


def _boom(x: object) -> object:
    raise RuntimeError(f"boom {x}")


def _read_fact(query: str, ctx: journaled.AgentContext) -> str:
    assert ctx.memory is not None
    return ctx.memory.search(query)[0].text


def _ask(step: Step, ctx: journaled.AgentContext) -> AgentResult:
    if ctx.answer is None:
        raise NeedsInput(f"which region for {step.input}?")
    return AgentResult(output=f"answer {ctx.answer} for {step.input}", calls_used=0)


def _nested(step: Step, ctx: journaled.AgentContext) -> AgentResult:
    child = ctx.execute(Plan(goal="child", steps=[Step("inner", agent="ask", input="inner")]))
    if child.waiting:
        raise NeedsInput("the child asks which region")
    inner = [o for o in child.observations if o.step_id == "inner"][-1]
    return AgentResult(ok=inner.ok, output=f"child said {inner.output}", calls_used=0)


def budget_planner(goal: str, observations: Any, clarifications: Any) -> Plan:
    """Two skills one after the other: under call_budget=1 the pass stops before the second."""
    return Plan(
        goal=goal,
        steps=[
            Step("t", skill="think", input=1),
            Step("s", skill="think", input=2, depends_on=["t"]),
        ],
    )


def register(rt: journaled.Runtime) -> None:
    """Register the probes' tools and agents."""
    rt.register_agent("nested", _nested)
    rt.register_skill("think", lambda x: f"thought {x}")
    rt.register_tool("echo", _echo)
    rt.register_tool("slow", _slow)
    rt.register_tool("boom", _boom)
    rt.register_tool("read_fact", _read_fact)
    rt.register_agent("ask", _ask)


def planner(goal: str, observations: Any, clarifications: Any) -> Plan:
    """First a plan that fails, then (a replan after the failed pass) one that succeeds."""
    failed = any(not o.ok for o in observations)
    block = os.environ.get("PROBE_BLOCK_REPLAN")
    if failed and block:
        Path(block).write_text("replanning")
        threading.Event().wait(WAIT * 4)
    tool = "echo" if failed else "boom"
    return Plan(goal=goal, steps=[Step("p1", tool=tool, input=f"{goal} pass")])


# -- the child ------------------------------------------------------------------------------------


def _note(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _hold(marker: str) -> None:
    Path(marker).write_text("here")
    threading.Event().wait(WAIT * 4)


def _patch(cfg: dict[str, Any]) -> None:
    """Block the child at a chosen point of an operation (the parent kills it there)."""
    point, marker = cfg.get("point"), cfg.get("marker", "")
    if point == "before_scrub":
        from journaled.actors.scrubber import Scrubber

        Scrubber.after_erasure = lambda self: _hold(marker)  # type: ignore[method-assign]
    elif point in ("before_child_cancelled", "after_child_cancelled"):
        from journaled.actors.runs import Runs

        original = Runs.cancel_at_rest
        pause_after = cfg["pause_after"]

        def patched(self: Runs, run_id: str, timeout: float = 30.0) -> bool:
            if run_id == pause_after and point == "before_child_cancelled":
                _hold(marker)
            done = original(self, run_id, timeout)
            if run_id == pause_after:
                _hold(marker)
            return done

        Runs.cancel_at_rest = patched  # type: ignore[method-assign]


def child_main(raw: str) -> None:
    """Open the journal and perform one operation over and over until killed."""
    cfg = json.loads(raw)
    _patch(cfg)
    rt = journaled.open(cfg["url"], drain=0.2)
    register(rt)
    items: list[str] = cfg.get("items", [])
    mode = cfg["mode"]
    log = cfg["log"]
    Path(cfg["ready"]).write_text("ready")
    if mode == "run_purge":
        for run_id in items:
            rt.runs.purge(run_id, REASON)
            _note(log, run_id)
    elif mode == "memory_purge":
        for fact_id in items:
            rt.memory.purge(fact_id, REASON)
            _note(log, fact_id)
    elif mode == "fork":
        for n in range(10_000):
            new = rt.runs.fork(
                items[0], replace={"b": Step("b", tool="echo", input=f"alt {n}", depends_on=["a"])}
            )
            _note(log, new)
    elif mode == "refresh":
        for _ in range(10_000):
            _note(log, rt.runs.refresh(items[0]))
    elif mode == "cancel":
        for run_id in items:
            _note(log, f"{run_id} {rt.cancel(run_id)}")
    elif mode == "resume":
        for run_id in items:
            rt.resume(run_id, answers={"q": "eu"})
            _note(log, run_id)
    elif mode == "ack":
        sub = rt.journal.subscribe(name="billing")
        while True:
            event = sub.poll(0.05)
            if event is None:
                break
            _note(log, f"try {event.position}")
            sub.ack(event.position)
            _note(log, f"acked {event.position}")
    elif mode == "summaries":
        for n in range(10_000):
            rt.execute(Plan(goal=f"more {n}", steps=[Step("a", tool="echo", input=n)]))
            rt.runs.summaries.save()
    elif mode == "close":
        rt.runs.list()
        rt.execute(Plan(goal="before close", steps=[Step("a", tool="echo", input=1)]))
        rt.close()
        _note(log, "closed")
    elif mode == "checkpoint":
        for n in range(10_000):
            rt.memory.remember(f"checkpointed fact number {n}")
            rt.memory.checkpoint()
    elif mode == "orchestrate":
        rt.orchestrate("replan goal", planner, mode="orchestrate")
    threading.Event().wait(WAIT * 4)  # the parent kills us


def _spawn(
    cfg: dict[str, Any], tmp: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    ready = tmp / f"ready-{time.monotonic_ns()}"
    cfg = {**cfg, "ready": str(ready)}
    cfg.setdefault("log", str(tmp / "log.txt"))
    err = (tmp / "child.err").open("ab")
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), json.dumps(cfg)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=err,
        env={**os.environ, **(env or {})},
    )
    err.close()
    deadline = time.monotonic() + WAIT
    while not ready.exists():
        if proc.poll() is not None:
            pytest.fail(f"child exited ({proc.returncode}):\n{(tmp / 'child.err').read_text()}")
        if time.monotonic() > deadline:
            _kill(proc)
            pytest.fail("child not ready in time")
        time.sleep(0.005)
    return proc


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(WAIT)


def kill_after(cfg: dict[str, Any], tmp: Path, delay: float) -> None:
    """Run the child's operation; SIGKILL it ``delay`` seconds after it is ready."""
    proc = _spawn(cfg, tmp)
    try:
        time.sleep(delay)
    finally:
        _kill(proc)
    assert proc.returncode == -signal.SIGKILL, (tmp / "child.err").read_text()


def kill_at_marker(cfg: dict[str, Any], tmp: Path, marker: Path, env: dict[str, str]) -> None:
    """Run the child's operation; SIGKILL it once it writes ``marker``."""
    proc = _spawn(cfg, tmp, env)
    try:
        deadline = time.monotonic() + WAIT
        while not marker.exists():
            assert proc.poll() is None, (tmp / "child.err").read_text()
            assert time.monotonic() < deadline, "the child never reached the kill point"
            time.sleep(0.005)
    finally:
        _kill(proc)
    assert proc.returncode == -signal.SIGKILL


def _delays(seed: int, n: int, low: float = 0.001, high: float = 0.2) -> list[float]:
    rng = random.Random(seed)
    return sorted(rng.uniform(low, high) for _ in range(n))


# -- what the next process checks -----------------------------------------------------------------


def _cells_hold(value: object, marker: bytes) -> bool:
    if isinstance(value, memoryview):
        value = value.tobytes()
    if isinstance(value, bytes):
        if marker in value:
            return True
        for wbits in (zlib.MAX_WBITS, -zlib.MAX_WBITS):
            try:
                if marker in zlib.decompress(value, wbits):
                    return True
            except zlib.error:
                pass
        return False
    return marker in str(value).encode()


def tables_holding(url: str, markers: list[str]) -> set[str]:
    """Return the markers found in any cell of any table (zlib cells inflated), read below the
    runtime (opening one would scrub)."""
    rows: list[tuple[object, ...]] = []
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            names = [
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            ]
            for name in names:
                rows += conn.execute(f'SELECT * FROM "{name}"').fetchall()  # noqa: S608
        finally:
            conn.close()
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as pg:
            names = pg.execute(
                "SELECT table_schema, table_name FROM information_schema.tables WHERE "
                "table_schema NOT IN ('pg_catalog', 'information_schema')"
            ).fetchall()
            for schema, name in names:
                rows += pg.execute(f'SELECT * FROM "{schema}"."{name}"').fetchall()  # noqa: S608
    found: set[str] = set()
    for marker in markers:
        encoded = marker.encode()
        if any(_cells_hold(cell, encoded) for row in rows for cell in row):
            found.add(marker)
    return found


def file_bytes(url: str) -> bytes:
    """Every byte of the journal's files: SQLite's, or the data files of PostgreSQL's tables."""
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute("CHECKPOINT")
        row = pg.execute("SHOW data_directory").fetchone()
        files = pg.execute(
            "SELECT pg_relation_filepath(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') "
            "OR c.relname LIKE 'pg_toast_%'"
        ).fetchall()
    data = Path(str(row[0])) if row is not None else Path()
    stored = b""
    for (relative,) in files:
        if relative is not None:
            target = data / relative
            for part in target.parent.glob(target.name + "*"):
                stored += part.read_bytes()
    return stored


def check_journal(url: str) -> None:
    """The chain and every snapshot verify, from a process that did not write them (R7)."""
    from journaled.runtime import verify

    report = verify(url)
    assert report.ok, report.problem


def check_summaries(rt: journaled.Runtime) -> None:
    """runs.list() and runs.summary() equal a plain fold of each run (T2)."""
    try:
        folded = expected(rt)
    except journaled.RunNotFound:
        # An orchestration names a pass run whose first event a kill cut off (a resume starts
        # it, orchestrator._start_pass_run): fold the plain runs only.
        folded = _plain_fold(rt)
        assert {r: row for r, row in listed(rt).items() if r in folded} == folded
        return
    assert listed(rt) == folded
    for run_id, row in folded.items():
        summary = rt.runs.summary(run_id)
        assert (summary.status, summary.goal) == row[:2]


def _plain_fold(rt: journaled.Runtime) -> dict[str, tuple[object, ...]]:
    out: dict[str, tuple[object, ...]] = {}
    for run_id in rt.runs.ids():
        history = rt.runs.history(run_id)
        if history[0].kind == "orchestration.started":
            continue
        state = fold_run(history)
        assert state.started is not None
        status = running_or_interrupted(rt, run_id, state.owner, state.last_at)
        if state.purged is not None:
            status = "purged"
        elif state.finished is not None:
            status = state.finished.status
            status = {"waiting": "waiting_for_input"}.get(status, status)
            status = {"stopped_for_budget": "waiting_for_budget"}.get(status, status)
        elif state.suspended is not None:
            status = "suspended"
        goal = "" if state.purged else state.started.plan.goal
        done = sum(1 for v in state.status.values() if v in ("succeeded", "failed", "skipped"))
        out[run_id] = (status, goal, done, len(state.order), state.calls_used)
    return out


def _fresh(durable_url: str, tmp: Path, n: int) -> tuple[str, Path]:
    """A new journal for the n-th kill of a probe: a new SQLite file, or PG's cleared tables."""
    work = tmp / f"k{n}"
    work.mkdir()
    if durable_url.startswith("sqlite:///"):
        return f"sqlite:///{work / 'journal.sqlite'}", work
    return durable_url, work


def _drop_all(url: str) -> None:
    if url.startswith("sqlite:///"):
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        for schema, name in pg.execute(
            "SELECT table_schema, table_name FROM information_schema.tables WHERE "
            "table_schema NOT IN ('pg_catalog', 'information_schema')"
        ).fetchall():
            pg.execute(f'DROP TABLE IF EXISTS "{schema}"."{name}" CASCADE')


# -- R2: run purge ---------------------------------------------------------------------------------


def _finished_runs(url: str, n: int, tag: str) -> dict[str, str]:
    """Make n finished runs whose content holds a marker each; return {run id: marker}."""
    out: dict[str, str] = {}
    with journaled.open(url, drain=0.2) as rt:
        register(rt)
        for i in range(n):
            marker = f"zebra-{tag}-{i}-quokka"
            plan = Plan(
                goal=f"goal {marker}",
                steps=[
                    Step("a", tool="echo", input=f"in {marker}"),
                    Step("b", tool="echo", input="plain", depends_on=["a"]),
                ],
            )
            run_id = rt.execute(plan).run_id
            fork = rt.runs.fork(
                run_id, replace={"b": Step("b", tool="echo", input="again", depends_on=["a"])}
            )
            rt.resume(fork)  # a fork copies its source's content: the family is erased whole
            out[run_id] = marker
        rt.runs.list()
    return out


@pytest.mark.timeout(120)
def test_run_purge_killed_anywhere_is_whole_or_nothing_and_a_retry_erases(
    durable_url: str, tmp_path: Path
) -> None:
    """R2/R7: SIGKILL at random points of runs.purge loops: each run's family is erased from
    every table or not at all, a retry erases the rest and no purged text comes back."""
    seed = 2 if durable_url.startswith("sqlite") else 3
    for n, delay in enumerate(_delays(seed, 3, 0.001, 0.25)):
        url, work = _fresh(durable_url, tmp_path, n)
        _drop_all(url)
        runs = _finished_runs(url, 5, f"r{n}")
        kill_after({"url": url, "mode": "run_purge", "items": list(runs)}, work, delay)
        check_journal(url)
        stored = tables_holding(url, list(runs.values()))
        with journaled.open(url, drain=0.2) as rt:
            register(rt)
            for run_id, marker in runs.items():
                status = rt.runs.summary(run_id).status
                assert (status == "purged") == (marker not in stored), (run_id, status, delay)
            check_summaries(rt)
            for run_id in runs:
                if rt.runs.summary(run_id).status != "purged":
                    rt.runs.purge(run_id, REASON)
            check_summaries(rt)
            rt.memory.scrub()
        assert tables_holding(url, list(runs.values())) == set()
        raw = file_bytes(url)
        assert [m for m in runs.values() if m.encode() in raw] == []
        check_journal(url)


@pytest.mark.timeout(60)
def test_memory_purge_killed_anywhere_is_whole_or_nothing(sqlite_url: str, tmp_path: Path) -> None:
    """R2/M10: SIGKILL at random points of memory.purge loops: each fact's text is in no table
    or the fact is intact, a retry purges it, and the files hold none after the scrub."""
    for n, delay in enumerate(_delays(5, 3, 0.001, 0.15)):
        url, work = _fresh(sqlite_url, tmp_path, n)
        facts: dict[str, str] = {}
        with journaled.open(url) as rt:
            for i in range(6):
                marker = f"walrus-{n}-{i}-okapi"
                facts[rt.memory.remember(f"the code is {marker}").id] = marker
            rt.memory.checkpoint()
        kill_after({"url": url, "mode": "memory_purge", "items": list(facts)}, work, delay)
        check_journal(url)
        stored = tables_holding(url, list(facts.values()))
        with journaled.open(url) as rt:
            for fact_id, marker in facts.items():
                assert (rt.memory.get(fact_id) is None) == (marker not in stored), delay
                if rt.memory.get(fact_id) is not None:
                    assert rt.memory.purge(fact_id, REASON)
            rt.memory.scrub()
        assert tables_holding(url, list(facts.values())) == set()
        assert [m for m in facts.values() if m.encode() in file_bytes(url)] == []


# -- F1/F2/P4: fork and refresh --------------------------------------------------------------------


def _check_forks(rt: journaled.Runtime, source: str) -> int:
    """Every fork of ``source`` in the journal is whole: it reads, lists, and resumes."""
    forks = [s for s in rt.runs.list() if s.forked_from == source]
    for fork in forks:
        first = rt.runs.history(fork)[0]
        assert first.kind == "run.forked"
        assert [s.id for s in rt.runs.state(fork).plan().steps] == ["a", "b"]
        assert fork.status in ("forked", "completed")  # completed: resumed by an earlier check
    check_summaries(rt)
    # The newest fork not resumed yet: a kill can land before the loop made any new fork, and
    # the fork resumed by the check before is finished (a resume of it is refused).
    fresh = [f for f in forks if f.status == "forked"]
    if fresh:
        result = rt.resume(fresh[-1])
        assert isinstance(result, journaled.ExecuteResult)
        assert result.ok
    return len(forks)


@pytest.mark.timeout(60)
def test_fork_killed_anywhere_leaves_only_whole_forks(durable_url: str, tmp_path: Path) -> None:
    """F1/F2/R7: SIGKILL at random points of a fork loop: every fork the journal holds begins
    with run.forked, lists as forked and resumes; the source is untouched."""
    with journaled.open(durable_url) as rt:
        register(rt)
        plan = Plan(
            goal="g",
            steps=[
                Step("a", tool="echo", input=1),
                Step("b", tool="echo", input=2, depends_on=["a"]),
            ],
        )
        source = rt.execute(plan).run_id
        before = [e.position for e in rt.runs.history(source)]
    made = 0
    for n, delay in enumerate(_delays(7, 2, 0.02, 0.2)):
        work = tmp_path / f"k{n}"
        work.mkdir()
        kill_after({"url": durable_url, "mode": "fork", "items": [source]}, work, delay)
        check_journal(durable_url)
        with journaled.open(durable_url) as rt:
            register(rt)
            made = _check_forks(rt, source)
            assert [e.position for e in rt.runs.history(source)] == before
    assert made >= 1


@pytest.mark.timeout(60)
def test_refresh_killed_anywhere_leaves_only_whole_forks(sqlite_url: str, tmp_path: Path) -> None:
    """P4/F1/R7: SIGKILL at random points of a refresh loop: each fork made is whole and, resumed,
    re-reads today's memory."""
    with journaled.open(sqlite_url) as rt:
        register(rt)
        rt.memory.remember("The deploy region is eu-west", conflict_key="region")
        plan = Plan(
            goal="g",
            steps=[
                Step("a", tool="read_fact", input="deploy region"),
                Step("b", tool="echo", input=2, depends_on=["a"]),
            ],
        )
        source = rt.execute(plan).run_id
        rt.memory.remember("The deploy region is us-east", conflict_key="region")
        assert rt.runs.stale(source)
    for n, delay in enumerate(_delays(11, 2, 0.01, 0.15)):
        work = tmp_path / f"k{n}"
        work.mkdir()
        kill_after({"url": sqlite_url, "mode": "refresh", "items": [source]}, work, delay)
        check_journal(sqlite_url)
        with journaled.open(sqlite_url) as rt:
            register(rt)
            forks = [s for s in rt.runs.list() if s.forked_from == source]
            for fork in forks:
                assert rt.runs.history(fork)[0].kind == "run.forked"
            check_summaries(rt)
            assert forks
            result = rt.resume(forks[-1])
            assert isinstance(result, journaled.ExecuteResult)
            assert result.observations[0].output == "The deploy region is us-east"


# -- E5/R3: cancel at rest, resume with answers ---------------------------------------------------


def _waiting_runs(url: str, n: int) -> list[str]:
    with journaled.open(url, drain=0.2) as rt:
        register(rt)
        out = []
        for i in range(n):
            plan = Plan(
                goal=f"waits {i}",
                steps=[
                    Step("q", agent="ask", input=i),
                    Step("after", tool="slow", input=i, depends_on=["q"]),
                ],
            )
            result = rt.execute(plan)
            assert result.waiting == ["q"]
            out.append(result.run_id)
        return out


@pytest.mark.timeout(90)
def test_cancel_at_rest_killed_anywhere_is_cancelled_or_still_resumable(
    durable_url: str, tmp_path: Path
) -> None:
    """E5/R3/R8: SIGKILL at random points of cancels of waiting runs: each run is cancelled or
    still takes an answer or a new cancel; none stays running once its process is dead (one
    left mid-cancel is interrupted, ADR 0088)."""
    seed = 13 if durable_url.startswith("sqlite") else 17
    for n, delay in enumerate(_delays(seed, 3, 0.001, 0.3)):
        url, work = _fresh(durable_url, tmp_path, n)
        _drop_all(url)
        runs = _waiting_runs(url, 4)
        kill_after({"url": url, "mode": "cancel", "items": runs}, work, delay)
        check_journal(url)
        with journaled.open(url, drain=0.2) as rt:
            register(rt)
            check_summaries(rt)
            for i, run_id in enumerate(runs):
                status = rt.runs.summary(run_id).status
                assert status in ("cancelled", "waiting_for_input", "interrupted"), status
                if status == "waiting_for_input" and i % 2 == 0:
                    result = rt.resume(run_id, answers={"q": "eu"})
                    assert isinstance(result, journaled.ExecuteResult)
                    assert result.ok
                elif status != "cancelled":
                    assert rt.cancel(run_id) is True, (run_id, status, delay)
                    assert rt.runs.summary(run_id).status == "cancelled"
            check_summaries(rt)
        check_journal(url)


@pytest.mark.timeout(90)
def test_resume_with_answers_killed_anywhere_finishes_with_the_answer(
    durable_url: str, tmp_path: Path
) -> None:
    """E10/E14/R7: SIGKILL at random points of resumes with answers: a waiting run takes the
    answer again, a taken-up one resumes, each completes having used its answer."""
    seed = 19 if durable_url.startswith("sqlite") else 23
    for n, delay in enumerate(_delays(seed, 2, 0.001, 0.3)):
        url, work = _fresh(durable_url, tmp_path, n)
        _drop_all(url)
        runs = _waiting_runs(url, 4)
        kill_after({"url": url, "mode": "resume", "items": runs}, work, delay)
        check_journal(url)
        with journaled.open(url, drain=0.2) as rt:
            register(rt)
            check_summaries(rt)
            for i, run_id in enumerate(runs):
                status = rt.runs.summary(run_id).status
                if status == "waiting_for_input":
                    rt.resume(run_id, answers={"q": "eu"})
                elif status == "interrupted":  # taken up by the killed process (ADR 0088)
                    rt.resume(run_id)
                result = rt.runs.current(run_id)
                assert result.ok, (run_id, status)
                asked = [o for o in result.observations if o.step_id == "q"][-1]
                assert asked.output == f"answer eu for {i}"
            check_summaries(rt)


# -- A3: a named subscription's ack ---------------------------------------------------------------


@pytest.mark.timeout(60)
def test_subscription_ack_killed_anywhere_resumes_at_or_before_the_ack(
    durable_url: str, tmp_path: Path
) -> None:
    """A3: SIGKILL at random points of a consumer acking each event: the stored position is at
    least the last ack that returned and at most the last one asked; a restart resumes after it."""
    with journaled.open(durable_url) as rt:
        for i in range(150):
            rt.memory.remember(f"fact {i} for the consumer")
    for n, delay in enumerate(_delays(29, 3, 0.005, 0.25)):
        work = tmp_path / f"k{n}"
        work.mkdir()
        log = work / "log.txt"
        kill_after({"url": durable_url, "mode": "ack", "log": str(log)}, work, delay)
        lines = log.read_text().splitlines() if log.exists() else []
        acked = [int(x.split()[1]) for x in lines if x.startswith("acked")]
        tried = [int(x.split()[1]) for x in lines if x.startswith("try")]
        with journaled.open(durable_url) as rt:
            stored = [s.position for s in rt.journal.subscriptions() if s.name == "billing"]
            position = stored[0] if stored else 0
            assert position >= (max(acked) if acked else 0)
            assert position <= (max(tried) if tried else position)
            with rt.journal.subscribe(name="billing") as sub:
                event = sub.poll(1.0)
                if position < rt.journal.position():
                    assert event is not None
                    assert event.position == position + 1
                else:
                    assert event is None
        check_journal(durable_url)


# -- T2: the run-summary projection: save and close ------------------------------------------------


@pytest.mark.timeout(60)
def test_summaries_save_killed_anywhere_is_ignored_or_right(
    durable_url: str, tmp_path: Path
) -> None:
    """T2/R7: SIGKILL at random points of a loop of runs and projection saves: the stored
    projection verifies and runs.list() equals a fold of each run."""
    for n, delay in enumerate(_delays(31, 3, 0.01, 0.3)):
        work = tmp_path / f"k{n}"
        work.mkdir()
        kill_after({"url": durable_url, "mode": "summaries"}, work, delay)
        check_journal(durable_url)
        with journaled.open(durable_url) as rt:
            check_summaries(rt)
            assert rt.runs.list()


@pytest.mark.timeout(60)
def test_close_killed_anywhere_leaves_a_projection_that_is_ignored_or_right(
    sqlite_url: str, tmp_path: Path
) -> None:
    """T2/R3/R7: SIGKILL at random points of a close (which saves the projection and run
    snapshots): the next process verifies and lists every run as a fold does."""
    with journaled.open(sqlite_url) as rt:
        register(rt)
        for i in range(40):
            rt.execute(Plan(goal=f"g {i}", steps=[Step("a", tool="echo", input=i)]))
    for n, delay in enumerate(_delays(37, 3, 0.0, 0.08)):
        work = tmp_path / f"k{n}"
        work.mkdir()
        kill_after({"url": sqlite_url, "mode": "close"}, work, delay)
        check_journal(sqlite_url)
        with journaled.open(sqlite_url) as rt:
            check_summaries(rt)


# -- M/J5: memory snapshot ------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_memory_checkpoint_killed_anywhere_is_ignored_or_right(
    durable_url: str, tmp_path: Path
) -> None:
    """J5/R7/M: SIGKILL at random points of a remember-and-checkpoint loop: the snapshot verifies
    and memory holds exactly the facts the journal remembered."""
    for n, delay in enumerate(_delays(41, 3, 0.01, 0.3)):
        work = tmp_path / f"k{n}"
        work.mkdir()
        kill_after({"url": durable_url, "mode": "checkpoint"}, work, delay)
        check_journal(durable_url)
        with journaled.open(durable_url) as rt:
            remembered = {
                e.data.fact_id  # type: ignore[attr-defined]
                for e in rt.journal.read()
                if e.kind == "memory.fact-remembered"
            }
            assert {f.id for f in rt.memory.all()} == remembered
            assert remembered
            hits = rt.memory.search("checkpointed fact number 0")
            assert hits
            assert hits[0].text.startswith("checkpointed fact")


# -- O5/R5: an orchestration killed mid-replan ----------------------------------------------------


def _check_orchestration(rt: journaled.Runtime, resume: bool = True) -> None:
    (orch,) = [s for s in rt.runs.list() if s.kind == "orchestration.started"]
    check_summaries(rt)
    if resume:
        outcome = rt.resume(orch, planner=planner)
        assert isinstance(outcome, journaled.Outcome)
        assert outcome.status == "completed", outcome
    assert rt.runs.summary(orch).status == "completed"
    passes = [s for s in rt.runs.list() if s.orchestration == orch]
    assert len(passes) == 2, passes
    assert [p.status for p in passes] == ["failed", "completed"]
    check_summaries(rt)


@pytest.mark.timeout(60)
def test_orchestration_killed_in_its_replan_resumes_to_one_new_pass(
    durable_url: str, tmp_path: Path
) -> None:
    """O5/R5/R7: SIGKILL while the planner replans after a failed pass: the next process lists it
    as a fold does, resumes it to a second pass that completes, and no pass is doubled."""
    marker = tmp_path / "replanning"
    kill_at_marker(
        {"url": durable_url, "mode": "orchestrate"},
        tmp_path,
        marker,
        {"PROBE_BLOCK_REPLAN": str(marker)},
    )
    check_journal(durable_url)
    with journaled.open(durable_url) as rt:
        register(rt)
        _check_orchestration(rt)
    check_journal(durable_url)


@pytest.mark.timeout(60)
def test_orchestration_killed_anywhere_around_its_replan_resumes(
    sqlite_url: str, tmp_path: Path
) -> None:
    """O5/R5/R7: SIGKILL at random points of an orchestration that fails, replans and completes:
    the next process resumes it (or finds it completed) with one failed and one completed pass."""
    for n, delay in enumerate(_delays(43, 4, 0.001, 0.15)):
        url, work = _fresh(sqlite_url, tmp_path, n)
        kill_after({"url": url, "mode": "orchestrate"}, work, delay)
        check_journal(url)
        with journaled.open(url) as rt:
            register(rt)
            found = [s for s in rt.runs.list() if s.kind == "orchestration.started"]
            if not found:
                continue  # killed before it began
            _check_orchestration(rt, resume=found[0].status != "completed")


# -- chosen kill points --------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_run_purge_killed_before_its_scrub_is_scrubbed_by_the_next_process(
    durable_url: str, tmp_path: Path
) -> None:
    """R2/M10: SIGKILL after a run purge commits, before its scrub: the next process, only
    opened and closed, leaves no purged text in any table or file."""
    runs = _finished_runs(durable_url, 1, "scrub")
    marker = tmp_path / "scrub"
    cfg = {"url": durable_url, "mode": "run_purge", "items": list(runs)}
    kill_at_marker({**cfg, "point": "before_scrub", "marker": str(marker)}, tmp_path, marker, {})
    check_journal(durable_url)
    assert tables_holding(durable_url, list(runs.values())) == set()
    with journaled.open(durable_url) as rt:
        assert [rt.runs.summary(r).status for r in runs] == ["purged"]
        check_summaries(rt)
    raw = file_bytes(durable_url)
    assert [m for m in runs.values() if m.encode() in raw] == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("point", "child_left"),
    [("before_child_cancelled", "waiting_for_input"), ("after_child_cancelled", "cancelled")],
)
def test_a_cancel_of_a_waiting_parent_killed_midway_keeps_the_parent_cancelled(
    durable_url: str, tmp_path: Path, point: str, child_left: str
) -> None:
    """E5/E9/R5 (ADR 0079): SIGKILL while a cancel at rest ends a waiting parent and then its
    waiting child: the parent is cancelled whichever way (no answer carries it on), and a new
    cancel ends a child it left waiting."""
    with journaled.open(durable_url) as rt:
        register(rt)
        parent = rt.execute(Plan(goal="parent", steps=[Step("p", agent="nested")]))
        assert parent.waiting == ["p"]
        child = parent.observations[-1].agent_task_id
        assert child is not None
    marker = tmp_path / "child-cancelled"
    cfg = {"url": durable_url, "mode": "cancel", "items": [parent.run_id], "pause_after": child}
    kill_at_marker({**cfg, "point": point, "marker": str(marker)}, tmp_path, marker, {})
    check_journal(durable_url)
    with journaled.open(durable_url) as rt:
        register(rt)
        check_summaries(rt)
        assert rt.runs.summary(parent.run_id).status == "cancelled"
        assert rt.runs.summary(child).status == child_left
        with pytest.raises(journaled.RunNotResumable):
            rt.resume(parent.run_id, answers={"p": "eu"})
        assert rt.cancel(parent.run_id) is (child_left != "cancelled")
        assert rt.runs.summary(parent.run_id).status == "cancelled"
        assert rt.runs.summary(child).status == "cancelled"
        assert rt.cancel(parent.run_id) is False


@pytest.mark.timeout(60)
def test_cancel_of_an_orchestration_at_rest_killed_after_its_pass_is_cancelled_recovers(
    durable_url: str, tmp_path: Path
) -> None:
    """E5/O5/R5: SIGKILL after a cancel at rest ended an orchestration's waiting pass, before the
    orchestration: it lists as a fold does, and a new cancel ends it failed."""
    with journaled.open(durable_url) as rt:
        register(rt)
        outcome = rt.orchestrate("budget goal", budget_planner, call_budget=1, partial=True)
        assert outcome.status == "waiting_for_budget", outcome
        (orch,) = [s for s in rt.runs.list() if s.kind == "orchestration.started"]
        assert orch.current_run is not None
        pass_run = orch.current_run
    marker = tmp_path / "pass-cancelled"
    cfg = {"url": durable_url, "mode": "cancel", "items": [orch], "pause_after": pass_run}
    kill_at_marker(
        {**cfg, "point": "after_child_cancelled", "marker": str(marker)}, tmp_path, marker, {}
    )
    check_journal(durable_url)
    with journaled.open(durable_url) as rt:
        register(rt)
        check_summaries(rt)
        assert rt.runs.summary(pass_run).status == "cancelled"
        assert rt.cancel(orch) is True
        assert rt.runs.summary(orch).status == "failed"
        check_summaries(rt)


if __name__ == "__main__":
    child_main(sys.argv[1])
