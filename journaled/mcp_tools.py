"""The tools ``journaled mcp`` serves: arguments, answers, refusals (SPEC X2, ADR 0042).

Each tool's arguments are a msgspec Struct: the JSON Schema an MCP client sees (types, bounds,
enums, descriptions) and the validation of a call come from that one declaration, and unknown
arguments are refused. A tool answers a pair: the value the matching CLI command prints with
``--json``, and the same value as an object (lists wrapped: ``{"facts": [...]}``) for
``structuredContent``, whose schema is generated from its type. A refused call raises
:class:`ToolError` naming the argument. This module imports nothing of ``mcp``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, get_type_hints

import msgspec

import journaled
from journaled import cli_render as render
from journaled.actors.errors import InvalidFact, RunNotFound
from journaled.errors import InvalidArgument
from journaled.events.base import Event
from journaled.events.errors import EventsError
from journaled.events.inputs import short
from journaled.events.memory import Fact
from journaled.events.provenance import Stale
from journaled.events.run_summaries import RunSummary, SummaryStatus

# -- arguments -------------------------------------------------------------------------------------

_ISO = "an ISO-8601 time, e.g. 2026-11-30T07:00:00Z (no offset: UTC), or a date"
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
EpochMs = Annotated[int, msgspec.Meta(ge=0)]
Position = Annotated[int, msgspec.Meta(ge=0, description="A journal position (0 or more).")]
Limit = Annotated[int, msgspec.Meta(ge=1, le=1000, description="Most results to return.")]
RunStatus = SummaryStatus


class _Args(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every tool's arguments: unknown arguments are refused, not ignored."""


class RememberArgs(_Args, frozen=True, kw_only=True):
    """Arguments of ``memory_remember`` (M2)."""

    text: Annotated[NonEmpty, msgspec.Meta(description="The fact. Secrets are redacted (M9).")]
    scope: Annotated[
        NonEmpty, msgspec.Meta(description="Logical scope (M1): user, project, repository, ...")
    ] = "project"
    domain: Annotated[str | None, msgspec.Meta(description="Domain, for search filters.")] = None
    confidence: Annotated[
        float | None, msgspec.Meta(description="Confidence, clamped into [0, 1]; default 1.")
    ] = None
    conflict_key: Annotated[
        str | None,
        msgspec.Meta(description="Facts sharing it are superseded by this one (M3)."),
    ] = None
    source: Annotated[str | None, msgspec.Meta(description="Where the fact comes from.")] = None
    valid_from: Annotated[
        EpochMs | None, msgspec.Meta(description="Valid from this epoch-ms time.")
    ] = None
    valid_until: Annotated[
        EpochMs | None, msgspec.Meta(description="Valid until this epoch-ms time.")
    ] = None


class SearchArgs(_Args, frozen=True, kw_only=True):
    """Arguments of ``memory_search`` (M5, M6)."""

    query: Annotated[NonEmpty, msgspec.Meta(description="Words to search for (BM25).")]
    scopes: Annotated[
        list[NonEmpty] | None, msgspec.Meta(description="Keep only these logical scopes.")
    ] = None
    domains: Annotated[
        list[NonEmpty] | None, msgspec.Meta(description="Keep only these domains.")
    ] = None
    min_confidence: Annotated[
        float, msgspec.Meta(ge=0, le=1, description="Keep only facts at least this confident.")
    ] = 0.0
    limit: Limit = 10


class FactArgs(_Args, frozen=True, kw_only=True):
    """Arguments of ``memory_why`` and ``memory_history`` (M11)."""

    fact_id: Annotated[NonEmpty, msgspec.Meta(description="The fact's id.")]


class AsOfArgs(_Args, frozen=True, kw_only=True):
    """Arguments of ``memory_as_of`` (M12): exactly one of ``position`` and ``at_time``."""

    position: Position | None = None
    at_time: Annotated[str | None, msgspec.Meta(description=f"View the store at {_ISO}.")] = None
    query: Annotated[
        NonEmpty | None,
        msgspec.Meta(description="Search as the store would have then; omit for every fact."),
    ] = None
    limit: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            le=1000,
            description="Most search results to return, with query; without one, every fact "
            "stored then is returned (as `journaled memory as-of --json`).",
        ),
    ] = 10


