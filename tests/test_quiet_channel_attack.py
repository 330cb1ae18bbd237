"""ADR 0057 probed: run-only appends notify a quiet channel on PostgreSQL (J3, A3).

Every probe is a test. A second OS process (``_CHILD``) plays runtime B where the question is
another process; it talks to the test through files in a work directory only. Timing checks
wait with long timeouts (20-30 s) and demand an answer well before (10 s), so that only a lost
wake-up, not a slow shared machine, fails them.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import journaled
import journaled.aio
from journaled.cli_follow import follow
from journaled.events.base import Pending
from journaled.events.catalog import NOT_MEMORY, codec
from journaled.events.journal import Journal
from journaled.events.memory import FactRemembered
from journaled.events.runs import RunHeartbeat
from journaled.events.url import parse_url

ROOT = Path(__file__).resolve().parent.parent
LONG = 20.0
"""How long a probe's wait may last: a lost wake-up shows as a wait this long."""
PROMPT = 10.0
"""How soon an answer must come: far below :data:`LONG`, far above a slow machine's delay."""

_CHILD = r"""
import sys, time, pathlib
import journaled

url, work = sys.argv[1], pathlib.Path(sys.argv[2])


def wait_file(name, timeout=90.0):
    end = time.monotonic() + timeout
    while not (work / name).exists():
        if time.monotonic() > end:
            raise SystemExit(f"child: {name} never appeared")
        time.sleep(0.02)


def gate(x):
    wait_file("release")
    return x


def remembering(x, *, ctx):
    ctx.memory.remember(f"stepfact {x['word']}", scope="project")
    return x


def plan(goal, tool, word="w"):
    return journaled.Plan(
        goal=goal,
        steps=[
            journaled.Step("a", tool="echo", input={"word": word}),
            journaled.Step("b", tool=tool, input={"word": word}, depends_on=["a"]),
        ],
    )


with (work / "child.log").open("a", buffering=1) as log:
    with journaled.open(url, follow=None) as rt:
        rt.register_tool("echo", lambda x: x)
        rt.register_tool("gate", gate)
        rt.register_tool("remembering", remembering)
        last_run = last_fact = None
        log.write("ready\n")
        for cmd in sys.argv[3:]:
            op, _, arg = cmd.partition(":")
            if op == "wait":
                wait_file(arg)
            elif op == "plan":
                result = rt.execute(plan("child plan", "echo"))
                assert result.ok, result
                last_run = result.run_id
                log.write(f"run {last_run}\n")
            elif op == "gated":
                handle = rt.runs.start(plan("child gated plan", "gate"))
                log.write(f"started {handle.run_id}\n")
                result = handle.result(120)
                assert result.ok, result
                last_run = result.run_id
                log.write(f"run {last_run}\n")
            elif op == "stepfact":
                result = rt.execute(plan("child step remembers", "remembering", arg))
                assert result.ok, result
                last_run = result.run_id
                log.write(f"run {last_run}\n")
            elif op == "remember":
                last_fact = rt.memory.remember(arg, scope="project").id
                log.write(f"fact {last_fact}\n")
            elif op == "purge-run":
                log.write(f"purged-run {rt.runs.purge(last_run, 'attack pass')}\n")
            elif op == "purge-fact":
                log.write(f"purged-fact {rt.memory.purge(last_fact, 'attack pass')}\n")
            else:
                raise SystemExit(f"child: unknown command {cmd!r}")
    log.write("done\n")
"""


