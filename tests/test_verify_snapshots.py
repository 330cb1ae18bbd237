"""Verify compares every snapshot with the fold of the events it claims to cover (R7).

Snapshots are caches outside the digest chain (ADR 0021), so an edit to one is caught by folding
the journal again, not by a digest; these tests forge snapshot rows with raw SQL.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

import journaled
from journaled import AgentResult, NeedsInput, Plan, Step
from journaled.cli import main
from journaled.events.compressed import deflate, inflate
from journaled.events.journal import SNAPSHOT_TABLE
from journaled.runtime import verify
from journaled.testing import ManualClock

Forgery = Callable[[dict[str, Any], list[str]], None]


def _path(url: str) -> str:
    return url.removeprefix("sqlite:///")


def _asker(step: Step, ctx: journaled.AgentContext) -> AgentResult:
    if ctx.answer is None:
        raise NeedsInput("which region?")
    return AgentResult(output=f"deployed to {ctx.answer}", calls_used=1)


def _fail(data: Any) -> str:
    raise RuntimeError("the disk is full")


def _busy_runtime(rt: journaled.Runtime, clock: ManualClock) -> list[str]:
    """Remember, supersede, expire, delete and purge facts, and run plans; return run ids."""
    rt.memory.remember("deploys happen on Tuesdays", conflict_key="deploy-day")
    clock.advance(1000)
    rt.memory.remember("deploys happen on Thursdays", conflict_key="deploy-day", domain="ops")
    rt.memory.remember("the staging key rotates", valid_until=clock() + 10, confidence=0.5)
    gone = rt.memory.remember("the old bastion is bastion-1", scope="user")
    rt.memory.remember("the intern's nickname is Sparky")
    rt.memory.delete(gone.id)
    rt.register_tool("echo", lambda data: f"{data}-out")
    rt.register_tool("fail", _fail)
    rt.register_agent("asker", _asker)
    first = rt.execute(
        Plan(
            goal="ship it",
            steps=[
                Step("a", tool="echo", input={"text": "build"}),
                Step("b", tool="fail"),
                Step("c", agent="asker", depends_on=["a"]),
            ],
        )
    )
    rt.resume(first.run_id, answers={"c": "eu-west"})
    second = rt.execute(Plan(goal="tidy", steps=[Step("x", tool="echo", input="logs")]))
    return [first.run_id, second.run_id]


def test_a_clean_journal_with_snapshots_verifies(journal_url: str, clock: ManualClock) -> None:
    """R7: memory and run snapshots written in normal use agree with their events: verify is ok."""
    with journaled.open(journal_url, clock=clock) as rt:
        runs = _busy_runtime(rt, clock)
        assert rt.memory.checkpoint()
        purged = rt.memory.remember("a secret that will be purged")
        rt.memory.purge(purged.id, reason="asked to")
        rt.memory.remember("facts after the purge still fold", conflict_key="deploy-day")
        assert rt.memory.checkpoint()
        rt.runs.purge(runs[1], reason="asked to")
        report = rt.journal.verify()
        assert report.ok, report.problem
        assert report.snapshots >= 2  # memory's, and at least the unpurged run's
    if journal_url.startswith("memory"):
        return  # nothing outlives the runtime
    with journaled.open(journal_url, clock=clock) as rt:  # restored from the snapshot, folded on
        rt.memory.remember("one more after reopening")
        assert rt.memory.checkpoint()
    report = verify(journal_url)
    assert report.ok, report.problem
    assert report.snapshots >= 2


def test_snapshots_of_two_organizations_verify(sqlite_url: str, clock: ManualClock) -> None:
    """R7: each organization's memory snapshot is checked against its own view of the events."""
    for organization in ("acme", "globex"):
        with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
            shared = rt.memory.remember(f"{organization} ships on Fridays", scope="organization")
            rt.memory.remember(f"{organization} on-call rota", conflict_key="rota")
            rt.memory.delete(shared.id)
            rt.memory.remember(f"{organization} ships on Mondays", scope="organization")
            assert rt.memory.checkpoint()
    report = verify(sqlite_url)
    assert report.ok, report.problem
    assert report.snapshots == 2


def _edit_memory_snapshot(url: str, forge: Forgery) -> tuple[str, int]:
    """Change the project scope of the memory snapshot with raw SQL; return its key and position."""
    conn = sqlite3.connect(_path(url))
    key, state = conn.execute(
        f"SELECT stream, state FROM {SNAPSHOT_TABLE} WHERE stream LIKE 'memory:%'"  # noqa: S608
    ).fetchone()
    snapshot = msgspec.msgpack.decode(state)
    scope = snapshot["scopes"]["project"]  # embedded as encoded (ADR 0058)
    forge(scope, sorted(scope["facts"]))
    conn.execute(
        f"UPDATE {SNAPSHOT_TABLE} SET state = ? WHERE stream = ?",  # noqa: S608
        (msgspec.msgpack.encode(snapshot), key),
    )
    conn.commit()
    conn.close()
    return str(key), int(snapshot["position"])


