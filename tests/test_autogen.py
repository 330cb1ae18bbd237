"""AutoGen Core integration against the real autogen-core (SPEC X1, ADR 0041).

Memory: add, query, update_context, clear and close of :class:`JournaledMemory` over a journaled
runtime. Agents: an agent hosted on a real ``SingleThreadedAgentRuntime`` run as a journaled agent
step, with a scripted handler (no model, no network).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from autogen_core import MessageContext, RoutedAgent, SingleThreadedAgentRuntime, message_handler
from autogen_core.memory import MemoryContent, MemoryMimeType
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import RequestUsage, SystemMessage, UserMessage

import journaled
from journaled import ExecuteResult, NeedsInput, Plan, Step
from journaled.aio import AsyncRuntime
from journaled.errors import ConfigurationError, InvalidArgument
from journaled.events.bm25 import bm25_rescore
from journaled.events.memory import FactDeleted
from journaled.integrations.autogen import (
    JournaledMemory,
    StepMessage,
    StepReply,
    register_autogen_agent,
)
from journaled.testing import ScriptedEmbedder

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def text(content: str, **metadata: Any) -> MemoryContent:
    return MemoryContent(content=content, mime_type=MemoryMimeType.TEXT, metadata=metadata or None)


def with_aio(url: str, body: Callable[[AsyncRuntime], Awaitable[T]], **options: Any) -> T:
    """Run ``body(rt)`` on a fresh asyncio runtime over ``url``."""

    async def main() -> T:
        async with journaled.aio.open(url, **options) as rt:
            return await body(rt)

    return asyncio.run(main())


# -- memory ----------------------------------------------------------------------------------


def test_add_then_query_ranks_the_scope_facts_with_scores(sqlite_url: str) -> None:
    """X1/M6: query returns this scope's facts best first, score and ranking in the metadata."""

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt, "session")
        other = JournaledMemory(rt, "user")
        await memory.add(text("staging runs in eu-west-1"))
        await memory.add(text("the staging database is postgres on a large host"))
        await memory.add(text("lunch is at noon"))
        await other.add(text("staging is where alice deploys"))
        found = await memory.query("staging region")
        contents = [r.content for r in found.results]
        assert contents == [
            "staging runs in eu-west-1",
            "the staging database is postgres on a large host",
        ]
        scores = [r.metadata["score"] for r in found.results if r.metadata]
        assert scores[0] > scores[1] > 0
        first = found.results[0]
        assert first.metadata is not None
        assert first.metadata["ranking"] == "bm25"
        assert first.metadata["scope"] == "session"
        assert first.metadata["source"] == "autogen"
        assert first.mime_type == MemoryMimeType.TEXT.value
        fact = await rt.memory.get(first.metadata["id"])
        assert fact is not None
        assert fact.text == "staging runs in eu-west-1"
        assert (await memory.query("staging", limit=1)).results[0].content == contents[0]
        assert (await memory.query("")).results == []
        assert (await memory.query(text("noon lunch"))).results[0].content == "lunch is at noon"

    with_aio(sqlite_url, body)


def test_metadata_maps_onto_fact_fields_and_the_rest_is_kept(sqlite_url: str) -> None:
    """X1/M3: metadata fills the fact's fields (a conflict key supersedes); other keys survive."""

    async def add(rt: AsyncRuntime) -> str:
        memory = JournaledMemory(rt, "session")
        await memory.add(text("staging is in us-east-1", conflict_key="staging-region"))
        meta = {
            "conflict_key": "staging-region",
            "domain": "infra",
            "confidence": 0.8,
            "source": "ops-chat",
            "user": "alice",
            "tags": ["region"],
        }
        await memory.add(text("staging is in eu-west-1", **meta))
        facts = [f for f in await rt.memory.all() if f.superseded_by is None]
        (fact,) = facts
        assert (fact.domain, fact.confidence, fact.conflict_key) == ("infra", 0.8, "staging-region")
        return fact.id

    fact_id = with_aio(sqlite_url, add)

    async def read_back(rt: AsyncRuntime) -> None:  # a new runtime: kept in the journal
        found = await JournaledMemory(rt, "session").query("staging")
        assert [r.content for r in found.results] == ["staging is in eu-west-1"]
        meta = found.results[0].metadata
        assert meta is not None
        assert meta["id"] == fact_id
        assert meta["user"] == "alice"
        assert meta["tags"] == ["region"]
        assert meta["source"] == "ops-chat"
        assert meta["domain"] == "infra"
        assert meta["conflict_key"] == "staging-region"
        assert "ops-chat" in await rt.memory.why(fact_id)

    with_aio(sqlite_url, read_back)


