"""The journal contract (J1, J2, J4, J5), run against every backend through one fixture."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from journaled.events.base import Pending
from journaled.events.codec import Codec
from journaled.events.errors import (
    AppendRefused,
    ConcurrencyConflict,
    CorruptEvent,
    JournalClosed,
    JournalUnreadable,
    JournalUrlError,
    UnreadableEvent,
)
from journaled.events.journal import PAYLOAD_TABLE, Journal
from journaled.events.memory import MEMORY_EVENTS, FactPurged, FactRemembered
from journaled.events.url import default_url, parse_url


@pytest.fixture
def journal(journal_url: str) -> Iterator[Journal]:
    """Yield an open journal on each backend."""
    j = Journal(parse_url(journal_url), Codec(MEMORY_EVENTS))
    yield j
    j.close()


def remembered(fact_id: str, at: int = 1) -> FactRemembered:
    """Make a small event."""
    return FactRemembered(at=at, fact_id=fact_id, scope="project")


def test_an_event_that_would_not_read_back_is_refused_and_nothing_of_its_append_stored(
    journal: Journal,
) -> None:
    """R7, J5: msgspec encodes a field of the wrong type without a word, and every later read
    would fail at that event; the append refuses it, naming the event, the stream and the
    field, and stores nothing of its batch (the valid event beside it included)."""
    journal.append([Pending(stream="a", version=1, data=remembered("a"))])
    before = [(e.position, e.stream, e.data) for e in journal.read()]
    wrong = FactRemembered(at=2, fact_id="b", scope=5)  # type: ignore[arg-type]
    with pytest.raises(UnreadableEvent) as raised:
        journal.append(
            [
                Pending(stream="c", version=1, data=remembered("c")),
                Pending(stream="b", version=1, data=wrong),
            ]
        )
    message = str(raised.value)
    for part in ("memory.fact-remembered", "stream b", "scope", "nothing was appended"):
        assert part in message, message
    assert isinstance(raised.value, ValueError)
    assert [(e.position, e.stream, e.data) for e in journal.read()] == before
    assert journal.verify().ok
    assert journal.append([Pending(stream="c", version=1, data=remembered("c"))]) == [2]


def test_positions_are_one_global_order(journal: Journal) -> None:
    """J1: every append gets increasing positions, and read() returns that order."""
    assert journal.position() == 0
    p1 = journal.append([Pending(stream="a", version=1, data=remembered("a"))])
    p2 = journal.append(
        [
            Pending(stream="b", version=1, data=remembered("b")),
            Pending(stream="a", version=2, data=FactPurged(at=2, fact_id="a")),
        ]
    )
    assert p1 == [1]
    assert p2 == [2, 3]
    assert journal.position() == 3
    events = list(journal.read())
    assert [(e.position, e.stream, e.version) for e in events] == [
        (1, "a", 1),
        (2, "b", 1),
        (3, "a", 2),
    ]
    assert [e.position for e in journal.read(after=1, upto=2)] == [2]


def test_read_pages_through_long_logs(journal: Journal) -> None:
    """J1: reading pages through more events than one page holds, in order."""
    journal.append(
        [Pending(stream=f"s{i}", version=1, data=remembered(f"s{i}")) for i in range(2500)]
    )
    assert [e.position for e in journal.read(page=1000)] == list(range(1, 2501))


def test_conflicting_append_writes_nothing(journal: Journal) -> None:
    """J2/J3: an append whose one event conflicts is rejected whole, payloads included."""
    journal.append([Pending(stream="a", version=1, data=remembered("a"))], payloads={"a": b"one"})
    with pytest.raises(ConcurrencyConflict) as info:
        journal.append(
            [
                Pending(stream="b", version=1, data=remembered("b")),
                Pending(stream="a", version=1, data=remembered("a")),
            ],
            payloads={"b": b"two"},
        )
    assert "a" in info.value.streams
    assert journal.position() == 1
    assert journal.stream("b") == []
    assert journal.payloads() == {"a": b"one"}


def test_payloads_written_and_forgotten_with_events(journal: Journal) -> None:
    """M10: payloads are written with their events and forgotten in the same append."""
    journal.append([Pending(stream="a", version=1, data=remembered("a"))], payloads={"a": b"text"})
    assert journal.payloads(["a", "zzz"]) == {"a": b"text"}
    journal.append(
        [Pending(stream="a", version=2, data=FactPurged(at=3, fact_id="a"))], forget=["a"]
    )
    assert journal.payloads() == {}
    journal.scrub()


def test_an_erasure_owes_a_scrub_until_one_succeeds(journal: Journal, journal_url: str) -> None:
    """M10/R2: each erasure's commit records the scrub it owes; a later scrub pays it."""
    journal.append([Pending(stream="a", version=1, data=remembered("a"))], payloads={"a": b"t"})
    journal.append([Pending(stream="b", version=1, data=remembered("b"))], payloads={"b": b"u"})
    assert journal.scrub_debt() == 0  # writing owes nothing
    for stream in ("a", "b"):
        purged = Pending(stream=stream, version=2, data=FactPurged(at=2, fact_id=stream))
        journal.append([purged], forget=[stream])
    assert journal.scrub_debt() == 2
    if journal_url != "memory://":  # another process's journal sees the same debt
        other = Journal(parse_url(journal_url), Codec(MEMORY_EVENTS))
        try:
            assert other.scrub_debt() == 2
            other.scrub()
        finally:
            other.close()
    else:
        journal.scrub()
    assert journal.scrub_debt() == 0


