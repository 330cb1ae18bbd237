"""A JournaledMemory's component config keeps the runtime's embedder (SPEC X1, M7, ADR 0092).

Every case runs against the real autogen-core: a config dumped from a memory whose runtime ranks
by meaning loads as a memory that ranks the same, and one that could not is refused, naming the
embedder, at dump or at load.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from autogen_core.memory import MemoryContent, MemoryMimeType

import journaled
from journaled.aio import AsyncRuntime
from journaled.embedders import OpenAIEmbeddings, SentenceTransformerEmbeddings
from journaled.errors import ConfigurationError
from journaled.integrations.autogen import JournaledMemory
from journaled.testing import KeywordEmbedder, ScriptedEmbedder

T = TypeVar("T")

VOCABULARY = ["cat", "feline", "pet"]
FACTS = [
    "cat food prices rose and cat owners complained about food prices",
    "a feline pet",
]
QUERY = "cat pet"
"""BM25 puts the short fact first; the keyword vectors put the one about cats first."""


def with_aio(url: str, body: Callable[[AsyncRuntime], Awaitable[T]], **options: Any) -> T:
    """Run ``body(rt)`` on a fresh asyncio runtime over ``url``."""

    async def main() -> T:
        async with journaled.aio.open(url, **options) as rt:
            return await body(rt)

    return asyncio.run(main())


def text(content: str) -> MemoryContent:
    return MemoryContent(content=content, mime_type=MemoryMimeType.TEXT)


def ranked(found: Any) -> list[tuple[str, float, str]]:
    return [(r.content, r.metadata["score"], r.metadata["ranking"]) for r in found.results]


def dumped_with(url: str, embedder: object | None = None) -> dict[str, Any]:
    """Return, as JSON gives it back, the config of a memory holding FACTS."""

    async def body(rt: AsyncRuntime) -> dict[str, Any]:
        memory = JournaledMemory(rt, "session")
        for fact in FACTS:
            await memory.add(text(fact))
        loaded: dict[str, Any] = json.loads(memory.dump_component().model_dump_json())
        return loaded

    return with_aio(url, body, embedder=embedder)


def test_a_loaded_memory_ranks_by_meaning_as_the_dumped_one_did(sqlite_url: str) -> None:
    """X1/M7: dump, JSON and load keep the embedder: the same order, scores and ranking."""

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt, "session")
        for fact in FACTS:
            await memory.add(text(fact))
        original = ranked(await memory.query(QUERY))
        by_bm25 = ranked(await memory.query(QUERY, semantic=False))
        assert [c for c, _, _ in original] == list(FACTS)
        assert [c for c, _, _ in by_bm25] == list(reversed(FACTS))  # the query tells them apart
        model = memory.dump_component()
        assert model.config["embedder"] == {
            "provider": "journaled.testing.KeywordEmbedder",
            "config": {"vocabulary": VOCABULARY},
        }
        loaded = JournaledMemory.load_component(json.loads(model.model_dump_json()))
        try:
            assert ranked(await loaded.query(QUERY)) == original
            assert loaded.dump_component().config == model.config
        finally:
            await loaded.close()

    with_aio(sqlite_url, body, embedder=KeywordEmbedder(VOCABULARY))


def test_a_memory_over_a_sync_runtime_keeps_its_embedder_too(sqlite_url: str) -> None:
    """X1/M7: a memory over journaled.open() dumps its runtime's embedder as well."""
    with journaled.open(sqlite_url, embedder=KeywordEmbedder(VOCABULARY)) as rt:

        async def body() -> None:
            memory = JournaledMemory(rt)
            for fact in FACTS:
                await memory.add(text(fact))
            original = ranked(await memory.query(QUERY))
            loaded = JournaledMemory.load_component(memory.dump_component())
            try:
                assert ranked(await loaded.query(QUERY)) == original
                assert original[0][2] == "semantic"
            finally:
                await loaded.close()

        asyncio.run(body())