class Child:
    """Runtime B in another OS process, driven by ``op[:arg]`` commands given at start."""

    def __init__(self, url: str, work: Path, *commands: str) -> None:
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, url, str(work), *commands],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def lines(self) -> list[str]:
        path = self.work / "child.log"
        return path.read_text().splitlines() if path.exists() else []

    def line(self, prefix: str, timeout: float = 90.0) -> str:
        """Wait for the log's first line starting with ``prefix``; return what follows it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines():
                if line.startswith(prefix):
                    return line[len(prefix) :].strip()
            if self.proc.poll() is not None and not any(
                line.startswith(prefix) for line in self.lines()
            ):
                out = self.proc.stdout.read() if self.proc.stdout else ""
                pytest.fail(f"child exited ({self.proc.returncode}) before {prefix!r}: {out}")
            time.sleep(0.02)
        pytest.fail(f"child never wrote {prefix!r}: {self.lines()}")

    def touch(self, name: str) -> float:
        (self.work / name).touch()
        return time.monotonic()

    def finish(self, timeout: float = 90.0) -> None:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            pytest.fail(f"child did not finish: {out}")
        assert self.proc.returncode == 0, out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def child_factory(tmp_path: Path) -> Iterator[Callable[..., Child]]:
    children: list[Child] = []

    def make(url: str, *commands: str) -> Child:
        child = Child(url, tmp_path / f"child{len(children)}", *commands)
        children.append(child)
        return child

    yield make
    for child in children:
        child.kill()


def _journal(url: str) -> Journal:
    return Journal(parse_url(url), codec())


def _heartbeat(stream: str) -> Pending:
    return Pending(stream=stream, version=1, data=RunHeartbeat(at=1, owner="x"))


def _fact(stream: str) -> Pending:
    return Pending(
        stream=stream, version=1, data=FactRemembered(at=1, fact_id=stream, scope="project")
    )


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[float]]:
    """Run ``fn`` in a daemon thread; the list gets how long it took once it returns."""
    took: list[float] = []

    def run() -> None:
        start = time.monotonic()
        fn()
        took.append(time.monotonic() - start)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, took


def _prompt(took: list[float]) -> None:
    """Fail unless a wait of :func:`_in_thread` returned, and well before :data:`LONG`."""
    assert took, "the wait never returned"
    assert took[0] < PROMPT, took


def _warm_watcher(journal: Journal) -> None:
    """Start the journal's append watcher and let its first look's bump pass."""
    journal.wait_for_appends(0.5, since=journal.append_mark())
    time.sleep(0.4)


def _backends(url: str, query: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND query = %s",
            [query],
        ).fetchall()
    return [int(r[0]) for r in rows]


def _terminate(url: str, pids: list[int]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s)", [pid])


def _searchable(rt: journaled.Runtime, word: str) -> bool:
    return any(word in f.text for f in rt.memory.search(word))


def _until(condition: Callable[[], bool], timeout: float) -> float | None:
    """Poll ``condition`` (cheaply, in-process) up to ``timeout`` s; return when it held."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if condition():
            return time.monotonic() - start
        time.sleep(0.05)
    return None


# -- subscriptions in runtime A, runs executed by process B --------------------------------------


def test_sync_subscription_sees_another_process_plan_and_fact(
    pg_url: str, child_factory: Callable[..., Child]
) -> None:
    """A3: a subscription in A receives B's run events and B's fact, each poll well in time."""
    with journaled.open(pg_url, follow=None) as rt:
        child = child_factory(pg_url, "wait:go", "plan", "remember:quokka zebra")
        child.line("ready")
        sub = rt.journal.subscribe(after=rt.journal.position())
        kinds: list[str] = []
        child.touch("go")
        deadline = time.monotonic() + 60
        while not ("run.finished" in kinds and "memory.fact-remembered" in kinds):
            assert time.monotonic() < deadline, kinds
            start = time.monotonic()
            event = sub.poll(LONG)
            assert event is not None, f"nothing within {LONG}s; got {kinds}"
            assert time.monotonic() - start < PROMPT
            kinds.append(event.kind)
        sub.close()
        child.finish()
        assert kinds.index("run.started") < kinds.index("run.finished"), kinds


def test_async_subscription_sees_another_process_plan(
    pg_url: str, child_factory: Callable[..., Child]
) -> None:
    """A3 through journaled.aio: the same, awaited on an event loop."""

    async def main() -> list[str]:
        async with journaled.aio.open(pg_url, follow=None) as rt:
            child = child_factory(pg_url, "wait:go", "plan")
            await asyncio.to_thread(child.line, "ready")
            position = await rt.journal.position()
            sub = await rt.journal.subscribe(after=position)
            kinds: list[str] = []
            child.touch("go")
            while "run.finished" not in kinds:
                start = time.monotonic()
                event = await sub.poll(LONG)
                assert event is not None, f"nothing within {LONG}s; got {kinds}"
                assert time.monotonic() - start < PROMPT
                kinds.append(event.kind)
            await sub.aclose()
            await asyncio.to_thread(child.finish)
            return kinds

    kinds = asyncio.run(main())
    assert "run.started" in kinds


