"""Bad input at the doors gets one clear line naming what is wrong and where, and loses nothing
stored: a follower's --interval it could not keep, and a journal whose file cannot be written
(J1, J2, M2, E14, SPEC section 5 and the CLI; ADR 0081's update of 2026-12-08)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from required import unavailable

import journaled
from journaled import EventsError, JournalReadOnly, Plan, Step
from journaled.cli import main
from journaled.events.url import parse_url
from journaled.testing import ManualClock


def _cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--url", url, *args])


def _one_line_error(result: Result) -> None:
    """A CLI refusal: non-zero exit, no exception escaping click, one line of error."""
    assert result.exit_code != 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


@pytest.fixture
def journal_with_a_fact(sqlite_url: str) -> str:
    """A SQLite journal holding one fact."""
    with journaled.open(sqlite_url, clock=ManualClock(1_000)) as rt:
        rt.memory.remember("the sky is blue")
    return sqlite_url


# -- journal tail --follow --interval ---------------------------------------------------------


@pytest.mark.parametrize("interval", ["nan", "inf", "-inf", "0", "1e8", "3601"])
def test_journal_tail_follow_refuses_an_interval_it_could_not_keep(
    journal_with_a_fact: str, interval: str
) -> None:
    """J1: --interval is the longest wait between checks for Ctrl-C, refused in one line as
    `runs follow` refuses it (above 0, at most an hour). nan escaped as InvalidArgument and inf
    as OverflowError (tracebacks); 1e8 was taken, and the follower then ignored SIGINT and
    SIGTERM for that long (--max-seconds stops this test's follower were it taken)."""
    result = _cli(
        journal_with_a_fact, "journal", "tail", "--follow", "--interval", interval,
        "--max-seconds", "2",
    )  # fmt: skip
    _one_line_error(result)
    assert "--interval must be a number of seconds above 0 and at most 3600" in result.output


def test_journal_tail_follow_takes_an_interval_of_an_hour(journal_with_a_fact: str) -> None:
    """J1: the longest interval refused by neither follower is accepted."""
    result = _cli(
        journal_with_a_fact, "journal", "tail", "--follow", "--interval", "3600",
        "--max-seconds", "0.2",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.startswith("#1 ")  # the backlog, then the follow until the deadline


# -- a journal whose file cannot be written ---------------------------------------------------


def _chattr(flag: str, *paths: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["chattr", flag, *map(str, paths)], capture_output=True, check=False)


@pytest.fixture
def immutable_journal(journal_with_a_fact: str) -> Iterator[tuple[str, Path]]:
    """The journal with its file made immutable (chattr +i binds root too, unlike chmod)."""
    if shutil.which("chattr") is None:
        unavailable("CHATTR", "no chattr on this machine (e2fsprogs)")
    path = Path(parse_url(journal_with_a_fact).path or "")
    done = _chattr("+i", path)
    assert done.returncode == 0, f"chattr +i {path} failed: {done.stderr!r}"
    try:
        yield journal_with_a_fact, path
    finally:
        for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            if name.exists():
                _chattr("-i", name)


def test_cli_remember_on_a_read_only_journal_is_one_line_naming_the_journal(
    immutable_journal: tuple[str, Path],
) -> None:
    """M2, ADR 0081 (update 2026-12-08): a traceback ended `ActorsError: OperationalError:
    attempt to write a readonly database`, naming no journal. One line now names it, says it
    cannot be written and that nothing was stored; the file is untouched."""
    url, path = immutable_journal
    before = path.read_bytes()
    result = _cli(url, "memory", "remember", "a new fact")
    _one_line_error(result)
    assert str(path) in result.output
    assert "cannot be written" in result.output
    assert "nothing was stored" in result.output
    assert path.read_bytes() == before


def test_api_writes_on_a_read_only_journal_name_the_journal(
    immutable_journal: tuple[str, Path],
) -> None:
    """M2, E14, ADR 0081 (update 2026-12-08): remember and execute raised `ActorsError:
    OperationalError: ...`, delete and orchestrate the library's raw OperationalError, scrub
    `ScrubPending` blaming a reader; none named the journal. Each raises JournalReadOnly
    naming it (an EventsError, rebuilt by name from an actor's answer), nothing is stored, and
    the journal still reads."""
    url, path = immutable_journal
    with journaled.open(url) as rt:
        rt.register_tool("echo", lambda x: x)
        fact_id = rt.memory.all()[0].id
        position = rt.journal.position()

        def plan(goal: str, outcomes: object, context: object) -> Plan:
            return Plan(goal="g", steps=[Step("a", tool="echo")])

        doors: dict[str, Callable[[], object]] = {
            "remember": lambda: rt.memory.remember("x"),
            "execute": lambda: rt.execute(Plan(goal="g", steps=[Step("a", tool="echo")])),
            "delete": lambda: rt.memory.delete(fact_id),
            "orchestrate": lambda: rt.orchestrate("g", plan),
            "scrub": rt.memory.scrub,
        }
        for name, door in doors.items():
            with pytest.raises(JournalReadOnly) as raised:
                door()
            assert isinstance(raised.value, EventsError)
            assert str(path) in str(raised.value), (name, str(raised.value))
            assert "cannot be written" in str(raised.value), name
            assert raised.value.journal == url, name
        assert rt.journal.position() == position
        assert [f.text for f in rt.memory.all()] == ["the sky is blue"]


def test_cli_scrub_on_a_read_only_journal_does_not_blame_another_reader(
    immutable_journal: tuple[str, Path],
) -> None:
    """M2, ADR 0081 (update 2026-12-08): `memory scrub` said another connection (a backup, a
    report) kept reading older data; what is wrong is that the journal cannot be written."""
    url, path = immutable_journal
    result = _cli(url, "memory", "scrub")
    _one_line_error(result)
    assert "keeps reading older data" not in result.output
    assert str(path) in result.output
    assert "cannot be written" in result.output