def _retext(scope: dict[str, Any], ids: list[str]) -> None:
    scope["facts"][ids[0]]["text"] = "wire the funds to account 666"


def _rescope(scope: dict[str, Any], ids: list[str]) -> None:
    scope["facts"][ids[0]]["scope"] = "session"


def _unsupersede(scope: dict[str, Any], ids: list[str]) -> None:
    for fact in scope["facts"].values():
        fact.pop("superseded_by", None)


def _drop(scope: dict[str, Any], ids: list[str]) -> None:
    del scope["facts"][ids[-1]]


def _add(scope: dict[str, Any], ids: list[str]) -> None:
    scope["facts"]["f-forged"] = {**scope["facts"][ids[0]], "id": "f-forged"}


def _reindex(scope: dict[str, Any], ids: list[str]) -> None:
    postings = scope["index"]["postings"]
    postings["bitcoin"] = dict(next(iter(postings.values())))


@pytest.mark.parametrize("forge", [_retext, _rescope, _unsupersede, _drop, _add, _reindex])
def test_a_forged_memory_snapshot_is_reported(
    sqlite_url: str, clock: ManualClock, forge: Forgery
) -> None:
    """R7: a memory snapshot whose facts or index differ from the events' fold is reported."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.memory.remember("deploys happen on Tuesdays", conflict_key="deploy-day")
        rt.memory.remember("deploys happen on Thursdays", conflict_key="deploy-day")
        rt.memory.remember("the staging key rotates monthly")
        assert rt.memory.checkpoint()
    assert verify(sqlite_url).ok
    key, position = _edit_memory_snapshot(sqlite_url, forge)
    report = verify(sqlite_url)
    assert not report.ok
    assert report.problem is not None
    assert report.problem.kind == "snapshot-altered"
    assert report.problem.position == position
    assert key in report.problem.reason


def _edit_run_snapshot(url: str, run_id: str, edit: Callable[[dict[str, Any]], None]) -> None:
    """Decode a run's stored snapshot, let ``edit`` change it, and store it back by hand."""
    conn = sqlite3.connect(_path(url))
    (state,) = conn.execute(
        f"SELECT state FROM {SNAPSHOT_TABLE} WHERE stream = ?",  # noqa: S608
        (run_id,),
    ).fetchone()
    snapshot = msgspec.msgpack.decode(inflate(state))
    edit(snapshot)
    conn.execute(
        f"UPDATE {SNAPSHOT_TABLE} SET state = ? WHERE stream = ?",  # noqa: S608
        (deflate(msgspec.msgpack.encode(snapshot)), run_id),
    )
    conn.commit()
    conn.close()


def test_a_forged_run_snapshot_is_reported(sqlite_url: str, clock: ManualClock) -> None:
    """R7: a run snapshot whose state differs from its stream's fold is reported, named."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("echo", lambda data: f"{data}-out")
        run = rt.execute(Plan(goal="tidy", steps=[Step("x", tool="echo", input="logs")]))
    assert verify(sqlite_url).ok

    def edit(snapshot: dict[str, Any]) -> None:
        snapshot["observations"][0]["output"] = "rm -rf /"

    _edit_run_snapshot(sqlite_url, run.run_id, edit)
    report = verify(sqlite_url)
    assert report.problem is not None
    assert report.problem.kind == "snapshot-altered"
    assert run.run_id in report.problem.reason
    assert "observations" in report.problem.reason


EQUAL_BUT_FORGED = {
    "int to bool": (1, True),
    "int to float": (1, 1.0),
    "zero to negative zero": (0.0, -0.0),
    "false to zero": (False, 0),
    "nested ints to bools": ({"k": [1, 0]}, {"k": [True, False]}),
}


@pytest.mark.parametrize("case", list(EQUAL_BUT_FORGED))
def test_a_run_snapshot_forged_to_a_value_equal_by_python_is_reported(
    sqlite_url: str, clock: ManualClock, case: str
) -> None:
    """R7, R5, ADR 0097: ``==`` finds 1, 1.0 and True equal, and 0.0 and -0.0; a reader of the
    record does not. A snapshot forged so is reported, naming the field, not served by a
    reopen as the run's state."""
    real, forged = EQUAL_BUT_FORGED[case]
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("t", lambda _: real)
        run = rt.execute(Plan(goal="g", steps=[Step("a", tool="t")]))
    assert verify(sqlite_url).ok

    def edit(snapshot: dict[str, Any]) -> None:
        snapshot["observations"][0]["output"] = forged

    _edit_run_snapshot(sqlite_url, run.run_id, edit)
    report = verify(sqlite_url)
    assert report.problem is not None
    assert report.problem.kind == "snapshot-altered"
    assert report.problem.reason.endswith("it differs in observations")


