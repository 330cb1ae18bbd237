"""Attacks on tamper evidence (R7): failures mid-append, odd journals, the CLI's exit status."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tracemalloc
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner
from test_verify import _pendings

import journaled
from journaled.cli import main
from journaled.events.catalog import codec
from journaled.events.errors import ConcurrencyConflict
from journaled.events.journal import Journal
from journaled.events.url import parse_url
from journaled.runtime import verify


def _path(url: str) -> str:
    return url.removeprefix("sqlite:///")


def test_a_rolled_back_append_does_not_leave_a_stale_head_behind(sqlite_url: str) -> None:
    """R7: after an append fails past its digest, another writer's commit still chains."""
    ours = Journal(parse_url(sqlite_url), codec())
    theirs = Journal(parse_url(sqlite_url), codec())
    try:
        ours.append(_pendings("a", 1), payloads={"mem_a_000000": b"first"})
        conn = sqlite3.connect(_path(sqlite_url))
        conn.execute(  # the payload insert fails after the record was computed (a full disk)
            "CREATE TRIGGER refuse BEFORE INSERT ON journaled_payloads WHEN NEW.stream = 'bad' "
            "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
        )
        conn.commit()
        conn.close()
        with pytest.raises(ConcurrencyConflict):
            ours.append(_pendings("b", 1), payloads={"bad": b"never stored"})
        theirs.append(_pendings("c", 1))  # takes the position the rollback gave back
        ours.append(_pendings("d", 1))  # predicts its positions right after the lost append
        report = ours.verify()
        assert report.ok, report.problem
        assert report.events == 3
    finally:
        ours.close()
        theirs.close()


def test_cli_verify_exits_2_when_the_journal_cannot_be_read(tmp_path: Path) -> None:
    """R7: `journal verify` exits 2, not 1 (tampered), when there is no journal to read."""
    not_a_journal = tmp_path / "notes.sqlite"
    not_a_journal.write_text("hello\n")
    for path in (tmp_path / "missing.sqlite", not_a_journal):
        result = CliRunner().invoke(main, ["--url", f"sqlite:///{path}", "journal", "verify"])
        assert result.exit_code == 2, result.output
        assert result.output.count("\n") == 1
        assert result.output.startswith("Error: ")


def test_a_forged_memory_snapshot_is_either_refused_or_reported(sqlite_url: str) -> None:
    """R7: a fact text forged in the memory snapshot is not served while verify says ok."""
    with journaled.open(sqlite_url) as rt:
        facts = [rt.memory.remember(f"the deploy key rotates on day {i}") for i in range(3)]
        rt.memory.checkpoint()
    conn = sqlite3.connect(_path(sqlite_url))
    key, state = conn.execute("SELECT stream, state FROM journaled_snapshots").fetchone()
    snapshot = msgspec.msgpack.decode(state)
    scope = snapshot["scopes"]["project"]  # embedded as encoded (ADR 0058)
    scope["facts"][facts[0].id]["text"] = "wire the funds to account 666"
    conn.execute(
        "UPDATE journaled_snapshots SET state = ? WHERE stream = ?",
        (msgspec.msgpack.encode(snapshot), key),
    )
    conn.commit()
    conn.close()
    with journaled.open(sqlite_url) as rt:
        served = sorted(f.text for f in rt.memory.all())
    journaled_texts = sorted(f.text for f in facts)
    assert served == journaled_texts or not verify(sqlite_url).ok


