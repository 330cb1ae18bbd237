"""``journaled mcp``: memory and runs as Model Context Protocol tools over stdio (X2, ADR 0042).

Any MCP client (an agent, an IDE, a chat application) starts ``journaled mcp`` as a subprocess and
calls nine tools: ``memory_remember``, ``memory_search``, ``memory_why``, ``memory_history``,
``memory_as_of``, ``runs_list``, ``runs_why``, ``runs_at`` and ``runs_stale``.

- Each tool's arguments are a msgspec Struct (:mod:`journaled.mcp_tools`): the JSON Schema the
  client sees (``inputSchema``: types, bounds, enums, descriptions) and the validation of a call
  come from the same declaration. Unknown arguments are refused.
- A result's text is exactly what the matching CLI command prints with ``--json``; its
  ``structuredContent`` is the same value, wrapped in an object when the CLI prints a list
  (``{"facts": [...]}``), and it conforms to the tool's ``outputSchema``.
- Bad input (a wrong type, a bound, an unknown run or fact id, a position past the end of the
  journal) is a tool error (``isError``) whose one line names the argument:
  ``position: 99 is past the end of the journal (its last position is 12)``. An unknown tool name
  is a protocol error (``INVALID_PARAMS``). Nothing is appended for a refused call.
- The protocol owns stdout (:mod:`journaled.mcp_wire` points fd 1 at stderr while serving);
  logging goes to stderr. At end of stdin every request read is answered, then the runtime is
  closed and the process exits with status 0; SIGINT and SIGTERM stop it the same way, with
  status 130 and 143.

Needs the extra ``journaled[mcp]``; ``import journaled`` never imports this module or ``mcp``.
"""

from __future__ import annotations

import logging
import signal
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any

import anyio
import mcp.types as mt
import msgspec
import pydantic
from anyio.abc import ObjectReceiveStream, ObjectSendStream
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

import journaled
from journaled import cli_render as render
from journaled.events.errors import EventsError
from journaled.mcp_tools import TOOLS, ToolError, answer, object_schema
from journaled.mcp_wire import Wire, claimed_stdio

log = logging.getLogger("journaled.mcp")

SERVER_NAME = "journaled"


def tool_list() -> list[mt.Tool]:
    """Describe every tool as MCP lists it: name, description, input and output schemas."""
    return [
        mt.Tool(
            name=spec.name,
            description=spec.description,
            input_schema=object_schema(spec.args),
            output_schema=object_schema(spec.result),
            annotations=mt.ToolAnnotations(
                read_only_hint=spec.read_only,
                destructive_hint=False,
                idempotent_hint=spec.read_only,
                open_world_hint=False,
            ),
        )
        for spec in TOOLS
    ]


def _result(cli_value: object, structured: object) -> mt.CallToolResult:
    return mt.CallToolResult(
        content=[mt.TextContent(type="text", text=render.to_json(cli_value))],
        structured_content=msgspec.to_builtins(structured),
    )


def _error(error: ToolError) -> mt.CallToolResult:
    text = render.one_line(str(error))
    return mt.CallToolResult(
        content=[mt.TextContent(type="text", text=text)],
        structured_content={"argument": error.argument, "error": text},
        is_error=True,
    )


