"""Attacks on the operating features: the checkpoint cache, run summaries, the write path's
compact storage, spans and the lazy door (SPEC T1-T4, R2, R7)."""

from __future__ import annotations

import copy
import json
import pickle
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from old_journals import copy_journal, register_tools
from typecheck import mypy_strict

import journaled
import journaled.testing
from journaled.events.catalog import codec
from journaled.events.journal import Journal
from journaled.events.run_state import fold_run
from journaled.events.run_summaries import SUMMARIES_KEY, RunSummaries
from journaled.events.url import parse_url

WAIT = 30.0
CLI = [sys.executable, "-m", "journaled.cli"]
SECRET_OUTPUT = "the launch code is 4471"


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "--url", url, *args], capture_output=True, text=True, timeout=WAIT, check=False
    )


def _path(url: str) -> str:
    return url.removeprefix("sqlite:///")


def _chain(n: int, goal: str = "chain", tool: str = "noop") -> journaled.Plan:
    return journaled.Plan(
        goal=goal,
        steps=[
            journaled.Step(f"c{i}", tool=tool, depends_on=[f"c{i - 1}"] if i else [])
            for i in range(n)
        ],
    )


def _plain_at(journal: Journal, run_id: str, position: int) -> journaled.ExecuteResult:
    """Fold a run's prefix without any cache: the truth the cache must equal."""
    return fold_run(journal.stream(run_id, upto=position)).result()


def _waiting_agent(step: journaled.Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
    if ctx.answer is None:
        raise journaled.NeedsInput("which colour?")
    return journaled.AgentResult(ok=True, output=f"painted {ctx.answer}")


# -- T1: the checkpoint cache against other writers --------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_url(request: pytest.FixtureRequest, sqlite_url: str) -> str:
    """A journal two runtimes share: a SQLite file or a PostgreSQL database."""
    if request.param == "sqlite":
        return sqlite_url
    url: str = request.getfixturevalue("pg_url")
    return url


def test_a_warm_cache_sees_a_resume_by_another_runtime(shared_url: str) -> None:
    """T1/O7: after another runtime resumes a run, a warm cache serves every position exactly."""
    with journaled.open(shared_url) as a, journaled.open(shared_url) as b:
        for rt in (a, b):
            rt.register_tool("noop", lambda _: None)
            rt.register_agent("ask", _waiting_agent)
        plan = journaled.Plan(
            goal="paint",
            steps=[
                journaled.Step("s0", tool="noop"),
                journaled.Step("ask", agent="ask", depends_on=["s0"]),
                journaled.Step("s2", tool="noop", depends_on=["ask"]),
            ],
        )
        first = a.execute(plan)
        assert first.waiting == ["ask"]
        warm_end = a.journal.position()
        assert a.runs.at(first.run_id, warm_end).waiting == ["ask"]  # warms a's cache
        # Other streams interleave with the run's positions.
        a.memory.remember("an unrelated fact")
        b.execute(_chain(3))
        done = b.resume(first.run_id, answers={"ask": "red"})
        assert isinstance(done, journaled.ExecuteResult)
        assert done.ok
        b.memory.remember("another unrelated fact")
        end = a.journal.position()
        journal = a.runs._journal
        for position in range(journal.first(first.run_id).position, end + 1):  # type: ignore[union-attr]
            assert a.runs.at(first.run_id, position) == _plain_at(
                journal, first.run_id, position
            ), position
        assert a.runs.at(first.run_id, end).ok


def test_a_purge_by_another_runtime_reaches_a_warm_cache_of_a_fork(shared_url: str) -> None:
    """R2/T1: a fork's cached states lose the source's output once another runtime purges it."""
    with journaled.open(shared_url) as a, journaled.open(shared_url) as b:
        for rt in (a, b):
            rt.register_tool("speak", lambda _: SECRET_OUTPUT)
            rt.register_tool("noop", lambda _: None)
        source = a.execute(
            journaled.Plan(
                goal="secret goal",
                steps=[
                    journaled.Step("s0", tool="speak"),
                    journaled.Step("s1", tool="noop", depends_on=["s0"]),
                ],
            )
        )
        fork = a.runs.fork(
            source.run_id,
            replace={"s1": journaled.Step("s1", tool="noop", input={"v": 2}, depends_on=["s0"])},
        )
        a.resume(fork)
        end = a.journal.position()
        # Warm both runs' timelines at every position.
        for run_id in (source.run_id, fork):
            first = a.runs.history(run_id)[0].position
            for position in range(first, end + 1):
                a.runs.at(run_id, position)
        assert SECRET_OUTPUT in repr(a.runs.at(fork, end).observations)
        assert b.runs.purge(source.run_id, "asked to forget") > 0
        after = a.journal.position()
        for run_id in (source.run_id, fork):
            first = a.runs.history(run_id)[0].position
            for position in range(first, after + 1):
                state = a.runs.at(run_id, position)
                assert SECRET_OUTPUT not in repr(state), (run_id, position)
                assert "secret goal" not in repr(state), (run_id, position)
        assert "secret goal" not in repr(a.runs.list())


def test_a_purge_in_another_process_reaches_a_warm_diff(sqlite_url: str) -> None:
    """R2/T1: runs.diff from a warm cache holds no output purged by a CLI process."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("speak", lambda _: SECRET_OUTPUT)
        result = rt.execute(_chain(2, goal="to purge", tool="speak"))
        start, end = rt.runs.history(result.run_id)[0].position, rt.journal.position()
        assert SECRET_OUTPUT in repr(rt.runs.diff(result.run_id, start, end))
        done = _cli(sqlite_url, "runs", "purge", result.run_id, "--reason", "forget it")
        assert done.returncode == 0, done.stderr
        diff = rt.runs.diff(result.run_id, start, rt.journal.position())
        assert SECRET_OUTPUT not in repr(diff)
        assert SECRET_OUTPUT not in rt.runs.why(result.run_id)


# -- T2: the summary projection -----------------------------------------------------------------


def test_a_summary_names_the_wave_of_a_chain_whose_partitions_are_implied(
    sqlite_url: str,
) -> None:
    """T2: a chain's summary shows the wave its last step ran in, partitions stored or not."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("noop", lambda _: None)
        result = rt.execute(_chain(3))
        assert rt.runs.state(result.run_id).wave == 3  # the fold's wave, from the starts
        [summary] = rt.runs.list()
    assert summary.wave == 3, summary.as_dict()


def _forge_projection(url: str, state: bytes, position: int | None = None) -> None:
    conn = sqlite3.connect(_path(url))
    try:
        if position is None:
            conn.execute(
                "UPDATE journaled_snapshots SET state = ? WHERE stream = ?", (state, SUMMARIES_KEY)
            )
        else:
            conn.execute(
                "UPDATE journaled_snapshots SET state = ?, version = ? WHERE stream = ?",
                (state, position, SUMMARIES_KEY),
            )
        conn.commit()
    finally:
        conn.close()


def _stored_runs(url: str) -> dict[str, Any]:
    with journaled.open(url) as rt:
        rt.register_tool("noop", lambda _: None)
        ids = [rt.execute(_chain(2, goal=f"goal {n}")).run_id for n in range(3)]
        assert rt.runs.summaries.save()
        expected: dict[str, Any] = {
            str(s): (s.status, s.goal, s.steps_done) for s in rt.runs.list()
        }
    assert len(expected) == len(ids)
    return expected


@pytest.mark.parametrize(
    "state",
    [b"\xc1\xc1 not msgpack", b"", b"\x80", b"\x83\xa6schema\x63\xa8position\x01\xa4runs\x80"],
    ids=["garbage", "empty", "empty-map", "other-schema"],
)
def test_a_corrupt_or_foreign_projection_snapshot_is_a_cache_miss(
    sqlite_url: str, state: bytes
) -> None:
    """T2/J5: an unreadable or other-schema projection snapshot is folded around, not trusted."""
    expected = _stored_runs(sqlite_url)
    _forge_projection(sqlite_url, state)
    with journaled.open(sqlite_url) as rt:
        assert {s: (s.status, s.goal, s.steps_done) for s in rt.runs.list()} == expected
    done = _cli(sqlite_url, "runs", "list", "--json")
    assert done.returncode == 0, done.stderr
    assert {r["run_id"]: (r["status"], r["goal"]) for r in json.loads(done.stdout)} == {
        k: v[:2] for k, v in expected.items()
    }


def _forge_future_watermark(url: str) -> dict[str, Any]:
    """Store runs and their projection, then move the projection's watermark past the end."""
    import msgspec

    expected = _stored_runs(url)
    with journaled.open(url) as rt:
        end = rt.journal.position()
        stored = rt.runs._journal.snapshot(SUMMARIES_KEY)
        assert stored is not None
    from journaled.events.compressed import deflate, inflate

    raw = msgspec.msgpack.decode(inflate(stored[1]))
    raw["position"] = end + 1000
    _forge_projection(url, deflate(msgspec.msgpack.encode(raw)), end + 1000)
    return expected


def test_verify_reports_a_projection_watermark_past_the_end(sqlite_url: str) -> None:
    """R7: journal verify reports a projection snapshot claiming a position past the end."""
    _forge_future_watermark(sqlite_url)
    with journaled.open(sqlite_url) as rt:
        report = rt.journal.verify()
    assert not report.ok
    done = _cli(sqlite_url, "journal", "verify")
    assert done.returncode == 1, done.stdout + done.stderr


def test_a_projection_claiming_a_future_position_is_not_trusted(sqlite_url: str) -> None:
    """T2/R7: a projection snapshot stored past the journal's end does not hide later runs."""
    expected = _forge_future_watermark(sqlite_url)
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("noop", lambda _: None)
        later = rt.execute(_chain(1, goal="later")).run_id
        listed = {s: s.status for s in rt.runs.list()}
    assert later in listed, "a run appended after a forged watermark is missing from runs.list"
    assert set(expected) <= set(listed)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"status": "done"}, "status"),
        ({"status": ["completed", "done"]}, "status"),
        ({"status": {"completed": 1}}, "status"),
        ({"status": 3}, "status"),
        ({"since": -1}, "since"),
        ({"since": 1.5}, "since"),
        ({"since": True}, "since"),
        ({"since": "2026-13-01"}, "since"),
        ({"since": float("nan")}, "since"),
        ({"limit": 0}, "limit"),
        ({"limit": -3}, "limit"),
        ({"limit": "3"}, "limit"),
        ({"limit": 2.0}, "limit"),
        ({"limit": False}, "limit"),
    ],
)
def test_odd_list_filters_are_one_line_errors_naming_the_argument(
    kwargs: dict[str, Any], names: str
) -> None:
    """T2: a bad runs.list filter raises ValueError naming the argument; nothing is appended."""
    with journaled.open("memory://") as rt:
        before = rt.journal.position()
        with pytest.raises(ValueError, match=names) as raised:
            rt.runs.list(**kwargs)
        assert "\n" not in str(raised.value)
        assert rt.journal.position() == before