class RunsListArgs(_Args, frozen=True, kw_only=True):
    """Arguments of ``runs_list`` (T2)."""

    status: Annotated[
        RunStatus | list[RunStatus] | None,
        msgspec.Meta(description="Only runs in this status, or in any of several (a list)."),
    ] = None
    since: Annotated[
        str | None, msgspec.Meta(description=f"Only runs active at or after {_ISO}.")
    ] = None
    limit: Annotated[
        Annotated[int, msgspec.Meta(ge=1)] | None,
        msgspec.Meta(description="Only the newest N runs (oldest first)."),
    ] = None


class RunArgs(_Args, frozen=True, kw_only=True):
    """Arguments of ``runs_why`` (O6)."""

    run_id: Annotated[NonEmpty, msgspec.Meta(description="The run's (or orchestration's) id.")]


class RunAtArgs(_Args, frozen=True, kw_only=True):
    """Arguments of ``runs_at`` (O7): at most one of ``position`` and ``at_time``; none: now."""

    run_id: Annotated[NonEmpty, msgspec.Meta(description="The run's (or orchestration's) id.")]
    position: Position | None = None
    at_time: Annotated[str | None, msgspec.Meta(description=f"Rebuild the run at {_ISO}.")] = None


class StaleArgs(_Args, frozen=True, kw_only=True):
    """Arguments of ``runs_stale`` (P3)."""

    run_id: Annotated[
        NonEmpty | None, msgspec.Meta(description="One run's id; omit for every run.")
    ] = None


# -- results (structuredContent: always an object) -----------------------------------------------


class Facts(msgspec.Struct, frozen=True, kw_only=True):
    """``memory_search``: the facts found, best first."""

    facts: list[Fact]


class History(msgspec.Struct, frozen=True, kw_only=True):
    """``memory_history``: a fact's events, oldest first, with their journal positions."""

    fact_id: str
    events: list[Event]


class StaleSteps(msgspec.Struct, frozen=True, kw_only=True):
    """``runs_stale``: steps whose read facts changed since they were read."""

    stale: list[Stale]


def _summary_struct() -> type[msgspec.Struct]:
    """Describe ``RunSummary.as_dict()`` as a Struct, from the class's own annotations."""
    hints = get_type_hints(RunSummary)
    fields: list[tuple[str, Any]] = [(name, hints[name]) for name in RunSummary.__annotations__]
    fields += [("at", int)]  # as_dict() repeats started_at under its earlier name
    return msgspec.defstruct("RunSummary", fields, frozen=True, kw_only=True)


Answer = tuple[object, object]
"""What a tool answers: the CLI's ``--json`` value, and the structured value (an object)."""

RunSummaryShape: Any = _summary_struct()
RunsResult: Any = msgspec.defstruct(
    "Runs", [("runs", list[RunSummaryShape])], frozen=True, kw_only=True
)


class ToolError(Exception):
    """A refused call: the argument at fault and what is wrong with it."""

    def __init__(self, argument: str, problem: str) -> None:
        self.argument = argument
        self.problem = problem
        super().__init__(f"{argument}: {problem}")


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, what it does, its arguments, its result, and how it answers."""

    name: str
    description: str
    args: type[_Args]
    result: Any
    """The type whose JSON Schema is the tool's ``outputSchema``."""
    answer: Callable[[journaled.Runtime, Any], Answer]
    """``(rt, args) -> (the CLI's --json value, the structured value)``."""
    read_only: bool = True
    blame: str | None = None
    """The argument a library ``ValueError`` without a field is about."""


# -- answers ---------------------------------------------------------------------------------------


def _time(value: str, argument: str) -> int:
    try:
        return render.parse_time(value)
    except ValueError as exc:
        raise ToolError(argument, str(exc)) from None


def _position(rt: journaled.Runtime, position: int, argument: str = "position") -> int:
    end = rt.journal.position()
    if position > end:
        raise ToolError(
            argument, f"{position} is past the end of the journal (its last position is {end})"
        )
    return position


def _known_fact(rt: journaled.Runtime, fact_id: str) -> list[Event]:
    history = rt.memory.history(fact_id)
    if not history:
        raise ToolError("fact_id", f"no fact {short(fact_id)} in this journal")
    return history


def _remember(rt: journaled.Runtime, a: RememberArgs) -> Answer:
    fact = rt.memory.remember(
        a.text,
        scope=a.scope,
        domain=a.domain,
        confidence=a.confidence,
        conflict_key=a.conflict_key,
        source=a.source,
        valid_from=a.valid_from,
        valid_until=a.valid_until,
    )
    return fact, fact


