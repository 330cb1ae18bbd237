"""Attacks on memory's schema-4 snapshot and on SQLite's payload reads by key (ADR 0058).

A snapshot is a cache outside the digest chain: whatever is forged into it, an open must answer
as a fold of the journal would (M4), never serve a text the journal does not hold for that fact
(R7), and never show another organization's fact (R1). Payloads read by key must be exactly the
wanted ones whatever the keys are.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from in_place import fail_fold_once, writer_of

import journaled
from journaled.actors.memory import MemoryWriter
from journaled.cli import main
from journaled.events.base import Pending
from journaled.events.catalog import STORED_EVENTS
from journaled.events.codec import Codec
from journaled.events.journal import SNAPSHOT_TABLE, Journal
from journaled.events.memory import FactRemembered
from journaled.events.memory_state import MEMORY_SNAPSHOT_SCHEMA
from journaled.events.url import parse_url
from journaled.runtime import verify
from journaled.testing import ManualClock

Edit = Callable[[dict[str, Any]], None]


def _path(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///").partition("?")[0])


def _answers(rt: journaled.Runtime, now: int, *, search: bool = True) -> object:
    facts = sorted(rt.memory.all(), key=lambda f: f.id)
    if not search:
        return msgspec.to_builtins({"all": facts})
    return msgspec.to_builtins(
        {
            "all": facts,
            "search": [f.id for f in rt.memory.search("deploy api port", now=now)],
            "scoped": [f.id for f in rt.memory.search("api", scopes=["user"], now=now)],
        }
    )


def _populate(rt: journaled.Runtime, clock: ManualClock) -> None:
    for i in range(12):
        rt.memory.remember(
            f"deploy api number {i} on port {8000 + i}",
            conflict_key=f"k{i % 4}",
            scope=["project", "user", "session"][i % 3],
            valid_until=clock.now + 10_000 if i % 5 == 0 else None,
        )
    rt.memory.delete(rt.memory.all()[3].id)


def _snapshot_rows(path: Path) -> dict[str, bytes]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(f"SELECT stream, state FROM {SNAPSHOT_TABLE}").fetchall()  # noqa: S608
    return {str(k): bytes(v) for k, v in rows}


def _edit(path: Path, key: str, edit: Edit) -> None:
    """Rewrite one stored memory snapshot, decoded as plain maps, through ``edit``."""
    with sqlite3.connect(path) as conn:
        (state,) = conn.execute(
            f"SELECT state FROM {SNAPSHOT_TABLE} WHERE stream = ?",  # noqa: S608
            (key,),
        ).fetchone()
        snapshot = msgspec.msgpack.decode(state)
        edit(snapshot)
        conn.execute(
            f"UPDATE {SNAPSHOT_TABLE} SET state = ? WHERE stream = ?",  # noqa: S608
            (msgspec.msgpack.encode(snapshot), key),
        )


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the writer's position right after each open's snapshot restore (0: not served)."""
    positions: list[int] = []
    restore = MemoryWriter._restore_snapshot

    def spy(self: MemoryWriter) -> None:
        restore(self)
        positions.append(self.position)

    monkeypatch.setattr(MemoryWriter, "_restore_snapshot", spy)
    return positions


@pytest.fixture
def made(sqlite_url: str) -> tuple[str, ManualClock, int, object]:
    """A journal with memory's snapshot: (url, clock, now, the answers of a full fold)."""
    clock = ManualClock(step=3)
    with journaled.open(sqlite_url, clock=clock) as rt:
        _populate(rt, clock)
        assert rt.memory.checkpoint()
        now = clock.now
        expected = _answers(rt, now)
    return sqlite_url, clock, now, expected


def _project(snapshot: dict[str, Any]) -> dict[str, Any]:
    part: dict[str, Any] = snapshot["scopes"]["project"]
    return part


# -- forged snapshots -----------------------------------------------------------------------------


