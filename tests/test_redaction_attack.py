"""Secrets put everywhere a value can travel never reach storage or an observer (M9).

SPEC M9: "The journal never holds the secret." ADR 0018 redacts run data where it is staged
(``RunRecorder.stage``, ``Orchestrator._append``) and memory texts where the fact is decided;
ADR 0019 keeps the rules our own. These probes push every kind of secret of the corpus
(``tests/secret_corpus.py``) through every door that leads to storage or out to an observer:
plan goals, step inputs in nested shapes, tool outputs as dataclasses and msgspec Structs,
exception messages, agent data, artifacts and questions, answers, planner questions, gaps and
failures, clarifications, orchestration summaries, fact texts and sources, purge reasons, run
summaries, journal reads and subscriptions, OpenTelemetry spans, log records, the wire protocol,
MCP calls and the vector cache. After each scenario the raw bytes of every file beside the
journal (the ``-wal`` file included) and every stored cell (snapshots inflated) are scanned, and
on PostgreSQL every row of every table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sqlite3
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from gateway_foreign import Foreign
from secret_corpus import LOOK_ALIKES, SECRETS

import journaled
from journaled import AgentResult, Clarify, Gap, Gaps, NeedsInput, Observation, Plan, Step
from journaled.events.gateway_messages import ReadJournal, RememberRequest, StartRun
from journaled.events.redact import REDACTED, find_secrets, redact, redact_data
from journaled.testing import KeywordEmbedder, ManualClock

# -- the secrets -----------------------------------------------------------------------------------

_FIRST: dict[str, tuple[str, tuple[str, ...]]] = {}
for _kind, _text, _values in SECRETS:
    _FIRST.setdefault(_kind, (_text, _values))

TEXTS: list[str] = [text for text, _ in _FIRST.values()]
"""One realistic text per kind of secret the rules know (54 kinds)."""
VALUES: list[str] = sorted(
    {line for _, values in _FIRST.values() for value in values for line in value.splitlines()}
)
"""The secret values inside :data:`TEXTS` (each line of a multi-line one, as a JSON text or
a row may break it there): none may be found anywhere after a scenario."""
JOINED = "\n\n".join(TEXTS)
"""Every text at once (about 5 KB): for goals, questions, answers and clarifications."""


def _chunks(limit: int = 3000) -> list[str]:
    """Split :data:`TEXTS` into texts under ``limit`` characters (an error keeps 4096)."""
    out: list[str] = [""]
    for text in TEXTS:
        if out[-1] and len(out[-1]) + len(text) + 2 > limit:
            out.append("")
        out[-1] = f"{out[-1]}\n\n{text}" if out[-1] else text
    return out


CHUNKS = _chunks()
GITHUB = next(v for v in VALUES if v.startswith("ghp_"))
PASSWORD = next(v for k, (_, vs) in _FIRST.items() if k == "env-password" for v in vs)


def _leaked(data: bytes | str) -> list[str]:
    """Return the secret values found in ``data``."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    return [v for v in VALUES if v.encode() in raw]


def _json(value: Any) -> str:
    """Return ``value`` as JSON text (events, results, spans), whatever msgspec can encode."""
    return msgspec.json.encode(value, enc_hook=repr).decode()


def _cells(value: Any) -> Iterator[bytes]:
    """Yield a stored cell's bytes, and its inflated bytes when it is a deflated cache."""
    if isinstance(value, memoryview):
        value = value.tobytes()
    if isinstance(value, bytes):
        yield value
        with contextlib.suppress(zlib.error):
            yield zlib.decompress(value)
    elif value is not None:
        yield str(value).encode("utf-8", "surrogatepass")


def _sqlite_cells(path: Path) -> bytes:
    """Return every cell of every table of a SQLite file (deflated caches inflated)."""
    out: list[bytes] = []
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for row in db.execute(f'SELECT * FROM "{table}"'):  # noqa: S608 - names from the file
                for cell in row:
                    out.extend(_cells(cell))
    finally:
        db.close()
    return b"\x00".join(out)


def _stored_sqlite(directory: Path) -> bytes:
    """Return the raw bytes of every file in ``directory``, then the cells of its databases."""
    files = sorted(p for p in directory.iterdir() if p.is_file())
    raw = [p.read_bytes() for p in files]
    cells = [
        _sqlite_cells(p)
        for p, data in zip(files, raw, strict=True)
        if data.startswith(b"SQLite format 3\x00")
    ]
    return b"\x00".join(raw + cells)


