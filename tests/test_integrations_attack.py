"""The MCP server (SPEC X2) and the AutoGen memory (X1) driven as an attacker and an operator.

Another process writing and purging the journal the server reads, a client that goes away
mid-call, many calls at once, organizations (R1), PostgreSQL, and AutoGen's component configs.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("mcp", reason="the MCP tests need the mcp extra: pip install -e '.[mcp]'")
pytest.importorskip("autogen_core", reason="the AutoGen tests need: pip install -e '.[autogen]'")

from autogen_core.memory import MemoryContent
from test_mcp_attack import INITIALIZE, INITIALIZED, call, line

import journaled
from journaled.integrations.autogen import JournaledMemory
from journaled.mcp_tools import TOOLS, answer, object_schema

pytestmark = pytest.mark.slow

SPECS = {spec.name: spec for spec in TOOLS}


def tool(rt: journaled.Runtime, name: str, **arguments: Any) -> Any:
    """Answer one call as the server does (in this thread); return the CLI's JSON value."""
    shown, _structured = answer(rt, SPECS[name], arguments)
    return json.loads(json.dumps(shown, default=_builtins))


def _builtins(value: object) -> object:
    import msgspec

    return msgspec.to_builtins(value)


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
    proc.stdin.write(line(INITIALIZE))
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline())["id"] == 0
    proc.stdin.write(line(INITIALIZED))
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
        b"".join(line(call(i, "memory_remember", {"text": f"fact {i}"})) for i in range(1, 60))
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


# -- X2: many calls at once, organizations, PostgreSQL ------------------------------------------


def _answers(proc: subprocess.Popen[bytes], count: int) -> dict[int, dict[str, Any]]:
    assert proc.stdout is not None
    found: dict[int, dict[str, Any]] = {}
    while len(found) < count:
        message = json.loads(proc.stdout.readline())
        found[message["id"]] = message
    return found


def _structured(reply: dict[str, Any]) -> Any:
    result = reply["result"]
    assert not result["isError"], result
    return result["structuredContent"]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_many_keyed_remembers_at_once_leave_one_active_in_their_organization(
    backend: str,
    request: pytest.FixtureRequest,
    servers: list[subprocess.Popen[bytes]],
) -> None:
    """Held: 40 keyed remembers and 40 searches at once, one active; secrets redacted, NUL kept;
    another organization's server sees none of it (R1), on SQLite and PostgreSQL."""
    url: str = request.getfixturevalue("pg_url" if backend == "postgresql" else "sqlite_url")
    env = {k: v for k, v in os.environ.items() if k != "JOURNALED_URL"}
    acme = start(url, servers, {**env, "JOURNALED_ORGANIZATION": "acme"})
    globex = start(url, servers, {**env, "JOURNALED_ORGANIZATION": "globex"})
    assert acme.stdin is not None
    secret = "sk-" + "a1B2" * 10
    calls = [
        request_line
        for i in range(1, 41)
        for request_line in (
            line(
                call(
                    i,
                    "memory_remember",
                    {
                        "text": f"plan {i} of acme\x00 key {secret}",
                        "scope": "organization",
                        "conflict_key": "acme-plan",
                        "source": f"token={secret}",
                    },
                )
            ),
            line(call(100 + i, "memory_search", {"query": "acme plan", "limit": 1000})),
        )
    ]
    acme.stdin.write(b"".join(calls))
    acme.stdin.flush()
    replies = _answers(acme, 80)
    stored = [_structured(replies[i]) for i in range(1, 41)]
    assert all(secret not in json.dumps(fact) for fact in stored)  # M9, text and source
    assert all("\x00" in fact["text"] for fact in stored)  # NUL kept, on every backend
    for i in range(101, 141):
        assert len(_structured(replies[i])["facts"]) <= 1  # never two active under one key
    acme.stdin.write(line(call(200, "memory_search", {"query": "acme plan"})))
    acme.stdin.flush()
    active = _structured(_answers(acme, 1)[200])["facts"]
    assert len(active) == 1
    assert globex.stdin is not None  # another organization's server: nothing of acme's
    ids = [fact["id"] for fact in stored]
    globex.stdin.write(
        line(call(1, "memory_search", {"query": "acme plan"}))
        + line(call(2, "memory_why", {"fact_id": ids[0]}))
        + line(call(3, "memory_as_of", {"position": 0, "query": "acme"}))
    )
    globex.stdin.flush()
    theirs = _answers(globex, 3)
    assert _structured(theirs[1]) == {"facts": []}
    assert theirs[2]["result"]["isError"]
    for proc in (acme, globex):
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(60) == 0
    with journaled.open(url, organization="acme") as rt:
        assert rt.journal.verify().ok
        assert len(rt.memory.all()) == 40
        raw = json.dumps(
            [e.data for f in rt.memory.all() for e in rt.memory.history(f.id)], default=str
        )
        assert secret not in raw


def test_memory_as_of_says_its_limit_bounds_a_search_only(sqlite_url: str) -> None:
    """Without a query the tool answers every fact stored then, whatever ``limit`` says; its
    schema told a client ``limit`` was the most results to return."""
    with journaled.open(sqlite_url) as rt:
        for i in range(3):
            rt.memory.remember(f"fact {i}")
        shown = tool(rt, "memory_as_of", position=rt.journal.position(), limit=1)
        assert len(shown["facts"]) == 3  # as `journaled memory as-of --limit 1 --json`
    schema = object_schema(SPECS["memory_as_of"].args)
    assert "query" in schema["properties"]["limit"]["description"]
