"""The step worker: the actor that runs one step of any kind (skill, tool, agent) at a time.

A worker runs user code in its own thread, so a busy step never blocks the executor: it is told a
:class:`RunStep` and tells a :class:`StepDone` back to the executor's address, or, when the
executor is free, has it take the result in this thread (ADR 0043). An exception in user
code becomes a failed observation (E11). An output that cannot be journaled (not msgspec-encodable,
or larger than :data:`MAX_OUTPUT_BYTES`) fails its own step rather than the run. ``async def``
functions run on the runtime's event loop (:mod:`journaled.actors.loop`) while the worker waits.

There is one worker kind, not one per step kind (ADR 0027): what differs between skills, tools and
agents is how they are called (:func:`run_callable`, :func:`run_agent`) and costed
(:mod:`journaled.events.plan_rules`), all of it plain functions kept apart from pykka so they can
run on other actor systems.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine, Generator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import msgspec
import pykka

from journaled.actors.directory import Directory, quick_inbox
from journaled.actors.errors import RuntimeClosed
from journaled.actors.loop import (
    CANCELLED,
    Cancellations,
    LoopGone,
    LoopRunner,
    StepCancelled,
    StepToken,
)
from journaled.actors.placement import Placement, resources_problem, run_placed
from journaled.actors.run_args import child_run_id
from journaled.actors.tracing import Tracing
from journaled.events.inputs import int_problem, short, text_problem
from journaled.events.memory import Fact
from journaled.events.plans import (
    OBSERVATION_CODES,
    AgentResult,
    ExecuteResult,
    Observation,
    ObservationCode,
    Plan,
    Retry,
    Step,
    retry_problem,
)
from journaled.events.redact import redact
from journaled.events.run_messages import RunStep, StepDone

MAX_OUTPUT_BYTES = 1 << 20
"""Largest encoded output (and error text) a step may journal: 1 MiB."""
MAX_AGENT_DATA_BYTES = 64 << 10
"""Largest encoded ``data`` an agent step may journal (64 KiB); larger data is dropped, noted."""
_ENCODER = msgspec.msgpack.Encoder()


class NeedsInput(Exception):
    """Raised by an agent to wait for a human answer (E10): the step stays pending."""

    def __init__(self, question: str) -> None:
        self.question = question
        super().__init__(question)


class MemoryAccess(Protocol):
    """The runtime memory operations a step may use through ``ctx.memory`` (P1)."""

    def search(self, query: str, *args: Any, **kwargs: Any) -> list[Fact]: ...
    def search_semantic(self, query: str, *args: Any, **kwargs: Any) -> list[Fact]: ...
    def search_hybrid(self, query: str, *args: Any, **kwargs: Any) -> list[Fact]: ...
    def get(self, fact_id: str) -> Fact | None: ...
    def all(self) -> list[Fact]: ...
    def remember(self, text: str, *args: Any, **kwargs: Any) -> Fact: ...


class StepMemory:
    """``ctx.memory``: the runtime's memory, noting the ids of the facts each read returns (P1).

    The reads of one step attempt are collected here and journaled once, as ``run.memory-read``
    in the commit of the attempt's result (ADR 0033). A fact remembered through it records this
    run and step as its provenance. Thread-safe.
    """

    def __init__(self, memory: MemoryAccess, run_id: str, step_id: str) -> None:
        self._memory = memory
        self._run_id = run_id
        self._step_id = step_id
        self._ids: dict[str, None] = {}
        self._ops: dict[str, None] = {}
        self._lock = threading.Lock()
        self.began: tuple[int | None, int | None] = (None, None)
        """Where and when the first read began (ADR 0062): (journal position, epoch ms)."""
        self._begun = False

    def _begin(self) -> None:
        """Note where the attempt's first read begins, before it reads (ADR 0062)."""
        if self._begun:
            return
        mark = getattr(self._memory, "read_mark", None)
        began = mark() if mark is not None else (None, None)
        with self._lock:
            if not self._begun:
                self.began, self._begun = began, True

    def _note(self, op: str, facts: list[Fact]) -> list[Fact]:
        with self._lock:
            self._ops[op] = None
            for fact in facts:
                self._ids[fact.id] = None
        return facts

    def search(self, query: str, *args: Any, **kwargs: Any) -> list[Fact]:
        """Search by BM25 like ``rt.memory.search``; the ids returned are journaled."""
        self._begin()
        return self._note("search", self._memory.search(query, *args, **kwargs))

    def search_semantic(self, query: str, *args: Any, **kwargs: Any) -> list[Fact]:
        """Search by meaning like ``rt.memory.search_semantic``; the ids returned are journaled."""
        self._begin()
        return self._note("search_semantic", self._memory.search_semantic(query, *args, **kwargs))

    def search_hybrid(self, query: str, *args: Any, **kwargs: Any) -> list[Fact]:
        """Search like ``rt.memory.search_hybrid`` (ADR 0047); the ids returned are journaled."""
        self._begin()
        return self._note("search_hybrid", self._memory.search_hybrid(query, *args, **kwargs))

    def get(self, fact_id: str) -> Fact | None:
        """Return a fact like ``rt.memory.get``; its id is journaled when found."""
        self._begin()
        fact = self._memory.get(fact_id)
        self._note("get", [] if fact is None else [fact])
        return fact

    def all(self) -> list[Fact]:
        """Return every fact like ``rt.memory.all``; every id returned is journaled."""
        self._begin()
        return self._note("all", self._memory.all())

    def remember(self, text: str, *args: Any, **kwargs: Any) -> Fact:
        """Remember a fact like ``rt.memory.remember``, recording this run and step with it."""
        return self._memory.remember(
            text, *args, run_id=self._run_id, step_id=self._step_id, **kwargs
        )

    def reads(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Return (fact ids, operations) read so far, in first-read order."""
        with self._lock:
            return tuple(self._ids), tuple(self._ops)


class ToolContext:
    """What a tool or skill declaring a ``ctx`` keyword parameter receives (P1).

    Attributes:
        run_id: the run the step belongs to.
        step_id: the step.
        attempt: 1 for the first execution, higher on a re-run.
        memory: the runtime's memory; reads are journaled with the step. None when the runtime
            gave the worker no memory.
    """

    def __init__(self, msg: RunStep, memory: StepMemory | None) -> None:
        self.run_id = msg.run_id
        self.step_id = msg.step.id
        self.attempt = msg.attempt
        self.memory = memory


def wants_ctx(fn: Callable[..., Any]) -> bool:
    """Tell whether a tool or skill declares a keyword parameter named ``ctx`` (P1)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # some builtins have no signature: they take no ctx
        return False
    param = params.get("ctx")
    return param is not None and param.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


class Registry:
    """The skills, tools and agents a runtime can run, by name. Thread-safe."""

    def __init__(self, agents_enabled: bool = True) -> None:
        self.agents_enabled = agents_enabled
        self.skills: dict[str, Callable[[Any], Any]] = {}
        self.tools: dict[str, Callable[[Any], Any]] = {}
        self.agents: dict[str, Callable[[Step, AgentContext], AgentResult]] = {}
        self.with_ctx: set[tuple[str, str]] = set()
        """(kind, name) of the skills and tools that take ``ctx``: decided once, at registration."""
        self.resources: dict[tuple[str, str], dict[str, Any]] = {}
        """(kind, name) -> what its steps ask of the placement that runs them (S1)."""
        self.retries: dict[tuple[str, str], Retry] = {}
        """(kind, name) -> its retry policy (S2); empty for most runtimes, checked first."""
        self._lock = threading.Lock()

    def register(
        self,
        kind: str,
        name: str,
        fn: Callable[..., Any],
        *,
        resources: Mapping[str, Any] | None = None,
        retry: Retry | None = None,
    ) -> None:
        """Register (or replace) a function under a kind and name, with its placement needs
        and retry policy (S1, S2)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {kind} name must be a non-empty string, got {name!r}")
        if not callable(fn):
            raise TypeError(f"{kind} {name!r} must be callable, got {type(fn).__name__}")
        problem = None if resources is None else resources_problem(resources)
        if problem:
            raise ValueError(f"resources of {kind} {name!r} {problem}")
        problem = None if retry is None else retry_problem(retry)
        if problem:
            raise ValueError(f"retry of {kind} {name!r} {problem}")
        key = (kind, name)
        with self._lock:
            table: dict[str, Any] = getattr(self, kind + "s")
            table[name] = fn
            if kind != "agent" and wants_ctx(fn):
                self.with_ctx.add(key)
            else:
                self.with_ctx.discard(key)
            if resources is None:
                self.resources.pop(key, None)
            else:
                self.resources[key] = dict(resources)
            if retry is None:
                self.retries.pop(key, None)
            else:
                self.retries[key] = retry

    def resources_of(self, step: Step) -> dict[str, Any] | None:
        """Return what the step's registration asks of its placement, or None."""
        with self._lock:
            return self.resources.get((step.kind or "", step.target))

    def retry_of(self, step: Step) -> Retry | None:
        """Return the retry policy of the step's skill, tool or agent, or None (S2)."""
        with self._lock:
            return self.retries.get((step.kind or "", step.target))

    def takes_ctx(self, step: Step) -> bool:
        """Tell whether the skill or tool a step names was registered with a ``ctx`` parameter."""
        kind = "skill" if step.skill is not None else "tool"
        with self._lock:
            return (kind, step.target) in self.with_ctx

    def lookup(self, step: Step) -> Callable[..., Any] | None:
        """Return the function a step names, or None if it is not registered."""
        with self._lock:
            if step.skill is not None:
                return self.skills.get(step.skill)
            if step.tool is not None:
                return self.tools.get(step.tool)
            if step.agent is not None and self.agents_enabled:
                return self.agents.get(step.agent)
        return None


class AgentContext:
    """What an agent function receives besides its step.

    Attributes:
        run_id: the run the step belongs to.
        step_id: the step.
        attempt: 1 for the first execution; higher when the step runs again after a crash or an
            answer. Steps are executed at least once: use (run_id, step_id, attempt) to stay
            idempotent.
        reservation: model calls reserved for this agent (E6); None when unbounded (no call
            budget and a ``reserve`` answering infinity): the agent is charged what it reports.
        answer: the human answer given on resume, or None (E10).
    """

    def __init__(
        self,
        msg: RunStep,
        token: StepToken | None = None,
        child_runner: Callable[..., ExecuteResult] | None = None,
        memory: StepMemory | None = None,
        child_starter: Callable[..., Future[ExecuteResult]] | None = None,
    ) -> None:
        self.memory = memory
        """The runtime's memory; each read's fact ids are journaled with the step (P1)."""
        self.run_id = msg.run_id
        self.step_id = msg.step.id
        self.attempt = msg.attempt
        self.reservation = msg.reservation
        self.answer = msg.answer
        self._cancel = token
        self._runner = child_runner
        self._starter = child_starter
        """Starts a child plan and returns the future its run completes (``execute_async``)."""
        self.child_runs: list[str] = []
        self._calls = 0
        self._calls_lock = threading.Lock()
        self.unawaited = 0
        """Calls of ``ctx.execute`` from an async agent not awaited (yet): each started nothing."""
        self._in_flight: list[str] = []
        """The child runs started by calls that have not returned yet, oldest first."""
        self.interrupted = False
        """Set when a child run was cut short by the runtime closing: the step has no result
        and runs again on resume, whatever the agent returns (R3)."""

    def cancelled(self) -> bool:
        """Tell whether the run was asked to stop (E5)."""
        return self._cancel is not None and self._cancel.is_set()

    def execute(self, plan: Plan, **options: Any) -> ExecuteResult:
        """Run a child plan as a journaled run linked to this step (E9).

        A child is identified by (this run, this step, the ordinal of this call within the step):
        when the step runs again — after an answer, a crash or a retry — the same call finds its
        child again and resumes it (or returns its result if it finished) instead of starting a
        duplicate (R5). The plan given on a re-run is not compared with the first one.

        In an ``async def`` agent (on an event loop) it cannot block the loop: it returns at
        once an awaitable, and ``await ctx.execute(plan)`` gives the result (as
        :meth:`execute_async` does). The return type is a sync agent's: annotate an async
        agent's ``ctx`` as :class:`AsyncAgentContext` to type that awaitable.

        Raises:
            RuntimeClosed: the runtime is closing; the child (if any) was suspended and this step
                runs again on resume.
        """
        if self._runner is None:
            raise RuntimeError("this agent context cannot start child runs")
        if _in_event_loop():
            return cast(ExecuteResult, _ChildRunAwaited(self, plan, options))
        call, child = self._reserve()
        return self._run_child(plan, call, child, options)

    def _reserve(self) -> tuple[int, str]:
        """Take the next call ordinal of this step and the id of the child it names."""
        with self._calls_lock:
            # The ordinal is taken when the call starts, so calls from several threads of the
            # step get distinct children (R5); a call that fails still uses its ordinal.
            self._calls += 1
            call = self._calls
            child = child_run_id(self.run_id, self.step_id, call)
            self._in_flight.append(child)
            if self._cancel is not None:
                self._cancel.child = child  # named by a timeout's observation (E9)
        return call, child

    def _run_child(
        self, plan: Plan, call: int, child: str, options: dict[str, Any]
    ) -> ExecuteResult:
        runner = self._runner
        assert runner is not None  # checked by execute and execute_async
        try:
            result = runner(plan, parent=(self.run_id, self.step_id), call=call, **options)
        except RuntimeClosed:
            self.interrupted = True
            raise
        finally:
            self._returned(child)
        return self._child_result(result)

    def _returned(self, child: str) -> None:
        """Note that the call that started ``child`` no longer waits for it."""
        with self._calls_lock:
            self._in_flight.remove(child)

    def _ended_unawaited(self, child: str, ended: Future[ExecuteResult]) -> None:
        """Note the end of a child whose call stopped waiting for it (its agent was cancelled);
        one a close cut short leaves the step without a result, as an awaited one does (R3)."""
        self.child_runs.append(child)
        self._returned(child)
        error = ended.exception()
        if isinstance(error, RuntimeClosed) or (error is None and ended.result().suspended):
            self.interrupted = True

    def _child_result(self, result: ExecuteResult) -> ExecuteResult:
        """Return a child run's result to the agent, or raise RuntimeClosed if it was suspended."""
        self.child_runs.append(result.run_id)
        if result.suspended:
            self.interrupted = True
            raise RuntimeClosed(
                f"the runtime closed while child run {result.run_id} ran; it was suspended and "
                "this step runs again when its run is resumed"
            )
        return result

    def last_child(self) -> str | None:
        """Return the child run to name in the step's observation (E9): the one a call still
        waits for (an async agent cancelled while it awaited its child), else the last one a
        call returned, else None."""
        with self._calls_lock:
            if self._in_flight:
                return self._in_flight[-1]
        return self.child_runs[-1] if self.child_runs else None

    async def execute_async(self, plan: Plan, **options: Any) -> ExecuteResult:
        """Run a child plan like :meth:`execute`, from an async agent, without blocking its loop.

        The call's ordinal is taken on the loop, in the order the agent's calls start (for
        ``asyncio.gather`` of several, the order of its arguments), not by whichever worker
        thread runs first: each call finds its own child again on a re-run (R5).
        """
        if self._runner is None:
            raise RuntimeError("this agent context cannot start child runs")
        call, child = self._reserve()
        if self._starter is None:
            return await asyncio.to_thread(self._run_child, plan, call, child, options)
        parent = (self.run_id, self.step_id)
        started: Future[ExecuteResult] | None = None
        try:
            # Only the start runs in a thread (the journal read and the opening append); the
            # child's whole life is awaited on its future, so no thread waits for it: nested
            # async agents, however many, hold no thread of the loop's executor (A1).
            started = await asyncio.to_thread(
                self._starter, plan, parent=parent, call=call, **options
            )
            result = await asyncio.wrap_future(started)
        except asyncio.CancelledError:
            # The agent stopped waiting (its run was cancelled, its deadline passed): the child
            # goes on, and is the one its step names until it ends (E9).
            if started is not None:
                started.add_done_callback(functools.partial(self._ended_unawaited, child))
            raise
        except RuntimeClosed:
            self.interrupted = True
            self._returned(child)
            raise
        except BaseException:
            self._returned(child)
            raise
        self._returned(child)
        return self._child_result(result)


class AsyncAgentContext(Protocol):
    """The type of ``ctx`` for an ``async def`` agent: an :class:`AgentContext` as its loop sees it.

    The object is the same :class:`AgentContext` a sync agent gets; what differs is what
    :meth:`execute` returns. Called on an event loop, it cannot block the loop, so it returns an
    awaitable of the result (A1, E9), which a sync agent's call never is. Which of the two a call
    gets depends on whether a loop runs in the calling thread, which no static type can see, so
    ``AgentContext.execute`` is typed for sync agents (``-> ExecuteResult``), and an async agent
    annotates ``ctx: journaled.AsyncAgentContext`` to have ``result = await ctx.execute(plan)``
    check as an :class:`ExecuteResult`, and a forgotten ``await`` reported. (From a thread the
    agent starts itself, where no loop runs, ``ctx.execute`` blocks and returns the result:
    call ``ctx.execute_async`` on the loop instead.)
    """

    @property
    def memory(self) -> StepMemory | None:
        """The runtime's memory; each read's fact ids are journaled with the step (P1)."""

    @property
    def run_id(self) -> str:
        """The run the step belongs to."""

    @property
    def step_id(self) -> str:
        """The step."""

    @property
    def attempt(self) -> int:
        """1 for the first execution; higher when the step runs again."""

    @property
    def reservation(self) -> int | None:
        """Model calls reserved for this agent (E6); None when unbounded."""

    @property
    def answer(self) -> str | None:
        """The human answer given on resume, or None (E10)."""

    def cancelled(self) -> bool:
        """Tell whether the run was asked to stop (E5)."""

    def execute(self, plan: Plan, **options: Any) -> Coroutine[Any, Any, ExecuteResult]:
        """Return an awaitable that runs a child plan as a journaled run linked to this step."""

    async def execute_async(self, plan: Plan, **options: Any) -> ExecuteResult:
        """Run a child plan without blocking the agent's loop (as ``await execute``)."""


class _ChildRunAwaited(Coroutine[Any, Any, ExecuteResult]):
    """``ctx.execute(plan)`` called from an async agent: awaiting it runs the child.

    Nothing starts until it is awaited (so one never awaited leaves no run and no coroutine
    behind); reading a result's attribute from it says to await it. It is a coroutine as
    asyncio sees one, so ``asyncio.create_task`` and a ``TaskGroup`` take it as ``gather``
    does; like a coroutine, it runs once: awaiting it again raises RuntimeError.
    """

    __slots__ = ("_coro", "_ctx", "_options", "_plan")

    def __init__(self, ctx: AgentContext, plan: Plan, options: dict[str, Any]) -> None:
        self._ctx, self._plan, self._options = ctx, plan, options
        self._coro: Coroutine[Any, Any, ExecuteResult] | None = None
        with ctx._calls_lock:
            ctx.unawaited += 1

    def _started(self) -> Coroutine[Any, Any, ExecuteResult]:
        if self._coro is None:
            with self._ctx._calls_lock:
                self._ctx.unawaited -= 1
            self._coro = self._ctx.execute_async(self._plan, **self._options)
        return self._coro

    def __await__(self) -> Generator[Any, None, ExecuteResult]:
        if self._coro is not None:
            raise RuntimeError(
                "ctx.execute(plan) was awaited already: it runs its child once; keep its result"
            )
        return self._started().__await__()

    def send(self, value: Any) -> Any:
        return self._started().send(value)

    def throw(self, *args: Any) -> Any:
        return self._started().throw(*args)

    def close(self) -> None:
        if self._coro is not None:
            self._coro.close()

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"ctx.execute(plan) in an async agent returns an awaitable, not the result: "
            f"use `await ctx.execute(plan)` (asked for .{name})"
        )


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def journalable(value: Any, what: str, limit: int = MAX_OUTPUT_BYTES) -> Any:
    """Return ``value`` as msgspec builtins, or raise ValueError saying why it cannot be stored."""
    if value is None:  # most tools' output: nothing to convert or measure
        return None
    try:
        builtins = msgspec.to_builtins(value, builtin_types=_RAW)
        encoded = _ENCODER.encode(builtins)
        if any(marker in encoded for marker in _BIN_MARKERS):  # bytes, or a string holding one
            try:
                builtins = _bytes_as_text(builtins)
            except RecursionError:  # too deep to walk here: its bytes stored as they come
                builtins = msgspec.to_builtins(value)
            encoded = _ENCODER.encode(builtins)
        size = len(encoded)
        problem = _key_problem(builtins)
    except RecursionError:
        raise ValueError(
            f"{what} cannot be journaled: it contains itself (or nests too deep)"
        ) from None
    except (TypeError, ValueError, OverflowError) as exc:
        # OverflowError: msgpack holds ints of 64 bits; ValueError includes a lone surrogate.
        raise ValueError(f"{what} cannot be journaled: {exc}") from exc
    if problem:
        raise ValueError(f"{what} cannot be journaled: {problem}")
    if size > limit:
        raise ValueError(f"{what} is {size} bytes encoded, over the {limit}-byte bound")
    return builtins