def test_json_and_markdown_are_held_with_their_mime_type(sqlite_url: str) -> None:
    """X1: JSON content comes back as JSON (searchable by its words), markdown as markdown."""

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt)
        await memory.add(
            MemoryContent(content={"service": "billing"}, mime_type="application/json")
        )
        await memory.add(
            MemoryContent(content="# Runbook\nrestart billing", mime_type="text/markdown")
        )
        found = await memory.query("billing")
        by_mime = {r.mime_type: r.content for r in found.results}
        assert by_mime == {
            "application/json": {"service": "billing"},
            "text/markdown": "# Runbook\nrestart billing",
        }
        by_json = await memory.query(
            MemoryContent(content={"q": "billing"}, mime_type="application/json")
        )
        assert len(by_json.results) == 2
        with pytest.raises(InvalidArgument, match="content must be a str for mime type 'image/"):
            await memory.query(MemoryContent(content=b"\x89PNG", mime_type=MemoryMimeType.IMAGE))
        with pytest.raises(InvalidArgument, match="content is not JSON"):
            await memory.add(MemoryContent(content="{not json", mime_type="application/json"))

    with_aio(sqlite_url, body)


@pytest.mark.parametrize(
    ("content", "mime"),
    [
        (b"\x89PNG", MemoryMimeType.IMAGE),
        (b"\x00\x01", MemoryMimeType.BINARY),
        (b"RIFF", "audio/wav"),
    ],
)
def test_a_mime_type_it_cannot_hold_is_refused_by_name(
    sqlite_url: str, content: bytes, mime: MemoryMimeType | str
) -> None:
    """X1: adding an image or binary content names the mime type and appends nothing."""
    name = mime.value if isinstance(mime, MemoryMimeType) else mime

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt)
        before = await rt.journal.position()
        with pytest.raises(InvalidArgument) as caught:
            await memory.add(MemoryContent(content=content, mime_type=mime))
        message = str(caught.value)
        assert message.startswith("mime_type ")
        assert repr(name) in message
        assert "\n" not in message
        assert await rt.journal.position() == before

    with_aio(sqlite_url, body)


def test_text_content_that_is_not_a_string_is_refused(sqlite_url: str) -> None:
    """X1: bytes under a text mime type are refused, naming the content and its type."""

    async def body(rt: AsyncRuntime) -> None:
        with pytest.raises(InvalidArgument, match="content must be a str for mime type"):
            await JournaledMemory(rt).add(MemoryContent(content=b"x", mime_type="text/plain"))

    with_aio(sqlite_url, body)


def test_update_context_adds_the_relevant_facts_as_a_system_message(sqlite_url: str) -> None:
    """X1: update_context queries with the last message and appends one SystemMessage."""

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt)
        await memory.add(text("staging runs in eu-west-1"))
        await memory.add(text("lunch is at noon"))
        context = UnboundedChatCompletionContext()
        empty = await memory.update_context(context)
        assert empty.memories.results == []
        assert await context.get_messages() == []
        await context.add_message(UserMessage(content="where does staging run?", source="user"))
        result = await memory.update_context(context)
        assert [r.content for r in result.memories.results] == ["staging runs in eu-west-1"]
        messages = await context.get_messages()
        assert len(messages) == 2
        added = messages[-1]
        assert isinstance(added, SystemMessage)
        assert "1. staging runs in eu-west-1" in added.content
        assert "lunch" not in added.content
        await context.add_message(UserMessage(content="what about the weather", source="user"))
        nothing = await memory.update_context(context)
        assert nothing.memories.results == []
        assert len(await context.get_messages()) == 3

    with_aio(sqlite_url, body)


