"""Shared fixtures: journal backends, a manual clock, and a guard against leaked actors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pykka
import pytest

import journaled
from journaled.testing import ManualClock

BACKENDS = ["memory", "sqlite"]


@pytest.fixture(autouse=True)
def no_leaked_actors() -> Iterator[None]:
    """Fail a test that leaves actors running (they would keep the interpreter alive)."""
    yield
    leaked = pykka.ActorRegistry.get_all()
    if leaked:
        futures = [ref.stop(block=False) for ref in leaked]
        for future in futures:
            future.get(timeout=10)
        pytest.fail(
            f"test leaked {len(leaked)} actor(s): {[r.actor_class.__name__ for r in leaked]}"
        )


@pytest.fixture(params=BACKENDS)
def journal_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Yield a fresh journal URL for every backend of the contract suite."""
    if request.param == "memory":
        return "memory://"
    return f"sqlite:///{tmp_path / 'journal.sqlite'}"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """Return the URL of a fresh SQLite journal file."""
    return f"sqlite:///{tmp_path / 'journal.sqlite'}"


@pytest.fixture
def clock() -> ManualClock:
    """Return a manual clock that steps 1 ms per reading."""
    return ManualClock(start=1_700_000_000_000, step=1)


@pytest.fixture
def rt(journal_url: str, clock: ManualClock) -> Iterator[journaled.Runtime]:
    """Yield an open runtime on each backend, closed after the test."""
    with journaled.open(journal_url, clock=clock) as runtime:
        yield runtime
