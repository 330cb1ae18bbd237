"""Attack probes on the memory side of the tenant boundary (R1, ADR 0017): a runtime of another
organization (``other``), or of none, shares acme's SQLite file or PostgreSQL database and tries
the doors ``test_tenant_boundary.py`` and ``test_run_tenancy_attack.py`` do not: remember's
provenance and conflict keys, a delete's cascade through acme's facts, the audit of a shared fact
acme's fact superseded, the vector cache beside the journal, ``ctx.memory`` of its own steps, the
MCP tools, the protocol door, the AutoGen memory, the command line and memory snapshots."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_run_tenancy_attack import Box

import journaled
from journaled import Deletion, InvalidFact, Plan, Step
from journaled.cli import main
from journaled.embedders.cache import digest
from journaled.events.gateway_messages import (
    DeleteFact,
    FactHistory,
    FactWhy,
    GetFact,
    PurgeFact,
    SearchFacts,
    SearchSemantic,
)
from journaled.events.memory import FactRelinked, FactSuperseded
from journaled.mcp_tools import TOOLS, ToolError
from journaled.mcp_tools import answer as mcp_answer
from journaled.testing import KeywordEmbedder, ManualClock

ORGS = ["other", None]
WAIT = 10.0
SECRET = "acme will acquire globex in march"
SOURCE = "s3://acme-private/board-minutes"
KEY = "acme-merger-target"
NEVER_RUN = "run_000000000000_000000000000"
NEVER_FACT = "mem_0000000000_0000000000000000"
WORDS = ["acme", "globex", "initech", "acquire", "march", "launch", "may", "june", "rule"]
EXPIRY_OFFSET = 987_654_321
"""How long after the clock's start acme's superseding fact expires: a value no other field has."""


class NamedEmbedder(KeywordEmbedder):
    """A keyword embedder naming its model, so its vectors are kept beside a SQLite journal."""

    model = "keywords-tenancy-v1"


@dataclass(frozen=True)
class Superseded:
    """A shared fact acme's organization-scope fact superseded by conflict key."""

    shared: str
    private: str
    expires: int


def _acme_supersedes_a_shared_fact(url: str, clock: ManualClock) -> Superseded:
    """Acme remembers a shared fact, then an organization fact of the same key (M3)."""
    expires = clock.now + EXPIRY_OFFSET
    with journaled.open(url, organization="acme", clock=clock) as acme:
        shared = acme.memory.remember("the launch is in may", conflict_key=KEY)
        private = acme.memory.remember(
            SECRET, scope="organization", conflict_key=KEY, source=SOURCE, valid_until=expires
        )
        assert private.supersedes == (shared.id,)
    return Superseded(shared=shared.id, private=private.id, expires=expires)


def _acme_private(url: str, clock: ManualClock, embedder: Any = None) -> str:
    with journaled.open(url, organization="acme", clock=clock, embedder=embedder) as acme:
        fact = acme.memory.remember(SECRET, scope="organization", conflict_key=KEY, source=SOURCE)
        acme.memory.remember("shared rule: deploys need a review", scope="project")
        if embedder is not None:
            assert [f.id for f in acme.memory.search_semantic("globex")] == [fact.id]
        return fact.id


def _acme_unchanged(url: str, clock: ManualClock, fact_id: str) -> None:
    with journaled.open(url, organization="acme", clock=clock) as acme:
        fact = acme.memory.get(fact_id)
        assert fact is not None
        assert fact.text == SECRET
        assert fact.superseded_by is None
        assert [f.id for f in acme.memory.search("globex")] == [fact_id]
        assert [e.kind for e in acme.memory.history(fact_id)] == ["memory.fact-remembered"]


# -- remember: provenance and conflict keys ------------------------------------------------------


