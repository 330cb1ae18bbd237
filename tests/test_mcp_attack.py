"""``journaled mcp`` (SPEC X2) against a hostile client and an operator: raw lines on stdin.

The package's own client never sends a malformed line, so these tests talk JSON-RPC by hand to
``journaled mcp`` run as a subprocess: lines that are not UTF-8, not JSON or no JSON-RPC message,
lone surrogates, a line of tens of MB, deep nesting, arguments of every wrong type, requests before
``initialize``, end of stdin right after the requests, and SIGINT or SIGTERM while calls run.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

pytest.importorskip("mcp", reason="the MCP tests need the mcp extra: pip install -e '.[mcp]'")

import mcp.types as mt

import journaled
from journaled.mcp_wire import MAX_LINE_BYTES

pytestmark = pytest.mark.slow

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def call(request_id: int, tool: str, arguments: object) -> dict[str, Any]:
    """Return a ``tools/call`` request."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }


def line(message: dict[str, Any] | bytes) -> bytes:
    """Return one wire line: a message as compact JSON, or raw bytes, then a newline."""
    raw = message if isinstance(message, bytes) else json.dumps(message).encode()
    return raw + b"\n"


class Raw:
    """``journaled mcp`` in a subprocess, spoken to one line at a time."""

    started: ClassVar[list[Raw]] = []

    def __init__(self, url: str, *, probe: str = "") -> None:
        command = [sys.executable, "-m", "journaled.cli", "mcp", "--url", url]
        if probe:  # run the command from a script that first changes something in-process
            command = [sys.executable, "-c", probe, "mcp", "--url", url]
        # stderr goes to a file: a pipe nobody reads until the end could fill and stall the server.
        self.errlog = tempfile.TemporaryFile()  # noqa: SIM115 - closed by the fixture
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errlog
        )
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.stdin = self.proc.stdin
        self.stdout = self.proc.stdout
        self.raw_lines: list[bytes] = []
        self._unread = bytearray()
        """Bytes read from stdout that no line has taken yet: a read may bring several lines,
        and ``select`` on the pipe cannot see what sits here."""
        Raw.started.append(self)

    def send(self, *messages: dict[str, Any] | bytes) -> None:
        """Write each message as one line."""
        self.stdin.write(b"".join(line(m) for m in messages))
        self.stdin.flush()

    def next_line(self, timeout: float) -> bytes | None:
        """Return the next whole line of stdout, b"" at its end, or None after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        fd = self.stdout.fileno()
        while (end := self._unread.find(b"\n")) < 0:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                rest, self._unread = bytes(self._unread), bytearray()
                return rest
            self._unread += chunk
        raw = bytes(self._unread[: end + 1])
        del self._unread[: end + 1]
        return raw

    def reply(self, timeout: float = 60.0) -> dict[str, Any]:
        """Read the next line of stdout within ``timeout`` seconds; it must be strict UTF-8."""
        raw = self.next_line(timeout)
        assert raw is not None, f"no reply within {timeout} s; stderr: {self.stderr()}"
        assert raw.endswith(b"\n"), raw[:200]
        self.raw_lines.append(raw)
        value: dict[str, Any] = json.loads(raw.decode("utf-8"))
        assert value["jsonrpc"] == "2.0"
        return value

    def replies(self, count: int) -> tuple[dict[Any, dict[str, Any]], list[dict[str, Any]]]:
        """Read ``count`` replies: those with an id by id, those with a null id in order.

        Calls run side by side, so their answers come in any order.
        """
        by_id: dict[Any, dict[str, Any]] = {}
        nulls: list[dict[str, Any]] = []
        for _ in range(count):
            reply = self.reply()
            if reply["id"] is None:
                nulls.append(reply)
            else:
                assert reply["id"] not in by_id, reply
                by_id[reply["id"]] = reply
        return by_id, nulls

    def open(self) -> None:
        """Initialize the session, as a client does first."""
        self.send(INITIALIZE, INITIALIZED)
        assert self.reply()["id"] == 0

    def stderr(self) -> str:
        """Return what the server wrote on stderr so far."""
        self.errlog.seek(0)
        return self.errlog.read().decode("utf-8", "replace")

    def close(self, timeout: float = 60.0) -> tuple[list[dict[str, Any]], str]:
        """Close stdin; return the replies still to come and stderr once the server exits."""
        rest, _ = self.proc.communicate(timeout=timeout)
        rest, self._unread = bytes(self._unread) + rest, bytearray()
        replies = [json.loads(raw.decode("utf-8")) for raw in rest.splitlines()]
        return replies, self.stderr()


@pytest.fixture(autouse=True)
def _no_server_left() -> Iterator[None]:
    """Kill a server a failed test left running, and close its pipes."""
    yield
    while Raw.started:
        server = Raw.started.pop()
        if server.proc.poll() is None:
            server.proc.kill()
        server.proc.wait(timeout=60)
        for pipe in (server.proc.stdin, server.proc.stdout, server.errlog):
            if pipe is not None:
                pipe.close()


def tool_error(reply: dict[str, Any]) -> tuple[str, str]:
    """Return a refused call's ``(argument, one-line message)``."""
    result = reply["result"]
    assert result["isError"] is True, result
    (block,) = result["content"]
    assert "\n" not in block["text"]
    return result["structuredContent"]["argument"], block["text"]