def test_clear_deletes_the_scope_facts_and_why_explains_it(journal_url: str) -> None:
    """X1/M8/M11: clear deletes this scope's facts through journaled; why and history say so."""

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt, "session")
        kept = JournaledMemory(rt, "user")
        await memory.add(text("staging runs in eu-west-1"))
        await memory.add(text("staging runs in us-east-1", conflict_key="region"))
        await kept.add(text("staging belongs to alice"))
        ids = [f.id for f in await rt.memory.all() if f.scope == "session"]
        assert len(ids) == 2
        await memory.clear()
        assert (await memory.query("staging")).results == []
        assert [r.content for r in (await kept.query("staging")).results] == [
            "staging belongs to alice"
        ]
        for fact_id in ids:
            assert await rt.memory.get(fact_id) is None
            assert "deleted" in await rt.memory.why(fact_id)
            events = await rt.memory.history(fact_id)
            assert isinstance(events[-1].data, FactDeleted)

    with_aio(journal_url, body)


@pytest.mark.parametrize("attempt", range(6))
def test_clear_deletes_superseded_facts_first_whatever_order_their_ids_give(
    tmp_path: Path, attempt: int
) -> None:
    """X1/M8: facts remembered in one millisecond have ids in random order; clear deletes the
    superseded one first, so no delete restores a fact (the record is the same every time)."""
    from journaled.events.memory import FactRestored
    from journaled.testing import ManualClock

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt, "session")
        for region in ("us-east-1", "eu-west-1"):
            await memory.add(text(f"staging runs in {region}", conflict_key="region"))
        ids = [f.id for f in await rt.memory.all() if f.scope == "session"]
        await memory.clear()
        for fact_id in ids:
            assert not any(
                isinstance(e.data, FactRestored) for e in await rt.memory.history(fact_id)
            )

    clock = ManualClock(start=1_700_000_000_000, step=0)  # one millisecond for every fact
    with_aio(f"sqlite:///{tmp_path / f'j{attempt}.sqlite'}", body, clock=clock)


def test_close_stops_the_memory_but_leaves_the_callers_runtime_open(sqlite_url: str) -> None:
    """X1: after close the memory refuses calls; the runtime it was given still works."""

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt)
        await memory.add(text("a fact"))
        await memory.close()
        await memory.close()  # idempotent
        with pytest.raises(RuntimeError, match="is closed"):
            await memory.add(text("another fact"))
        with pytest.raises(RuntimeError, match="is closed"):
            await memory.query("fact")
        assert len(await rt.memory.all()) == 1

    with_aio(sqlite_url, body)


def test_semantic_ranking_when_the_runtime_has_an_embedder(sqlite_url: str) -> None:
    """X1/M7: with an embedder, query ranks by meaning (cosine scores); BM25 finds nothing."""
    embedder = ScriptedEmbedder(
        {
            "the cat sleeps on the sofa": [1.0, 0.0],
            "stocks fell sharply": [0.0, 1.0],
            "feline": [0.9, 0.1],
        }
    )

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt)
        await memory.add(text("the cat sleeps on the sofa"))
        await memory.add(text("stocks fell sharply"))
        found = await memory.query("feline")
        assert [r.content for r in found.results] == [
            "the cat sleeps on the sofa",
            "stocks fell sharply",
        ]
        meta = [r.metadata for r in found.results]
        assert meta[0] is not None
        assert meta[1] is not None
        assert meta[0]["ranking"] == "semantic"
        assert meta[0]["score"] == pytest.approx(0.9 / (0.81 + 0.01) ** 0.5)
        assert meta[0]["score"] > meta[1]["score"]
        assert (await memory.query("feline", semantic=False)).results == []
        assert (await JournaledMemory(rt, semantic=False).query("feline")).results == []

    with_aio(sqlite_url, body, embedder=embedder)


