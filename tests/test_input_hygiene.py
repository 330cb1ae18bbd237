"""Bad input gets one clear error naming the field and appends nothing; stored text cannot drive
the terminal or forge structure on output (J5, M2, E1, O6, SPEC section 5 and the CLI)."""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

import journaled
from journaled import (
    ActorsError,
    AgentResult,
    Clarify,
    ConfigurationError,
    CorruptEvent,
    InvalidArgument,
    InvalidFact,
    JournalUnreadable,
    JournalUrlError,
    Limits,
    NeedsInput,
    Plan,
    PlanRejected,
    RunNotFound,
    RunNotResumable,
    Step,
)
from journaled.cli import main
from journaled.cli_common import call
from journaled.testing import ManualClock

MIB = 1 << 20
SURROGATE = "a\ud800b"
"""A lone surrogate, what ``os.fsdecode`` or a bad decode leaves behind: UTF-8 cannot store it."""
HOSTILE = "done\x1b]0;PWNED\x07 \x1b[2J\u202etxt.exe\x9b31m"
"""Stored text that would retitle the terminal, clear it, reverse the line and colour it."""
FORGED = "boom\nnow: completed using 0 model call(s)"
"""A stored error that would forge the ``now:`` line of ``runs why``."""
TERMINAL_CODES = ("\x1b", "\x07", "\u202e", "\x9b")


def _self_containing() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


def _plan(goal: str = "g", step_id: str = "a", data: Any = None) -> Plan:
    return Plan(goal=goal, steps=[Step(step_id, tool="echo", input=data)])


@pytest.fixture
def rt(sqlite_url: str) -> Iterator[journaled.Runtime]:
    """Yield a runtime over a SQLite file holding one fact, with an ``echo`` tool."""
    with journaled.open(sqlite_url, clock=ManualClock(1_000)) as runtime:
        runtime.register_tool("echo", lambda data: data)
        runtime.memory.remember("the sky is blue")
        yield runtime