_JSON = msgspec.json.Encoder()
_JSON_DECODER = msgspec.json.Decoder()


def _key_problem(builtins: Any) -> str | None:
    """Say where a dict of ``builtins`` has a key JSON cannot carry, or None.

    A JSON object is keyed by text; msgspec writes an int or float key as its text, so those
    reach every JSON door (the CLI's ``--json``, a JSON wire client, ``why``), but a tuple,
    None or bool key would break each of them on the stored run, for good (ADR 0098).
    """
    try:
        text = _JSON.encode(builtins)  # in C: nearly every value passes here, and is not walked
    except TypeError:
        pass
    else:
        # Keys 1 and "1" (or two NaNs) are both written "1" by JSON: a JSON reader keeps one of
        # the two. Read back and written again, such a text comes out shorter (in C as well).
        if len(_JSON.encode(_JSON_DECODER.decode(text))) == len(text):
            return None
    # Iterative, each node linked to its parent: a path is spelled only for the key refused.
    links: list[tuple[int, str]] = [(-1, "$")]
    todo: list[tuple[Any, int]] = [(builtins, 0)]
    while todo:
        value, at = todo.pop()
        if isinstance(value, dict):
            written: dict[str, object] = {}
            for key, item in value.items():
                if isinstance(key, bool) or not isinstance(key, str | int | float):
                    return (
                        f"a key at {_path(links, at)} is {_key_kind(key)}, not a str: a stored "
                        "dict is keyed by text (or a number, which JSON reads as its text)"
                    )
                as_text = key if isinstance(key, str) else _key_text(key)
                if as_text in written:
                    return (
                        f"the keys {_shown(written[as_text])} and {_shown(key)} at "
                        f"{_path(links, at)} are both written {_quoted(as_text)} in JSON, which "
                        "would keep one of their values: key the dict by one of them"
                    )
                written[as_text] = key
                links.append((at, f"[{_quoted(key) if isinstance(key, str) else repr(key)}]"))
                todo.append((item, len(links) - 1))
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                links.append((at, f"[{i}]"))
                todo.append((item, len(links) - 1))
    return None


