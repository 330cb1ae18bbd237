"""docs/protocol.md "Failures" (A4, ADR 0030): every refusal an asker can be told reaches it,
naming the field at fault; an argument the executor cannot keep is refused, not crashed on."""

from __future__ import annotations

import json
import queue
import threading
import time
from typing import Any

import msgspec
import pytest

import journaled
from journaled import Plan, Step
from journaled.events.errors import ProtocolError


def _runtime() -> tuple[Any, queue.Queue[dict[str, Any]]]:
    rt = journaled.open("memory://")
    rt.register_tool("echo", lambda text: text)
    replies: queue.Queue[dict[str, Any]] = queue.Queue()
    rt.protocol.register_bytes("autogen/agent-7", lambda b: replies.put(json.loads(b)), "json")
    return rt, replies


# -- undecodable text in a request that names reply_to and correlation -----------------------


def test_json_request_with_a_lone_surrogate_escape_is_answered_by_reply_failure() -> None:
    """docs/protocol.md "Failures" / ADR 0030: bytes that do not decode raise ProtocolError and,
    when they still name reply_to and correlation, the asker also gets reply.failure.

    `"\\ud800"` is valid JSON (RFC 8259 escapes) naming reply_to and correlation; msgspec refuses
    the whole document, so the address is read leniently and the field named.
    """
    rt, replies = _runtime()
    try:
        head = json.dumps({"to": rt.protocol.address})[:-1]
        raw = (
            head + ', "message": {"type": "gateway.search", "reply_to": "autogen/agent-7",'
            ' "correlation": "c2", "query": "a\\ud800b"}}'
        )
        assert json.loads(raw)["message"]["correlation"] == "c2"  # the data names them
        with pytest.raises(ProtocolError):
            rt.protocol.deliver(raw, wire="json")
        reply = replies.get(timeout=3)["message"]
        assert reply["type"] == "reply.failure"
        assert reply["correlation"] == "c2"
        assert reply["field"] == "query"
    finally:
        rt.close()


def test_msgpack_request_with_invalid_utf8_in_one_field_is_answered_by_reply_failure() -> None:
    """Same promise on the msgpack wire: one bad string field must not silence the asker."""
    rt = journaled.open("memory://")
    replies: queue.Queue[bytes] = queue.Queue()
    rt.protocol.register_bytes("me", replies.put)
    try:
        raw = msgspec.msgpack.encode(
            {
                "to": rt.protocol.address,
                "message": {
                    "type": "gateway.search",
                    "reply_to": "me",
                    "correlation": "m1",
                    "query": "QQQQ",
                },
            }
        ).replace(b"QQQQ", b"\xff\xfe\xfd\xfc")
        with pytest.raises(ProtocolError):
            rt.protocol.deliver(raw)
        reply = msgspec.msgpack.decode(replies.get(timeout=3))["message"]
        assert reply["type"] == "reply.failure"
        assert reply["correlation"] == "m1"
    finally:
        rt.close()


# -- reply.failure names the argument at fault ------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"call_budget": -1}, "call_budget"),
        ({"max_parallel_steps": 0}, "max_parallel_steps"),
        ({"step_timeout": -1}, "step_timeout"),
        ({"limits": {"per_tool": {"echo": 0}}}, "limits"),
    ],
)
def test_a_refused_run_start_names_the_field_at_fault(extra: dict[str, Any], field: str) -> None:
    """docs/protocol.md "Failures": reply.failure carries "the field at fault when there is one
    (a msgspec path inside the request, or the name of the argument)". A bad call_budget (the
    page's own example of a ValueError refusal) comes back with field null."""
    rt, replies = _runtime()
    try:
        message = {
            "type": "gateway.run-start",
            "reply_to": "autogen/agent-7",
            "correlation": "c5",
            "plan": {"goal": "g", "steps": [{"id": "a", "tool": "echo", "input": "x"}]},
            **extra,
        }
        rt.protocol.deliver(json.dumps({"to": rt.protocol.address, "message": message}), "json")
        reply = replies.get(timeout=5)["message"]
        assert reply["type"] == "reply.failure"
        assert reply["field"] is not None, reply
        assert reply["field"].startswith(field), reply
    finally:
        rt.close()


# -- a step_timeout past threading.TIMEOUT_MAX -----------------------------------------------


@pytest.mark.parametrize("door", ["python", "gateway"])
def test_a_huge_step_timeout_is_refused_or_harmless_never_a_thread_traceback(door: str) -> None:
    """A step_timeout past threading.TIMEOUT_MAX (1e12 s) is refused by name at both doors; it
    passed the "positive, finite" check, then the executor's timer thread died with an
    OverflowError traceback and no timeout was armed."""
    crashed: list[BaseException | None] = []
    old_hook = threading.excepthook
    threading.excepthook = lambda args: crashed.append(args.exc_value)
    rt, replies = _runtime()
    try:
        if door == "python":
            with pytest.raises(ValueError, match="step_timeout"):
                rt.execute(
                    Plan(goal="g", steps=[Step("a", tool="echo", input="x")]), step_timeout=1e12
                )
        else:
            message = {
                "type": "gateway.run-start",
                "reply_to": "autogen/agent-7",
                "correlation": "t",
                "plan": {"goal": "g", "steps": [{"id": "a", "tool": "echo", "input": "x"}]},
                "step_timeout": 1e12,
            }
            rt.protocol.deliver(json.dumps({"to": rt.protocol.address, "message": message}), "json")
            first = replies.get(timeout=5)["message"]
            assert first["type"] == "reply.failure"
            assert first["field"] == "step_timeout"
        time.sleep(0.3)
        assert crashed == [], crashed
    finally:
        threading.excepthook = old_hook
        rt.close()