def position(url: str) -> int:
    with journaled.open(url) as rt:
        return rt.journal.position()


def test_a_lone_surrogate_is_a_tool_error_naming_the_argument(sqlite_url: str) -> None:
    """X2: "\\ud800" in an argument is refused naming it; nothing appended; serving goes on."""
    server = Raw(sqlite_url)
    server.open()
    before = position(sqlite_url)
    head = b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"memory_remember",'
    server.send(
        head % 1 + b'"arguments":{"text":"ok \\ud800 then"}}}',
        head % 2 + b'"arguments":{"text":"ok","source":"\\udfff"}}}',
        # The answer echoes this id: it must be written as a JSON escape, never as bad UTF-8.
        b'{"jsonrpc":"2.0","id":"s\\ud83d","method":"tools/call","params":{'
        b'"name":"memory_search","arguments":{"query":"ok","scopes":["project","\\ud83d"]}}}',
        b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"memory_\\ud800",'
        b'"arguments":{}}}',
        call(5, "memory_remember", {"text": "a clean fact"}),
    )
    said, _ = server.replies(5)  # each line must be strict UTF-8
    argument, message = tool_error(said[1])
    assert argument == "text"
    assert message.startswith("text: holds a lone UTF-16 surrogate (\\ud800 at character 3)")
    assert tool_error(said[2])[0] == "source"
    assert tool_error(said["s\ud83d"])[0] == "scopes"
    assert said[4]["error"]["code"] == mt.INVALID_PARAMS
    assert said[4]["error"]["message"].startswith("name: no tool 'memory_\\ud800'")
    assert said[5]["result"]["structuredContent"]["text"] == "a clean fact"
    _, err = server.close()
    assert server.proc.returncode == 0, err
    assert "Traceback" not in err
    with journaled.open(sqlite_url) as rt:
        assert [f.text for f in rt.memory.all()] == ["a clean fact"]
        assert rt.journal.position() == before + 1


def test_bytes_that_are_not_utf8_are_a_parse_error_and_store_nothing(sqlite_url: str) -> None:
    """X2: a line that is not UTF-8 is PARSE_ERROR naming the byte, logged; nothing stored."""
    server = Raw(sqlite_url)
    server.open()
    server.send(
        b"\xff\xfe garbage",
        b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"memory_remember",'
        b'"arguments":{"text":"caf\xe9"}}}',
        call(8, "memory_search", {"query": "caf"}),
    )
    said, (garbage,) = server.replies(3)
    latin1, search = said[7], said[8]
    assert garbage["id"] is None
    assert garbage["error"]["code"] == mt.PARSE_ERROR
    assert garbage["error"]["message"].startswith("the line is not UTF-8: byte 0xff at offset 0")
    assert latin1["id"] == 7  # read from the line's start, so the client is not left waiting
    assert latin1["error"]["message"].startswith("the line is not UTF-8: byte 0xe9 at offset")
    assert search["result"]["structuredContent"] == {"facts": []}
    _, err = server.close()
    assert server.proc.returncode == 0, err
    assert "the line is not UTF-8: byte 0xe9" in err  # the operator sees it too
    with journaled.open(sqlite_url) as rt:
        assert rt.memory.all() == []