def test_a_hand_written_config_names_its_embedder(sqlite_url: str) -> None:
    """X1/M7: a config written by hand with an embedder loads a memory that ranks by it."""
    model = dumped_with(sqlite_url)
    assert "embedder" not in model["config"]  # none was there: none is written
    model["config"]["embedder"] = {
        "provider": "journaled.testing.KeywordEmbedder",
        "config": {"vocabulary": VOCABULARY},
    }

    async def main() -> None:
        loaded = JournaledMemory.load_component(model)
        try:
            found = ranked(await loaded.query(QUERY))
            assert [c for c, _, _ in found] == list(FACTS)
            assert {r for _, _, r in found} == {"semantic"}
        finally:
            await loaded.close()

    asyncio.run(main())


class Unlisted:
    """An embedder defined at the top level, without ``embedder_config``."""

    def embed(self, texts: list[str]) -> list[list[float]]:
        return [[1.0] for _ in texts]


def _local_embedder() -> object:
    class Local:
        def embed(self, texts: list[str]) -> list[list[float]]:
            return [[1.0] for _ in texts]

        def embedder_config(self) -> dict[str, object]:
            return {}

    return Local()


class Opaque(KeywordEmbedder):
    """Describes itself with arguments that are not JSON."""

    def embedder_config(self) -> dict[str, object]:
        return {"vocabulary": {"cat"}}


@pytest.mark.parametrize(
    ("embedder", "named", "why"),
    [
        (ScriptedEmbedder({}), "journaled.testing.ScriptedEmbedder", "embedder_config"),
        (Unlisted(), f"{__name__}.Unlisted", "embedder_config"),
        (_local_embedder(), "Local", "top level of a module"),
        (Opaque(["cat"]), f"{__name__}.Opaque", "not JSON"),
        (
            OpenAIEmbeddings("tiny", "http://127.0.0.1:9/v1", api_key="sk-hidden-key"),
            "journaled.embedders.http.OpenAIEmbeddings (model 'tiny')",
            "OPENAI_API_KEY",
        ),
        (
            SentenceTransformerEmbeddings(instance=object(), name="mini"),
            "journaled.embedders.local.SentenceTransformerEmbeddings (model 'mini')",
            "instance=",
        ),
    ],
    ids=["scripted", "unlisted", "local-class", "not-json", "api-key", "instance"],
)
def test_a_memory_whose_embedder_cannot_be_written_refuses_to_dump(
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
    embedder: object,
    named: str,
    why: str,
) -> None:
    """X1/M7: dump_component names the embedder and what to do, instead of dropping it."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    async def body(rt: AsyncRuntime) -> None:
        with pytest.raises(ConfigurationError) as caught:
            JournaledMemory(rt).dump_component()
        message = str(caught.value)
        assert message.startswith("embedder ")
        assert named in message
        assert why in message
        assert "sk-hidden-key" not in message

    with_aio(sqlite_url, body, embedder=embedder)


@pytest.mark.parametrize(
    ("embedder", "why"),
    [
        ({"provider": "no_such_module.Embedder", "config": {}}, "cannot be imported"),
        ({"provider": "journaled.testing.NoSuchEmbedder", "config": {}}, "cannot be imported"),
        ({"provider": "journaled.testing.ScriptedEmbedder", "config": {}}, "is not an embedder"),
        ({"provider": "os.system", "config": {"command": "true"}}, "is not an embedder"),
        (
            {"provider": "journaled.testing.KeywordEmbedder", "config": {"vocabulary": 3}},
            "cannot be built from its arguments",
        ),
    ],
    ids=["no-module", "no-class", "not-described", "a-function", "bad-arguments"],
)
def test_a_config_whose_embedder_cannot_be_built_is_refused_at_load(
    tmp_path: Path, embedder: dict[str, Any], why: str
) -> None:
    """X1/M7: load_component names the embedder it cannot build; no journal is opened."""
    model = dumped_with(f"sqlite:///{tmp_path / 'journal.sqlite'}", KeywordEmbedder(VOCABULARY))
    fresh = tmp_path / "fresh.sqlite"
    model["config"] = {**model["config"], "url": f"sqlite:///{fresh}", "embedder": embedder}
    with pytest.raises(ConfigurationError) as caught:
        JournaledMemory.load_component(model)
    message = str(caught.value)
    assert message.startswith("the JournaledMemory config's embedder ")
    assert embedder["provider"] in message
    assert why in message
    assert not fresh.exists()


def test_a_config_written_before_embedders_were_kept_says_it_ranks_by_bm25(
    sqlite_url: str,
) -> None:
    """X1/M7: a component_version 1 config cannot tell of an embedder: loading it says so,
    unless it asks for BM25 anyway (a warning would fail the second load here)."""
    model = dumped_with(sqlite_url)
    model.update(version=1, component_version=1)

    async def load(config: dict[str, Any]) -> None:
        loaded = JournaledMemory.load_component(config)
        await loaded.close()

    with pytest.warns(UserWarning, match="without the runtime's embedder"):
        asyncio.run(load(model))
    asyncio.run(load({**model, "config": {**model["config"], "semantic": False}}))


def test_an_openai_embedder_is_rebuilt_from_its_config_without_its_key(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """M7: OpenAIEmbeddings is written with every setting that shapes its vectors, not the key."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    embedder = OpenAIEmbeddings(
        "text-embedding-3-small", "http://127.0.0.1:9/v1/", batch_size=8, dimensions=256
    )

    async def body(rt: AsyncRuntime) -> None:
        model = JournaledMemory(rt).dump_component()
        assert "sk-from-env" not in model.model_dump_json()
        loaded = JournaledMemory.load_component(model)
        try:
            assert loaded._rt.memory.embedder is not None
            rebuilt = loaded._rt.memory.embedder
            assert isinstance(rebuilt, OpenAIEmbeddings)
            assert repr(rebuilt) == repr(embedder)
            assert (rebuilt.batch_size, rebuilt.timeout, rebuilt.dimensions) == (8, 30.0, 256)
        finally:
            await loaded.close()

    with_aio(sqlite_url, body, embedder=embedder)