Call = Callable[[journaled.Runtime], object]
CASES: list[tuple[str, Call, type[Exception], str]] = [
    ("text-surrogate", lambda r: r.memory.remember(SURROGATE), InvalidFact, "text"),
    ("text-over-1mib", lambda r: r.memory.remember("x" * (MIB + 1)), InvalidFact, "text"),
    ("scope-surrogate", lambda r: r.memory.remember("t", scope=SURROGATE), InvalidFact, "scope"),
    ("domain-surrogate", lambda r: r.memory.remember("t", domain=SURROGATE), InvalidFact, "domain"),
    ("source-surrogate", lambda r: r.memory.remember("t", source=SURROGATE), InvalidFact, "source"),
    (
        "key-surrogate",
        lambda r: r.memory.remember("t", conflict_key=SURROGATE),
        InvalidFact,
        "conflict_key",
    ),
    (
        "valid-until-2**64",
        lambda r: r.memory.remember("t", valid_until=2**64),
        InvalidFact,
        "valid_until",
    ),
    (
        "valid-from-minus-2**64",
        lambda r: r.memory.remember("t", valid_from=-(2**64)),
        InvalidFact,
        "valid_from",
    ),
    ("search-now-str", lambda r: r.memory.search("sky", now="x"), InvalidArgument, "now"),  # type: ignore[arg-type]
    ("search-now-2**64", lambda r: r.memory.search("sky", now=2**64), InvalidArgument, "now"),
    ("search-now-float", lambda r: r.memory.search("sky", now=1.5), InvalidArgument, "now"),  # type: ignore[arg-type]
    ("search-query-surrogate", lambda r: r.memory.search(SURROGATE), InvalidArgument, "query"),
    ("search-query-bytes", lambda r: r.memory.search(b"sky"), InvalidArgument, "query"),  # type: ignore[arg-type]
    ("search-scopes-int", lambda r: r.memory.search("sky", scopes=[1]), InvalidArgument, "scopes"),  # type: ignore[list-item]
    (
        "search-scopes-str",
        lambda r: r.memory.search("sky", scopes="user"),
        InvalidArgument,
        "scopes",
    ),
    ("search-limit-2**70", lambda r: r.memory.search("sky", limit=2**70), InvalidArgument, "limit"),
    (
        "semantic-now-str",
        lambda r: r.memory.search_semantic("sky", now="x"),  # type: ignore[arg-type]
        InvalidArgument,
        "now",
    ),
    ("as-of-at-str", lambda r: r.memory.as_of(at="x"), InvalidArgument, "at"),  # type: ignore[arg-type]
    ("as-of-at-2**64", lambda r: r.memory.as_of(at=2**64), InvalidArgument, "at"),
    ("as-of-position-and-at", lambda r: r.memory.as_of(position=0, at=0), InvalidArgument, "as_of"),
    (
        "purge-reason-surrogate",
        lambda r: r.memory.purge(r.memory.all()[0].id, reason=SURROGATE),
        InvalidArgument,
        "reason",
    ),
    ("goal-surrogate", lambda r: r.execute(_plan(goal=SURROGATE)), PlanRejected, "goal"),
    ("goal-over-1mib", lambda r: r.execute(_plan(goal="g" * (MIB + 1))), PlanRejected, "goal"),
    ("step-id-surrogate", lambda r: r.execute(_plan(step_id=SURROGATE)), PlanRejected, "id"),
    ("input-surrogate", lambda r: r.execute(_plan(data={"k": SURROGATE})), PlanRejected, "input"),
    ("input-key-surrogate", lambda r: r.execute(_plan(data={SURROGATE: 1})), PlanRejected, "input"),
    ("input-int-2**64", lambda r: r.execute(_plan(data=2**64)), PlanRejected, "input"),
    ("input-int-2**100", lambda r: r.execute(_plan(data=[2**100])), PlanRejected, "input"),
    (
        "input-contains-itself",
        lambda r: r.execute(_plan(data=_self_containing())),
        PlanRejected,
        "input",
    ),
    (
        "budget-2**64",
        lambda r: r.execute(_plan(), call_budget=2**64),
        ValueError,
        "call_budget",
    ),
    (
        "parallel-2**64",
        lambda r: r.execute(_plan(), max_parallel_steps=2**64),
        ValueError,
        "max_parallel_steps",
    ),
    (
        "timeout-nan",
        lambda r: r.execute(_plan(), step_timeout=math.nan),
        ValueError,
        "step_timeout",
    ),
    (
        "timeout-inf",
        lambda r: r.execute(_plan(), step_timeout=math.inf),
        ValueError,
        "step_timeout",
    ),
    (
        "limit-2**64",
        lambda r: r.execute(_plan(), limits=Limits(per_tool={"echo": 2**64})),
        ValueError,
        "limits.per_tool",
    ),
    (
        "orchestrate-goal-surrogate",
        lambda r: r.orchestrate(SURROGATE, lambda g, o, c: _plan()),
        InvalidArgument,
        "goal",
    ),
    (
        "orchestrate-goal-over-1mib",
        lambda r: r.orchestrate("g" * (MIB + 1), lambda g, o, c: _plan()),
        InvalidArgument,
        "goal",
    ),
    (
        "orchestrate-require-approval-str",  # "no" was journaled as True: a wait not asked for
        lambda r: r.orchestrate("g", lambda g, o, c: _plan(), require_approval="no"),  # type: ignore[arg-type]
        InvalidArgument,
        "require_approval",
    ),
    (
        "orchestrate-partial-int",
        lambda r: r.orchestrate("g", lambda g, o, c: _plan(), partial=1),  # type: ignore[arg-type]
        InvalidArgument,
        "partial",
    ),
    (
        "clarification-surrogate",
        lambda r: r.resume("run_x", clarification=SURROGATE),
        RunNotResumable,
        "clarification",
    ),
    (
        "answer-over-1mib",
        lambda r: r.resume("run_x", answers={"a": "y" * (MIB + 1)}),
        RunNotResumable,
        "answer",
    ),
    ("answers-list", lambda r: r.resume("run_x", answers=["y"]), RunNotResumable, "answers"),  # type: ignore[arg-type]
    ("resume-run-id-int", lambda r: r.resume(42), InvalidArgument, "run_id"),  # type: ignore[arg-type]
    ("cancel-run-id-None", lambda r: r.cancel(None), InvalidArgument, "run_id"),  # type: ignore[arg-type]
    ("runs-why-fact-id", lambda r: r.runs.why(r.memory.all()[0].id), RunNotFound, "not runs"),
    ("runs-at-fact-id", lambda r: r.runs.at(r.memory.all()[0].id, 1), RunNotFound, "not runs"),
    ("open-url-int", lambda r: journaled.open(42), JournalUrlError, "URL must be a string"),  # type: ignore[arg-type]
    (
        "open-url-bytes",
        lambda r: journaled.open(b"memory://"),  # type: ignore[arg-type]
        JournalUrlError,
        "URL must be a string",
    ),
    ("open-url-surrogate", lambda r: journaled.open("sqlite:///x\udcff"), JournalUrlError, "URL"),
    (
        "open-agents-str",
        lambda r: journaled.open("memory://", agents="no"),  # type: ignore[arg-type]
        ConfigurationError,
        "agents",
    ),
    (
        "open-organization-surrogate",
        lambda r: journaled.open("memory://", organization=SURROGATE),
        ConfigurationError,
        "organization",
    ),
]