def _path(links: list[tuple[int, str]], at: int) -> str:
    parts: list[str] = []
    while at >= 0:
        at, part = links[at]
        parts.append(part)
    path = "".join(reversed(parts))
    return path if len(path) <= 160 else f"{path[:80]}…{path[-72:]}"


def _key_kind(key: object) -> str:
    if key is None or isinstance(key, bool):
        return repr(key)
    return f"a {type(key).__name__}"


def _key_text(key: int | float) -> str:
    """Return the text JSON writes for a number key."""
    (text,) = _JSON_DECODER.decode(_JSON.encode({key: None}))
    return str(text)


def _shown(key: object) -> str:
    return _quoted(key) if isinstance(key, str) else repr(key)


_RAW = (bytes, bytearray, memoryview)
_BIN_MARKERS = (b"\xc4", b"\xc5", b"\xc6")
"""msgpack's ``bin`` headers: absent from an encoding that holds no bytes."""


def _bytes_as_text(value: Any) -> Any:
    """Return builtins with each bytes value as base64 text, as msgspec would store it, but of
    its redacted text when it decodes as UTF-8 (M9): base64 of a token is the token to anyone
    who reads the journal, and no rule reads base64."""
    if isinstance(value, _RAW):
        raw = bytes(value)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            redacted = redact(text)
            if redacted != text:
                raw = redacted.encode("utf-8")
        return base64.b64encode(raw).decode("ascii")
    if isinstance(value, dict):
        return {_bytes_as_text(k): _bytes_as_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_bytes_as_text(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_bytes_as_text(v) for v in value)
    return value


def _error_text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # user code's __str__ may raise too: the step still fails, named
        text = f"{type(exc).__name__} (its message could not be read)"
    if isinstance(exc, SystemExit | KeyboardInterrupt):
        text = f"{type(exc).__name__}({text})" if text else type(exc).__name__
    return storable_text(text or type(exc).__name__)


def storable_text(text: str, limit: int = 4096) -> str:
    """Return user code's message as UTF-8-storable text of at most ``limit`` characters.

    Redacted before it is cut (M9): a token cut first may be too short for its rule, and its
    head would be kept. What is redacted is bounded too (eight times ``limit``), so a huge
    message costs no more than a long one.
    """
    if len(text) > limit:
        text = redact(text[: 8 * limit])
        text = text if len(text) <= limit else text[:limit] + "…"
    # A lone surrogate cannot be stored; keep it visible as its escape instead of failing the run.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def call_user(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    loop: LoopRunner | None,
    token: StepToken | None,
    ctx: ToolContext | None = None,
) -> Any:
    """Call user code, with ``ctx=`` when given; a coroutine runs on ``loop`` (A1).

    Raises:
        StepCancelled: the coroutine's task was cancelled (run cancelled or deadline passed).
    """
    result = fn(*args, **({} if ctx is None else {"ctx": ctx}))
    if inspect.isawaitable(result):
        if loop is None:
            raise RuntimeError("an async step needs an event loop, and this worker has none")
        return loop.run(result, token)
    return result