def _search(rt: journaled.Runtime, a: SearchArgs) -> Answer:
    # The other tools read the journal; a search reads memory's projection, which folds other
    # processes' appends only every `follow` seconds. Folded first, a search answers what the
    # journal holds now, as memory_why does: a fact purged elsewhere is never found (R2).
    rt.refresh()
    facts = rt.memory.search(
        a.query, scopes=a.scopes, domains=a.domains, min_confidence=a.min_confidence, limit=a.limit
    )
    return facts, Facts(facts=facts)


def _why(rt: journaled.Runtime, a: FactArgs) -> Answer:
    _known_fact(rt, a.fact_id)
    why = render.FactWhy(fact_id=a.fact_id, why=rt.memory.why(a.fact_id))
    return why, why


def _history(rt: journaled.Runtime, a: FactArgs) -> Answer:
    events = _known_fact(rt, a.fact_id)
    return events, History(fact_id=a.fact_id, events=events)


def _as_of(rt: journaled.Runtime, a: AsOfArgs) -> Answer:
    if (a.position is None) == (a.at_time is None):
        raise ToolError("position", "give exactly one of position and at_time")
    at = None if a.at_time is None else _time(a.at_time, "at_time")
    if a.position is not None:
        _position(rt, a.position)
    view = rt.memory.as_of(position=a.position, at=at)
    facts = view.all() if a.query is None else view.search(a.query, limit=a.limit)
    shown = render.MemoryAsOf(position=view.position, at=at, query=a.query, facts=facts)
    return shown, shown


def _runs_list(rt: journaled.Runtime, a: RunsListArgs) -> Answer:
    since = None if a.since is None else _time(a.since, "since")
    rows = [row.as_dict() for row in rt.runs.list(status=a.status, since=since, limit=a.limit)]
    return rows, {"runs": rows}


def _runs_why(rt: journaled.Runtime, a: RunArgs) -> Answer:
    why = render.RunWhy(run_id=a.run_id, why=rt.runs.why(a.run_id))
    return why, why


def _runs_at(rt: journaled.Runtime, a: RunAtArgs) -> Answer:
    if a.position is not None and a.at_time is not None:
        raise ToolError("position", "give at most one of position and at_time")
    if a.at_time is not None:
        at = _time(a.at_time, "at_time")
        try:
            position = render.position_at_time(rt, a.run_id, at)
        except RunNotFound:
            raise
        except ValueError as exc:
            raise ToolError("at_time", str(exc)) from None
    else:
        end = rt.journal.position()
        position = end if a.position is None else _position(rt, a.position)
    view = render.run_view(rt, a.run_id, position)
    return view, view


def _runs_stale(rt: journaled.Runtime, a: StaleArgs) -> Answer:
    found = rt.runs.stale(a.run_id)
    return found, StaleSteps(stale=found)


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "memory_remember",
        "Remember a fact (secrets redacted first); a conflict_key supersedes older facts with "
        "that key in the same append. Returns the stored fact. Same JSON as "
        "`journaled memory remember --json`.",
        RememberArgs,
        Fact,
        _remember,
        read_only=False,
        blame="text",
    ),
    ToolSpec(
        "memory_search",
        "Search the facts valid now by BM25, best first: {facts: [Fact]}. Superseded, expired "
        "and not-yet-valid facts are left out.",
        SearchArgs,
        Facts,
        _search,
        blame="query",
    ),
    ToolSpec(
        "memory_why",
        "Explain a fact's life from its events: remembered, superseded (by what, which key, "
        "when), restored, deleted, purged, and the steps that read it: {fact_id, why}.",
        FactArgs,
        render.FactWhy,
        _why,
        blame="fact_id",
    ),
    ToolSpec(
        "memory_history",
        "List a fact's events, oldest first, each with its journal position: {fact_id, events: "
        "[{position, stream, version, data: {type, at, ...}}]}.",
        FactArgs,
        History,
        _history,
        blame="fact_id",
    ),
    ToolSpec(
        "memory_as_of",
        "View the memory store as it was at a journal position or a time: every fact stored "
        "then, or a search as it would have answered then: {position, at, query, facts}.",
        AsOfArgs,
        render.MemoryAsOf,
        _as_of,
        blame="position",
    ),
    ToolSpec(
        "runs_list",
        "List runs and orchestrations at a glance, oldest first: {runs: [{run_id, status, goal, "
        "started_at, last_event, steps_done, steps_total, calls_used, ...}]}.",
        RunsListArgs,
        RunsResult,
        _runs_list,
        blame="status",
    ),
    ToolSpec(
        "runs_why",
        "Explain from its events why a run is in its state: which wave stopped for budget, "
        "which step waits and for what, which step failed with what error: {run_id, why}.",
        RunArgs,
        render.RunWhy,
        _runs_why,
        blame="run_id",
    ),
    ToolSpec(
        "runs_at",
        "Rebuild a run as it was at a journal position or a time (default: now): plan with "
        "step statuses, observations, calls used, waiting steps, budget stop, waves.",
        RunAtArgs,
        render.RunView,
        _runs_at,
        blame="position",
    ),
    ToolSpec(
        "runs_stale",
        "List steps whose read facts were since superseded, deleted, purged or expired: "
        "{stale: [{run_id, step_id, fact_id, change, position, replacement}]}.",
        StaleArgs,
        StaleSteps,
        _runs_stale,
        blame="run_id",
    ),
)