def test_a_nan_in_a_steps_input_or_a_tools_output_verifies(
    sqlite_url: str, clock: ManualClock
) -> None:
    """R7, R5, ADR 0097: a NaN or an infinity in a step's input or a tool's output (numpy and
    pandas give them) is journaled as given; verify finds the untouched run snapshot equal to
    its fold, though NaN != NaN; replay equals the live result; the JSON doors show null.
    A NaN forged into something else is still reported."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("echo", lambda data: data)
        rt.register_tool("score", lambda _: {"score": math.nan, "worst": -math.inf})
        run = rt.execute(
            Plan(goal="g", steps=[Step("a", tool="echo", input=math.nan), Step("b", tool="score")])
        )
        assert run.ok
        report = rt.journal.verify()
        assert report.ok, report.problem
        assert report.snapshots >= 1
        replayed = rt.runs.at(run.run_id, rt.journal.position())
        assert msgspec.msgpack.encode(replayed.observations) == msgspec.msgpack.encode(
            run.observations
        )
        scored = next(o for o in replayed.observations if o.step_id == "b")
        assert math.isnan(scored.output["score"])
    runner = CliRunner()
    for args in (["runs", "show", run.run_id], ["runs", "history", run.run_id]):
        for extra in ([], ["--json"]):
            shown = runner.invoke(main, ["--url", sqlite_url, *args, *extra])
            assert shown.exit_code == 0, shown.output
    shown = runner.invoke(main, ["--url", sqlite_url, "runs", "show", run.run_id, "--json"])
    assert '"score":null' in shown.output.replace(" ", "")

    def edit(snapshot: dict[str, Any]) -> None:
        # The wave's two steps finish in either order: find "b" by its id.
        scored = next(o for o in snapshot["observations"] if o["step_id"] == "b")
        scored["output"]["score"] = 0.5

    _edit_run_snapshot(sqlite_url, run.run_id, edit)
    report = verify(sqlite_url)
    assert report.problem is not None
    assert report.problem.kind == "snapshot-altered"
    assert report.problem.reason.endswith("it differs in observations")


def test_journal_verify_exits_1_naming_the_forged_snapshot(
    sqlite_url: str, clock: ManualClock
) -> None:
    """R7: `journal verify` exits 1 and names the snapshot key and position that was forged."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.memory.remember("the deploy key rotates on Mondays")
        assert rt.memory.checkpoint()
    clean = CliRunner().invoke(main, ["--url", sqlite_url, "journal", "verify"])
    assert clean.exit_code == 0, clean.output
    assert "1 snapshots checked" in clean.output
    key, position = _edit_memory_snapshot(sqlite_url, _retext)
    result = CliRunner().invoke(main, ["--url", sqlite_url, "journal", "verify"])
    assert result.exit_code == 1, result.output
    assert f"FAILED at position {position} (snapshot-altered)" in result.output
    assert f"snapshot {key} at position {position}" in result.output


def test_open_folds_the_events_when_a_snapshot_text_is_forged(
    sqlite_url: str, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """R7: an open never serves a fact text its payload does not hold; it folds the events."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        facts = [rt.memory.remember(f"the deploy key rotates on day {i}") for i in range(3)]
        assert rt.memory.checkpoint()
    with caplog.at_level("WARNING", logger="journaled.memory"), journaled.open(sqlite_url) as rt:
        assert sorted(f.text for f in rt.memory.all()) == sorted(f.text for f in facts)
    assert not [r for r in caplog.records if "does not match the journal" in r.message]
    key, _ = _edit_memory_snapshot(sqlite_url, _retext)
    with caplog.at_level("WARNING", logger="journaled.memory"), journaled.open(sqlite_url) as rt:
        served = sorted(f.text for f in rt.memory.all())
        found = rt.memory.search("funds account")
    assert served == sorted(f.text for f in facts)
    assert found == []
    warned = [r.message for r in caplog.records if "does not match the journal" in r.message]
    assert len(warned) == 1
    assert key in warned[0]
