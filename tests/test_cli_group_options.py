"""``--url`` and ``--json`` after a group's name (``journaled runs --json list``), and negative
numbers read as a command's arguments (``runs diff RUN -1 2``, O7): section 11's command line."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

import journaled
from journaled.cli import main

CLI = [sys.executable, "-m", "journaled.cli"]


@dataclass(frozen=True)
class Made:
    """A SQLite journal holding one fact and one completed run."""

    url: str
    missing: str
    """The URL of a journal that does not exist: reading it fails, naming it."""
    run_id: str
    fact_id: str


@pytest.fixture
def made(tmp_path: Path) -> Made:
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url) as rt:
        fact = rt.memory.remember("deploys go through staging")
        rt.register_tool("ok", lambda x: x)
        run = rt.execute(journaled.Plan(goal="ship", steps=[journaled.Step("a", tool="ok")]))
    missing = f"sqlite:///{tmp_path / 'missing.sqlite'}"
    return Made(url=url, missing=missing, run_id=run.run_id, fact_id=fact.id)


def cli(made: Made, *args: str) -> Result:
    """Invoke the command line with $JOURNALED_URL naming a journal that does not exist."""
    return CliRunner().invoke(main, list(args), env={"JOURNALED_URL": made.missing})


def ok(made: Made, *args: str) -> str:
    result = cli(made, *args)
    assert result.exit_code == 0, (args, result.output)
    assert result.stderr == ""
    return result.stdout


def _groups(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            out += [(*prefix, name), *_groups(command, (*prefix, name))]
    return out


def test_every_group_takes_url_and_json_before_its_subcommand() -> None:
    """Section 11: each group (runs, memory, journal) takes --url and --json, and its help says
    a subcommand's own --url wins."""
    found = _groups(main)
    assert {("runs",), ("memory",), ("journal",)} <= set(found)
    for path in found:
        out = CliRunner().invoke(main, [*path, "--help"])
        assert out.exit_code == 0, out.output
        assert "--url" in out.stdout, path
        assert "--json" in out.stdout, path
        assert "its own --url wins" in " ".join(out.stdout.split()), path


def _json_commands(made: Made) -> list[list[str]]:
    return [
        ["runs", "list"],
        ["runs", "why", made.run_id],
        ["runs", "history", made.run_id],
        ["runs", "show", made.run_id],
        ["runs", "stale"],
        ["memory", "search", "staging"],
        ["memory", "show", made.fact_id],
        ["memory", "history", made.fact_id],
        ["journal", "subscriptions"],
    ]


def test_json_after_a_group_prints_what_json_after_the_command_prints(made: Made) -> None:
    """Section 11: ``runs --json list`` is ``runs list --json``, for every group's commands."""
    for group, *rest in _json_commands(made):
        before = ok(made, "--url", made.url, group, "--json", *rest)
        after = ok(made, "--url", made.url, group, *rest, "--json")
        assert before == after, (group, rest)
        json.loads(before)


def test_url_after_a_group_names_the_journal(made: Made) -> None:
    """Section 11: ``runs --url U list``, ``memory --url U search Q`` and ``journal --url U
    verify`` read the journal at U, not $JOURNALED_URL's."""
    listed = json.loads(ok(made, "runs", "--url", made.url, "list", "--json"))
    assert [row["run_id"] for row in listed] == [made.run_id]
    found = json.loads(ok(made, "memory", "--url", made.url, "--json", "search", "staging"))
    assert [fact["id"] for fact in found] == [made.fact_id]
    verified = json.loads(ok(made, "journal", "--json", "--url", made.url, "verify"))
    assert verified["ok"] is True


def test_a_commands_own_url_wins_over_its_groups(made: Made) -> None:
    """Section 11: the --url nearest the command wins: its own over its group's, its group's
    over ``journaled --url``."""
    own = ok(made, "runs", "--url", made.missing, "list", "--url", made.url, "--json")
    assert [row["run_id"] for row in json.loads(own)] == [made.run_id]
    group = ok(made, "--url", made.missing, "runs", "--url", made.url, "list", "--json")
    assert [row["run_id"] for row in json.loads(group)] == [made.run_id]
    refused = cli(made, "runs", "--url", made.url, "list", "--url", made.missing)
    assert refused.exit_code == 1
    assert f"no journal at {made.missing.removeprefix('sqlite:///')}" in refused.stderr


def test_the_installed_command_takes_options_after_a_group(made: Made) -> None:
    """Section 11: the real command line, in its own process: ``journaled runs --json --url U
    list`` prints the runs as JSON."""
    done = subprocess.run(
        [*CLI, "runs", "--json", "--url", made.url, "list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert [row["run_id"] for row in json.loads(done.stdout)] == [made.run_id]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["-1", "2"], "A -1"),
        (["0", "-2"], "B -2"),
        (["--json", "-1", "-2"], "A -1"),
    ],
)
def test_runs_diff_reads_a_negative_position_after_group_options(
    made: Made, args: list[str], named: str
) -> None:
    """O7: ``runs --json --url U diff RUN -1 2`` says the position is negative and what is
    allowed; positions are journal positions, 0 or more, never counted from the end."""
    result = cli(made, "runs", "--json", "--url", made.url, "diff", made.run_id, *args)
    assert result.exit_code == 1, result.output
    assert f"{named} is negative: give a journal position, 0 or more" in result.stderr
    assert "No such option" not in result.output


@pytest.mark.parametrize(
    ("args", "refused"),
    [
        (["1", "2", "--bogus"], "No such option '--bogus'."),
        (["--jsn", "1", "2"], "No such option '--jsn'. Did you mean '--json'?"),
        (["1", "2", "--jsn=1"], "No such option '--jsn'. Did you mean '--json'?"),
        (["--at", "1", "2"], "No such option '--at'."),
    ],
)
def test_runs_diff_still_refuses_an_unknown_option_by_name(
    made: Made, args: list[str], refused: str
) -> None:
    """O7: taking negative numbers as A and B, ``runs diff`` still names an option it does not
    have, instead of reading it as a position (``'--jsn' is not a valid integer``)."""
    result = cli(made, "--url", made.url, "runs", "diff", made.run_id, *args)
    assert result.exit_code == 2, result.output
    assert refused in result.stderr
    assert "valid integer" not in result.stderr


def test_runs_diff_takes_words_after_a_double_dash_as_arguments(made: Made) -> None:
    """O7: after ``--`` every word is an argument, as click reads it: ``-1`` is A and says so."""
    result = cli(made, "--url", made.url, "runs", "diff", made.run_id, "--", "-1", "2")
    assert result.exit_code == 1, result.output
    assert "A -1 is negative: give a journal position, 0 or more" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("--url=", "runs", "list"),
        ("runs", "--url=", "list"),
        ("runs", "list", "--url="),
        ("memory", "search", "staging", "--url=  "),
        ("journal", "--url=", "verify"),
        ("--url", "{url}", "runs", "--url=", "list"),
    ],
)
def test_an_empty_url_is_refused_wherever_it_is_given(
    made: Made, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    """An empty --url names no journal: refused by name (exit 2), never read as the default
    journal nor allowed to hide a URL given before it; nothing is created."""
    monkeypatch.chdir(tmp_path)
    result = cli(made, *(a.replace("{url}", made.url) for a in args))
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--url': is empty" in result.output
    assert not (tmp_path / ".journaled").exists()
