"""The tenant boundary: another organization's facts behave as unknown to every operation (R1).

One journal, two organizations: ``acme`` remembers facts in its organization scope; a runtime of
``other`` (or of no organization) on the same journal then tries every read, audit, command and
log view it has, as an attacker would, and ``acme`` reopens to find its facts untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from click.testing import CliRunner

import journaled
from journaled.cli import main
from journaled.events.base import Pending
from journaled.events.memory import ConflictKeyClaimed, FactRemembered
from journaled.events.memory_state import MemoryState
from journaled.events.tenancy import Boundary
from journaled.testing import ManualClock

SOURCE = "s3://acme-private/board-minutes"
DOMAIN = "acme-mergers"
KEY = "acme-merger-target"
TEXT = "acme will acquire globex in march"
OLD_TEXT = "acme will acquire initech in june"


@dataclass(frozen=True)
class Acme:
    """What acme stored: two facts of one conflict key, the newer superseding the older."""

    old: str
    new: str
    shared: str
    end: int


SHARED = pytest.mark.parametrize("journal_url", ["sqlite", "postgresql"], indirect=True)
"""Backends two runtimes can share (an in-memory journal belongs to one runtime)."""


def _acme(url: str, clock: ManualClock) -> Acme:
    with journaled.open(url, organization="acme", clock=clock) as rt:
        old = rt.memory.remember(
            OLD_TEXT, scope="organization", domain=DOMAIN, conflict_key=KEY, source=SOURCE
        )
        new = rt.memory.remember(
            TEXT, scope="organization", domain=DOMAIN, conflict_key=KEY, source=SOURCE
        )
        shared = rt.memory.remember("the office wifi is called guest", scope="project")
        assert new.supersedes == (old.id,)
        return Acme(old=old.id, new=new.id, shared=shared.id, end=rt.journal.position())


def _leaks(text: str, acme: Acme) -> list[str]:
    return [w for w in (acme.old, acme.new, SOURCE, DOMAIN, KEY, "globex", "initech") if w in text]


@SHARED
@pytest.mark.parametrize("organization", ["other", None])
def test_another_organizations_fact_is_unknown_to_every_operation(
    journal_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1: get, all, search, as_of, delete, purge, why, history and journal reads refuse acme's."""
    acme = _acme(journal_url, clock)
    with journaled.open(journal_url, organization=organization, clock=clock) as rt:
        for fact_id in (acme.old, acme.new):
            assert rt.memory.get(fact_id) is None
            assert rt.memory.purge(fact_id, reason="attack") is False
            assert rt.memory.delete(fact_id) == journaled.Deletion(primary=False, relationships=0)
            assert rt.memory.history(fact_id) == []
            assert rt.memory.why(fact_id) == f"no fact {fact_id} in this journal"
            assert rt.memory.remembered(fact_id) is None
            assert rt.memory.as_of(position=acme.end).get(fact_id) is None
        assert [f.id for f in rt.memory.all()] == [acme.shared]
        assert rt.memory.search("acme acquire globex initech") == []
        assert rt.memory.search_semantic("acme acquire globex") == []
        assert [f.id for f in rt.memory.as_of(position=acme.end).all()] == [acme.shared]
        assert rt.memory.as_of(at=clock.now + 1).search("acquire") == []
        log = rt.journal.read()
        assert _leaks(repr(log), acme) == []
        assert any(isinstance(e.data, FactRemembered) for e in log)  # the shared fact stays
        # Claiming acme's conflict key in a shared scope supersedes nothing of acme's.
        mine = rt.memory.remember("we will acquire nobody", conflict_key=KEY)
        assert mine.supersedes == ()
        after = rt.journal.position()
    with journaled.open(journal_url, organization="acme", clock=clock) as rt:
        new = rt.memory.get(acme.new)
        old = rt.memory.get(acme.old)
        assert new is not None
        assert new.text == TEXT
        assert new.superseded_by is None
        assert old is not None
        assert old.text == OLD_TEXT
        assert old.superseded_by == acme.new
        assert [f.id for f in rt.memory.search("globex")] == [acme.new]
        kinds = [e.kind for e in rt.memory.history(acme.new)]
        assert kinds == ["memory.fact-remembered"]
        assert rt.journal.position() == after


