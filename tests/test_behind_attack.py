"""Attacks by a runtime that is behind on the journal (J3, M3, M8, M10, R2, E14, F1, P3, P4).

Runtime B is opened before runtime A (another runtime of this process, or another process)
appends; B does not follow (``follow=None``) unless a probe says otherwise, so what it folded is
exactly what it saw when it opened, until a write conflict or ``rt.refresh()``. B then acts on
what it last saw. Each probe checks the record: the events, every storage cell of the journal's
database, and what a fresh runtime folds from the journal.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pykka
import pytest

import journaled
from journaled import AgentResult, Plan, Step
from journaled.actors import run_erasure
from journaled.actors.errors import ActorTimeout
from journaled.events.errors import ConcurrencyConflict
from journaled.events.memory import (
    FactDeleted,
    FactPurged,
    FactSuperseded,
)
from journaled.testing import ManualClock, wait_for

MARKER = "wombatquasar"
"""A word in a purged text: searched for in every storage cell afterwards."""


# -- helpers ---------------------------------------------------------------------------------------


def _script(url: str, body: str) -> str:
    """Return a script that opens a runtime on ``url`` as ``rt`` and runs ``body``."""
    head = textwrap.dedent(
        f"""
        import sys, time, json
        import journaled
        from journaled import Plan, Step, AgentResult
        url = {url!r}
        """
    )
    return head + textwrap.dedent(body)


def _other_process(url: str, body: str, timeout: float = 60.0) -> str:
    """Run ``body`` in another Python process (``url`` bound); return its stdout, or fail."""
    done = subprocess.run(
        [sys.executable, "-c", _script(url, body)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _cells(value: object) -> Iterator[bytes]:
    """Yield a stored value as bytes, and its zlib-inflated form when it is a zlib stream."""
    if value is None:
        return
    if isinstance(value, memoryview):
        value = value.tobytes()
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogatepass")
    if not isinstance(value, bytes):
        value = str(value).encode("utf-8")
    yield value
    if value[:1] == b"\x78":
        with contextlib.suppress(zlib.error):
            yield zlib.decompress(value)


def _stored_anywhere(url: str, marker: str) -> list[str]:
    """Return every table (and, for SQLite, file) whose stored cells hold ``marker``."""
    needle = marker.encode("utf-8")
    where: list[str] = []
    if url.startswith("postgresql"):
        with psycopg.connect(url) as conn:
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT quote_ident(schemaname) || '.' || quote_ident(tablename)"
                    " FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
                ).fetchall()
            ]
            for table in tables:
                for row in conn.execute(f"SELECT * FROM {table}").fetchall():  # noqa: S608
                    if any(needle in cell for value in row for cell in _cells(value)):
                        where.append(table)
                        break
        return where
    path = Path(url.removeprefix("sqlite:///").partition("?")[0])
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for row in db.execute(f'SELECT * FROM "{table}"'):  # noqa: S608
                if any(needle in cell for value in row for cell in _cells(value)):
                    where.append(table)
                    break
    return where


def _facts(rt: journaled.Runtime) -> dict[str, tuple[str | None, tuple[str, ...]]]:
    """Return every fact's (superseded_by, supersedes), by id."""
    return {f.id: (f.superseded_by, tuple(sorted(f.supersedes))) for f in rt.memory.all()}


def _events_of(rt: journaled.Runtime, kind: type) -> list[Any]:
    """Return the data of every journal event of one kind, in order."""
    return [e.data for e in rt.journal.read() if isinstance(e.data, kind)]


@pytest.fixture
def pair(durable_url: str) -> Iterator[tuple[journaled.Runtime, journaled.Runtime]]:
    """Yield (A, B) on one durable journal; B does not follow (it is behind until it conflicts)."""
    clock = ManualClock(start=1_700_000_000_000, step=1)
    with (
        journaled.open(durable_url, clock=clock, follow=None) as a,
        journaled.open(durable_url, clock=clock, follow=None) as b,
    ):
        yield a, b


# -- memory: B writes on what it last saw ----------------------------------------------------------


def test_behind_remember_supersedes_the_new_holder_of_the_key_once(
    pair: tuple[journaled.Runtime, journaled.Runtime],
) -> None:
    """M3/J3: B, behind A's supersession of f0 by f1, remembers f2 on the key: f2 supersedes f1
    alone and f0 is superseded exactly once."""
    a, b = pair
    f0 = a.memory.remember("port is 1", conflict_key="port")
    b.refresh()
    f1 = a.memory.remember("port is 2", conflict_key="port")
    f2 = b.memory.remember("port is 3", conflict_key="port")
    assert f2.supersedes == (f1.id,)
    superseded = [(e.fact_id, e.by) for e in _events_of(a, FactSuperseded)]
    assert superseded == [(f0.id, f1.id), (f1.id, f2.id)]
    a.refresh()
    for rt in (a, b):
        active = [f.id for f in rt.memory.all() if f.superseded_by is None]
        assert active == [f2.id]


