"""Values SPEC writes as tuples unpack and compare as those tuples, and the names section 5
gives are the types returned (M8, O1, F2, O7; ADR 0099)."""

from __future__ import annotations

import operator

import journaled
from journaled import Plan, Step


def test_a_deletion_is_the_pair_m8_returns(rt: journaled.Runtime) -> None:
    """M8: delete returns (primary: bool, relationships: int): it unpacks and equals that pair,
    and keeps its names (section 5)."""
    lone = rt.memory.remember("the office closes at six")
    primary, relationships = rt.memory.delete(lone.id)
    assert (primary, relationships) == (True, 0)
    old = rt.memory.remember("the deploy day is Tuesday", conflict_key="deploy-day")
    rt.memory.remember("the deploy day is Thursday", conflict_key="deploy-day")
    deletion = rt.memory.delete(old.id)  # the newer fact no longer lists it: one relationship
    assert deletion == (True, 1)
    assert (deletion.primary, deletion.relationships) == tuple(deletion)
    assert rt.memory.delete("fact_nope") == (False, 0)
    assert rt.memory.delete("fact_nope") == journaled.Deletion(primary=False, relationships=0)
    assert {rt.memory.delete("fact_nope")} == {(False, 0)}  # hashes as the pair
    missing = rt.memory.delete("fact_nope")
    pair = (False, 0)
    assert operator.ne(missing, pair) is False  # != is the negation of ==, both ways
    assert operator.ne(pair, missing) is False
    assert missing != (True, 0)
    assert missing != journaled.Deletion(primary=True, relationships=0)
    assert (missing[0], missing[1], len(missing)) == (False, 0, 2)


def test_lineage_entries_are_run_source_and_position_triples(rt: journaled.Runtime) -> None:
    """F2: lineage lists (run_id, forked_from, at) from the root to the run."""
    rt.register_tool("t", lambda x: x)
    root = rt.execute(Plan(goal="g", steps=[Step("a", tool="t", input=1)])).run_id
    fork = rt.runs.fork(root)
    lineage = rt.runs.lineage(fork)
    (first_id, first_from, first_at), (run_id, forked_from, at) = lineage
    assert (first_id, first_from, first_at) == (root, None, None)
    assert (run_id, forked_from) == (fork, root)
    assert lineage == [(root, None, None), (fork, root, at)]
    assert lineage[1].at == at is not None


def test_an_outcomes_budget_is_the_four_numbers_o1_names(rt: journaled.Runtime) -> None:
    """O1: budget = (est_calls, max_calls, completed_steps, total_steps)."""
    rt.register_skill("s", lambda x: x)
    outcome = rt.orchestrate(
        "g", lambda goal, obs, clar: Plan(goal=goal, steps=[Step("a", skill="s")]), call_budget=0
    )
    assert outcome.status == "waiting_for_budget"
    assert outcome.budget is not None
    est_calls, max_calls, completed_steps, total_steps = outcome.budget
    assert outcome.budget == (1, 0, 0, 1) == (est_calls, max_calls, completed_steps, total_steps)


def test_runs_at_returns_a_run_state(rt: journaled.Runtime) -> None:
    """Section 5, O7: rt.runs.at(run_id, position) -> RunState (.plan .observations
    .calls_used .waiting)."""
    rt.register_tool("t", lambda x: x)
    run = rt.execute(Plan(goal="g", steps=[Step("a", tool="t", input=1)]))
    state = rt.runs.at(run.run_id, rt.journal.position())
    assert isinstance(state, journaled.RunState)
    assert (state.plan, state.observations, state.calls_used, state.waiting) == (
        run.plan,
        run.observations,
        0,
        [],
    )
