"""AutoGen Core and journaled (SPEC X1, ADR 0041): ``pip install 'journaled[autogen]'``.

Two directions:

- :class:`JournaledMemory` is an ``autogen_core.memory.Memory`` over ``rt.memory`` and one scope:
  what an AutoGen agent adds is a journaled fact (redacted, superseded by conflict key, explained
  by ``why``), what it queries is ranked by BM25 or, when the runtime has an embedder, by meaning.
- :func:`register_autogen_agent` makes an agent hosted on an AutoGen runtime a journaled agent
  step: the step sends it a :class:`StepMessage`, its reply is the step's output, the model
  requests it reports are charged as calls, and a question it asks leaves the step waiting for
  an answer (E10).

Both work with a runtime from :func:`journaled.open` or from :func:`journaled.aio.open`; neither
blocks the event loop (the sync runtime's calls run in a thread).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self, cast

try:
    from autogen_core import AgentId, AgentRuntime, CancellationToken, Component
    from autogen_core.memory import (
        Memory,
        MemoryContent,
        MemoryMimeType,
        MemoryQueryResult,
        UpdateContextResult,
    )
    from autogen_core.model_context import ChatCompletionContext
    from autogen_core.models import RequestUsage, SystemMessage
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "journaled.integrations.autogen needs autogen-core: pip install 'journaled[autogen]'"
    ) from exc
from pydantic import BaseModel, ConfigDict

from journaled.actors.steps import AgentContext, NeedsInput
from journaled.aio import AsyncRuntime
from journaled.errors import ConfigurationError, InvalidArgument
from journaled.events.inputs import MAX_TEXT_BYTES, int_problem, short, text_problem
from journaled.events.memory import Fact, physical_scope
from journaled.events.plans import AgentResult, Step
from journaled.runtime import Runtime
from journaled.runtime import open as open_runtime

__all__ = [
    "HELD_MIME_TYPES",
    "LOOP_POLL",
    "RESULT_FIELDS",
    "AutoGenStopped",
    "JournaledMemory",
    "JournaledMemoryConfig",
    "StepMessage",
    "StepReply",
    "register_autogen_agent",
]

HELD_MIME_TYPES: tuple[str, ...] = (
    MemoryMimeType.TEXT.value,
    MemoryMimeType.MARKDOWN.value,
    MemoryMimeType.JSON.value,
)
"""The mime types a :class:`JournaledMemory` holds: a fact is text."""

FACT_FIELDS: tuple[str, ...] = (
    "domain",
    "confidence",
    "conflict_key",
    "source",
    "valid_from",
    "valid_until",
)
"""Metadata keys of a ``MemoryContent`` that become the fact's own fields (M2, M3, M5)."""

RESULT_FIELDS: tuple[str, ...] = ("id", "scope", "score", "ranking", "created_at")
"""Metadata keys ``query`` sets on each result besides :data:`FACT_FIELDS`; ``add`` refuses them."""

_ENVELOPE = "journaled.autogen"
"""Marks a fact source that also keeps a content's mime type and other metadata."""


# -- memory ----------------------------------------------------------------------------------


class JournaledMemoryConfig(BaseModel):
    """The component configuration of a :class:`JournaledMemory` (``dump_component``).

    Strict: a hand-edited config with a value of the wrong type (``limit: "5"``, ``semantic: 1``)
    or an unknown key (a typo) is refused naming it, instead of being coerced or ignored.
    """

    model_config = ConfigDict(strict=True, extra="forbid")

    url: str | None = None
    """The journal URL; None: ``$JOURNALED_URL``, then the embedded journal (J4)."""
    scope: str = "project"
    name: str | None = None
    domain: str | None = None
    source: str = "autogen"
    limit: int = 5
    min_confidence: float = 0.0
    semantic: bool = True


class _MemoryCalls:
    """``rt.memory`` of a sync or an asyncio runtime, awaited without blocking the loop."""

    def __init__(self, rt: Runtime | AsyncRuntime) -> None:
        if isinstance(rt, AsyncRuntime):
            self._aio: Any = rt.memory
            self._sync: Any = None
        elif isinstance(rt, Runtime):
            self._aio = None
            self._sync = rt.memory
        else:
            raise InvalidArgument(
                "rt",
                f"must be a runtime from journaled.open() or journaled.aio.open(), got "
                f"{type(rt).__name__}",
            )

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self._aio is not None:
            return await getattr(self._aio, name)(*args, **kwargs)
        # The sync runtime's calls wait on actors: a thread waits, never the loop.
        return await asyncio.to_thread(getattr(self._sync, name), *args, **kwargs)


