"""Memory behaviour, SPEC M1-M12, through ``rt.memory`` on every journal backend."""

from __future__ import annotations

import math

import pytest
from aio_facade import FLAVOURS

import journaled
from journaled.testing import KeywordEmbedder, ManualClock, ScriptedEmbedder

# -- M1 scopes -------------------------------------------------------------------------------------


@pytest.fixture(params=FLAVOURS)
def flavour(request: pytest.FixtureRequest) -> str:
    """Run the runtime fixture's tests on the sync and the asyncio runtime (A1)."""
    param: str = request.param
    return param


def test_default_scope_is_project(rt: journaled.Runtime) -> None:
    """M1: a fact without a scope is stored in `project`."""
    fact = rt.memory.remember("the build uses hatchling")
    assert fact.scope == "project"
    assert fact.physical == "project"


def test_logical_scope_kept_but_stored_in_project(rt: journaled.Runtime) -> None:
    """M1: `session` is stored physically in project but keeps its logical name."""
    fact = rt.memory.remember("the user is debugging a flaky test", scope="session")
    stored = rt.memory.get(fact.id)
    assert stored is not None
    assert stored.scope == "session"
    assert stored.physical == "project"
    assert [f.id for f in rt.memory.search("flaky", scopes=["session"])] == [fact.id]
    assert rt.memory.search("flaky", scopes=["project"]) == []


def test_user_and_repository_map_to_themselves(rt: journaled.Runtime) -> None:
    """M1: user and repository scopes are physical scopes of their own."""
    user = rt.memory.remember("prefers tabs", scope="user")
    repo = rt.memory.remember("main branch is protected", scope="repository")
    assert (user.physical, repo.physical) == ("user", "repository")


def test_organization_without_configuration_is_rejected(rt: journaled.Runtime) -> None:
    """M1: organization without configuration names the setting; nothing is written."""
    before = rt.journal.position()
    with pytest.raises(journaled.OrganizationNotConfigured, match=r'organization="acme"'):
        rt.memory.remember("all repos use MIT", scope="organization")
    assert rt.journal.position() == before


def test_organization_scope_when_configured(journal_url: str, clock: ManualClock) -> None:
    """M1: with an organization configured, facts go to the organization scope and are read back."""
    with journaled.open(journal_url, organization="acme", clock=clock) as rt:
        fact = rt.memory.remember("all repos use the MIT license", scope="organization")
        assert fact.physical == "organization"
        assert [f.id for f in rt.memory.search("license")] == [fact.id]


def test_organization_facts_not_traversed_without_configuration(
    sqlite_url: str, clock: ManualClock
) -> None:
    """M1: reads traverse organization only when it is configured (and only that organization's)."""
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        fact = rt.memory.remember("all repos use the MIT license", scope="organization")
    with journaled.open(sqlite_url, clock=clock) as rt:
        assert rt.memory.get(fact.id) is None
        assert rt.memory.search("license") == []
    with journaled.open(sqlite_url, organization="globex", clock=clock) as rt:
        assert rt.memory.get(fact.id) is None
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        assert rt.memory.get(fact.id) == fact


def test_org_conflicts_cascade_only_when_configured(sqlite_url: str, clock: ManualClock) -> None:
    """M1/M3: supersession traverses organization only when configured."""
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        org = rt.memory.remember("deploys on Fridays", scope="organization", conflict_key="deploy")
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.memory.remember("never deploy on Fridays", conflict_key="deploy")
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        stored = rt.memory.get(org.id)
        assert stored is not None
        assert stored.superseded_by is None


# -- M2 remember -----------------------------------------------------------------------------------


def test_remember_returns_stored_record(rt: journaled.Runtime, clock: ManualClock) -> None:
    """M2: remember stamps created_at from the clock and returns what get returns."""
    t = clock.now
    fact = rt.memory.remember(
        "CI runs on two cores",
        domain="ci",
        confidence=0.8,
        source="docs/ci.md",
        valid_from=t - 10,
        valid_until=t + 10_000,
    )
    assert fact.created_at == t
    assert rt.memory.get(fact.id) == fact
    assert (fact.domain, fact.confidence, fact.source) == ("ci", 0.8, "docs/ci.md")


def test_ids_are_unique(rt: journaled.Runtime) -> None:
    """M2: ids never collide, even within one millisecond."""
    frozen = ManualClock(start=5, step=0)
    rt.memory._writer.proxy().clock = frozen
    ids = {rt.memory.remember(f"fact {i}").id for i in range(200)}
    assert len(ids) == 200