def test_stream_has_positions(journal: Journal) -> None:
    """J1: a stream's events come back with their global positions."""
    journal.append([Pending(stream="x", version=1, data=remembered("x"))])
    journal.append([Pending(stream="y", version=1, data=remembered("y"))])
    journal.append([Pending(stream="x", version=2, data=FactPurged(at=2, fact_id="x"))])
    assert [(e.position, e.version) for e in journal.stream("x")] == [(1, 1), (3, 2)]
    assert journal.stream("nope") == []


def test_closed_journal_refuses_use(journal: Journal) -> None:
    """A closed journal says so instead of failing obscurely."""
    journal.close()
    with pytest.raises(JournalClosed):
        journal.position()


def test_corrupt_row_names_its_position(sqlite_url: str) -> None:
    """J5: an undecodable event fails loudly with its position, never skipped."""
    config = parse_url(sqlite_url)
    j = Journal(config, Codec(MEMORY_EVENTS))
    j.append([Pending(stream="a", version=1, data=remembered("a"))])
    j.append([Pending(stream="b", version=1, data=remembered("b"))])
    j.close()
    assert config.path is not None
    with sqlite3.connect(config.path) as conn:
        conn.execute("UPDATE stored_events SET state = x'c1c1' WHERE originator_id = 'b'")
    j = Journal(config, Codec(MEMORY_EVENTS))
    try:
        with pytest.raises(CorruptEvent, match="position 2") as info:
            list(j.read())
        assert info.value.position == 2
    finally:
        j.close()


def test_unknown_topic_names_its_position(sqlite_url: str) -> None:
    """J5: a topic this release does not know is an error with the position."""
    config = parse_url(sqlite_url)
    j = Journal(config, Codec(MEMORY_EVENTS))
    j.append([Pending(stream="a", version=1, data=remembered("a"))])
    j.close()
    assert config.path is not None
    with sqlite3.connect(config.path) as conn:
        conn.execute("UPDATE stored_events SET topic = 'memory.from-the-future@1'")
    j = Journal(config, Codec(MEMORY_EVENTS))
    try:
        with pytest.raises(CorruptEvent, match="position 1"):
            list(j.read())
    finally:
        j.close()


# -- URLs (J4) -------------------------------------------------------------------------------------


