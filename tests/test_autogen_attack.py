"""The AutoGen Core integration under hostile and careless use (SPEC X1, A1, ADR 0041).

Every case runs against the real autogen-core: bad settings refused where they are given,
metadata that would be confused with query's own, an AutoGen runtime or loop stopped under a
step, replies and usage reports that are not what they should be.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from autogen_core import MessageContext, RoutedAgent, SingleThreadedAgentRuntime, message_handler
from autogen_core.memory import MemoryContent, MemoryMimeType
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import RequestUsage, SystemMessage, UserMessage
from pydantic import ValidationError

import journaled
from journaled import Plan, Step
from journaled.aio import AsyncRuntime
from journaled.errors import ConfigurationError, InvalidArgument
from journaled.integrations.autogen import (
    RESULT_FIELDS,
    JournaledMemory,
    StepMessage,
    StepReply,
    register_autogen_agent,
)

T = TypeVar("T")


def text(content: str, **metadata: Any) -> MemoryContent:
    return MemoryContent(content=content, mime_type=MemoryMimeType.TEXT, metadata=metadata or None)


def with_aio(url: str, body: Callable[[AsyncRuntime], Awaitable[T]], **options: Any) -> T:
    """Run ``body(rt)`` on a fresh asyncio runtime over ``url``."""

    async def main() -> T:
        async with journaled.aio.open(url, **options) as rt:
            return await body(rt)

    return asyncio.run(main())


# -- settings --------------------------------------------------------------------------------

BAD_SETTINGS: list[tuple[dict[str, Any], str]] = [
    ({"scope": 5}, "scope"),
    ({"scope": "   "}, "scope"),
    ({"scope": "a\x00b"}, "scope"),
    ({"scope": "s" * 2000}, "scope"),
    ({"name": 5}, "name"),
    ({"name": ""}, "name"),
    ({"domain": 5}, "domain"),
    ({"domain": ""}, "domain"),
    ({"source": None}, "source"),
    ({"source": ""}, "source"),
    ({"limit": True}, "limit"),
    ({"limit": 0}, "limit"),
    ({"limit": -3}, "limit"),
    ({"limit": 2.5}, "limit"),
    ({"min_confidence": "high"}, "min_confidence"),
    ({"min_confidence": float("nan")}, "min_confidence"),
    ({"min_confidence": 1.5}, "min_confidence"),
    ({"min_confidence": True}, "min_confidence"),
    ({"semantic": "no"}, "semantic"),
    ({"semantic": 1}, "semantic"),
]


@pytest.mark.parametrize(("settings", "arg"), BAD_SETTINGS)
def test_a_bad_memory_setting_is_refused_at_construction_naming_it(
    sqlite_url: str, settings: dict[str, Any], arg: str
) -> None:
    """X1: JournaledMemory(...) refuses each unusable setting at once, naming the argument."""

    async def body(rt: AsyncRuntime) -> None:
        with pytest.raises(InvalidArgument) as caught:
            JournaledMemory(rt, **settings)
        assert caught.value.field == arg
        assert "\n" not in str(caught.value)

    with_aio(sqlite_url, body)


def test_a_closed_runtime_is_refused_at_construction(sqlite_url: str) -> None:
    """X1: a memory over a closed runtime (sync or asyncio) is refused, naming rt."""
    rt = journaled.open(sqlite_url)
    rt.close()
    with pytest.raises(InvalidArgument, match=r"^rt is a closed runtime"):
        JournaledMemory(rt)

    async def main() -> None:
        art = await journaled.aio.open(sqlite_url)
        await art.close()
        with pytest.raises(InvalidArgument, match=r"^rt is a closed runtime"):
            JournaledMemory(art)

    asyncio.run(main())


@pytest.mark.parametrize("rt", [None, "sqlite:///x.db", object()])
def test_something_else_than_a_runtime_is_refused(rt: object) -> None:
    """X1: a memory over a URL or any non-runtime object names rt and what to pass."""
    with pytest.raises(InvalidArgument, match=r"^rt must be a runtime from journaled.open"):
        JournaledMemory(rt)  # type: ignore[arg-type]


def test_the_organization_scope_needs_an_organization(sqlite_url: str) -> None:
    """X1/M1: scope='organization' without a configured organization is refused at once."""

    async def body(rt: AsyncRuntime) -> None:
        with pytest.raises(InvalidArgument, match=r"^scope 'organization' needs an organization"):
            JournaledMemory(rt, "organization")

    with_aio(sqlite_url, body)

    async def configured(rt: AsyncRuntime) -> None:
        assert JournaledMemory(rt, "organization").scope == "organization"

    with_aio(sqlite_url, configured, organization="acme")


def dumped(sqlite_url: str) -> dict[str, Any]:
    async def body(rt: AsyncRuntime) -> dict[str, Any]:
        return JournaledMemory(rt, "session").dump_component().model_dump()

    return with_aio(sqlite_url, body)


@pytest.mark.parametrize(
    ("edit", "arg"),
    [
        ({"scope": ""}, "scope"),
        ({"limit": 0}, "limit"),
        ({"min_confidence": 7.0}, "min_confidence"),
        ({"source": ""}, "source"),
        ({"name": ""}, "name"),
        ({"scope": "organization"}, "scope"),
    ],
)
def test_a_hand_edited_config_with_a_bad_value_is_refused_before_opening(
    tmp_path: Path, edit: dict[str, Any], arg: str
) -> None:
    """X1: load_component of an edited config names the setting; no journal is opened."""
    model = dumped(f"sqlite:///{tmp_path / 'journal.sqlite'}")
    fresh = tmp_path / "fresh.sqlite"
    model["config"] = {**model["config"], "url": f"sqlite:///{fresh}", **edit}
    with pytest.raises(ConfigurationError, match=rf"^the JournaledMemory config's {arg} "):
        JournaledMemory.load_component(model)
    if edit.get("scope") != "organization":  # the rest is refused before opening anything
        assert not fresh.exists()


@pytest.mark.parametrize(
    ("edit", "field"),
    [({"limit": "5"}, "limit"), ({"semantic": 1}, "semantic"), ({"limt": 3}, "limt")],
)
def test_a_config_of_the_wrong_type_or_with_a_typo_is_refused(
    sqlite_url: str, edit: dict[str, Any], field: str
) -> None:
    """X1: the config is strict: a value of another type or an unknown key names the field."""
    model = dumped(sqlite_url)
    model["config"] = {**model["config"], **edit}
    with pytest.raises(ValidationError, match=field):
        JournaledMemory.load_component(model)


# -- add and query ---------------------------------------------------------------------------


@pytest.mark.parametrize("key", RESULT_FIELDS)
def test_metadata_named_like_a_result_field_is_refused_and_nothing_appended(
    sqlite_url: str, key: str
) -> None:
    """X1: add refuses metadata keys query sets (id, score, ...), naming the key; no event."""

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt, "session")
        before = await rt.journal.position()
        with pytest.raises(InvalidArgument) as caught:
            await memory.add(text("staging runs in eu-west-1", **{key: "mine"}))
        assert caught.value.field == f"metadata[{key!r}]"
        assert "is set by query" in str(caught.value)
        assert await rt.journal.position() == before

    with_aio(sqlite_url, body)


def test_metadata_keys_that_are_not_strings_are_refused(sqlite_url: str) -> None:
    """X1: a metadata key that is not a str is refused naming metadata; nothing appended."""

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt)
        before = await rt.journal.position()
        content = MemoryContent(content="x", mime_type="text/plain", metadata={"a": 1})
        content.metadata = {1: "one", "b": 2}  # type: ignore[dict-item]
        with pytest.raises(InvalidArgument, match=r"^metadata keys must be strings, got int 1"):
            await memory.add(content)
        assert await rt.journal.position() == before

    with_aio(sqlite_url, body)


@pytest.mark.parametrize("query", [5, None, b"staging", ["staging"]])
def test_a_query_that_is_neither_text_nor_content_names_it(sqlite_url: str, query: Any) -> None:
    """X1: query(5), query(None)... raise InvalidArgument naming query, not AttributeError."""

    async def body(rt: AsyncRuntime) -> None:
        with pytest.raises(InvalidArgument, match=r"^query must be a str or a MemoryContent"):
            await JournaledMemory(rt).query(query)

    with_aio(sqlite_url, body)


def test_a_huge_query_is_refused_by_its_size_and_a_blank_one_finds_nothing(
    sqlite_url: str,
) -> None:
    """X1/M6: a query over the text bound names its size; a blank query returns no result."""

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt)
        await memory.add(text("staging runs in eu-west-1"))
        with pytest.raises(InvalidArgument, match=r"^query is \d+ bytes in UTF-8, over"):
            await memory.query("staging " * 200_000)
        assert (await memory.query(" \n\t ")).results == []
        assert (await memory.query("?!")).results == []

    with_aio(sqlite_url, body)


@pytest.mark.parametrize(
    ("options", "arg"),
    [
        ({"limit": True}, "limit"),
        ({"limit": 0}, "limit"),
        ({"min_confidence": 3}, "min_confidence"),
        ({"semantic": "no"}, "semantic"),
        ({"domains": "infra"}, "domains"),
    ],
)
def test_a_bad_query_option_names_it(sqlite_url: str, options: dict[str, Any], arg: str) -> None:
    """X1: query's per-call options are checked like the memory's settings."""

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt)
        await memory.add(text("staging runs in eu-west-1"))
        with pytest.raises(InvalidArgument) as caught:
            await memory.query("staging", **options)
        assert caught.value.field == arg

    with_aio(sqlite_url, body)


# -- update_context, clear, close ------------------------------------------------------------


def test_update_context_refuses_what_is_not_a_model_context(sqlite_url: str) -> None:
    """X1: update_context(None) or a list names model_context instead of an AttributeError."""

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt)
        for bad in (None, [UserMessage(content="hi", source="user")]):
            with pytest.raises(InvalidArgument, match=r"^model_context must be an autogen_core"):
                await memory.update_context(bad)  # type: ignore[arg-type]

    with_aio(sqlite_url, body)


def test_update_context_on_an_empty_context_or_an_empty_memory_adds_nothing(
    sqlite_url: str,
) -> None:
    """X1: no message, a message without text, or no fact: nothing appended to the context."""

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt)
        context = UnboundedChatCompletionContext()
        assert (await memory.update_context(context)).memories.results == []
        await context.add_message(UserMessage(content="where does staging run?", source="user"))
        assert (await memory.update_context(context)).memories.results == []
        assert len(await context.get_messages()) == 1
        await memory.add(text("staging runs in eu-west-1"))
        await memory.update_context(context)
        messages = await context.get_messages()
        assert isinstance(messages[-1], SystemMessage)

    with_aio(sqlite_url, body)


def test_clear_on_an_empty_scope_twice_and_with_superseded_facts(sqlite_url: str) -> None:
    """X1/M8: clear of an empty scope appends nothing; superseded facts are cleared too."""

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt, "session")
        start = await rt.journal.position()
        await memory.clear()
        await memory.clear()
        assert await rt.journal.position() == start
        await memory.add(text("staging is in us-east-1", conflict_key="region"))
        await memory.add(text("staging is in eu-west-1", conflict_key="region"))
        await memory.clear()
        assert [f for f in await rt.memory.all() if f.scope == "session"] == []
        after = await rt.journal.position()
        await memory.clear()
        assert await rt.journal.position() == after

    with_aio(sqlite_url, body)


def test_every_call_after_close_names_the_closed_memory(sqlite_url: str) -> None:
    """X1: add, query, update_context and clear after close raise; close stays idempotent."""

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt, name="notes")
        await memory.close()
        await memory.close()
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: memory.add(text("x")),
            lambda: memory.query("x"),
            lambda: memory.update_context(UnboundedChatCompletionContext()),
            memory.clear,
        ]
        for call in calls:
            with pytest.raises(RuntimeError, match="memory 'notes' is closed"):
                await call()

    with_aio(sqlite_url, body)


# -- agents: arguments -----------------------------------------------------------------------


class Holder(RoutedAgent):
    """An AutoGen agent that holds each StepMessage until released or cancelled (no model)."""

    def __init__(self, gate: Gate) -> None:
        super().__init__("holds messages")
        self._gate = gate

    @message_handler
    async def on_step(self, message: StepMessage, ctx: MessageContext) -> StepReply:
        cancelled = asyncio.Event()
        ctx.cancellation_token.add_callback(cancelled.set)
        self._gate.started.set()
        with contextlib.suppress(TimeoutError):  # bounded: a test that goes wrong fails, not hangs
            await asyncio.wait_for(cancelled.wait(), 10)
        self._gate.cancelled.append(ctx.cancellation_token.is_cancelled())
        self._gate.finished.set()
        return StepReply(output="late")


class Gate:
    """What a test learns from a :class:`Holder`, from any thread."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.finished = threading.Event()
        self.cancelled: list[bool] = []