def test_marked_wait_wakes_for_another_process_run_commits(
    pg_url: str, child_factory: Callable[..., Child]
) -> None:
    """ADR 0057: a gated run's first commits (run events alone: the quiet channel) wake a wait
    with a mark in A at once; the run is still executing, so no end-of-run commit helps."""
    with journaled.open(pg_url, follow=None) as rt:
        journal = rt._journal
        child = child_factory(pg_url, "wait:go", "gated")
        child.line("ready")
        _warm_watcher(journal)
        before = journal.position()

        def wait() -> None:
            end = time.monotonic() + LONG
            while journal.position() == before and time.monotonic() < end:
                journal.wait_for_appends(end - time.monotonic(), since=journal.append_mark())

        thread, took = _in_thread(wait)
        time.sleep(0.2)
        child.touch("go")
        thread.join(LONG + 10)
        _prompt(took)
        assert journal.position() > before
        assert "run.finished" not in [e.kind for e in journal.read(after=before)]
        child.touch("release")
        child.finish()


def test_runs_follow_settles_promptly_for_a_run_another_process_executes(
    pg_url: str, child_factory: Callable[..., Child]
) -> None:
    """T2: ``journaled runs follow`` (interval 30 s) in A returns the settled run of B at once."""
    with journaled.open(pg_url, follow=None) as rt:
        child = child_factory(pg_url, "gated")
        run_id = child.line("started ")
        assert _until(lambda: rt.runs.summary(run_id) is not None, 30) is not None
        settled: list[Any] = []
        thread, took = _in_thread(
            lambda: settled.append(follow(rt._journal, run_id, 30.0, 60.0, as_json=True))
        )
        time.sleep(1.0)
        released = child.touch("release")
        thread.join(70)
        assert took, "follow never returned"
        assert settled, "follow never returned"
        assert settled[0] is not None
        assert settled[0].status == "completed", settled
        assert time.monotonic() - released < PROMPT + 2, took
        child.finish()


# -- memory in runtime A, facts from process B -------------------------------------------------


def test_follower_makes_another_process_fact_searchable_then_purged_promptly(
    pg_url: str, child_factory: Callable[..., Child]
) -> None:
    """J3: with a 30 s poll, only a notice wakes A's follower: B's fact, then B's purge of it,
    must reach A's memory well within the poll (and B's plan in between must not matter)."""
    with journaled.open(pg_url, follow=30.0) as rt:
        child = child_factory(
            pg_url, "wait:go", "remember:narwhal", "plan", "wait:purge", "purge-fact"
        )
        child.line("ready")
        time.sleep(0.5)
        child.touch("go")
        child.line("fact ")
        assert _until(lambda: _searchable(rt, "narwhal"), PROMPT) is not None
        child.line("run ")
        child.touch("purge")
        assert child.line("purged-fact ") == "True"
        assert _until(lambda: not _searchable(rt, "narwhal"), PROMPT) is not None
        child.finish()


def test_fact_remembered_inside_a_step_of_another_process_is_searchable(
    pg_url: str, child_factory: Callable[..., Child]
) -> None:
    """P1, J3: a fact a step of B remembers through ``ctx.memory`` reaches A's memory at once."""
    with journaled.open(pg_url, follow=30.0) as rt:
        child = child_factory(pg_url, "wait:go", "stepfact:platypus")
        child.line("ready")
        time.sleep(0.5)
        child.touch("go")
        child.line("run ")
        assert _until(lambda: _searchable(rt, "platypus"), PROMPT) is not None
        child.finish()