def test_sqlite_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """J4: sqlite:///relative is under the working directory; sqlite:////abs is absolute."""
    monkeypatch.chdir(tmp_path)
    assert parse_url("sqlite:///j.sqlite").path == str(tmp_path / "j.sqlite")
    assert parse_url(f"sqlite:///{tmp_path}/x.sqlite").path == str(tmp_path / "x.sqlite")
    assert parse_url("sqlite:///j.sqlite?durability=full").durability == "full"
    assert default_url(tmp_path) == f"sqlite:///{tmp_path / '.journaled' / 'journal.sqlite'}"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("", "empty"),
        ("mysql://x", "unknown scheme"),
        ("sqlite://host/x.sqlite", "has a host"),
        ("sqlite:///", "names no database file"),
        ("sqlite:///:memory:", "memory://"),
        ("sqlite:///x.sqlite?durability=sometimes", "durability"),
        ("sqlite:///x.sqlite?pool=3", "unknown parameter"),
        ("memory://?x=1", "unknown parameter"),
    ],
)
def test_malformed_urls_are_clear_errors(url: str, words: str) -> None:
    """J4: a malformed journal URL raises an error naming what is wrong."""
    with pytest.raises(JournalUrlError, match=words):
        parse_url(url)


@pytest.mark.parametrize(
    ("tail", "words"),
    [
        ("my#1.sqlite", "holds a '#'"),
        ("j.sqlite#", "holds a '#'"),
        ("j.sqlite?durability=full&durability=normal", "gives durability more than once"),
        ("j.sqlite?durability=full&durability=full", "gives durability more than once"),
    ],
    ids=["hash-in-file-name", "empty-fragment", "durability-twice", "same-durability-twice"],
)
def test_a_sqlite_url_never_silently_opens_another_file_or_setting(
    tmp_path: Path, tail: str, words: str
) -> None:
    """J4, ADR 0004 (update 2026-12-08): `sqlite:////dir/my#1.sqlite` opened `/dir/my` (the rest
    read as a fragment and dropped), and a parameter given twice silently kept the last; both
    are refused by name, and nothing is created."""
    with pytest.raises(JournalUrlError, match=words):
        parse_url(f"sqlite:///{tmp_path}/{tail}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("form", ["sqlite:{}", "sqlite:{}?durability=full"])
def test_a_sqlite_url_with_one_slash_is_not_moved_under_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    """J4, ADR 0004 (update 2026-12-08): `sqlite:/abs/j.sqlite` was read as the relative path
    `abs/j.sqlite` under the working directory; it is refused, naming both spellings."""
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "data" / "j.sqlite"
    with pytest.raises(JournalUrlError) as raised:
        parse_url(form.format(target))
    assert f"sqlite:///{target}" in str(raised.value)  # sqlite://// + the absolute path
    assert f"sqlite:///{str(target).lstrip('/')}" in str(raised.value)  # the relative form
    with pytest.raises(JournalUrlError, match="three slashes"):
        parse_url("sqlite:j.sqlite")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://me:hunter#2secret@db/x",
        "postgresql://me:hunter2secret@db/x#frag",
        "postgres://db/x?password=hunter2secret#more",
    ],
)
def test_a_hash_in_a_postgresql_url_is_refused_without_showing_the_password(url: str) -> None:
    """J4, ADR 0004 (update 2026-12-08): a '#' ends a URL, so a password holding one was cut
    short (and the rest read as a host or dropped); it is refused, saying to write %23, and
    no part of the password is shown."""
    with pytest.raises(JournalUrlError, match="%23") as raised:
        parse_url(url)
    for part in ("hunter", "2secret", "more"):
        assert part not in str(raised.value)


def test_a_postgresql_parameter_given_twice_is_refused() -> None:
    """J4, ADR 0004 (update 2026-12-08): `?pool_size=2&pool_size=3` silently kept the last."""
    with pytest.raises(JournalUrlError, match="gives pool_size more than once"):
        parse_url("postgresql://me@db/x?pool_size=2&pool_size=3")


def test_password_is_masked_in_errors() -> None:
    """J4: a URL's password never appears in an error message."""
    with pytest.raises(JournalUrlError) as info:
        parse_url("mysql://me:hunter2@db/x")
    assert "hunter2" not in str(info.value)