def test_a_sync_runtime_serves_the_memory_from_a_thread(sqlite_url: str) -> None:
    """X1: JournaledMemory works over journaled.open() too (its calls run off the loop)."""
    with journaled.open(sqlite_url) as rt:

        async def body() -> list[Any]:
            memory = JournaledMemory(rt, "session")
            await memory.add(text("staging runs in eu-west-1"))
            return [r.content for r in (await memory.query("staging")).results]

        assert asyncio.run(body()) == ["staging runs in eu-west-1"]
        assert [f.scope for f in rt.memory.all()] == ["session"]


def test_component_config_round_trips_and_the_loaded_memory_owns_its_runtime(
    sqlite_url: str,
) -> None:
    """X1: dump_component/load_component reopen the same journal; close closes that runtime."""

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt, "session", limit=3, domain="infra")
        await memory.add(text("staging runs in eu-west-1"))
        model = memory.dump_component()
        assert model.provider == "journaled.integrations.autogen.JournaledMemory"
        assert model.config["scope"] == "session"
        loaded = JournaledMemory.load_component(model)
        try:
            found = await loaded.query("staging")
            assert [r.content for r in found.results] == ["staging runs in eu-west-1"]
            assert loaded.dump_component().config == model.config
        finally:
            await loaded.close()
        with pytest.raises(RuntimeError, match="is closed"):
            await loaded.query("staging")

    with_aio(sqlite_url, body)


def test_an_in_memory_journal_cannot_be_dumped_into_a_config() -> None:
    """X1: a memory:// journal would load as an empty one: dumping it says so."""

    async def body(rt: AsyncRuntime) -> None:
        with pytest.raises(ConfigurationError, match="memory://"):
            JournaledMemory(rt).dump_component()

    with_aio("memory://", body)


def test_bad_constructor_arguments_name_the_argument(sqlite_url: str) -> None:
    """X1: a bad scope, limit or runtime is refused with an error naming it."""

    async def body(rt: AsyncRuntime) -> None:
        with pytest.raises(InvalidArgument, match=r"^scope "):
            JournaledMemory(rt, "")
        with pytest.raises(InvalidArgument, match=r"^limit "):
            JournaledMemory(rt, limit=0)
        with pytest.raises(InvalidArgument, match=r"^rt "):
            JournaledMemory(object())  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match=r"^colour "):
            await JournaledMemory(rt).query("x", colour="red")

    with_aio(sqlite_url, body)


def test_search_scored_keeps_the_scores_search_ranks_by(journal_url: str) -> None:
    """M6/M7: search_scored returns search's facts in its order, with the reference BM25 scores."""
    texts = ["staging runs in eu-west-1", "the staging database", "lunch at noon", "staging"]
    with journaled.open(journal_url) as rt:
        for t in texts:
            rt.memory.remember(t, scope="session")
        rt.memory.remember("staging elsewhere", scope="user")
        hits, ranking = rt.memory.search_scored("staging region", scopes=["session"], limit=3)
        assert ranking == "bm25"
        assert [f.id for _, f in hits] == [
            f.id for f in rt.memory.search("staging region", scopes=["session"], limit=3)
        ]
        docs = [(f.id, f.text) for f in rt.memory.all() if f.scope == "session"]
        reference = bm25_rescore("staging region", docs, 3)
        assert [f.id for _, f in hits] == [i for _, i in reference]
        assert [s for s, _ in hits] == pytest.approx([s for s, _ in reference])
        # Semantic without an embedder falls back to BM25 and says so (M7).
        assert rt.memory.search_scored("staging region", semantic=True)[1] == "bm25"