def _id_not_key(snapshot: dict[str, Any]) -> None:
    """A fact kept under its own key (so its text is that key's payload) but naming another id."""
    facts = _project(snapshot)["facts"]
    ids = sorted(facts)
    facts[ids[0]]["id"] = ids[1]


def _extra_scope(snapshot: dict[str, Any]) -> None:
    snapshot["scopes"]["elsewhere"] = snapshot["scopes"]["project"]


def _missing_scope(snapshot: dict[str, Any]) -> None:
    del snapshot["scopes"]["repository"]


def _erased_with_text(snapshot: dict[str, Any]) -> None:
    part = _project(snapshot)
    part["erased"] = sorted(part["facts"])[:1]


def _erased_text_unerased(snapshot: dict[str, Any]) -> None:
    """A fact whose text shows as purged while its payload is still there."""
    part = _project(snapshot)
    fact_id = sorted(part["facts"])[0]
    part["facts"][fact_id]["text"] = "[purged]"
    part["erased"] = [fact_id]


def _scopes_swapped(snapshot: dict[str, Any]) -> None:
    scopes = snapshot["scopes"]
    scopes["project"], scopes["user"] = scopes["user"], scopes["project"]


def _physical_renamed(snapshot: dict[str, Any]) -> None:
    _project(snapshot)["physical"] = "user"


def _part_is_bytes(snapshot: dict[str, Any]) -> None:
    snapshot["scopes"]["project"] = msgspec.msgpack.encode(snapshot["scopes"]["project"])


def _text_changed_by_one_char(snapshot: dict[str, Any]) -> None:
    facts = _project(snapshot)["facts"]
    fact = facts[sorted(facts)[0]]
    fact["text"] = fact["text"] + " "


def _fact_of_another_scope(snapshot: dict[str, Any]) -> None:
    """A project fact filed, and routed, under the user scope's part."""
    project, user = _project(snapshot)["facts"], snapshot["scopes"]["user"]["facts"]
    fact_id = sorted(project)[0]
    user[fact_id] = project.pop(fact_id)
    snapshot["route"][fact_id] = "user"


def _fact_gone_with_its_lengths(snapshot: dict[str, Any]) -> None:
    """A fact dropped with its index lengths and groups; its number stays in the index."""
    part = _project(snapshot)
    fact_id = sorted(part["facts"])[-1]
    del part["facts"][fact_id]
    part["index"]["lengths"].pop(fact_id, None)
    part["index"]["terms"].pop(fact_id, None)
    part["plain_group"].pop(fact_id, None)


@pytest.mark.parametrize(
    "forge",
    [
        _fact_of_another_scope,
        _fact_gone_with_its_lengths,
        _id_not_key,
        _extra_scope,
        _missing_scope,
        _erased_with_text,
        _erased_text_unerased,
        _scopes_swapped,
        _physical_renamed,
        _part_is_bytes,
        _text_changed_by_one_char,
    ],
)
def test_a_forged_snapshot_never_changes_an_answer(
    made: tuple[str, ManualClock, int, object], forge: Edit
) -> None:
    """M4, R7: whatever shape a forged snapshot has, the open answers as the full fold."""
    url, clock, now, expected = made
    _edit(_path(url), "memory:", forge)
    with journaled.open(url, clock=clock) as rt:
        assert _answers(rt, now) == expected
        # and memory goes on: a fold after the open finds every fact where it should be
        fact = rt.memory.remember("deploy api after the forgery", conflict_key="k1")
        assert rt.memory.get(fact.id) is not None
        assert fact.id in {f.id for f in rt.memory.all()}


def test_a_fact_served_under_an_id_is_that_ids_text(
    made: tuple[str, ManualClock, int, object],
) -> None:
    """R7: every fact an open serves has, as its text, the payload the journal holds for its own
    id, not the payload of the key it was filed under in the snapshot."""
    url, clock, _, _ = made
    _edit(_path(url), "memory:", _id_not_key)
    journal = Journal(parse_url(url), Codec(STORED_EVENTS))
    try:
        with journaled.open(url, clock=clock) as rt:
            facts = rt.memory.all()
            held = journal.payloads([f.id for f in facts])
            wrong = [f.id for f in facts if held.get(f.id) != f.text.encode()]
            assert wrong == []
            assert len({f.id for f in facts}) == len(facts)  # no id served twice
    finally:
        journal.close()


