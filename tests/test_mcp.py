"""``journaled mcp`` (SPEC X2): the real ``mcp`` client against the server run as a subprocess."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp", reason="the MCP tests need the mcp extra: pip install -e '.[mcp]'")

import mcp.types as mt
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

import journaled
from journaled import Plan, Step
from journaled.events.journal import SNAPSHOT_TABLE
from journaled.events.run_summaries import RUN_STATUSES

pytestmark = pytest.mark.slow

TOOLS = {
    "memory_remember",
    "memory_search",
    "memory_why",
    "memory_history",
    "memory_as_of",
    "runs_list",
    "runs_why",
    "runs_at",
    "runs_stale",
}

Session = Callable[[ClientSession], Awaitable[None]]


def _server(url: str, *wrapper: str) -> StdioServerParameters:
    command = [sys.executable, "-m", "journaled.cli", "mcp", "--url", url]
    if wrapper:  # e.g. sh -c '...; echo exit $?' to see how the server ended
        return StdioServerParameters(command=wrapper[0], args=[*wrapper[1:], *command])
    return StdioServerParameters(command=command[0], args=command[1:])


def _talk(url: str, session: Session, errlog: Path, *wrapper: str) -> None:
    """Start ``journaled mcp`` on ``url``, initialize a client session, run ``session``."""

    async def main() -> None:
        with errlog.open("a") as err:
            async with (
                stdio_client(_server(url, *wrapper), errlog=err) as (read, write),
                ClientSession(read, write) as client,
            ):
                await client.initialize()
                await session(client)

    anyio.run(main)


def _ok(result: mt.CallToolResult) -> Any:
    """Return a successful call's JSON text, checked against its structured content."""
    assert not result.is_error, result.content
    block = result.content[0]
    assert isinstance(block, mt.TextContent)
    value = json.loads(block.text)
    structured = result.structured_content
    assert isinstance(structured, dict)
    if isinstance(value, list):  # the CLI prints a list; structured content is an object
        assert value in structured.values()
    else:
        assert structured == value
    return value


def _refused(result: mt.CallToolResult) -> str:
    assert result.is_error
    block = result.content[0]
    assert isinstance(block, mt.TextContent)
    assert "\n" not in block.text
    return block.text


