"""An MCP client uses journaled's memory and runs through ``journaled mcp`` (SPEC X2, X3).

First a small agent run is journaled (a tool and a skill answered by a scripted model, so it runs
offline). Then an MCP client session, made with the ``mcp`` package's own client, starts
``journaled mcp`` over stdio as any MCP host would, lists the tools, remembers a fact, searches,
asks why a fact was superseded, lists the runs and asks why the run ended as it did. Needs the
extra: ``pip install 'journaled[mcp]'``. Run it with

    python examples/mcp_client.py

An MCP host is configured the same way, e.g. in its JSON settings::

    {"mcpServers": {"journaled": {"command": "journaled",
                                  "args": ["mcp", "--url", "sqlite:///path/journal.sqlite"]}}}
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.types import CallToolResult, TextContent

import journaled
from journaled import Plan, Step
from journaled.testing import ScriptedModel

MODEL = ScriptedModel({"triage": "priority: high, the login page is down"})


def journal_a_run(url: str) -> str:
    """Run a two-step triage plan in this process; return its run id."""
    with journaled.open(url) as rt:
        rt.register_tool("read_ticket", lambda ticket: f"ticket {ticket}: login page returns 500")
        rt.register_skill("triage", lambda text: MODEL.complete(f"Triage this: {text}"))
        plan = Plan(
            goal="triage ticket 42",
            steps=[
                Step("read", tool="read_ticket", input=42),
                Step("triage", skill="triage", input="ticket 42", depends_on=["read"]),
            ],
        )
        return rt.execute(plan).run_id


def answer(result: CallToolResult) -> Any:
    """Return a tool's structured answer; a refused call's one line says which argument."""
    if result.is_error:
        block = result.content[0]
        raise SystemExit(block.text if isinstance(block, TextContent) else "tool error")
    return result.structured_content


async def session(url: str, run_id: str) -> None:
    """Talk to ``journaled mcp`` as an MCP host does, printing what it answers."""
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "journaled.cli", "mcp", "--url", url]
    )
    async with (
        stdio_client(server) as (read, write),
        ClientSession(read, write) as client,
    ):
        await client.initialize()
        tools = await client.list_tools()
        print(f"tools: {', '.join(tool.name for tool in tools.tools)}")

        old = answer(
            await client.call_tool(
                "memory_remember", {"text": "on-call is Alice", "conflict_key": "on-call"}
            )
        )
        new = answer(
            await client.call_tool(
                "memory_remember", {"text": "on-call is Bob", "conflict_key": "on-call"}
            )
        )
        print(f"remembered {new['id']}, superseding {', '.join(new['supersedes'])}")
        found = answer(await client.call_tool("memory_search", {"query": "who is on-call"}))
        print(f"search found: {[fact['text'] for fact in found['facts']]}")
        why = answer(await client.call_tool("memory_why", {"fact_id": old["id"]}))
        print(f"why {old['id']}: {why['why'].splitlines()[-1].strip()}")

        runs = answer(await client.call_tool("runs_list", {}))
        for row in runs["runs"]:
            goal, calls = row["goal"], row["calls_used"]
            print(f"run {row['run_id']}: {row['status']}, goal {goal!r}, calls used {calls}")
        why_run = answer(await client.call_tool("runs_why", {"run_id": run_id}))
        print(f"why the run: {why_run['why'].splitlines()[-1].strip()}")

        refused = await client.call_tool("runs_at", {"run_id": run_id, "position": 10_000})
        block = refused.content[0]
        print(f"refused: {block.text if isinstance(block, TextContent) else refused}")


def main() -> None:
    """Journal a run, then read and write the journal through an MCP session."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'journal.sqlite'}"
        run_id = journal_a_run(url)
        anyio.run(session, url, run_id)


if __name__ == "__main__":
    main()