def test_non_ascii_texts_are_served_from_the_snapshot(sqlite_url: str, served: list[int]) -> None:
    """ADR 0058: texts beyond ASCII (accents, emoji, NUL, control characters) pass the check
    byte for byte, so the snapshot is served, and answers are those of the fold."""
    texts = [
        "café au lait",
        "日本語のテキスト",
        "emoji \U0001f600 here",
        "nul\x00inside",
        "tab\tbell\a",
    ]
    with journaled.open(sqlite_url) as rt:
        for text in texts:
            rt.memory.remember(text)
        assert rt.memory.checkpoint()
        expected = sorted(f.text for f in rt.memory.all())
        position = writer_of(rt).position
    served.clear()
    with journaled.open(sqlite_url) as rt:
        assert sorted(f.text for f in rt.memory.all()) == expected == sorted(texts)
    assert served == [position]


def test_a_snapshot_of_an_empty_scope_set_is_served(sqlite_url: str, served: list[int]) -> None:
    """Memory whose every fact was deleted: a snapshot of empty scopes is restored, not refused."""
    with journaled.open(sqlite_url) as rt:
        fact = rt.memory.remember("short lived")
        rt.memory.delete(fact.id)
        assert rt.memory.checkpoint()
        position = writer_of(rt).position
        before = msgspec.to_builtins(rt.memory.all())
    served.clear()
    with journaled.open(sqlite_url) as rt:
        assert msgspec.to_builtins(rt.memory.all()) == before
        assert rt.memory.remember("after").text == "after"
    assert served == [position]


def test_a_snapshot_put_back_after_a_purge_never_serves_the_purged_text(
    sqlite_url: str, served: list[int]
) -> None:
    """R2, R7: an operator restores memory's snapshot row from before a purge: the open sees
    the payload gone and folds instead; the erased text is served nowhere."""
    with journaled.open(sqlite_url) as rt:
        secret = rt.memory.remember("the escrow code is 777-888-999")
        rt.memory.remember("an ordinary fact")
        assert rt.memory.checkpoint()
        old = _snapshot_rows(_path(sqlite_url))
        rt.memory.purge(secret.id)
    with sqlite3.connect(_path(sqlite_url)) as conn:
        conn.executemany(
            f"INSERT OR REPLACE INTO {SNAPSHOT_TABLE} VALUES (?, ?, ?)",  # noqa: S608
            [(k, 2, v) for k, v in old.items()],
        )
    served.clear()
    with journaled.open(sqlite_url) as rt:
        texts = [f.text for f in rt.memory.all()]
        assert all("777-888-999" not in t for t in texts)
        assert rt.memory.search("escrow") == []
        got = rt.memory.get(secret.id)
        assert got is None or "777" not in got.text
    assert served == [0]


# -- organizations ----------------------------------------------------------------------------


def _two_organizations(url: str) -> dict[str, object]:
    answers: dict[str, object] = {}
    for organization in ("acme", "globex"):
        with journaled.open(url, organization=organization) as rt:
            rt.memory.remember(f"{organization} ships deploy api on Fridays", scope="organization")
            rt.memory.remember(f"{organization} deploy api rota", scope="project")
            assert rt.memory.checkpoint()
    for organization in ("acme", "globex"):
        with journaled.open(url, organization=organization) as rt:
            rt.memory.checkpoint()
            answers[organization] = _answers(rt, 10**13)
    return answers