def test_behind_remember_after_a_delete_restores_nothing_twice(
    pair: tuple[journaled.Runtime, journaled.Runtime],
) -> None:
    """M3/M8/J3: A deletes f1 (restoring f0); B, behind, remembers f2 on the key: f2 supersedes
    f0 (active again), never the deleted f1."""
    a, b = pair
    f0 = a.memory.remember("port is 1", conflict_key="port")
    f1 = a.memory.remember("port is 2", conflict_key="port")
    b.refresh()
    assert a.memory.delete(f1.id).primary
    f2 = b.memory.remember("port is 3", conflict_key="port")
    assert f2.supersedes == (f0.id,)
    assert b.memory.get(f1.id) is None
    with journaled.open(a.journal.url, follow=None) as c:
        assert _facts(c) == _facts(b)
        assert _facts(c)[f0.id] == (f2.id, ())


def test_behind_remember_after_a_purge_supersedes_nothing(
    pair: tuple[journaled.Runtime, journaled.Runtime],
) -> None:
    """M3/M10: A purges the key's only fact; B, behind, remembers on the key: it supersedes
    nothing and the purged fact stays gone."""
    a, b = pair
    f0 = a.memory.remember(f"the {MARKER} port is 1", conflict_key="port")
    b.refresh()
    assert a.memory.purge(f0.id, reason="asked")
    f1 = b.memory.remember("port is 2", conflict_key="port")
    assert f1.supersedes == ()
    assert b.memory.get(f0.id) is None
    assert [e.fact_id for e in _events_of(a, FactSuperseded)] == []


def test_behind_delete_of_a_deleted_fact_is_unknown(
    pair: tuple[journaled.Runtime, journaled.Runtime],
) -> None:
    """M8/J3: B deletes a fact A already deleted: (False, 0), and one deletion in the journal."""
    a, b = pair
    f0 = a.memory.remember("a fact to delete")
    b.refresh()
    assert a.memory.delete(f0.id).primary
    gone = b.memory.delete(f0.id)
    assert (gone.primary, gone.relationships) == (False, 0)
    assert [e.fact_id for e in _events_of(a, FactDeleted)] == [f0.id]


def test_behind_delete_of_a_fact_superseded_meanwhile_strips_the_superseder(
    pair: tuple[journaled.Runtime, journaled.Runtime],
) -> None:
    """M8/J3: A supersedes f0 by f1; B, behind, deletes f0: f1 no longer lists f0 and counts as
    one relationship."""
    a, b = pair
    f0 = a.memory.remember("port is 1", conflict_key="port")
    b.refresh()
    f1 = a.memory.remember("port is 2", conflict_key="port")
    gone = b.memory.delete(f0.id)
    assert (gone.primary, gone.relationships) == (True, 1)
    with journaled.open(a.journal.url, follow=None) as c:
        assert _facts(c) == {f1.id: (None, ())}
        assert _facts(b) == _facts(c)


def test_behind_delete_of_the_middle_of_a_chain_heals_it(
    pair: tuple[journaled.Runtime, journaled.Runtime],
) -> None:
    """M8/J3: f0 <- f1 and A then supersedes f1 by f2; B, behind, deletes f1: f0 <- f2."""
    a, b = pair
    f0 = a.memory.remember("port is 1", conflict_key="port")
    f1 = a.memory.remember("port is 2", conflict_key="port")
    b.refresh()
    f2 = a.memory.remember("port is 3", conflict_key="port")
    assert b.memory.delete(f1.id).primary
    with journaled.open(a.journal.url, follow=None) as c:
        assert _facts(c) == {f0.id: (f2.id, ()), f2.id: (None, (f0.id,))}
        assert _facts(b) == _facts(c)


def test_behind_purge_of_a_purged_fact_is_false_and_appends_nothing(
    pair: tuple[journaled.Runtime, journaled.Runtime],
) -> None:
    """M10/J3: B purges a fact A already purged: False, and one purge event in the journal."""
    a, b = pair
    f0 = a.memory.remember(f"the {MARKER} is here")
    b.refresh()
    assert a.memory.purge(f0.id, reason="first")
    assert b.memory.purge(f0.id, reason="second") is False
    assert [e.fact_id for e in _events_of(a, FactPurged)] == [f0.id]