def test_stray_environment_cannot_redirect_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """J4: eventsourcing settings in os.environ are ignored; only the URL decides."""
    decoy = tmp_path / "decoy.sqlite"
    monkeypatch.setenv("PERSISTENCE_MODULE", "eventsourcing.popo")
    monkeypatch.setenv("SQLITE_DBNAME", str(decoy))
    monkeypatch.setenv("JOURNALED_SQLITE_DBNAME", str(decoy))
    real = tmp_path / "real.sqlite"
    j = Journal(parse_url(f"sqlite:///{real}"), Codec(MEMORY_EVENTS))
    j.append([Pending(stream="a", version=1, data=remembered("a"))])
    j.close()
    assert real.exists()
    assert not decoy.exists()


def test_reading_a_missing_journal_creates_nothing(tmp_path: Path) -> None:
    """J4: opening for reading only does not create an empty journal."""
    path = tmp_path / "nothing.sqlite"
    with pytest.raises(JournalUrlError, match="no journal"):
        Journal(parse_url(f"sqlite:///{path}"), Codec(MEMORY_EVENTS), create=False)
    assert not path.exists()


FOREIGN = {
    "own-stored-events": [
        "CREATE TABLE stored_events (id INTEGER PRIMARY KEY, body TEXT)",
        "INSERT INTO stored_events (body) VALUES ('precious')",
    ],
    "other-tables": [
        "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)",
        "INSERT INTO customers (name) VALUES ('ada')",
    ],
}


@pytest.mark.parametrize("schema", list(FOREIGN.values()), ids=list(FOREIGN))
def test_another_applications_database_is_refused_and_left_as_it_was(
    tmp_path: Path, schema: list[str]
) -> None:
    """J4, J5 (ADR 0004): a URL naming another application's SQLite database (its own
    stored_events table, or tables of its own and no journal) is refused naming the path and
    what it holds; the file is left byte for byte as it was: no table, no column added."""
    path = tmp_path / "other_app.sqlite"
    with sqlite3.connect(path) as conn:
        for statement in schema:
            conn.execute(statement)
    conn.close()
    before = path.read_bytes()
    for create in (True, False):
        with pytest.raises(JournalUnreadable) as raised:
            Journal(parse_url(f"sqlite:///{path}"), Codec(MEMORY_EVENTS), create=create)
        assert str(path) in str(raised.value)
        assert "another application's database" in str(raised.value)
        assert "stored_events has the columns id, body" in str(raised.value) or (
            "tables customers" in str(raised.value)
        )
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other_app.sqlite"]


def test_an_empty_sqlite_file_becomes_a_journal(tmp_path: Path) -> None:
    """J4 (ADR 0004): a SQLite file holding no table (created empty) is made a journal."""
    path = tmp_path / "empty.sqlite"
    sqlite3.connect(path).close()
    j = Journal(parse_url(f"sqlite:///{path}"), Codec(MEMORY_EVENTS))
    j.append([Pending(stream="a", version=1, data=remembered("a"))])
    assert j.position() == 1
    j.close()


def test_sqlite_file_is_wal_with_chosen_durability(tmp_path: Path) -> None:
    """J4: file journals use WAL; durability=full sets synchronous=FULL on its connections."""
    for durability, level in (("normal", 1), ("full", 2)):
        path = tmp_path / f"{durability}.sqlite"
        j = Journal(parse_url(f"sqlite:///{path}?durability={durability}"), Codec(MEMORY_EVENTS))
        j.append([Pending(stream="a", version=1, data=remembered("a"))])
        with j._recorder.datastore.transaction(commit=False) as c:  # type: ignore[union-attr]
            c.execute("PRAGMA synchronous")
            assert c.fetchone()[0] == level
            c.execute("PRAGMA secure_delete")
            assert c.fetchone()[0] == 1
        j.close()
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            assert {"stored_events", PAYLOAD_TABLE} <= tables
    assert os.path.exists(tmp_path / "normal.sqlite")