async def start_holder(gate: Gate) -> SingleThreadedAgentRuntime:
    runtime = SingleThreadedAgentRuntime()
    await Holder.register(runtime, "holder", lambda: Holder(gate))
    runtime.start()
    return runtime


def test_bad_register_arguments_are_refused_naming_them(sqlite_url: str) -> None:
    """X1: register_autogen_agent names a bad or closed rt, agent type, key, factory or loop."""
    closed = asyncio.new_event_loop()
    closed.close()

    async def body(rt: AsyncRuntime) -> None:
        runtime = SingleThreadedAgentRuntime()
        good: dict[str, Any] = {"runtime": runtime, "agent_type": "writer"}
        cases: list[tuple[Any, dict[str, Any], str]] = [
            (object(), good, "rt"),
            (rt, {**good, "runtime": object()}, "runtime"),
            (rt, {**good, "runtime": "runtime"}, "runtime"),
            (rt, {**good, "agent_type": "has space"}, "agent_type"),
            (rt, {**good, "agent_type": ""}, "agent_type"),
            (rt, {**good, "agent_type": 5}, "agent_type"),
            (rt, {**good, "key": 5}, "key"),
            (rt, {**good, "key": ""}, "key"),
            (rt, {**good, "message": "hello"}, "message"),
            (rt, {**good, "reply": 5}, "reply"),
            (rt, {**good, "loop": "loop"}, "loop"),
            (rt, {**good, "loop": closed}, "loop"),
        ]
        for target, kwargs, arg in cases:
            with pytest.raises(InvalidArgument) as caught:
                register_autogen_agent(target, "writer", **kwargs)
            assert caught.value.field == arg, kwargs
        done = journaled.open("memory://")
        done.close()
        with pytest.raises(InvalidArgument, match=r"^rt is a closed runtime"):
            register_autogen_agent(done, "writer", **good)

    with_aio(sqlite_url, body)