def test_huge_and_edge_list_filters_are_answered() -> None:
    """T2: a huge limit keeps every run; since 0 and a far-future since are plain filters."""
    with journaled.open("memory://") as rt:
        rt.register_tool("noop", lambda _: None)
        ids = [rt.execute(_chain(1)).run_id for _ in range(3)]
        assert rt.runs.list(limit=10**30) == ids
        assert rt.runs.list(limit=2**63) == ids
        assert rt.runs.list(limit=1) == ids[-1:]
        assert rt.runs.list(since=0) == ids
        assert rt.runs.list(since=2**80) == []
        assert rt.runs.list(status="failed") == []


def test_cli_list_rejects_odd_filters_in_one_line(sqlite_url: str) -> None:
    """T2: `runs list` with a bad status, limit or since exits non-zero with one line."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("noop", lambda _: None)
        rt.execute(_chain(1))
    for args in (
        ("--status", "bogus"),
        ("--limit", "0"),
        ("--limit", "-1"),
        ("--since", "yesterday-ish"),
    ):
        done = _cli(sqlite_url, "runs", "list", "--json", *args)
        assert done.returncode != 0, args
        assert "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_summary_survives_pickle_and_copy() -> None:
    """T2/§5: a RunSummary pickles and copies to an equal summary that is still its run id."""
    with journaled.open("memory://") as rt:
        rt.register_tool("noop", lambda _: None)
        run_id = rt.execute(_chain(2)).run_id
        [summary] = rt.runs.list()
    copies = (
        pickle.loads(pickle.dumps(summary)),  # noqa: S301 -- our own bytes
        copy.copy(summary),
        copy.deepcopy(summary),
    )
    for again in copies:
        assert again == summary
        assert again == run_id
        assert again.as_dict() == summary.as_dict()
        assert type(again) is type(summary)


# -- T3: spans that go wrong ----------------------------------------------------------------------


def _raising(where: str) -> Any:
    """Return a span processor whose ``where`` hook raises (a broken vendor plug-in)."""
    from opentelemetry.sdk.trace import SpanProcessor

    class Raising(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            if where == "start":
                raise RuntimeError("span processor on_start failed")

        def on_end(self, span: Any) -> None:
            if where == "end":
                raise RuntimeError("span processor on_end failed")

    return Raising()


class _FailingExporter:
    """An exporter that raises on every export (a collector that is down)."""

    def export(self, spans: object) -> object:
        raise ConnectionError("collector unreachable")

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _kinds(rt: journaled.Runtime, run_id: str) -> list[str]:
    return [e.kind for e in rt.runs.history(run_id)]


def _traced_plan() -> journaled.Plan:
    return journaled.Plan(
        goal="traced",
        steps=[
            journaled.Step("a", tool="noop"),
            journaled.Step("b", tool="noop"),
            journaled.Step("c", tool="noop", depends_on=["a", "b"]),
        ],
    )


def _untraced_kinds() -> list[str]:
    with journaled.open("memory://") as rt:
        rt.register_tool("noop", lambda _: None)
        result = rt.execute(_traced_plan())
        assert result.ok
        return _kinds(rt, result.run_id)


def _provider_with(processor: object) -> Any:
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    provider.add_span_processor(processor)  # type: ignore[arg-type]
    return provider


def test_a_span_processor_raising_on_start_does_not_break_the_run() -> None:
    """T3/R4: a run traced through a processor that raises on_start completes, same events."""
    import journaled.otel

    expected = _untraced_kinds()
    with journaled.open("memory://") as rt:
        rt.register_tool("noop", lambda _: None)
        journaled.otel.instrument(rt, tracer_provider=_provider_with(_raising("start")))
        handle = rt.start(_traced_plan())
        result = handle.result(timeout=WAIT)
        assert result.ok
        assert _kinds(rt, result.run_id) == expected


def test_a_span_processor_raising_on_end_does_not_break_the_run() -> None:
    """T3/R4: a run traced through a processor that raises on_end completes, same events."""
    import journaled.otel

    expected = _untraced_kinds()
    with journaled.open("memory://") as rt:
        rt.register_tool("noop", lambda _: None)
        journaled.otel.instrument(rt, tracer_provider=_provider_with(_raising("end")))
        handle = rt.start(_traced_plan())
        result = handle.result(timeout=10)  # it hangs today: do not wait the full WAIT
        assert result.ok
        assert _kinds(rt, result.run_id) == expected


def test_an_exporter_that_raises_does_not_break_the_run() -> None:
    """T3/R4: with an exporter that raises on export, the run completes with the same events."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    import journaled.otel

    expected = _untraced_kinds()
    with journaled.open("memory://") as rt:
        rt.register_tool("noop", lambda _: None)
        provider = _provider_with(SimpleSpanProcessor(_FailingExporter()))  # type: ignore[arg-type]
        journaled.otel.instrument(rt, tracer_provider=provider)
        result = rt.start(_traced_plan()).result(timeout=WAIT)
        assert result.ok
        assert _kinds(rt, result.run_id) == expected