def test_follower_wakes_for_a_foreign_append_mixing_a_run_and_a_fact(pg_url: str) -> None:
    """ADR 0057: an append of a run's event and a fact goes to the main channel: heard."""
    mine, other = _journal(pg_url), _journal(pg_url)
    try:
        assert not mine.wait_for_foreign(0.05, NOT_MEMORY)  # listening from now on
        thread, took = _in_thread(lambda: mine.wait_for_foreign(LONG, NOT_MEMORY))
        time.sleep(0.3)
        other.append([_heartbeat("run-mixed"), _fact("fact-mixed")])
        thread.join(LONG + 5)
        _prompt(took)
    finally:
        mine.close()
        other.close()


def test_follower_sleeps_through_another_runtimes_plan(pg_url: str) -> None:
    """ADR 0057's aim: another runtime's plan (runs alone, no fact) wakes no memory follower.

    A run's last commit carries its snapshot (RunRecorder.flush(snapshot=True)), and an
    append with snapshots takes the library's path: that path notifies with the journal's note
    and channel too, never the library's bare NOTIFY of the main channel.
    """
    other = journaled.open(pg_url, follow=None)
    mine = _journal(pg_url)
    try:
        other.register_tool("echo", lambda x: x)
        assert not mine.wait_for_foreign(0.05, NOT_MEMORY)  # listening from now on
        plan = journaled.Plan(
            goal="runs alone",
            steps=[
                journaled.Step("a", tool="echo", input={"n": 1}),
                journaled.Step("b", tool="echo", input={"n": 2}, depends_on=["a"]),
            ],
        )
        assert other.execute(plan).ok
        woken = mine.wait_for_foreign(1.5, NOT_MEMORY)
        assert not woken, "a follower was woken by another runtime's plan of runs alone"
    finally:
        mine.close()
        other.close()


def test_run_purge_by_another_process_reaches_a_subscription_and_reads(
    pg_url: str, child_factory: Callable[..., Child]
) -> None:
    """R2: B purges its run; A's subscription gets run.purged promptly, A reads it purged."""
    with journaled.open(pg_url, follow=None) as rt:
        child = child_factory(pg_url, "plan", "wait:go", "purge-run")
        run_id = child.line("run ")
        sub = rt.journal.subscribe(after=rt.journal.position())
        assert sub.poll(0.5) is None
        child.touch("go")
        kinds: list[str] = []
        while "run.purged" not in kinds:
            start = time.monotonic()
            event = sub.poll(LONG)
            assert event is not None, kinds
            assert time.monotonic() - start < PROMPT
            kinds.append(event.kind)
        sub.close()
        assert int(child.line("purged-run ")) > 0
        child.finish()
        assert rt.runs.state(run_id).purged is not None


def test_a_foreign_run_purge_reaches_time_travel_in_a(
    pg_url: str, child_factory: Callable[..., Child]
) -> None:
    """R2, ADR 0034: B purges a run that A has read as of a past position (so A holds it in
    its checkpoint cache); A's next read as of that position must not show the erased goal."""
    with journaled.open(pg_url, follow=None) as rt:
        child = child_factory(pg_url, "plan", "wait:go", "purge-run")
        run_id = child.line("run ")
        end = rt.journal.position()
        for _ in range(2):  # the first read folds plainly, the next builds checkpoints
            assert rt.runs.at(run_id, end).plan.goal == "child plan"
        child.touch("go")
        assert int(child.line("purged-run ")) > 0
        child.finish()
        assert rt.runs.state(run_id).purged is not None  # the journal says purged
        with journaled.open(pg_url, follow=None) as fresh:
            assert fresh.runs.at(run_id, end).plan.goal != "child plan"
        assert rt.runs.at(run_id, end).plan.goal != "child plan"


# -- wait_for_appends without a mark -------------------------------------------------------------


def test_unmarked_wait_wakes_for_a_foreign_run_append(pg_url: str) -> None:
    """ADR 0057: ``wait_for_appends`` without a mark listens on both channels."""
    mine, other = _journal(pg_url), _journal(pg_url)
    try:
        mine.wait_for_appends(0.05)  # listening from now on
        thread, took = _in_thread(lambda: mine.wait_for_appends(LONG))
        time.sleep(0.3)
        other.append([_heartbeat("run-unmarked")])
        thread.join(LONG + 5)
        _prompt(took)
    finally:
        mine.close()
        other.close()


