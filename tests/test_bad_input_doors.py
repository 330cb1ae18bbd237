"""Bad input at the doors gets one clear line naming what is wrong and where, and loses nothing
stored: a follower's --interval it could not keep (J1, SPEC section 5 and the CLI)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner, Result

import journaled
from journaled.cli import main
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
