"""Memory's doors against facts another runtime wrote, odd times and odd arguments.

M5, M8, M10, M11, M12, R1, R2: a delete or a purge acts on a fact this runtime has not folded
yet; a view at a time keeps no text purged while it folded; ``why`` renders every time a
fact may carry; arguments SQLite and PostgreSQL would treat apart are refused alike.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence

import pytest

import journaled
from journaled.errors import ConfigurationError, InvalidArgument
from journaled.testing import ManualClock

SECRET = "the launch code is swordfish"


def _stored_texts(url: str) -> list[bytes]:
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        return [bytes(row[0]) for row in conn.execute("SELECT payload FROM journaled_payloads")]


@pytest.mark.parametrize("follow", [0.2, None], ids=["following", "not following"])
def test_a_purge_reaches_a_fact_another_runtime_just_remembered(
    sqlite_url: str, follow: float | None
) -> None:
    """M10, R2: a runtime that has not folded a fact yet (it follows late, or not at all)
    purges it when asked, instead of calling it unknown and leaving the text stored."""
    with journaled.open(sqlite_url, clock=ManualClock(step=1), follow=follow) as late:
        with journaled.open(sqlite_url, clock=ManualClock(step=1)) as writer:
            fact = writer.memory.remember(SECRET)
        assert late.memory.purge(fact.id) is True
        assert late.memory.get(fact.id) is None
    assert not any(b"swordfish" in text for text in _stored_texts(sqlite_url))


def test_a_delete_reaches_a_fact_another_runtime_just_remembered(sqlite_url: str) -> None:
    """M8: delete of a fact another runtime remembered after this one's position deletes it."""
    with journaled.open(sqlite_url, clock=ManualClock(step=1), follow=None) as late:
        with journaled.open(sqlite_url, clock=ManualClock(step=1)) as writer:
            fact = writer.memory.remember("a fact")
        assert late.memory.delete(fact.id).primary is True
        assert late.memory.get(fact.id) is None


def test_an_unknown_id_stays_unknown_and_appends_nothing(sqlite_url: str) -> None:
    """M8, M10: an id with no stream in the journal is unknown, as before: nothing appended."""
    with journaled.open(sqlite_url, clock=ManualClock(step=1), follow=None) as rt:
        rt.memory.remember("kept")
        before = rt.journal.position()
        assert rt.memory.purge("mem_0123456789ab_000000000000") is False
        assert rt.memory.delete("mem_0123456789ab_000000000000").primary is False
        assert rt.journal.position() == before


def test_a_view_at_a_time_keeps_no_text_purged_while_it_folded(sqlite_url: str) -> None:
    """R2, M12, ADR 0034: as a view at a position does, a view at a time folds again when a
    purge committed while it folded, so it holds no text erased before it returned."""
    with journaled.open(sqlite_url, clock=ManualClock(start=1_000_000, step=1)) as rt:
        secret = rt.memory.remember("topsecret zebra")
        rt.memory.remember("plain zebra")
        journal = rt.memory._journal
        read: Callable[[Sequence[str] | None], dict[str, bytes]] = journal.payloads
        purged: list[bool] = []

        def payloads(ids: Sequence[str] | None = None) -> dict[str, bytes]:
            found = read(ids)
            if not purged and ids is not None and secret.id in ids:
                purged.append(rt.memory.purge(secret.id))  # commits after the texts were read
            return found

        journal.payloads = payloads  # type: ignore[method-assign,assignment]
        view = rt.memory.as_of(at=2_000_000)
        assert purged == [True]
        shown = view.get(secret.id)
        assert shown is None or "topsecret" not in shown.text
        assert all("topsecret" not in f.text for f in view.search("zebra"))


@pytest.mark.parametrize("until", [2**63 - 1, 0], ids=["never expires", "epoch zero"])
def test_why_renders_every_expiry_a_superseder_may_carry(sqlite_url: str, until: int) -> None:
    """M11: why() of a fact superseded by one valid until 2**63 - 1 ("never expires", past the
    calendar) or until 0 tells its story, with the expiry, instead of raising or leaving it out."""
    with journaled.open(sqlite_url, clock=ManualClock(start=1_000, step=1)) as rt:
        old = rt.memory.remember("setting old", conflict_key="s")
        new = rt.memory.remember("setting new", conflict_key="s", valid_until=until)
        why = rt.memory.why(old.id)
        assert new.id in why
        assert "until" in why


def test_search_refuses_a_bool_min_confidence(sqlite_url: str) -> None:
    """M6, ADR 0023: min_confidence=True is refused by name, as every numeric argument refuses
    a bool; it filtered as 1.0."""
    with journaled.open(sqlite_url, clock=ManualClock(step=1)) as rt:
        rt.memory.remember("alpha", confidence=0.5)
        with pytest.raises(InvalidArgument, match="min_confidence"):
            rt.memory.search("alpha", min_confidence=True)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_an_organization_holding_nul_is_refused_on_every_backend(
    backend: str, sqlite_url: str, request: pytest.FixtureRequest
) -> None:
    """R1, ADR 0074: PostgreSQL's text holds no NUL, and memory's snapshot key holds the
    organization: such a name is refused at open on every backend, naming it."""
    url = sqlite_url if backend == "sqlite" else str(request.getfixturevalue("pg_url"))
    with pytest.raises(ConfigurationError, match="organization holds a NUL"):
        journaled.open(url, organization="a\x00b")
