"""The stdio wire of ``journaled mcp``: JSON-RPC lines in, answers out (SPEC X2, ADR 0042).

The ``mcp`` package's own stdio transport reads stdin as text with ``errors="replace"``, so bytes
that are not UTF-8 reach a tool as U+FFFD; it drops a line it cannot parse without a word; and
when stdin ends it stops the server, cancelling the requests still running. This transport:

- reads lines of bytes, each at most :data:`MAX_LINE_BYTES`, in a daemon thread (a blocked read
  never keeps the process alive after Ctrl-C);
- answers a line that is not UTF-8, not JSON, nested too deeply, too long or not a JSON-RPC
  message with a JSON-RPC error naming what is wrong (with the request's id when it can be
  read), logs it on stderr and keeps serving;
- writes each answer as one line of UTF-8 to its own duplicate of fd 1; a string UTF-8 cannot
  encode (a lone surrogate a client sent as ``\\ud800``) is written as its JSON escape;
- keeps a ledger of the requests handed to the server: at end of stdin (or :meth:`Wire.stop`,
  on SIGINT or SIGTERM) it reads no more, and closes the server's stream only once every request
  read has been answered.

:func:`claimed_stdio` points fd 1 at stderr while serving, so a stray ``print`` (or a child
process) cannot corrupt the protocol, and fd 0 at the null device.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, BinaryIO

import anyio
import anyio.from_thread
import anyio.lowlevel
import mcp.types as mt
import pydantic
from anyio.abc import ObjectReceiveStream, ObjectSendStream
from mcp.shared.message import ServerMessageMetadata, SessionMessage

from journaled.events.inputs import holds_infinity

log = logging.getLogger("journaled.mcp")

MAX_LINE_BYTES = 16 * 1024 * 1024
"""The longest request line read (16 MiB); the bounds on a tool's text (1 MiB each) fit well."""

_HEAD = 4096
_AHEAD = 4
_ID_AT_HEAD = re.compile(
    rb'^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,200}")'
)


class _Eof:
    """End of stdin."""


class _TooLong:
    """A line over the bound: its first bytes and its length."""

    def __init__(self, head: bytes, length: int) -> None:
        self.head = head
        self.length = length


Frame = bytes | _Eof | _TooLong


def _read_frames(source: BinaryIO, limit: int, deliver: Callable[[Frame], None]) -> None:
    """Read ``source`` line by line and hand each to ``deliver``; run in a daemon thread."""
    try:
        while True:
            line = source.readline(limit + 1)
            if not line:
                break
            if len(line) > limit and not line.endswith(b"\n"):
                head, length = line[:_HEAD], len(line)
                while not line.endswith(b"\n"):  # skip the rest, a MiB at a time
                    line = source.readline(1 << 20)
                    if not line:
                        break
                    length += len(line)
                deliver(_TooLong(head, length))
                continue
            deliver(line)
    except (OSError, ValueError) as exc:  # ValueError: closed while the server stopped
        log.warning("stdin cannot be read (%s): serving what was read, then stopping", exc)
    deliver(_Eof())


def _request_id(head: bytes) -> int | str | None:
    """Read a request's id from the start of a line that cannot be parsed whole."""
    found = _ID_AT_HEAD.match(head[:_HEAD])
    if found is None:
        return None
    raw = found.group(1).decode("utf-8", "replace")
    return raw[1:-1] if raw.startswith('"') else int(raw)


def _problem(value: object) -> str:
    """Say why a parsed JSON value is not a JSON-RPC 2.0 message, as ``member: problem``."""
    if not isinstance(value, dict):
        return f"a message is a JSON object, not {type(value).__name__} (batches are not served)"
    if value.get("jsonrpc") != "2.0":
        return 'jsonrpc: must be "2.0"'
    if "id" in value and (isinstance(value["id"], bool) or not isinstance(value["id"], int | str)):
        return "id: must be a string or an integer"
    if "method" not in value and "result" not in value and "error" not in value:
        return "method: is missing"
    if "method" in value and not isinstance(value["method"], str):
        return "method: must be a string"
    if value.get("params") is not None and not isinstance(value["params"], dict):
        return "params: must be an object"
    return "is not a JSON-RPC 2.0 request, notification or response"