def _stored_postgresql(url: str) -> bytes:
    """Return every cell of every table of the database (no pg_dump: SELECT from each)."""
    import psycopg

    out: list[bytes] = []
    with psycopg.connect(url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_schema NOT IN ('pg_catalog', 'information_schema') "
            "AND table_type = 'BASE TABLE'"
        ).fetchall()
        assert tables, "the journal made no tables"
        for schema, table in tables:
            for row in conn.execute(f'SELECT * FROM "{schema}"."{table}"').fetchall():  # noqa: S608
                for cell in row:
                    out.extend(_cells(cell))
    return b"\x00".join(out)


def _stored(url: str) -> bytes:
    """Return everything the backend of ``url`` keeps (nothing for an in-memory journal)."""
    if url.startswith("sqlite:///"):
        return _stored_sqlite(Path(url.removeprefix("sqlite:///")).parent)
    if url.startswith("postgresql"):
        return _stored_postgresql(url)
    return b""


# -- shapes a tool may return ----------------------------------------------------------------------


@dataclasses.dataclass
class _Note:
    note: str
    extra: dict[str, Any]


class _Creds(msgspec.Struct):
    user: str
    password: str
    token: str
    notes: list[str]


class _Planner:
    """Ask a question holding every secret, then answer gaps holding them too."""

    def __call__(
        self, goal: str, observations: list[Observation], clarifications: list[tuple[str, str]]
    ) -> object:
        if not clarifications:
            return Clarify(JOINED)
        return Gaps([Gap(kind="tool", name=f"the {GITHUB} deployer", reason=CHUNKS[1])])


def _plans_the_texts(
    goal: str, observations: list[Observation], clarifications: list[tuple[str, str]]
) -> object:
    return Plan(goal=goal, steps=[Step("p", tool="echo", input={"texts": TEXTS})])


def _raises(
    goal: str, observations: list[Observation], clarifications: list[tuple[str, str]]
) -> object:
    raise RuntimeError(CHUNKS[0])