def test_cancelling_the_run_cancels_the_autogen_message(sqlite_url: str) -> None:
    """X1/E5: rt.cancel of a run cancels the CancellationToken the AutoGen handler was given."""
    started = asyncio.Event()
    tokens: list[bool] = []

    class Waiter(RoutedAgent):
        def __init__(self) -> None:
            super().__init__("waits until cancelled")

        @message_handler
        async def on_step(self, message: StepMessage, ctx: MessageContext) -> StepReply:
            cancelled = asyncio.Event()
            ctx.cancellation_token.add_callback(cancelled.set)
            started.set()
            with contextlib.suppress(TimeoutError):  # bounded: a missed cancel fails, not hangs
                await asyncio.wait_for(cancelled.wait(), 10)
            tokens.append(ctx.cancellation_token.is_cancelled())
            return StepReply(output="stopped")

    async def body(rt: AsyncRuntime) -> None:
        runtime = SingleThreadedAgentRuntime()
        await Waiter.register(runtime, "waiter", Waiter)
        runtime.start()
        try:
            register_autogen_agent(rt, "waiter", runtime=runtime, agent_type="waiter")
            handle = await rt.start(Plan(goal="g", steps=[Step("a", agent="waiter")]))
            await asyncio.wait_for(started.wait(), 30)
            await rt.cancel(handle.run_id)
            result = await handle.result(timeout=30)
            await runtime.stop_when_idle()
        finally:
            if runtime._run_context is not None:
                await runtime.stop()
        assert not result.ok
        assert tokens == [True]

    with_aio(sqlite_url, body)


# -- agents ----------------------------------------------------------------------------------

Script = list[Callable[[StepMessage], Any]]


class ScriptedAgent(RoutedAgent):
    """An AutoGen agent answering each StepMessage with the next scripted reply (no model)."""

    def __init__(self, script: Script, seen: list[StepMessage]) -> None:
        super().__init__("a scripted agent")
        self._script = script
        self._seen = seen

    @message_handler
    async def on_step(self, message: StepMessage, ctx: MessageContext) -> Any:
        self._seen.append(message)
        return self._script.pop(0)(message)


async def start_autogen(script: Script, seen: list[StepMessage]) -> SingleThreadedAgentRuntime:
    runtime = SingleThreadedAgentRuntime()
    await ScriptedAgent.register(runtime, "writer", lambda: ScriptedAgent(script, seen))
    runtime.start()
    return runtime


def usage_reply(message: StepMessage) -> StepReply:
    return StepReply(
        output=f"draft about {message.task}",
        usage=[RequestUsage(prompt_tokens=10, completion_tokens=5), RequestUsage(7, 3)],
    )


def test_an_autogen_agent_runs_as_a_journaled_agent_step(sqlite_url: str) -> None:
    """X1/E8: the step sends the agent a message, its reply is the output, usage is charged."""
    seen: list[StepMessage] = []

    async def body(rt: AsyncRuntime) -> None:
        runtime = await start_autogen([usage_reply], seen)
        try:
            register_autogen_agent(rt, "writer", runtime=runtime, agent_type="writer")
            plan = Plan(goal="g", steps=[Step("a", agent="writer", input="staging")])
            result = await rt.execute(plan)
        finally:
            await runtime.stop()
        assert result.ok
        (obs,) = result.observations
        assert obs.output == "draft about staging"
        assert obs.calls_used == 2
        assert obs.data == {"prompt_tokens": 17, "completion_tokens": 8}
        assert result.calls_used == 2
        assert seen[0].run_id == result.run_id
        assert (seen[0].step_id, seen[0].attempt, seen[0].answer) == ("a", 1, None)
        assert "a" in await rt.runs.why(result.run_id)

    with_aio(sqlite_url, body)


