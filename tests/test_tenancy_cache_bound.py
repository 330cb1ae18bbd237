"""A runtime keeps the owners of the runs it last used only (R1, ADR 0074, ADR 0093): over any
number of runs its cache stays within its bound, and a run left out of it is still unknown to
another organization, or to none, and its own organization's to read."""

from __future__ import annotations

import pytest

import journaled
from journaled import Plan, RunNotFound, Step
from journaled.events import tenancy
from journaled.events.tenancy import RUN_OWNERS_KEPT
from journaled.testing import ManualClock

KEPT = 4
"""The bound these tests set, so that a few dozen runs overflow it."""
RUNS = 12


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1_767_225_600_000)


@pytest.fixture
def small_bound(monkeypatch: pytest.MonkeyPatch) -> int:
    """Make every boundary opened from here on keep the owners of ``KEPT`` runs."""
    monkeypatch.setattr(tenancy, "RUN_OWNERS_KEPT", KEPT)
    return KEPT


def _acme_runs(url: str, clock: ManualClock, count: int) -> list[str]:
    with journaled.open(url, organization="acme", clock=clock) as acme:
        acme.register_tool("echo", lambda text, ctx: text)
        ids = []
        for n in range(count):
            done = acme.execute(Plan(goal=f"acme {n}", steps=[Step("e", tool="echo", input="x")]))
            assert done.ok, done.observations
            ids.append(done.run_id)
        return ids


def _kept(rt: journaled.Runtime) -> list[int]:
    """Return how many runs' owners each of the runtime's run boundaries keeps."""
    assert rt.runs.boundary is not None
    return [len(rt.runs.boundary._runs), len(rt.journal._boundary._runs)]


def test_the_default_bound_holds_over_more_runs_than_it(sqlite_url: str) -> None:
    """A boundary keeps at most RUN_OWNERS_KEPT runs' owners, however many it learns (R1)."""
    with journaled.open(sqlite_url, organization="acme") as rt:
        boundary = rt.runs.boundary
        assert boundary is not None
        for n in range(RUN_OWNERS_KEPT + 100):
            boundary.note_run(f"run_{n:010d}", "acme")
            assert len(boundary._runs) <= RUN_OWNERS_KEPT
        assert len(boundary._runs) == RUN_OWNERS_KEPT
        assert boundary.run_elsewhere("run_0000000000") is False  # left out, and no run: unknown


@pytest.mark.parametrize("other", ["other", None])
def test_the_run_owner_cache_never_exceeds_its_bound(
    sqlite_url: str, clock: ManualClock, small_bound: int, other: str | None
) -> None:
    """Over three times more runs than it keeps, no boundary of either runtime keeps more (R1)."""
    runs = _acme_runs(sqlite_url, clock, RUNS)
    with journaled.open(sqlite_url, organization=other, clock=clock) as stranger:
        for run_id in runs:
            with pytest.raises(RunNotFound):
                stranger.runs.history(run_id)
            assert max(_kept(stranger)) <= small_bound
        assert not [e for e in stranger.journal.read() if e.stream in runs]
        assert max(_kept(stranger)) <= small_bound
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        for run_id in runs:
            assert acme.runs.history(run_id)
            assert max(_kept(acme)) <= small_bound
        assert {e.stream for e in acme.journal.read()} >= set(runs)
        assert max(_kept(acme)) <= small_bound


@pytest.mark.parametrize("other", ["other", None])
def test_a_run_left_out_of_the_cache_is_still_refused_elsewhere_and_read_at_home(
    sqlite_url: str, clock: ManualClock, small_bound: int, other: str | None
) -> None:
    """A run whose owner the cache let go is read from the journal again: still unknown to
    another organization, or to none, and still acme's own (R1, ADR 0074)."""
    first, *rest = _acme_runs(sqlite_url, clock, RUNS)
    with journaled.open(sqlite_url, organization=other, clock=clock) as stranger:
        boundary = stranger.runs.boundary
        assert boundary is not None
        with pytest.raises(RunNotFound) as before:
            stranger.runs.history(first)
        assert first in boundary._runs
        for run_id in rest:
            with pytest.raises(RunNotFound):
                stranger.runs.state(run_id)
        assert first not in boundary._runs
        with pytest.raises(RunNotFound) as after:
            stranger.runs.history(first)
        assert str(after.value) == str(before.value)
        with pytest.raises(RunNotFound):
            stranger.runs.fork(first)
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        boundary = acme.runs.boundary
        assert boundary is not None
        assert acme.runs.history(first)
        assert first in boundary._runs
        for run_id in rest:
            assert acme.runs.state(run_id).started is not None
        assert first not in boundary._runs
        assert acme.runs.history(first)[0].stream == first
        assert acme.runs.fork(first) not in {first, *rest}