def test_a_key_function_returning_no_string_fails_the_step_naming_key(sqlite_url: str) -> None:
    """X1: key(step, ctx) returning an int fails that step with an error naming key."""

    async def body(rt: AsyncRuntime) -> None:
        runtime = SingleThreadedAgentRuntime()
        await Holder.register(runtime, "holder", lambda: Holder(Gate()))
        runtime.start()
        seven: Any = lambda step, ctx: 7  # noqa: E731 - typed Any: it breaks key's contract
        try:
            register_autogen_agent(rt, "holder", runtime=runtime, agent_type="holder", key=seven)
            result = await rt.execute(Plan(goal="g", steps=[Step("a", agent="holder")]))
        finally:
            await runtime.stop()
        assert result.observations[-1].error == (
            "key function must return a non-empty string, got int 7"
        )

    with_aio(sqlite_url, body)


# -- agents: the AutoGen side stops ----------------------------------------------------------


def test_stopping_the_autogen_runtime_mid_step_fails_the_step_promptly(sqlite_url: str) -> None:
    """X1/A1: runtime.stop() while the message is in flight fails the step, naming the agent."""
    gate = Gate()

    async def body(rt: AsyncRuntime) -> None:
        runtime = await start_holder(gate)
        register_autogen_agent(rt, "holder", runtime=runtime, agent_type="holder")
        handle = await rt.start(Plan(goal="g", steps=[Step("a", agent="holder")]))
        await asyncio.to_thread(gate.started.wait, 30)
        loop = asyncio.get_running_loop()
        stopped_at = loop.time()
        await runtime.stop()
        result = await handle.result(timeout=20)
        took = loop.time() - stopped_at
        assert not result.ok
        error = result.observations[-1].error
        assert error is not None
        assert error.startswith("the AutoGen runtime hosting 'holder' was stopped while the ")
        assert "holder/default" in error
        assert took < 5  # the handler holds it 10 s: the step did not wait for that
        # The handler hears the cancel through its token (it would hold 10 s otherwise).
        assert await asyncio.to_thread(gate.finished.wait, 5)
        assert gate.cancelled == [True]

    with_aio(sqlite_url, body)