def test_two_organizations_each_open_from_their_own_snapshot(
    sqlite_url: str, served: list[int]
) -> None:
    """R1: with two organizations on one journal, each open is served by its own snapshot and
    answers as its own full fold (its organization's facts and the shared ones)."""
    answers = _two_organizations(sqlite_url)
    served.clear()
    for organization in ("acme", "globex"):
        with journaled.open(sqlite_url, organization=organization) as rt:
            assert _answers(rt, 10**13) == answers[organization]
            other = "globex" if organization == "acme" else "acme"
            assert all(other not in f.text or f.scope != "organization" for f in rt.memory.all())
    assert all(p > 0 for p in served), served
    with sqlite3.connect(_path(sqlite_url)) as conn:
        conn.execute(f"DELETE FROM {SNAPSHOT_TABLE}")  # noqa: S608
    for organization in ("acme", "globex"):
        with journaled.open(sqlite_url, organization=organization) as rt:
            assert _answers(rt, 10**13) == answers[organization]


def test_another_organizations_fact_forged_into_a_snapshot_is_not_served(
    sqlite_url: str,
) -> None:
    """R1: globex's organization fact, copied into acme's snapshot with its true text (so the
    payload check passes), is never shown to acme."""
    _two_organizations(sqlite_url)
    path = _path(sqlite_url)
    globex = msgspec.msgpack.decode(_snapshot_rows(path)["memory:globex"])
    theirs = globex["scopes"]["organization"]["facts"]
    assert len(theirs) == 1

    def smuggle(snapshot: dict[str, Any]) -> None:
        snapshot["scopes"]["organization"]["facts"].update(theirs)
        snapshot["route"].update(dict.fromkeys(theirs, "organization"))

    _edit(path, "memory:acme", smuggle)
    with journaled.open(sqlite_url, organization="acme") as rt:
        shown = [f.text for f in rt.memory.all() if f.scope == "organization"]
        assert not any(t.startswith("globex") for t in shown), shown
        found = rt.memory.search("globex Fridays", scopes=["organization"])
        assert not any(f.text.startswith("globex") for f in found), found
        assert all(rt.memory.get(fact_id) is None for fact_id in theirs)


# -- the check is not the whole story --------------------------------------------------------


def test_a_snapshot_missing_a_fact_is_not_served(
    made: tuple[str, ManualClock, int, object],
) -> None:
    """M4: a snapshot that silently lost a fact (every text it keeps matches) must not make the
    fact vanish from memory."""
    url, clock, now, expected = made

    def drop(snapshot: dict[str, Any]) -> None:
        facts = _project(snapshot)["facts"]
        del facts[sorted(facts)[-1]]

    _edit(_path(url), "memory:", drop)
    with journaled.open(url, clock=clock) as rt:
        assert _answers(rt, now) == expected


def test_as_of_ignores_a_forged_snapshot(made: tuple[str, ManualClock, int, object]) -> None:
    """M12: a view of the past folds the events alone, whatever memory's snapshot says."""
    url, clock, _, expected = made

    def drop_all(snapshot: dict[str, Any]) -> None:
        for part in snapshot["scopes"].values():
            part["facts"] = {}

    _edit(_path(url), "memory:", drop_all)
    with journaled.open(url, clock=clock) as rt:
        last = rt.journal.position()
        past = rt.memory.as_of(position=last)
        want = msgspec.convert(expected, dict[str, Any])["all"]
        assert sorted(f.id for f in past.all()) == sorted(f["id"] for f in want)


def test_verify_reports_a_schema_4_part_that_does_not_decode(
    made: tuple[str, ManualClock, int, object],
) -> None:
    """R7: `journal verify` on a schema-4 snapshot whose scope part is no scope reports the
    snapshot altered (exit 1), and a clean one verifies."""
    url, _, _, _ = made
    assert verify(url).ok
    clean = CliRunner().invoke(main, ["--url", url, "journal", "verify"])
    assert clean.exit_code == 0, clean.output
    _edit(_path(url), "memory:", lambda s: s["scopes"].__setitem__("user", [1, 2, 3]))
    report = verify(url)
    assert report.problem is not None
    assert report.problem.kind == "snapshot-altered"
    assert "user" in report.problem.reason
    result = CliRunner().invoke(main, ["--url", url, "journal", "verify"])
    assert result.exit_code == 1, result.output