class JournaledMemory(Memory, Component[JournaledMemoryConfig]):
    """An AutoGen Core memory whose entries are journaled facts of one scope (X1).

    Args:
        rt: a runtime from :func:`journaled.open` or :func:`journaled.aio.open`; it stays the
            caller's to close.
        scope: the logical scope (M1) facts are remembered into and searched in.
        name: the memory's name (default ``journaled:<scope>``).
        domain: the domain of added facts, unless a content's metadata names one.
        source: the provenance of added facts, unless a content's metadata names one.
        limit: how many facts a query returns by default.
        min_confidence: facts below this confidence are not returned (M5).
        semantic: rank by meaning when the runtime has an embedder (M7); BM25 otherwise (M6).

    ``add`` holds text, markdown and JSON (:data:`HELD_MIME_TYPES`); a content's metadata keys
    in :data:`FACT_FIELDS` become the fact's fields, the others are kept with the fact and come
    back in query results' metadata. ``query`` results carry the fact's id, scope, fields, its
    ``score`` and the ``ranking`` that produced it ("bm25" or "semantic") in their metadata.
    ``clear`` deletes every fact of the scope through ``rt.memory.delete`` (M8), so ``why`` and
    ``history`` explain each one.
    """

    component_type = "memory"
    component_config_schema = JournaledMemoryConfig
    component_provider_override = "journaled.integrations.autogen.JournaledMemory"
    component_description: ClassVar[str | None] = "Journaled facts of one scope as AutoGen memory."

    def __init__(
        self,
        rt: Runtime | AsyncRuntime,
        scope: str = "project",
        *,
        name: str | None = None,
        domain: str | None = None,
        source: str = "autogen",
        limit: int = 5,
        min_confidence: float = 0.0,
        semantic: bool = True,
    ) -> None:
        problem = _settings_problem(
            scope=scope,
            name=name,
            domain=domain,
            source=source,
            limit=limit,
            min_confidence=min_confidence,
            semantic=semantic,
        )
        if problem is not None:
            raise InvalidArgument(*problem)
        self._memory = _MemoryCalls(rt)
        if _is_closed(rt):
            raise InvalidArgument(
                "rt", "is a closed runtime: open one with journaled.open() or journaled.aio.open()"
            )
        if physical_scope(scope) == "organization" and rt.organization is None:
            raise InvalidArgument(
                "scope",
                "'organization' needs an organization: pass organization=\"acme\" to "
                "journaled.open() or set JOURNALED_ORGANIZATION (M1)",
            )
        self._rt = rt
        self._scope = scope
        self._name = name or f"journaled:{scope}"
        self._domain = domain
        self._source = source
        self._limit = limit
        self._min_confidence = min_confidence
        self._semantic = semantic
        self._owns_runtime = False
        self._closed = False

    @property
    def name(self) -> str:
        """Return the memory's name."""
        return self._name

    @property
    def scope(self) -> str:
        """Return the logical scope this memory remembers into and searches in."""
        return self._scope

    async def add(
        self, content: MemoryContent, cancellation_token: CancellationToken | None = None
    ) -> None:
        """Remember a content as a fact of this scope (M2); supersedes by conflict key (M3).

        Raises:
            InvalidArgument: a mime type the memory cannot hold (an image, binary data), content
                that does not match its mime type, or metadata that cannot be stored.
            InvalidFact: the fact itself cannot be stored (empty text, bad confidence, ...).
        """
        self._check_open()
        _check_cancelled(cancellation_token)
        mime = _mime(content.mime_type)
        if mime not in HELD_MIME_TYPES:
            raise InvalidArgument(
                "mime_type",
                f"{mime!r} cannot be held by JournaledMemory, which holds "
                f"{', '.join(HELD_MIME_TYPES)}: remember a text that describes it instead",
            )
        text = _content_text(content.content, mime)
        metadata = dict(content.metadata or {})
        for key in metadata:
            if not isinstance(key, str):
                raise InvalidArgument(
                    "metadata", f"keys must be strings, got {type(key).__name__} {short(key)}"
                )
            if key in RESULT_FIELDS:
                raise InvalidArgument(
                    f"metadata[{key!r}]",
                    "is set by query on every result (one of "
                    f"{', '.join(RESULT_FIELDS)}): rename the key",
                )
        fields = {key: metadata.pop(key) for key in FACT_FIELDS if key in metadata}
        provenance = fields.pop("source", self._source)
        await self._memory.call(
            "remember",
            text,
            scope=self._scope,
            domain=fields.get("domain", self._domain),
            confidence=fields.get("confidence"),
            conflict_key=fields.get("conflict_key"),
            source=_pack_source(provenance, mime, metadata),
            valid_from=fields.get("valid_from"),
            valid_until=fields.get("valid_until"),
        )

    async def query(
        self,
        query: str | MemoryContent,
        cancellation_token: CancellationToken | None = None,
        **kwargs: Any,
    ) -> MemoryQueryResult:
        """Return this scope's facts relevant to ``query``, best first, scores in the metadata.

        Keyword arguments: ``limit``, ``min_confidence``, ``domains`` (a list of names) and
        ``semantic`` override the memory's settings for this query. An empty or
        all-punctuation query finds nothing (M6).
        """
        self._check_open()
        _check_cancelled(cancellation_token)
        text: str
        if isinstance(query, str):
            text = query
        elif isinstance(query, MemoryContent):
            text = _content_text(query.content, _mime(query.mime_type))
        else:
            raise InvalidArgument(
                "query", f"must be a str or a MemoryContent, got {type(query).__name__}"
            )
        unknown = set(kwargs) - {"limit", "min_confidence", "domains", "semantic"}
        if unknown:
            problem = "is not a query option: use limit, min_confidence, domains or semantic"
            raise InvalidArgument(sorted(unknown)[0], problem)
        checks = {
            "limit": _limit_problem,
            "min_confidence": _confidence_problem,
            "semantic": _bool_problem,
        }
        for option, check in checks.items():
            bad = check(kwargs[option]) if option in kwargs else None
            if bad:
                raise InvalidArgument(option, bad)
        if not text.strip():
            return MemoryQueryResult(results=[])
        hits, ranking = await self._memory.call(
            "search_scored",
            text,
            scopes=[self._scope],
            domains=kwargs.get("domains"),
            min_confidence=kwargs.get("min_confidence", self._min_confidence),
            limit=kwargs.get("limit", self._limit),
            semantic=kwargs.get("semantic", self._semantic),
        )
        return MemoryQueryResult(
            results=[_as_content(fact, score, ranking) for score, fact in hits]
        )

    async def update_context(self, model_context: ChatCompletionContext) -> UpdateContextResult:
        """Add the facts relevant to the last message to ``model_context`` as a SystemMessage.

        As AutoGen's own memories do: the last message's text is the query (its first
        ``MAX_TEXT_BYTES``, lone surrogates replaced); when facts are found, one
        ``SystemMessage`` listing them (best first) is appended. Nothing is added when there is
        no message, no text in the last one, or no relevant fact.
        """
        self._check_open()
        if not isinstance(model_context, ChatCompletionContext):
            got = type(model_context).__name__
            raise InvalidArgument(
                "model_context", f"must be an autogen_core ChatCompletionContext, got {got}"
            )
        messages = await model_context.get_messages()
        text = _searchable(_message_text(messages[-1])) if messages else ""
        if not text.strip():
            return UpdateContextResult(memories=MemoryQueryResult(results=[]))
        found = await self.query(text)
        if found.results:
            lines = [f"{i}. {_shown(item.content)}" for i, item in enumerate(found.results, 1)]
            memory_context = "\nRelevant memory content (most relevant first):\n"
            await model_context.add_message(
                SystemMessage(content=memory_context + "\n".join(lines) + "\n")
            )
        return UpdateContextResult(memories=found)

    async def clear(self) -> None:
        """Delete every fact of this scope through ``rt.memory.delete`` (M8): each is journaled."""
        self._check_open()
        facts: list[Fact] = await self._memory.call("all")
        for fact in facts:
            if fact.scope == self._scope:
                await self._memory.call("delete", fact.id)

    async def close(self) -> None:
        """Stop using the runtime; it is closed too only when this memory opened it (config)."""
        if self._closed:
            return
        self._closed = True
        if self._owns_runtime:
            await _close(self._rt)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"memory {self._name!r} is closed: make a new JournaledMemory")

    def _to_config(self) -> JournaledMemoryConfig:
        url = self._rt.journal.url
        if url.startswith("memory://"):
            raise ConfigurationError(
                "an in-memory journal (memory://) lives in one process and cannot be written "
                "into a component config: open the runtime on a SQLite or PostgreSQL URL"
            )
        return JournaledMemoryConfig(
            url=url,
            scope=self._scope,
            name=self._name,
            domain=self._domain,
            source=self._source,
            limit=self._limit,
            min_confidence=self._min_confidence,
            semantic=self._semantic,
        )

    @classmethod
    def _from_config(cls, config: JournaledMemoryConfig) -> Self:
        """Open the configured journal; the memory owns that runtime and closes it in close()."""
        if config.url is not None and "***" in config.url:
            raise ConfigurationError(
                "url has its password masked (***): give the full URL in the config, or leave "
                "url empty and set JOURNALED_URL"
            )
        problem = _settings_problem(
            scope=config.scope,
            name=config.name,
            domain=config.domain,
            source=config.source,
            limit=config.limit,
            min_confidence=config.min_confidence,
            semantic=config.semantic,
        )
        if problem is not None:  # refused before a journal is opened (or a file made)
            arg, why = problem
            raise ConfigurationError(f"the JournaledMemory config's {arg} {why}")
        rt = open_runtime(config.url)
        try:
            memory = cls(
                rt,
                config.scope,
                name=config.name,
                domain=config.domain,
                source=config.source,
                limit=config.limit,
                min_confidence=config.min_confidence,
                semantic=config.semantic,
            )
        except InvalidArgument as exc:  # e.g. an organization scope the journal has none for
            rt.close()
            raise ConfigurationError(f"the JournaledMemory config's {exc}") from None
        memory._owns_runtime = True
        return memory