def run_callable(
    kind: str,
    step: Step,
    fn: Callable[[Any], Any],
    loop: LoopRunner | None = None,
    token: StepToken | None = None,
    ctx: ToolContext | None = None,
    *,
    ending: Callable[[BaseException], bool] | None = None,
) -> Observation:
    """Run a skill or tool function and observe the outcome (E11); ``ctx`` is passed if given.

    ``ending`` picks out what ends the process rather than the step (a Ray worker told to
    terminate, S2): that is raised on, not observed; a ``sys.exit()`` of user code still fails
    its step.
    """
    try:
        output = call_user(fn, (step.input,), loop, token, ctx)
        stored = journalable(output, f"the output of {kind} {step.target!r}")
    except LoopGone:
        raise  # no result: the step runs again on resume (R3)
    except StepCancelled as exc:
        # A cancel of its run cancelled its task: said as E5 says it, not as a failure.
        code: ObservationCode | None = "cancelled" if exc.reason == CANCELLED else None
        return Observation(
            step_id=step.id, skill=step.skill, tool=step.tool, ok=False, error=str(exc), code=code
        )
    except BaseException as exc:  # SystemExit from user code fails its step, not the process
        if ending is not None and ending(exc):
            raise
        return Observation(
            step_id=step.id, skill=step.skill, tool=step.tool, ok=False, error=_error_text(exc)
        )
    return Observation(step_id=step.id, skill=step.skill, tool=step.tool, ok=True, output=stored)