def test_verify_reports_a_fact_filed_under_another_id(
    made: tuple[str, ManualClock, int, object],
) -> None:
    """R7: verify compares by content: a fact whose id differs from its key is reported."""
    url, _, _, _ = made
    _edit(_path(url), "memory:", _id_not_key)
    report = verify(url)
    assert report.problem is not None
    assert report.problem.kind == "snapshot-altered"


# -- layouts, rebuilds, containers --------------------------------------------------------------


def test_an_upgrade_from_a_schema_3_snapshot_leaves_a_schema_4_one(
    sqlite_url: str, served: list[int]
) -> None:
    """ADR 0058: the first open after the upgrade folds the log, and its close writes a
    schema-4 snapshot (over the schema-3 one at the same position), which the next open serves."""
    with journaled.open(sqlite_url) as rt:
        for i in range(520):
            rt.memory.remember(f"fact {i}")
        position = writer_of(rt).position
    path = _path(sqlite_url)

    def to_schema_3(snapshot: dict[str, Any]) -> None:
        snapshot["schema"] = 3
        snapshot["scopes"] = {k: msgspec.msgpack.encode(v) for k, v in snapshot["scopes"].items()}

    _edit(path, "memory:", to_schema_3)
    served.clear()
    with journaled.open(sqlite_url) as rt:
        assert len(rt.memory.all()) == 520
    assert served == [0]
    stored = msgspec.msgpack.decode(_snapshot_rows(path)["memory:"])
    assert stored["schema"] == MEMORY_SNAPSHOT_SCHEMA
    with journaled.open(sqlite_url) as rt:
        assert len(rt.memory.all()) == 520
    assert served == [0, position]


def test_a_rebuild_after_a_failed_fold_on_a_restored_memory_is_whole(
    made: tuple[str, ManualClock, int, object], monkeypatch: pytest.MonkeyPatch, served: list[int]
) -> None:
    """A fold that fails after an open from the snapshot rebuilds memory into empty scopes
    (RestoreScope with a fresh state): it answers as the fold, and its next snapshot too."""
    url, clock, now, expected = made
    with journaled.open(url, clock=clock) as rt:
        assert served[-1] > 0
        fail_fold_once(monkeypatch)
        boom = rt.memory.remember("boom")
        after = rt.memory.remember("deploy api after the rebuild")
        assert rt.memory.get(boom.id) is not None
        ids = {f.id for f in rt.memory.all()}
        assert {boom.id, after.id} <= ids
        answers = _answers(rt, now)
        assert rt.memory.checkpoint()
    with journaled.open(url, clock=clock) as rt:
        assert _answers(rt, now) == answers
    assert verify(url).ok
    want = msgspec.convert(expected, dict[str, Any])["all"]
    assert len(msgspec.convert(answers, dict[str, Any])["all"]) == len(want) + 2


def test_restored_scopes_share_no_container(
    made: tuple[str, ManualClock, int, object], served: list[int]
) -> None:
    """ADR 0058: what a scope adopts is its own: no two scopes, and not the writer, hold the same
    facts or groups; folds after the restore change one scope only, and a second snapshot and
    open answer as the fold."""
    url, clock, now, _ = made
    with journaled.open(url, clock=clock) as rt:
        assert served[-1] > 0
        writer = writer_of(rt)
        states = [shelf.state for shelf in writer.shelves.values()]
        facts = [id(s.facts) for s in states]
        groups = [id(s._plain_group) for s in states]
        assert len(set(facts)) == len(facts)
        assert len(set(groups)) == len(groups)
        mine = {id(writer.route), id(writer.versions), id(writer.hidden_superseders)}
        assert not mine & set(facts + groups)
        before = {name: dict(s.facts) for name, s in zip(writer.shelves, states, strict=True)}
        new = rt.memory.remember("deploy api port 9999", scope="user")
        target = rt.memory.all()[0]
        rt.memory.delete(target.id)
        for name, shelf in writer.shelves.items():
            changed = set(shelf.state.facts) ^ set(before[name])
            if name not in ("user", writer.route.get(target.id) or ""):
                assert not changed, name
        answers = _answers(rt, now)
        assert rt.memory.checkpoint()
        assert new.id in {f.id for f in rt.memory.all()}
    with journaled.open(url, clock=clock) as rt:
        assert _answers(rt, now) == answers
    with sqlite3.connect(_path(url)) as conn:
        conn.execute(f"DELETE FROM {SNAPSHOT_TABLE}")  # noqa: S608
    with journaled.open(url, clock=clock) as rt:
        assert _answers(rt, now) == answers