def encode(message: dict[str, Any]) -> bytes:
    """Return one wire line: compact JSON in UTF-8, strings UTF-8 cannot hold as escapes."""
    text = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:  # a lone surrogate: JSON's \\uXXXX escape carries it
        return json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"


def _error(request_id: int | str | None, code: int, text: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": text}}


Screen = Callable[[mt.JSONRPCRequest], tuple[int, str] | None]
"""Look at a request before the server does: ``(code, message)`` refuses it here."""


Serve = Callable[
    [ObjectReceiveStream[SessionMessage | Exception], ObjectSendStream[SessionMessage]],
    Awaitable[None],
]
"""Run the server over its read and write streams until the read stream ends."""


class Wire:
    """Serve one MCP connection over a binary input and output (lines of JSON-RPC)."""

    def __init__(
        self,
        source: BinaryIO,
        sink: BinaryIO,
        *,
        limit: int = MAX_LINE_BYTES,
        screen: Screen | None = None,
    ) -> None:
        self._source = source
        self._sink = sink
        self._limit = limit
        self._screen = screen
        self._pending: Counter[int | str] = Counter()
        self._settled = anyio.Event()
        self._write_lock = anyio.Lock()
        self._broken = False
        self._stopping = False
        self._waiting = anyio.CancelScope()

    # -- writing -----------------------------------------------------------------------------------

    def _write_blocking(self, data: bytes) -> None:
        self._sink.write(data)
        self._sink.flush()

    async def _write(self, message: dict[str, Any]) -> None:
        data = encode(message)
        async with self._write_lock:
            if self._broken:
                return
            try:
                # A client slow to read blocks this thread only, never the loop.
                await anyio.to_thread.run_sync(self._write_blocking, data)
            except OSError as exc:  # the client closed its end: nobody is left to answer
                log.warning("stdout cannot be written (%s): the client has gone", exc)
                self._broken = True
                self._pending.clear()
                self._settled.set()

    def _settle(self, request_id: object) -> None:
        if isinstance(request_id, int | str) and self._pending[request_id] > 0:
            self._pending[request_id] -= 1
            if self._pending[request_id] == 0:
                del self._pending[request_id]
            self._settled.set()

    async def _answer_server(self, answers: ObjectReceiveStream[SessionMessage]) -> None:
        async with answers:
            async for answer in answers:
                message = answer.message
                await self._write(
                    message.model_dump(by_alias=True, exclude_unset=True, mode="json")
                )
                if isinstance(message, mt.JSONRPCResponse | mt.JSONRPCError):
                    self._settle(message.id)

    # -- reading -----------------------------------------------------------------------------------

    async def _refuse(self, request_id: int | str | None, code: int, text: str) -> None:
        log.warning("refused a line (id %r): %s", request_id, text)
        await self._write(_error(request_id, code, text))

    async def _frame(
        self, frame: bytes | _TooLong, requests: ObjectSendStream[SessionMessage]
    ) -> None:
        if isinstance(frame, _TooLong):
            await self._refuse(
                _request_id(frame.head),
                mt.INVALID_REQUEST,
                f"the line is {frame.length} bytes, over the {self._limit}-byte bound",
            )
        else:
            await self._take(frame, requests)

    async def _take(self, line: bytes, requests: ObjectSendStream[SessionMessage]) -> None:
        """Hand one line to the server, or answer it here when it is no JSON-RPC message."""
        if not line.strip():
            return
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            await self._refuse(
                _request_id(line),
                mt.PARSE_ERROR,
                f"the line is not UTF-8: byte 0x{line[exc.start]:02x} at offset {exc.start} "
                "(JSON-RPC over stdio is UTF-8 text)",
            )
            return
        try:
            value = json.loads(text, parse_constant=_no_constant)
            if holds_infinity(value):
                raise ValueError("a number out of range (JSON has no infinity)")
        except RecursionError:
            await self._refuse(
                _request_id(line),
                mt.PARSE_ERROR,
                "the line nests arrays and objects too deeply to be read",
            )
            return
        except ValueError as exc:
            await self._refuse(_request_id(line), mt.PARSE_ERROR, f"the line is not JSON: {exc}")
            return
        try:
            message = mt.jsonrpc_message_adapter.validate_python(value, by_name=False)
        except (pydantic.ValidationError, RecursionError):
            found = value.get("id") if isinstance(value, dict) else None
            known = isinstance(found, int | str) and not isinstance(found, bool)
            await self._refuse(found if known else None, mt.INVALID_REQUEST, _problem(value))
            return
        metadata = None
        request_id: int | str | None = None
        if isinstance(message, mt.JSONRPCRequest):
            refused = None if self._screen is None else self._screen(message)
            if refused is not None:
                await self._refuse(message.id, *refused)
                return
            self._pending[message.id] += 1
            request_id = message.id
            metadata = ServerMessageMetadata(on_request_unanswered=self._unanswered(request_id))
        try:
            await requests.send(SessionMessage(message, metadata))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            log.warning("the server stopped before it read request %r", request_id)
            self._settle(request_id)
        except BaseException:  # cancelled (Ctrl-C): the request was not handed over
            self._settle(request_id)
            raise

    def _unanswered(self, request_id: int | str) -> Callable[[], Awaitable[None]]:
        async def unanswered() -> None:  # e.g. cancelled by the client: no answer comes
            self._settle(request_id)

        return unanswered

    def stop(self) -> None:
        """Read no more lines; the requests already read are still answered."""
        self._stopping = True
        self._waiting.cancel()  # only the wait for a next line: a line in hand is handed over

    async def _drain(self) -> None:
        """Wait until every request handed to the server has been answered."""
        while self._pending:
            self._settled = anyio.Event()
            await self._settled.wait()

    async def serve(self, run: Serve) -> None:
        """Run ``run(read_stream, write_stream)`` (the server) over this wire until EOF."""
        requests, server_reads = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        server_writes, answers = anyio.create_memory_object_stream[SessionMessage](0)
        frames_in, frames = anyio.create_memory_object_stream[Frame](_AHEAD)
        credits = threading.Semaphore(_AHEAD)  # bounds the lines read ahead of the server
        token = anyio.lowlevel.current_token()

        def deliver(frame: Frame) -> None:
            credits.acquire()
            # A callback, not a task: a loop that has stopped leaves no task behind. When the
            # server is stopping, nothing waits for this frame.
            with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, RuntimeError):
                anyio.from_thread.run_sync(frames_in.send_nowait, frame, token=token)

        reader = threading.Thread(
            target=_read_frames,
            args=(self._source, self._limit, deliver),
            name="journaled-mcp-stdin",
            daemon=True,  # a read blocked on a terminal never keeps the process alive
        )

        async def pump() -> None:
            async with requests, frames:
                while not (self._stopping or self._broken):
                    frame: Frame | None = None
                    with anyio.CancelScope() as self._waiting:
                        frame = await frames.receive()
                    if frame is None:  # stop() came first
                        break
                    credits.release()
                    if isinstance(frame, _Eof):
                        break
                    await self._frame(frame, requests)
                await self._drain()

        async with anyio.create_task_group() as tg:
            tg.start_soon(self._answer_server, answers)
            tg.start_soon(pump)
            reader.start()
            await run(server_reads, server_writes)


@contextmanager
def claimed_stdio() -> Iterator[tuple[BinaryIO, BinaryIO]]:
    """Yield the wire's own stdin and stdout; meanwhile fd 0 reads nothing and fd 1 is stderr."""
    sys.stdout.flush()
    wire_in = os.dup(0)
    wire_out = os.dup(1)
    saved_stdout = sys.stdout
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        # Never closed here: the daemon reader may still be blocked on it.
        source = os.fdopen(wire_in, "rb", buffering=1 << 16, closefd=False)
        sink = os.fdopen(wire_out, "wb", closefd=False)
        try:
            yield source, sink
        finally:
            # A client gone mid-answer leaves bytes in the buffer that its closed pipe cannot
            # take: the close's flush would raise EPIPE, and the command exit 1 (click's rule).
            with suppress(OSError):
                sink.close()
    finally:
        sys.stdout = saved_stdout
        os.dup2(wire_out, 1)
        os.dup2(wire_in, 0)
        os.close(null)
        os.close(wire_out)
        # wire_in stays open: the daemon reader may still be blocked on it


def _no_constant(name: str) -> object:
    """Refuse NaN and Infinity, which Python's JSON reader takes and JSON has not (RFC 8259)."""
    raise ValueError(f"{name} is no JSON value")
