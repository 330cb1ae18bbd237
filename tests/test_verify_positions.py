"""Tamper evidence (R7, ADR 0021, ADR 0082): verify names the event that was altered or removed.

The chain keeps one digest record per commit (on SQLite in the commit's last row). These tests
tamper with one event of a commit, or with the row that carries the record, and check that the
reported position is that event's, not its commit's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from click.testing import CliRunner
from test_verify import EVENTS, _backend, _pendings, _sql

import journaled
from journaled import Plan, Step
from journaled.cli import main
from journaled.events.catalog import codec
from journaled.events.journal import Journal, VerifyReport
from journaled.events.url import parse_url
from journaled.runtime import verify


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, sqlite_url: str) -> str:
    """Yield a fresh journal URL on each backend that raw SQL can reach."""
    if request.param == "postgresql":
        url: str = request.getfixturevalue("pg_url")
        return url
    return sqlite_url


@dataclass(frozen=True)
class _Story:
    run_id: str
    positions: dict[tuple[str, str | None], tuple[int, int]]
    """(kind, step id) -> (position, version) of the run's events."""
    last: int


def _run_story(url: str) -> _Story:
    """Remember four facts (one commit each), then run two steps (commits of two events)."""
    with journaled.open(url) as rt:
        for i in range(4):
            rt.memory.remember(f"fact {i}")
        rt.register_tool("t", lambda x: f"out-{x}-XYZ")
        plan = Plan(
            goal="g",
            steps=[Step("a", tool="t", input=1), Step("b", tool="t", input=2, depends_on=["a"])],
        )
        run = rt.execute(plan)
        positions = {
            (e.kind, getattr(e.data, "step_id", None)): (e.position, e.version)
            for e in rt.runs.history(run.run_id)
        }
        return _Story(run.run_id, positions, rt.journal.position())


def _delete(url: str, *positions: int) -> None:
    table, pos = EVENTS[_backend(url)]
    for position in positions:
        _sql(url, f"DELETE FROM {table} WHERE {pos} = ?", (position,))  # noqa: S608


def _failed(report: VerifyReport, position: int, kind: str) -> str:
    assert not report.ok, report
    assert report.problem is not None
    assert (report.problem.position, report.problem.kind) == (position, kind), report.problem
    assert f"position {position}" in report.problem.reason
    return report.problem.reason


def test_a_changed_step_output_is_reported_at_the_step_that_returned_it(db_url: str) -> None:
    """R7, ADR 0021: a payload changed in place is reported at its event, not its commit's last."""
    story = _run_story(db_url)
    position, version = story.positions[("run.step-succeeded", "a")]
    key = f"{story.run_id}@{version}"
    [(blob,)] = _sql(db_url, "SELECT payload FROM journaled_payloads WHERE stream = ?", (key,))
    assert b"XYZ" in bytes(blob)
    changed = bytes(blob).replace(b"XYZ", b"XYQ")  # still decodable
    _sql(db_url, "UPDATE journaled_payloads SET payload = ? WHERE stream = ?", (changed, key))
    reason = _failed(verify(db_url), position, "payload-altered")
    assert key in reason


def test_removing_the_row_that_ends_a_commit_is_reported_at_that_event(db_url: str) -> None:
    """R7, ADR 0021: the deleted last row of a commit (its record's row) is named, not its first."""
    story = _run_story(db_url)
    position, _ = story.positions[("run.step-started", "b")]
    succeeded, _ = story.positions[("run.step-succeeded", "a")]
    assert succeeded == position - 1  # the same commit: succeeded a, then started b
    _delete(db_url, position)
    _failed(verify(db_url), position, "removed")


def test_removing_the_journals_last_event_is_reported_removed_at_its_position(
    db_url: str,
) -> None:
    """R7, ADR 0021: the journal's deleted last event is `removed` at its position, not inserted."""
    story = _run_story(db_url)
    position, _ = story.positions[("run.finished", None)]
    assert position == story.last
    _delete(db_url, position)
    reason = _failed(verify(db_url), position, "removed")
    assert "not appended through the journal" not in reason
    result = CliRunner().invoke(main, ["--url", db_url, "journal", "verify"])
    assert result.exit_code == 1, result.output
    assert f"FAILED at position {position} (removed)" in result.output
    as_json = CliRunner().invoke(main, ["--url", db_url, "--json", "journal", "verify"])
    assert json.loads(as_json.output)["problem"]["position"] == position


def test_removing_a_last_commit_of_one_event_is_reported_at_its_position(db_url: str) -> None:
    """R7, ADR 0021: a deleted last remember (its own commit) is `removed` at its position."""
    with journaled.open(db_url) as rt:
        for i in range(3):
            rt.memory.remember(f"fact {i}")
        last = rt.journal.position()
    _delete(db_url, last)
    _failed(verify(db_url), last, "removed")


