"""Named subscriptions are their organization's own (R1, A3, ADR 0077): another organization's
runtime neither lists acme's names and positions nor moves, resets or drops them, and a name it
gives is a subscription of its own, which starts where it says."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from typing import Any

import pytest
from click.testing import CliRunner

import journaled
from journaled.cli import main
from journaled.subscriptions import StoredSubscription, Subscription

DURABLE = pytest.mark.parametrize("durable_url", ["sqlite", "postgresql"], indirect=True)
WAIT = 20.0


def _take(sub: Subscription, count: int) -> list[int]:
    """Return the positions of the next ``count`` events, failing if they do not come."""
    positions = []
    for _ in range(count):
        event = sub.poll(timeout=WAIT)
        assert event is not None, "the subscription delivered nothing"
        positions.append(event.position)
    return positions


def _acme_billing(url: str) -> tuple[int, int]:
    """Leave acme's 'billing' acknowledged at its second event of three; return (acked, head)."""
    with journaled.open(url, organization="acme") as acme:
        for text in ("invoice 1 sent", "invoice 2 sent", "invoice 3 sent"):
            acme.memory.remember(text)
        with acme.journal.subscribe(name="billing") as sub:
            acked = _take(sub, 2)[1]
            sub.ack(acked)
        return acked, acme.journal.position()


@DURABLE
def test_another_organization_neither_lists_nor_moves_nor_drops_acmes_subscription(
    durable_url: str,
) -> None:
    """R1/A3 (ADR 0077): to `other` and to a runtime of no organization acme's 'billing' is
    unknown: not listed, not dropped by unsubscribe, and their own 'billing' starts at their
    `after`; acking theirs to the head leaves acme's where acme acknowledged it."""
    acked, head = _acme_billing(durable_url)
    for organization in ("other", None):
        with journaled.open(durable_url, organization=organization) as rt:
            assert rt.journal.subscriptions() == []
            assert rt.journal.unsubscribe("billing") is False
            with rt.journal.subscribe(name="billing") as sub:
                assert sub.position == 0, "it started at acme's acknowledged position"
                rt.memory.remember(f"{organization}'s own fact")
                last = _take(sub, 1)[-1]
                sub.ack(last)
            assert rt.journal.subscriptions() == [StoredSubscription(name="billing", position=last)]
    with journaled.open(durable_url, organization="acme") as acme:
        assert acme.journal.subscriptions() == [StoredSubscription(name="billing", position=acked)]
        with acme.journal.subscribe(name="billing") as sub:
            assert sub.position == acked
            assert _take(sub, 1) == [head]
        assert acme.journal.unsubscribe("billing") is True
    with journaled.open(durable_url, organization="other") as other:
        # Dropping acme's name dropped nothing of other's.
        assert [s.name for s in other.journal.subscriptions()] == ["billing"]


def test_names_of_an_organization_never_meet_those_of_a_longer_one(sqlite_url: str) -> None:
    """R1 (ADR 0077): the stored key of organization 'a' and name 'b' differs from every key of
    organization 'a\\x1fb' (organization texts may hold the separator; names may not)."""
    with journaled.open(sqlite_url, organization="a") as a:
        a.memory.remember("a fact")
        with a.journal.subscribe(name="b"):
            pass
        with a.journal.subscribe(name="c", after=1):
            pass
    with journaled.open(sqlite_url, organization="a\x1fb") as ab:
        assert ab.journal.subscriptions() == []
        with ab.journal.subscribe(name="c"):
            pass
        assert ab.journal.subscriptions() == [StoredSubscription(name="c", position=0)]
    with journaled.open(sqlite_url, organization="a") as a:
        assert a.journal.subscriptions() == [
            StoredSubscription(name="b", position=0),
            StoredSubscription(name="c", position=1),
        ]


def test_a_name_stored_by_an_earlier_release_stays_the_runtime_without_organization(
    sqlite_url: str,
) -> None:
    """A3 (ADR 0077): a bare name in the table, as every earlier release stored it, is still the
    name of a runtime without organization (it resumes there), and no organization's."""
    with journaled.open(sqlite_url) as rt:
        for text in ("one", "two"):
            rt.memory.remember(text)
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS journaled_subscriptions "
            "(name TEXT PRIMARY KEY, position INTEGER NOT NULL) WITHOUT ROWID"
        )
        db.execute("INSERT INTO journaled_subscriptions VALUES ('mailer', 1)")
    with journaled.open(sqlite_url) as rt:
        assert rt.journal.subscriptions() == [StoredSubscription(name="mailer", position=1)]
        with rt.journal.subscribe(name="mailer") as sub:
            assert sub.position == 1
    with journaled.open(sqlite_url, organization="acme") as acme:
        assert acme.journal.subscriptions() == []
        with acme.journal.subscribe(name="mailer") as sub:
            assert sub.position == 0


def test_the_command_line_lists_the_names_of_its_organization(sqlite_url: str) -> None:
    """R1/A3 (ADR 0077): `journal subscriptions` lists acme's names with
    JOURNALED_ORGANIZATION=acme only, and `journal tail --follow --name` of another
    organization resumes from its own position, not acme's."""
    acked, _ = _acme_billing(sqlite_url)

    def cli(organization: str | None, *args: str) -> list[Any]:
        env = {"JOURNALED_ORGANIZATION": organization or ""}
        out = CliRunner().invoke(main, ["--url", sqlite_url, *args, "--json"], env=env)
        assert out.exit_code == 0, out.output
        return [json.loads(line) for line in out.output.splitlines() if line.strip()]

    assert cli("acme", "journal", "subscriptions") == [[{"name": "billing", "position": acked}]]
    assert cli("other", "journal", "subscriptions") == [[]]
    assert cli(None, "journal", "subscriptions") == [[]]
    # other's consumer of that name reads acme's journal from the start (nothing of acme's
    # facts is delivered to it, R1) and stores its own position.
    cli("other", "journal", "tail", "--follow", "--name", "billing", "--max-seconds", "0.5")
    (listed,) = cli("other", "journal", "subscriptions")
    assert [row["name"] for row in listed] == ["billing"]
    assert cli("acme", "journal", "subscriptions") == [[{"name": "billing", "position": acked}]]


def test_the_asyncio_runtime_keeps_names_per_organization(sqlite_url: str) -> None:
    """R1/A3 (ADR 0077): `journaled.aio` lists and drops only its organization's names."""
    acked, _ = _acme_billing(sqlite_url)

    async def other() -> None:
        async with journaled.aio.open(sqlite_url, organization="other") as rt:
            assert await rt.journal.subscriptions() == []
            assert await rt.journal.unsubscribe("billing") is False
            sub = await rt.journal.subscribe(name="billing")
            assert sub.position == 0
            await sub.aclose()

    async def acme() -> None:
        async with journaled.aio.open(sqlite_url, organization="acme") as rt:
            assert await rt.journal.subscriptions() == [
                StoredSubscription(name="billing", position=acked)
            ]

    asyncio.run(other())
    asyncio.run(acme())