_NAME_BYTES = 1024
"""UTF-8 bytes a scope or a domain may hold: the bound ``remember`` applies to them (M2)."""

_SOURCE_BYTES = 64 * 1024
"""UTF-8 bytes a fact's source may hold (M2)."""


def _settings_problem(
    *,
    scope: object,
    name: object,
    domain: object,
    source: object,
    limit: object,
    min_confidence: object,
    semantic: object,
) -> tuple[str, str] | None:
    """Return (argument, problem) for the first unusable setting of a memory, or None."""
    checks: list[tuple[str, str | None]] = [
        ("scope", _name_problem(scope, _NAME_BYTES)),
        ("name", None if name is None else _name_problem(name, _NAME_BYTES)),
        ("domain", None if domain is None else _name_problem(domain, _NAME_BYTES)),
        ("source", _name_problem(source, _SOURCE_BYTES)),
        ("limit", _limit_problem(limit)),
        ("min_confidence", _confidence_problem(min_confidence)),
        ("semantic", _bool_problem(semantic)),
    ]
    return next(((arg, problem) for arg, problem in checks if problem), None)


def _name_problem(value: object, limit: int) -> str | None:
    if not isinstance(value, str):
        return f"must be a non-empty string, got {type(value).__name__} {short(value)}"
    problem = text_problem(value, limit=limit, empty=False)
    if problem is None and "\x00" in value:
        # Scopes and domains name streams, which PostgreSQL keeps as text (M2's rule).
        problem = f"holds a NUL character at index {value.index(chr(0))}"
    return problem