def test_removing_a_whole_last_commit_is_reported_at_its_first_position(db_url: str) -> None:
    """R7, ADR 0021: a last commit deleted whole is named by the payloads it left behind."""
    journal = Journal(parse_url(db_url), codec())
    try:
        journal.append(_pendings("a", 1), payloads={"mem_a_000000": b"first"})
        events = _pendings("b", 3)
        positions = journal.append(events, payloads={e.stream: b"text" for e in events})
    finally:
        journal.close()
    _delete(db_url, *positions)
    _failed(verify(db_url), positions[0], "removed")


def _four_event_commit(url: str, followed: bool) -> list[int]:
    """Append a commit of one event, then one of four, whose positions are returned, then (if
    ``followed``) one more of one event."""
    journal = Journal(parse_url(url), codec())
    try:
        journal.append(_pendings("a", 1))
        positions = journal.append(_pendings("b", 4))
        if followed:
            journal.append(_pendings("c", 1))
    finally:
        journal.close()
    return positions


_FOLLOWED = pytest.mark.parametrize("followed", [True, False], ids=["then-a-commit", "at-the-end"])
"""The four-event commit is followed by another, or is the journal's last."""


@_FOLLOWED
def test_removing_an_event_inside_a_commit_is_reported_at_its_position(
    db_url: str, followed: bool
) -> None:
    """R7, ADR 0021: an event deleted from the middle of a four-event commit is named."""
    positions = _four_event_commit(db_url, followed)
    _delete(db_url, positions[1])
    _failed(verify(db_url), positions[1], "removed")


@_FOLLOWED
def test_removing_events_with_the_row_that_ends_their_commit_names_the_first(
    db_url: str, followed: bool
) -> None:
    """R7, ADR 0021: events deleted from a commit, its last row too, are named from the first."""
    positions = _four_event_commit(db_url, followed)
    _delete(db_url, positions[1], positions[3])
    reason = _failed(verify(db_url), positions[1], "removed")
    if _backend(db_url) == "sqlite":  # the record went with the last row: the rest is named
        assert f"positions {positions[0]}, {positions[2]} remain, unchecked" in reason


def test_a_payload_restored_after_a_purge_is_reported_at_its_event(db_url: str) -> None:
    """R7, ADR 0021: a purged fact's text put back is reported at the event that wrote it."""
    with journaled.open(db_url) as rt:
        facts = [rt.memory.remember(f"secret number {i}") for i in range(3)]
        written = rt.memory.history(facts[1].id)[0].position
    [(blob,)] = _sql(
        db_url, "SELECT payload FROM journaled_payloads WHERE stream = ?", (facts[1].id,)
    )
    with journaled.open(db_url) as rt:
        assert rt.memory.purge(facts[1].id)
        erased = rt.journal.position()
    assert erased != written
    _sql(db_url, "INSERT INTO journaled_payloads VALUES (?, ?)", (facts[1].id, bytes(blob)))
    reason = _failed(verify(db_url), written, "payload-restored")
    assert f"position {erased}" in reason


def test_a_payload_slipped_in_beside_an_event_is_reported_at_that_event(db_url: str) -> None:
    """R7, ADR 0021: a payload row no commit wrote, keyed by a stored event, names that event."""
    story = _run_story(db_url)
    position, version = story.positions[("run.step-started", "a")]
    key = f"{story.run_id}@{version}"
    assert not _sql(db_url, "SELECT 1 FROM journaled_payloads WHERE stream = ?", (key,))
    _sql(db_url, "INSERT INTO journaled_payloads VALUES (?, ?)", (key, b"\x91\xa6forged"))
    reason = _failed(verify(db_url), position, "payload-inserted")
    assert key in reason


def test_removing_a_commits_last_event_with_its_record_on_postgres_names_it(pg_url: str) -> None:
    """R7, ADR 0021: on PostgreSQL an event deleted with its commit's record is named as removed."""
    story = _run_story(pg_url)
    position, _ = story.positions[("run.step-started", "b")]
    _delete(pg_url, position)
    _sql(pg_url, "DELETE FROM journaled_digests WHERE position = ?", (position,))
    reason = _failed(verify(pg_url), position, "removed")
    assert f"the event at position {position - 1} remains, unchecked" in reason


def test_removing_a_last_commit_with_its_record_on_postgres_is_reported_after_the_chain(
    pg_url: str,
) -> None:
    """R7, ADR 0021: on PostgreSQL a last remember deleted with its record is named by its text."""
    with journaled.open(pg_url) as rt:
        for i in range(3):
            rt.memory.remember(f"fact {i}")
        last = rt.journal.position()
    _delete(pg_url, last)
    _sql(pg_url, "DELETE FROM journaled_digests WHERE position = ?", (last,))
    reason = _failed(verify(pg_url), last, "removed")
    assert f"at position {last} or later" in reason


def test_removing_a_purge_is_reported_at_it_not_at_the_payload_it_erased(db_url: str) -> None:
    """R7, ADR 0021: a deleted purge is `removed` at its position; its erased text is no finding."""
    with journaled.open(db_url) as rt:
        facts = [rt.memory.remember(f"secret number {i}") for i in range(3)]
        assert rt.memory.purge(facts[0].id)
        last = rt.journal.position()
    _delete(db_url, last)
    _failed(verify(db_url), last, "removed")