def test_every_request_read_is_answered_before_the_server_exits(sqlite_url: str) -> None:
    """X2: stdin closed right after the requests: each is answered, then exit status 0."""
    server = Raw(sqlite_url)
    texts = [f"fact {n} for the end of input" for n in range(6)]
    server.send(
        INITIALIZE,
        INITIALIZED,
        *(call(n + 1, "memory_remember", {"text": text}) for n, text in enumerate(texts)),
        call(7, "memory_search", {"query": "fact"}),
        call(8, "runs_list", {}),
    )
    replies, err = server.close()
    assert server.proc.returncode == 0, err
    assert sorted(r["id"] for r in replies) == list(range(9))
    assert all("result" in r for r in replies), replies
    with journaled.open(sqlite_url) as rt:
        assert sorted(f.text for f in rt.memory.all()) == sorted(texts)


def test_lines_that_are_no_json_rpc_message_are_answered_and_serving_goes_on(
    sqlite_url: str,
) -> None:
    """X2: not JSON, too deep, no method, a batch, bad params: JSON-RPC errors that say why."""
    server = Raw(sqlite_url)
    server.open()
    deep = b"[" * 5000 + b"]" * 5000
    nested = json.loads("[" * 400 + "]" * 400)
    server.send(
        b"not json at all",
        b"[" * 100_000,
        b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"memory_remember",'
        b'"arguments":{"text":"x","domain":' + deep + b"}}}",
        {"jsonrpc": "2.0", "id": 4},
        json.dumps([call(5, "memory_search", {"query": "x"})]).encode(),  # a batch
        {"jsonrpc": "1.0", "id": 6, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": "memory_search"},
        call(8, "memory_search", "query=x"),
        call(9, "memory_remember", {"text": "x", "domain": nested}),
        b"   ",  # a blank line is no message: no answer
        call(10, "memory_search", {"query": "x"}),
    )
    said, (not_json, too_deep, batch) = server.replies(10)
    assert not_json["error"]["code"] == mt.PARSE_ERROR
    assert not_json["error"]["message"].startswith("the line is not JSON: Expecting value")
    assert too_deep["error"]["message"] == (
        "the line nests arrays and objects too deeply to be read"
    )
    assert said[3]["error"] == too_deep["error"]
    assert said[4]["error"] == {"code": mt.INVALID_REQUEST, "message": "method: is missing"}
    assert batch["error"]["message"].startswith("a message is a JSON object, not list")
    assert said[6]["error"]["message"] == 'jsonrpc: must be "2.0"'
    assert said[7]["error"]["message"] == "params: must be an object"
    assert said[8]["error"] == {
        "code": mt.INVALID_PARAMS,
        "message": "params.arguments: Input should be a valid dictionary",
    }
    assert tool_error(said[9]) == ("domain", "domain: expected `str | null`, got `array`")
    assert said[10]["result"]["structuredContent"] == {"facts": []}
    _, err = server.close()
    assert server.proc.returncode == 0, err
    assert "Traceback" not in err
    with journaled.open(sqlite_url) as rt:
        assert rt.memory.all() == []


def test_a_line_of_tens_of_megabytes_is_refused_with_its_id(sqlite_url: str) -> None:
    """X2, ADR 0023: a line over MAX_LINE_BYTES is refused unread; one under it by the bound."""
    server = Raw(sqlite_url)
    server.open()
    huge = MAX_LINE_BYTES + 4 * 1024 * 1024
    server.send(
        call(1, "memory_remember", {"text": "word " * (huge // 5)}),
        call(2, "memory_remember", {"text": "x" * (MAX_LINE_BYTES // 2)}),
        call(3, "memory_search", {"query": "word"}),
    )
    said, _ = server.replies(3)
    over, under, search = said[1], said[2], said[3]
    assert over["id"] == 1
    assert over["error"]["code"] == mt.INVALID_REQUEST
    assert over["error"]["message"].endswith(f"bytes, over the {MAX_LINE_BYTES}-byte bound")
    argument, message = tool_error(under)
    assert argument == "text"
    assert "over the 1048576-byte bound" in message
    assert search["result"]["structuredContent"] == {"facts": []}
    _, err = server.close()
    assert server.proc.returncode == 0, err
    with journaled.open(sqlite_url) as rt:
        assert rt.memory.all() == []


_WRONG = {"string": 12, "integer": "ten", "number": "high", "array": "one", "boolean": "yes"}


def _none_of(kinds: set[str]) -> object:
    """Return a value of a JSON type none of ``kinds`` is (a number counts as an integer)."""
    for kind, value in (("integer", 12), ("string", "ten"), ("boolean", True), ("object", {})):
        if kind not in kinds and not (kind == "integer" and "number" in kinds):
            return value
    raise AssertionError(kinds)


def _declared_types(schema: dict[str, Any]) -> set[str]:
    choices = schema.get("anyOf", [schema])
    # An enum (a run status) is a string.
    return {c.get("type", "string") for c in choices if c.get("type") != "null"}


def test_every_argument_of_every_tool_refuses_a_wrong_json_type(sqlite_url: str) -> None:
    """X2: each tool's each argument given a value of another JSON type is refused by name."""
    server = Raw(sqlite_url)
    server.open()
    server.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    tools = server.reply()["result"]["tools"]
    base = {"text": "t", "query": "q", "fact_id": "mem_x", "run_id": "run_x"}
    sent: list[tuple[int, str, str]] = []
    request_id = 100
    for tool in tools:
        schema = tool["inputSchema"]
        required = {name: base[name] for name in schema.get("required", [])}
        for name, prop in schema["properties"].items():
            kinds = _declared_types(prop)
            wrong = _WRONG[next(iter(kinds))] if len(kinds) == 1 else _none_of(kinds)
            request_id += 1
            server.send(call(request_id, tool["name"], {**required, name: wrong}))
            sent.append((request_id, tool["name"], name))
    assert len(sent) >= 25
    said, _ = server.replies(len(sent))
    for request_id, tool_name, name in sent:
        reply = said[request_id]
        argument, message = tool_error(reply)
        assert argument == name, (tool_name, message)
        assert message.startswith(f"{name}: expected `"), (tool_name, message)
    server.send(
        call(1, "memory_search", {"query": "q", "limit": 10**30}),
        call(2, "runs_list", {"limit": 10**30}),
        call(3, "memory_as_of", {"position": -(10**30)}),
        call(4, "runs_at", {"run_id": "run_x", "position": -1}),
        call(5, "memory_as_of", {"position": 10**30}),
    )
    said, _ = server.replies(5)
    limit, runs, as_of, at, past = (said[n] for n in range(1, 6))
    assert tool_error(limit) == ("limit", "limit: expected `int` <= 1000")
    assert runs["result"]["structuredContent"] == {"runs": []}
    assert tool_error(as_of) == ("position", "position: expected `int` >= 0")
    assert tool_error(at) == ("position", "position: expected `int` >= 0")
    assert tool_error(past)[1].startswith(f"position: {10**30} is past the end of the journal")
    _, err = server.close()
    assert server.proc.returncode == 0, err
    with journaled.open(sqlite_url) as rt:
        assert rt.memory.all() == []


def test_requests_out_of_protocol_get_an_answer_that_says_why(sqlite_url: str) -> None:
    """X2: a call before initialize, an unknown method, a notification sent with an id."""
    server = Raw(sqlite_url)
    server.send(
        call(1, "memory_search", {"query": "x"}),
        {"jsonrpc": "2.0", "id": 2, "method": "ping"},
        INITIALIZE,
        INITIALIZED,
        {"jsonrpc": "2.0", "id": 3, "method": "memory/forget", "params": {}},
        {"jsonrpc": "2.0", "id": 4, "method": "notifications/initialized"},
        call(5, "memory_search", {"query": "x"}),
    )
    said, _ = server.replies(6)
    assert said[1]["error"] == {
        "code": mt.INVALID_REQUEST,
        "message": "tools/call: the connection is not initialized; send initialize first, "
        "then notifications/initialized",
    }
    assert said[2]["result"] == {}
    assert said[3]["error"]["code"] == mt.METHOD_NOT_FOUND
    assert said[4]["error"]["code"] == mt.METHOD_NOT_FOUND  # an id makes it a request
    assert said[5]["result"]["structuredContent"] == {"facts": []}
    _, err = server.close()
    assert server.proc.returncode == 0, err


def test_a_stray_print_reaches_stderr_not_the_protocol(sqlite_url: str) -> None:
    """X2: while serving, fd 1 is stderr: output from tool code cannot corrupt the wire."""
    probe = (
        "import os, sys\n"
        "from journaled import mcp_tools\n"
        "search = mcp_tools._search\n"
        "def noisy(rt, a):\n"
        "    print('stray print')\n"
        "    os.system('echo stray child')\n"
        "    return search(rt, a)\n"
        "mcp_tools.TOOLS = tuple(\n"
        "    mcp_tools.ToolSpec(**{**s.__dict__, 'answer': noisy}) if s.name == 'memory_search'\n"
        "    else s for s in mcp_tools.TOOLS)\n"
        "from journaled.cli import main\n"
        "main(sys.argv[1:])\n"
    )
    server = Raw(sqlite_url, probe=probe)
    server.open()
    server.send(call(1, "memory_search", {"query": "x"}))
    assert server.reply()["result"]["structuredContent"] == {"facts": []}
    rest, err = server.close()
    assert rest == []
    assert server.proc.returncode == 0, err
    assert "stray print" in err
    assert "stray child" in err


def _stop_while_calls_run(url: str, signum: signal.Signals) -> None:
    server = Raw(url)
    server.open()
    server.send(*(call(n, "memory_remember", {"text": f"fact {n} " * 40}) for n in range(1, 81)))
    first = server.reply()
    server.proc.send_signal(signum)  # stdin stays open, as in a terminal
    deadline = time.monotonic() + 60
    replies = [first]
    while time.monotonic() < deadline:
        raw = server.next_line(deadline - time.monotonic())
        if not raw:
            break
        replies.append(json.loads(raw.decode("utf-8")))
    status = server.proc.wait(timeout=60)
    _, err = server.close()
    assert status == {signal.SIGINT: 130, signal.SIGTERM: 143}[signum], err
    assert "Traceback" not in err
    assert f"{signum.name}: answering the requests already read, then stopping" in err
    answered = {r["result"]["structuredContent"]["id"] for r in replies}
    # The requests read are a prefix of those sent; calls run side by side.
    assert sorted(r["id"] for r in replies) == list(range(1, len(replies) + 1))
    with journaled.open(url) as rt:
        assert rt.journal.verify().ok
        # Every fact stored was answered: no request was cut off between journal and reply.
        assert {f.id for f in rt.memory.all()} == answered


@pytest.mark.usefixtures("sigint_reaches_children")
def test_ctrl_c_while_calls_run_answers_them_and_exits_130(sqlite_url: str) -> None:
    """X2: SIGINT mid-call: calls read are answered, the runtime closes, exit 130, no traceback."""
    _stop_while_calls_run(sqlite_url, signal.SIGINT)


def test_sigterm_while_calls_run_answers_them_and_exits_143(sqlite_url: str) -> None:
    """X2: SIGTERM mid-call: calls read are answered, the runtime closes, exit 143."""
    _stop_while_calls_run(sqlite_url, signal.SIGTERM)


def test_a_request_the_client_cancels_does_not_hold_the_exit(sqlite_url: str) -> None:
    """X2: a call cancelled by notifications/cancelled settles without an answer; EOF exits 0."""
    probe = (
        "import sys, threading\n"
        "from journaled import mcp_tools\n"
        "release = threading.Event()\n"
        "search, runs_list = mcp_tools._search, mcp_tools._runs_list\n"
        "def held(rt, a):\n"
        "    release.wait(60)\n"
        "    return search(rt, a)\n"
        "def releasing(rt, a):\n"
        "    release.set()\n"
        "    return runs_list(rt, a)\n"
        "swap = {'memory_search': held, 'runs_list': releasing}\n"
        "mcp_tools.TOOLS = tuple(\n"
        "    mcp_tools.ToolSpec(**{**s.__dict__, 'answer': swap.get(s.name, s.answer)})\n"
        "    for s in mcp_tools.TOOLS)\n"
        "from journaled.cli import main\n"
        "main(sys.argv[1:])\n"
    )
    server = Raw(sqlite_url, probe=probe)
    server.open()
    cancel = {"requestId": 1, "reason": "no longer needed"}
    server.send(
        call(1, "memory_search", {"query": "x"}),
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel},
        call(2, "runs_list", {}),
    )
    assert server.reply()["id"] == 2
    replies, err = server.close(timeout=60)
    assert server.proc.returncode == 0, err
    assert [r["id"] for r in replies] in ([], [1])  # the SDK may still answer a late cancel


def test_nan_and_infinity_are_no_json_and_are_refused(sqlite_url: str) -> None:
    """X2: NaN, Infinity and numbers out of range are no JSON (RFC 8259), though Python's
    reader takes them (the last as an infinity): a line holding one is a PARSE_ERROR naming
    it, and nothing is stored."""
    server = Raw(sqlite_url)
    server.open()
    server.send(
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"memory_remember",'
        b'"arguments":{"text":"x","confidence":NaN}}}',
        b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"memory_remember",'
        b'"arguments":{"text":"y","valid_until":-Infinity}}}',
        b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"memory_remember",'
        b'"arguments":{"text":"z","confidence":-1e999}}}',
        call(3, "memory_search", {"query": "x"}),
    )
    said, _ = server.replies(4)
    assert said[1]["error"] == {
        "code": mt.PARSE_ERROR,
        "message": "the line is not JSON: NaN is no JSON value",
    }
    assert said[2]["error"]["message"] == "the line is not JSON: -Infinity is no JSON value"
    assert said[4]["error"] == {
        "code": mt.PARSE_ERROR,
        "message": "the line is not JSON: a number out of range (JSON has no infinity)",
    }
    assert said[3]["result"]["structuredContent"] == {"facts": []}
    _, err = server.close()
    assert server.proc.returncode == 0, err
    with journaled.open(sqlite_url) as rt:
        assert rt.memory.all() == []


def test_an_unknown_id_of_any_length_is_not_echoed_back_whole(sqlite_url: str) -> None:
    """X2: an unknown run or fact id of 200 kB is answered by an error of a few hundred bytes
    naming it shortened, not by the 200 kB sent; serving goes on."""
    server = Raw(sqlite_url)
    server.open()
    server.send(
        call(1, "runs_at", {"run_id": "r" * 200_000}),
        call(2, "memory_why", {"fact_id": "m" * 200_000}),
        call(3, "runs_why", {"run_id": "run_" + "x" * 200_000}),
        call(4, "memory_search", {"query": "x"}),
    )
    said, _ = server.replies(4)
    for request_id in (1, 2, 3):
        argument, message = tool_error(said[request_id])
        assert argument in ("run_id", "fact_id"), message
        assert len(message) < 300, len(message)
        assert "…" in message
    assert said[4]["result"]["structuredContent"] == {"facts": []}
    _, err = server.close()
    assert server.proc.returncode == 0, err