# -- dropped listener connections ----------------------------------------------------------------


def test_a_marked_waiter_wakes_after_its_watcher_backend_is_terminated(pg_url: str) -> None:
    """J3: the watcher's connection is terminated while a wait with a mark is in progress; a
    foreign run append afterwards must still end that wait well before its timeout.

    A watcher that fails bumps the mark as it ends (after a pause), so the waiter wakes and
    its next wait starts another watcher; it does not sleep out its whole timeout.
    """
    mine, other = _journal(pg_url), _journal(pg_url)
    try:
        _warm_watcher(mine)
        pids = _backends(pg_url, 'LISTEN "journaled_events_quiet"')
        assert len(pids) == 1, pids
        thread, took = _in_thread(lambda: mine.wait_for_appends(LONG, since=mine.append_mark()))
        time.sleep(0.3)
        _terminate(pg_url, pids)
        time.sleep(1.0)
        other.append([_heartbeat("run-after-kill")])
        thread.join(LONG + 5)
        _prompt(took)
    finally:
        mine.close()
        other.close()


def test_the_watcher_recovers_after_its_backend_is_terminated(pg_url: str) -> None:
    """J3: after the watcher's backend was terminated, the next wait hears a run append."""
    mine, other = _journal(pg_url), _journal(pg_url)
    try:
        _warm_watcher(mine)
        _terminate(pg_url, _backends(pg_url, 'LISTEN "journaled_events_quiet"'))
        time.sleep(1.0)  # the watcher has noticed and ended
        mine.wait_for_appends(1.0, since=mine.append_mark())  # the dying watcher's wait
        _warm_watcher(mine)
        assert len(_backends(pg_url, 'LISTEN "journaled_events_quiet"')) == 1
        before = mine.position()

        def wait() -> None:
            end = time.monotonic() + LONG
            while mine.position() == before and time.monotonic() < end:
                mine.wait_for_appends(end - time.monotonic(), since=mine.append_mark())

        thread, took = _in_thread(wait)
        time.sleep(0.3)
        other.append([_heartbeat("run-recovered")])
        thread.join(LONG + 5)
        _prompt(took)
    finally:
        mine.close()
        other.close()


def test_follower_recovers_after_its_listener_is_terminated(
    pg_url: str, child_factory: Callable[..., Child]
) -> None:
    """J3: A's follower (30 s poll) loses its listening connection; B's next fact still
    reaches A's memory promptly."""
    with journaled.open(pg_url, follow=30.0) as rt:
        child = child_factory(pg_url, "wait:go", "remember:axolotl")
        child.line("ready")
        time.sleep(0.5)
        pids = _backends(pg_url, 'LISTEN "journaled_events"')
        assert len(pids) == 1, pids
        _terminate(pg_url, pids)
        time.sleep(1.5)
        assert len(_backends(pg_url, 'LISTEN "journaled_events"')) == 1  # listening again
        child.touch("go")
        child.line("fact ")
        assert _until(lambda: _searchable(rt, "axolotl"), PROMPT) is not None
        child.finish()


# -- close() while a waiter waits ----------------------------------------------------------------


def test_close_releases_a_marked_waiter(pg_url: str) -> None:
    """ADR 0026: close() ends a wait with a mark at once, and returns at once."""
    mine = _journal(pg_url)
    _warm_watcher(mine)
    thread, took = _in_thread(lambda: mine.wait_for_appends(LONG, since=mine.append_mark()))
    time.sleep(0.3)
    start = time.monotonic()
    mine.close()
    closed = time.monotonic() - start
    thread.join(LONG + 5)
    assert closed < PROMPT, closed
    _prompt(took)


def test_close_does_not_wait_out_wait_for_foreign(pg_url: str) -> None:
    """close() while wait_for_foreign waits must not wait for that wait's whole timeout.

    wait_for_foreign holds ``_listen_lock`` while it listens, and close() takes the same lock
    to drop the listeners: it listens in slices and ends its wait once the journal is closed.
    """
    mine = _journal(pg_url)
    assert not mine.wait_for_foreign(0.05, NOT_MEMORY)
    thread, _ = _in_thread(lambda: mine.wait_for_foreign(LONG, NOT_MEMORY))
    time.sleep(0.3)
    start = time.monotonic()
    mine.close()
    closed = time.monotonic() - start
    thread.join(LONG + 5)
    assert closed < PROMPT, closed