@pytest.mark.parametrize(
    ("call", "error", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_one_line_naming_the_field(
    rt: journaled.Runtime, call: Call, error: type[Exception], field: str
) -> None:
    """J5, M2, E1: odd input raises the documented error, one line naming the field; no append."""
    before = rt.journal.position()
    texts = [f.text for f in rt.memory.all()]
    with pytest.raises(error) as raised:
        call(rt)
    message = str(raised.value)
    assert field in message
    assert "\n" not in message
    message.encode("utf-8")  # the message itself can be printed and logged
    assert rt.journal.position() == before
    assert [f.text for f in rt.memory.all()] == texts


@pytest.mark.parametrize("answer", ["now", 1.5, True, 2**64], ids=["str", "float", "bool", "2**64"])
def test_a_clock_answering_no_epoch_ms_int_is_named(sqlite_url: str, answer: object) -> None:
    """SPEC 5 (clock: () -> epoch ms int), M2, E1: a clock given to open() that answers no int
    fails remember and execute with an error naming the clock and its answer, in one line;
    nothing is appended."""
    with journaled.open(sqlite_url, clock=lambda: answer) as runtime:  # type: ignore[arg-type,return-value]
        runtime.register_tool("echo", lambda data: data)
        for call in (lambda: runtime.memory.remember("x"), lambda: runtime.execute(_plan())):
            # remember's writer is an actor: it passes the error on inside an ActorsError
            with pytest.raises((ConfigurationError, ActorsError)) as raised:
                call()
            assert "clock" in str(raised.value)
            assert repr(answer) in str(raised.value)
            assert "\n" not in str(raised.value)
        assert runtime.journal.position() == 0


def _run_one(rt: journaled.Runtime, agent: Callable[[Step, Any], AgentResult]) -> Any:
    rt.register_agent("odd", agent)
    return rt.execute(Plan(goal="g", steps=[Step("a", agent="odd")]))


def _raise(exc: BaseException) -> Any:
    raise exc


USER_CODE: list[tuple[str, Callable[[Step, Any], AgentResult], str]] = [
    ("error-with-surrogate", lambda s, c: _raise(RuntimeError(SURROGATE)), "\\ud800"),
    ("question-with-surrogate", lambda s, c: _raise(NeedsInput(SURROGATE)), "question"),
    ("question-over-1mib", lambda s, c: _raise(NeedsInput("q" * (MIB + 1))), "question"),
    ("calls-used-2**64", lambda s, c: AgentResult(ok=True, calls_used=2**64), "calls_used"),
    ("error-text-surrogate", lambda s, c: AgentResult(ok=False, error=SURROGATE), "error"),
]


@pytest.mark.parametrize(
    ("agent", "names"), [c[1:] for c in USER_CODE], ids=[c[0] for c in USER_CODE]
)
def test_unstorable_output_of_user_code_fails_the_step_not_the_run(
    rt: journaled.Runtime, agent: Callable[[Step, Any], AgentResult], names: str
) -> None:
    """E11, J5: a step whose result cannot be stored fails, named; the run finishes and reads."""
    result = _run_one(rt, agent)
    assert not result.ok
    (obs,) = result.observations
    assert obs.error is not None
    assert names in obs.error
    assert rt.runs.state(result.run_id).run_status == "failed"
    assert "failed" in rt.runs.why(result.run_id)


@pytest.mark.parametrize("question", [SURROGATE, "q" * (MIB + 1)], ids=["surrogate", "over-1mib"])
def test_unstorable_planner_question_is_a_failed_outcome(
    rt: journaled.Runtime, question: str
) -> None:
    """O1, J5: a planner asking an unstorable question fails the orchestration, naming it."""
    outcome = rt.orchestrate("g", lambda g, o, c: Clarify(question))
    assert outcome.status == "failed"
    assert "question" in outcome.summary
    assert "question" in rt.runs.why(outcome.run_id)


# -- files that are no journal (J5) ---------------------------------------------------------------


def _journal_file(tmp_path: Path) -> Path:
    path = tmp_path / "good.sqlite"
    with journaled.open(f"sqlite:///{path}") as rt:
        for i in range(200):
            rt.memory.remember(f"fact number {i} " + "word " * 40)
    return path


@pytest.mark.parametrize("damage", ["not-sqlite", "truncated-half", "truncated-tenth"])
def test_a_file_that_is_no_journal_names_its_path(tmp_path: Path, damage: str) -> None:
    """J5: opening a non-SQLite or truncated file raises JournalUnreadable naming the path."""
    path = tmp_path / "bad.sqlite"
    if damage == "not-sqlite":
        path.write_text("hello, I am a text file\n" * 100)
    else:
        shutil.copy(_journal_file(tmp_path), path)
        keep = {"truncated-half": 0.5, "truncated-tenth": 0.1}[damage]
        with path.open("r+b") as f:
            f.truncate(int(path.stat().st_size * keep))
    with pytest.raises(JournalUnreadable) as raised:
        journaled.open(f"sqlite:///{path}")
    assert str(path) in str(raised.value)
    result = CliRunner().invoke(main, ["--url", f"sqlite:///{path}", "runs", "list"])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert str(path) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_stored_text_that_is_not_utf8_fails_with_its_position(tmp_path: Path) -> None:
    """J5: invalid UTF-8 in a stored fact text fails the open with the position and the reason."""
    path = _journal_file(tmp_path)
    conn = sqlite3.connect(path)
    stream = conn.execute("SELECT stream FROM journaled_payloads ORDER BY stream").fetchone()[0]
    conn.execute("UPDATE journaled_payloads SET payload = x'41ff42' WHERE stream = ?", (stream,))
    conn.execute("DELETE FROM journaled_snapshots")
    position = conn.execute(
        "SELECT rowid FROM stored_events WHERE originator_id = ?", (stream,)
    ).fetchone()[0]
    conn.commit()
    conn.close()
    with pytest.raises(CorruptEvent) as raised:
        journaled.open(f"sqlite:///{path}")
    assert raised.value.position == position
    assert "UTF-8" in str(raised.value)
    assert "byte 1" in str(raised.value)


def _hand_edit(path: Path, prefix: str, change: str) -> int:
    """Set ``change`` on the first stored row whose topic starts ``prefix``; return its position."""
    conn = sqlite3.connect(path)
    (position,) = conn.execute(
        "SELECT min(rowid) FROM stored_events WHERE substr(topic, 1, ?) = ?", (len(prefix), prefix)
    ).fetchone()
    conn.execute(f"UPDATE stored_events SET {change} WHERE rowid = ?", (position,))  # noqa: S608
    conn.execute("DELETE FROM journaled_snapshots")
    conn.commit()
    conn.close()
    return int(position)


EDITS = {"state-null": "state = NULL", "state-text": "state = 'hello'", "state-int": "state = 12"}


@pytest.mark.parametrize("change", list(EDITS.values()), ids=list(EDITS))
def test_a_fact_row_edited_to_another_type_fails_the_open_with_its_position(
    tmp_path: Path, change: str
) -> None:
    """J5: a fact's row whose state a hand edit made NULL, text or an integer fails the open
    with CorruptEvent naming the position and what is wrong, not a bare TypeError."""
    path = _journal_file(tmp_path)
    position = _hand_edit(path, "memory.", change)
    with pytest.raises(CorruptEvent) as raised:
        journaled.open(f"sqlite:///{path}")
    assert raised.value.position == position
    assert "its payload is" in str(raised.value)


@pytest.mark.parametrize("change", list(EDITS.values()), ids=list(EDITS))
def test_a_run_row_edited_to_another_type_fails_the_reads_with_its_position(
    tmp_path: Path, change: str
) -> None:
    """J5, O6, T2: a run's row whose state a hand edit made NULL, text or an integer fails
    runs.why and runs.list with CorruptEvent naming the position, as a garbage blob does."""
    path = tmp_path / "runs.sqlite"
    with journaled.open(f"sqlite:///{path}") as runtime:
        runtime.register_tool("echo", lambda data: data)
        run_id = runtime.execute(_plan()).run_id
    position = _hand_edit(path, "run.started", change)
    with journaled.open(f"sqlite:///{path}") as runtime:
        for read in (runtime.runs.list, lambda: runtime.runs.why(run_id)):
            with pytest.raises(CorruptEvent) as raised:
                read()
            assert raised.value.position == position


@pytest.mark.parametrize("prefix", ["memory.", "run.started"])
def test_a_row_whose_topic_was_erased_by_hand_fails_the_open_not_left_out(
    tmp_path: Path, prefix: str
) -> None:
    """J5: a row whose topic a hand edit made NULL is no longer left out of the reads that
    filter by topic (a fact silently missing, a run missing from runs.list): the open fails
    with CorruptEvent naming the position."""
    path = tmp_path / "topic.sqlite"
    with journaled.open(f"sqlite:///{path}") as runtime:
        runtime.register_tool("echo", lambda data: data)
        runtime.memory.remember("fact one")
        runtime.memory.remember("fact two")
        runtime.execute(_plan())
    position = _hand_edit(path, prefix, "topic = NULL")
    with pytest.raises(CorruptEvent) as raised:
        journaled.open(f"sqlite:///{path}")
    assert raised.value.position == position
    assert "its topic is NULL" in str(raised.value)


# -- the command line ------------------------------------------------------------------------------


def _cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--url", url, *args])


@pytest.fixture
def hostile(sqlite_url: str) -> tuple[str, str, str]:
    """Return (url, fact id, run id) of a journal whose stored texts hold terminal codes."""
    with journaled.open(sqlite_url) as rt:
        fact = rt.memory.remember(HOSTILE, scope="project", source=HOSTILE)
        rt.register_tool("boom", lambda _: _raise(RuntimeError(FORGED + HOSTILE)))
        rt.register_tool("echo", lambda data: data)
        steps = [Step("a", tool="boom"), Step("b", tool="echo", input=HOSTILE)]
        run = rt.execute(Plan(goal=HOSTILE, steps=steps))
    return sqlite_url, fact.id, run.run_id


RUN_COMMANDS = [["why"], ["show"], ["history"], ["diff", "0", "1"]]


@pytest.mark.parametrize("command", RUN_COMMANDS, ids=lambda c: c[0])
def test_run_commands_refuse_a_fact_id_in_one_line(
    hostile: tuple[str, str, str], command: list[str]
) -> None:
    """O6, R1: a run command given a fact id finds no run (the fact id hinted at from its shape
    alone, so a hidden fact answers alike), in one line, exit 1."""
    url, fact_id, _ = hostile
    result = _cli(url, "runs", command[0], fact_id, *command[1:])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "name facts, not runs" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["why", "history"])
def test_memory_commands_refuse_a_run_id_in_one_line(
    hostile: tuple[str, str, str], command: str
) -> None:
    """M11: a memory command given a run id says there is no such fact, in one line, exit 1."""
    url, _, run_id = hostile
    result = _cli(url, "memory", command, run_id)
    assert result.exit_code == 1, result.output
    assert f"no fact {run_id}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    with journaled.open(url) as rt:
        assert rt.memory.history(run_id) == []


def test_timeline_refuses_a_fact_id_in_one_line(
    hostile: tuple[str, str, str], tmp_path: Path
) -> None:
    """O7: the timeline of a fact id is a one-line error, exit 1, and writes no page."""
    url, fact_id, _ = hostile
    page = tmp_path / "page.html"
    result = _cli(url, "timeline", fact_id, "-o", str(page))
    assert result.exit_code == 1
    assert "name facts, not runs" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not page.exists()


RUN_DOORS: list[tuple[str, Call]] = [
    ("resume", lambda r: r.resume("run_" + SURROGATE)),
    ("runs.why", lambda r: r.runs.why("run_" + SURROGATE)),
    ("runs.state", lambda r: r.runs.state("run_" + SURROGATE)),
    ("runs.history", lambda r: r.runs.history("run_" + SURROGATE)),
    ("runs.at", lambda r: r.runs.at("run_" + SURROGATE, 1)),
    ("runs.purge", lambda r: r.runs.purge("run_" + SURROGATE, "asked")),
    ("runs.fork", lambda r: r.runs.fork("run_" + SURROGATE, 1)),
    ("runs.lineage", lambda r: r.runs.lineage("run_" + SURROGATE)),
]


@pytest.mark.parametrize("door", [d[1] for d in RUN_DOORS], ids=[d[0] for d in RUN_DOORS])
def test_a_run_id_utf8_cannot_store_is_an_unknown_run(rt: journaled.Runtime, door: Call) -> None:
    """O6, R1 (ADR 0017): a run id holding a lone surrogate (an argument of invalid UTF-8) names
    no run: RunNotFound in one line, as an unused id, not the driver's UnicodeEncodeError."""
    with pytest.raises(RunNotFound) as raised:
        door(rt)
    assert "\n" not in str(raised.value)
    assert not rt.cancel("run_" + SURROGATE)
    assert [f.text for f in rt.memory.all()] == ["the sky is blue"]


def test_a_fact_id_utf8_cannot_store_is_an_unknown_fact(rt: journaled.Runtime) -> None:
    """M11, R1: a fact id holding a lone surrogate names no fact: why says so, history and
    used_by are empty, as for an unused id."""
    fact_id = "mem_" + SURROGATE
    assert rt.memory.why(fact_id) == f"no fact {fact_id} in this journal"
    assert rt.memory.history(fact_id) == []
    assert rt.memory.used_by(fact_id) == []
    assert rt.memory.get(fact_id) is None


@pytest.mark.parametrize(
    "command", [["runs", "why"], ["runs", "show"], ["memory", "why"], ["memory", "used-by"]]
)
def test_an_id_of_invalid_utf8_on_the_command_line_is_unknown_in_one_line(
    sqlite_url: str, command: list[str]
) -> None:
    """O6, M11: an id the shell passed as invalid UTF-8 finds nothing, in one line, exit 1."""
    with journaled.open(sqlite_url) as runtime:
        runtime.memory.remember("kept")
    result = _cli(sqlite_url, *command, "x_" + SURROGATE)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "no run" in result.stderr or "no fact" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_unexpected_value_error_prints_what_it_says() -> None:
    """O6: the command line's one-line error of a ValueError it did not foresee is what the
    error says, not its first argument alone (a UnicodeEncodeError's is only 'utf-8')."""
    with pytest.raises(click.ClickException) as raised:
        call(lambda: SURROGATE.encode("utf-8"))
    assert "can't encode character" in raised.value.message
    empty: dict[str, int] = {}
    with pytest.raises(click.ClickException) as raised:
        call(lambda: empty["missing"])
    assert raised.value.message == "missing"


PLAIN = [
    ["runs", "why", "{run}"],
    ["runs", "show", "{run}"],
    ["runs", "history", "{run}"],
    ["runs", "list"],
    ["memory", "search", "done"],
    ["memory", "show", "{fact}"],
    ["memory", "why", "{fact}"],
    ["memory", "history", "{fact}"],
    ["journal", "tail"],
]


@pytest.mark.parametrize("command", PLAIN, ids=lambda c: "-".join(c[:2]))
def test_plain_output_neutralises_terminal_codes(
    hostile: tuple[str, str, str], command: list[str]
) -> None:
    """J5, O6: plain output shows stored escapes and bidi overrides inert; nothing obeyed."""
    url, fact_id, run_id = hostile
    args = [a.format(run=run_id, fact=fact_id) for a in command]
    result = _cli(url, *args)
    assert result.exit_code == 0, result.output
    for code in TERMINAL_CODES:
        assert code not in result.stdout, (code, result.stdout)


def test_a_stored_newline_cannot_forge_a_why_line(hostile: tuple[str, str, str]) -> None:
    """O6: a newline in a stored error stays inside its line: one ``now:`` line, the real one."""
    url, _, run_id = hostile
    lines = _cli(url, "runs", "why", run_id).stdout.splitlines()
    now = [line for line in lines if line.startswith("now:")]
    assert len(now) == 1
    assert "failed" in now[0]
    with journaled.open(url) as rt:
        assert [ln for ln in rt.runs.why(run_id).splitlines() if ln.startswith("now:")] == now


def test_json_output_keeps_stored_text_exact(hostile: tuple[str, str, str]) -> None:
    """J5: JSON output is not neutralised: scripts get the stored text byte for byte."""
    url, fact_id, run_id = hostile
    fact = json.loads(_cli(url, "--json", "memory", "show", fact_id).stdout)
    assert fact["text"] == HOSTILE
    assert fact["source"] == HOSTILE
    view = json.loads(_cli(url, "--json", "runs", "show", run_id).stdout)
    assert view["plan"]["goal"] == HOSTILE
    errors = [o["error"] for o in view["observations"] if o.get("error")]
    assert errors == [FORGED + HOSTILE]


def test_a_run_stored_with_keys_json_has_none_for_still_reads_everywhere(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0098: a run an earlier release stored with an output keyed by a tuple and by None
    (which JSON has no key for) still shows: `runs show`, `runs history` (plain and --json)
    and `rt.runs.why` write such keys as their repr. Before, each crashed with msgspec's
    TypeError ("Only dicts with str-like or number-like keys")."""
    # As an earlier release stored it (raising=False: that release had no such check).
    monkeypatch.setattr("journaled.actors.steps._key_problem", lambda _: None, raising=False)
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("keyed", lambda _: {(1, 2): "pair", None: {"inner": 1}})
        run = rt.execute(journaled.Plan(goal="g", steps=[journaled.Step("a", tool="keyed")]))
        assert run.ok
        assert "a" in rt.runs.why(run.run_id)
    monkeypatch.undo()
    for args in (["runs", "show", run.run_id], ["runs", "history", run.run_id]):
        for options in ([], ["--json"]):
            result = _cli(sqlite_url, *options, *args)
            assert result.exit_code == 0, (args, options, result.output)
            assert "Traceback" not in result.output
    shown = _cli(sqlite_url, "--json", "runs", "show", run.run_id)
    assert "(1, 2)" in shown.stdout
    json.loads(shown.stdout)


NUL_ID = "run_\x00"
"""A run id PostgreSQL's text cannot hold."""
NUL_RUN_DOORS: list[tuple[str, Call]] = [
    ("resume", lambda r: r.resume(NUL_ID)),
    ("runs.why", lambda r: r.runs.why(NUL_ID)),
    ("runs.state", lambda r: r.runs.state(NUL_ID)),
    ("runs.history", lambda r: r.runs.history(NUL_ID)),
    ("runs.at", lambda r: r.runs.at(NUL_ID, 1)),
    ("runs.purge", lambda r: r.runs.purge(NUL_ID, "asked")),
    ("runs.fork", lambda r: r.runs.fork(NUL_ID, 1)),
    ("runs.lineage", lambda r: r.runs.lineage(NUL_ID)),
    ("runs.compare", lambda r: r.runs.compare(NUL_ID, NUL_ID)),
    ("runs.refresh", lambda r: r.runs.refresh(NUL_ID)),
    ("runs.stale", lambda r: r.runs.stale(NUL_ID)),
]


@pytest.mark.parametrize("door", [d[1] for d in NUL_RUN_DOORS], ids=[d[0] for d in NUL_RUN_DOORS])
def test_an_id_holding_nul_is_unknown_on_every_backend(journal_url: str, door: Call) -> None:
    """O6, M11, ADR 0017: PostgreSQL's text holds no NUL; an id holding one names no run and
    no fact there as on SQLite, never the driver's DataError; nothing stored is touched."""
    with journaled.open(journal_url, clock=ManualClock(1_000)) as runtime:
        runtime.register_tool("echo", lambda data: data)
        runtime.memory.remember("the sky is blue")
        with pytest.raises(RunNotFound):
            door(runtime)
        assert not runtime.cancel(NUL_ID)
        fact_id = "mem_\x00"
        assert runtime.memory.why(fact_id) == f"no fact {fact_id} in this journal"
        assert runtime.memory.history(fact_id) == []
        assert runtime.memory.used_by(fact_id) == []
        assert runtime.memory.get(fact_id) is None
        assert [f.text for f in runtime.memory.all()] == ["the sky is blue"]