@pytest.mark.parametrize(("given", "stored"), [(1.7, 1.0), (-3, 0.0), (0.25, 0.25), (None, 1.0)])
def test_confidence_is_clamped(rt: journaled.Runtime, given: float | None, stored: float) -> None:
    """M2: confidence is clamped into [0, 1], default 1.0."""
    assert rt.memory.remember("x marks the spot", confidence=given).confidence == stored


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"text": ""}, "text"),
        ({"text": "   "}, "text"),
        ({"text": 42}, "text"),
        ({"text": "ok", "confidence": math.nan}, "confidence"),
        ({"text": "ok", "confidence": "high"}, "confidence"),
        ({"text": "ok", "valid_from": 10, "valid_until": 5}, "valid_until"),
        ({"text": "ok", "valid_from": "soon"}, "valid_from"),
        ({"text": "ok", "scope": ""}, "scope"),
        ({"text": "ok", "domain": 3}, "domain"),
    ],
)
def test_bad_input_is_rejected_and_nothing_is_written(
    rt: journaled.Runtime, kwargs: dict[str, object], field: str
) -> None:
    """M2: bad input raises an error naming the field, and the journal is unchanged."""
    before = rt.journal.position()
    with pytest.raises(journaled.InvalidFact) as info:
        rt.memory.remember(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert field in str(info.value)
    assert isinstance(info.value, ValueError)
    assert rt.journal.position() == before


# -- M3 supersede ----------------------------------------------------------------------------------


def test_conflict_key_supersedes_with_cause(rt: journaled.Runtime) -> None:
    """M3: a new fact supersedes facts with its key; one event per superseded fact, with cause."""
    a = rt.memory.remember("api on 8080", conflict_key="api-port")
    b = rt.memory.remember("api on 8081", conflict_key="api-port", scope="user")
    c = rt.memory.remember("api on 9090", conflict_key="api-port")
    assert c.supersedes == (b.id,)
    assert b.supersedes == (a.id,)
    stored_a, stored_b = rt.memory.get(a.id), rt.memory.get(b.id)
    assert stored_a is not None
    assert stored_b is not None
    assert stored_a.superseded_by == b.id
    assert stored_b.superseded_by == c.id
    superseded = [e for e in rt.memory.history(b.id) if e.kind == "memory.fact-superseded"]
    assert len(superseded) == 1
    data = superseded[0].data
    assert (data.by, data.conflict_key, data.at) == (c.id, "api-port", c.created_at)  # type: ignore[attr-defined]


def test_supersession_is_one_atomic_append(rt: journaled.Runtime) -> None:
    """M3/J2: the remember and its supersessions land at consecutive positions of one append."""
    a = rt.memory.remember("api on 8080", conflict_key="api-port")
    before = rt.journal.position()
    b = rt.memory.remember("api on 9090", conflict_key="api-port")
    events = rt.journal.read(after=before)
    kinds = [e.kind for e in events]
    assert kinds == [
        "memory.fact-remembered",
        "memory.fact-superseded",
        "memory.conflict-key-claimed",
    ]
    assert [e.stream for e in events] == [b.id, a.id, "key:api-port"]


def test_fact_superseded_by_expired_fact_is_superseded_again(
    rt: journaled.Runtime, clock: ManualClock
) -> None:
    """M3/M5: a fact whose superseder expired is active, so the next keyed fact supersedes it."""
    now = clock.now
    a = rt.memory.remember("api on 8080", conflict_key="api-port")
    b = rt.memory.remember("api on 9090 (temporary)", conflict_key="api-port", valid_until=now + 50)
    clock.advance(100)
    c = rt.memory.remember("api on 7070", conflict_key="api-port")
    assert set(c.supersedes) == {a.id, b.id}


def test_no_key_no_supersession(rt: journaled.Runtime) -> None:
    """M3: facts without a conflict key never supersede anything."""
    rt.memory.remember("api on 8080")
    b = rt.memory.remember("api on 9090")
    assert b.supersedes == ()
    assert len(rt.memory.search("api")) == 2


# -- M4 get / all ----------------------------------------------------------------------------------


def test_get_unknown_is_none_and_all_includes_superseded(
    rt: journaled.Runtime, clock: ManualClock
) -> None:
    """M4: get of an unknown id is None; all() includes superseded and expired facts."""
    assert rt.memory.get("mem_nope") is None
    a = rt.memory.remember("old", conflict_key="k")
    b = rt.memory.remember("new", conflict_key="k")
    c = rt.memory.remember("expired", valid_until=clock.now - 1)
    d = rt.memory.remember("a user fact", scope="user")
    assert {f.id for f in rt.memory.all()} == {a.id, b.id, c.id, d.id}


# -- M5 filter -------------------------------------------------------------------------------------


def test_filter_excludes_expired_future_superseded_low_confidence(
    rt: journaled.Runtime, clock: ManualClock
) -> None:
    """M5: expired, not-yet-valid, actively superseded and low-confidence facts are filtered out."""
    now = clock.now
    ok = rt.memory.remember("deploy target is kubernetes", confidence=0.9)
    rt.memory.remember("deploy target is nomad", valid_until=now - 1)
    rt.memory.remember("deploy target is lambda", valid_from=now + 100_000)
    rt.memory.remember("deploy target is heroku", conflict_key="deploy")
    newer = rt.memory.remember("deploy target is fly", conflict_key="deploy")
    rt.memory.remember("deploy target is ec2", confidence=0.2)
    found = {f.id for f in rt.memory.search("deploy target", min_confidence=0.5)}
    assert found == {ok.id, newer.id}


def test_superseded_by_expired_fact_is_visible_again(
    rt: journaled.Runtime, clock: ManualClock
) -> None:
    """M5: a fact superseded by a fact that has since expired is visible again."""
    now = clock.now
    a = rt.memory.remember("office in Berlin", conflict_key="office")
    rt.memory.remember(
        "office in Paris for the summer", conflict_key="office", valid_until=now + 50
    )
    assert [f.id for f in rt.memory.search("office Berlin")] != [a.id]
    assert a.id not in {f.id for f in rt.memory.search("office")}
    later = now + 1_000
    assert a.id in {f.id for f in rt.memory.search("office", now=later)}


def test_scope_and_domain_filters(rt: journaled.Runtime) -> None:
    """M5: scopes filter by logical scope name; domains by domain."""
    a = rt.memory.remember("use ruff for lint", domain="python")
    b = rt.memory.remember("use eslint for lint", domain="js", scope="repository")
    c = rt.memory.remember("lint before commit", scope="user")
    assert {f.id for f in rt.memory.search("lint", domains=["python"])} == {a.id}
    assert {f.id for f in rt.memory.search("lint", scopes=["repository", "user"])} == {b.id, c.id}
    assert {f.id for f in rt.memory.search("lint", scopes=["user"], domains=["js"])} == set()


def test_now_is_injectable_per_query(rt: journaled.Runtime, clock: ManualClock) -> None:
    """M5: `now` per query decides validity windows."""
    now = clock.now
    f = rt.memory.remember("freeze window", valid_from=now + 100, valid_until=now + 200)
    assert rt.memory.search("freeze") == []
    assert [x.id for x in rt.memory.search("freeze", now=now + 150)] == [f.id]
    assert rt.memory.search("freeze", now=now + 201) == []


# -- M6 BM25 ---------------------------------------------------------------------------------------


def _bm25(query: list[str], docs: dict[str, str]) -> dict[str, float]:
    """Hand-rolled BM25 with SPEC M6's parameters, for comparison."""
    import re

    tok = {k: re.findall(r"[^\W_]+", v.lower()) for k, v in docs.items()}
    n_docs = len(docs)
    avgdl = sum(len(t) for t in tok.values()) / n_docs
    scores = {}
    for doc, terms in tok.items():
        s = 0.0
        for q in dict.fromkeys(query):
            n = sum(1 for t in tok.values() if q in t)
            if not n:
                continue
            idf = math.log(1 + (n_docs - n + 0.5) / (n + 0.5))
            tf = terms.count(q)
            s += idf * tf * 2.2 / (tf + 1.2 * (1 - 0.75 + 0.75 * len(terms) / avgdl))
        if s > 0:
            scores[doc] = s
    return scores


def test_bm25_ranking_matches_the_formula(rt: journaled.Runtime) -> None:
    """M6: ranking follows Okapi BM25 (k1=1.2, b=0.75, the pinned idf), best first."""
    texts = [
        "postgres is the primary database",
        "the cache is redis; the database is postgres postgres",
        "deploys go through the staging cluster",
        "the database migrations run at deploy time",
    ]
    facts = [rt.memory.remember(t) for t in texts]
    expected = _bm25(["database", "postgres"], {f.id: f.text for f in facts})
    ranked = rt.memory.search("Database postgres!")
    assert [f.id for f in ranked] == sorted(expected, key=lambda k: (-expected[k], k))


def test_single_fact_is_found_by_its_own_words(rt: journaled.Runtime) -> None:
    """M6: idf is always positive, so a lone fact is found."""
    fact = rt.memory.remember("Zürich office opens at 9")
    assert [f.id for f in rt.memory.search("zürich")] == [fact.id]


def test_empty_and_punctuation_queries_return_nothing(rt: journaled.Runtime) -> None:
    """M6: an empty or all-punctuation query returns []."""
    rt.memory.remember("anything at all")
    assert rt.memory.search("") == []
    assert rt.memory.search("?!... --") == []


def test_ties_broken_by_id_and_limit(rt: journaled.Runtime) -> None:
    """M6: equal scores go by id ascending; limit caps the result; zero scores are dropped."""
    ids = [rt.memory.remember("same words here").id for _ in range(5)]
    rt.memory.remember("unrelated text")
    result = rt.memory.search("same words", limit=3)
    assert [f.id for f in result] == sorted(ids)[:3]
    assert len(rt.memory.search("same", limit=10)) == 5


def test_ties_across_physical_scopes_go_by_id(rt: journaled.Runtime) -> None:
    """M6: equal scores held by different physical scopes (each its own index) are merged by
    id ascending too, whichever scope holds which."""
    scopes = ["user", "repository", "project", "session"]  # session lives in project
    ids = [rt.memory.remember("same words here", scope=scopes[i % 4]).id for i in range(12)]
    for _ in range(3):
        rt.memory.remember("unrelated text", scope="repository")
    assert [f.id for f in rt.memory.search("same words", limit=12)] == sorted(ids)
    assert [f.id for f in rt.memory.search("same words", limit=5)] == sorted(ids)[:5]


def test_bm25_stats_count_only_filtered_candidates(rt: journaled.Runtime) -> None:
    """M6: N and n are counted over the filtered candidates, so filters change scores."""
    a = rt.memory.remember("alpha beta", domain="d1")
    b = rt.memory.remember("alpha alpha gamma", domain="d1")
    for i in range(6):
        rt.memory.remember(f"beta filler {i}", domain="d2")
    ranked = rt.memory.search("alpha beta", domains=["d1"])
    expected = _bm25(["alpha", "beta"], {a.id: a.text, b.id: b.text})
    assert [f.id for f in ranked] == sorted(expected, key=lambda k: (-expected[k], k))


# -- M7 semantic -----------------------------------------------------------------------------------


def test_semantic_ranks_by_cosine_and_caches(journal_url: str, clock: ManualClock) -> None:
    """M7: with an embedder, ranking is by cosine; a stable fact is embedded once per runtime."""
    embedder = KeywordEmbedder(["cat", "dog", "fish"])
    with journaled.open(journal_url, clock=clock, embedder=embedder) as rt:
        cat = rt.memory.remember("cat cat dog")
        dog = rt.memory.remember("dog")
        rt.memory.remember("fish")
        ranked = rt.memory.search_semantic("cat")
        assert [f.id for f in ranked] == [cat.id]
        ranked = rt.memory.search_semantic("dog")
        assert [f.id for f in ranked] == [dog.id, cat.id]
        embedded = [t for call in embedder.calls for t in call]
        assert embedded.count("cat cat dog") == 1


@pytest.mark.parametrize(
    "embedder",
    [
        None,
        ScriptedEmbedder({}, fail=RuntimeError("model server down")),
        ScriptedEmbedder({"fact about ports": [1.0, 0.0]}, default=[]),
        ScriptedEmbedder({"ports": [math.nan, 1.0]}, default=[1.0, 0.0]),
        ScriptedEmbedder({"ports": [1.0, 0.0]}, default=[math.inf, 0.0]),
    ],
    ids=["no-embedder", "embedder-raises", "unusable-query", "nan-query", "no-usable-candidate"],
)
def test_semantic_falls_back_to_bm25(
    journal_url: str, clock: ManualClock, embedder: ScriptedEmbedder | None
) -> None:
    """M7: no embedder, embedder error, unusable query vector or no usable candidate -> BM25."""
    with journaled.open(journal_url, clock=clock, embedder=embedder) as rt:
        fact = rt.memory.remember("fact about ports")
        rt.memory.remember("something else entirely")
        assert [f.id for f in rt.memory.search_semantic("ports")] == [fact.id]


def test_semantic_does_not_cache_unusable_vectors(journal_url: str, clock: ManualClock) -> None:
    """M7: only usable vectors are cached, so a fact that embedded badly is embedded again."""
    embedder = ScriptedEmbedder({"q": [1.0, 0.0]}, default=[])
    with journaled.open(journal_url, clock=clock, embedder=embedder) as rt:
        rt.memory.remember("first fact")
        rt.memory.search_semantic("q")
        rt.memory.search_semantic("q")
        asked = [t for call in embedder.calls for t in call]
        assert asked.count("first fact") == 2


def test_semantic_drops_nonpositive_and_mismatched(journal_url: str, clock: ManualClock) -> None:
    """M7: cosine 0 for different lengths; hits with score <= 0 are dropped; ties by id."""
    vectors = {
        "q": [1.0, 0.0],
        "same": [2.0, 0.0],
        "twin": [3.0, 0.0],
        "opposite": [-1.0, 0.0],
        "short": [1.0],
    }
    embedder = ScriptedEmbedder(vectors)
    with journaled.open(journal_url, clock=clock, embedder=embedder) as rt:
        same = rt.memory.remember("same")
        twin = rt.memory.remember("twin")
        rt.memory.remember("opposite")
        rt.memory.remember("short")
        assert [f.id for f in rt.memory.search_semantic("q")] == sorted([same.id, twin.id])


# -- M8 delete -------------------------------------------------------------------------------------


def test_delete_unknown(rt: journaled.Runtime) -> None:
    """M8: deleting an unknown id returns (False, 0) and appends nothing."""
    before = rt.journal.position()
    assert rt.memory.delete("mem_missing") == journaled.Deletion(primary=False, relationships=0)
    assert rt.journal.position() == before


def test_delete_heals_the_chain(rt: journaled.Runtime) -> None:
    """M8: A <- X <- B, deleting X gives A <- B, and B.supersedes gains A."""
    a = rt.memory.remember("v1", conflict_key="k")
    x = rt.memory.remember("v2", conflict_key="k")
    b = rt.memory.remember("v3", conflict_key="k")
    deletion = rt.memory.delete(x.id)
    assert deletion.primary
    assert deletion.relationships == 2
    stored_a, stored_b = rt.memory.get(a.id), rt.memory.get(b.id)
    assert stored_a is not None
    assert stored_b is not None
    assert stored_a.superseded_by == b.id
    assert stored_b.supersedes == (a.id,)
    assert rt.memory.get(x.id) is None


def test_delete_restores_when_no_heir(rt: journaled.Runtime) -> None:
    """M8: deleting the head of a chain makes the fact it superseded active again."""
    a = rt.memory.remember("v1 of the api port", conflict_key="k")
    b = rt.memory.remember("v2 of the api port", conflict_key="k")
    assert rt.memory.delete(b.id) == journaled.Deletion(primary=True, relationships=1)
    stored = rt.memory.get(a.id)
    assert stored is not None
    assert stored.superseded_by is None
    assert [f.id for f in rt.memory.search("api port")] == [a.id]
    assert [e.kind for e in rt.memory.history(a.id)][-1] == "memory.fact-restored"


def test_delete_cascade_is_atomic(rt: journaled.Runtime) -> None:
    """M8/J2: the delete and its cascade are consecutive events of one append."""
    rt.memory.remember("v1", conflict_key="k")
    x = rt.memory.remember("v2", conflict_key="k")
    rt.memory.remember("v3", conflict_key="k")
    before = rt.journal.position()
    rt.memory.delete(x.id)
    kinds = [e.kind for e in rt.journal.read(after=before)]
    assert kinds == ["memory.fact-relinked", "memory.fact-unlinked", "memory.fact-deleted"]


# -- M10 purge -------------------------------------------------------------------------------------


def test_purge_erases_text_but_keeps_history(rt: journaled.Runtime) -> None:
    """M10: after purge no query, replay or view returns the text; history shows why."""
    fact = rt.memory.remember("the launch code is 0000-1111")
    position = rt.journal.position()
    assert rt.memory.purge(fact.id, reason="user asked to forget")
    assert rt.memory.get(fact.id) is None
    assert rt.memory.search("launch code") == []
    view = rt.memory.as_of(position=position)
    old = view.get(fact.id)
    assert old is not None
    assert "0000" not in old.text
    assert view.search("launch") == []
    kinds = [e.kind for e in rt.memory.history(fact.id)]
    assert kinds == ["memory.fact-remembered", "memory.fact-deleted", "memory.fact-purged"]
    assert "user asked to forget" in rt.memory.why(fact.id)
    assert not rt.memory.purge(fact.id)
    assert not rt.memory.purge("mem_unknown")


def test_purge_of_deleted_fact_still_erases(rt: journaled.Runtime) -> None:
    """M10: a deleted fact's text is still in the journal until it is purged."""
    fact = rt.memory.remember("temporary secret-ish note")
    rt.memory.delete(fact.id)
    assert rt.memory.purge(fact.id)
    assert [e.kind for e in rt.memory.history(fact.id)][-1] == "memory.fact-purged"


# -- M9 redaction ----------------------------------------------------------------------------------


def test_secrets_never_reach_the_journal(rt: journaled.Runtime) -> None:
    """M9: secrets are redacted before anything is appended; the event records their kinds."""
    key = "sk-" + "a1B2c3D4" * 5
    fact = rt.memory.remember(f"use key {key} for the eval run")
    assert key not in fact.text
    assert "[REDACTED]" in fact.text
    remembered = rt.memory.remembered(fact.id)
    assert remembered is not None
    assert remembered.redacted
    for event in rt.journal.read():
        assert key not in repr(event)


# -- M11 audit -------------------------------------------------------------------------------------


def test_why_tells_the_story(rt: journaled.Runtime) -> None:
    """M11: why() names the superseder, the key and the times, then the re-link by a delete."""
    a = rt.memory.remember("api on 8080", conflict_key="api-port", source="README")
    x = rt.memory.remember("api on 8081", conflict_key="api-port")
    b = rt.memory.remember("api on 9090", conflict_key="api-port")
    rt.memory.delete(x.id)
    why = rt.memory.why(a.id)
    assert "remembered" in why
    assert "'README'" in why
    assert "superseded at" in why
    assert x.id in why
    assert "'api-port'" in why
    assert "re-linked" in why
    assert b.id in why
    assert rt.memory.why("mem_unknown") == "no fact mem_unknown in this journal"


def test_history_is_the_fact_stream(rt: journaled.Runtime) -> None:
    """M11: history() returns the fact's events in order with positions."""
    a = rt.memory.remember("v1", conflict_key="k")
    rt.memory.remember("v2", conflict_key="k")
    history = rt.memory.history(a.id)
    assert [e.version for e in history] == [1, 2]
    assert history[0].position < history[1].position


# -- M12 time travel -------------------------------------------------------------------------------


def test_as_of_position_answers_as_then(rt: journaled.Runtime) -> None:
    """M12: a view at a position answers get/all/search exactly as the store did then."""
    rt.memory.remember("api on 8080", conflict_key="api-port")
    p1 = rt.journal.position()
    then_search = [f.id for f in rt.memory.search("api")]
    then_all = rt.memory.all()
    b = rt.memory.remember("api on 9090", conflict_key="api-port")
    view = rt.memory.as_of(position=p1)
    assert view.all() == then_all
    assert [f.id for f in view.search("api")] == then_search
    assert view.get(b.id) is None
    now_view = rt.memory.as_of(position=rt.journal.position())
    assert now_view.all() == rt.memory.all()


def test_as_of_time(rt: journaled.Runtime, clock: ManualClock) -> None:
    """M12: a view at a time holds the events recorded up to it."""
    a = rt.memory.remember("first")
    t = clock.advance(1_000)
    rt.memory.remember("second")
    view = rt.memory.as_of(at=t - 1)
    assert [f.id for f in view.all()] == [a.id]


def test_as_of_rejects_bad_positions(rt: journaled.Runtime) -> None:
    """M12: positions past the end, negative ones, or both arguments are clear errors."""
    rt.memory.remember("x")
    with pytest.raises(ValueError, match="past the end"):
        rt.memory.as_of(position=99)
    with pytest.raises(ValueError, match=">= 0"):
        rt.memory.as_of(position=-1)
    with pytest.raises(ValueError, match="not both"):
        rt.memory.as_of(position=0, at=0)