# -- payload reads by key ---------------------------------------------------------------------


def _fill(journal: Journal, keys: list[str]) -> None:
    for start in range(0, len(keys), 500):
        chunk = keys[start : start + 500]
        journal.append(
            [
                Pending(stream=k, version=1, data=FactRemembered(at=1, fact_id=k, scope="project"))
                for k in chunk
            ],
            payloads={k: f"text of {k}".encode() for k in chunk},
        )


_ODD = [
    f"k{i:03d}{suffix}" for i in range(60) for suffix in ("", "\x00", "\x01", "é", "\U0001f600")
]
"""Keys whose order depends on how text compares: NUL, control characters, beyond ASCII."""


@pytest.mark.parametrize("encoding", ["UTF-8", "UTF-16le", "UTF-16be"])
def test_payload_reads_by_key_whatever_the_database_text_encoding(
    tmp_path: Path, encoding: str
) -> None:
    """ADR 0058's range read assumes SQLite compares text as Python sorts it (UTF-8 bytes). A
    journal file created with another text encoding (an operator's own tooling) must still give
    every wanted payload."""
    path = tmp_path / "journal.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA encoding = '{encoding}'")
        conn.execute("CREATE TABLE operators_own (x)")  # writes the header: the encoding stays
        conn.execute("DROP TABLE operators_own")  # a file of other tables is refused (ADR 0004)
    journal = Journal(parse_url(f"sqlite:///{path}"), Codec(STORED_EVENTS))
    try:
        _fill(journal, _ODD)
        got = journal.payloads(list(_ODD))
        assert sorted(got) == sorted(_ODD)
        assert all(v == f"text of {k}".encode() for k, v in got.items())
    finally:
        journal.close()


def test_payload_reads_of_odd_keys_many_duplicated_and_among_other_streams(
    sqlite_url: str,
) -> None:
    """Keys with NUL and control characters, beyond ASCII, duplicated across 500-key chunks, many
    (over 1,500), with run content keys and missing keys in between: exactly the wanted ones."""
    runs = [f"run-x@{i}" for i in range(400)]
    facts = [f"mem_{i:05d}" for i in range(1500)]
    keys = [*_ODD, *runs, *facts]
    journal = Journal(parse_url(sqlite_url), Codec(STORED_EVENTS))
    try:
        _fill(journal, keys)
        wanted = [*facts[::2], *_ODD, *facts[::2], "mem_missing", "run-x@9999", *runs[::7]]
        got = journal.payloads(wanted)
        want = {k for k in wanted if k in set(keys)}
        assert set(got) == want
        assert all(got[k] == f"text of {k}".encode() for k in want)
        assert journal.payloads(list(reversed(wanted))) == got
    finally:
        journal.close()


def test_memory_with_many_facts_opens_from_the_snapshot_with_every_text(
    sqlite_url: str, served: list[int]
) -> None:
    """ADR 0058: an open from the snapshot reads every fact's payload in ranges (over 500, so
    several chunks): every fact is there with its text, and the snapshot is served."""
    with journaled.open(sqlite_url) as rt:
        for i in range(1200):
            rt.memory.remember(f"fact {i} \u00e9t\u00e9", scope=["project", "user"][i % 2])
        assert rt.memory.checkpoint()
        position = writer_of(rt).position
        expected = {f.id: f.text for f in rt.memory.all()}
    served.clear()
    with journaled.open(sqlite_url) as rt:
        assert {f.id: f.text for f in rt.memory.all()} == expected
    assert served == [position]