def test_read_can_filter_by_topic(journal: Journal) -> None:
    """J1: reading only some topics keeps their global order and positions."""
    journal.append([Pending(stream="a", version=1, data=remembered("a"))])
    journal.append([Pending(stream="a", version=2, data=FactPurged(at=2, fact_id="a"))])
    journal.append([Pending(stream="b", version=1, data=remembered("b"))])
    topic = "memory.fact-remembered@1"
    assert [(e.position, e.stream) for e in journal.read(topics=[topic])] == [(1, "a"), (3, "b")]
    assert [e.position for e in journal.read(after=1, topics=[topic], page=1)] == [3]


def test_read_can_leave_out_topic_prefixes(journal: Journal) -> None:
    """J1: topics starting with a left-out prefix are skipped by the database, order kept."""
    journal.append([Pending(stream="a", version=1, data=remembered("a"))])
    journal.append([Pending(stream="a", version=2, data=FactPurged(at=2, fact_id="a"))])
    journal.append([Pending(stream="b", version=1, data=remembered("b"))])
    kept = journal.read(skip_prefixes=["memory.fact-p"])
    assert [(e.position, e.stream) for e in kept] == [(1, "a"), (3, "b")]
    kept = journal.read(after=1, skip_prefixes=["memory.fact-p", "run."], page=1)
    assert [e.position for e in kept] == [3]
    assert list(journal.read(skip_prefixes=["memory."])) == []


@pytest.mark.parametrize("with_payload", [False, True])
def test_an_append_guarded_by_topics_is_refused_once_one_of_them_landed(
    journal: Journal, with_payload: bool
) -> None:
    """R2 (ADR 0078): `append(refuse_after=(position, topics))` stores nothing, payload
    included, when an event of those topics was appended after `position`; events of other
    topics, or ones up to `position`, let it through."""
    journal.append([Pending(stream="a", version=1, data=remembered("a"))])
    seen = journal.position()
    journal.append([Pending(stream="a", version=2, data=FactPurged(at=2, fact_id="a"))])
    payloads = {"b": b"the text of b"} if with_payload else None
    purged = ("memory.fact-purged@",)
    with pytest.raises(AppendRefused, match="fact-purged"):
        journal.append(
            [Pending(stream="b", version=1, data=remembered("b"))],
            payloads=payloads,
            refuse_after=(seen, purged),
        )
    assert journal.position() == seen + 1
    assert journal.stream("b") == []
    assert journal.payloads(["b"]) == {}
    journal.append(
        [Pending(stream="b", version=1, data=remembered("b"))],
        payloads=payloads,
        refuse_after=(seen + 1, purged),
    )
    journal.append(
        [Pending(stream="c", version=1, data=remembered("c"))],
        refuse_after=(seen, ("memory.fact-deleted@",)),
    )
    assert [e.stream for e in journal.read(after=seen + 1)] == ["b", "c"]
    assert journal.payloads(["b"]) == ({"b": b"the text of b"} if with_payload else {})


@pytest.mark.parametrize(
    ("guard", "named"),
    [
        ((-1, ("run.purged@",)), "position"),
        ((True, ("run.purged@",)), "position"),
        ((0, "run.purged@"), "prefixes"),
        ((0, ()), "prefixes"),
        ((0, ("",)), "prefixes"),
        ((0, (7,)), "prefixes"),
    ],
)
def test_a_malformed_append_guard_is_refused_naming_it(
    journal: Journal, guard: tuple[object, object], named: str
) -> None:
    """J5/R2 (ADR 0078): a guard that is no (position, topic prefixes) is refused with a
    ValueError naming its part, and nothing is appended."""
    with pytest.raises(ValueError, match=f"refuse_after's .*{named}"):
        journal.append(
            [Pending(stream="a", version=1, data=remembered("a"))],
            refuse_after=guard,  # type: ignore[arg-type]
        )
    assert journal.position() == 0
