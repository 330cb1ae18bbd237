"""Attacks on ADR 0091 (M6, M12): a remember is indexed by the next search, not as it is stored.

The oracle for search answers is a fold from the journal's start that indexes as it goes
(``eager_view`` in ``in_place``; ``searches`` in ``deferred`` asks the same 30 searches of both).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deferred import scope_states, searches
from in_place import eager_view, writer_of

import journaled
from journaled.actors.memory import MemoryWriter
from journaled.testing import ManualClock


def test_a_burst_of_folds_does_not_put_off_automatic_snapshots_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A memory only written to snapshots itself (ADR 0091) even when more remembers than the
    snapshot is due for were folded at once (another process's, caught up in one batch): they
    are no cold open's backlog, and each later remember must not put the snapshot off again."""
    monkeypatch.setattr(MemoryWriter, "auto_snapshot_events", 20)
    url = f"sqlite:///{tmp_path / 'j.sqlite'}"
    with (
        journaled.open(url, clock=ManualClock(1_000_000), follow=None) as here,
        journaled.open(url, clock=ManualClock(2_000_000), follow=None) as other,
    ):
        for i in range(30):
            other.memory.remember(f"alpha other {i}")
        here._actors.catch_up()  # 30 remembers folded in one batch: more than the 20 due
        writer = writer_of(here)
        for i in range(200):
            here.memory.remember(f"alpha here {i}")
        here._actors.catch_up()
        assert writer._snapshot_position > 0, (
            f"no automatic snapshot after {writer._since_snapshot} folds, "
            f"{sum(s.pending_count for s in scope_states(here))} facts pending"
        )
        assert writer._since_snapshot < writer._auto_snapshot_due()
        assert searches(here.memory) == searches(eager_view(here))