def test_a_stopped_autogen_runtime_fails_the_step_before_sending(sqlite_url: str) -> None:
    """X1: a step after runtime.stop() fails at once saying to start the runtime again."""

    async def body(rt: AsyncRuntime) -> None:
        runtime = await start_holder(Gate())
        await runtime.stop()
        register_autogen_agent(rt, "holder", runtime=runtime, agent_type="holder")
        result = await rt.execute(Plan(goal="g", steps=[Step("a", agent="holder")]))
        error = result.observations[-1].error
        assert error is not None
        assert "'holder' is not started (or was stopped)" in error

    with_aio(sqlite_url, body)


class LoopThread:
    """An event loop in a thread of its own, as a sync program hosting AutoGen would run it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        assert not self.thread.is_alive()


@pytest.fixture
def autogen_thread() -> Iterator[LoopThread]:
    """Yield an AutoGen loop thread; afterwards run what is left on it, then close it."""
    host = LoopThread()
    try:
        yield host
    finally:
        if host.thread.is_alive():
            host.stop()
        if not host.loop.is_closed():
            # Let the cancels scheduled on the stopped loop run, so nothing is left pending.
            pending = asyncio.all_tasks(host.loop)
            host.loop.run_until_complete(asyncio.wait_for(_settle(pending), 15))
            host.loop.close()


async def _settle(tasks: set[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_stopping_the_autogen_loop_thread_mid_step_fails_the_step_promptly(
    sqlite_url: str, autogen_thread: LoopThread
) -> None:
    """X1: the AutoGen loop stopping while a sync runtime's step waits fails that step."""
    gate = Gate()
    runtime = autogen_thread.run(start_holder(gate))
    with journaled.open(sqlite_url) as rt:
        register_autogen_agent(rt, "holder", runtime=runtime, agent_type="holder")
        handle = rt.start(Plan(goal="g", steps=[Step("a", agent="holder")]))
        assert gate.started.wait(30)
        autogen_thread.stop()
        result = handle.result(timeout=20)
    error = result.observations[-1].error
    assert error is not None
    assert error.startswith("the event loop of the AutoGen runtime hosting 'holder' is stopped")
    assert "in flight" in error


