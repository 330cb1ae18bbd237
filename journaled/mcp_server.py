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
- The protocol owns stdout; logging goes to stderr. The runtime is closed when the client closes
  the connection (end of stdin), and the process exits with status 0.

Needs the extra ``journaled[mcp]``; ``import journaled`` never imports this module or ``mcp``.
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any

import anyio
import mcp.types as mt
import msgspec
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

import journaled
from journaled import cli_render as render
from journaled.events.errors import EventsError
from journaled.mcp_tools import TOOLS, ToolError, answer, object_schema

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


async def serve_stdio(rt: journaled.Runtime) -> None:
    """Serve ``rt``'s tools over this process's stdin and stdout until the client closes."""
    server = build_server(rt)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def serve(rt: journaled.Runtime) -> None:
    """Serve until the client closes stdin; the caller closes ``rt`` afterwards."""
    anyio.run(serve_stdio, rt)