def test_close_does_not_wait_out_an_unmarked_wait(pg_url: str) -> None:
    """close() while wait_for_appends (no mark) waits must not wait for its whole timeout.

    The same ``_listen_lock``, over the second listening connection (``_listener_all``).
    """
    mine = _journal(pg_url)
    mine.wait_for_appends(0.05)
    thread, _ = _in_thread(lambda: mine.wait_for_appends(LONG))
    time.sleep(0.3)
    start = time.monotonic()
    mine.close()
    closed = time.monotonic() - start
    thread.join(LONG + 5)
    assert closed < PROMPT, closed


# -- other backends, and wait_for_foreign's refusal ----------------------------------------------


def test_sqlite_subscription_sees_another_runtimes_plan(sqlite_url: str) -> None:
    """A3 on SQLite (unaffected): a subscription in A sees B's plan, each poll in time."""
    with journaled.open(sqlite_url, follow=None) as a, journaled.open(sqlite_url, follow=None) as b:
        b.register_tool("echo", lambda x: x)
        sub = a.journal.subscribe(after=a.journal.position())
        assert sub.poll(0.3) is None
        plan = journaled.Plan(goal="g", steps=[journaled.Step("a", tool="echo", input={"n": 1})])
        thread, _ = _in_thread(lambda: b.execute(plan))
        kinds: list[str] = []
        while "run.finished" not in kinds:
            start = time.monotonic()
            event = sub.poll(LONG)
            assert event is not None, kinds
            assert time.monotonic() - start < PROMPT
            kinds.append(event.kind)
        thread.join(30)
        sub.close()


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_wait_for_foreign_elsewhere_waits_and_says_poll(backend: str, tmp_path: Path) -> None:
    """Off PostgreSQL, wait_for_foreign waits its timeout and returns True, as before."""
    url = "memory://" if backend == "memory" else f"sqlite:///{tmp_path / 'j.sqlite'}"
    journal = _journal(url)
    try:
        start = time.monotonic()
        assert journal.wait_for_foreign(0.2, NOT_MEMORY) is True
        assert time.monotonic() - start >= 0.15
    finally:
        journal.close()


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_wait_for_foreign_elsewhere_accepts_any_prefixes(backend: str, tmp_path: Path) -> None:
    """Off PostgreSQL there is no quiet channel, so no prefixes can miss anything.

    There is no quiet channel off PostgreSQL: any prefixes are accepted there, as before.
    """
    url = "memory://" if backend == "memory" else f"sqlite:///{tmp_path / 'j.sqlite'}"
    journal = _journal(url)
    try:
        assert journal.wait_for_foreign(0.01, ()) is True
    finally:
        journal.close()


def test_wait_for_foreign_refuses_prefixes_that_miss_a_quiet_family(pg_url: str) -> None:
    """ADR 0057: prefixes missing ``run.`` or ``orchestration.`` are refused; more are fine."""
    journal = _journal(pg_url)
    try:
        for prefixes in [(), ("run.",), ("orchestration.",), ("memory.",)]:
            with pytest.raises(ValueError, match="skip_prefixes must cover"):
                journal.wait_for_foreign(0.01, prefixes)
        assert not journal.wait_for_foreign(0.01, [*NOT_MEMORY, "memory.superseded"])
    finally:
        journal.close()


def test_wait_for_foreign_accepts_prefixes_that_cover_the_quiet_families(pg_url: str) -> None:
    """Prefixes are matched by ``startswith``: ``("run", "orchestration")`` skip exactly what
    ``NOT_MEMORY`` skips, so nothing can be missed.

    Prefixes match by ``startswith``, so ``("run", "orchestration")`` covers them.
    """
    journal = _journal(pg_url)
    try:
        assert not journal.wait_for_foreign(0.01, ("run", "orchestration"))
    finally:
        journal.close()