def test_an_uninstrumented_runtime_beside_a_traced_one_emits_nothing(sqlite_url: str) -> None:
    """T3: in one process, a traced runtime's runs have spans, another runtime's runs none."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import journaled.otel

    exporter = InMemorySpanExporter()
    provider = _provider_with(SimpleSpanProcessor(exporter))
    with journaled.open(sqlite_url) as traced, journaled.open("memory://") as plain:
        for rt in (traced, plain):
            rt.register_tool("noop", lambda _: None)
        journaled.otel.instrument(traced, tracer_provider=provider)
        untraced = plain.execute(_traced_plan()).run_id
        traced_id = traced.execute(_traced_plan()).run_id
        untraced_again = plain.execute(_traced_plan()).run_id
    runs = {(s.attributes or {}).get("journaled.run.id") for s in exporter.get_finished_spans()}
    assert traced_id in runs
    assert untraced not in runs
    assert untraced_again not in runs
    assert runs == {traced_id}


# -- T4: the lazy door ----------------------------------------------------------------------------


def test_every_public_name_resolves_and_is_listed() -> None:
    """T4/§5: every name in journaled.__all__ resolves to its home's object and is in dir()."""
    import importlib

    listed = dir(journaled)
    for name in journaled.__all__:
        value = getattr(journaled, name)
        assert value is not None, name
        assert name in listed, name
        if name != "aio":
            home = importlib.import_module(value.__module__)
            assert getattr(home, name, value) is value, name
    with pytest.raises(AttributeError, match="no_such_name"):
        getattr(journaled, "no_such_name")  # noqa: B009 -- the lazy door's miss