@pytest.mark.parametrize("timeout", [None, 0.25, 30])
def test_a_loaded_memory_waits_for_its_embedder_as_the_dumped_one_did(
    sqlite_url: str, timeout: float | None
) -> None:
    """X1/M7, ADR 0067: the runtime's embed_timeout is written into the config and a loaded
    memory's runtime waits for its embedder that long (None: no bound), not the default."""

    async def body(rt: AsyncRuntime) -> None:
        assert rt.memory.embed_timeout == timeout
        memory = JournaledMemory(rt, "session")
        model = memory.dump_component()
        assert model.config["embed_timeout"] == ("unbounded" if timeout is None else timeout)
        loaded = JournaledMemory.load_component(json.loads(model.model_dump_json()))
        try:
            assert loaded.dump_component().config == model.config
        finally:
            await loaded.close()

    with_aio(sqlite_url, body, embedder=KeywordEmbedder(VOCABULARY), embed_timeout=timeout)


@pytest.mark.parametrize("bad", [0, -1.0, "10", "none", True, None])
def test_a_config_with_a_bad_embed_timeout_is_refused_before_a_file_is_made(
    tmp_path: Path, bad: object
) -> None:
    """X1: a hand-edited embed_timeout that is no positive number of seconds is refused,
    naming it, and no journal file is made."""
    url = f"sqlite:///{tmp_path / 'j.sqlite'}"
    config = {"url": url, "embed_timeout": bad}
    with pytest.raises((ConfigurationError, ValueError), match="embed_timeout"):
        JournaledMemory.load_component(
            {"provider": "journaled.integrations.autogen.JournaledMemory", "config": config}
        )
    assert not (tmp_path / "j.sqlite").exists()