@pytest.mark.parametrize("organization", ORGS)
def test_remember_naming_acmes_run_is_refused_as_for_an_unknown_run(
    durable_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/ADR 0074/P1: remember(run_id=acme's run) fails exactly as for a never-used run id."""
    with journaled.open(durable_url, organization="acme", clock=clock) as acme:
        acme.register_tool("read", lambda q, ctx: [f.text for f in ctx.memory.search(q)])
        acme.memory.remember(SECRET, scope="organization")
        run = acme.execute(Plan(goal="acme goal", steps=[Step("r", tool="read", input="globex")]))
        assert run.ok, run.observations
    with journaled.open(durable_url, organization=organization, clock=clock) as rt:
        end = rt.journal.position()
        with pytest.raises(InvalidFact) as unknown:
            rt.memory.remember("attached", run_id=NEVER_RUN, step_id="r")
        with pytest.raises(InvalidFact) as hidden:
            rt.memory.remember("attached", run_id=run.run_id, step_id="r")
        assert str(hidden.value) == str(unknown.value).replace(NEVER_RUN, run.run_id)
        assert rt.journal.position() == end


def test_acme_may_name_its_own_run_as_provenance(sqlite_url: str, clock: ManualClock) -> None:
    """P1: acme's own remember(run_id=its run) is recorded and shown by why (the control)."""
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        acme.register_tool("read", lambda q, ctx: [f.text for f in ctx.memory.search(q)])
        run = acme.execute(Plan(goal="g", steps=[Step("r", tool="read", input="x")]))
        fact = acme.memory.remember("noted later", run_id=run.run_id, step_id="r")
        assert run.run_id in acme.memory.why(fact.id)


# -- a delete's cascade through acme's facts -----------------------------------------------------


@pytest.mark.parametrize("op", ["delete", "purge"])
@pytest.mark.parametrize("organization", ORGS)
def test_another_tenants_delete_unlinks_acmes_superseder(
    durable_url: str, clock: ManualClock, organization: str | None, op: str
) -> None:
    """M8/R1: after other deletes (or purges) the shared fact, acme's superseder lists none."""
    facts = _acme_supersedes_a_shared_fact(durable_url, clock)
    with journaled.open(durable_url, organization=organization, clock=clock) as rt:
        if op == "delete":
            assert rt.memory.delete(facts.shared) == Deletion(primary=True, relationships=0)
        else:
            assert rt.memory.purge(facts.shared) is True
    with journaled.open(durable_url, organization="acme", clock=clock) as acme:
        private = acme.memory.get(facts.private)
        assert private is not None
        assert acme.memory.get(facts.shared) is None
        assert private.supersedes == ()


@pytest.mark.parametrize("op", ["delete", "purge"])
def test_acmes_own_delete_unlinks_its_superseder(
    sqlite_url: str, clock: ManualClock, op: str
) -> None:
    """M8: acme's own delete (or purge) of the shared fact strips it from its superseder."""
    facts = _acme_supersedes_a_shared_fact(sqlite_url, clock)
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        if op == "delete":
            assert acme.memory.delete(facts.shared) == Deletion(primary=True, relationships=1)
        else:
            assert acme.memory.purge(facts.shared) is True
        private = acme.memory.get(facts.private)
        assert private is not None
        assert private.supersedes == ()


@pytest.mark.parametrize("organization", ORGS)
def test_another_tenants_delete_counts_none_of_acmes_facts(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/M8: deleting the shared fact acme's fact superseded reports 0 relationships, as for a
    lone shared fact, and acme's fact stays as it was (text, key, validity)."""
    facts = _acme_supersedes_a_shared_fact(sqlite_url, clock)
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        lone = rt.memory.remember("a lone shared fact")
        assert rt.memory.delete(lone.id) == Deletion(primary=True, relationships=0)
        assert rt.memory.delete(facts.shared) == Deletion(primary=True, relationships=0)
        assert rt.memory.delete(facts.shared) == Deletion(primary=False, relationships=0)
        assert rt.memory.get(facts.private) is None
        assert rt.memory.purge(facts.private) is False
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        private = acme.memory.get(facts.private)
        assert private is not None
        assert (private.text, private.conflict_key, private.valid_until) == (
            SECRET,
            KEY,
            facts.expires,
        )
        assert private.superseded_by is None


# -- the audit of a shared fact acme's fact superseded ---------------------------------------------


@pytest.mark.parametrize("organization", ORGS)
def test_a_shared_facts_audit_shows_only_the_id_of_acmes_superseder(
    durable_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/M11: other's history/why/log of the shared fact name acme's superseder by id only."""
    facts = _acme_supersedes_a_shared_fact(durable_url, clock)
    with journaled.open(durable_url, organization=organization, clock=clock) as rt:
        history = rt.memory.history(facts.shared)
        assert [e.kind for e in history] == [
            "memory.fact-remembered",
            "memory.fact-superseded",
        ]
        superseded = history[1].data
        assert isinstance(superseded, FactSuperseded)
        assert superseded.by == facts.private  # its id: accepted by ADR 0017
        shown = repr(history) + rt.memory.why(facts.shared) + repr(rt.journal.read())
        assert SECRET not in shown
        assert SOURCE not in shown
        assert str(facts.expires) not in shown
        assert "until" not in rt.memory.why(facts.shared)


@pytest.mark.parametrize("organization", ORGS)
def test_a_relink_to_acmes_fact_shows_only_its_id(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/M8: when other deletes the middle of a chain whose head is acme's fact, the shared
    fact re-linked to acme's names it by id alone in history, why and the log."""
    expires = clock.now + EXPIRY_OFFSET
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        first = acme.memory.remember("the launch is in may", conflict_key=KEY)
        middle = acme.memory.remember("the launch is in june", conflict_key=KEY)
        private = acme.memory.remember(
            SECRET, scope="organization", conflict_key=KEY, valid_until=expires
        )
        assert private.supersedes == (middle.id,)
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        assert rt.memory.delete(middle.id) == Deletion(primary=True, relationships=1)
        history = rt.memory.history(first.id)
        relinked = history[-1].data
        assert isinstance(relinked, FactRelinked)
        assert (relinked.to, relinked.to_valid_until) == (private.id, None)
        shown = repr(history) + rt.memory.why(first.id) + repr(rt.journal.read())
        assert str(expires) not in shown
        assert SECRET not in shown
    with journaled.open(sqlite_url, organization="acme", clock=clock) as acme:
        relinked = acme.memory.history(first.id)[-1].data
        assert isinstance(relinked, FactRelinked)
        assert relinked.to_valid_until == expires  # acme's own view keeps it


@pytest.mark.parametrize("organization", ORGS)
def test_a_shared_fact_superseded_by_acmes_tells_nothing_else(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/M5: the shared fact is hidden from search for everyone; its superseder is unknown to
    get, history, why, used_by, purge and as_of; nothing of acme's text or source shows."""
    facts = _acme_supersedes_a_shared_fact(sqlite_url, clock)
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        end = rt.journal.position()
        assert rt.memory.search("launch may") == []
        assert rt.memory.get(facts.private) is None
        assert rt.memory.history(facts.private) == []
        assert rt.memory.why(facts.private) == f"no fact {facts.private} in this journal"
        assert rt.memory.used_by(facts.private) == []
        view = rt.memory.as_of(position=end)
        assert view.get(facts.private) is None
        assert [f.id for f in view.all()] == [facts.shared]
        assert view.search("globex march acquire") == []
        shown = repr(rt.memory.all()) + rt.memory.why(facts.shared)
        assert SECRET not in shown
        assert SOURCE not in shown
        assert rt.journal.position() == end


# -- the vector cache beside the journal -----------------------------------------------------------


@pytest.mark.parametrize("organization", ORGS)
def test_the_vector_cache_does_not_confirm_acmes_text(
    tmp_path: Path, clock: ManualClock, organization: str | None
) -> None:
    """R1/M7: other's guess of acme's text is embedded as a guess of a text acme never stored."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    _acme_private(url, clock, NamedEmbedder(WORDS))
    embedder = NamedEmbedder(WORDS)
    wrong_guess = "acme will acquire initech in march"
    with journaled.open(url, organization=organization, clock=clock, embedder=embedder) as rt:
        guesses = [rt.memory.remember(t, scope="user") for t in (SECRET, wrong_guess)]
        assert {f.id for f in rt.memory.search_semantic("acquire")} >= {g.id for g in guesses}
    embedded = {text for call in embedder.calls for text in call}
    assert wrong_guess in embedded
    assert SECRET in embedded


def test_a_vector_cache_of_an_earlier_release_is_emptied_once(
    tmp_path: Path, clock: ManualClock
) -> None:
    """R1/M7 (ADR 0078): a cache file an earlier release wrote (user_version 0) keyed acme's
    organization fact by its text alone; it is emptied when next opened, so other's guess of
    that text is embedded, not answered from acme's vector."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    fact_id = _acme_private(url, clock, NamedEmbedder(WORDS))
    cache = str(tmp_path / "journal.sqlite.vectors")
    with sqlite3.connect(cache) as db:  # as the earlier release stored it
        (vector,) = db.execute("SELECT vector FROM vectors LIMIT 1").fetchone()
        db.execute("DELETE FROM facts")
        db.execute("DELETE FROM vectors")
        model = NamedEmbedder(WORDS).model
        db.execute("INSERT INTO vectors VALUES (?, ?, ?)", (model, digest(SECRET), vector))
        db.execute("INSERT INTO facts VALUES (?, ?, ?)", (model, fact_id, digest(SECRET)))
        db.execute("PRAGMA user_version = 0")
    embedder = NamedEmbedder(WORDS)
    with journaled.open(url, organization="other", clock=clock, embedder=embedder) as rt:
        guess = rt.memory.remember(SECRET, scope="user")
        assert guess.id in {f.id for f in rt.memory.search_semantic("acquire")}
    assert SECRET in {text for call in embedder.calls for text in call}
    with sqlite3.connect(cache) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (2,)
        linked = {row[0] for row in db.execute("SELECT fact_id FROM facts")}
    assert guess.id in linked
    assert fact_id not in linked


def test_an_owners_key_never_meets_another_owners() -> None:
    """R1 (ADR 0078): the cache key of (organization, text) is unambiguous, though both texts
    may hold the separator an earlier key put between them."""
    assert digest("secret", "acme\x1fx") != digest("x\x1fsecret", "acme")
    assert digest("secret", "acme") != digest("secret")
    assert digest("secret", "acme") != digest("secret", "other")


@pytest.mark.parametrize("organization", ORGS)
def test_semantic_and_hybrid_views_rank_none_of_acmes_facts(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/M7/M12: search_semantic, search_hybrid and search_scored, live and as_of(at=), find
    and embed none of acme's facts."""
    private = _acme_private(sqlite_url, clock, KeywordEmbedder(WORDS))
    embedder = KeywordEmbedder(WORDS)
    with journaled.open(
        sqlite_url, organization=organization, clock=clock, embedder=embedder
    ) as rt:
        mine = rt.memory.remember("globex rule of ours")
        view = rt.memory.as_of(at=clock.now)
        for found in (
            rt.memory.search_semantic("globex acquire march"),
            rt.memory.search_hybrid("globex acquire march", limit=500),
            [f for _, f in rt.memory.search_scored("globex", semantic=True)[0]],
            view.search_semantic("globex acquire"),
            view.search_hybrid("globex acquire"),
        ):
            assert private not in [f.id for f in found]
            assert SECRET not in repr(found)
        assert mine.id in [f.id for f in rt.memory.search_semantic("globex")]
    assert SECRET not in {text for call in embedder.calls for text in call}


# -- ctx.memory in a step of the other organization's run -----------------------------------------


@pytest.mark.parametrize("organization", ORGS)
def test_a_step_of_another_tenant_finds_and_supersedes_none_of_acmes_facts(
    durable_url: str, clock: ManualClock, organization: str | None
) -> None:
    """P1/R1: in other's tool and agent steps, ctx.memory.search_semantic, search_hybrid, get
    and remember(conflict_key=acme's key) touch none of acme's facts; reads record only what
    they returned."""
    private = _acme_private(durable_url, clock)
    found: list[Any] = []

    def snoop(query: str, ctx: Any) -> str:
        found.extend(f.id for f in ctx.memory.search_semantic(query))
        found.extend(f.id for f in ctx.memory.search_hybrid(query))
        found.append(ctx.memory.get(private))
        return ctx.memory.remember("our guess", conflict_key=KEY).id  # type: ignore[no-any-return]

    def agent(step: Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        assert ctx.memory is not None
        found.extend(f.id for f in ctx.memory.search("globex march"))
        note = ctx.memory.remember("agent note", scope="session", conflict_key=KEY)
        return journaled.AgentResult(output=list(note.supersedes), calls_used=0)

    embedder = KeywordEmbedder(WORDS)
    with journaled.open(
        durable_url, organization=organization, clock=clock, embedder=embedder
    ) as rt:
        rt.register_tool("snoop", snoop)
        rt.register_agent("spy", agent)
        plan = Plan(
            goal="snoop",
            steps=[
                Step("t", tool="snoop", input="globex acquire"),
                Step("a", agent="spy", depends_on=["t"]),
            ],
        )
        result = rt.execute(plan)
        assert result.ok, result.observations
        outputs = {o.step_id: o.output for o in result.observations}
        guess = rt.memory.get(str(outputs["t"]))
        assert guess is not None
        assert guess.supersedes == ()
        assert outputs["a"] == [guess.id]  # the agent's note supersedes other's own guess only
        assert None in found
        assert private not in found
        reads = [e.data for e in rt.runs.history(result.run_id) if e.kind == "run.memory-read"]
        assert private not in repr(reads)
    assert SECRET not in {text for call in embedder.calls for text in call}
    _acme_unchanged(durable_url, clock, private)


# -- the MCP tools, the protocol door, AutoGen, the command line -----------------------------------


@pytest.mark.parametrize("organization", ORGS)
def test_mcp_memory_tools_treat_acmes_fact_as_unknown(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/X2: memory_why and memory_history refuse acme's id as a never-used one; memory_search
    and memory_as_of show none of it; memory_remember with acme's key supersedes none."""
    private = _acme_private(sqlite_url, clock)
    tools = {t.name: t for t in TOOLS}
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        for name in ("memory_why", "memory_history"):
            with pytest.raises(ToolError) as hidden:
                mcp_answer(rt, tools[name], {"fact_id": private})
            with pytest.raises(ToolError) as unknown:
                mcp_answer(rt, tools[name], {"fact_id": NEVER_FACT})
            assert str(hidden.value) == str(unknown.value).replace(NEVER_FACT, private)
        end = rt.journal.position()
        shown = [
            mcp_answer(rt, tools["memory_search"], {"query": "acme globex acquire march"}),
            mcp_answer(rt, tools["memory_as_of"], {"position": end}),
            mcp_answer(rt, tools["memory_as_of"], {"position": end, "query": "globex"}),
            mcp_answer(rt, tools["memory_as_of"], {"at_time": "2100-01-01"}),
        ]
        assert private not in repr(shown)
        assert SECRET not in repr(shown)
        fact, _ = mcp_answer(
            rt, tools["memory_remember"], {"text": "our guess", "conflict_key": KEY}
        )
        assert fact.supersedes == ()  # type: ignore[attr-defined]
    _acme_unchanged(sqlite_url, clock, private)


@pytest.mark.parametrize("organization", ORGS)
def test_protocol_memory_door_answers_acmes_fact_as_an_unknown_one(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/A4: gateway.get, delete, purge, why and history of acme's id reply as for a never-used
    id; gateway.search and search-semantic return none of acme's facts."""
    private = _acme_private(sqlite_url, clock)
    with journaled.open(
        sqlite_url, organization=organization, clock=clock, embedder=KeywordEmbedder(WORDS)
    ) as rt:
        box = Box()
        rt.protocol.register("attacker/m", box)
        try:
            end = rt.journal.position()
            for request in (GetFact, DeleteFact, PurgeFact, FactWhy, FactHistory):
                replies = []
                for fact_id in (private, NEVER_FACT):
                    rt.protocol.send(
                        request(reply_to="attacker/m", correlation="c", fact_id=fact_id)
                    )
                    replies.append(repr(box.take()).replace(fact_id, "ID"))
                assert replies[0] == replies[1], request
            for search in (SearchFacts, SearchSemantic):
                rt.protocol.send(search(reply_to="attacker/m", correlation="s", query="globex"))
                reply = box.take()
                assert reply.facts == [], reply
            assert rt.journal.position() == end
        finally:
            rt.protocol.unregister("attacker/m")
    _acme_unchanged(sqlite_url, clock, private)


@pytest.mark.parametrize("organization", ["other"])
def test_autogen_memory_of_another_tenant_queries_and_clears_none_of_acmes(
    sqlite_url: str, clock: ManualClock, organization: str
) -> None:
    """R1/X1: JournaledMemory of other's organization scope queries none of acme's facts and its
    clear() deletes only other's; acme's fact stays."""
    pytest.importorskip("autogen_core")
    from journaled.integrations.autogen import JournaledMemory

    private = _acme_private(sqlite_url, clock)

    async def attack(rt: journaled.Runtime) -> list[str]:
        seen: list[str] = []
        for scope in ("organization", "project"):
            memory = JournaledMemory(rt, scope, semantic=False)
            for query in ("globex", "acme acquire march"):
                seen.extend(repr(r) for r in (await memory.query(query)).results)
            await memory.clear()
            await memory.close()
        return seen

    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        rt.memory.remember("our own globex plan", scope="organization")
        seen = asyncio.run(attack(rt))
        assert any("our own globex plan" in s for s in seen)
        assert private not in repr(seen)
        assert SECRET not in repr(seen)
        assert rt.memory.all() == []
    _acme_unchanged(sqlite_url, clock, private)


@pytest.mark.parametrize("organization", ORGS)
def test_cli_memory_search_and_as_of_show_none_of_acmes(
    sqlite_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1: `journaled memory search` (plain, --hybrid, --json) and `memory as-of` under
    JOURNALED_ORGANIZATION of another show none of acme's facts; `memory used-by` refuses its id."""
    private = _acme_private(sqlite_url, clock)
    env = {"JOURNALED_ORGANIZATION": organization or ""}
    runner = CliRunner()
    outputs = []
    for args in (
        ["memory", "search", "globex"],
        ["memory", "search", "acme globex march", "--json"],
        ["memory", "search", "--hybrid", "globex"],
        ["memory", "as-of", "--position", "3", "--json"],
        ["memory", "as-of", "globex", "--at-time", "2100-01-01", "--json"],
    ):
        result = runner.invoke(main, ["--url", sqlite_url, *args], env=env)
        assert result.exit_code == 0, result.output
        outputs.append(result.output)
    assert json.loads(outputs[1]) == []
    assert private not in "".join(outputs)
    assert SECRET not in "".join(outputs)
    assert json.loads(outputs[4])["facts"] == []
    assert [f["text"] for f in json.loads(outputs[3])["facts"]] == [
        "shared rule: deploys need a review"
    ]
    used = runner.invoke(main, ["--url", sqlite_url, "memory", "used-by", private], env=env)
    assert used.exit_code != 0
    assert f"no fact {private} in this journal" in used.output


# -- memory snapshots -----------------------------------------------------------------------------


@pytest.mark.parametrize("organization", ORGS)
def test_snapshots_of_each_tenant_serve_none_of_the_others_facts(
    durable_url: str, clock: ManualClock, organization: str | None
) -> None:
    """R1/ADR 0009: acme's snapshot, then other's, then reopens both ways: each opens to its
    own facts and the shared ones, and a delete after a restore still heals acme's fact."""
    with journaled.open(durable_url, organization="acme", clock=clock) as acme:
        private = acme.memory.remember(SECRET, scope="organization", conflict_key=KEY)
        shared = acme.memory.remember("the merger is off", conflict_key=KEY)
        assert acme.memory.checkpoint()
    with journaled.open(durable_url, organization=organization, clock=clock) as rt:
        rt.memory.remember("other's own words", scope="project")
        assert rt.memory.checkpoint()
    with journaled.open(durable_url, organization=organization, clock=clock) as rt:
        assert private.id not in [f.id for f in rt.memory.all()]
        assert rt.memory.get(private.id) is None
        assert rt.memory.search("globex") == []
        assert rt.memory.delete(shared.id) == Deletion(primary=True, relationships=0)
    with journaled.open(durable_url, organization="acme", clock=clock) as acme:
        healed = acme.memory.get(private.id)
        assert healed is not None
        assert healed.superseded_by is None
        assert [f.id for f in acme.memory.search("globex")] == [private.id]


STEP = "negotiate_globex_takeover_price"
"""A step name from acme's plan: what it plans is acme's, even where the fact it wrote is shared."""


@pytest.mark.parametrize("organization", ORGS)
def test_a_shared_facts_provenance_names_acmes_run_but_not_its_step(
    tmp_path: Path, clock: ManualClock, organization: str | None
) -> None:
    """ADR 0074 (update): a shared fact remembered by a step of acme's run names the run by id
    (an id tells nothing but a time) and no step, in ``why``, ``history`` and ``journal.read``.
    Before, the step's name, chosen in acme's plan, was printed to every organization. Acme
    still sees its own step."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, organization="acme", clock=clock) as acme:
        acme.register_tool("note", lambda q, ctx: ctx.memory.remember(f"shared note {q}").id)
        run = acme.execute(Plan(goal="acme plan", steps=[Step(STEP, tool="note", input="x")]))
        fact_id = run.observations[0].output
        assert f"by step {STEP!r} of run {run.run_id}" in acme.memory.why(fact_id)
    with journaled.open(url, organization=organization, clock=clock) as b:
        assert b.memory.get(fact_id) is not None  # the shared fact itself is everyone's
        told = b.memory.why(fact_id)
        assert STEP not in told
        assert f"by a step of run {run.run_id}" in told
        assert all(STEP not in repr(e.data) for e in b.memory.history(fact_id))
        shown = [e for e in b.journal.read() if e.stream == fact_id]
        assert shown
        assert all(getattr(e.data, "step_id", None) is None for e in shown)
    with journaled.open(url, organization="acme", clock=clock) as acme:
        assert [e.data.step_id for e in acme.memory.history(fact_id)[:1]] == [STEP]  # type: ignore[attr-defined]