def test_star_import_binds_every_public_name_in_a_fresh_process() -> None:
    """T4/§5: `from journaled import *` binds every name in __all__, in a fresh interpreter."""
    code = (
        "import journaled\n"
        "ns = {}\n"
        "exec('from journaled import *', ns)\n"
        "missing = [n for n in journaled.__all__ if n not in ns]\n"
        "assert not missing, missing\n"
        "assert ns['open'] is journaled.open\n"
        "assert ns['Plan'](goal='g', steps=[]).goal == 'g'\n"
        "print(len(journaled.__all__))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT, check=False
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(journaled.__all__)


def test_public_value_types_pickle_through_the_lazy_door() -> None:
    """T4/§5: public value types pickle and unpickle equal (their home module is importable)."""
    values: list[object] = [
        journaled.Plan(goal="g", steps=[journaled.Step("a", tool="t", input={"k": [1, 2]})]),
        journaled.Step("b", skill="s", depends_on=["a"]),
        journaled.Limits(per_tool={"t": 1}),
        journaled.AgentResult(ok=True, output="x"),
        journaled.Clarify("which?"),
        journaled.Gaps([journaled.Gap(kind="tool", name="t", reason="missing")]),
    ]
    for value in values:
        again = pickle.loads(pickle.dumps(value))  # noqa: S301 -- our own bytes
        assert again == value, value
        assert type(again) is type(value)


@pytest.mark.parametrize("kind", ["PlanRejected", "InvalidArgument"])
def test_two_argument_errors_pickle(kind: str) -> None:
    """E1/§5: PlanRejected and InvalidArgument cross a process boundary (pickle) intact."""
    error = getattr(journaled, kind)("a", "is wrong")
    again = pickle.loads(pickle.dumps(error))  # noqa: S301 -- our own bytes
    assert type(again) is type(error)
    assert str(again) == str(error)


def test_public_errors_pickle() -> None:
    """§5: run and input errors pickle and unpickle with their message."""
    for error in (
        journaled.RunNotFound("no run 'x'"),
        journaled.RunOwnedElsewhere("owned"),
        journaled.NeedsInput("which colour?"),
        journaled.JournalClosed("closed"),
    ):
        again = pickle.loads(pickle.dumps(error))  # noqa: S301 -- our own bytes
        assert type(again) is type(error)
        assert str(again) == str(error)


def test_mypy_sees_every_public_name_typed(tmp_path: Path) -> None:
    """T4/§5: mypy types every name in __all__ through the lazy door (none of them is Any)."""
    lines = ["import journaled", ""]
    lines += [f"reveal_type(journaled.{name})" for name in journaled.__all__]
    lines += [
        "",
        "",
        "def summaries(rt: journaled.Runtime) -> list[journaled.RunSummary]:",
        "    return rt.runs.list(status='completed', limit=3)",
    ]
    done = mypy_strict(tmp_path, lines)
    revealed = [line for line in done.stdout.splitlines() if "Revealed type is" in line]
    assert len(revealed) == len(journaled.__all__), done.stdout + done.stderr
    untyped = [line for line in revealed if line.endswith('"Any"')]
    assert not untyped, untyped
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_rejects_a_misspelt_public_name(tmp_path: Path) -> None:
    """T4/§5: mypy reports a name journaled does not export, as it would without lazy loading."""
    done = mypy_strict(tmp_path, ["import journaled", "", "plan = journaled.Plna"])
    assert done.returncode == 1, done.stdout
    assert 'Module has no attribute "Plna"' in done.stdout, done.stdout


# -- T2: runs follow on runs that do not settle -------------------------------------------------


def _forked_run(url: str) -> str:
    """Return a fork never resumed: `runs follow` keeps following it (status forked)."""
    with journaled.open(url) as rt:
        rt.register_tool("noop", lambda _: None)
        source = rt.execute(_chain(1)).run_id
        return rt.runs.fork(source)


def test_follow_a_purged_run_exits_7_and_shows_no_goal(sqlite_url: str) -> None:
    """T2/R2: `runs follow` of a purged run settles at once as purged (7), goal erased."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("noop", lambda _: None)
        run_id = rt.execute(_chain(1, goal="a confidential goal")).run_id
        assert rt.runs.purge(run_id, "forget") > 0
    done = _cli(sqlite_url, "runs", "follow", run_id, "--json")
    assert done.returncode == 7, done.stdout + done.stderr
    last = json.loads(done.stdout.splitlines()[-1])
    assert last["status"] == "purged"
    assert "confidential" not in done.stdout
    listed = _cli(sqlite_url, "runs", "list", "--json")
    assert "confidential" not in listed.stdout
    table = _cli(sqlite_url, "runs", "follow", run_id)
    assert table.returncode == 7
    assert "confidential" not in table.stdout


def test_follow_a_fork_until_another_process_resumes_it(sqlite_url: str) -> None:
    """T2: `runs follow` of a fork not yet resumed waits, and settles once it is resumed."""
    fork = _forked_run(sqlite_url)
    follower = subprocess.Popen(
        [*CLI, "--url", sqlite_url, "runs", "follow", fork, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        first = json.loads(follower.stdout.readline())  # it shows the fork, then waits
        assert first["status"] == "forked"
        assert follower.poll() is None
        with journaled.open(sqlite_url) as rt:
            rt.register_tool("noop", lambda _: None)
            assert isinstance(rt.resume(fork), journaled.ExecuteResult)
        out, err = follower.communicate(timeout=WAIT)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["status"] == "completed"


def test_follow_an_unknown_or_blank_run_id_is_one_line(sqlite_url: str) -> None:
    """T2: `runs follow` of an unknown, empty or odd run id exits 1 with one line."""
    _forked_run(sqlite_url)
    for run_id in ("run_nope", "", "x" * 5000, "run_\u0000"):
        try:
            done = _cli(sqlite_url, "runs", "follow", run_id)
        except ValueError:
            continue  # the OS refuses a NUL in an argument: nothing to check
        assert done.returncode == 1, (run_id[:20], done.stderr)
        assert "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("interval", ["nan", "inf"])
def test_follow_rejects_a_non_finite_interval(sqlite_url: str, interval: str) -> None:
    """T2: `runs follow --interval nan|inf` is a one-line error, as 0 and negatives are."""
    fork = _forked_run(sqlite_url)
    args = [*CLI, "--url", sqlite_url, "runs", "follow", fork, "--interval", interval]
    try:
        done = subprocess.run(
            [*args, "--max-seconds", "2"], capture_output=True, text=True, timeout=15, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"runs follow --interval {interval} --max-seconds 2 did not stop")
    assert done.returncode not in (0, 130), done.stdout
    assert "Traceback" not in done.stderr
    assert "--interval" in done.stderr
    unbounded = subprocess.run(args, capture_output=True, text=True, timeout=15, check=False)
    assert "Traceback" not in unbounded.stderr, unbounded.stderr


# -- R7: verify on the compact encoding ----------------------------------------------------------


def _compact_journal(url: str) -> tuple[str, list[int]]:
    """Write a run in the compact encoding: tagless payloads, content-only side rows."""
    with journaled.open(url) as rt:
        rt.register_tool("noop", lambda _: None)
        rt.register_tool("speak", lambda data: f"said {data}")
        plan = journaled.Plan(
            goal="tamper",
            steps=[
                journaled.Step("a", tool="speak", input="one"),
                journaled.Step("b", tool="speak", input="two", depends_on=["a"]),
                journaled.Step("c", tool="noop", depends_on=["b"]),
                journaled.Step("d", tool="noop", depends_on=["c"]),
            ],
        )
        result = rt.execute(plan)
        assert result.ok
        rt.memory.remember("a later fact")
        positions = [e.position for e in rt.runs.history(result.run_id)]
        assert rt.journal.verify().ok
    return result.run_id, positions


def _sql(url: str, *statements: tuple[str, tuple[object, ...]]) -> None:
    conn = sqlite3.connect(_path(url))
    try:
        for sql, args in statements:
            conn.execute(sql, args)
        conn.commit()
    finally:
        conn.close()


def _rows(url: str, sql: str, args: tuple[object, ...] = ()) -> list[Any]:
    conn = sqlite3.connect(_path(url))
    try:
        return list(conn.execute(sql, args))
    finally:
        conn.close()


def _verify_cli(url: str) -> subprocess.CompletedProcess[str]:
    return _cli(url, "journal", "verify", "--json")


def test_verify_catches_two_step_payloads_swapped(sqlite_url: str) -> None:
    """R7: swapping the stored payloads of two step events of the compact encoding is reported."""
    run_id, _ = _compact_journal(sqlite_url)
    rows = _rows(
        sqlite_url,
        "SELECT rowid, state FROM stored_events WHERE originator_id = ? AND topic LIKE ? "
        "ORDER BY rowid",
        (run_id, "%step-started%"),
    )
    assert len(rows) >= 2
    (first, a), (second, b) = rows[0], rows[-1]
    _sql(
        sqlite_url,
        ("UPDATE stored_events SET state = ? WHERE rowid = ?", (b, first)),
        ("UPDATE stored_events SET state = ? WHERE rowid = ?", (a, second)),
    )
    with journaled.open(sqlite_url) as rt:
        report = rt.journal.verify()
    assert not report.ok
    assert report.problem is not None
    assert report.problem.position == first
    assert _verify_cli(sqlite_url).returncode == 1


def test_verify_catches_a_dropped_middle_row(sqlite_url: str) -> None:
    """R7: deleting one step row (no side row) from the middle of a run is reported."""
    _, positions = _compact_journal(sqlite_url)
    dropped = positions[len(positions) // 2]
    _sql(sqlite_url, ("DELETE FROM stored_events WHERE rowid = ?", (dropped,)))
    with journaled.open(sqlite_url) as rt:
        report = rt.journal.verify()
    assert not report.ok
    assert report.problem is not None
    assert report.problem.position is not None
    assert report.problem.position <= dropped + 1
    assert _verify_cli(sqlite_url).returncode == 1


def test_verify_catches_a_flipped_byte_in_a_content_only_side_row(sqlite_url: str) -> None:
    """R7: one changed byte of a content-only side row (ADR 0035) is reported."""
    run_id, _ = _compact_journal(sqlite_url)
    rows = _rows(
        sqlite_url,
        "SELECT stream, payload FROM journaled_payloads WHERE stream LIKE ?",
        (f"{run_id}@%",),
    )
    said = [(stream, bytes(p)) for stream, p in rows if b"said one" in bytes(p)]
    assert said, rows
    stream, payload = said[0]
    assert payload[0] & 0xF0 != 0x80  # a content-only array, not a whole-event map
    _sql(
        sqlite_url,
        (
            "UPDATE journaled_payloads SET payload = ? WHERE stream = ?",
            (payload.replace(b"said one", b"said 0ne"), stream),
        ),
    )
    with journaled.open(sqlite_url) as rt:
        report = rt.journal.verify()
    assert not report.ok
    assert report.problem is not None
    assert report.problem.kind == "payload-altered"
    assert _verify_cli(sqlite_url).returncode == 1


def test_verify_catches_two_side_rows_swapped(sqlite_url: str) -> None:
    """R7: exchanging the content-only side rows of two steps is reported."""
    run_id, _ = _compact_journal(sqlite_url)
    rows = _rows(
        sqlite_url,
        "SELECT stream, payload FROM journaled_payloads WHERE stream LIKE ?",
        (f"{run_id}@%",),
    )
    one = next((s, p) for s, p in rows if b"said one" in bytes(p))
    two = next((s, p) for s, p in rows if b"said two" in bytes(p))
    _sql(
        sqlite_url,
        ("UPDATE journaled_payloads SET payload = ? WHERE stream = ?", (two[1], one[0])),
        ("UPDATE journaled_payloads SET payload = ? WHERE stream = ?", (one[1], two[0])),
    )
    with journaled.open(sqlite_url) as rt:
        report = rt.journal.verify()
    assert not report.ok
    assert _verify_cli(sqlite_url).returncode == 1


# -- J6/T1/T2: a journal written by the previous encoding ----------------------------------------


@pytest.fixture
def release2_url(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """A copy of the journal release 2 wrote: every partition, whole-event side rows."""
    return copy_journal(tmp_path, "release2-runs")


def test_a_release2_journal_is_listed_and_time_travelled(
    release2_url: tuple[str, dict[str, Any]],
) -> None:
    """T1/T2/J6: release 2's runs list with their statuses and every position equals a fold."""
    url, expected = release2_url
    runs = expected["runs"]
    listed = _cli(url, "runs", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    status = {r["run_id"]: r["status"] for r in json.loads(listed.stdout)}
    # "wide" crashed mid-run when release 2 wrote it: its owner is long gone (ADR 0088).
    assert status == {runs["chain"]: "completed", runs["wide"]: "interrupted"}
    with journaled.open(url, clock=journaled.testing.ManualClock(start=1_800_000_000_000)) as rt:
        register_tools(rt)
        journal = rt.runs._journal
        end = rt.journal.position()
        for run_id in runs.values():  # the cold path first: release 2's snapshots
            assert rt.runs.at(run_id, end) == _plain_at(journal, run_id, end)
        chain = {s: (s.status, s.steps_done, s.steps_total, s.wave) for s in rt.runs.list()}
        assert chain[runs["chain"]][:3] == ("completed", 3, 3)
        assert chain[runs["chain"]][3] == 3  # release 2 stored every partition
        for run_id in runs.values():
            first = journal.first(run_id)
            assert first is not None
            for position in range(first.position, rt.journal.position() + 1):
                assert rt.runs.at(run_id, position) == _plain_at(journal, run_id, position)
        # Resume the crashed run in today's encoding: a mixed stream, warm cache.
        resumed = rt.runs.resume(runs["wide"], take_over=True)
        assert resumed.ok
        end = rt.journal.position()
        for position in range(journal.first(runs["wide"]).position, end + 1):  # type: ignore[union-attr]
            assert rt.runs.at(runs["wide"], position) == _plain_at(journal, runs["wide"], position)
        assert {s: s.status for s in rt.runs.list()}[runs["wide"]] == "completed"
        assert rt.journal.verify().ok
    assert _verify_cli(url).returncode == 0


def test_a_release2_run_purged_today_leaves_nothing_and_verifies(
    release2_url: tuple[str, dict[str, Any]],
) -> None:
    """R2/R7: purging a run release 2 stored erases its outputs everywhere; verify still passes."""
    url, expected = release2_url
    wide = expected["runs"]["wide"]
    with journaled.open(url) as rt:
        register_tools(rt)
        rt.runs.resume(wide, take_over=True)
        end = rt.journal.position()
        assert "{'echo'" in repr(rt.runs.at(wide, end))
        assert rt.runs.purge(wide, "forget") > 0
        for position in range(rt.runs.history(wide)[0].position, rt.journal.position() + 1):
            assert "{'echo'" not in repr(rt.runs.at(wide, position)), position
        assert rt.journal.verify().ok
    conn = sqlite3.connect(_path(url))
    try:
        payloads = [bytes(p) for (p,) in conn.execute("SELECT payload FROM journaled_payloads")]
        states = [bytes(s) for (s,) in conn.execute("SELECT state FROM journaled_snapshots")]
    finally:
        conn.close()
    assert not any(b"echo" in p and b"x" in p for p in payloads if wide.encode() in p)
    assert not any(b"\xa4echo" in s for s in states)


# -- E3/ADR 0035: a wave held back by caps keeps its explanation --------------------------------


def test_a_step_held_back_by_a_cap_is_explained_mid_run(sqlite_url: str) -> None:
    """E3/O6/T1: a wave whose cap holds a step back keeps its partition; at and why show it."""
    import threading

    gate, started = threading.Event(), threading.Event()

    def slow(_: object) -> None:
        started.set()
        gate.wait(WAIT)

    with journaled.open(sqlite_url) as rt:
        rt.register_tool("slow", slow)
        plan = journaled.Plan(
            goal="caps",
            steps=[journaled.Step("a", tool="slow"), journaled.Step("b", tool="slow")],
        )
        handle = rt.start(plan, limits=journaled.Limits(per_tool={"slow": 1}))
        try:
            assert started.wait(WAIT)
            journaled.testing.wait_for(
                lambda: any(e.kind == "run.step-started" for e in rt.runs.history(handle.run_id)),
                timeout=WAIT,
            )
            kinds = [e.kind for e in rt.runs.history(handle.run_id)]
            assert "run.wave-partitioned" in kinds  # not implied: b was held back
            now = rt.runs.at(handle.run_id, rt.journal.position())
            assert {s.id: s.status for s in now.plan.steps} == {"a": "running", "b": "pending"}
            why = rt.runs.why(handle.run_id)
            assert "wave 1: runnable a, b" in why, why
            [summary] = rt.runs.list()
            assert (summary.wave, summary.running, summary.steps_done) == (1, ("a",), 0)
        finally:
            gate.set()
        assert handle.result(timeout=WAIT).ok


# -- M9/R2: redacted and purged text never comes back through the new read paths ----------------


def test_a_secret_in_a_goal_or_output_stays_out_of_summaries_cache_and_spans(
    sqlite_url: str,
) -> None:
    """M9/T1/T2/T3: a secret in a goal or a step output is redacted in at, list, CLI and spans."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import journaled.otel

    secret = "sk-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6"
    exporter = InMemorySpanExporter()
    with journaled.open(sqlite_url) as rt:
        journaled.otel.instrument(rt, tracer_provider=_provider_with(SimpleSpanProcessor(exporter)))

        def leak(_: object) -> str:
            raise RuntimeError(f"failed with key {secret}")

        rt.register_tool("speak", lambda _: f"key={secret}")
        rt.register_tool("leak", leak)
        plan = journaled.Plan(
            goal=f"deploy using {secret}",
            steps=[journaled.Step("a", tool="speak"), journaled.Step("b", tool="leak")],
        )
        result = rt.execute(plan)
        first = rt.runs.history(result.run_id)[0].position
        seen = [repr(rt.runs.at(result.run_id, p)) for p in range(first, rt.journal.position() + 1)]
        seen.append(repr(rt.runs.list()[0].as_dict()))
        seen.append(rt.runs.why(result.run_id))
    seen.append(_cli(sqlite_url, "runs", "list", "--json").stdout)
    seen.append(_cli(sqlite_url, "runs", "list").stdout)
    seen.append(_cli(sqlite_url, "runs", "follow", result.run_id, "--json").stdout)
    seen += [repr(dict(s.attributes or {})) + repr(s.events) for s in exporter.get_finished_spans()]
    assert exporter.get_finished_spans()
    for text in seen:
        assert secret not in text
    raw = Path(_path(sqlite_url)).read_bytes()
    assert secret.encode() not in raw


def test_an_orchestration_purged_elsewhere_leaves_a_warm_cache_clean(shared_url: str) -> None:
    """R2/T1/T2: after another runtime purges an orchestration, cached passes hold no output."""
    with journaled.open(shared_url) as a, journaled.open(shared_url) as b:
        for rt in (a, b):
            rt.register_tool("speak", lambda _: SECRET_OUTPUT)

        def planner(goal: str, observations: object, _: object) -> journaled.Plan:
            return journaled.Plan(goal=goal, steps=[journaled.Step("s", tool="speak")])

        out = a.orchestrate("an orchestrated secret", planner, require_approval=True)
        assert out.status == "waiting_for_approval"
        waiting = a.runs.at(out.run_id, a.journal.position())  # no pass run yet (O4, O7)
        assert [s.status for s in waiting.plan.steps] == ["pending"]
        assert SECRET_OUTPUT not in json.dumps(waiting.observations)
        assert a.runs.list()[0].status == "waiting_for_approval"  # a's projection is warm
        done = b.resume(out.run_id, approve=True)
        assert isinstance(done, journaled.Outcome)
        assert done.status == "completed"
        end = a.journal.position()
        assert SECRET_OUTPUT in repr(a.runs.at(out.run_id, end))  # the pass, seen from a
        assert SECRET_OUTPUT in repr(a.runs.at(out.run_id, end - 1))  # now from its timeline
        pass_run = {str(s): s for s in a.runs.list()}[out.run_id].current_run or ""
        assert pass_run in a.runs.checkpoints
        assert b.runs.purge(out.run_id, "forget") > 0
        after = a.journal.position()
        first = a.runs.history(out.run_id)[0].position
        for position in range(first, after + 1):
            try:
                state = a.runs.at(out.run_id, position)
            except ValueError:
                continue  # before the pass had a run
            assert SECRET_OUTPUT not in repr(state), position
        summary = {str(s): s for s in a.runs.list()}[out.run_id]
        assert summary.status == "purged"
        assert "orchestrated secret" not in repr(a.runs.list())


# -- T2/T4: a journal nobody may write ----------------------------------------------------------


def _without_write_rights() -> list[str]:
    """Return a command prefix that runs a program unable to write what it does not own."""
    import os
    import shutil

    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:  # util-linux: on every machine the suite runs on
        pytest.fail("running as root needs setpriv (util-linux) to enforce file permissions")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]


@pytest.mark.parametrize("directory_writable", [False, True], ids=["archive", "file-only"])
def test_a_read_only_journal_is_listed_followed_and_time_travelled(
    tmp_path: Path, directory_writable: bool
) -> None:
    """T2/T4: a read-only journal is listed, followed and time-travelled; nothing is written."""
    archive = tmp_path / "archive"
    archive.mkdir()
    file = archive / "journal.sqlite"
    url = f"sqlite:///{file}"
    with journaled.open(url) as rt:
        rt.register_tool("noop", lambda _: None)
        ids = [rt.execute(_chain(3, goal=f"g{n}")).run_id for n in range(2)]
        rt.journal.position()
    before = file.read_bytes()
    file.chmod(0o444)
    archive.chmod(0o755 if directory_writable else 0o555)
    code = (
        "import sys, journaled\n"
        "rt = journaled.Runtime(sys.argv[1], create=False)\n"
        "try:\n"
        "    listed = rt.runs.list()\n"
        "    assert [s.status for s in listed] == ['completed', 'completed'], listed\n"
        "    end = rt.journal.position()\n"
        "    for run_id in listed:\n"
        "        for p in range(rt.runs.history(run_id)[0].position, end + 1):\n"
        "            rt.runs.at(run_id, p)\n"
        "        assert rt.runs.at(run_id, end).ok\n"
        "finally:\n"
        "    rt.close()\n"
        "print('ok')\n"
    )
    prefix = _without_write_rights()
    try:
        listed = subprocess.run(
            [*prefix, *CLI, "--url", url, "runs", "list", "--json"],
            capture_output=True,
            text=True,
            timeout=WAIT,
            check=False,
        )
        followed = subprocess.run(
            [*prefix, *CLI, "--url", url, "runs", "follow", ids[0], "--json"],
            capture_output=True,
            text=True,
            timeout=WAIT,
            check=False,
        )
        api = subprocess.run(
            [*prefix, sys.executable, "-c", code, url],
            capture_output=True,
            text=True,
            timeout=WAIT,
            check=False,
        )
    finally:
        archive.chmod(0o755)
        file.chmod(0o644)
    assert listed.returncode == 0, listed.stderr
    assert [r["run_id"] for r in json.loads(listed.stdout)] == ids
    assert followed.returncode == 0, followed.stderr
    assert api.returncode == 0, api.stderr
    assert api.stdout.strip() == "ok"
    assert file.read_bytes() == before


# -- T2: SIGKILL while the projection is being stored -------------------------------------------

_STORING_CHILD = """
import pathlib, sys
import journaled
url, marker = sys.argv[1], pathlib.Path(sys.argv[2])
rt = journaled.open(url)
rt.register_tool("noop", lambda _: None)
for n in range(150):
    rt.execute(journaled.Plan(goal=f"goal {n} " + "x" * 200,
                              steps=[journaled.Step("a", tool="noop")]))
n = 0
while True:  # store, append, store again ... until killed
    rt.runs.summaries.save()
    marker.write_text(str(n))
    rt.execute(journaled.Plan(goal=f"more {n}", steps=[journaled.Step("a", tool="noop")]))
    n += 1
"""


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2])
def test_a_kill_while_storing_the_projection_leaves_it_consistent(
    tmp_path: Path, delay: float
) -> None:
    """T2/R7: a SIGKILL at any point of storing the projection leaves a true projection."""
    import signal
    import time

    from journaled.events.run_summaries import TOPICS, _summaries, check_stored, fold

    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    marker = tmp_path / "stored"
    child = subprocess.Popen(
        [sys.executable, "-c", _STORING_CHILD, url, str(marker)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert child.poll() is None, child.stderr.read() if child.stderr else ""
            assert time.monotonic() < deadline, "the child never stored its projection"
            time.sleep(0.01)
        time.sleep(delay)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        if child.stderr is not None:
            child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    journal = Journal(parse_url(url), codec(), create=False)
    try:
        stored = journal.snapshot(SUMMARIES_KEY)
        assert stored is not None
        assert check_stored(journal, stored[1]) is None
        runs: dict[str, Any] = {}
        for event in journal.read(topics=TOPICS):
            fold(runs, event)
        assert RunSummaries(journal).read() == _summaries(runs)
        assert journal.verify().ok
    finally:
        journal.close()
    done = _cli(url, "runs", "list", "--json")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)) == len(runs)


# -- T1: the cold path's trust in the executor's snapshot ---------------------------------------


def test_a_cold_at_answers_from_the_journal_not_an_altered_snapshot(sqlite_url: str) -> None:
    """T1/R7: runs.at at the end answers the journal's state, the same on every call."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("speak", lambda data: f"said {data}")
        run_id = rt.execute(
            journaled.Plan(goal="g", steps=[journaled.Step("a", tool="speak", input="one")])
        ).run_id
        end = rt.journal.position()
    from journaled.events.compressed import deflate, inflate

    [(state,)] = _rows(
        sqlite_url, "SELECT state FROM journaled_snapshots WHERE stream = ?", (run_id,)
    )
    plain = inflate(bytes(state))
    assert b"said one" in plain
    _sql(
        sqlite_url,
        (
            "UPDATE journaled_snapshots SET state = ? WHERE stream = ?",
            (deflate(plain.replace(b"said one", b"said 0ne")), run_id),
        ),
    )
    with journaled.open(sqlite_url) as rt:
        truth = _plain_at(rt.runs._journal, run_id, end)
        first = rt.runs.at(run_id, end)
        second = rt.runs.at(run_id, end)
    assert truth.observations[0].output == "said one"
    assert second == truth
    assert first == truth


def test_submodules_resolve_as_attributes_after_import_journaled() -> None:
    """T4/§5: after `import journaled`, the submodules the door used to bind still resolve."""
    code = (
        "import journaled\n"
        "assert journaled.errors.JournalClosed is journaled.JournalClosed\n"
        "assert callable(journaled.runtime.verify)\n"
        "assert journaled.subscriptions.AsyncSubscription is not None\n"
        "assert journaled.memory.Memory is journaled.Memory\n"
        "assert journaled.events.__name__ == 'journaled.events'\n"
        "assert journaled.actors.__name__ == 'journaled.actors'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT, check=False
    )
    assert done.returncode == 0, done.stderr


def test_public_names_resolve_from_many_threads_at_once() -> None:
    """T4: every public name, first touched by its own thread at the same instant, resolves."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import threading, journaled\n"
            "names = list(journaled.__all__)\n"
            "barrier = threading.Barrier(len(names))\n"
            "errors = []\n"
            "def get(name):\n"
            "    barrier.wait()\n"
            "    try:\n"
            "        assert getattr(journaled, name) is not None\n"
            "    except BaseException as exc:\n"
            "        errors.append((name, repr(exc)))\n"
            "threads = [threading.Thread(target=get, args=(n,)) for n in names]\n"
            "for t in threads: t.start()\n"
            "for t in threads: t.join(60)\n"
            "assert not errors, errors\n"
            "assert not any(t.is_alive() for t in threads)\n",
        ],
        capture_output=True,
        text=True,
        timeout=WAIT * 2,
        check=False,
    )
    assert done.returncode == 0, done.stderr


# -- T1: time travel from many threads while the run executes -----------------------------------


def test_at_from_threads_while_the_run_executes_equals_a_plain_fold(sqlite_url: str) -> None:
    """T1/O7: runs.at from reader threads during a live run always equals a plain prefix fold."""
    import random
    import threading

    with journaled.open(sqlite_url) as rt:
        rt.register_tool("noop", lambda _: None)
        handle = rt.start(_chain(150))
        journal = rt.runs._journal
        journaled.testing.wait_for(lambda: journal.first(handle.run_id) is not None, WAIT)
        start = journal.first(handle.run_id).position  # type: ignore[union-attr]
        seen: list[tuple[int, journaled.ExecuteResult]] = []
        failures: list[BaseException] = []
        finished = threading.Event()

        def read(seed: int) -> None:
            chance = random.Random(seed)
            try:
                while not finished.is_set() or len(seen) < 60:
                    end = rt.journal.position()
                    position = chance.randint(start, end)
                    seen.append((position, rt.runs.at(handle.run_id, position)))
            except BaseException as exc:
                failures.append(exc)

        readers = [threading.Thread(target=read, args=(n,)) for n in range(3)]
        for reader in readers:
            reader.start()
        result = handle.result(timeout=WAIT * 4)
        finished.set()
        for reader in readers:
            reader.join(WAIT)
        assert not failures, failures
        assert isinstance(result, journaled.ExecuteResult)
        assert result.ok
        for position, state in seen:
            assert state == _plain_at(journal, handle.run_id, position), position


@pytest.mark.parametrize("limit", [4, 5])
def test_a_limit_above_the_number_of_runs_keeps_them_all(sqlite_url: str, limit: int) -> None:
    """T2: runs.list(limit=N) and `runs list --limit N` keep every run when there are fewer."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("noop", lambda _: None)
        ids = [rt.execute(_chain(1)).run_id for _ in range(3)]
        listed = rt.runs.list(limit=limit)
    done = _cli(sqlite_url, "runs", "list", "--json", "--limit", str(limit))
    assert done.returncode == 0, done.stderr
    assert [r["run_id"] for r in json.loads(done.stdout)] == ids
    assert listed == ids


def test_odd_goals_cannot_drive_the_terminal(sqlite_url: str) -> None:
    """T2: escape sequences, bells and bidi controls in a goal never reach list/follow output."""
    goal = "evil \x1b[31mRED\x1b[0m [bold]MARKUP[/] \x1b]0;title\x07 a\nb \u202egnp.exe"
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("noop", lambda _: None)
        run_id = rt.execute(_chain(1, goal=goal)).run_id
    for args in (("runs", "list"), ("runs", "follow", run_id), ("runs", "why", run_id)):
        done = _cli(sqlite_url, *args)
        assert done.returncode == 0, done.stderr
        for control in ("\x1b", "\x07", "\u202e"):
            assert control not in done.stdout, (args, control)


def test_instrument_rejects_what_is_not_a_tracer_provider() -> None:
    """T3: instrument(rt, tracer_provider=<not a provider>) is a one-line error naming it."""
    import journaled.otel

    with journaled.open("memory://") as rt:
        with pytest.raises((TypeError, ValueError), match="tracer_provider"):
            journaled.otel.instrument(rt, tracer_provider="a provider")  # type: ignore[arg-type]
        rt.register_tool("noop", lambda _: None)
        assert rt.execute(_chain(1)).ok  # nothing was installed: the run is untraced


def test_instrument_rejects_what_is_not_a_runtime() -> None:
    """T3: instrument() of something that is not a runtime is a TypeError saying what it takes."""
    import journaled.otel

    for thing in (None, "rt", object()):
        with pytest.raises(TypeError, match=r"takes a runtime from journaled\.open\(\)"):
            journaled.otel.instrument(thing)


def test_cli_since_odd_times_are_one_line_errors(sqlite_url: str) -> None:
    """T2: `runs list --since` with an unreadable or pre-1970 time is one line, no traceback."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("noop", lambda _: None)
        rt.execute(_chain(1))
    for since in ("", "12345", "nan", "1e300", "1969-01-01", "0001-01-01"):
        done = _cli(sqlite_url, "runs", "list", "--json", "--since", since)
        assert done.returncode == 1, (since, done.stdout)
        assert "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    far = _cli(sqlite_url, "runs", "list", "--json", "--since", "9999-12-31T23:59:59Z")
    assert far.returncode == 0, far.stderr
    assert json.loads(far.stdout) == []


# -- T1: stories the checkpoint property does not tell -------------------------------------------


def _every_position_equals_a_plain_fold(rt: journaled.Runtime, run_id: str, every: int) -> int:
    import random

    from journaled.events.run_checkpoints import RunCheckpoints

    journal = rt.runs._journal
    positions = [e.position for e in rt.runs.history(run_id)]
    positions = list(range(positions[0], rt.journal.position() + 1))
    for order in (positions, positions[::-1], random.Random(3).sample(positions, len(positions))):
        rt.runs.checkpoints = RunCheckpoints(every=every)
        for position in order:
            assert rt.runs.at(run_id, position) == _plain_at(journal, run_id, position), position
    return len(positions)


def _reserve_one(step: journaled.Step, remaining: float) -> float:
    return 1


@pytest.mark.parametrize("every", [1, 2, 3])
def test_cancel_failures_overruns_and_resumes_through_tiny_checkpoints(
    sqlite_url: str, every: int
) -> None:
    """T1/O7: cancel, failures, skips, overruns, answers and a budget raise fold exactly."""
    import threading

    gate, started = threading.Event(), threading.Event()

    def slow(_: object) -> None:
        started.set()
        gate.wait(WAIT)

    def boom(_: object) -> None:
        raise RuntimeError("boom")

    def greedy(step: journaled.Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        if ctx.answer is None:
            raise journaled.NeedsInput("go on?")
        return journaled.AgentResult(ok=True, output=ctx.answer, calls_used=5)

    with journaled.open(sqlite_url) as rt:
        rt.register_tool("slow", slow)
        rt.register_tool("noop", lambda _: None)
        rt.register_tool("boom", boom)
        rt.register_skill("think", lambda _: "t")
        rt.register_agent("greedy", greedy)
        step = journaled.Step
        cancelled = rt.start(
            journaled.Plan(
                goal="cancel",
                steps=[
                    step("a", tool="slow"),
                    step("g", agent="greedy"),
                    step("b", tool="noop", depends_on=["a"]),
                    step("c", tool="noop", depends_on=["b", "g"]),
                ],
            )
        )
        assert started.wait(WAIT)
        rt.cancel(cancelled.run_id)
        gate.set()
        cancelled.result(timeout=WAIT)
        mixed = rt.execute(
            journaled.Plan(
                goal="mixed",
                steps=[
                    step("x", tool="boom"),
                    step("y", tool="noop", depends_on=["x"]),
                    step("t1", skill="think"),
                    step("g", agent="greedy", depends_on=["t1"]),
                    step("t2", skill="think", depends_on=["g"]),
                    step("t3", skill="think", depends_on=["t2"]),
                ],
            ),
            call_budget=3,
            reserve=_reserve_one,
        )
        assert mixed.waiting == ["g"]
        rt.resume(mixed.run_id, answers={"g": "yes"}, reserve=_reserve_one)
        rt.resume(mixed.run_id, call_budget=100, reserve=_reserve_one)
        for run_id in (cancelled.run_id, mixed.run_id):
            assert _every_position_equals_a_plain_fold(rt, run_id, every) > 3


# -- J5/T4: the journal-only commands on a damaged journal ---------------------------------------


def _damaged_journal(url: str) -> str:
    """Write a run, then cut its step result's side row to no values (a damaged payload)."""
    with journaled.open(url) as rt:
        rt.register_tool("speak", lambda data: f"said {data}")
        run_id = rt.execute(
            journaled.Plan(goal="g", steps=[journaled.Step("a", tool="speak", input="one")])
        ).run_id
    rows = _rows(url, "SELECT stream, payload FROM journaled_payloads")
    [stream] = [s for s, payload in rows if b"said one" in bytes(payload)]
    _sql(url, ("UPDATE journaled_payloads SET payload = ? WHERE stream = ?", (b"\x90", stream)))
    return run_id


def test_runtime_commands_report_a_damaged_journal_in_one_line(sqlite_url: str) -> None:
    """J5: `runs why` and `runs show` on a damaged payload exit 1 naming the position."""
    run_id = _damaged_journal(sqlite_url)
    for args in (("runs", "why", run_id), ("runs", "show", run_id, "--at", "3")):
        done = _cli(sqlite_url, *args)
        assert done.returncode == 1, args
        assert "Traceback" not in done.stderr
        assert "position 3" in done.stderr


@pytest.mark.parametrize("command", ["list", "follow"])
def test_journal_only_commands_report_a_damaged_journal_in_one_line(
    sqlite_url: str, command: str
) -> None:
    """J5/T4: `runs list` / `runs follow` on a damaged payload exit 1 with one line naming it."""
    run_id = _damaged_journal(sqlite_url)
    args = ("runs", "list", "--json") if command == "list" else ("runs", "follow", run_id)
    done = _cli(sqlite_url, *args)
    assert done.returncode == 1
    assert "position 3" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_why_says_the_wave_of_each_step_of_a_chain(sqlite_url: str) -> None:
    """O6/ADR 0035: runs.why of a chain still names the wave each step ran in."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("noop", lambda _: None)
        run_id = rt.execute(_chain(3)).run_id
        why = rt.runs.why(run_id)
    for wave in (1, 2, 3):
        assert f"wave {wave}" in why, why


def test_why_still_says_the_waves_of_a_release2_chain(
    release2_url: tuple[str, dict[str, Any]],
) -> None:
    """O6/J6: a chain release 2 stored with every partition is explained wave by wave."""
    url, expected = release2_url
    with journaled.open(url) as rt:
        why = rt.runs.why(expected["runs"]["chain"])
    for wave in (1, 2, 3):
        assert f"wave {wave}: runnable c{wave - 1}" in why, why


def test_a_warm_projection_closed_after_a_purge_elsewhere_stores_no_goal(
    shared_url: str,
) -> None:
    """R2/T2: a runtime holding a goal in its projection stores none of it after a purge."""
    goal = "a goal that must go 8812"
    with journaled.open(shared_url) as a:
        a.register_tool("noop", lambda _: None)
        run_id = a.execute(_chain(2, goal=goal)).run_id
        assert a.runs.list()[0].goal == goal  # a's projection holds the goal
        with journaled.open(shared_url) as b:
            assert b.runs.purge(run_id, "forget") > 0
        assert a.runs.summaries.save() in (True, False)  # stores, or refuses: never the goal
    # a closed here: close stores the projection too.
    with journaled.open(shared_url) as c:
        stored = c.runs._journal.snapshot(SUMMARIES_KEY)
        assert stored is None or goal.encode() not in stored[1]
        assert c.runs.list()[0].status == "purged"
        assert goal not in repr(c.runs.list()[0].as_dict())
        assert c.journal.verify().ok


@pytest.mark.parametrize("position", [True, 2.5, float("nan"), "2", None])
def test_at_and_diff_reject_a_position_that_is_no_int(position: object) -> None:
    """T1/O7: runs.at and runs.diff reject a position that is not an int, naming it."""
    with journaled.open("memory://") as rt:
        rt.register_tool("noop", lambda _: None)
        run_id = rt.execute(_chain(1)).run_id
        with pytest.raises((TypeError, ValueError), match="position"):
            rt.runs.at(run_id, position)  # type: ignore[arg-type]
        with pytest.raises((TypeError, ValueError), match=r"position|a="):
            rt.runs.diff(run_id, position, 3)  # type: ignore[arg-type]


def test_at_rejects_positions_outside_the_run_in_one_line() -> None:
    """T1/O7: a position before the run or past the journal's end is a ValueError saying so."""
    with journaled.open("memory://") as rt:
        rt.register_tool("noop", lambda _: None)
        rt.memory.remember("first, so the run starts later")
        run_id = rt.execute(_chain(1)).run_id
        with pytest.raises(ValueError, match="before run"):
            rt.runs.at(run_id, 1)
        with pytest.raises(ValueError, match="past the end of the journal"):
            rt.runs.at(run_id, 10**30)
        with pytest.raises(ValueError, match="a <= b"):
            rt.runs.diff(run_id, 4, 3)