@pytest.mark.parametrize("state", ["stopped", "closed"])
def test_a_stopped_or_closed_autogen_loop_fails_the_step_before_sending(
    sqlite_url: str, autogen_thread: LoopThread, state: str
) -> None:
    """X1: a step whose AutoGen loop no longer runs fails at once: the message is not sent."""
    gate = Gate()
    runtime = autogen_thread.run(start_holder(gate))
    with journaled.open(sqlite_url) as rt:
        register_autogen_agent(
            rt, "holder", runtime=runtime, agent_type="holder", loop=autogen_thread.loop
        )
        autogen_thread.stop()
        if state == "closed":  # closed as asyncio.run closes: its tasks cancelled first
            loop = autogen_thread.loop
            loop.run_until_complete(_settle(asyncio.all_tasks(loop)))
            loop.close()
        handle = rt.start(Plan(goal="g", steps=[Step("a", agent="holder")]))
        result = handle.result(timeout=20)
    assert result.observations[-1].error == (
        f"the event loop of the AutoGen runtime hosting 'holder' is {state}: the message was "
        "not sent"
    )
    assert not gate.started.is_set()


# -- agents: replies -------------------------------------------------------------------------


class Replier(RoutedAgent):
    """An AutoGen agent answering every StepMessage with ``answer(message)`` (no model)."""

    def __init__(self, answer: Callable[[StepMessage], Any]) -> None:
        super().__init__("answers from a script")
        self._answer = answer

    @message_handler
    async def on_step(self, message: StepMessage, ctx: MessageContext) -> Any:
        return self._answer(message)


