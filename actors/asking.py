"""Asking actors and waiting for their answers, with one timeout and one error for it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import pykka

from journaled.actors.errors import ActorTimeout

__all__ = ["ASK_TIMEOUT", "ask", "ask_all", "await_reply"]

T = TypeVar("T")

ASK_TIMEOUT = 30.0
"""Seconds to wait for an actor's answer before giving up with :class:`ActorTimeout`."""
STOP_GRACE = 5.0
"""Seconds a told actor that stopped still has to answer (from its ``on_stop``)."""


def ask(ref: Any, message: object) -> Any:
    """Ask an actor and wait, translating pykka's timeout into :class:`ActorTimeout`."""
    try:
        return ref.ask(message, timeout=ASK_TIMEOUT)
    except pykka.Timeout as exc:
        raise ActorTimeout(f"no answer to {type(message).__name__} in {ASK_TIMEOUT}s") from exc


def ask_all(
    refs: Sequence[Any],
    message: object,
    messages: Sequence[object] | None = None,
    *,
    sent_under: contextlib.AbstractContextManager[object] | None = None,
) -> list[Any]:
    """Ask several actors at once (one message, or one each) and wait for every answer.

    With ``sent_under``, every message is queued while holding it (a lock, say), and the answers
    are awaited after it is released.
    """
    each = messages if messages is not None else [message] * len(refs)
    with sent_under if sent_under is not None else contextlib.nullcontext():
        futures = [ref.ask(m, block=False) for ref, m in zip(refs, each, strict=True)]
    try:
        return [f.get(timeout=ASK_TIMEOUT) for f in futures]
    except pykka.Timeout as exc:
        raise ActorTimeout(f"no answer to {type(message).__name__} in {ASK_TIMEOUT}s") from exc


def await_reply(ref: Any, reply: Future[T], what: str) -> T:
    """Wait for the answer an actor owes through ``reply`` (told, not asked).

    Raises:
        ActorTimeout: no answer within :data:`ASK_TIMEOUT`.
        pykka.ActorDeadError: the actor stopped without answering.
    """
    deadline = time.monotonic() + ASK_TIMEOUT
    while True:
        try:
            return reply.result(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
        except FutureTimeout:
            if not ref.is_alive():
                # pykka marks an actor dead before its on_stop, which may still answer.
                try:
                    return reply.result(timeout=STOP_GRACE)
                except FutureTimeout:
                    raise pykka.ActorDeadError(f"{ref} stopped before answering {what}") from None
            if time.monotonic() >= deadline:
                raise ActorTimeout(f"no answer to {what} in {ASK_TIMEOUT}s") from None
