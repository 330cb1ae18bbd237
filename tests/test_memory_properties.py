"""Replay is pure: folding is deterministic and positions can be reached any way (M12, J1)."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

import journaled
from journaled.events.memory_state import MemoryState, Query, plan_terms
from journaled.testing import ManualClock

WORDS = ["api", "port", "deploy", "cache", "redis", "helm", "argo", "lint"]
KEYS = [None, "a", "b"]
SCOPES = ["project", "user", "session", "repository"]

Command = tuple[str, int, int, int, int]

commands = st.lists(
    st.tuples(
        st.sampled_from(["remember", "remember", "remember", "delete", "purge"]),
        st.integers(0, len(WORDS) - 1),
        st.integers(0, len(KEYS) - 1),
        st.integers(0, len(SCOPES) - 1),
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=25,
)


def _run(rt: journaled.Runtime, clock: ManualClock, script: list[Command]) -> None:
    ids: list[str] = []
    for op, w, k, s, extra in script:
        if op == "remember" or not ids:
            words = f"{WORDS[w]} {WORDS[(w + extra) % len(WORDS)]}"
            until = clock.now + 50 if extra == 3 else None
            fact = rt.memory.remember(
                words, conflict_key=KEYS[k], scope=SCOPES[s], valid_until=until
            )
            ids.append(fact.id)
        elif op == "delete":
            rt.memory.delete(ids[w % len(ids)])
        else:
            rt.memory.purge(ids[w % len(ids)])
        clock.advance(10 * extra)


def _fold(rt: journaled.Runtime, upto: int | None, split: int | None = None) -> MemoryState:
    state = MemoryState(["user", "project", "repository"], None)
    texts = rt._journal.payloads()
    events = rt.journal.read(upto=upto)
    cut = len(events) if split is None else split
    for event in events[:cut]:
        state.apply(event, texts)
    for event in events[cut:]:
        state.apply(event, texts)
    return state


def _snapshot(answer: Callable[[str], list[journaled.Fact]], facts: list[journaled.Fact]) -> object:
    return (
        sorted(facts, key=lambda f: f.id),
        {w: [f.id for f in answer(w)] for w in WORDS},
    )


@settings(max_examples=25, deadline=None)
@given(script=commands, data=st.data())
def test_as_of_equals_fresh_replay_up_to_position(
    script: list[Command], data: st.DataObject
) -> None:
    """M12: as_of(p) answers exactly like a fresh fold of the journal up to p (to the end of
    the append holding p)."""
    clock = ManualClock(step=1)
    with journaled.open("memory://", clock=clock) as rt:
        _run(rt, clock, script)
        end = rt.journal.position()
        p = data.draw(st.integers(0, end))
        now = clock.now
        view = rt.memory.as_of(position=p)
        # A position inside one append is taken at that append's end (J2, ADR 0064).
        assert view.position == rt._journal.commit_end(p) >= p
        fresh = _fold(rt, view.position)

        def fresh_search(w: str) -> list[journaled.Fact]:
            return fresh.search(Query(terms=plan_terms(w), now=now))

        assert _snapshot(lambda w: view.search(w, now=now), view.all()) == _snapshot(
            fresh_search, fresh.all()
        )


@settings(max_examples=25, deadline=None)
@given(script=commands, data=st.data())
def test_prefix_then_rest_equals_everything_and_live_store(
    script: list[Command], data: st.DataObject
) -> None:
    """J1/M12: folding a prefix then the rest equals folding everything, equals the live actors."""
    clock = ManualClock(step=1)
    with journaled.open("memory://", clock=clock) as rt:
        _run(rt, clock, script)
        events = rt.journal.read()
        split = data.draw(st.integers(0, len(events)))
        whole = _fold(rt, None)
        parts = _fold(rt, None, split=split)
        now = clock.now

        def search(state: MemoryState) -> Callable[[str], list[journaled.Fact]]:
            return lambda w: state.search(Query(terms=plan_terms(w), now=now))

        assert _snapshot(search(whole), whole.all()) == _snapshot(search(parts), parts.all())
        live = _snapshot(lambda w: rt.memory.search(w, now=now), rt.memory.all())
        assert live == _snapshot(search(whole), whole.all())
