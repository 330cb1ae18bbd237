"""``journaled memory``: remember facts, and read the memory store now or as it was."""

from __future__ import annotations

import click
import msgspec

import journaled
from journaled import cli_render as render
from journaled.cli_common import (
    call,
    check_position,
    emit,
    fail,
    json_option,
    open_runtime,
    parse_time_option,
    wants_json,
)
from journaled.events.memory_audit import when


@click.group()
def memory() -> None:
    """Remember facts, and read the memory store now or as it was."""


@memory.command("remember")
@click.argument("text")
@click.option("--scope", default="project", show_default=True, help="Logical scope.")
@click.option("--domain", default=None, help="Domain, for search filters.")
@click.option("--key", "conflict_key", default=None, help="Conflict key: supersedes older facts.")
@click.option("--source", default=None, help="Where the fact comes from.")
@click.option("--confidence", type=float, default=None, help="Confidence in [0, 1] (default 1).")
@json_option
@click.pass_context
def memory_remember(
    ctx: click.Context,
    text: str,
    scope: str,
    domain: str | None,
    conflict_key: str | None,
    source: str | None,
    confidence: float | None,
) -> None:
    """Remember a fact (secrets redacted), superseding older facts with its conflict key.

    Creates the journal if needed.

    JSON: the stored Fact {id, scope, text, domain, confidence, conflict_key, source,
    valid_from, valid_until, created_at, superseded_by, supersedes}.
    """
    with open_runtime(ctx, create=True) as rt:
        fact = call(
            lambda: rt.memory.remember(
                text,
                scope=scope,
                domain=domain,
                confidence=confidence,
                conflict_key=conflict_key,
                source=source,
            )
        )
        if wants_json(ctx):
            emit(fact)
            return
        line = f"remembered {fact.id} in scope {fact.scope!r}"
        if fact.supersedes:
            line += f", superseding {', '.join(fact.supersedes)}"
        if fact.text != text:
            line += " (secrets were redacted)"
        render.echo(line)


@memory.command("search")
@click.argument("query")
@click.option("--limit", default=10, show_default=True)
@click.option("--scope", "scopes", multiple=True, help="Logical scope to keep (repeatable).")
@click.option(
    "--hybrid",
    is_flag=True,
    help="Fuse BM25 with semantic ranks (needs --embedder; without one, BM25 alone).",
)
@click.option(
    "--embedder",
    "embedder_spec",
    envvar="JOURNALED_EMBEDDER",
    default=None,
    help="openai:MODEL@BASE_URL or local:MODEL_DIR (default $JOURNALED_EMBEDDER).",
)
@json_option
@click.pass_context
def memory_search(
    ctx: click.Context,
    query: str,
    limit: int,
    scopes: tuple[str, ...],
    hybrid: bool,
    embedder_spec: str | None,
) -> None:
    """Search facts valid now by BM25, or fused with meaning (--hybrid). JSON: a list of Fact."""
    embedder = None
    if hybrid and embedder_spec:
        from journaled.embedders import from_spec

        try:
            embedder = from_spec(embedder_spec)
        except (ValueError, ImportError) as exc:
            fail(f"--embedder: {exc}")
    with open_runtime(ctx, embedder=embedder) as rt:
        search = rt.memory.search_hybrid if hybrid else rt.memory.search
        facts = call(lambda: search(query, scopes=list(scopes) or None, limit=limit))
        if wants_json(ctx):
            emit(facts)
            return
        if hybrid and embedder is None:
            render.echo("no embedder (--embedder or JOURNALED_EMBEDDER): ranked by BM25 alone")
        render.table_console().print(render.facts_table(facts))