def _limit_problem(value: object) -> str | None:
    return int_problem(value, low=1, unit="a positive int")


def _confidence_problem(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number in [0, 1], got {type(value).__name__} {short(value)}"
    if math.isnan(value) or not 0 <= value <= 1:
        return f"is {value!r}, outside [0, 1]: confidences are clamped into it (M2)"
    return None


def _bool_problem(value: object) -> str | None:
    if isinstance(value, bool):
        return None
    return f"must be True or False, got {type(value).__name__} {short(value)}"


def _is_closed(rt: Runtime | AsyncRuntime) -> bool:
    """Tell whether a runtime is closing or closed (it serves nothing any more)."""
    return bool(rt.runs.closing)


async def _close(rt: Runtime | AsyncRuntime) -> None:
    if isinstance(rt, AsyncRuntime):
        await rt.close()
    else:
        await asyncio.to_thread(rt.close)


def _check_cancelled(token: CancellationToken | None) -> None:
    if token is not None and token.is_cancelled():
        raise asyncio.CancelledError("the operation's cancellation token was cancelled")


def _mime(mime_type: MemoryMimeType | str) -> str:
    return mime_type.value if isinstance(mime_type, MemoryMimeType) else str(mime_type)


def _content_text(content: object, mime: str) -> str:
    """Return a content's text; JSON content is kept as compact, key-sorted JSON."""
    if mime == MemoryMimeType.JSON.value:
        if isinstance(content, str):
            try:
                json.loads(content)
            except ValueError as exc:
                raise InvalidArgument("content", f"is not JSON ({exc})") from None
            return content
        try:
            return json.dumps(content, ensure_ascii=False, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument("content", f"cannot be written as JSON: {exc}") from None
    if not isinstance(content, str):
        raise InvalidArgument(
            "content", f"must be a str for mime type {mime!r}, got {type(content).__name__}"
        )
    return content


def _pack_source(provenance: object, mime: str, extra: Mapping[str, Any]) -> str | None:
    """Return the fact's source; a non-plain mime type and other metadata are kept in it.

    The source is redacted like the text (M9) and shown by ``why``, so what is kept beside a
    fact stays as safe and as visible as the fact.
    """
    if provenance is not None and not isinstance(provenance, str):
        raise InvalidArgument(
            "metadata['source']", f"must be a string, got {type(provenance).__name__}"
        )
    if mime == MemoryMimeType.TEXT.value and not extra:
        return provenance
    envelope = {_ENVELOPE: 1, "source": provenance, "mime_type": mime, "metadata": dict(extra)}
    try:
        return json.dumps(envelope, ensure_ascii=False, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        key = next((k for k, v in extra.items() if not _jsonable(v)), "?")
        raise InvalidArgument(f"metadata[{key!r}]", f"cannot be kept: {exc}") from None


def _jsonable(value: object) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _unpack_source(source: str | None) -> tuple[str | None, str, dict[str, Any]]:
    """Return (provenance, mime type, other metadata) of a fact's source."""
    plain = MemoryMimeType.TEXT.value
    if source is None or not source.startswith("{"):
        return source, plain, {}
    try:
        envelope = json.loads(source)
    except ValueError:
        return source, plain, {}
    if not isinstance(envelope, dict) or envelope.get(_ENVELOPE) != 1:
        return source, plain, {}
    metadata = envelope.get("metadata")
    return (
        envelope.get("source"),
        str(envelope.get("mime_type", plain)),
        metadata if isinstance(metadata, dict) else {},
    )


def _as_content(fact: Fact, score: float, ranking: str) -> MemoryContent:
    provenance, mime, extra = _unpack_source(fact.source)
    content: Any = fact.text
    if mime == MemoryMimeType.JSON.value:
        try:
            content = json.loads(fact.text)
        except ValueError:  # redaction (M9) may have cut it: the text is still the fact
            mime = MemoryMimeType.TEXT.value
    known = {
        "id": fact.id,
        "scope": fact.scope,
        "score": score,
        "ranking": ranking,
        "confidence": fact.confidence,
        "created_at": fact.created_at,
        "domain": fact.domain,
        "conflict_key": fact.conflict_key,
        "source": provenance,
        "valid_from": fact.valid_from,
        "valid_until": fact.valid_until,
    }
    # Keys query sets are the fact's, whatever an old envelope kept under those names.
    kept = {k: v for k, v in extra.items() if k not in known}
    metadata = {**kept, **{k: v for k, v in known.items() if v is not None}}
    return MemoryContent(content=content, mime_type=mime, metadata=metadata)


def _searchable(text: str) -> str:
    """Return a message's text as a query can take it: its first MAX_TEXT_BYTES, valid UTF-8.

    A model context's last message may be a long tool output, or hold a lone surrogate: it
    still finds what its text is about rather than failing the agent's turn.
    """
    raw = text.encode("utf-8", "replace")
    if len(raw) <= MAX_TEXT_BYTES and raw.decode("utf-8") == text:
        return text
    return raw[:MAX_TEXT_BYTES].decode("utf-8", "ignore")


def _shown(content: object) -> str:
    """Return a query result's content as the model should read it (JSON as JSON)."""
    if isinstance(content, str):
        return content
    return json.dumps(content, ensure_ascii=False, sort_keys=True, default=str)


def _message_text(message: object) -> str:
    """Return the text of a model-context message (its string parts, for multimodal content)."""
    content = getattr(message, "content", None)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part for part in content if isinstance(part, str))
    return ""


# -- agents ----------------------------------------------------------------------------------


@dataclass
class StepMessage:
    """What a journaled agent step sends its AutoGen agent (unless ``message=`` says otherwise).

    Handle it in a ``RoutedAgent`` with ``@message_handler`` and answer with a
    :class:`StepReply`, a ``journaled.AgentResult``, or any journalable value (the output).
    """

    task: Any
    """The step's input."""
    run_id: str
    step_id: str
    attempt: int
    """1 for the first execution, higher when the step runs again (after an answer, a crash)."""
    answer: str | None = None
    """The human answer given on resume, after the agent asked a question (E10)."""
    reservation: int | None = None
    """Model calls reserved for this step (E6); None: unbounded."""


@dataclass
class StepReply:
    """An AutoGen agent's answer to a :class:`StepMessage`.

    ``usage`` lists one ``RequestUsage`` per model request the agent made: the step is charged
    that many calls (E8), and the token counts are journaled in the observation's ``data``.
    ``needs_input`` asks a human: the step waits for an answer (E10). ``error`` fails the step.
    """

    output: Any = None
    usage: list[RequestUsage] = field(default_factory=list)
    needs_input: str | None = None
    error: str | None = None


MessageFactory = Callable[[Step, AgentContext], Any]
ReplyReader = Callable[[Any], AgentResult | Awaitable[AgentResult]]

LOOP_POLL = 0.1
"""Seconds between two looks at another thread's AutoGen loop while a step waits on it: a
stopped or closed loop runs no callback, so only looking tells."""


class AutoGenStopped(RuntimeError):
    """The AutoGen runtime or its event loop stopped before an agent step got its reply."""


def register_autogen_agent(
    rt: Runtime | AsyncRuntime,
    name: str,
    *,
    runtime: AgentRuntime,
    agent_type: str,
    key: str | Callable[[Step, AgentContext], str] = "default",
    loop: asyncio.AbstractEventLoop | None = None,
    message: MessageFactory | None = None,
    reply: ReplyReader | None = None,
) -> None:
    """Register an agent hosted on an AutoGen runtime as journaled agent ``name`` (X1, E9).

    A plan's step ``Step(id, agent=name, input=...)`` sends the AutoGen agent
    ``AgentId(agent_type, key)`` a :class:`StepMessage` (or ``message(step, ctx)``) on
    ``runtime``; the reply becomes the step's observation (see :class:`StepReply`; ``reply(r)``
    reads other reply types). The agent may also raise ``journaled.NeedsInput(question)`` to
    wait for an answer. Cancelling the run cancels the message's ``CancellationToken``. If the
    AutoGen runtime is stopped, or its event loop stops or closes, before the reply comes, the
    step fails at once with :class:`AutoGenStopped` naming the agent and what stopped.

    Args:
        rt: the journaled runtime (sync or asyncio) whose plans use the agent.
        name: the agent's name in plans.
        runtime: the AutoGen runtime hosting the agent; it must be started.
        agent_type: the AutoGen agent type registered on ``runtime``.
        key: the agent key, or ``key(step, ctx)`` returning one (e.g. one agent per run).
        loop: the event loop ``runtime`` runs on; default: the loop of a started
            ``SingleThreadedAgentRuntime``, else the loop running when this is called, else the
            loop the step runs on. Give it when a sync journaled runtime drives an AutoGen
            runtime of another kind running in another thread.
        message: builds the message sent for a step (a function or a coroutine function).
        reply: turns the agent's reply into an ``AgentResult`` (a function or a coroutine
            function).

    Raises:
        InvalidArgument: an argument that cannot be used, named.
    """
    if not isinstance(rt, Runtime | AsyncRuntime):
        raise InvalidArgument(
            "rt",
            "must be a runtime from journaled.open() or journaled.aio.open(), got "
            f"{type(rt).__name__}",
        )
    if not isinstance(runtime, AgentRuntime):
        raise InvalidArgument(
            "runtime",
            "must be an autogen_core AgentRuntime (e.g. a SingleThreadedAgentRuntime), got "
            f"{type(runtime).__name__}",
        )
    if not isinstance(agent_type, str) or not _is_agent_type(agent_type):
        raise InvalidArgument(
            "agent_type",
            f"must be an AutoGen agent type (letters, digits, _, - and .), got {short(agent_type)}",
        )
    if not callable(key) and (problem := _key_problem(key)):
        raise InvalidArgument("key", f"must be a non-empty string or a function, {problem}")
    for arg, value in (("message", message), ("reply", reply)):
        if value is not None and not callable(value):
            raise InvalidArgument(
                arg, f"must be a function (or None), got {type(value).__name__} {short(value)}"
            )
    if loop is not None and not isinstance(loop, asyncio.AbstractEventLoop):
        raise InvalidArgument("loop", f"must be an asyncio event loop, got {type(loop).__name__}")
    if loop is not None and loop.is_closed():
        raise InvalidArgument("loop", "is closed: give the loop the AutoGen runtime runs on")
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
    home = loop
    build = message or _step_message
    read = reply or _read_reply

    async def run_step(step: Step, ctx: AgentContext) -> AgentResult:
        here = asyncio.get_running_loop()
        target = _runtime_loop(runtime) or home or here
        recipient = AgentId(agent_type, _agent_key(key, step, ctx))
        outgoing = build(step, ctx)
        if inspect.isawaitable(outgoing):
            outgoing = await outgoing
        try:
            if target is here:
                answer = await _exchange(runtime, outgoing, recipient)
            else:
                answer = await _exchange_across(runtime, outgoing, recipient, target)
        except (NeedsInput, AutoGenStopped):
            raise
        except Exception as exc:
            raise RuntimeError(f"AutoGen agent {recipient} failed: {exc}") from exc
        result = read(answer)
        if inspect.isawaitable(result):
            result = await result
        return result

    rt.register_agent(name, run_step)


def _is_agent_type(value: str) -> bool:
    try:
        AgentId(value, "default")  # it checks the type AutoGen accepts
    except ValueError:
        return False
    return True


def _key_problem(value: object) -> str | None:
    if isinstance(value, str) and value:
        return None
    return f"got {type(value).__name__} {short(value)}"


def _agent_key(
    key: str | Callable[[Step, AgentContext], str], step: Step, ctx: AgentContext
) -> str:
    if not callable(key):
        return key
    made = key(step, ctx)
    problem = _key_problem(made)
    if problem:
        raise InvalidArgument("key", f"function must return a non-empty string, {problem}")
    return made


def _runtime_loop(runtime: AgentRuntime) -> asyncio.AbstractEventLoop | None:
    """Return the loop a started ``SingleThreadedAgentRuntime`` runs on, or None."""
    task = getattr(getattr(runtime, "_run_context", None), "_run_task", None)
    return task.get_loop() if isinstance(task, asyncio.Future) else None


async def _exchange(runtime: AgentRuntime, outgoing: Any, recipient: AgentId) -> Any:
    """Send ``outgoing`` on the AutoGen runtime's own loop; fail if the runtime stops first."""
    # A message sent to a SingleThreadedAgentRuntime that is not running waits forever (its
    # queue is read by nobody): fail instead, and watch the task that reads it while waiting.
    # No public attribute tells; these are pinned by the autogen-core version range of the extra.
    context = getattr(runtime, "_run_context", True)
    if context is None:
        raise AutoGenStopped(
            f"the AutoGen runtime hosting {recipient.type!r} is not started (or was stopped): "
            "call runtime.start() before running plans that use it"
        )
    reader = getattr(context, "_run_task", None)
    token = CancellationToken()
    sending = asyncio.ensure_future(
        runtime.send_message(outgoing, recipient, cancellation_token=token)
    )
    sending.add_done_callback(_retrieve)
    if not isinstance(reader, asyncio.Future):  # another kind of AgentRuntime: its own rules
        try:
            return await sending
        except asyncio.CancelledError:
            token.cancel()
            raise
    stopped: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_stop(_: object) -> None:
        if not stopped.done():
            stopped.set_result(None)

    reader.add_done_callback(on_stop)
    try:
        await asyncio.wait({sending, stopped}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        # The handler hears it through MessageContext.cancellation_token.
        token.cancel()
        sending.cancel()
        raise
    finally:
        reader.remove_done_callback(on_stop)
    if sending.done():
        return sending.result()
    token.cancel()
    sending.cancel()
    raise AutoGenStopped(
        f"the AutoGen runtime hosting {recipient.type!r} {_how_it_ended(reader)} while the "
        f"message to {recipient} was in flight: no reply will come (start it again and resume "
        "the run)"
    )


def _how_it_ended(reader: asyncio.Future[Any]) -> str:
    if reader.cancelled():
        return "had its message loop cancelled"
    error = reader.exception()
    if error is not None:
        return f"stopped on an error ({type(error).__name__}: {error})"
    return "was stopped"


async def _exchange_across(
    runtime: AgentRuntime, outgoing: Any, recipient: AgentId, home: asyncio.AbstractEventLoop
) -> Any:
    """Exchange on ``home``, another thread's loop, and fail if that loop stops or closes."""
    if (state := _loop_down(home)) is not None:
        raise AutoGenStopped(
            f"the event loop of the AutoGen runtime hosting {recipient.type!r} is {state}: "
            "the message was not sent"
        )
    exchange = _exchange(runtime, outgoing, recipient)
    try:
        future = asyncio.run_coroutine_threadsafe(exchange, home)
    except RuntimeError:  # closed since the look above: never scheduled, not left un-awaited
        exchange.close()
        raise AutoGenStopped(
            f"the event loop of the AutoGen runtime hosting {recipient.type!r} is closed: "
            "the message was not sent"
        ) from None
    waiting = asyncio.wrap_future(future)
    try:
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=LOOP_POLL)
            if done:
                return waiting.result()
            if (state := _loop_down(home)) is not None:
                _cancel_on(home, future)
                raise AutoGenStopped(
                    f"the event loop of the AutoGen runtime hosting {recipient.type!r} is "
                    f"{state} while the message to {recipient} was in flight: no reply will "
                    "come"
                )
    except asyncio.CancelledError:
        _cancel_on(home, future)  # its task cancels the message's token on its own loop
        raise


def _loop_down(loop: asyncio.AbstractEventLoop) -> str | None:
    """Return "closed" or "stopped" for a loop that runs nothing, else None."""
    if loop.is_closed():
        return "closed"
    if not loop.is_running():
        return "stopped"
    return None


def _cancel_on(loop: asyncio.AbstractEventLoop, future: Future[Any]) -> None:
    # Cancelling schedules the task's cancel on its loop: impossible once that loop is closed.
    if not loop.is_closed():
        future.cancel()


def _retrieve(task: asyncio.Future[Any]) -> None:
    # A reply failing after the step stopped waiting is not "never retrieved": it was let go.
    if not task.cancelled():
        task.exception()


def _step_message(step: Step, ctx: AgentContext) -> StepMessage:
    return StepMessage(
        task=step.input,
        run_id=ctx.run_id,
        step_id=ctx.step_id,
        attempt=ctx.attempt,
        answer=ctx.answer,
        reservation=ctx.reservation,
    )


def _read_reply(answer: Any) -> AgentResult:
    """Turn an AutoGen agent's reply into an ``AgentResult`` (E8: reported usage is charged)."""
    if isinstance(answer, AgentResult):
        return answer
    if isinstance(answer, StepReply):
        if answer.needs_input is not None:
            raise NeedsInput(answer.needs_input)
        calls, data = _usage(answer.usage)
        if answer.error is not None:
            error = answer.error
            if isinstance(error, str) and not error.strip():
                error = "the AutoGen agent replied StepReply(error=...) with no text: say why"
            return AgentResult(
                ok=False, error=error, code="agent-failed", calls_used=calls, data=data
            )
        return AgentResult(ok=True, output=_plain(answer.output), calls_used=calls, data=data)
    # Another reply (e.g. an AgentChat message): its ``models_usage`` is charged when present.
    calls, data = _usage(getattr(answer, "models_usage", None))
    return AgentResult(ok=True, output=_plain(answer), calls_used=calls, data=data)


def _usage(usage: object) -> tuple[int | None, dict[str, Any] | None]:
    """Return (calls, token counts) of reported usage; (None, None) when nothing was reported.

    Each reported request is one model call (E8), whatever its token counts say: a report with
    a negative, missing or non-integer count is charged all the same, its tokens are left out
    of the totals, and ``usage_problem`` in the data says which count was unusable.
    """
    if usage is None:
        return None, None
    if isinstance(usage, RequestUsage):
        requests: list[object] = [usage]
    elif isinstance(usage, list | tuple):
        requests = list(usage)
    else:
        return None, None
    if not requests:
        return 0, None
    totals = {"prompt_tokens": 0, "completion_tokens": 0}
    problems: list[str] = []
    for i, request in enumerate(requests):
        counts = {name: getattr(request, name, None) for name in totals}
        bad = next(
            (
                f"usage[{i}].{name} is {short(value)}, not a token count"
                for name, value in counts.items()
                if int_problem(value, low=0, unit="a count") is not None
            ),
            None,
        )
        if bad is not None:
            problems.append(bad)
            continue
        for name, value in counts.items():
            totals[name] += int(cast(int, value))
    data: dict[str, Any] = dict(totals)
    if problems:
        data["usage_problem"] = (
            f"{problems[0]} ({len(problems)} of {len(requests)} requests left out of the token "
            "totals; every request is charged as a call)"
        )
    return len(requests), data


def _plain(value: Any) -> Any:
    """Return a reply value as journalable builtins where it is a pydantic model."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value