def test_an_agent_question_waits_and_the_answer_resumes_it(sqlite_url: str) -> None:
    """X1/E10: NeedsInput raised by the AutoGen agent leaves the step waiting; resume answers."""
    seen: list[StepMessage] = []

    def ask(message: StepMessage) -> StepReply:
        raise NeedsInput("which region?")

    def answer(message: StepMessage) -> StepReply:
        return StepReply(output=f"deploying to {message.answer}", usage=[RequestUsage(1, 1)])

    async def body(rt: AsyncRuntime) -> None:
        runtime = await start_autogen([ask, answer], seen)
        try:
            register_autogen_agent(rt, "writer", runtime=runtime, agent_type="writer")
            plan = Plan(goal="g", steps=[Step("a", agent="writer", input="deploy")])
            first = await rt.execute(plan)
            assert not first.ok
            assert first.waiting == ["a"]
            assert first.observations[-1].code == "agent-waiting"
            assert "which region?" in await rt.runs.why(first.run_id)
            second = await rt.resume(first.run_id, answers={"a": "eu-west-1"})
        finally:
            await runtime.stop()
        assert isinstance(second, ExecuteResult)
        assert second.ok
        assert second.observations[-1].output == "deploying to eu-west-1"
        assert second.calls_used == 1
        assert seen[-1].answer == "eu-west-1"

    with_aio(sqlite_url, body)


def test_a_reply_asking_for_input_also_waits(sqlite_url: str) -> None:
    """X1/E10: a StepReply with needs_input leaves the step waiting with that question."""

    async def body(rt: AsyncRuntime) -> None:
        runtime = await start_autogen([lambda m: StepReply(needs_input="approve the plan?")], [])
        try:
            register_autogen_agent(rt, "writer", runtime=runtime, agent_type="writer")
            result = await rt.execute(Plan(goal="g", steps=[Step("a", agent="writer")]))
        finally:
            await runtime.stop()
        assert result.waiting == ["a"]
        assert result.observations[-1].error == "approve the plan?"

    with_aio(sqlite_url, body)


def test_an_agent_failure_fails_the_step_naming_the_agent(sqlite_url: str) -> None:
    """X1/E11: an exception in the AutoGen handler, or a reply error, fails the step."""

    def boom(message: StepMessage) -> StepReply:
        raise ValueError("the model refused")

    def refuse(message: StepMessage) -> StepReply:
        return StepReply(error="out of scope", usage=[RequestUsage(3, 0)])

    async def body(rt: AsyncRuntime) -> None:
        runtime = await start_autogen([boom, refuse], [])
        try:
            register_autogen_agent(rt, "writer", runtime=runtime, agent_type="writer")
            one = await rt.execute(Plan(goal="g", steps=[Step("a", agent="writer")]))
            two = await rt.execute(Plan(goal="g", steps=[Step("a", agent="writer")]))
        finally:
            await runtime.stop()
        assert one.observations[-1].code == "agent-failed"
        assert (
            one.observations[-1].error == "AutoGen agent writer/default failed: the model refused"
        )
        assert (two.observations[-1].error, two.calls_used) == ("out of scope", 1)

    with_aio(sqlite_url, body)


def test_a_runtime_that_was_not_started_fails_the_step_instead_of_hanging(sqlite_url: str) -> None:
    """X1: a message to an AutoGen runtime never started fails its step, saying start() it."""

    async def body(rt: AsyncRuntime) -> None:
        runtime = SingleThreadedAgentRuntime()
        await ScriptedAgent.register(runtime, "writer", lambda: ScriptedAgent([], []))
        register_autogen_agent(rt, "writer", runtime=runtime, agent_type="writer")
        result = await rt.execute(Plan(goal="g", steps=[Step("a", agent="writer")]))
        assert result.observations[-1].error is not None
        assert "runtime.start()" in result.observations[-1].error

    with_aio(sqlite_url, body)