@memory.command("as-of")
@click.argument("query", required=False)
@click.option("--position", type=int, default=None, help="Journal position to view the store at.")
@click.option("--at-time", default=None, help="ISO-8601 time (2026-11-30T07:00:00Z, or a date).")
@click.option("--limit", default=10, show_default=True, help="Most search results to show.")
@json_option
@click.pass_context
def memory_as_of(
    ctx: click.Context, query: str | None, position: int | None, at_time: str | None, limit: int
) -> None:
    """Show every fact stored then, or search as the store would have then (M12).

    Give exactly one of --position and --at-time.

    JSON: {position, at, query, facts: [Fact]}.
    """
    if (position is None) == (at_time is None):
        fail("memory as-of takes exactly one of --position N and --at-time ISO-TIME")
    at = None if at_time is None else parse_time_option(at_time)
    with open_runtime(ctx) as rt:
        if position is not None:
            check_position(rt, position)
        view = call(lambda: rt.memory.as_of(position=position, at=at))
        facts = view.all() if query is None else call(lambda: view.search(query, limit=limit))
        if wants_json(ctx):
            emit(render.MemoryAsOf(position=view.position, at=at, query=query, facts=facts))
            return
        then = f"#{view.position}" + ("" if at is None else f" ({when(at)})")
        title = f"memory as of {then}" + ("" if query is None else f": search {query!r}")
        render.table_console().print(render.facts_table(facts, title=title))


@memory.command("show")
@click.argument("fact_id")
@json_option
@click.pass_context
def memory_show(ctx: click.Context, fact_id: str) -> None:
    """Show one fact. JSON: the Fact."""
    with open_runtime(ctx) as rt:
        fact = rt.memory.get(fact_id)
        if fact is None:
            fail(f"no fact {fact_id} in this journal (deleted or unknown)")
        text = render.to_json(fact)
        if wants_json(ctx):
            click.echo(text)
        else:
            render.echo(msgspec.json.format(text))


@memory.command("why")
@click.argument("fact_id")
@json_option
@click.pass_context
def memory_why(ctx: click.Context, fact_id: str) -> None:
    """Explain a fact's life from its events (M11). JSON: {fact_id, why}."""
    with open_runtime(ctx) as rt:
        if not rt.memory.history(fact_id):
            fail(f"no fact {fact_id} in this journal")
        why = rt.memory.why(fact_id)
        if wants_json(ctx):
            emit(render.FactWhy(fact_id=fact_id, why=why))
        else:
            render.echo(why)


@memory.command("history")
@click.argument("fact_id")
@json_option
@click.pass_context
def memory_history(ctx: click.Context, fact_id: str) -> None:
    """List a fact's events with their positions (M11).

    JSON: a list of Event {position, stream, version, data: {type, at, ...}}.
    """
    with open_runtime(ctx) as rt:
        history = rt.memory.history(fact_id)
        if not history:
            fail(f"no fact {fact_id} in this journal")
        if wants_json(ctx):
            emit(history)
        else:
            render.echo(render.history_lines(history))


@memory.command("scrub")
@click.option(
    "--timeout", type=float, default=10.0, show_default=True, help="Seconds to wait for readers."
)
@click.pass_context
def memory_scrub(ctx: click.Context, timeout: float) -> None:
    """Remove purged texts' bytes from the journal's files (M10).

    A purge erases the text from every table when it commits; the files are scrubbed afterwards,
    once no other connection (a backup, a report) still reads older data. Run this after such a
    reader has finished, or after a process died between a purge and its scrub, to make sure.
    Exit status 1 if a reader still holds old data (the message says how many purges it left).
    """
    with open_runtime(ctx) as rt:
        owed = call(lambda: rt.memory.scrub_pending)
        try:
            call(lambda: rt.memory.scrub(timeout=timeout))
        except journaled.ScrubPending as exc:
            fail(str(exc))
        found = " (a purge had not been scrubbed yet)" if owed else ""
        click.echo(f"scrubbed: no erased text remains in the journal's files{found}")


@memory.command("used-by")
@click.argument("fact_id")
@json_option
@click.pass_context
def memory_used_by(ctx: click.Context, fact_id: str) -> None:
    """List the steps that read a fact, from the journal (P2).

    JSON: [{run_id, step_id, position, carried_from}]; ``carried_from`` names the run whose
    read a fork's kept step rests on (null for a step's own read).
    """
    with open_runtime(ctx) as rt:
        if not rt.memory.history(fact_id):
            fail(f"no fact {fact_id} in this journal")
        uses = rt.memory.used_by(fact_id)
        if wants_json(ctx):
            emit(uses)
            return
        if not uses:
            render.echo(f"no step read {fact_id}")
        for use in uses:
            line = f"[#{use.position}] step {use.step_id!r} of run {use.run_id}"
            if use.carried_from is not None:
                line += f" (a fork: its output is run {use.carried_from}'s)"
            render.echo(line)
