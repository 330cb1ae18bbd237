"""P3 judges expiry as M5 does: a fact is visible while valid_until >= now (ADR 0033)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import journaled
from journaled import Plan, Step
from journaled.testing import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1_700_000_000_000, step=0)


@pytest.fixture
def srt(sqlite_url: str, clock: ManualClock) -> Iterator[journaled.Runtime]:
    with journaled.open(sqlite_url, clock=clock) as runtime:
        runtime.register_tool("read", lambda q, ctx: [f.id for f in ctx.memory.search(q)])
        yield runtime


def _plan() -> Plan:
    return Plan(goal="g", steps=[Step("a", tool="read", input="office hours")])


def test_a_fact_still_valid_at_its_valid_until_is_not_stale(
    srt: journaled.Runtime, clock: ManualClock
) -> None:
    """M5 excludes a fact only when valid_until < now: at now == valid_until search still finds
    it, so P3 must not call the read 'expired' yet (refresh would re-read the same fact)."""
    until = clock.now + 1000
    fact = srt.memory.remember("office hours nine to five", valid_until=until)
    run = srt.execute(_plan())
    assert run.ok
    clock.set(until)  # still valid per M5
    assert [f.id for f in srt.memory.search("office hours")] == [fact.id]
    assert srt.runs.stale(run.run_id) == []


def test_a_fact_read_at_its_valid_until_that_then_expires_is_stale(
    srt: journaled.Runtime, clock: ManualClock
) -> None:
    """A read at now == valid_until still returns the fact (M5); one ms later it has expired,
    after the read: P3 must report it 'expired'."""
    until = clock.now + 1000
    fact = srt.memory.remember("office hours nine to five", valid_until=until)
    clock.set(until)
    run = srt.execute(_plan())
    assert run.observations[0].output == [fact.id]
    clock.advance(1)
    assert srt.memory.search("office hours") == []
    assert [(s.fact_id, s.change) for s in srt.runs.stale(run.run_id)] == [(fact.id, "expired")]