@SHARED
@pytest.mark.parametrize("organization", ["other", None])
def test_the_command_line_shows_nothing_of_another_organization(
    journal_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1: memory show/why/history fail as for an unknown id; journal tail omits acme's events."""
    acme = _acme(journal_url, clock)
    env = {"JOURNALED_ORGANIZATION": organization or ""}
    runner = CliRunner()
    for command in ("show", "why", "history"):
        result = runner.invoke(main, ["--url", journal_url, "memory", command, acme.new], env=env)
        assert result.exit_code != 0
        assert f"no fact {acme.new} in this journal" in result.output
        assert _leaks(result.output, acme) == [acme.new]  # only the id the caller typed
    for extra in ([], ["--json"], ["--after", "0"]):
        result = runner.invoke(
            main, ["--url", journal_url, "journal", "tail", "--limit", "50", *extra], env=env
        )
        assert result.exit_code == 0, result.output
        assert acme.shared in result.output
        assert _leaks(result.output, acme) == []
    mine = runner.invoke(
        main,
        ["--url", journal_url, "journal", "tail", "--limit", "50"],
        env={"JOURNALED_ORGANIZATION": "acme"},
    )
    assert acme.new in mine.output
    assert KEY in mine.output


def test_the_boundary_sorts_events_without_a_runtime(journal_url: str, clock: ManualClock) -> None:
    """R1: a journal's reader of organization `other` hides acme's events; acme's keeps them."""
    with journaled.open(journal_url, organization="acme", clock=clock) as rt:
        fact = rt.memory.remember(TEXT, scope="organization", conflict_key=KEY, source=SOURCE)
        shared = rt.memory.remember("shared words", conflict_key=KEY)
        journal = rt._journal
        log = list(journal.read())
        for organization, hidden in (("other", {fact.id}), (None, {fact.id}), ("acme", set())):
            boundary = Boundary(organization, journal.first)
            seen = boundary.visible(log)
            assert {getattr(e.data, "fact_id", None) for e in log} - {
                getattr(e.data, "fact_id", None) for e in seen
            } == hidden
            assert boundary.fact_elsewhere(fact.id) == bool(hidden)
            assert not boundary.fact_elsewhere(shared.id)
            state = MemoryState(["user", "project", "repository", "organization"], organization)
            for event in log:
                state.apply(event, journal.payloads())
            assert (state.get(fact.id) is None) == bool(hidden)


@SHARED
@pytest.mark.parametrize("organization", ["other", None])
def test_deleting_a_shared_fact_heals_another_organizations_fact(
    journal_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/M8: a delete by another tenant still restores acme's fact it had superseded, unseen."""
    with journaled.open(journal_url, organization="acme", clock=clock) as rt:
        private = rt.memory.remember(TEXT, scope="organization", conflict_key=KEY)
        shared = rt.memory.remember("the merger is off", scope="project", conflict_key=KEY)
        assert shared.supersedes == (private.id,)
    with journaled.open(journal_url, organization=organization, clock=clock) as rt:
        assert rt.memory.delete(shared.id) == journaled.Deletion(primary=True, relationships=0)
        assert rt.memory.history(private.id) == []
    with journaled.open(journal_url, organization="acme", clock=clock) as rt:
        healed = rt.memory.get(private.id)
        assert healed is not None
        assert healed.superseded_by is None
        assert [f.id for f in rt.memory.search("globex")] == [private.id]
        assert rt.memory.checkpoint()
    with journaled.open(journal_url, organization="acme", clock=clock) as rt:
        assert [f.id for f in rt.memory.search("globex")] == [private.id]


@SHARED
@pytest.mark.parametrize("organization", ["other", None])
def test_a_delete_relinks_to_another_organizations_superseder(
    journal_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/M8: the chain heals through acme's fact that another tenant cannot see (A <- X <- B)."""
    with journaled.open(journal_url, organization="acme", clock=clock) as rt:
        oldest = rt.memory.remember("the launch is in may", conflict_key=KEY)
        middle = rt.memory.remember("the launch is in june", conflict_key=KEY)
        private = rt.memory.remember(TEXT, scope="organization", conflict_key=KEY)
        assert middle.supersedes == (oldest.id,)
        assert private.supersedes == (middle.id,)
    with journaled.open(journal_url, organization=organization, clock=clock) as rt:
        assert rt.memory.delete(middle.id) == journaled.Deletion(primary=True, relationships=1)
    with journaled.open(journal_url, organization="acme", clock=clock) as rt:
        relinked = rt.memory.get(oldest.id)
        heir = rt.memory.get(private.id)
        assert relinked is not None
        assert relinked.superseded_by == private.id
        assert heir is not None
        assert heir.supersedes == (oldest.id,)
        assert [f.id for f in rt.memory.search("launch globex")] == [private.id]


@pytest.mark.parametrize("organization", ["other", None])
def test_a_fact_another_process_stored_for_acme_is_unknown_on_every_backend(
    journal_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1: acme's fact appended beside this runtime is unknown to every operation, any backend."""
    with journaled.open(journal_url, organization=organization, clock=clock) as rt:
        fact_id = "mem_acme_0001"
        remembered = FactRemembered(
            at=clock.now,
            fact_id=fact_id,
            scope="organization",
            organization="acme",
            domain=DOMAIN,
            conflict_key=KEY,
            source=SOURCE,
        )
        claim = ConflictKeyClaimed(at=clock.now, conflict_key=KEY, fact_id=fact_id)
        rt._journal.append(
            [
                Pending(stream=fact_id, version=1, data=remembered),
                Pending(stream=f"key:{KEY}", version=1, data=claim),
            ],
            payloads={fact_id: TEXT.encode()},
        )
        rt._actors.catch_up()  # what following another process does
        end = rt.journal.position()
        assert rt.memory.purge(fact_id) is False
        assert rt.memory.delete(fact_id) == journaled.Deletion(primary=False, relationships=0)
        assert rt.memory.get(fact_id) is None
        assert rt.memory.all() == []
        assert rt.memory.search("globex") == []
        assert rt.memory.history(fact_id) == []
        assert rt.memory.why(fact_id) == f"no fact {fact_id} in this journal"
        assert rt.memory.as_of(position=end).all() == []
        assert rt.journal.read() == []
        assert rt.memory.remember("shared words", conflict_key=KEY).supersedes == ()
        assert rt._journal.payloads([fact_id]) == {fact_id: TEXT.encode()}  # nothing erased
        assert [e.kind for e in rt._journal.stream(fact_id)] == ["memory.fact-remembered"]