def _everything(rt: journaled.Runtime) -> tuple[list[Any], list[Any], list[str]]:
    """Send every secret through every kind of run content; return (results, seen, run ids)."""
    seen: list[Any] = []

    def echo(data: Any) -> Any:
        seen.append(data)
        return data

    def shapes(data: Any) -> Any:
        seen.append(data)
        return {
            "note": _Note(note=CHUNKS[0], extra={"password": PASSWORD, "texts": TEXTS[:5]}),
            "creds": _Creds(user="bob", password=PASSWORD, token=GITHUB, notes=TEXTS[5:10]),
            "tuple": tuple(TEXTS[10:15]),
            "keys": {t: i for i, t in enumerate(TEXTS) if "\n" not in t},
            "deep": [[[{"apiKey": GITHUB, "list": [TEXTS[-1]]}]]],
        }

    def asker(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        if ctx.answer is None:
            raise NeedsInput(JOINED)
        seen.append(ctx.answer)
        return AgentResult(
            output=ctx.answer,
            data={"texts": TEXTS, "password": PASSWORD},
            artifacts=[{"text": t} for t in TEXTS[:20]],
            calls_used=0,
        )

    def refuser(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        return AgentResult(ok=False, error=CHUNKS[1], data={"why": CHUNKS[0]}, calls_used=0)

    rt.register_tool("echo", echo)
    rt.register_tool("shapes", shapes)
    rt.register_skill("skill", lambda data: f"summary of {data}")
    for i, chunk in enumerate(CHUNKS):

        def fail(data: Any, chunk: str = chunk) -> Any:
            raise RuntimeError(chunk)

        rt.register_tool(f"fail{i}", fail)
    rt.register_agent("asker", asker)
    rt.register_agent("refuser", refuser)
    plan = Plan(
        goal=JOINED,
        steps=[
            Step(
                "a",
                tool="echo",
                input={
                    "texts": TEXTS,
                    "by_kind": {f"case {kind}": text for kind, (text, _) in _FIRST.items()},
                    "tuple": tuple(TEXTS),
                    "nested": [[{"password": PASSWORD, "token": GITHUB}]],
                    "keys": {t: i for i, t in enumerate(TEXTS) if "\n" not in t},
                },
            ),
            Step("b", tool="shapes", input=_Note(note=CHUNKS[1], extra={"secret": PASSWORD})),
            Step("s", skill="skill", input=CHUNKS[2 % len(CHUNKS)]),
            *[Step(f"f{i}", tool=f"fail{i}", input=c) for i, c in enumerate(CHUNKS)],
            Step("q", agent="asker", depends_on=["a"]),
            Step("r", agent="refuser"),
        ],
    )
    results: list[Any] = []
    first = rt.execute(plan)
    assert first.waiting == ["q"], first
    results.append(first)
    done = rt.resume(first.run_id, answers={"q": JOINED})
    results.append(done)
    asked = rt.orchestrate(JOINED, _Planner())
    assert asked.status == "waiting_for_clarification", asked
    results.append(asked)
    results.append(rt.resume(asked.run_id, clarification=JOINED))
    results.append(rt.orchestrate(CHUNKS[0], _raises))
    results.append(rt.orchestrate(CHUNKS[1], _plans_the_texts))
    results.extend(rt.memory.remember(chunk, source=chunk) for chunk in CHUNKS)
    fact = rt.memory.remember("a fact to purge")
    assert rt.memory.purge(fact.id, reason=CHUNKS[0])
    ids = [first.run_id, asked.run_id, results[4].run_id, results[5].run_id]
    return results, seen, ids


def _reads(rt: journaled.Runtime, ids: list[str]) -> str:
    """Return what every read door shows: journal, histories, whys, states, listings."""
    parts = [_json(rt.journal.read())]
    summaries = rt.runs.list()
    parts.append(_json(summaries))
    for summary in summaries:
        parts.append(_json(rt.runs.history(summary.run_id)))
        parts.append(rt.runs.why(summary.run_id))
        if summary.kind == "run.started":
            parts.append(_json(rt.runs.at(summary.run_id, rt.journal.position())))
    for fact in rt.memory.all():
        parts.append(rt.memory.why(fact.id))
        parts.append(_json(rt.memory.history(fact.id)))
    assert set(ids) <= set(rt.runs.ids())
    return "\n".join(parts)


def test_every_secret_in_every_kind_of_run_content_reaches_no_storage(
    journal_url: str, clock: ManualClock
) -> None:
    """M9, ADR 0018: every kind of secret the rules know, in goals, nested step inputs (dict
    keys, tuples, dataclasses), tool outputs (dataclasses, msgspec Structs, keys, deep lists),
    skill outputs, exception messages, agent data, artifacts, errors and questions, answers,
    planner questions, gaps and failures, clarifications, summaries, fact texts, sources and
    purge reasons: none is in the live results, in what a step received, in any read door, nor
    in any file, row or inflated snapshot of the backend, while open and after close."""
    with journaled.open(journal_url, clock=clock) as rt:
        results, seen, ids = _everything(rt)
        assert _leaked(_json(results)) == []
        assert _leaked(_json(seen)) == []  # a step receives its redacted input (ADR 0018)
        reads = _reads(rt, ids)
        assert _leaked(reads) == []
        assert REDACTED in reads
        assert _leaked(_stored(journal_url)) == []
    assert _leaked(_stored(journal_url)) == []  # snapshots saved at close included


def test_the_redacted_run_still_says_what_was_there(sqlite_url: str, clock: ManualClock) -> None:
    """M9, ADR 0019: redaction replaces the secret only: the key names, the step's structure,
    the failing step's surrounding words and the agent's other data are kept, and a resume
    after a reopen reads the same redacted values (R5)."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        results, _, ids = _everything(rt)
        done = results[1]
        by_step = {o.step_id: o for o in done.observations}
        echoed = by_step["a"].output
        assert echoed["nested"] == [[{"password": REDACTED, "token": REDACTED}]]
        assert set(echoed["by_kind"]) == {f"case {kind}" for kind in _FIRST}
        assert len(echoed["texts"]) == len(TEXTS)
        assert echoed["by_kind"]["case env-password"] == (
            f"DB_HOST=db.internal\nDB_PASSWORD={REDACTED}\nDB_PORT=5432"
        )
        shaped = by_step["b"].output
        assert shaped["creds"]["user"] == "bob"
        assert shaped["creds"]["password"] == REDACTED
        assert "postgres://app:" + REDACTED + "@db.internal:5432/app" in str(shaped["keys"])
        assert by_step["f0"].ok is False
        assert REDACTED in (by_step["f0"].error or "")
        assert by_step["q"].data["password"] == REDACTED
        live = rt.runs.at(ids[0], rt.journal.position()).observations
    with journaled.open(sqlite_url, clock=clock) as rt:
        assert rt.runs.at(ids[0], rt.journal.position()).observations == live


def test_run_purge_reason_and_fact_purge_reason_hold_no_secret(
    sqlite_url: str, clock: ManualClock
) -> None:
    """M9, R2: the reason given to ``runs.purge`` and to ``memory.purge`` is journaled (and
    shown by why) without the secrets it quotes; nothing is left in the files."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("echo", lambda data: data)
        run_id = rt.execute(Plan(goal="g", steps=[Step("a", tool="echo", input=1)])).run_id
        assert rt.runs.purge(run_id, reason=CHUNKS[0]) > 0
        fact = rt.memory.remember("the deploy key moved to the vault")
        assert rt.memory.purge(fact.id, reason=CHUNKS[1])
        why = rt.runs.why(run_id) + rt.memory.why(fact.id)
        assert "content purged: " in why
        assert REDACTED in why
        assert _leaked(why) == []
        assert _leaked(_json(rt.journal.read())) == []
    assert _leaked(_stored(sqlite_url)) == []


def test_a_fork_of_a_run_that_held_secrets_carries_only_redacted_values(
    sqlite_url: str, clock: ManualClock
) -> None:
    """M9, F1: a fork copies the source's observations, questions and plan into its own
    ``run.forked``: they were redacted in the source, so the fork holds no secret either."""

    def asker(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        if ctx.answer is None:
            raise NeedsInput(CHUNKS[0])
        return AgentResult(output="ok", calls_used=0)

    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("echo", lambda data: data)
        rt.register_agent("asker", asker)
        first = rt.execute(
            Plan(
                goal=CHUNKS[1],
                steps=[Step("a", tool="echo", input=TEXTS), Step("q", agent="asker")],
            )
        )
        assert first.waiting == ["q"]
        fork = rt.runs.fork(first.run_id, answers={"q": "plain answer"})
        resumed = rt.resume(fork)
        assert isinstance(resumed, journaled.ExecuteResult)
        assert resumed.ok
        assert _leaked(_json(rt.runs.history(fork))) == []
        assert _leaked(_json(rt.runs.compare(first.run_id, fork))) == []
    assert _leaked(_stored(sqlite_url)) == []


# -- memory fields ---------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["domain", "conflict_key"])
def test_a_secret_in_a_domain_or_conflict_key_is_refused_and_nothing_is_appended(
    sqlite_url: str, field: str
) -> None:
    """M9, M2: a domain or conflict key names a stream or a filter, so it cannot be redacted:
    one that holds a secret is refused, the error does not repeat it, nothing is appended."""
    with journaled.open(sqlite_url) as rt:
        position = rt.journal.position()
        named = f"deploy {GITHUB}"
        domain, key = (named, None) if field == "domain" else (None, named)
        with pytest.raises(journaled.InvalidFact) as refused:
            rt.memory.remember("a plain fact", domain=domain, conflict_key=key)
        assert GITHUB not in str(refused.value)
        assert field in str(refused.value)
        assert rt.journal.position() == position
    assert GITHUB.encode() not in _stored(sqlite_url)


def test_fact_texts_and_sources_are_redacted_and_the_kinds_are_named(
    sqlite_url: str, clock: ManualClock
) -> None:
    """M9, M2: every corpus text remembered as a fact (and as its source) is stored redacted;
    the returned fact, ``get``, search and ``why`` show the redacted text, and why names the
    kinds of secret removed."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        facts = [rt.memory.remember(text, source=text) for text in TEXTS]
        assert _leaked(_json(facts)) == []
        assert all(REDACTED in f.text for f in facts)
        assert _leaked(_json([rt.memory.get(f.id) for f in facts])) == []
        assert _leaked(_json(rt.memory.search("DB_HOST"))) == []
        why = rt.memory.why(facts[0].id)
        assert "secret(s) redacted" in why
        assert _leaked(why) == []
    assert _leaked(_stored(sqlite_url)) == []


def test_a_megabyte_fact_with_secrets_at_both_ends_is_redacted(
    sqlite_url: str, clock: ManualClock
) -> None:
    """M9, J5: a fact of nearly the 1 MiB bound with a secret in its first and last bytes is
    stored whole and redacted at both ends, in well under the time a remember may take."""
    filler = "lorem ipsum dolor sit amet " * 38_000
    text = f"{GITHUB} {filler} password={PASSWORD}"
    assert len(text.encode()) < 1 << 20
    with journaled.open(sqlite_url, clock=clock) as rt:
        began = time.monotonic()
        fact = rt.memory.remember(text)
        assert time.monotonic() - began < 10
        assert fact.text == f"{REDACTED} {filler} password={REDACTED}"
    assert _leaked(_stored(sqlite_url)) == []


# -- observers -------------------------------------------------------------------------------------


def test_a_subscription_delivers_only_redacted_events(sqlite_url: str, clock: ManualClock) -> None:
    """M9, A3: a subscriber following the journal sees every event of the scenario, none of
    them holding a secret."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        _everything(rt)
        end = rt.journal.position()
        got: list[Any] = []
        with rt.journal.subscribe() as sub:
            deadline = time.monotonic() + 10
            while sub.position < end and time.monotonic() < deadline:
                event = sub.poll(1.0)
                if event is not None:
                    got.append(event)
        assert got
        assert got[-1].position == end
        assert _leaked(_json(got)) == []


def test_spans_hold_no_secret(sqlite_url: str, clock: ManualClock) -> None:
    """M9, T3: the OpenTelemetry spans of runs, waves and steps (attributes, events, status
    descriptions) carry the redacted error of a failing step, never its secret."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import journaled.otel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with journaled.open(sqlite_url, clock=clock) as rt:
        journaled.otel.instrument(rt, tracer_provider=provider)
        _everything(rt)
    spans = list(exporter.get_finished_spans())
    assert len(spans) > 10
    shown: list[Any] = []
    for span in spans:
        shown += [span.name, dict(span.attributes or {}), span.status.description]
        shown += [(e.name, dict(e.attributes or {})) for e in span.events]
    text = _json(shown)
    assert "exception.message" in text
    assert REDACTED in text
    assert _leaked(text) == []


def test_log_records_hold_no_secret(
    sqlite_url: str, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """M9: failing tools, refusing agents, a raising planner and refused facts log nothing that
    holds their secrets, at any level (tracebacks included)."""
    caplog.set_level(logging.DEBUG)
    with journaled.open(sqlite_url, clock=clock) as rt:
        _everything(rt)
        with pytest.raises(journaled.InvalidFact):
            rt.memory.remember("x", conflict_key=GITHUB)
    logged = "\n".join(
        f"{r.getMessage()}\n{logging.Formatter().formatException(r.exc_info) if r.exc_info else ''}"
        for r in caplog.records
    )
    assert _leaked(logged) == []


def test_the_wire_protocol_carries_only_redacted_values(
    sqlite_url: str, clock: ManualClock
) -> None:
    """M9, A4: a plan and a fact sent as msgpack envelopes through the gateway are journaled
    redacted; the replies (the fact, run.ended's result, a journal page) hold no secret, and
    neither do the files."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("echo", lambda data: data)
        box = Foreign("foreign/redaction", rt.protocol.address, rt.protocol.deliver)
        rt.protocol.register_bytes(box.address, box.receive)
        try:
            fact = box.ask(RememberRequest, "r1", text=CHUNKS[0], source=CHUNKS[1])
            assert REDACTED in fact.fact.text
            plan = Plan(goal=JOINED, steps=[Step("a", tool="echo", input={"texts": TEXTS})])
            box.send(StartRun, "run1", plan=plan)
            _, ended = box.wait("run1", 2)
            assert ended.result.ok
            page = box.ask(ReadJournal, "j1", after=0, limit=500)
            assert page.events
        finally:
            rt.protocol.unregister(box.address)
        assert _leaked(b"".join(box.received)) == []
    assert _leaked(_stored(sqlite_url)) == []


def test_mcp_remember_is_redacted_and_a_refusal_does_not_repeat_the_secret(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """M9, T4: a fact remembered through the MCP tool is stored redacted and returned
    redacted; a refused call (a conflict key holding a token) names the argument, not the
    token, in its error and in the log."""
    pytest.importorskip("mcp")
    from journaled.mcp_tools import TOOLS, ToolError, answer

    spec = next(s for s in TOOLS if s.name.endswith("remember"))
    caplog.set_level(logging.DEBUG)
    with journaled.open(sqlite_url) as rt:
        shown, structured = answer(rt, spec, {"text": CHUNKS[0], "source": CHUNKS[1]})
        assert _leaked(_json([shown, structured])) == []
        with pytest.raises(ToolError) as refused:
            answer(rt, spec, {"text": "plain", "conflict_key": f"key {GITHUB}"})
        assert GITHUB not in str(refused.value)
    assert _leaked(caplog.text) == []
    assert _leaked(_stored(sqlite_url)) == []


class _NamedEmbedder(KeywordEmbedder):
    """A keyword embedder with a model name, so its vectors are kept in a file (ADR 0048)."""

    model = "keywords-redaction"


def test_the_vector_cache_and_the_embedder_see_only_redacted_fact_texts(
    sqlite_url: str, clock: ManualClock
) -> None:
    """M9, M7, ADR 0048: semantic search embeds the stored (redacted) fact texts; the vector
    cache file beside the journal keeps no secret, and the query, which holds one, is not kept."""
    embedder = _NamedEmbedder(["deploy", "vault", "key", "token"])
    with journaled.open(sqlite_url, clock=clock, embedder=embedder) as rt:
        for chunk in CHUNKS:
            rt.memory.remember(f"deploy vault {chunk}")
        hits = rt.memory.search_semantic(f"deploy key {GITHUB}")
        assert hits
        assert _leaked(_json(hits)) == []
    fact_texts = [t for call in embedder.calls for t in call if "deploy vault" in t]
    assert len(fact_texts) >= len(CHUNKS)
    assert _leaked(_json(fact_texts)) == []
    cache = Path(sqlite_url.removeprefix("sqlite:///") + ".vectors")
    assert cache.exists()
    assert _leaked(_stored(sqlite_url)) == []


# -- the rules at their edges ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Case-insensitive matching folds these to the ASCII letters of a secret's name.
        ("pa\u017f\u017fword=Hunt3r-2xyz", f"pa\u017f\u017fword={REDACTED}"),
        ("to\u212aen=Hunt3r-2xyz", f"to\u212aen={REDACTED}"),
        ("\u00e9t\u00e9: SECRET=Hunt3r-2xyz", f"\u00e9t\u00e9: SECRET={REDACTED}"),
        # Non-ASCII text around an ASCII token runs every rule (no prefilter).
        ("cl\u00e9 \u2192 " + GITHUB + " \u2713", f"cl\u00e9 \u2192 {REDACTED} \u2713"),
    ],
)
def test_unicode_that_folds_to_a_secrets_name_is_still_redacted(text: str, expected: str) -> None:
    """M9, ADR 0019: names spelled with letters that fold to ASCII (long s, Kelvin sign) and
    tokens in non-ASCII text are found as the ASCII ones are."""
    assert redact(text) == expected
    assert redact(expected) == expected


@pytest.mark.parametrize(
    "text",
    [
        REDACTED,
        f"{REDACTED}{REDACTED}",
        f"password={REDACTED}",
        f"sk-{REDACTED}",
        f"Authorization: Bearer {REDACTED}",
        f"postgres://u:{REDACTED}@db/x",
        f"-----BEGIN RSA PRIVATE KEY-----\n{REDACTED}",
        f'{{"password": "{REDACTED}", "token": "{REDACTED}"}}',
    ],
)
def test_redacting_a_redacted_text_changes_nothing(text: str) -> None:
    """M9: a text that already holds markers comes back as it is and reports no secret —
    except a PEM header, whose block runs to the end of the text and is redacted whole."""
    once = redact(text)
    assert redact(once) == once
    assert find_secrets(once) == []
    if not text.startswith("-----BEGIN"):
        assert once == text


def test_redacting_structured_data_twice_changes_nothing() -> None:
    """M9, ADR 0018: ``redact_data`` is idempotent on the nested shapes of run data, and keeps
    tuples as tuples, non-string keys, numbers and booleans."""
    data: Any = {
        "texts": TEXTS,
        "tuple": tuple(TEXTS[:3]),
        1: "password=" + PASSWORD,
        "flag": True,
        "count": 3,
        "nested": [[{"password": PASSWORD, "ok": None}]],
    }
    once = redact_data(data)
    assert redact_data(once) == once
    assert isinstance(once["tuple"], tuple)
    assert once[1] == f"password={REDACTED}"
    assert once["flag"] is True
    assert once["count"] == 3
    assert once["nested"] == [[{"password": REDACTED, "ok": None}]]
    assert _leaked(_json(once)) == []


def test_deeply_nested_input_is_redacted_without_exhausting_the_stack() -> None:
    """M9, ADR 0018: a secret at the bottom of data nested 10,000 deep is redacted (the walk
    is iterative)."""
    data: Any = {"password": PASSWORD}
    for _ in range(10_000):
        data = [data]
    out = redact_data(data)
    for _ in range(10_000):
        out = out[0]
    assert out == {"password": REDACTED}


@pytest.mark.parametrize("text", LOOK_ALIKES[:60])
def test_look_alikes_survive_the_journey_through_a_run(text: str) -> None:
    """M9, ADR 0019: texts that only look like secrets (placeholders, hashes, UUIDs, prose
    about passwords) come back unchanged from ``redact_data``, keys included."""
    assert redact_data({"text": text, text: [text]}) == {"text": text, text: [text]}


@pytest.mark.parametrize(
    "text",
    [
        "Set a password of at least 12 characters; tokens: 4096 per request.",
        "max_tokens=4096 temperature=0.2 top_p=0.9",
        "PASSWORD_MIN_LENGTH=12 TOKEN_EXPIRY=3600 SECRET_ROTATION_DAYS=30",
        "git push -u origin main",
        "ssh://git@github.com:2222/org/repo.git and http://user@host:8080/path",
        "see https://scikit-learn.org/stable/ for sk-learn-compatible-estimators",
        "commit 4f9c0c7e1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d",
        "uuid 123e4567-e89b-12d3-a456-426614174000",
        "The bearer token is sent in Bearer authentication headers.",
        "the password is read from ${DB_PASSWORD}; token = os.environ['TOKEN']",
        "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n"
        "-----END PUBLIC KEY-----",
    ],
)
def test_ordinary_text_about_credentials_is_not_mangled(text: str) -> None:
    """M9, ADR 0019: prose, configuration limits, git remotes, placeholders and public keys
    are kept whole: a user would be surprised to lose them."""
    assert redact(text) == text
    assert redact_data({"note": text}) == {"note": text}


def test_struct_and_dataclass_fields_named_like_secrets_are_replaced_whole(
    sqlite_url: str, clock: ManualClock
) -> None:
    """M9, ADR 0018: a tool returning a dataclass or a msgspec Struct whose fields are named
    like secrets (``password``, ``token``, ``apiKey``, ``client_secret``) has them replaced
    whole, whatever the value looks like; other fields are kept."""

    @dataclasses.dataclass
    class Login:
        user: str
        password: str
        apiKey: str
        region: str

    class Client(msgspec.Struct):
        client_secret: str
        token: int
        timeout: int

    def login(data: Any) -> Any:
        return {
            "login": Login("bob", "correct horse battery staple", "plainword", "eu-west-1"),
            "client": Client(client_secret="abc", token=123456, timeout=30),
        }

    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("login", login)
        out = rt.execute(Plan(goal="g", steps=[Step("a", tool="login")])).observations[0].output
    assert out == {
        "login": {
            "user": "bob",
            "password": REDACTED,
            "apiKey": REDACTED,
            "region": "eu-west-1",
        },
        "client": {"client_secret": REDACTED, "token": REDACTED, "timeout": 30},
    }
    stored = _stored(sqlite_url)
    assert b"correct horse battery staple" not in stored
    assert b"plainword" not in stored


def test_json_text_of_a_config_loses_every_credential_and_keeps_the_rest() -> None:
    """M9, ADR 0019: a JSON document (one level, as a tool prints it) loses its passwords,
    tokens and keys; its other values and its shape stay, so it still parses."""
    config = {
        "host": "db.internal",
        "password": PASSWORD,
        "api_key": "Zx81-" + "Qv7" * 5,
        "retries": 3,
        "Authorization": "Bearer " + "Ab9" * 8,
    }
    redacted = json.loads(redact(json.dumps(config)))
    assert redacted == {
        "host": "db.internal",
        "password": REDACTED,
        "api_key": REDACTED,
        "retries": 3,
        "Authorization": f"Bearer {REDACTED}",
    }
