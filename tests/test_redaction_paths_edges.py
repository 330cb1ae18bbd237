"""Secrets on the paths into the journal that bypassed redaction, and inputs that made the
journal unreadable (M9, E1, E3, E9, O1, F1; ADR 0018, 0069): forks, agent codes, ids, the keys
of limits, fact scopes and step ids, planner gaps, error messages cut before they were redacted,
and a plan id or a gap that is not text.

Each test failed before its fix. Fake secrets are assembled at run time."""

from __future__ import annotations

import base64
import binascii
import contextlib
from typing import Any

import msgspec
import pytest
from test_redaction_attack import _json, _stored

import journaled
from journaled import AgentResult, Gap, Gaps, NeedsInput, Observation, Plan, Step
from journaled.events.errors import PlanRejected
from journaled.events.redact import redact
from journaled.testing import ManualClock


def _github(tag: str) -> str:
    """Return a fake GitHub token (``ghp_`` and 36 letters and digits) marked by ``tag``."""
    return "ghp_" + (tag + "R4nd0mT0k3n" * 4)[:36]


GITHUB = _github("Edg3s")
AWS_KEY = "AKIA" + "Q7ZT3XW9" + "EDGE4EFG"
PASSWORD = "Hunt3r-" + "Zq8" * 3


def _everywhere(rt: journaled.Runtime, url: str) -> bytes:
    """Return what the journal shows (every event as JSON) and what its backend stores."""
    return _json(rt.journal.read()).encode() + b"\x00" + _stored(url)