class _Elsewhere:
    """A placement that runs steps in another process (as RaySteps does); never called here."""

    closed = False

    def run_step(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no step is placed in this test")


def test_an_autogen_agent_is_refused_by_a_runtime_that_places_steps_elsewhere(
    sqlite_url: str,
) -> None:
    """X1, S1: a runtime opened with steps= (Ray) runs agent steps in other processes, which
    cannot reach an AutoGen runtime of this one: registering the AutoGen agent there is refused
    naming why and what to do, where each step failed with a pickling error."""

    async def body(rt: AsyncRuntime) -> None:
        runtime = SingleThreadedAgentRuntime()
        await ScriptedAgent.register(runtime, "writer", lambda: ScriptedAgent([], []))
        with pytest.raises(InvalidArgument, match="places its steps elsewhere"):
            register_autogen_agent(rt, "writer", runtime=runtime, agent_type="writer")
        with pytest.raises(InvalidArgument, match="without steps="):
            register_autogen_agent(rt._sync, "writer", runtime=runtime, agent_type="writer")

    with_aio(sqlite_url, body, steps=_Elsewhere())


@pytest.fixture
def autogen_thread() -> Iterator[asyncio.AbstractEventLoop]:
    """Run an event loop in a thread of its own, as a sync program hosting AutoGen would."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def test_a_sync_runtime_drives_an_autogen_runtime_on_another_loop(
    sqlite_url: str, autogen_thread: asyncio.AbstractEventLoop
) -> None:
    """X1: with loop=, the sync runtime's step reaches an AutoGen runtime in another thread."""
    seen: list[StepMessage] = []
    runtime = asyncio.run_coroutine_threadsafe(
        start_autogen([usage_reply], seen), autogen_thread
    ).result(timeout=10)
    try:
        with journaled.open(sqlite_url) as rt:
            register_autogen_agent(
                rt, "writer", runtime=runtime, agent_type="writer", loop=autogen_thread
            )
            result = rt.execute(Plan(goal="g", steps=[Step("a", agent="writer", input="x")]))
    finally:
        asyncio.run_coroutine_threadsafe(runtime.stop(), autogen_thread).result(timeout=10)
    assert result.ok
    assert result.observations[-1].output == "draft about x"
    assert result.calls_used == 2
    assert len(seen) == 1


# -- optional stays optional -----------------------------------------------------------------

IMPORTS = """
import sys
import journaled
import journaled.integrations
journaled.integrations.__all__
assert "autogen_core" not in sys.modules, "autogen_core was imported"
print("ok")
"""


def test_importing_journaled_and_its_integrations_does_not_import_autogen() -> None:
    """X1/T4: import journaled and journaled.integrations leave autogen_core unimported."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_extra_is_declared_and_the_dev_extra_pulls_it() -> None:
    """X1: pyproject declares journaled[autogen] on autogen-core 0.7, and dev installs it."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert extras["autogen"] == ["autogen-core>=0.7,<0.8"]
    assert "journaled[autogen]" in extras["dev"]


def test_the_readme_autogen_setup_runs_as_written(tmp_path: Path) -> None:
    """X1: the README's AutoGen Core setup lines run in a fresh process."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### AutoGen Core", 1)[1].split("\n#", 1)[0]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    program = (
        "import asyncio, journaled\n"
        "from autogen_core import SingleThreadedAgentRuntime\n"
        "from autogen_core.memory import MemoryContent\n"
        "async def main():\n"
        "    async with journaled.aio.open('memory://') as rt:\n"
        "        runtime = SingleThreadedAgentRuntime()\n"
        + "".join(f"        {line}\n" for line in block.splitlines())
        + "        await memory.add(MemoryContent(content='tea at five', mime_type='text/plain'))\n"
        "        print((await memory.query('tea')).results[0].content)\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "tea at five"