def run_one(
    sqlite_url: str, answer: Callable[[StepMessage], Any], **options: Any
) -> journaled.ExecuteResult:
    """Execute one step of an AutoGen agent replying ``answer(message)``; return the result."""

    async def body(rt: AsyncRuntime) -> journaled.ExecuteResult:
        runtime = SingleThreadedAgentRuntime()
        await Replier.register(runtime, "writer", lambda: Replier(answer))
        runtime.start()
        try:
            register_autogen_agent(rt, "writer", runtime=runtime, agent_type="writer", **options)
            return await rt.execute(Plan(goal="g", steps=[Step("a", agent="writer", input="x")]))
        finally:
            await runtime.stop()

    return with_aio(sqlite_url, body)


def test_usage_with_bad_token_counts_is_charged_and_says_which_count(sqlite_url: str) -> None:
    """X1/E8: negative, missing or non-usage reports still cost a call; the totals skip them."""
    usage: list[Any] = [
        RequestUsage(prompt_tokens=10, completion_tokens=5),
        RequestUsage(prompt_tokens=-3, completion_tokens=2),
        RequestUsage(prompt_tokens=None, completion_tokens=1),  # type: ignore[arg-type]
        {"prompt_tokens": 1, "completion_tokens": 1},
    ]
    result = run_one(sqlite_url, lambda m: StepReply(output="draft", usage=usage))
    assert result.ok
    (obs,) = result.observations
    assert (obs.output, obs.calls_used, result.calls_used) == ("draft", 4, 4)
    assert obs.data is not None
    assert (obs.data["prompt_tokens"], obs.data["completion_tokens"]) == (10, 5)
    assert obs.data["usage_problem"].startswith(
        "usage[1].prompt_tokens is -3, not a token count (3 of 4 requests left out"
    )


def test_a_reply_error_without_text_still_says_why(sqlite_url: str) -> None:
    """X1/E11: StepReply(error='') fails the step with an error that is not empty."""
    result = run_one(sqlite_url, lambda m: StepReply(error="  "))
    obs = result.observations[-1]
    assert not obs.ok
    assert obs.error == "the AutoGen agent replied StepReply(error=...) with no text: say why"


class Opaque:
    """A reply no journal can hold."""


def test_a_reply_that_cannot_be_journaled_fails_the_step(sqlite_url: str) -> None:
    """X1/E11: a reply that is neither a StepReply nor journalable fails naming the agent."""
    result = run_one(sqlite_url, lambda m: Opaque())
    error = result.observations[-1].error
    assert error is not None
    assert error.startswith("the output of agent 'writer' cannot be journaled")


def test_coroutine_message_and_reply_functions_are_awaited(sqlite_url: str) -> None:
    """X1/A1: message= and reply= may be async def; their results are used, not journaled."""

    async def message(step: Step, ctx: Any) -> StepMessage:
        await asyncio.sleep(0)
        return StepMessage(task=f"async {step.input}", run_id=ctx.run_id, step_id="a", attempt=1)

    async def reply(answer: Any) -> journaled.AgentResult:
        await asyncio.sleep(0)
        return journaled.AgentResult(output=f"read {answer}", calls_used=1)

    result = run_one(sqlite_url, lambda m: m.task, message=message, reply=reply)
    assert result.ok
    assert result.observations[-1].output == "read async x"
    assert result.calls_used == 1