# -- a posting the open's check cannot read (it stays encoded, ADR 0060) ---------------------------


def _bad_posting(snapshot: dict[str, Any]) -> None:
    """The posting of a term every search of ``_answers`` reads."""
    postings = _project(snapshot)["index"]["postings"]
    assert "deploy" in postings
    postings["deploy"] = "not a posting"


def test_an_unreadable_posting_is_healed_from_the_journal(
    made: tuple[str, ManualClock, int, object],
) -> None:
    """The first search to read it fails with IndexTorn, memory is rebuilt from the journal
    (never from that snapshot again), answers as a full fold, and the close replaces the
    snapshot: the next open is served a good one and verify says ok."""
    url, clock, now, expected = made
    _edit(_path(url), "memory:", _bad_posting)
    with journaled.open(url, clock=clock) as rt:
        with pytest.raises(journaled.IndexTorn, match="cannot be read"):
            _answers(rt, now)  # the search that meets it; the next ones are answered
        assert _answers(rt, now) == expected
    with journaled.open(url, clock=clock) as rt:
        assert _answers(rt, now) == expected
    assert verify(url).ok


def test_an_unreadable_posting_met_indexing_a_fact_folded_after_the_snapshot_is_healed(
    made: tuple[str, ManualClock, int, object],
) -> None:
    """A fact remembered after the snapshot is folded on open, and indexed by the first search
    (ADR 0091): indexing it meets the unreadable postings, that search fails with IndexTorn,
    memory is rebuilt from the journal and answers as before, and the close replaces the
    snapshot."""
    url, clock, now, _ = made
    with journaled.open(url, clock=clock) as rt:
        rt.memory.remember("deploy api number 99 on port 9999", scope="project")
        now = clock.now
        expected = _answers(rt, now)
    _edit(_path(url), "memory:", _poison_every_posting)
    with journaled.open(url, clock=clock) as rt:
        assert _answers(rt, now, search=False) == {"all": expected["all"]}  # type: ignore[index]
        with pytest.raises(journaled.IndexTorn, match="cannot be read"):
            _answers(rt, now)
        assert _answers(rt, now) == expected
    with journaled.open(url, clock=clock) as rt:
        assert _answers(rt, now) == expected
    assert verify(url).ok


def _poison_every_posting(snapshot: dict[str, Any]) -> None:
    postings = _project(snapshot)["index"]["postings"]
    for term in postings:
        postings[term] = "not a posting"


def test_verify_reports_an_unreadable_posting(made: tuple[str, ManualClock, int, object]) -> None:
    url, _, _, _ = made
    _edit(_path(url), "memory:", _bad_posting)
    report = verify(url)
    assert not report.ok
    assert report.problem is not None
    assert report.problem.kind == "snapshot-altered"


def test_a_wait_that_finds_the_journal_closed_opens_no_listener(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() between a wait's open check and its listener: the wait opens none (it could
    never be closed)."""
    journal = Journal(parse_url(pg_url), Codec(STORED_EVENTS))
    real = Journal._check_open

    def check_then_close(self: Journal) -> None:
        real(self)
        monkeypatch.setattr(Journal, "_check_open", real)
        self.close()

    monkeypatch.setattr(Journal, "_check_open", check_then_close)
    assert journal.wait_for_foreign(0.05, ("run.", "orchestration.")) is False
    assert journal._listener is None
    monkeypatch.setattr(Journal, "_check_open", check_then_close)
    reopened = Journal(parse_url(pg_url), Codec(STORED_EVENTS))
    monkeypatch.setattr(Journal, "_check_open", check_then_close)
    reopened.wait_for_appends(0.05)
    assert reopened._listener_all is None