def test_a_forks_replacement_inputs_and_answers_are_redacted(
    sqlite_url: str, clock: ManualClock
) -> None:
    """M9, F1, ADR 0018: ``run.forked`` is redacted before it is appended, like every run event
    staged by a recorder. It was appended as given: a replacement step's input and an answer
    given with the fork were in the journal file, and the resumed step received them verbatim."""
    seen: list[Any] = []

    def asker(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        if ctx.answer is None:
            raise NeedsInput("which key?")
        seen.append(ctx.answer)
        return AgentResult(output="ok", calls_used=0)

    with journaled.open(sqlite_url, clock=clock) as rt:

        def echo(data: Any) -> str:
            seen.append(data)
            return "done"

        rt.register_tool("echo", echo)
        rt.register_agent("asker", asker)
        first = rt.execute(
            Plan(goal="g", steps=[Step("a", tool="echo", input="x"), Step("q", agent="asker")])
        )
        assert first.waiting == ["q"]
        fork = rt.runs.fork(
            first.run_id,
            replace={"a": Step("a", tool="echo", input={"note": f"use {GITHUB}"})},
            answers={"q": f"password={PASSWORD}"},
        )
        resumed = rt.resume(fork)
        assert isinstance(resumed, journaled.ExecuteResult)
        assert resumed.ok
        stored = _everywhere(rt, sqlite_url)
    assert GITHUB.encode() not in stored
    assert PASSWORD.encode() not in stored
    assert GITHUB not in _json(seen)


def test_an_agents_unknown_code_fails_the_step_and_the_journal_stays_readable(
    sqlite_url: str, clock: ManualClock
) -> None:
    """M9, E9, E11: an ``AgentResult.code`` outside ``ObservationCode`` fails the step
    (``agent-failed``, the code quoted redacted). It was journaled as given: a token in it was
    stored, and the next ``journaled.open`` raised CorruptEvent on that event for good."""

    def agent(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        return AgentResult(ok=False, code=f"upstream-{GITHUB}", error="refused", calls_used=0)  # type: ignore[arg-type]

    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_agent("agent", agent)
        result = rt.execute(Plan(goal="g", steps=[Step("a", agent="agent")]))
        [obs] = result.observations
        assert obs.code == "agent-failed"
        assert "the agent's code must be None or one of" in (obs.error or "")
        assert GITHUB not in _json(result)
        assert GITHUB.encode() not in _everywhere(rt, sqlite_url)
    with journaled.open(sqlite_url, clock=clock) as rt:
        assert rt.runs.at(result.run_id, rt.journal.position()).observations


@pytest.mark.parametrize("where", ["step id", "plan id"])
def test_a_plan_whose_step_or_plan_id_holds_a_token_is_refused(
    sqlite_url: str, clock: ManualClock, where: str
) -> None:
    """M9, E1: a plan whose step id or plan id holds a secret is refused, without quoting it.
    Ids are journaled as given and never redacted; such a plan used to be stored with the token."""
    step_id = f"push-with-{GITHUB}" if where == "step id" else "a"
    plan_id = f"plan-{GITHUB}" if where == "plan id" else ""
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("echo", lambda data: data)
        refusal = ""
        try:
            rt.execute(Plan(goal="g", steps=[Step(step_id, tool="echo")], id=plan_id))
        except PlanRejected as refused:
            refusal = str(refused)
        assert GITHUB not in refusal
        stored = _everywhere(rt, sqlite_url)
    assert GITHUB.encode() not in stored


@pytest.mark.parametrize("table", ["per_tool", "per_skill", "per_agent"])
def test_limits_keyed_by_a_token_are_refused(
    sqlite_url: str, clock: ManualClock, table: str
) -> None:
    """M9, E3, ADR 0069: a key of ``Limits`` that holds a secret is refused, naming the table
    and the key's place without quoting it. Keys are names, stored inline in ``run.started`` and
    kept by a run's purge; one holding a token was journaled as given."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("echo", lambda data: data)
        plan = Plan(goal="g", steps=[Step("a", tool="echo", input=1)])
        limits = journaled.Limits(**{table: {"echo": 1, f"deploy-{GITHUB}": 1}})
        with pytest.raises(ValueError, match=rf"limits\.{table} key #1 holds a secret") as refused:
            rt.execute(plan, limits=limits)
        assert GITHUB not in str(refused.value)
        assert rt.runs.ids() == []
        stored = _everywhere(rt, sqlite_url)
    assert GITHUB.encode() not in stored


@pytest.mark.parametrize("field", ["scope", "step_id"])
def test_a_fact_whose_scope_or_step_id_holds_a_token_is_refused(
    sqlite_url: str, clock: ManualClock, field: str
) -> None:
    """M9, M2, P1: a fact whose scope or provenance ``step_id`` holds a secret is refused, as a
    domain or conflict key is (names are never redacted); both used to be stored verbatim."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("echo", lambda data: data)
        run_id = rt.execute(Plan(goal="g", steps=[Step("a", tool="echo")])).run_id
        fields: dict[str, Any] = (
            {"scope": f"user:{GITHUB}"}
            if field == "scope"
            else {"run_id": run_id, "step_id": f"a-{GITHUB}"}
        )
        refusal = ""
        try:
            rt.memory.remember("deploys go through staging", **fields)
        except journaled.InvalidFact as refused:
            refusal = str(refused)
        assert GITHUB not in refusal
        stored = _everywhere(rt, sqlite_url)
    assert GITHUB.encode() not in stored


def _gaps(kind: str, name: str) -> Any:
    def planner(
        goal: str, observations: list[Observation], clarifications: list[tuple[str, str]]
    ) -> object:
        return Gaps([Gap(kind=kind, name=name, reason="not registered")])

    return planner


def test_a_planner_gaps_kind_is_redacted(sqlite_url: str, clock: ManualClock) -> None:
    """M9, O1: a planner's ``Gap.kind`` is redacted with its name and reason; it was stored and
    returned in ``Outcome.gaps`` as given."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        outcome = rt.orchestrate("deploy", _gaps(f"vault access with {GITHUB}", "vault"))
        assert outcome.status == "failed"
        assert GITHUB not in _json(outcome)
        assert GITHUB.encode() not in _everywhere(rt, sqlite_url)


def test_a_multi_line_gap_name_is_quoted_redacted(sqlite_url: str, clock: ManualClock) -> None:
    """M9, O1: the planning failure quotes each gap's redacted name. It quoted the raw name with
    ``repr``, which turns a line break into ``\\n``, so ``password: ...`` no longer began a line
    and the password was stored in the reason and the summary."""
    name = f"db settings\npassword: {PASSWORD}"
    assert PASSWORD not in redact(name)  # the name alone is redacted
    with journaled.open(sqlite_url, clock=clock) as rt:
        outcome = rt.orchestrate("deploy", _gaps("tool", name))
        assert outcome.status == "failed"
        assert PASSWORD not in outcome.summary
        assert PASSWORD.encode() not in _everywhere(rt, sqlite_url)


@pytest.mark.parametrize("secret", [GITHUB, AWS_KEY], ids=["github", "aws"])
def test_an_error_cut_at_its_bound_inside_a_token_keeps_nothing_of_it(
    sqlite_url: str, clock: ManualClock, secret: str
) -> None:
    """M9, ADR 0018: a failing step's message longer than 4096 characters is redacted before it
    is cut. It was cut first: when the cut fell inside a token, what was left was too short for
    its rule (``ghp_`` needs 20 characters after it, ``AKIA`` 16) and the token's head was
    stored."""
    keep = 19 if secret is GITHUB else 17  # characters of the token before the cut

    def fail(data: Any) -> Any:
        raise RuntimeError("x " * ((4096 - keep) // 2) + secret + " rejected")

    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("fail", fail)
        result = rt.execute(Plan(goal="g", steps=[Step("a", tool="fail")]))
        error = result.observations[0].error or ""
        stored = _everywhere(rt, sqlite_url)
    assert len(error) <= 4097
    assert secret[:keep] not in error
    assert secret[:keep].encode() not in stored


@pytest.mark.parametrize("bad", [5, 2.5, b"plan"], ids=["int", "float", "bytes"])
def test_a_plan_id_that_is_not_text_is_refused_and_the_journal_stays_readable(
    sqlite_url: str, bad: object
) -> None:
    """E1, J (bad input loses nothing): a plan id must be text (empty or None: one is
    assigned). ``Plan(id=5)`` used to run, and its ``run.started`` made every later
    ``journaled.open`` of the journal raise CorruptEvent."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("echo", lambda data: data)
        before = rt.execute(Plan(goal="g", steps=[Step("a", tool="echo")])).run_id
        with pytest.raises(PlanRejected, match="the plan's id must be a string"):
            rt.execute(Plan(goal="g", steps=[Step("a", tool="echo")], id=bad))  # type: ignore[arg-type]
        assigned = rt.execute(Plan(goal="g", steps=[Step("a", tool="echo")], id=None))  # type: ignore[arg-type]
        assert assigned.ok
        assert assigned.plan.id
    with journaled.open(sqlite_url) as rt:
        assert {before, assigned.run_id} <= set(rt.runs.ids())


def test_a_gap_whose_fields_are_not_text_fails_the_planning_and_the_journal_stays_readable(
    sqlite_url: str,
) -> None:
    """O1, J: a planner's ``Gap`` whose kind, name or reason is not text fails the planning,
    saying which. It used to be journaled in ``orchestration.planning-failed``, and every
    later open raised CorruptEvent."""
    with journaled.open(sqlite_url) as rt:
        outcome = rt.orchestrate(
            "deploy",
            lambda g, o, c: Gaps([Gap(kind=5, name="vault", reason="x")]),  # type: ignore[arg-type]
        )
        assert outcome.status == "failed"
        assert "gap #0 kind must be a string, got int" in outcome.summary
    with journaled.open(sqlite_url) as rt:
        assert [s.status for s in rt.runs.list()] == ["failed"]


def _b64_decoded(value: Any) -> list[bytes]:
    """Return every string in ``value`` that is valid base64, decoded."""
    found: list[bytes] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, str):
            with contextlib.suppress(binascii.Error, ValueError):
                found.append(base64.b64decode(item, validate=True))
    return found


def test_bytes_returned_by_a_tool_are_stored_as_base64_of_their_redacted_text(
    sqlite_url: str, clock: ManualClock
) -> None:
    """M9, ADR 0069: bytes in a step's output are stored as base64 (as before), of their
    redacted text when they decode as UTF-8. They were stored as base64 of the raw bytes,
    which no rule reads: the token decoded straight back. Bytes with no secret, and bytes
    that are not UTF-8, are stored exactly as before."""
    binary = bytes(range(256))

    def dump(data: Any) -> Any:
        return {
            "stdout": f"export GITHUB_TOKEN={GITHUB}\n".encode(),
            "raw": (GITHUB.encode(),),
            "plain": b"hello",
            "binary": binary,
        }

    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("dump", dump)
        result = rt.execute(Plan(goal="g", steps=[Step("a", tool="dump")]))
        stored = _everywhere(rt, sqlite_url)
        outputs = [msgspec.to_builtins(e.data) for e in rt.runs.history(result.run_id)]
    output = result.observations[0].output
    assert base64.b64decode(output["stdout"]) == b"export GITHUB_TOKEN=[REDACTED]\n"
    assert output["plain"] == base64.b64encode(b"hello").decode()
    assert output["binary"] == base64.b64encode(binary).decode()
    assert GITHUB.encode() not in b"\x00".join(_b64_decoded(outputs))
    assert GITHUB.encode() not in stored