def run_agent(
    step: Step,
    fn: Callable[[Step, AgentContext], Any],
    msg: RunStep,
    *,
    token: StepToken | None = None,
    child_runner: Callable[..., ExecuteResult] | None = None,
    loop: LoopRunner | None = None,
    memory: StepMemory | None = None,
    child_starter: Callable[..., Future[ExecuteResult]] | None = None,
    ending: Callable[[BaseException], bool] | None = None,
) -> tuple[Observation, str | None]:
    """Run an agent function; return its observation and, if it waits, its question (E9, E10).

    ``ending`` picks out what ends the process rather than the step, as for
    :func:`run_callable`.

    Raises:
        RuntimeClosed: a child run was cut short by the runtime closing (R3): no result.
    """
    ctx = AgentContext(msg, token, child_runner, memory, child_starter)
    obs, question = _observe_agent(step, fn, ctx, loop, token, ending)
    if ctx.interrupted:
        raise RuntimeClosed(f"step {step.id!r} was interrupted by the runtime closing")
    return obs, question


def _observe_agent(
    step: Step,
    fn: Callable[[Step, AgentContext], Any],
    ctx: AgentContext,
    loop: LoopRunner | None,
    token: StepToken | None,
    ending: Callable[[BaseException], bool] | None = None,
) -> tuple[Observation, str | None]:
    base: dict[str, Any] = {"step_id": step.id, "agent": step.agent}
    try:
        result = call_user(fn, (step, ctx), loop, token)
    except LoopGone:
        raise  # no result: the step runs again on resume (R3)
    except NeedsInput as need:
        task = ctx.last_child()
        problem = text_problem(need.question, empty=False)
        if problem:
            error = f"agent {step.agent!r} asked a question that {problem}"
            return Observation(**base, ok=False, code="agent-failed", error=error), None
        question = need.question
        obs = Observation(
            **base, ok=False, code="agent-waiting", error=question, agent_task_id=task
        )
        return obs, question
    except StepCancelled as exc:
        task = ctx.last_child()
        # A cancel of its run cancelled its task: said as E5 says it, not as a failure.
        said: ObservationCode = "cancelled" if exc.reason == CANCELLED else "agent-failed"
        return Observation(**base, ok=False, code=said, error=str(exc), agent_task_id=task), None
    except BaseException as exc:  # SystemExit from user code fails its step, not the process
        if ending is not None and ending(exc):
            raise
        task = ctx.last_child()
        obs = Observation(
            **base, ok=False, code="agent-failed", error=_error_text(exc), agent_task_id=task
        )
        return obs, None
    task = ctx.last_child()
    if ctx.unawaited:
        # A forgotten ``await``: the child run it meant was never started, so whatever the
        # agent answered rests on nothing; its step fails, saying so, rather than passing.
        error = (
            f"agent {step.agent!r} called ctx.execute(plan) without awaiting it, so no child run "
            "was started: in an async agent, `await ctx.execute(plan)` (or `await "
            "ctx.execute_async(plan)`)"
        )
        return Observation(**base, ok=False, code="agent-failed", error=error), None
    if not isinstance(result, AgentResult):
        error = f"agent {step.agent!r} returned {type(result).__name__}, not journaled.AgentResult"
        return Observation(**base, ok=False, code="agent-failed", error=error), None
    field = "ok"
    try:
        if not isinstance(result.ok, bool):
            # Read by truth, ok="false" would journal a failure as a success.
            raise ValueError(
                f"the agent's ok must be True or False, got {type(result.ok).__name__}"
            )
        field = "output"
        output = journalable(result.output, f"the output of agent {step.agent!r}")
        field = "artifacts"
        artifacts = tuple(journalable(_artifacts(result.artifacts), "the agent's artifacts"))
        field = "calls_used"
        calls = result.calls_used
        problem = None if calls is None else int_problem(calls, low=0)
        if problem:
            # Not a report: the step is charged its reservation (E8), never made free (R6).
            raise ValueError(f"calls_used {problem}")
        problem = None if result.error is None else text_problem(result.error)
        if problem:
            raise ValueError(f"the agent's error {problem}")
        if result.code is not None and result.code not in OBSERVATION_CODES:
            # Journaled as is it would be unreadable (not an ObservationCode), and a free text
            # the redaction never reads (M9): the step fails instead, saying what it got.
            raise ValueError(
                f"the agent's code must be None or one of {', '.join(sorted(OBSERVATION_CODES))}"
                f", got {_quoted(result.code)}"
            )
        field = "data"
        try:
            data = journalable(result.data, "the agent's data", MAX_AGENT_DATA_BYTES)
        except ValueError as exc:
            data = {"dropped": str(exc)}
    except ValueError as exc:
        return Observation(**base, ok=False, code="agent-failed", error=str(exc)), None
    except (Exception, SystemExit) as exc:  # user objects read here run user code (E11)
        if ending is not None and ending(exc):
            raise
        error = f"the agent's {field} could not be read: {type(exc).__name__}: {_error_text(exc)}"
        return Observation(**base, ok=False, code="agent-failed", error=error), None
    code = result.code
    if code == "agent-waiting":
        question = result.error or "the agent is waiting for input"
        # The calls it spent before asking are charged with the wait (E8, ADR 0013).
        obs = Observation(
            **base, ok=False, code=code, error=question, calls_used=calls, agent_task_id=task
        )
        return obs, question
    obs = Observation(
        **base,
        ok=result.ok,
        output=output,
        error=result.error,
        code=code,
        data=data,
        artifacts=artifacts,
        calls_used=calls,
        agent_task_id=task,
    )
    return obs, None