def test_cancelling_the_run_while_the_reply_is_read_cancels_the_reader(sqlite_url: str) -> None:
    """X1/E5: rt.cancel while an async reply reader runs cancels it; the run ends cancelled."""
    reading = asyncio.Event()
    seen: list[str] = []

    async def reply(answer: Any) -> journaled.AgentResult:
        reading.set()
        try:
            await asyncio.sleep(10)  # bounded: a missed cancel fails the test, not hangs it
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        seen.append("finished")
        return journaled.AgentResult(output=answer)

    async def body(rt: AsyncRuntime) -> journaled.ExecuteResult:
        runtime = SingleThreadedAgentRuntime()
        await Replier.register(runtime, "writer", lambda: Replier(lambda m: "draft"))
        runtime.start()
        try:
            register_autogen_agent(rt, "writer", runtime=runtime, agent_type="writer", reply=reply)
            handle = await rt.start(Plan(goal="g", steps=[Step("a", agent="writer")]))
            await asyncio.wait_for(reading.wait(), 30)
            await rt.cancel(handle.run_id)
            return await handle.result(timeout=5)
        finally:
            await runtime.stop()

    result = with_aio(sqlite_url, body)
    assert not result.ok
    assert seen == ["cancelled"]


def test_update_context_with_a_huge_or_broken_last_message_still_finds_facts(
    sqlite_url: str,
) -> None:
    """X1: a last message over the query bound, or with a lone surrogate, is searched, not fatal."""

    async def body(rt: AsyncRuntime) -> None:
        memory = JournaledMemory(rt)
        await memory.add(text("staging runs in eu-west-1"))
        for message in ("where is staging? " + "log line " * 200_000, "staging \ud800 region"):
            context = UnboundedChatCompletionContext()
            await context.add_message(UserMessage(content=message, source="tool"))
            found = await memory.update_context(context)
            assert [r.content for r in found.memories.results] == ["staging runs in eu-west-1"]
            assert isinstance((await context.get_messages())[-1], SystemMessage)

    with_aio(sqlite_url, body)


def test_cancelling_a_sync_runtime_step_cancels_the_message_on_the_autogen_thread(
    sqlite_url: str, autogen_thread: LoopThread
) -> None:
    """X1/E5: rt.cancel reaches the handler on another thread's loop through its token."""
    gate = Gate()
    runtime = autogen_thread.run(start_holder(gate))
    with journaled.open(sqlite_url) as rt:
        register_autogen_agent(rt, "holder", runtime=runtime, agent_type="holder")
        handle = rt.start(Plan(goal="g", steps=[Step("a", agent="holder")]))
        assert gate.started.wait(30)
        rt.cancel(handle.run_id)
        result = handle.result(timeout=20)
    assert not result.ok
    assert gate.finished.wait(5)  # on its own loop, soon after: not after its 10 s hold
    autogen_thread.run(runtime.stop())
    assert gate.cancelled == [True]


class Releasable(RoutedAgent):
    """An AutoGen agent that answers once the test releases it."""

    def __init__(self, started: asyncio.Event, release: asyncio.Event) -> None:
        super().__init__("answers when released")
        self._started = started
        self._release = release

    @message_handler
    async def on_step(self, message: StepMessage, ctx: MessageContext) -> StepReply:
        self._started.set()
        await asyncio.wait_for(self._release.wait(), 10)
        return StepReply(output="done", usage=[RequestUsage(1, 1)])