def _cli_json(url: str, *args: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "journaled.cli", "--url", url, *args, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


def test_the_server_lists_its_tools_with_json_schemas(sqlite_url: str, tmp_path: Path) -> None:
    """X2: list_tools names memory and run tools, each with typed argument and result schemas."""
    listed: list[mt.Tool] = []

    async def session(client: ClientSession) -> None:
        listed.extend((await client.list_tools()).tools)

    _talk(sqlite_url, session, tmp_path / "stderr.log")
    tools = {tool.name: tool for tool in listed}
    assert set(tools) == TOOLS
    for tool in listed:
        assert tool.description
        assert tool.input_schema["type"] == "object"
        assert tool.input_schema["additionalProperties"] is False
        assert tool.output_schema is not None
        assert tool.output_schema["type"] == "object"
        assert tool.annotations is not None
        assert tool.annotations.read_only_hint is (tool.name != "memory_remember")
    remember = tools["memory_remember"].input_schema
    assert remember["required"] == ["text"]
    assert remember["properties"]["text"]["type"] == "string"
    assert remember["properties"]["scope"]["default"] == "project"
    status = tools["runs_list"].input_schema["properties"]["status"]["anyOf"][0]
    assert set(status["enum"]) == set(RUN_STATUSES)
    position = tools["runs_at"].input_schema["properties"]["position"]["anyOf"][0]
    assert position == {"type": "integer", "minimum": 0, "description": position["description"]}
    assert tools["runs_at"].input_schema["required"] == ["run_id"]
    limit = tools["memory_search"].input_schema["properties"]["limit"]
    assert (limit["type"], limit["minimum"], limit["default"]) == ("integer", 1, 10)


def test_memory_remember_search_why_history_and_as_of(sqlite_url: str, tmp_path: Path) -> None:
    """X2, M2, M3, M11, M12: a client remembers, searches, asks why and history, and looks back."""
    seen: dict[str, Any] = {}

    async def session(client: ClientSession) -> None:
        old = _ok(
            await client.call_tool(
                "memory_remember",
                {"text": "deploys happen on Fridays", "conflict_key": "deploy-day"},
            )
        )
        new = _ok(
            await client.call_tool(
                "memory_remember",
                {
                    "text": "deploys happen on Tuesdays; token=hunter2",
                    "conflict_key": "deploy-day",
                    "domain": "ops",
                    "confidence": 0.9,
                },
            )
        )
        seen["old"], seen["new"] = old, new
        seen["search"] = _ok(await client.call_tool("memory_search", {"query": "deploys"}))
        seen["filtered"] = _ok(
            await client.call_tool("memory_search", {"query": "deploys", "domains": ["none"]})
        )
        seen["why"] = _ok(await client.call_tool("memory_why", {"fact_id": old["id"]}))
        history = _ok(await client.call_tool("memory_history", {"fact_id": old["id"]}))
        seen["history"] = history
        seen["then"] = _ok(
            await client.call_tool(
                "memory_as_of", {"position": history[0]["position"], "query": "deploys"}
            )
        )

    _talk(sqlite_url, session, tmp_path / "stderr.log")
    old, new = seen["old"], seen["new"]
    assert new["supersedes"] == [old["id"]]
    assert "hunter2" not in new["text"]  # redacted before the journal (M9)
    assert new["confidence"] == 0.9
    assert [f["id"] for f in seen["search"]] == [new["id"]]
    assert seen["filtered"] == []
    assert seen["why"]["fact_id"] == old["id"]
    assert f"by {new['id']}, which claimed the same conflict key" in seen["why"]["why"]
    kinds = [e["data"]["type"] for e in seen["history"]]
    assert kinds[0] == "memory.fact-remembered"
    assert "memory.fact-superseded" in kinds
    then = seen["then"]
    assert then["query"] == "deploys"
    assert [f["id"] for f in then["facts"]] == [old["id"]]
    # The same shapes as the command line's --json (a second reader, same journal).
    assert _cli_json(sqlite_url, "memory", "why", old["id"]) == seen["why"]
    assert _cli_json(sqlite_url, "memory", "history", old["id"]) == seen["history"]
    assert _cli_json(sqlite_url, "memory", "search", "deploys") == seen["search"]


def _a_run_that_read_a_fact(url: str) -> tuple[str, str, int]:
    """Run a plan whose step reads memory, then supersede the fact it read (P1, P3).

    Returns the run id, the fact read, and the journal position at which the run had started.
    """
    with journaled.open(url) as rt:
        fact = rt.memory.remember("the release branch is main", conflict_key="branch")

        def look(query: str, ctx: Any) -> list[str]:
            return [f.text for f in ctx.memory.search(query)]

        rt.register_tool("look", look)
        rt.register_tool("echo", lambda value: value)
        plan = Plan(
            goal="prepare the release",
            steps=[
                Step("find", tool="look", input="release branch"),
                Step("say", tool="echo", input="ready", depends_on=["find"]),
            ],
        )
        result = rt.execute(plan)
        assert result.ok
        started = rt.runs.history(result.run_id)[0].position
        rt.memory.remember("the release branch is release/2", conflict_key="branch")
        return result.run_id, fact.id, started


def test_runs_list_why_at_and_stale_on_a_run_made_beforehand(
    sqlite_url: str, tmp_path: Path
) -> None:
    """X2, T2, O6, O7, P3: a client lists a run, asks why, rebuilds it then, finds it stale."""
    run_id, fact_id, started = _a_run_that_read_a_fact(sqlite_url)
    seen: dict[str, Any] = {}

    async def session(client: ClientSession) -> None:
        seen["list"] = _ok(await client.call_tool("runs_list", {}))
        seen["completed"] = _ok(await client.call_tool("runs_list", {"status": "completed"}))
        seen["failed"] = _ok(await client.call_tool("runs_list", {"status": "failed"}))
        seen["either"] = _ok(
            await client.call_tool("runs_list", {"status": ["failed", "completed"]})
        )
        seen["why"] = _ok(await client.call_tool("runs_why", {"run_id": run_id}))
        seen["start"] = _ok(
            await client.call_tool("runs_at", {"run_id": run_id, "position": started})
        )
        seen["now"] = _ok(await client.call_tool("runs_at", {"run_id": run_id}))
        seen["stale"] = _ok(await client.call_tool("runs_stale", {"run_id": run_id}))
        seen["all_stale"] = _ok(await client.call_tool("runs_stale", {}))

    _talk(sqlite_url, session, tmp_path / "stderr.log")
    (row,) = seen["list"]
    assert (row["run_id"], row["status"], row["goal"]) == (
        run_id,
        "completed",
        "prepare the release",
    )
    assert (row["steps_done"], row["steps_total"]) == (2, 2)
    assert seen["completed"] == seen["list"]
    assert seen["failed"] == []
    assert seen["either"] == seen["list"]  # several statuses, as on every other door (T2)
    assert seen["why"]["run_id"] == run_id
    assert "completed" in seen["why"]["why"]
    start = seen["start"]
    assert start["position"] == started
    assert start["observations"] == []
    assert {s["id"]: s["status"] for s in start["plan"]["steps"]} == {
        "find": "pending",
        "say": "pending",
    }
    now = seen["now"]
    assert {s["id"]: s["status"] for s in now["plan"]["steps"]} == {
        "find": "succeeded",
        "say": "succeeded",
    }
    assert now["waves"] == [["find"], ["say"]]
    (stale,) = seen["stale"]
    assert (stale["run_id"], stale["step_id"], stale["fact_id"], stale["change"]) == (
        run_id,
        "find",
        fact_id,
        "superseded",
    )
    assert seen["all_stale"] == seen["stale"]
    # The same shapes as the command line's --json.
    with journaled.open(sqlite_url) as rt:
        assert seen["why"]["why"] == rt.runs.why(run_id)
    assert _cli_json(sqlite_url, "runs", "show", run_id, "--at", str(started)) == start
    assert _cli_json(sqlite_url, "runs", "list") == seen["list"]
    assert _cli_json(sqlite_url, "runs", "stale", run_id) == seen["stale"]


def test_refused_calls_name_the_argument_and_append_nothing(
    sqlite_url: str, tmp_path: Path
) -> None:
    """X2, M1, M2: bad arguments, unknown ids, bad positions: tool errors naming the argument."""
    run_id, fact_id, _ = _a_run_that_read_a_fact(sqlite_url)
    with journaled.open(sqlite_url) as rt:
        before = rt.journal.position()
    said: dict[str, str] = {}
    unknown_tool: list[MCPError] = []

    async def session(client: ClientSession) -> None:
        calls: dict[str, tuple[str, dict[str, Any]]] = {
            "unknown run": ("runs_why", {"run_id": "run_nope"}),
            "unknown run at": ("runs_at", {"run_id": "run_nope", "position": 1}),
            "unknown stale run": ("runs_stale", {"run_id": "run_nope"}),
            "past the end": ("runs_at", {"run_id": run_id, "position": before + 100}),
            "negative": ("memory_as_of", {"position": -1}),
            "before the run": ("runs_at", {"run_id": run_id, "position": 1}),
            "both times": ("memory_as_of", {"position": 1, "at_time": "2026-01-01"}),
            "bad time": ("runs_at", {"run_id": run_id, "at_time": "yesterday"}),
            "unknown fact": ("memory_why", {"fact_id": "mem_nope"}),
            "unknown fact history": ("memory_history", {"fact_id": "mem_nope"}),
            "wrong type": ("memory_search", {"query": "x", "limit": "ten"}),
            "bad bound": ("memory_search", {"query": "x", "min_confidence": 2}),
            "bad status": ("runs_list", {"status": "finished"}),
            "unknown argument": ("memory_search", {"query": "x", "top_k": 3}),
            "missing": ("memory_why", {}),
            "organization": ("memory_remember", {"text": "a fact", "scope": "organization"}),
            "empty text": ("memory_remember", {"text": "   "}),
            "window": ("memory_remember", {"text": "x", "valid_from": 5, "valid_until": 1}),
        }
        for label, (tool, arguments) in calls.items():
            said[label] = _refused(await client.call_tool(tool, arguments))
        try:
            await client.call_tool("memory_forget", {"fact_id": fact_id})
        except MCPError as exc:
            unknown_tool.append(exc)

    _talk(sqlite_url, session, tmp_path / "stderr.log")
    assert said["unknown run"] == "run_id: no run 'run_nope' in this journal"
    assert said["unknown run at"].startswith("run_id: no run 'run_nope'")
    assert said["unknown stale run"].startswith("run_id: no run 'run_nope'")
    assert said["past the end"] == (
        f"position: {before + 100} is past the end of the journal (its last position is {before})"
    )
    assert said["negative"].startswith("position: expected `int` >= 0")
    assert said["before the run"].startswith("position: position 1 is before run")
    assert said["both times"] == "position: give exactly one of position and at_time"
    assert said["bad time"].startswith("at_time: cannot read the time 'yesterday'")
    assert said["unknown fact"] == "fact_id: no fact 'mem_nope' in this journal"
    assert said["unknown fact history"] == said["unknown fact"]
    assert said["wrong type"] == "limit: expected `int`, got `str`"
    assert said["bad bound"] == "min_confidence: expected `float` <= 1.0"
    assert said["bad status"].startswith("status: invalid enum value 'finished'; use one of ")
    assert said["unknown argument"] == (
        "top_k: no such argument: memory_search takes query, scopes, domains, min_confidence, limit"
    )
    assert said["missing"] == "fact_id: is missing (it is required)"
    assert said["organization"].startswith("scope: is 'organization', but the organization scope")
    assert "JOURNALED_ORGANIZATION" in said["organization"]
    assert said["empty text"].startswith("text: ")
    assert said["window"].startswith("valid_until: ")
    (error,) = unknown_tool
    assert error.code == mt.INVALID_PARAMS
    assert error.message.startswith("name: no tool 'memory_forget'; the tools are memory_remember")
    with journaled.open(sqlite_url) as rt:
        assert rt.journal.position() == before


def test_the_server_exits_cleanly_when_the_client_closes(sqlite_url: str, tmp_path: Path) -> None:
    """X2: closing the client session ends the server with status 0, its runtime closed."""
    errlog = tmp_path / "stderr.log"

    async def session(client: ClientSession) -> None:
        _ok(await client.call_tool("memory_remember", {"text": "a fact to keep"}))

    script = '"$@"; echo "server exit status $?" >&2'  # $0 is "sh", "$@" the server
    _talk(sqlite_url, session, errlog, "sh", "-c", script, "sh")
    text = errlog.read_text()
    assert text.strip().splitlines()[-1] == "server exit status 0", text
    assert "Traceback" not in text
    # The runtime was closed properly: a fresh reader sees the fact, no snapshot is broken.
    with journaled.open(sqlite_url) as rt:
        assert [f.text for f in rt.memory.all()] == ["a fact to keep"]
        assert rt.journal.verify().ok


def test_nothing_but_the_protocol_reaches_stdout(sqlite_url: str) -> None:
    """X2: stdout carries JSON-RPC only; the journal comes from $JOURNALED_URL; EOF exits 0."""
    lines: list[dict[str, Any]] = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "memory_remember", "arguments": {"text": "stdout stays clean"}},
        },
        {
            "jsonrpc": "2.0",
            "id": 4,
            "method": "tools/call",
            "params": {"name": "runs_why", "arguments": {"run_id": "run_nope"}},
        },
    ]
    server = subprocess.Popen(
        [sys.executable, "-m", "journaled.cli", "mcp"],  # the journal from $JOURNALED_URL
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "JOURNALED_URL": sqlite_url},
    )
    assert server.stdin is not None
    assert server.stdout is not None
    replies = []
    for line in lines:
        server.stdin.write(json.dumps(line) + "\n")
        server.stdin.flush()
        if "id" in line:  # a request: read its reply before closing, as a client does
            replies.append(json.loads(server.stdout.readline()))
    rest, stderr = server.communicate(timeout=60)  # closes stdin: the client has gone
    assert server.returncode == 0, stderr
    assert all(reply["jsonrpc"] == "2.0" for reply in replies)
    assert [reply["id"] for reply in replies] == [1, 2, 3, 4]
    assert rest == ""  # nothing after the replies either
    by_id = {reply["id"]: reply["result"] for reply in replies}
    assert by_id[3]["structuredContent"]["text"] == "stdout stays clean"
    assert by_id[4]["isError"] is True
    with journaled.open(sqlite_url) as rt:
        assert [f.text for f in rt.memory.all()] == ["stdout stays clean"]


