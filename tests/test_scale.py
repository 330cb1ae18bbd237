"""The timeline page and the wave scheduler grow linearly with the plan (E2, O7).

Each test measures a deterministic quantity (bytes written, dependency lists read) at n and 2n and
checks its ratio, so it fails on quadratic growth whatever the machine's speed.
"""

from __future__ import annotations

from typing import Any

import journaled
from journaled import Plan, Step, timeline
from journaled.events.plan_rules import waves


class _Counted(list[str]):
    """A dependency list that counts how often it is read."""

    reads = 0

    def __iter__(self) -> Any:
        _Counted.reads += 1
        return super().__iter__()


def _reverse_chain(n: int) -> list[Step]:
    """A chain s0 <- s1 <- ... listed last step first: the worst order for layer-by-layer scans."""
    steps = [
        Step(f"s{i}", tool="t", depends_on=_Counted([f"s{i - 1}"] if i else [])) for i in range(n)
    ]
    return steps[::-1]


def _reads(n: int) -> int:
    steps = _reverse_chain(n)
    _Counted.reads = 0
    layers = waves(steps)
    assert [[s.id for s in w] for w in layers] == [[f"s{i}"] for i in range(n)]
    return _Counted.reads


def test_waves_read_each_dependency_list_a_bounded_number_of_times() -> None:
    """E2: waves() is linear: a reverse-listed chain reads dependency lists O(n) times, not n^2."""
    small, large = _reads(400), _reads(800)
    assert large / small < 2.2, (small, large)
    assert large <= 2 * 800, large


def _chain_page(n: int) -> int:
    with journaled.open("memory://") as rt:
        rt.register_tool("t", lambda data: data)
        steps = [Step(f"s{i}", tool="t", depends_on=[f"s{i - 1}"] if i else []) for i in range(n)]
        result = rt.execute(Plan(goal="chain", steps=steps))
        assert result.ok
        return len(timeline.render(rt, result.run_id).encode("utf-8"))


def test_timeline_page_bytes_per_step_stay_bounded() -> None:
    """O7: the timeline page of a chain grows linearly: size(2n) / size(n) < 2.2."""
    small, large = _chain_page(100), _chain_page(200)
    assert large / small < 2.2, (small, large)