def test_stop_when_idle_lets_the_message_in_flight_answer(sqlite_url: str) -> None:
    """X1: stop_when_idle waits for the reply in flight: the step gets it, not a stop error."""
    started, release = asyncio.Event(), asyncio.Event()

    async def body(rt: AsyncRuntime) -> journaled.ExecuteResult:
        runtime = SingleThreadedAgentRuntime()
        await Releasable.register(runtime, "writer", lambda: Releasable(started, release))
        runtime.start()
        register_autogen_agent(rt, "writer", runtime=runtime, agent_type="writer")
        handle = await rt.start(Plan(goal="g", steps=[Step("a", agent="writer")]))
        await asyncio.wait_for(started.wait(), 30)
        stopping = asyncio.ensure_future(runtime.stop_when_idle())
        release.set()
        result = await handle.result(timeout=20)
        await asyncio.wait_for(stopping, 10)
        return result

    result = with_aio(sqlite_url, body)
    assert result.ok
    assert (result.observations[-1].output, result.calls_used) == ("done", 1)


def test_a_handler_that_cancels_itself_fails_the_step_naming_the_agent(sqlite_url: str) -> None:
    """X1/E11: CancelledError raised on the AutoGen side is the agent's failure, not a cancel."""

    def cancel(message: StepMessage) -> StepReply:
        raise asyncio.CancelledError

    result = run_one(sqlite_url, cancel)
    assert not result.ok
    assert result.observations[-1].error == (
        "AutoGen agent writer/default failed: its handler was cancelled on the AutoGen side "
        "(it raised CancelledError, or its CancellationToken was cancelled there)"
    )


def test_an_agent_type_not_registered_on_the_autogen_runtime_says_so(sqlite_url: str) -> None:
    """X1: a step whose agent type the AutoGen runtime does not know says to register it."""

    async def body(rt: AsyncRuntime) -> journaled.ExecuteResult:
        runtime = SingleThreadedAgentRuntime()
        runtime.start()
        try:
            register_autogen_agent(rt, "writer", runtime=runtime, agent_type="writer")
            return await rt.execute(Plan(goal="g", steps=[Step("a", agent="writer")]))
        finally:
            await runtime.stop()

    error = with_aio(sqlite_url, body).observations[-1].error
    assert error is not None
    assert error.startswith(
        "AutoGen agent writer/default failed: no agent type 'writer' is registered on the "
        "AutoGen runtime"
    )


@pytest.mark.parametrize("given", ['["zebra", 1]', "3", '"zebra"'])
def test_json_content_that_is_no_object_comes_back_as_given(tmp_path: Path, given: str) -> None:
    """X1, ADR 0041: MemoryContent holds a JSON object, never an array or a number; JSON
    content given as such text is stored, and query and update_context answer it as the text it
    was given as, instead of failing every turn that finds it."""

    async def main() -> None:
        async with journaled.aio.open(f"sqlite:///{tmp_path}/j.sqlite") as rt:
            memory = JournaledMemory(rt, "session")
            await memory.add(MemoryContent(content=given, mime_type=MemoryMimeType.JSON))
            await memory.add(MemoryContent(content="the zebra fact", mime_type="text/plain"))
            found = await memory.query("zebra" if "zebra" in given else "3")
            contents = {r.content for r in found.results}
            assert given in contents
            context = UnboundedChatCompletionContext()
            await context.add_message(UserMessage(content="zebra 3", source="user"))
            await memory.update_context(context)
            assert len(await context.get_messages()) == 2

    asyncio.run(main())


def test_a_config_dumped_over_a_relative_path_loads_the_same_journal_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0041: loading a dumped config opens the journal it was dumped from; a relative
    ``sqlite:///`` URL is written as its absolute file, so another working directory does not
    open a new, empty journal."""
    monkeypatch.chdir(tmp_path)

    async def main() -> None:
        with journaled.open("sqlite:///rel.sqlite?durability=full") as rt:
            memory = JournaledMemory(rt, "session")
            await memory.add(MemoryContent(content="the zebra fact", mime_type="text/plain"))
            dumped = memory.dump_component()
        assert dumped.config["url"] == f"sqlite:///{tmp_path / 'rel.sqlite'}?durability=full"
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        monkeypatch.chdir(elsewhere)
        loaded = JournaledMemory.load_component(dumped)
        try:
            found = await loaded.query("zebra")
        finally:
            await loaded.close()
        assert [r.content for r in found.results] == ["the zebra fact"]
        assert not (elsewhere / "rel.sqlite").exists()

    asyncio.run(main())