def test_neither_import_journaled_nor_help_imports_mcp() -> None:
    """T4, X2: `import journaled` and `journaled --help` leave the mcp package unimported."""
    probe = (
        "import sys, journaled\n"
        "from journaled.cli import main\n"
        "try:\n"
        "    main(['--help'], standalone_mode=False)\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'anyio', 'pydantic')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert "mcp" in done.stdout  # the help lists the command...
    assert done.stdout.strip().splitlines()[-1] == "[]"  # ...without importing the package


def test_without_the_extra_the_command_says_what_to_install(sqlite_url: str) -> None:
    """X2: without the mcp package, `journaled mcp` is a one-line error naming the extra."""
    probe = (
        "import sys\n"
        "sys.modules['mcp'] = None  # as if the extra were not installed\n"
        "from journaled.cli import main\n"
        "main(['mcp', '--url', sys.argv[1]])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, sqlite_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert "pip install 'journaled[mcp]'" in line


def test_a_damaged_journal_is_a_protocol_error_not_a_bad_argument(
    sqlite_url: str, tmp_path: Path
) -> None:
    """X2, J5: a run event that cannot be decoded is INTERNAL_ERROR naming its position."""
    run_id, _, _ = _a_run_that_read_a_fact(sqlite_url)
    with journaled.open(sqlite_url) as rt:
        broken = rt.runs.history(run_id)[-1].position
    path = sqlite_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE stored_events SET state = x'00' WHERE rowid = ?", [broken])
        conn.execute(f"DELETE FROM {SNAPSHOT_TABLE}")  # noqa: S608 - fold everything again
    errors: list[MCPError] = []

    async def session(client: ClientSession) -> None:
        try:
            await client.call_tool("runs_why", {"run_id": run_id})
        except MCPError as exc:
            errors.append(exc)
        _ok(await client.call_tool("memory_search", {"query": "release"}))  # still serving

    _talk(sqlite_url, session, tmp_path / "stderr.log")
    (error,) = errors
    assert error.code == mt.INTERNAL_ERROR
    assert error.message.startswith("the journal cannot be read: ")
    assert f"position {broken}" in error.message


@pytest.mark.usefixtures("sigint_reaches_children")
def test_ctrl_c_stops_the_server_quietly_with_status_130(sqlite_url: str) -> None:
    """X2: SIGINT (Ctrl-C in a terminal) closes the runtime and exits 130 without a traceback."""
    server = subprocess.Popen(
        [sys.executable, "-m", "journaled.cli", "mcp", "--url", sqlite_url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert server.stdin is not None
    assert server.stdout is not None
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
    server.stdin.write(json.dumps(hello) + "\n")
    server.stdin.flush()
    assert json.loads(server.stdout.readline())["id"] == 1  # serving: the runtime is open
    server.send_signal(signal.SIGINT)
    _, stderr = server.communicate(timeout=60)
    assert server.returncode == 130, stderr
    assert "Traceback" not in stderr
    with journaled.open(sqlite_url) as rt:
        assert rt.journal.verify().ok


def test_mcp_takes_json_after_the_command_as_every_command_does(sqlite_url: str) -> None:
    """X2, section 11 (each command with --json): `journaled mcp --json --url ...` serves as
    `journaled mcp` does (its results are JSON either way) and ends with 0 when stdin closes."""
    done = subprocess.run(
        [sys.executable, "-m", "journaled.cli", "mcp", "--json", "--url", sqlite_url],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "No such option" not in done.stderr
    assert done.stdout == ""