def _without_write_rights() -> list[str]:
    """Return a command prefix that runs a program unable to write what it does not own."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: file permissions cannot be enforced")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]


def test_verify_reads_a_journal_in_a_read_only_directory(tmp_path: Path) -> None:
    """R7: `journal verify` checks an archived journal whose file and directory are read-only."""
    archive = tmp_path / "archive"
    archive.mkdir()
    url = f"sqlite:///{archive / 'journal.sqlite'}"
    with journaled.open(url) as rt:
        rt.memory.remember("the deploy key rotates on Mondays")
    assert not list(archive.glob("*-wal"))
    assert not list(archive.glob("*-shm"))
    (archive / "journal.sqlite").chmod(0o444)
    archive.chmod(0o555)
    try:
        command = [sys.executable, "-m", "journaled.cli", "--url", url, "journal", "verify"]
        result = subprocess.run(
            [*_without_write_rights(), *command],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    finally:
        archive.chmod(0o755)
    assert result.returncode == 0, result.stderr
    assert "1 events read" in result.stdout


def test_verify_does_not_hold_every_payload_in_memory_at_once(sqlite_url: str) -> None:
    """R7: verify reads the whole journal without keeping all payload bytes in memory at once."""
    journal = Journal(parse_url(sqlite_url), codec())
    size, count = 4_000_000, 10
    try:
        for i in range(count):
            events = _pendings(f"big{i}", 1)
            journal.append(events, payloads={events[0].stream: bytes([65 + i]) * size})
        tracemalloc.start()
        try:
            report = journal.verify()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    finally:
        journal.close()
    assert report.ok, report.problem
    assert peak < size * count / 2, f"verify held {peak / 1e6:.0f} MB at its peak"


def test_a_kept_head_reveals_a_cut_off_tail_even_after_later_appends(sqlite_url: str) -> None:
    """R7: a head digest kept from an earlier verify shows the tail was cut, though appended to."""
    journal = Journal(parse_url(sqlite_url), codec())
    try:
        for i in range(3):
            journal.append(_pendings(f"a{i}", 1))
        kept = journal.verify().head
        assert kept is not None
        journal.append(_pendings("later", 1))
        assert journal.verify(head=kept).ok  # an honest continuation keeps the kept head
        kept = journal.verify().head
        assert kept is not None
        conn = sqlite3.connect(_path(sqlite_url))
        conn.execute("DELETE FROM stored_events WHERE rowid = 4")  # the last commit
        conn.commit()
        conn.close()
        journal.append(_pendings("after", 1))  # takes position 4 again, chained to 3
        assert journal.verify().ok  # the chain alone cannot tell
        report = journal.verify(head=kept)
    finally:
        journal.close()
    assert report.problem is not None
    assert report.problem.kind == "removed"
    assert kept in report.problem.reason
    result = CliRunner().invoke(
        main, ["--url", sqlite_url, "journal", "verify", "--head", kept], catch_exceptions=False
    )
    assert result.exit_code == 1, result.output
    assert "(removed)" in result.output
    typo = CliRunner().invoke(main, ["--url", sqlite_url, "journal", "verify", "--head", kept[1:]])
    assert typo.exit_code == 2, typo.output  # a mistyped digest is no evidence of tampering
    assert "head:" in typo.output


@pytest.mark.parametrize(
    "change",
    [
        "chain_digest = 'x'",
        "chain_hashes = 'x'",
        "chain_first = 'x'",
        "chain_prev = 1.5",
        "originator_version = 'x'",
    ],
)
def test_a_column_rewritten_with_another_type_is_reported_not_raised(
    sqlite_url: str, change: str
) -> None:
    """R7: an event or digest column rewritten as text or real is reported as altered."""
    journal = Journal(parse_url(sqlite_url), codec())
    try:
        for i in range(3):
            journal.append(_pendings(f"a{i}", 1), payloads={f"mem_a{i}_000000": b"text"})
    finally:
        journal.close()
    conn = sqlite3.connect(_path(sqlite_url))
    conn.execute(f"UPDATE stored_events SET {change} WHERE rowid = 2")  # noqa: S608
    conn.commit()
    conn.close()
    report = verify(sqlite_url)
    assert report.problem is not None
    assert (report.problem.position, report.problem.kind) == (2, "altered")


def test_a_payload_rewritten_as_text_does_not_break_verify(sqlite_url: str) -> None:
    """R7: verify reads a payload column rewritten as text by its bytes instead of raising."""
    journal = Journal(parse_url(sqlite_url), codec())
    try:
        journal.append(_pendings("a", 1), payloads={"mem_a_000000": b"text"})
    finally:
        journal.close()
    conn = sqlite3.connect(_path(sqlite_url))
    conn.execute("UPDATE journaled_payloads SET payload = 'other text'")
    conn.commit()
    conn.close()
    report = verify(sqlite_url)
    assert report.problem is not None
    assert (report.problem.position, report.problem.kind) == (1, "payload-altered")


def test_verify_on_a_sqlite_file_without_a_journal_changes_nothing(tmp_path: Path) -> None:
    """R7: `journal verify` on another program's SQLite file exits 2 and adds no table to it."""
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.commit()
    conn.close()
    result = CliRunner().invoke(main, ["--url", f"sqlite:///{other}", "journal", "verify"])
    assert result.exit_code == 2, result.output
    assert "no journal at" in result.output
    conn = sqlite3.connect(other)
    try:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master")]
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        conn.close()
    assert tables == ["notes"]
    assert mode == "delete"


@pytest.mark.parametrize("head", [5, b"00" * 16, ["0" * 32]], ids=["int", "bytes", "list"])
def test_a_head_that_is_no_text_is_refused_naming_head(sqlite_url: str, head: object) -> None:
    """R7, ADR 0023: ``verify(head=5)`` names the argument, at both doors, not a bare
    ``TypeError`` from the regular expression."""
    with journaled.open(sqlite_url) as rt:
        rt.memory.remember("one")
        with pytest.raises(ValueError, match=r"^head: "):
            rt.journal.verify(head=head)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^head: "):
        verify(sqlite_url, head=head)  # type: ignore[arg-type]


def test_a_chained_journal_whose_first_event_is_altered_is_not_called_unchained(
    sqlite_url: str,
) -> None:
    """R7, ADR 0082: with position 1 altered, the report still says where the chain starts
    (position 1); the CLI never prints "no digest chain yet" above the failure."""
    with journaled.open(sqlite_url) as rt:
        rt.memory.remember("one")
        rt.memory.remember("two")
    with sqlite3.connect(_path(sqlite_url)) as conn:
        conn.execute("UPDATE stored_events SET state = x'c1' WHERE rowid = 1")
    report = verify(sqlite_url)
    assert report.problem is not None
    assert report.problem.position == 1
    assert report.chained_from == 1
    result = CliRunner().invoke(main, ["--url", sqlite_url, "journal", "verify"])
    assert result.exit_code == 1, result.output
    assert "no digest chain" not in result.output
    assert "position 1" in result.output