def test_behind_purge_of_a_deleted_fact_erases_the_text_once(
    pair: tuple[journaled.Runtime, journaled.Runtime],
) -> None:
    """M10/M8: A deletes f0; B, behind, purges it: one deletion, one purge, no text stored."""
    a, b = pair
    f0 = a.memory.remember(f"the {MARKER} is here")
    b.refresh()
    assert a.memory.delete(f0.id).primary
    assert b.memory.purge(f0.id, reason="erase")
    assert [e.fact_id for e in _events_of(a, FactDeleted)] == [f0.id]
    assert [e.fact_id for e in _events_of(a, FactPurged)] == [f0.id]
    b.memory.scrub(timeout=5)
    assert _stored_anywhere(a.journal.url, MARKER) == []


def test_behind_threads_remembering_on_a_key_while_a_deletes_keep_one_live_fact(
    pair: tuple[journaled.Runtime, journaled.Runtime],
) -> None:
    """M3/M8/J3: threads of B (grouped remembers) claim one key while A remembers on it and
    deletes its holders; each of B's remembers is stored or refused whole (a refusal is a
    ConcurrencyConflict, nothing stored), and at most one fact holds the key live anywhere."""
    a, b = pair
    stop = threading.Event()
    errors: list[BaseException] = []
    stored: list[str] = []
    refused: list[str] = []

    def b_writes(n: int) -> None:
        for i in range(15):
            text = f"b{n} says {i}"
            try:
                b.memory.remember(text, conflict_key="port")
            except journaled.ConcurrencyConflict:
                refused.append(text)
                continue
            except BaseException as exc:
                errors.append(exc)
                return
            stored.append(text)

    def a_writes() -> None:
        try:
            while not stop.is_set():
                fact = a.memory.remember("a says so", conflict_key="port")
                a.memory.delete(fact.id)
                time.sleep(0.001)
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=a_writes)
    writer.start()
    threads = [threading.Thread(target=b_writes, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    stop.set()
    writer.join(timeout=30)
    assert errors == []
    assert len(stored) + len(refused) == 45
    a.refresh()
    b.refresh()
    with journaled.open(a.journal.url, follow=None) as c:
        texts = sorted(f.text for f in c.memory.all() if f.text.startswith("b"))
        assert texts == sorted(stored)
        for rt in (a, b, c):
            live = [f.id for f in rt.memory.all() if f.superseded_by is None]
            assert len(live) == 1, live
        assert _facts(a) == _facts(c) == _facts(b)


# -- memory: B reads, then snapshots and closes ----------------------------------------------------


def test_behind_reads_from_the_journal_see_a_purge_at_once(
    pair: tuple[journaled.Runtime, journaled.Runtime],
) -> None:
    """M10/M11/M12: B, behind A's purge, answers history, why and as_of from the journal:
    the purge is there and the text is not."""
    a, b = pair
    f0 = a.memory.remember(f"the {MARKER} is here")
    b.refresh()
    assert a.memory.purge(f0.id, reason="asked")
    assert [type(e.data) for e in b.memory.history(f0.id)][-1] is FactPurged
    assert "purged" in b.memory.why(f0.id)
    assert MARKER not in b.memory.why(f0.id)
    view = b.memory.as_of(position=b.journal.position())
    assert view.get(f0.id) is None
    old = b.memory.as_of(position=b.journal.position() - 1)
    assert all(MARKER not in f.text for f in old.all())


def test_a_follower_stops_serving_a_purged_text_within_the_bound(durable_url: str) -> None:
    """M10/J3: B follows (0.05 s); once A's purge returns, B's get, all and search stop
    returning the text within a bounded time."""
    with (
        journaled.open(durable_url, follow=0.05) as a,
        journaled.open(durable_url, follow=0.05) as b,
    ):
        f0 = a.memory.remember(f"the {MARKER} is here")
        wait_for(lambda: b.memory.get(f0.id) is not None, 5.0)
        assert [f.id for f in b.memory.search(MARKER)] == [f0.id]
        assert a.memory.purge(f0.id)
        wait_for(lambda: b.memory.get(f0.id) is None, 5.0)
        assert b.memory.search(MARKER) == []
        assert all(MARKER not in f.text for f in b.memory.all())


@pytest.mark.parametrize("write", ["checkpoint", "close"])
def test_behind_snapshot_never_writes_a_purged_text_back(durable_url: str, write: str) -> None:
    """R2: B folded a text (and searched it, so its index holds the token); A purges it; B's
    checkpoint or close stores no cell holding the text."""
    a = journaled.open(durable_url, follow=None)
    b = journaled.open(durable_url, follow=None)
    try:
        f0 = a.memory.remember(f"the {MARKER} is here")
        for i in range(30):
            a.memory.remember(f"filler fact number {i}")
        b.refresh()
        assert [f.id for f in b.memory.search(MARKER)] == [f0.id]
        assert a.memory.purge(f0.id)
        a.memory.scrub(timeout=5)
        if write == "checkpoint":
            b.memory.checkpoint()
        else:
            b.close()
    finally:
        b.close()
        a.memory.scrub(timeout=5)
        a.close()
    assert _stored_anywhere(durable_url, MARKER) == []
    with journaled.open(durable_url, follow=None) as c:
        assert c.memory.get(f0.id) is None
        assert c.memory.search(MARKER) == []


class _NamedEmbedder:
    """An embedder naming a model (so its vectors are cached beside a SQLite journal); it
    records every text it is given."""

    model = "probe-model"

    def __init__(self) -> None:
        self.seen: list[str] = []

    def embed(self, texts: list[str]) -> list[list[float]]:
        self.seen.extend(texts)
        return [[1.0, float(len(t)), float(sum(map(ord, t)) % 97)] for t in texts]


def test_behind_semantic_search_caches_no_vector_of_a_purged_fact(sqlite_url: str) -> None:
    """R2/M7/ADR 0048: A purges a fact B has not folded the purge of; B's semantic search
    leaves no link to the fact and no vector of its text in the vector cache file."""
    embedder = _NamedEmbedder()
    with (
        journaled.open(sqlite_url, follow=None) as a,
        journaled.open(sqlite_url, follow=None, embedder=embedder) as b,
    ):
        f0 = a.memory.remember(f"the {MARKER} is here")
        keep = a.memory.remember("another fact stays")
        b.refresh()
        assert a.memory.purge(f0.id)
        b.memory.search_semantic("fact here")
        path = sqlite_url.removeprefix("sqlite:///") + ".vectors"
        from journaled.embedders.cache import digest

        with sqlite3.connect(path) as db:
            links = {r[0] for r in db.execute("SELECT fact_id FROM facts")}
            digests = {bytes(r[0]) for r in db.execute("SELECT digest FROM vectors")}
        assert f0.id not in links
        assert digest(f0.text) not in digests
        assert keep.id in links


def test_behind_used_by_and_stale_see_another_runtimes_reads_at_once(
    pair: tuple[journaled.Runtime, journaled.Runtime],
) -> None:
    """P2/P3: a run of A reads a fact and A then supersedes it; B, not caught up, lists the use
    and the stale step at once (both are projections of the journal)."""
    a, b = pair
    _tools(a)
    f0 = a.memory.remember("the gate code is old", conflict_key="gate")
    run = a.execute(Plan(goal="g", steps=[Step("r", tool="read", input="gate code")])).run_id
    f1 = a.memory.remember("the gate code is new", conflict_key="gate")
    assert [(u.run_id, u.step_id) for u in b.memory.used_by(f0.id)] == [(run, "r")]
    assert [(s.step_id, s.change, s.replacement) for s in b.runs.stale(run)] == [
        ("r", "superseded", f1.id)
    ]
    assert [s.run_id for s in b.runs.stale()] == [run]
    assert f"run {run}" in b.memory.why(f0.id)


def test_after_catching_up_b_folds_what_a_fresh_runtime_folds(
    pair: tuple[journaled.Runtime, journaled.Runtime],
) -> None:
    """J3/M3/M8/M10: A and B interleave remembers on keys, deletes and purges, each on what it
    last saw; after both catch up, A, B and a fresh runtime hold the same facts."""
    a, b = pair
    made: list[str] = []
    for i in range(6):
        for who, rt in (("a", a), ("b", b)):
            made.append(rt.memory.remember(f"{who} {i}", conflict_key=f"k{i % 2}").id)
            if i % 3 == 2:
                assert rt.memory.delete(made[-4]) is not None
            if i % 4 == 3:
                rt.memory.purge(made[-3])
    a.refresh()
    b.refresh()
    with journaled.open(a.journal.url, follow=None) as c:
        assert _facts(a) == _facts(c)
        assert _facts(b) == _facts(c)
        for key in ("k0", "k1"):
            live = [
                f.id for f in c.memory.all() if f.conflict_key == key and f.superseded_by is None
            ]
            assert len(live) <= 1, (key, live)


# -- runs: B acts on runs A moved on ---------------------------------------------------------------


def _tools(rt: journaled.Runtime) -> None:
    def echo(x: Any) -> Any:
        return {"echo": x}

    def ask(step: Step, ctx: Any) -> AgentResult:
        if ctx.answer is None:
            raise journaled.NeedsInput("which colour?")
        return AgentResult(ok=True, output=f"colour {ctx.answer}")

    def read(query: str, ctx: Any) -> list[str]:
        return [f.id for f in ctx.memory.search(query)]

    rt.register_tool("echo", echo)
    rt.register_agent("ask", ask)
    rt.register_tool("read", read)


_OTHER_TOOLS = """
def echo(x):
    return {"echo": x}

def ask(step, ctx):
    if ctx.answer is None:
        raise journaled.NeedsInput("which colour?")
    return AgentResult(ok=True, output="colour " + ctx.answer)

def read(query, ctx):
    return [f.id for f in ctx.memory.search(query)]

def tools(rt):
    rt.register_tool("echo", echo)
    rt.register_agent("ask", ask)
    rt.register_tool("read", read)
"""


def _with_tools_elsewhere(url: str, line: str) -> str:
    """Run one line in another process's runtime with this file's tools; return its stdout."""
    return _other_process(
        url, _OTHER_TOOLS + f"\nwith journaled.open(url) as rt:\n    tools(rt)\n    {line}\n"
    )


def _waiting_run(rt: journaled.Runtime) -> str:
    result = rt.execute(Plan(goal="pick", steps=[Step("q", agent="ask", input=None)]))
    assert result.waiting == ["q"]
    return result.run_id


def test_behind_resume_of_a_run_another_process_finished_is_refused(durable_url: str) -> None:
    """E14/R8: B read a waiting run; another process answers it to completion; B's resume with
    an answer is refused as finished and the step ran once."""
    with journaled.open(durable_url, follow=None) as b:
        _tools(b)
        run = _waiting_run(b)
        assert b.runs.summary(run).status == "waiting_for_input"
        _with_tools_elsewhere(durable_url, f'assert rt.resume({run!r}, answers={{"q": "red"}}).ok')
        with pytest.raises(journaled.RunNotResumable, match="already finished"):
            b.resume(run, answers={"q": "blue"})
        assert b.runs.at(run, b.journal.position()).observations[-1].output == "colour red"
        assert b.runs.summary(run).status == "completed"


def test_behind_cancel_of_a_run_another_process_finished_is_false(durable_url: str) -> None:
    """E5/ADR 0075: B cancels a run another process answered to completion: False, nothing
    appended."""
    with journaled.open(durable_url, follow=None) as b:
        _tools(b)
        run = _waiting_run(b)
        _with_tools_elsewhere(durable_url, f'assert rt.resume({run!r}, answers={{"q": "red"}}).ok')
        end = b.journal.position()
        assert b.cancel(run) is False
        assert b.journal.position() == end
        assert b.runs.summary(run).status == "completed"


def test_behind_answer_of_a_run_another_process_cancelled_is_refused(durable_url: str) -> None:
    """E5/E14: another process cancels a waiting run at rest; B's answer is refused as
    finished (cancelled) and nothing runs."""
    with journaled.open(durable_url, follow=None) as b:
        _tools(b)
        run = _waiting_run(b)
        _with_tools_elsewhere(durable_url, f"assert rt.cancel({run!r}) is True")
        with pytest.raises(journaled.RunNotResumable, match="cancelled"):
            b.resume(run, answers={"q": "blue"})
        assert b.runs.summary(run).status == "cancelled"


def test_behind_resume_of_a_run_another_process_executes_is_owned_elsewhere(
    durable_url: str, tmp_path: Path
) -> None:
    """R8/E14: another process is executing a run (a step blocks); B's resume and cancel
    neither run nor end it: RunOwnedElsewhere, and cancel is False."""
    gate = tmp_path / "gate"
    started = tmp_path / "started"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _script(
                durable_url,
                f"""
import pathlib
gate = pathlib.Path({str(gate)!r})
def slow(x):
    pathlib.Path({str(started)!r}).write_text("yes")
    deadline = time.monotonic() + 30
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return x
with journaled.open(url) as rt:
    rt.register_tool("slow", slow)
    r = rt.execute(Plan(goal="slow", steps=[Step("s", tool="slow", input=1)]))
    print(r.run_id, r.ok)
""",
            ),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(started.exists, 20.0)
        with journaled.open(durable_url, follow=None) as b:
            b.register_tool("slow", lambda x: x)
            runs = b.runs.list()
            assert len(runs) == 1
            run = str(runs[0])
            assert runs[0].status == "running"
            with pytest.raises(journaled.RunOwnedElsewhere):
                b.resume(run)
            assert b.cancel(run) is False
            gate.write_text("go")
            out, err = proc.communicate(timeout=30)
            assert out.split() == [run, "True"], err[-2000:]
            assert b.runs.summary(run).status == "completed"
            steps = [e for e in b.runs.history(run) if e.data.__class__.__name__ == "StepStarted"]
            assert len(steps) <= 1
    finally:
        gate.write_text("go")
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_behind_fork_of_a_run_another_process_purged_is_refused(durable_url: str) -> None:
    """F1/R2: B saw a run; another process purges it; B's fork (at a position inside it) is
    refused and no cell holds the run's output."""
    with journaled.open(durable_url, follow=None) as b:
        _tools(b)
        result = b.execute(Plan(goal="g", steps=[Step("e", tool="echo", input=MARKER)]))
        run = result.run_id
        mid = b.journal.position()
        assert b.runs.at(run, mid).observations[0].output == {"echo": MARKER}
        _other_process(
            durable_url,
            f"""
with journaled.open(url) as rt:
    assert rt.runs.purge({run!r}, "asked") > 0
    rt.memory.scrub(timeout=5)
""",
        )
        with pytest.raises(journaled.RunNotResumable, match="purged"):
            b.runs.fork(run, at=mid)
        assert MARKER not in repr(b.runs.at(run, mid))
        b.memory.scrub(timeout=5)
    assert _stored_anywhere(durable_url, MARKER) == []


def test_a_fork_racing_a_purge_of_its_source_stores_no_purged_output(
    durable_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2/F1: B forks a finished run; between B's read of the source and its append, another
    process purges the source. The fork must not carry the purged output into storage."""
    with journaled.open(durable_url, follow=None) as b:
        _tools(b)
        result = b.execute(Plan(goal="g", steps=[Step("e", tool="echo", input=MARKER)]))
        run = result.run_id
        original = type(b.runs)._replacements

        def purge_meanwhile(self: Any, *args: Any, **kwargs: Any) -> Any:
            _other_process(
                durable_url,
                f"""
with journaled.open(url) as rt:
    assert rt.runs.purge({run!r}, "asked") > 0
    rt.memory.scrub(timeout=5)
""",
            )
            return original(self, *args, **kwargs)

        monkeypatch.setattr(type(b.runs), "_replacements", purge_meanwhile)
        fork: str | None
        try:
            fork = b.runs.fork(run)
        except journaled.RunNotResumable:
            fork = None
        monkeypatch.undo()
        b.memory.scrub(timeout=5)
        leaked = _stored_anywhere(durable_url, MARKER)
        shown = "" if fork is None else repr(b.runs.at(fork, b.journal.position()))
    assert (leaked, MARKER in shown) == ([], False)
    assert fork is None, "the fork landed after the purge of its source"


def test_a_purge_racing_a_fork_of_its_run_erases_the_forks_copy(
    durable_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2/F1: B purges a finished run; between B's read of the run's family and its append,
    another process forks the run. The purge reads the family again and erases the fork's copy
    of the output too."""
    with journaled.open(durable_url, follow=None) as b:
        _tools(b)
        result = b.execute(Plan(goal="g", steps=[Step("e", tool="echo", input=MARKER)]))
        run = result.run_id
        original = run_erasure._family
        forked: list[str] = []

        def fork_meanwhile(journal: Any, run_id: str) -> list[str]:
            family = original(journal, run_id)
            if not forked:
                forked.append(
                    _other_process(
                        durable_url,
                        f"""
with journaled.open(url) as rt:
    print(rt.runs.fork({run!r}))
""",
                    ).strip()
                )
            return family

        monkeypatch.setattr(run_erasure, "_family", fork_meanwhile)
        assert b.runs.purge(run, "asked") > 0
        monkeypatch.undo()
        b.memory.scrub(timeout=5)
        (fork,) = forked
        assert b.runs.state(fork).purged is not None
        assert MARKER not in repr(b.runs.at(fork, b.journal.position()))
    assert _stored_anywhere(durable_url, MARKER) == []


def test_forks_of_other_runs_meanwhile_do_not_hold_up_a_purge(
    durable_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2 (ADR 0078): a fork of another run landing while B purges a run refuses B's first
    append; the purge looks at that fork, finds it no copy of this family, and erases at once
    (its family read once)."""
    with journaled.open(durable_url, follow=None) as b:
        _tools(b)
        run = b.execute(Plan(goal="g", steps=[Step("e", tool="echo", input=MARKER)])).run_id
        other = b.execute(Plan(goal="h", steps=[Step("e", tool="echo", input="x")])).run_id
        original = run_erasure._family
        reads: list[str] = []

        def fork_other_meanwhile(journal: Any, run_id: str) -> list[str]:
            reads.append(run_id)
            family = original(journal, run_id)
            if len(reads) == 1:
                _with_tools_elsewhere(durable_url, f"print(rt.runs.fork({other!r}))")
            return family

        monkeypatch.setattr(run_erasure, "_family", fork_other_meanwhile)
        assert b.runs.purge(run, "asked") > 0
        monkeypatch.undo()
        assert reads == [run]
        assert b.runs.state(other).purged is None
        b.memory.scrub(timeout=5)
    assert _stored_anywhere(durable_url, MARKER) == []


def test_purges_of_other_runs_meanwhile_do_not_refuse_a_fork(
    durable_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F1/R2 (ADR 0078): another run's purge landing while B forks a run refuses B's first
    append; the fork finds its source untouched and lands, carrying its output."""
    with journaled.open(durable_url, follow=None) as b:
        _tools(b)
        run = b.execute(Plan(goal="g", steps=[Step("e", tool="echo", input="kept")])).run_id
        other = b.execute(Plan(goal="h", steps=[Step("e", tool="echo", input=MARKER)])).run_id
        original = type(b.runs)._replacements
        fired: list[bool] = []

        def purge_other_meanwhile(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not fired:
                fired.append(True)
                _with_tools_elsewhere(durable_url, f"assert rt.runs.purge({other!r}, 'x') > 0")
            return original(self, *args, **kwargs)

        monkeypatch.setattr(type(b.runs), "_replacements", purge_other_meanwhile)
        fork = b.runs.fork(run)
        monkeypatch.undo()
        assert fired
        assert b.runs.at(fork, b.journal.position()).observations[0].output == {"echo": "kept"}


def test_a_fork_whose_commit_was_retried_returns_its_id(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F1 (ADR 0078): an append that landed and then conflicted with itself (a connection lost
    after the commit and retried) gives the fork's id, not an error."""
    with journaled.open(sqlite_url, follow=None) as b:
        _tools(b)
        run = b.execute(Plan(goal="g", steps=[Step("e", tool="echo", input="x")])).run_id
        journal = b.runs._journal
        append = journal.append

        def land_then_conflict(*args: Any, **kwargs: Any) -> list[int]:
            append(*args, **kwargs)
            raise ConcurrencyConflict(["run_x"], "the retried commit found its own rows")

        monkeypatch.setattr(journal, "append", land_then_conflict)
        fork = b.runs.fork(run)
        monkeypatch.undo()
        assert b.runs.summary(fork).status != "running"
        assert [e.kind for e in b.runs.history(fork)] == ["run.forked"]


def test_a_resume_whose_memory_is_gone_is_refused_as_closed(sqlite_url: str) -> None:
    """R3/E14 (ADR 0078): memory's actors stopped under a resume (a close meanwhile) gives
    RuntimeClosed, the run stays resumable; memory too busy to catch up lets it go on."""
    with journaled.open(sqlite_url, follow=None) as b:
        _tools(b)
        run = _waiting_run(b)

        def stopped() -> int:
            raise pykka.ActorDeadError("memory writer stopped")

        b.runs.catch_up_memory = stopped
        with pytest.raises(journaled.RuntimeClosed, match="resume it in a new runtime"):
            b.resume(run, answers={"q": "red"})

        def busy() -> int:
            raise ActorTimeout("no answer to CatchUp in 30s")

        b.runs.catch_up_memory = busy
        resumed = b.resume(run, answers={"q": "red"})
        assert isinstance(resumed, journaled.ExecuteResult)
        assert resumed.ok


def test_a_cancel_at_rest_racing_an_answer_elsewhere_is_false_not_an_error(
    durable_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E5/ADR 0075: B cancels a waiting run at rest; between B's read and its append another
    process answers it (and it completes): cancel returns False (the docstring: nothing to
    cancel when another process executes it or it finished), it does not raise."""
    with journaled.open(durable_url, follow=None) as b:
        _tools(b)
        run = _waiting_run(b)
        original = type(b.runs)._reopen
        fired: list[bool] = []

        def answer_meanwhile(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(self, *args, **kwargs)
            if not fired:
                fired.append(True)
                _with_tools_elsewhere(
                    durable_url, f'assert rt.resume({run!r}, answers={{"q": "red"}}).ok'
                )
            return out

        monkeypatch.setattr(type(b.runs), "_reopen", answer_meanwhile)
        outcome: object
        try:
            outcome = b.cancel(run)
        except Exception as exc:
            outcome = exc
        monkeypatch.undo()
        assert fired
        assert b.runs.summary(run).status == "completed"
        assert outcome is False, outcome


def test_behind_refresh_reruns_the_stale_step_against_todays_memory(durable_url: str) -> None:
    """P4/P3: a run in B read fact f0; A supersedes f0 by f1; B sees the run stale at once
    (from the journal), refreshes it and resumes the fork: the re-run step reads today's
    memory (f1), so the fork is not stale."""
    clock = ManualClock(start=1_700_000_000_000, step=1)
    with (
        journaled.open(durable_url, clock=clock, follow=None) as a,
        journaled.open(durable_url, clock=clock, follow=None) as b,
    ):
        _tools(b)
        f0 = b.memory.remember("the gate code is old", conflict_key="gate")
        run = b.execute(Plan(goal="g", steps=[Step("r", tool="read", input="gate code")])).run_id
        assert b.runs.at(run, b.journal.position()).observations[0].output == [f0.id]
        a.refresh()
        f1 = a.memory.remember("the gate code is new", conflict_key="gate")
        stale = b.runs.stale(run)
        assert [(s.fact_id, s.change, s.replacement) for s in stale] == [
            (f0.id, "superseded", f1.id)
        ]
        fresh = b.runs.refresh(run)
        result = b.resume(fresh)
        assert isinstance(result, journaled.ExecuteResult)
        assert result.observations[-1].output == [f1.id]
        assert b.runs.stale(fresh) == []


def test_a_run_refreshed_elsewhere_resumes_against_todays_memory(durable_url: str) -> None:
    """P4/E14: A supersedes the fact a run of B read and refreshes the run; B, behind on the
    journal, resumes the fork: its re-run step reads what A remembered (the resume catches
    memory up first), so the fork is not stale."""
    clock = ManualClock(start=1_700_000_000_000, step=1)
    with (
        journaled.open(durable_url, clock=clock, follow=None) as a,
        journaled.open(durable_url, clock=clock, follow=None) as b,
    ):
        _tools(a)
        _tools(b)
        b.memory.remember("the gate code is old", conflict_key="gate")
        run = b.execute(Plan(goal="g", steps=[Step("r", tool="read", input="gate code")])).run_id
        a.refresh()
        f1 = a.memory.remember("the gate code is new", conflict_key="gate")
        fresh = a.runs.refresh(run)
        result = b.resume(fresh)
        assert isinstance(result, journaled.ExecuteResult)
        assert result.observations[-1].output == [f1.id]
        assert b.runs.stale(fresh) == []


def test_behind_lists_and_time_travels_runs_another_runtime_appended(
    pair: tuple[journaled.Runtime, journaled.Runtime],
) -> None:
    """T2/O7/E14: B lists, summarises and time-travels a run A executed after B opened, at once,
    and its summary follows A's later resume."""
    a, b = pair
    _tools(a)
    _tools(b)
    run = _waiting_run(a)
    listed = {str(s): s.status for s in b.runs.list()}
    assert listed == {run: "waiting_for_input"}
    assert b.runs.at(run, b.journal.position()).waiting == ["q"]
    resumed = a.resume(run, answers={"q": "red"})
    assert isinstance(resumed, journaled.ExecuteResult)
    assert resumed.ok
    assert b.runs.summary(run).status == "completed"
    assert [s.status for s in b.runs.list(status="completed")] == ["completed"]
    assert b.runs.at(run, b.journal.position()).ok


def test_threads_of_two_runtimes_resuming_one_waiting_run_run_it_once(
    pair: tuple[journaled.Runtime, journaled.Runtime],
) -> None:
    """R8/J3: threads of A and B resume one waiting run at once with different answers: one
    executes, the others are refused, and the step succeeded exactly once."""
    a, b = pair
    _tools(a)
    _tools(b)
    run = _waiting_run(a)
    barrier = threading.Barrier(4)
    outcomes: list[object] = []
    lock = threading.Lock()

    def go(rt: journaled.Runtime, answer: str) -> None:
        barrier.wait(timeout=10)
        try:
            got: object = rt.resume(run, answers={"q": answer})
        except Exception as exc:
            got = exc
        with lock:
            outcomes.append(got)

    threads = [
        threading.Thread(target=go, args=(rt, f"{name}{i}"))
        for i in range(2)
        for name, rt in (("a", a), ("b", b))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(outcomes) == 4
    won = [o for o in outcomes if isinstance(o, journaled.ExecuteResult)]
    assert len(won) == 1, outcomes
    assert all(isinstance(o, journaled.RunNotResumable) for o in outcomes if o not in won)
    succeeded = [e for e in a.runs.history(run) if e.data.__class__.__name__ == "StepSucceeded"]
    assert len(succeeded) == 1
    assert a.runs.summary(run).status == "completed"
