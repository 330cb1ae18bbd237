"""Attack probes: what still goes wrong when the disk holding a SQLite journal fills up
(ADR 0081; SPEC M2, M8, M10, R2, R4, E10, E14, A2, A3, T2, J2).

Each journal lives on a small tmpfs of the test's own, filled with a file until the kernel
answers ENOSPC, as tests/test_disk_full.py does.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from full_disk import FillingEcho, fill, mounted, needs_mount

import journaled
from journaled import JournalFull, Plan, Step
from journaled.testing import wait_for

WAIT = 30.0


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """Mount a 4 MiB tmpfs for one test; unmount it after."""
    with mounted(tmp_path / "disk") as where:
        yield where


@pytest.fixture
def big_disk(tmp_path: Path) -> Iterator[Path]:
    """Mount a 24 MiB tmpfs for one test (room for a thousand events); unmount it after."""
    with mounted(tmp_path / "disk", "24m") as where:
        yield where


def url_on(disk: Path) -> str:
    return f"sqlite:///{disk / 'journal.sqlite'}"


def lock_free(disk: Path) -> bool:
    """Tell whether another connection can take SQLite's write lock at once."""
    conn = sqlite3.connect(disk / "journal.sqlite", timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


def echo_plan(n: int = 1, goal: str = "g") -> Plan:
    return Plan(goal=goal, steps=[Step(f"s{i}", tool="echo", input=i) for i in range(n)])


def _echo(value: Any) -> Any:
    return {"echo": value}


@needs_mount
def test_delete_on_a_full_disk_raises_journal_full_and_changes_nothing(disk: Path) -> None:
    """M8, J2: a delete meeting a full disk raises JournalFull; the fact and the chain around
    it are as they were, and once space is freed the same delete heals the chain."""
    with journaled.open(url_on(disk)) as rt:
        a = rt.memory.remember("alpha one", conflict_key="k")
        b = rt.memory.remember("alpha two", conflict_key="k")
        position = rt.journal.position()
        filler = fill(disk)
        with pytest.raises(JournalFull):
            rt.memory.delete(b.id)
        assert rt.journal.position() == position
        assert rt.memory.get(b.id) is not None
        assert rt.memory.get(a.id).superseded_by == b.id  # type: ignore[union-attr]
        assert lock_free(disk)
        filler.unlink()
        deletion = rt.memory.delete(b.id)
        assert deletion.primary
        assert rt.memory.get(b.id) is None
        assert rt.memory.get(a.id).superseded_by is None  # type: ignore[union-attr]


@needs_mount
def test_purge_on_a_full_disk_erases_nothing_half_and_purges_once_freed(disk: Path) -> None:
    """M10, R2, J2: a purge meeting a full disk raises JournalFull saying the fact was not
    purged; the fact is whole (text, history), and once space is freed the purge erases it."""
    url = url_on(disk)
    with journaled.open(url) as rt:
        fact = rt.memory.remember("the vault code is marigold-4471")
        for i in range(5):
            rt.memory.remember(f"filler fact {i}")
        position = rt.journal.position()
        filler = fill(disk)
        with pytest.raises(JournalFull) as caught:
            rt.memory.purge(fact.id, reason="asked to forget")
        assert "nothing was stored" in str(caught.value)
        assert rt.journal.position() == position
        assert rt.memory.get(fact.id) == fact
        assert "purged" not in rt.memory.why(fact.id)
        assert lock_free(disk)
        filler.unlink()
        assert rt.memory.purge(fact.id, reason="asked to forget") is True
        assert rt.memory.get(fact.id) is None
        rt.memory.scrub(timeout=5)
    raw = b"".join(p.read_bytes() for p in disk.iterdir() if p.is_file())
    assert b"marigold-4471" not in raw
    with journaled.open(url) as rt:
        assert rt.journal.verify().ok
        assert "purged" in rt.memory.why(fact.id)


@needs_mount
def test_reads_answer_on_a_full_disk(disk: Path) -> None:
    """T2, M6, M12, R7: with nothing writable, runs.list, runs.why, runs.at, memory.search,
    memory.as_of and journal.verify answer as before the disk filled."""
    with journaled.open(url_on(disk)) as rt:
        rt.register_tool("echo", _echo)
        facts = [rt.memory.remember(f"note about apples {i}") for i in range(10)]
        runs = [rt.execute(echo_plan(3, goal=f"goal {i}")) for i in range(12)]
        middle = rt.journal.position() // 2

        def answers() -> tuple[object, ...]:
            return (
                [(r, r.status) for r in rt.runs.list()],
                rt.runs.why(runs[0].run_id),
                rt.runs.at(runs[0].run_id, rt.journal.position()),
                rt.memory.search("apples"),
                rt.memory.as_of(position=middle).all(),
            )

        before = answers()
        filler = fill(disk)
        assert answers() == before
        assert rt.journal.verify().ok
        assert len(rt.memory.all()) == len(facts)
        filler.unlink()


def _read(query: str, ctx: Any) -> list[str]:
    return [f.text for f in ctx.memory.search(query)]


def _asking(step: Step, ctx: Any) -> journaled.AgentResult:
    if ctx.answer is None:
        raise journaled.NeedsInput("which colour?")
    return journaled.AgentResult(ok=True, output=ctx.answer)


@needs_mount
def test_run_writes_at_rest_on_a_full_disk_raise_journal_full_and_work_once_freed(
    disk: Path,
) -> None:
    """R2, F1, P4, E5, E10: runs.purge, runs.fork, runs.refresh, cancel of a run at rest and
    resume with answers each raise JournalFull on a full disk, append nothing, leave no lock,
    and each works once space is freed."""
    with journaled.open(url_on(disk)) as rt:
        rt.register_tool("echo", _echo)
        rt.register_agent("ask", _asking)
        rt.register_tool("read", _read)
        rt.memory.remember("deploy to eu-west", conflict_key="deploy")
        done = rt.execute(Plan(goal="r", steps=[Step("r", tool="read", input="deploy")]))
        rt.memory.remember("deploy to us-east", conflict_key="deploy")
        assert rt.runs.stale(done.run_id)
        waiting = rt.execute(Plan(goal="w", steps=[Step("q", agent="ask")]))
        assert waiting.waiting == ["q"]
        other = rt.execute(Plan(goal="w2", steps=[Step("q", agent="ask")]))
        position = rt.journal.position()
        filler = fill(disk)
        attempts: dict[str, Callable[[], object]] = {
            "purge": lambda: rt.runs.purge(done.run_id, "gdpr"),
            "fork": lambda: rt.runs.fork(done.run_id),
            "refresh": lambda: rt.runs.refresh(done.run_id),
            "cancel": lambda: rt.cancel(other.run_id),
            "resume": lambda: rt.resume(waiting.run_id, answers={"q": "blue"}),
        }
        outcomes: dict[str, str] = {}
        for name, attempt in attempts.items():
            try:
                outcomes[name] = repr(attempt())
            except Exception as exc:
                outcomes[name] = type(exc).__name__
        assert outcomes == dict.fromkeys(attempts, "JournalFull")
        assert rt.journal.position() == position
        assert lock_free(disk)
        assert rt.runs.summary(waiting.run_id).status == "waiting_for_input"
        assert rt.runs.summary(other.run_id).status == "waiting_for_input"
        filler.unlink()
        result = rt.resume(waiting.run_id, answers={"q": "blue"})
        assert isinstance(result, journaled.ExecuteResult)
        assert result.ok
        assert rt.cancel(other.run_id) is True
        assert rt.runs.fork(done.run_id) != done.run_id
        assert rt.runs.refresh(done.run_id) != done.run_id
        assert rt.runs.purge(done.run_id, "gdpr") >= 1
        assert rt.journal.verify().ok


@needs_mount
def test_an_approval_on_a_full_disk_raises_journal_full_and_approves_once_freed(
    disk: Path,
) -> None:
    """O3, E14: resume(approve=True) of an orchestration waiting for approval raises
    JournalFull on a full disk, runs nothing, and approves and runs once space is freed."""
    ran: list[int] = []

    def echo(value: int) -> int:
        ran.append(value)
        return value

    def planner(goal: str, observations: object, clarifications: object) -> Plan:
        return Plan(goal=goal, steps=[Step("e", tool="echo", input=1)])

    with journaled.open(url_on(disk)) as rt:
        rt.register_tool("echo", echo)
        waiting = rt.orchestrate("g", planner, require_approval=True)
        assert waiting.status == "waiting_for_approval"
        filler = fill(disk)
        with pytest.raises(JournalFull):
            rt.resume(waiting.run_id, approve=True, planner=planner)
        assert ran == []
        assert rt.runs.summary(waiting.run_id).status == "waiting_for_approval"
        assert lock_free(disk)
        filler.unlink()
        outcome = rt.resume(waiting.run_id, approve=True, planner=planner)
        assert isinstance(outcome, journaled.Outcome)
        assert outcome.status == "completed"
        assert ran == [1]


@needs_mount
def test_a_named_ack_on_a_full_disk_raises_journal_full_and_keeps_the_last(disk: Path) -> None:
    """A3: a named subscription's ack on a full disk raises JournalFull; the stored position
    stays the last one acknowledged, and the same ack is stored once space is freed."""
    url = url_on(disk)
    with journaled.open(url) as rt:
        for i in range(4):
            rt.memory.remember(f"fact {i}")
        sub = rt.journal.subscribe(name="reader")
        first = sub.poll(timeout=5)
        second = sub.poll(timeout=5)
        assert first is not None
        assert second is not None
        sub.ack(first.position)
        filler = fill(disk)
        with pytest.raises(JournalFull):
            sub.ack(second.position)
        assert sub.acked == first.position
        assert [s.position for s in rt.journal.subscriptions()] == [first.position]
        assert lock_free(disk)
        filler.unlink()
        sub.ack(second.position)
        sub.close()
    with journaled.open(url) as rt:
        assert [s.position for s in rt.journal.subscriptions()] == [second.position]


@needs_mount
def test_a_checkpoint_on_a_full_disk_raises_journal_full_and_memory_goes_on(disk: Path) -> None:
    """M2, J2: memory.checkpoint() on a full disk raises JournalFull; memory keeps answering,
    and once space is freed both a checkpoint and a remember are stored."""
    with journaled.open(url_on(disk)) as rt:
        kept = [rt.memory.remember(f"fact {i} " + "w" * 200) for i in range(30)]
        filler = fill(disk)
        with pytest.raises(JournalFull):
            rt.memory.checkpoint()
        assert {f.id for f in rt.memory.all()} == {f.id for f in kept}
        assert lock_free(disk)
        filler.unlink()
        assert rt.memory.checkpoint() is True
        rt.memory.remember("after")
        assert len(rt.memory.all()) == len(kept) + 1


@needs_mount
def test_a_close_on_a_full_disk_closes_and_the_journal_reopens_whole(big_disk: Path) -> None:
    """R3, T2: on a full disk, runs.list answers with its projection due to be stored, and
    closing (memory's snapshot and the projection both due) returns promptly with every actor
    stopped; once space is freed the journal reopens with every fact and run, and verifies."""
    import time

    disk = big_disk
    url = url_on(disk)
    rt = journaled.open(url)
    try:
        rt.register_tool("echo", _echo)
        facts = [rt.memory.remember(f"fact {i}", conflict_key=f"k{i % 50}") for i in range(520)]
        runs = [rt.execute(echo_plan(100, goal=f"g{i}")).run_id for i in range(6)]
        assert rt.journal.position() > 1100
        filler = fill(disk)
        assert [str(r) for r in rt.runs.list()] == runs  # its projection due, unwritable
    finally:
        began = time.monotonic()
        rt.close()
        took = time.monotonic() - began
    assert took < 5
    filler.unlink()
    with journaled.open(url) as rt:
        assert rt.journal.verify().ok
        assert len(rt.memory.all()) == len(facts)
        assert [str(r) for r in rt.runs.list()] == runs


class Tiny:
    """A deterministic embedder: letter counts of a text, with a model name (file cache)."""

    model = "tiny-1"

    def __init__(self) -> None:
        self.calls = 0

    def embed(self, texts: list[str]) -> list[list[float]]:
        self.calls += 1
        return [[float(t.lower().count(c)) + 0.01 for c in "aeiourst"] for t in texts]


@needs_mount
def test_a_semantic_search_on_a_full_disk_answers_as_with_space(disk: Path) -> None:
    """M7: with an embedder and its file cache beside the journal, a semantic search on a full
    disk (the cache unwritable) answers exactly as the same search once space is freed."""
    tiny = Tiny()
    with journaled.open(url_on(disk), embedder=tiny) as rt:
        for i in range(20):
            rt.memory.remember(f"{'sea ' * (i % 5)}{'tree ' * (i % 3)} item {i}")
        filler = fill(disk)
        full = [f.id for f in rt.memory.search_semantic("sea sea sea", limit=5)]
        filler.unlink()
        freed = [f.id for f in rt.memory.search_semantic("sea sea sea", limit=5)]
        assert full == freed
        assert full != [f.id for f in rt.memory.search("sea sea sea", limit=5)]  # not BM25


@needs_mount
def test_vectors_embedded_on_a_full_disk_reach_the_file_cache_once_freed(disk: Path) -> None:
    """M7, ADR 0048: fact vectors embedded while the disk was full are written to the file
    cache once space is freed, so a runtime opened later embeds only the query."""
    url = url_on(disk)
    with journaled.open(url, embedder=Tiny()) as rt:
        for i in range(20):
            rt.memory.remember(f"{'sea ' * (i % 5)}{'tree ' * (i % 3)} item {i}")
        filler = fill(disk)
        rt.memory.search_semantic("sea sea sea", limit=5)
        filler.unlink()
        rt.memory.search_semantic("tree tree", limit=5)
    later = Tiny()
    with journaled.open(url, embedder=later) as rt:
        rt.memory.search_semantic("sea sea sea", limit=5)
    assert later.calls == 1  # the query alone


@needs_mount
def test_vectors_held_back_on_a_full_disk_skip_a_fact_another_process_purged(
    disk: Path,
) -> None:
    """R2, M10, ADR 0081 update: vectors a full disk held back are written once it has room,
    after the cache applied the journal's purges: a fact another process purged meanwhile
    reaches neither the file nor a later runtime, and the others are not embedded again."""
    url = url_on(disk)
    with journaled.open(url, embedder=Tiny()) as rt:
        facts = [rt.memory.remember(f"{'sea ' * (i % 5)} item {i}") for i in range(12)]
        filler = fill(disk)
        rt.memory.search_semantic("sea sea sea", limit=5)
        filler.unlink()
        gone = facts[4]
        # The other process searches too, with the same model: the file's position moves past
        # the purge, so no catch-up of this runtime's would read it from there.
        purge = (
            "import sys, journaled\n"
            f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "from test_disk_full_attack import Tiny\n"
            f"with journaled.open({url!r}, embedder=Tiny()) as rt:\n"
            f"    rt.memory.purge({gone.id!r})\n"
            "    rt.memory.search_semantic('sea', limit=5)\n"
        )
        done = subprocess.run([sys.executable, "-c", purge], timeout=WAIT, check=False)
        assert done.returncode == 0
        rt.memory.search_semantic("sea", limit=5)
    with sqlite3.connect(disk / "journal.sqlite.vectors") as db:
        linked = {row[0] for row in db.execute("SELECT fact_id FROM facts")}
    assert linked == {f.id for f in facts} - {gone.id}
    later = Tiny()
    with journaled.open(url, embedder=later) as rt:
        assert gone.id not in {f.id for f in rt.memory.search_semantic("sea", limit=20)}
    assert later.calls == 1  # the query alone


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, JOURNALED_URL=url)
    return subprocess.run(
        [str(Path(__file__).parents[1] / ".venv" / "bin" / "journaled"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )


def _cli_reads(url: str, run: str) -> list[subprocess.CompletedProcess[str]]:
    """Run the reading commands `runs list --json` and `runs why RUN`."""
    return [_cli(url, "runs", "list", "--json"), _cli(url, "runs", "why", run)]


@needs_mount
def test_cli_reads_on_a_full_disk_with_no_runtime_open_say_the_disk_is_full(disk: Path) -> None:
    """T2, J5, ADR 0081: with the journal closed and its disk full, SQLite cannot make the
    shared-memory file a reader needs: `runs list`, `runs why` and `journal verify` fail in one
    line saying the journal is out of space (never "damaged: restore it from a backup"), and
    answer as before once space is freed."""
    url = url_on(disk)
    with journaled.open(url) as rt:
        rt.register_tool("echo", _echo)
        run = rt.execute(echo_plan(2)).run_id
    before = _cli_reads(url, run)
    filler = fill(disk)
    try:
        full = [
            _cli(url, "runs", "list", "--json"),
            _cli(url, "runs", "why", run),
            _cli(url, "journal", "verify"),
        ]
    finally:
        filler.unlink()
    # 1: the command failed; 2: verify could not read the journal (1 is for tampering).
    assert [proc.returncode for proc in full] == [1, 1, 2], [p.stderr for p in full]
    for proc in full:
        assert "is out of space" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
        assert "restore it from a backup" not in proc.stderr, proc.stderr
    after = _cli_reads(url, run)
    assert [(p.returncode, p.stdout) for p in after] == [(0, p.stdout) for p in before]


def _open_and_get(url: str, fact_id: str) -> object:
    """Open the journal and get a fact; "full" when the open raised JournalFull."""
    try:
        with journaled.open(url) as rt:
            return rt.memory.get(fact_id)
    except JournalFull:
        return "full"


@needs_mount
def test_opening_a_journal_on_a_full_disk_is_journal_full_not_damaged(disk: Path) -> None:
    """J5, ADR 0081: opening a sound journal whose disk is full either opens it and reads it,
    or raises JournalFull; never JournalUnreadable telling the operator to restore a backup."""
    url = url_on(disk)
    with journaled.open(url) as rt:
        fact = rt.memory.remember("apples are red")
    filler = fill(disk)
    try:
        opened = _open_and_get(url, fact.id)
    finally:
        filler.unlink()
    # No process holds it open, so SQLite must make its shared-memory file: on a full disk
    # it cannot, and the open says the disk is full.
    assert opened == "full"
    with journaled.open(url) as rt:
        assert rt.journal.verify().ok


@needs_mount
def test_cli_reads_answer_on_a_full_disk_while_a_runtime_is_open(disk: Path) -> None:
    """T2: while a runtime holds the journal open, the command line's reading commands answer
    on a full disk exactly as with space."""
    url = url_on(disk)
    with journaled.open(url) as rt:
        rt.register_tool("echo", _echo)
        run = rt.execute(echo_plan(2)).run_id
        before = _cli_reads(url, run)
        filler = fill(disk)
        after = _cli_reads(url, run)
        verify = _cli(url, "journal", "verify")
        filler.unlink()
    assert [(p.returncode, p.stdout) for p in after] == [(0, p.stdout) for p in before]
    assert verify.returncode == 0, verify.stderr


@needs_mount
def test_a_parallel_run_whose_disk_fills_loses_and_repeats_no_step(disk: Path) -> None:
    """R4, E2, E14: a run with max_parallel_steps=2 whose disk fills mid-run stops with
    JournalFull from its handle; once freed, a resume runs each step not stored exactly once
    and never one whose success was stored."""
    echo = FillingEcho(disk, at=7)
    calls, filled = echo.calls, echo.filled

    with journaled.open(url_on(disk)) as rt:
        rt.register_tool("echo", echo)
        handle = rt.start(echo_plan(16), max_parallel_steps=2)
        with pytest.raises(JournalFull):
            handle.result(timeout=WAIT)
        stored = {int(s.id[1:]) for s in handle.state().plan.steps if s.status == "succeeded"}
        assert 7 not in stored
        assert lock_free(disk)
        filled[0].unlink()
        ran_before = list(calls)
        calls.clear()
        result = rt.resume(handle.run_id)
        assert isinstance(result, journaled.ExecuteResult)
        assert result.ok
        assert sorted(calls) == sorted(set(range(16)) - stored)
        assert set(ran_before) | set(calls) == set(range(16))
        assert rt.journal.verify().ok


@needs_mount
def test_a_waiting_step_whose_disk_fills_still_waits_once_freed(disk: Path) -> None:
    """E10, R4: an agent step that raises NeedsInput while the disk fills stops its run with
    JournalFull; once freed, a resume leaves it waiting and a resume with the answer ends ok."""
    asked: list[str | None] = []

    def ask(step: Step, ctx: Any) -> journaled.AgentResult:
        asked.append(ctx.answer)
        if ctx.answer is None:
            if len(asked) == 1:
                fill(disk)
            raise journaled.NeedsInput("which colour?")
        return journaled.AgentResult(ok=True, output=ctx.answer)

    with journaled.open(url_on(disk)) as rt:
        rt.register_agent("ask", ask)
        rt.register_tool("echo", _echo)
        plan = Plan(
            goal="w",
            steps=[Step("a", tool="echo", input=1), Step("q", agent="ask", depends_on=["a"])],
        )
        handle = rt.start(plan)
        with pytest.raises(JournalFull):
            handle.result(timeout=WAIT)
        (disk / "filler").unlink()
        waiting = rt.resume(handle.run_id)
        assert isinstance(waiting, journaled.ExecuteResult)
        assert waiting.waiting == ["q"]
        assert rt.runs.summary(handle.run_id).status == "waiting_for_input"
        done = rt.resume(handle.run_id, answers={"q": "blue"})
        assert isinstance(done, journaled.ExecuteResult)
        assert done.ok
        assert asked == [None, None, "blue"]


def _scrub_owed_on_a_full_disk(rt: journaled.Runtime, disk: Path) -> Path:
    """Remember a secret (marigold-4471) among filler facts and purge it while a reader holds old
    data (its scrub held off), fill the disk, then let the reader go; return the file that fills
    it."""
    fact = rt.memory.remember("the vault code is marigold-4471")
    for i in range(40):
        rt.memory.remember(f"filler fact {i} " + "z" * 300)
    reader = sqlite3.connect(disk / "journal.sqlite", isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM stored_events").fetchone()
    assert rt.memory.purge(fact.id) is True
    filler = fill(disk)
    reader.execute("COMMIT")
    reader.close()
    return filler


@needs_mount
def test_a_scrub_on_a_full_disk_says_the_disk_is_full_and_scrubs_once_freed(disk: Path) -> None:
    """M10, R2, ADR 0081: a purge committed, its scrub held off by a reader, then the disk fills:
    rt.memory.scrub() raises JournalFull (not ScrubPending blaming a reader, none is left);
    once space is freed the scrub succeeds and the text is gone from every file."""
    url = url_on(disk)
    with journaled.open(url) as rt:
        filler = _scrub_owed_on_a_full_disk(rt, disk)
        try:
            with pytest.raises(JournalFull):
                rt.memory.scrub(timeout=1)
        finally:
            filler.unlink()
        rt.memory.scrub(timeout=5)
        assert rt.memory.scrub_pending is False
        raw = b"".join(p.read_bytes() for p in disk.iterdir() if p.is_file())
        assert b"marigold-4471" not in raw


_OTHER = """
import sys
import journaled
with journaled.open(sys.argv[1]) as rt:
    try:
        fact = rt.memory.remember(sys.argv[2], conflict_key="shared")
    except journaled.JournalFull:
        print("full")
    else:
        print(fact.id)
"""


def _other_process(url: str, text: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _OTHER, url, text],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@needs_mount
def test_a_second_process_appending_on_a_full_disk_stores_nothing_then_once(disk: Path) -> None:
    """J3, M2, ADR 0081: a second process remembering into a journal this runtime holds open,
    on a full disk, gets JournalFull and stores nothing; once freed its remember is stored once
    and this runtime sees it, the supersession included."""

    url = url_on(disk)
    with journaled.open(url, follow=0.1) as rt:
        mine = rt.memory.remember("ours", conflict_key="shared")
        position = rt.journal.position()
        filler = fill(disk)
        assert _other_process(url, "theirs") == "full"
        assert rt.journal.position() == position
        assert lock_free(disk)
        filler.unlink()
        theirs = _other_process(url, "theirs")
        wait_for(lambda: rt.memory.get(theirs) is not None, timeout=WAIT)
        assert [f.text for f in rt.memory.all()] == ["ours", "theirs"]
        assert rt.memory.get(mine.id).superseded_by == theirs  # type: ignore[union-attr]
        assert rt.journal.verify().ok


@needs_mount
def test_concurrent_remembers_on_a_full_disk_all_fail_and_none_is_stored(disk: Path) -> None:
    """M2, M3, J2: remembers from eight threads at once on a full disk (grouped into shared
    commits) each raise JournalFull and store nothing; once freed each is stored exactly once
    and one conflict key ends with exactly one active fact."""
    from concurrent.futures import ThreadPoolExecutor

    with journaled.open(url_on(disk)) as rt:
        rt.memory.remember("seed", conflict_key="k")
        position = rt.journal.position()
        filler = fill(disk)

        def attempt(i: int) -> str:
            try:
                return rt.memory.remember(f"text {i}", conflict_key="k").id
            except JournalFull:
                return "full"

        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(attempt, range(8))) == ["full"] * 8
        assert rt.journal.position() == position
        filler.unlink()
        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(attempt, range(8)))
        assert "full" not in ids
        facts = rt.memory.all()
        assert sorted(f.text for f in facts) == sorted(["seed", *(f"text {i}" for i in range(8))])
        assert len([f for f in facts if f.superseded_by is None]) == 1


@needs_mount
def test_the_asyncio_runtime_raises_journal_full_and_resumes(disk: Path) -> None:
    """A1, A2, ADR 0081: on journaled.aio.open, a remember and an awaited handle meet a full
    disk with JournalFull; once freed, the remember is stored and the run resumes ok."""
    import asyncio

    async def story() -> None:
        echo = FillingEcho(disk, at=3)
        filled = echo.filled

        async with journaled.aio.open(url_on(disk)) as rt:
            rt.register_tool("echo", echo)
            handle = await rt.start(
                Plan(
                    goal="c",
                    steps=[
                        Step(f"s{i}", tool="echo", input=i, depends_on=[f"s{i - 1}"] if i else [])
                        for i in range(6)
                    ],
                )
            )
            with pytest.raises(JournalFull):
                await asyncio.wait_for(handle, WAIT)
            with pytest.raises(JournalFull):
                await rt.memory.remember("while full")
            filled[0].unlink()
            fact = await rt.memory.remember("after")
            result = await asyncio.wait_for(rt.resume(handle.run_id), WAIT)
            assert isinstance(result, journaled.ExecuteResult)
            assert result.ok
            assert [f.id for f in await rt.memory.all()] == [fact.id]

    asyncio.run(asyncio.wait_for(story(), 60))


@needs_mount
def test_an_orchestration_whose_disk_fills_raises_and_resumes_once_freed(disk: Path) -> None:
    """O1, E14, ADR 0081: an orchestration whose pass run meets a full disk fails its caller
    with JournalFull within the wait; once freed, resuming the orchestration completes it and
    no step whose success was stored runs again."""
    import threading

    echo = FillingEcho(disk, at=2)
    calls, filled = echo.calls, echo.filled

    def planner(goal: str, observations: object, clarifications: object) -> Plan:
        return Plan(
            goal=goal,
            steps=[
                Step(f"s{i}", tool="echo", input=i, depends_on=[f"s{i - 1}"] if i else [])
                for i in range(5)
            ],
        )

    with journaled.open(url_on(disk)) as rt:
        rt.register_tool("echo", echo)
        caught: list[BaseException] = []

        def drive() -> None:
            try:
                rt.orchestrate("g", planner)
            except BaseException as exc:
                caught.append(exc)

        driver = threading.Thread(target=drive, daemon=True)
        driver.start()
        driver.join(WAIT)
        assert not driver.is_alive()
        assert [type(e) for e in caught] == [JournalFull]
        filled[0].unlink()
        (orchestration,) = [r for r in rt.runs.list() if r.kind == "orchestration.started"]
        calls.clear()
        outcome = rt.resume(orchestration, planner=planner)
        assert isinstance(outcome, journaled.Outcome)
        assert outcome.status == "completed", outcome
        assert calls == [2, 3, 4]
        assert rt.journal.verify().ok


@needs_mount
def test_a_close_with_a_step_in_flight_on_a_full_disk_leaves_the_run_resumable(
    disk: Path,
) -> None:
    """R3, R4, E14: a runtime closed while a step is in flight and the disk is full returns
    within its drain plus a few seconds; once freed, a new runtime resumes the run, running the
    step in flight again and no stored one."""
    import threading
    import time

    url = url_on(disk)
    release = threading.Event()
    calls: list[int] = []

    def slow(value: int) -> int:
        calls.append(value)
        if value == 1:
            release.wait(WAIT)
        return value

    rt = journaled.open(url)
    rt.register_tool("echo", slow)
    handle = rt.start(
        Plan(
            goal="c",
            steps=[
                Step("s0", tool="echo", input=0),
                Step("s1", tool="echo", input=1, depends_on=["s0"]),
            ],
        )
    )
    wait_for(lambda: calls == [0, 1], timeout=WAIT)  # s1 is in flight
    filler = fill(disk)
    began = time.monotonic()
    try:
        rt.close(drain=0.3)
    finally:
        release.set()
    took = time.monotonic() - began
    assert took < 6, took  # the drain (0.3 s), then the close: never the step's whole wait
    with pytest.raises(JournalFull):  # its suspension could not be stored either
        handle.result(timeout=5)
    filler.unlink()
    calls.clear()
    with journaled.open(url) as rt:
        rt.register_tool("echo", slow)
        result = rt.resume(handle.run_id)
        assert isinstance(result, journaled.ExecuteResult)
        assert result.ok
        assert calls == [1]
        assert rt.journal.verify().ok


@needs_mount
def test_cli_writes_on_a_full_disk_fail_in_one_line(disk: Path) -> None:
    """ADR 0081, T2: `journaled memory remember`, `runs fork` and `runs purge` on a full disk
    exit 1 with one line saying the journal is out of space, never a traceback."""
    url = url_on(disk)
    with journaled.open(url) as rt:
        rt.register_tool("echo", _echo)
        run = rt.execute(echo_plan(2)).run_id
        position = rt.journal.position()
        filler = fill(disk)
        done = [
            _cli(url, "memory", "remember", "pears are green"),
            _cli(url, "runs", "fork", run),
            _cli(url, "runs", "purge", run, "--reason", "gdpr"),
        ]
        filler.unlink()
        assert rt.journal.position() == position
    for p in done:
        assert p.returncode == 1
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1, p.stderr
        assert lines[0].startswith("Error:")
        assert "out of space" in lines[0]


@needs_mount
def test_a_scrub_with_nothing_owed_on_a_full_disk_is_not_scrub_pending(disk: Path) -> None:
    """M10, ADR 0081: with no purge ever made, rt.memory.scrub() on a full disk does not claim
    erased bytes remain: it returns (nothing owed) or raises JournalFull."""
    with journaled.open(url_on(disk)) as rt:
        for i in range(40):
            rt.memory.remember(f"filler fact {i} " + "z" * 300)
        assert rt.memory.scrub_pending is False
        filler = fill(disk)
        try:
            rt.memory.scrub(timeout=0.5)
        except JournalFull:
            pass
        finally:
            filler.unlink()


@needs_mount
def test_a_close_with_a_scrub_owed_on_a_full_disk_says_the_disk_is_full(
    disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """M10, ADR 0081: closing a runtime whose purge is not scrubbed yet, the disk full and no
    reader left, warns that the disk is full, not that a reader holds old data."""
    url = url_on(disk)
    rt = journaled.open(url)
    filler: Path | None = None
    try:
        filler = _scrub_owed_on_a_full_disk(rt, disk)
        assert rt.memory.scrub_pending is True
        with caplog.at_level("WARNING", logger="journaled"):
            rt.close()
    finally:
        if filler is not None:
            filler.unlink()
        rt.close()
    said = [r.getMessage() for r in caplog.records if "erased bytes" in r.getMessage()]
    assert said, "the close warns that erased bytes remain"
    assert all("the disk is full" in m for m in said), said
    assert not any("reader holds old data" in m for m in said), said
    with journaled.open(url) as again:  # space freed: the next runtime scrubs them
        again.memory.scrub(timeout=5)
        assert again.memory.scrub_pending is False