def _artifacts(value: object) -> list[Any]:
    """Return an agent's artifacts as a list, or raise ValueError naming what came instead."""
    if value is None or isinstance(value, str | bytes | bytearray | Mapping):
        raise ValueError(
            f"the agent's artifacts must be a list or tuple, got {type(value).__name__}"
        )
    try:
        items = iter(value)  # type: ignore[call-overload]
    except TypeError:
        raise ValueError(
            f"the agent's artifacts must be a list or tuple, got {type(value).__name__}"
        ) from None
    return list(items)


def _quoted(value: object) -> str:
    """Quote a value the user gave for an error message: redacted whole, then shortened (M9:
    a token cut first may be too short for its rule, and its head would be kept)."""
    return short(redact(value)) if isinstance(value, str) else type(value).__name__


@dataclass
class Services:
    """What every step worker of a runtime shares: given at construction, never in messages."""

    registry: Registry
    directory: Directory
    cancellations: Cancellations = field(default_factory=Cancellations)
    loop: LoopRunner = field(default_factory=LoopRunner)
    child_runner: Callable[..., ExecuteResult] | None = None
    """Runs a child plan for ``ctx.execute`` (agent steps)."""
    child_starter: Callable[..., Future[ExecuteResult]] | None = None
    """Starts a child plan for an async agent's ``await ctx.execute``, returning the future its
    run completes; None: such a call waits for its child in a thread."""
    memory: MemoryAccess | None = None
    """The runtime's memory, offered to steps as ``ctx.memory`` (P1)."""
    tracing: Tracing | None = None
    """Spans for the runs started from now on (T3); None: off, nothing imported or emitted."""
    traced_runs: dict[str, Tracing] = field(default_factory=dict)
    """The tracer of each run whose pass is traced now, by run id, kept by that tracer: its
    steps run in that tracer's spans, whatever :attr:`tracing` has become since (ADR 0070)."""
    placement: Placement | None = None
    """Where user code runs (S1); None: in the worker's own thread."""
    closing: threading.Event = field(default_factory=threading.Event)
    """Set once the runtime began to close: a step that meets :class:`RuntimeClosed` calling
    back into it then has no result and runs again on resume (R3)."""


