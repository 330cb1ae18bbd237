"""AutoGen Core agents as journaled agent steps (SPEC X1, E9, A1, ADR 0041).

Imported through :mod:`journaled.integrations.autogen`, which says which extra to install.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, cast

from autogen_core import AgentId, AgentRuntime, CancellationToken
from autogen_core.models import RequestUsage
from pydantic import BaseModel

from journaled.actors.steps import AgentContext, NeedsInput
from journaled.aio import AsyncRuntime
from journaled.errors import InvalidArgument
from journaled.events.inputs import int_problem, short
from journaled.events.plans import AgentResult, Step
from journaled.runtime import Runtime

__all__ = [
    "LOOP_POLL",
    "AutoGenStopped",
    "MessageFactory",
    "ReplyReader",
    "StepMessage",
    "StepReply",
    "register_autogen_agent",
]


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
        loop: the event loop ``runtime`` runs on, for a runtime that does not tell: a started
            ``SingleThreadedAgentRuntime`` is reached on the loop its message loop runs on
            whatever is given here. Default: the loop running when this is called, else the
            loop the step runs on.
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
    sync = rt._sync if isinstance(rt, AsyncRuntime) else rt
    if sync._services.placement is not None:
        raise InvalidArgument(
            "rt",
            "places its steps elsewhere (open(steps=...), e.g. on Ray): an AutoGen agent is "
            "reached through its AutoGen runtime in this process, which a step run in another "
            "process cannot reach; register it on a runtime opened without steps= on the same "
            "journal",
        )
    if rt.runs.closing:
        raise InvalidArgument(
            "rt", "is a closed runtime: open one with journaled.open() or journaled.aio.open()"
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
    known = getattr(runtime, "_known_agent_names", None)
    if isinstance(known, set) and recipient.type not in known:
        raise LookupError(
            f"no agent type {recipient.type!r} is registered on the AutoGen runtime: register "
            f"it (await MyAgent.register(runtime, {recipient.type!r}, factory)) before running "
            "plans that use it"
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
    if sending.cancelled():  # not by this step (that raises above): by the AutoGen side
        raise RuntimeError(
            "its handler was cancelled on the AutoGen side (it raised CancelledError, or its "
            "CancellationToken was cancelled there)"
        )
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