# -- schemas ---------------------------------------------------------------------------------------


def object_schema(struct: Any) -> dict[str, Any]:
    """Return a Struct's JSON Schema with the object itself at the root (MCP needs ``object``)."""
    defs = msgspec.json.schema_components([struct], ref_template="#/$defs/{name}")[1]
    name = struct.__name__
    root = dict(defs[name])
    root.pop("title", None)
    root.pop("description", None)  # the tool's own description says it
    others = {k: v for k, v in defs.items() if k != name}
    if others:
        root["$defs"] = others
    return root


# -- calls -----------------------------------------------------------------------------------------

_AT_FIELD = re.compile(r"at `\$\.([A-Za-z_]+)")
_NAMED_FIELD = re.compile(r"field `([A-Za-z_]+)`")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _lone_surrogate(value: object) -> str | None:
    """Return the first lone UTF-16 surrogate in a JSON value's strings, escaped, or None."""
    stack = [value]
    while stack:  # no recursion: a client decides how deep the value nests
        item = stack.pop()
        if isinstance(item, str):
            found = _SURROGATE.search(item)
            if found is not None:
                return f"\\u{ord(found.group()):04x} at character {found.start()}"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def parse_args(spec: ToolSpec, arguments: dict[str, Any] | None) -> Any:
    """Validate a call's arguments against the tool's Struct.

    Raises:
        ToolError: naming the argument and what is wrong with it.
    """
    for name, value in (arguments or {}).items():
        # JSON may spell a lone surrogate ("\\ud800"); UTF-8, and so the journal, cannot hold it.
        where = _lone_surrogate([name, value])
        if where is not None:
            raise ToolError(
                ascii(name)[1:-1],
                f"holds a lone UTF-16 surrogate ({where}), which UTF-8 cannot encode: "
                "send valid Unicode text",
            )
    try:
        return msgspec.convert(arguments or {}, spec.args)
    except msgspec.ValidationError as exc:
        text = str(exc)
        found = _AT_FIELD.search(text) or _NAMED_FIELD.search(text)
        if found is None:
            raise ToolError("arguments", f"must be an object: {text}") from None
        argument = found.group(1)
        fields = spec.args.__struct_fields__
        if text.startswith("Object missing required field"):
            raise ToolError(argument, "is missing (it is required)") from None
        if text.startswith("Object contains unknown field"):
            raise ToolError(
                argument, f"no such argument: {spec.name} takes {', '.join(fields)}"
            ) from None
        problem = text.split(" - at `", 1)[0]
        problem = problem[0].lower() + problem[1:]
        allowed = object_schema(spec.args)["properties"].get(argument, {})
        choices = [c["enum"] for c in allowed.get("anyOf", [allowed]) if "enum" in c]
        if choices:
            problem += f"; use one of {', '.join(choices[0])}"
        raise ToolError(argument, problem) from None


def answer(rt: journaled.Runtime, spec: ToolSpec, arguments: dict[str, Any] | None) -> Answer:
    """Answer one call in this thread: the (CLI, structured) pair, or raise ToolError."""
    args = parse_args(spec, arguments)
    try:
        return spec.answer(rt, args)
    except ToolError:
        raise
    except RunNotFound as exc:
        raise ToolError("run_id", str(exc)) from None
    except InvalidFact as exc:
        said = str(exc).removeprefix("cannot remember this fact: ").removeprefix(f"{exc.field} ")
        raise ToolError(exc.field, said) from None
    except InvalidArgument as exc:
        raise ToolError(exc.field, exc.problem) from None
    except EventsError:
        raise  # a journal that cannot be read is no argument's fault
    except (ValueError, KeyError) as exc:
        message = render.error_message(exc)
        raise ToolError(spec.blame or "arguments", message) from None
