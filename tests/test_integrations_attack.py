"""The MCP server (SPEC X2) and the AutoGen memory (X1) driven as an attacker and an operator.

Another process writing and purging the journal the server reads, a client that goes away
mid-call, many calls at once, organizations (R1), PostgreSQL, and AutoGen's component configs.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("mcp", reason="the MCP tests need the mcp extra: pip install -e '.[mcp]'")
pytest.importorskip("autogen_core", reason="the AutoGen tests need: pip install -e '.[autogen]'")

from autogen_core.memory import MemoryContent

import journaled
from journaled.integrations.autogen import JournaledMemory
from journaled.mcp_tools import TOOLS, answer

pytestmark = pytest.mark.slow

SPECS = {spec.name: spec for spec in TOOLS}

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


def tool(rt: journaled.Runtime, name: str, **arguments: Any) -> Any:
    """Answer one call as the server does (in this thread); return the CLI's JSON value."""
    shown, _structured = answer(rt, SPECS[name], arguments)
    return json.loads(json.dumps(shown, default=_builtins))


def _builtins(value: object) -> object:
    import msgspec

    return msgspec.to_builtins(value)


def request(request_id: int, name: str, arguments: dict[str, Any]) -> bytes:
    message = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }
    return json.dumps(message).encode() + b"\n"


@pytest.fixture
def servers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def start(
    url: str, started: list[subprocess.Popen[bytes]], env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with tempfile.TemporaryFile() as errlog:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "journaled.cli", "mcp", "--url", url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errlog,
            env=env,
        )
    started.append(proc)
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline())["id"] == 0
    proc.stdin.write(json.dumps(INITIALIZED).encode() + b"\n")
    proc.stdin.flush()
    return proc


# -- X2: the journal another process writes ----------------------------------------------------


def test_a_search_never_finds_a_fact_another_process_purged(sqlite_url: str) -> None:
    """memory_why read the purge from the journal while memory_search, served from memory's
    projection between two polls of the follower, still returned the purged text (R2)."""
    with (
        journaled.open(sqlite_url, follow=None) as server,  # between two polls, for good
        journaled.open(sqlite_url) as other,
    ):
        fact = other.memory.remember("the vault code is 4711 zebra")
        server.refresh()  # the follower's last poll saw the fact
        other.memory.purge(fact.id)
        assert "purged" in tool(server, "memory_why", fact_id=fact.id)["why"]
        assert tool(server, "memory_search", query="zebra") == []
        assert "4711" not in json.dumps(tool(server, "memory_search", query="vault code"))
        later = other.memory.remember("a later zebra")  # and another process's new fact
        found = tool(server, "memory_search", query="zebra")
        assert [f["id"] for f in found] == [later.id]


# -- X2: the client goes away ------------------------------------------------------------------


def test_a_client_gone_mid_call_leaves_exit_status_0(
    sqlite_url: str, servers: list[subprocess.Popen[bytes]]
) -> None:
    """The answers the closed pipe could not take stayed in the sink's buffer; closing it raised
    EPIPE out of the command, which click turns into exit status 1."""
    proc = start(sqlite_url, servers)
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(
        b"".join(request(i, "memory_remember", {"text": f"fact {i}"}) for i in range(1, 60))
    )
    proc.stdin.flush()
    proc.stdout.close()
    proc.stdin.close()
    assert proc.wait(60) == 0
    with journaled.open(sqlite_url) as rt:
        assert rt.journal.verify().ok
        texts = [f.text for f in rt.memory.all()]
        assert len(texts) == len(set(texts))  # nothing stored twice


# -- X1: component configs and organizations ---------------------------------------------------


def test_a_dumped_organization_memory_loads_into_its_own_organization(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The config left the organization out: loaded where JOURNALED_ORGANIZATION names another,
    acme's memory of scope 'organization' read (and would write) that organization's facts."""

    async def main() -> None:
        with (
            journaled.open(sqlite_url, organization="acme") as acme,
            journaled.open(sqlite_url, organization="globex") as globex,
        ):
            mine = JournaledMemory(acme, "organization")
            await mine.add(MemoryContent(content="acme's zebra plan", mime_type="text/plain"))
            theirs = JournaledMemory(globex, "organization")
            await theirs.add(MemoryContent(content="globex's zebra plan", mime_type="text/plain"))
            config = mine.dump_component()
            for env in (None, "globex"):
                if env is None:
                    monkeypatch.delenv("JOURNALED_ORGANIZATION", raising=False)
                else:
                    monkeypatch.setenv("JOURNALED_ORGANIZATION", env)
                loaded = JournaledMemory.load_component(config)
                try:
                    found = await loaded.query("zebra")
                    assert [r.content for r in found.results] == ["acme's zebra plan"]
                finally:
                    await loaded.close()

    asyncio.run(main())
