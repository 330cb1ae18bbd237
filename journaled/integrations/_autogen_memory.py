"""JournaledMemory: an AutoGen Core memory over journaled facts (SPEC X1, ADRs 0041, 0092).

Imported through :mod:`journaled.integrations.autogen`, which says which extra to install.
"""

from __future__ import annotations

import asyncio
import json
import math
import warnings
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Self

from autogen_core import CancellationToken, Component
from autogen_core.memory import (
    Memory,
    MemoryContent,
    MemoryMimeType,
    MemoryQueryResult,
    UpdateContextResult,
)
from autogen_core.model_context import ChatCompletionContext
from autogen_core.models import SystemMessage
from pydantic import BaseModel, ConfigDict

from journaled.aio import AsyncRuntime
from journaled.embedders.config import build, describe
from journaled.errors import ConfigurationError, InvalidArgument
from journaled.events.inputs import MAX_TEXT_BYTES, int_problem, short, text_problem
from journaled.events.memory import Fact, physical_scope
from journaled.runtime import Runtime
from journaled.runtime import open as open_runtime
from journaled.semantic import EMBED_TIMEOUT, check_embed_timeout

__all__ = [
    "FACT_FIELDS",
    "HELD_MIME_TYPES",
    "RESULT_FIELDS",
    "JournaledEmbedderConfig",
    "JournaledMemory",
    "JournaledMemoryConfig",
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


class JournaledEmbedderConfig(BaseModel):
    """The runtime's embedder in a :class:`JournaledMemoryConfig` (ADR 0092).

    ``provider(**config)`` rebuilds it: an embedder class written as ``module.Class`` that
    defines ``embedder_config()``, and the JSON keyword arguments that method returned.
    """

    model_config = ConfigDict(strict=True, extra="forbid")

    provider: str
    """The import path of the embedder's class, e.g. ``journaled.embedders.OpenAIEmbeddings``."""
    config: dict[str, Any]
    """The keyword arguments the class is called with (never a secret such as an API key)."""


class JournaledMemoryConfig(BaseModel):
    """The component configuration of a :class:`JournaledMemory` (``dump_component``).

    Strict: a hand-edited config with a value of the wrong type (``limit: "5"``, ``semantic: 1``)
    or an unknown key (a typo) is refused naming it, instead of being coerced or ignored.
    """

    model_config = ConfigDict(strict=True, extra="forbid")

    url: str | None = None
    """The journal URL; None: ``$JOURNALED_URL``, then the embedded journal (J4)."""
    organization: str | None = None
    """The organization the memory acts for (R1); None: ``$JOURNALED_ORGANIZATION``, if set."""
    scope: str = "project"
    name: str | None = None
    domain: str | None = None
    source: str = "autogen"
    limit: int = 5
    min_confidence: float = 0.0
    semantic: bool = True
    embedder: JournaledEmbedderConfig | None = None
    """The runtime's embedder (M7); None: the runtime ranks by BM25 alone (M6)."""
    embed_timeout: float | Literal["unbounded"] = EMBED_TIMEOUT
    """How long one search waits for the embedder, in seconds, or ``"unbounded"`` (ADR 0067;
    the runtime's ``embed_timeout=None``: AutoGen drops a None from a dumped config)."""


def _written_timeout(timeout: float | None) -> float | Literal["unbounded"]:
    """Return a runtime's ``embed_timeout`` as a config holds it (None has no place there)."""
    return "unbounded" if timeout is None else timeout


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
    component_version: ClassVar[int] = 2
    """2 records the runtime's embedder (ADR 0092); a config of 1 was written without it."""
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
        # Superseded facts first, oldest first: a delete then never restores a fact the next
        # delete removes, and the journal records the same clear whatever order ``all`` gives
        # facts remembered within one millisecond (their ids do not order them).
        mine = [f for f in facts if f.scope == self._scope]
        for fact in sorted(mine, key=lambda f: (f.superseded_by is None, f.created_at, f.id)):
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
        path = self._rt.journal.path
        if path is not None and not url.startswith("sqlite:////"):
            # A relative path names another file wherever the config is loaded (ADR 0041).
            _, sep, query = url.partition("?")
            url = f"sqlite:///{path}{sep}{query}"
        embedder = self._rt.memory.embedder
        described = None
        if embedder is not None:
            # A config without the embedder would load as a memory ranking by BM25 (ADR 0092).
            provider, arguments = describe(embedder)
            described = JournaledEmbedderConfig(provider=provider, config=arguments)
        return JournaledMemoryConfig(
            url=url,
            organization=self._rt.organization,
            scope=self._scope,
            name=self._name,
            domain=self._domain,
            source=self._source,
            limit=self._limit,
            min_confidence=self._min_confidence,
            semantic=self._semantic,
            embedder=described,
            embed_timeout=_written_timeout(self._rt.memory.embed_timeout),
        )

    @classmethod
    def _from_config_past_version(cls, config: dict[str, Any], version: int) -> Self:
        """Load a config of component version 1, written before the embedder was recorded.

        It cannot say whether the memory it came from ranked by meaning: loaded without an
        embedder, with a warning when it asks for semantic ranking (ADR 0092).
        """
        loaded = JournaledMemoryConfig.model_validate(config)
        if loaded.embedder is not None:
            raise ConfigurationError(
                f"the JournaledMemory config of component_version {version} holds an embedder, "
                f"which only version {cls.component_version} records: set component_version "
                f"to {cls.component_version}"
            )
        if loaded.semantic:
            warnings.warn(
                f"this JournaledMemory config (component_version {version}) was written "
                "without the runtime's embedder, so the memory it loads ranks by BM25 (M6); "
                "if the memory it was dumped from had an embedder, dump that memory again",
                UserWarning,
                stacklevel=3,
            )
        return cls._from_config(loaded)

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
        embed_timeout = None if config.embed_timeout == "unbounded" else config.embed_timeout
        try:
            check_embed_timeout(embed_timeout)
        except ValueError as exc:
            raise ConfigurationError(f"the JournaledMemory config's {exc}") from None
        embedder = None
        if config.embedder is not None:
            try:
                embedder = build(config.embedder.provider, config.embedder.config)
            except ConfigurationError as exc:
                raise ConfigurationError(f"the JournaledMemory config's {exc}") from None
        # The organization dumped with the memory, not the loading process's: a memory of
        # acme's organization scope must never read another organization's facts (R1).
        rt = open_runtime(
            config.url,
            organization=config.organization,
            embedder=embedder,
            embed_timeout=embed_timeout,
        )
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
            decoded = json.loads(fact.text)
        except ValueError:  # redaction (M9) may have cut it: the text is still the fact
            mime = MemoryMimeType.TEXT.value
        else:
            # MemoryContent holds an object, never a JSON array or number: those stay the JSON
            # text they were given as, as a JSON string content is.
            content = decoded if isinstance(decoded, dict) else fact.text
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