def build_server(rt: journaled.Runtime) -> Server[Any]:
    """Return an MCP server whose tools read and write ``rt``'s journal."""
    specs = {spec.name: spec for spec in TOOLS}
    listed = tool_list()

    async def list_tools(
        _ctx: Any, _params: mt.PaginatedRequestParams | None
    ) -> mt.ListToolsResult:
        return mt.ListToolsResult(tools=listed)

    async def call_tool(_ctx: Any, params: mt.CallToolRequestParams) -> mt.CallToolResult:
        spec = specs.get(params.name)
        if spec is None:
            raise MCPError(
                mt.INVALID_PARAMS,
                f"name: no tool {params.name!r}; the tools are {', '.join(specs)}",
            )
        try:
            # The runtime blocks (actors, the journal): a worker thread keeps the loop serving.
            pair = await anyio.to_thread.run_sync(answer, rt, spec, params.arguments)
        except ToolError as exc:
            log.info("tool %s refused: %s", spec.name, exc)
            return _error(exc)
        except EventsError as exc:  # e.g. a damaged event: the message names its position
            log.error("tool %s: the journal cannot be read: %s", spec.name, exc)
            raise MCPError(mt.INTERNAL_ERROR, f"the journal cannot be read: {exc}") from exc
        return _result(*pair)

    return Server(
        SERVER_NAME,
        version=_version(),
        instructions=(
            "journaled's memory and runs: every change is a journaled event, so each fact and "
            "run can be explained (why, history) and viewed as it was (as_of, at)."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _version() -> str:
    try:
        return package_version("journaled")
    except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        return "0"


class Screen:
    """Refuse, with a reason, the requests the SDK would refuse without one.

    Before ``initialize`` the SDK answers a tool call ``Invalid request parameters`` with empty
    data, and the same for ``tools/call`` params of the wrong shape; a client learns nothing.
    """

    def __init__(self) -> None:
        self.opened = False

    def __call__(self, request: mt.JSONRPCRequest) -> tuple[int, str] | None:
        """Return ``(code, message)`` for a request to refuse, else None."""
        params = request.params or {}
        meta = params.get("_meta")
        if request.method == "initialize" or (
            isinstance(meta, dict) and mt.PROTOCOL_VERSION_META_KEY in meta  # no handshake then
        ):
            self.opened = True
        elif not self.opened and request.method != "ping":
            return (
                mt.INVALID_REQUEST,
                f"{request.method}: the connection is not initialized; send initialize "
                "first, then notifications/initialized",
            )
        if request.method == "tools/call":
            try:
                mt.CallToolRequestParams.model_validate(params, by_name=False)
            except pydantic.ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(part) for part in ("params", *first["loc"]))
                return mt.INVALID_PARAMS, f"{where}: {first['msg']}"
        return None


STOP_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}
"""The exit status after each stopping signal, as a shell reports a process it ended."""


async def serve_stdio(rt: journaled.Runtime) -> int:
    """Serve ``rt``'s tools over stdin and stdout until the client closes or a signal stops it.

    At end of stdin, SIGINT (Ctrl-C) or SIGTERM the server reads no more requests and answers
    those already read before it returns. Returns the exit status: 0 at end of stdin, else
    :data:`STOP_STATUS` of the signal.
    """
    server = build_server(rt)
    options = server.create_initialization_options()
    status = 0

    async def run(
        reads: ObjectReceiveStream[SessionMessage | Exception],
        writes: ObjectSendStream[SessionMessage],
    ) -> None:
        await server.run(reads, writes, options)

    async def stop_on_signal(wire: Wire) -> None:
        nonlocal status
        # Handled here rather than by cancelling every task: the SDK's serving loop does not
        # end cleanly when cancelled mid-request, and a request read deserves its answer.
        # A signal the process was started with ignored (nohup, a background job) stays ignored.
        handled = [sig for sig in STOP_STATUS if signal.getsignal(sig) is not signal.SIG_IGN]
        with anyio.open_signal_receiver(*handled) as signals:
            async for signum in signals:
                log.warning(
                    "%s: answering the requests already read, then stopping",
                    signal.Signals(signum).name,
                )
                status = STOP_STATUS[signal.Signals(signum)]
                wire.stop()
                return  # a second Ctrl-C is Python's own KeyboardInterrupt

    with claimed_stdio() as (source, sink):
        wire = Wire(source, sink, screen=Screen())
        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_on_signal, wire)
            await wire.serve(run)
            tg.cancel_scope.cancel()
    return status


def serve(rt: journaled.Runtime) -> int:
    """Serve until the client closes stdin or a signal stops it; return the exit status.

    The caller closes ``rt`` afterwards.
    """
    return anyio.run(serve_stdio, rt)