class StepWorker(pykka.ThreadingActor):
    """Run steps of any kind, one at a time, in this actor's thread."""

    use_daemon_thread = True
    """User code may hang forever; it must not keep the interpreter alive once the run is over."""

    _create_actor_inbox = staticmethod(quick_inbox)

    def __init__(self, services: Services) -> None:
        super().__init__()
        self.services = services

    def on_receive(self, message: object) -> object:
        """Run the step and tell the executor how it went."""
        if not isinstance(message, RunStep):
            raise TypeError(f"step worker got an unknown message {type(message).__name__}")
        services = self.services
        step = message.step
        fn = services.registry.lookup(step)
        token = services.cancellations.open(message.run_id, step.id, message.attempt)
        question = None
        interrupted = False
        ran = True
        # Only an agent, or a skill or tool that takes ``ctx``, can reach the memory: no other
        # step needs its reads noted (P1).
        takes_ctx = fn is not None and step.agent is None and services.registry.takes_ctx(step)
        memory = (
            None
            if services.memory is None or fn is None or not (takes_ctx or step.agent is not None)
            else StepMemory(services.memory, message.run_id, step.id)
        )
        # The step's span is current while its user code runs, so a tool's own spans nest (T3):
        # the span of the tracer tracing the run, which the runtime's may no longer be.
        tracing = (
            services.traced_runs.get(message.run_id, services.tracing)
            if services.traced_runs
            else services.tracing
        )
        scope = (
            None
            if tracing is None
            else tracing.step_scope(message.run_id, step.id, message.attempt)
        )
        try:
            if scope is not None:
                scope.__enter__()
            if fn is None:
                obs = missing(step)
            elif services.placement is not None:  # elsewhere (S1): no ctx.memory, no child runs
                obs, question, ran = run_placed(
                    services.placement,
                    message,
                    fn,
                    with_ctx=takes_ctx,
                    resources=services.registry.resources_of(step),
                    token=token,
                )
            elif step.agent is not None:
                try:
                    obs, question = run_agent(
                        step,
                        fn,
                        message,
                        token=token,
                        child_runner=services.child_runner,
                        loop=services.loop,
                        memory=memory,
                        child_starter=services.child_starter,
                    )
                except RuntimeClosed as exc:
                    obs = Observation(step_id=step.id, agent=step.agent, ok=False, error=str(exc))
                    interrupted = True
            else:
                ctx = ToolContext(message, memory) if takes_ctx else None
                try:
                    obs = run_callable(
                        step.kind or "tool",
                        step,
                        fn,
                        services.loop,
                        token,
                        ctx,
                        # Its own runtime closing under a call back into it ends no step's work:
                        # the step runs again on resume, as an agent's would (R3).
                        ending=lambda exc: (
                            isinstance(exc, RuntimeClosed) and services.closing.is_set()
                        ),
                    )
                except RuntimeClosed as exc:  # LoopGone, or the runtime closing (above)
                    obs = Observation(
                        step_id=step.id, skill=step.skill, tool=step.tool, ok=False, error=str(exc)
                    )
                    interrupted = True
        except (Exception, SystemExit) as exc:
            # Last resort: our code observing the step met what it did not foresee. The step
            # still fails with an answer, or its run would wait for it for ever (E11).
            obs, question, interrupted, ran = unobservable(step, exc), None, False, True
        finally:
            if scope is not None:
                scope.__exit__(None, None, None)
            services.cancellations.close(message.run_id, step.id, message.attempt)
        reads, ops = ((), ()) if memory is None else memory.reads()
        done = StepDone(
            run_id=message.run_id,
            step_id=step.id,
            attempt=message.attempt,
            observation=obs,
            question=question,
            interrupted=interrupted,
            reads=reads,
            read_ops=ops,
            read_position=None if memory is None else memory.began[0],
            read_at=None if memory is None else memory.began[1],
            memory=memory is not None,
            ran=ran,
        )
        # The executor takes the result in this thread when it is free: on a chain the next step
        # comes back to this worker without crossing a thread (ADR 0043). Otherwise it is told;
        # if the run ended without this step (it timed out), nobody is at that address any more.
        box = services.directory.lookup(message.reply_to)
        take = getattr(box, "take_result", None)
        if take is None or not take(done):
            services.directory.tell(message.reply_to, done)
        return None


def unobservable(step: Step, exc: BaseException) -> Observation:
    """Observe a step whose outcome could not be read: failed, naming the error's type (E11)."""
    error = f"step {step.id!r} could not be observed: {type(exc).__name__}: {_error_text(exc)}"
    if step.agent is not None:
        return Observation(
            step_id=step.id, agent=step.agent, ok=False, code="agent-failed", error=error
        )
    return Observation(step_id=step.id, skill=step.skill, tool=step.tool, ok=False, error=error)


def missing(step: Step) -> Observation:
    """Observe a step whose skill, tool or agent is not registered in this runtime (E9)."""
    if step.agent is not None:
        return Observation(
            step_id=step.id,
            agent=step.agent,
            ok=False,
            code="agent-not-enabled",
            error=f"agent {step.agent!r} is not enabled in this runtime",
        )
    kind = "skill" if step.skill is not None else "tool"
    return Observation(
        step_id=step.id,
        ok=False,
        error=f"{kind} {step.target!r} is not registered in this runtime",
        skill=step.skill,
        tool=step.tool,
    )
