"""The gateway (SPEC A4, ADR 0030): another actor system drives memory and runs by messages alone.

Every request and reply in these tests crosses as msgpack bytes: the foreign side registers a bytes
sink (``rt.protocol.register_bytes``) and sends encoded envelopes (``rt.protocol.deliver``).
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from gateway_foreign import WAIT, Foreign, read_frame, write_frame

import journaled
from journaled import AgentResult, NeedsInput, Plan, Step
from journaled.events import protocol
from journaled.events.errors import ProtocolError
from journaled.events.gateway_messages import (
    CancelRunRequest,
    DeleteFact,
    FactHistory,
    FactWhy,
    GatewayRequest,
    GetFact,
    JournalPosition,
    ListRuns,
    PurgeFact,
    ReadJournal,
    RememberRequest,
    ResumeRun,
    RunAt,
    RunWhy,
    SearchFacts,
    SearchSemantic,
    StartRun,
)
from journaled.events.messages import Failure
from journaled.testing import ManualClock

ROOT = Path(__file__).resolve().parent.parent


def tag(value: msgspec.Struct) -> str:
    """Return the tag a message or event crosses the wire with."""
    found = type(value).__struct_config__.tag
    assert isinstance(found, str)
    return found


@pytest.fixture
def runtime(journal_url: str, clock: ManualClock) -> Iterator[journaled.Runtime]:
    with journaled.open(journal_url, clock=clock) as rt:
        yield rt


@pytest.fixture
def foreign(runtime: journaled.Runtime) -> Iterator[Foreign]:
    box = Foreign("foreign/1", runtime.protocol.address, runtime.protocol.deliver)
    runtime.protocol.register_bytes(box.address, box.receive)
    yield box
    runtime.protocol.unregister(box.address)
    # Everything that crossed decodes as an envelope of the protocol, both ways.
    for data in [*box.sent, *box.received]:
        assert isinstance(protocol.decode_envelope_msgpack(data), protocol.Envelope)


def test_a_foreign_mailbox_drives_memory_by_messages(
    runtime: journaled.Runtime, foreign: Foreign
) -> None:
    """A4: remember, get, search, search_semantic, why, history, delete and purge by messages."""
    old = foreign.ask(RememberRequest, "r1", text="deploys go through staging", conflict_key="d")
    new = foreign.ask(RememberRequest, "r2", text="deploys go straight to prod", conflict_key="d")
    assert new.fact.supersedes == (old.fact.id,)
    assert foreign.ask(GetFact, "g1", fact_id=new.fact.id).fact == new.fact
    hits = foreign.ask(SearchFacts, "s1", query="deploys prod")
    assert [f.id for f in hits.facts] == [new.fact.id]
    semantic = foreign.ask(SearchSemantic, "s2", query="deploys prod")
    assert [f.id for f in semantic.facts] == [new.fact.id]
    why = foreign.ask(FactWhy, "w1", fact_id=old.fact.id)
    assert new.fact.id in why.text
    history = foreign.ask(FactHistory, "h1", fact_id=old.fact.id)
    assert [tag(e.data) for e in history.events] == [
        e.kind for e in runtime.memory.history(old.fact.id)
    ]
    assert tag(history.events[0].data) == "memory.fact-remembered"
    deleted = foreign.ask(DeleteFact, "d1", fact_id=new.fact.id)
    assert deleted.deletion.primary
    assert foreign.ask(GetFact, "g2", fact_id=new.fact.id).fact is None
    assert runtime.memory.get(new.fact.id) is None
    purged = foreign.ask(PurgeFact, "p1", fact_id=old.fact.id, reason="asked to")
    assert purged.erased
    assert runtime.memory.get(old.fact.id) is None


def test_a_foreign_mailbox_runs_a_plan_and_reads_it(
    runtime: journaled.Runtime, foreign: Foreign
) -> None:
    """A4: a start is answered at once with the run id, then run.ended with the result."""
    release = threading.Event()
    runtime.register_tool("slow", lambda x: release.wait(WAIT) and x * 2)
    plan = Plan(goal="double", steps=[Step("a", tool="slow", input=21)])
    foreign.send(StartRun, "run1", plan=plan, call_budget=5, max_parallel_steps=1)
    (started,) = foreign.wait("run1")
    assert tag(started) == "gateway.run-started"
    # The run is still executing: its id is readable, and nothing has ended.
    assert runtime.runs.history(started.run_id)[0].kind == "run.started"
    listed = foreign.ask(ListRuns, "l1")
    assert started.run_id in listed.run_ids
    release.set()
    _, ended = foreign.wait("run1", 2)
    assert tag(ended) == "run.ended"
    assert ended.result.run_id == started.run_id
    assert ended.result.ok
    assert ended.result.observations[0].output == 42
    state = foreign.ask(RunAt, "at1", run_id=started.run_id)
    assert state.result == ended.result
    first = runtime.runs.history(started.run_id)[0].position
    then = foreign.ask(RunAt, "at2", run_id=started.run_id, position=first)
    assert then.result.plan.steps[0].status == "pending"
    assert "completed" in foreign.ask(RunWhy, "y1", run_id=started.run_id).text
    position = foreign.ask(JournalPosition, "j1").position
    assert position == runtime.journal.position()
    page = foreign.ask(ReadJournal, "j2", after=0, limit=1000)
    assert page.position == position
    assert [e.position for e in page.events] == [e.position for e in runtime.journal.read()]
    assert {tag(e.data) for e in page.events} >= {"run.started", "run.finished"}


def test_a_waiting_step_is_answered_by_a_resume_request(
    runtime: journaled.Runtime, foreign: Foreign
) -> None:
    """A4/E14: a run waiting for input ends; a resume request answers it and it completes."""

    def asker(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        if ctx.answer is None:
            raise NeedsInput("which branch?")
        return AgentResult(output=f"on {ctx.answer}", calls_used=1)

    runtime.register_agent("asker", asker)
    foreign.send(StartRun, "run1", plan=Plan(goal="g", steps=[Step("a", agent="asker")]))
    started, ended = foreign.wait("run1", 2)
    assert ended.result.waiting == ["a"]
    assert not ended.result.ok
    foreign.send(ResumeRun, "res1", run_id=started.run_id, answers={"a": "main"}, call_budget=3)
    restarted, resumed = foreign.wait("res1", 2)
    assert restarted.run_id == started.run_id
    assert resumed.result.ok
    assert resumed.result.observations[-1].output == "on main"


def test_a_cancel_request_stops_a_run(runtime: journaled.Runtime, foreign: Foreign) -> None:
    """A4/E5: a cancel request stops a run started by message; its run.ended says so."""
    started_step = threading.Event()

    def waiter(step: Step, ctx: journaled.AgentContext) -> AgentResult:
        started_step.set()
        while not ctx.cancelled():
            threading.Event().wait(0.01)
        return AgentResult(ok=False, error="stopped")

    runtime.register_agent("waiter", waiter)
    runtime.register_tool("after", lambda x: x)
    plan = Plan(
        goal="g", steps=[Step("a", agent="waiter"), Step("b", tool="after", depends_on=["a"])]
    )
    foreign.send(StartRun, "run1", plan=plan)
    (started,) = foreign.wait("run1")
    assert started_step.wait(WAIT)
    assert foreign.ask(CancelRunRequest, "c1", run_id=started.run_id).cancelled
    _, ended = foreign.wait("run1", 2)
    assert not ended.result.ok
    assert runtime.runs.history(started.run_id)[-1].data.status == "cancelled"  # type: ignore[attr-defined]
    assert foreign.ask(CancelRunRequest, "c2", run_id=started.run_id).cancelled is False


def _envelope(foreign: Foreign, message: dict[str, Any]) -> bytes:
    return msgspec.msgpack.encode({"to": foreign.gateway, "message": message})


@pytest.mark.parametrize(
    ("message", "field", "words"),
    [
        ({"type": "gateway.forget-everything"}, "type", "gateway.forget-everything"),
        ({"type": "gateway.search", "query": 5}, "query", "Expected `str`, got `int`"),
        ({"type": "gateway.journal-read", "limit": "ten"}, "limit", "Expected `int`"),
        (
            {"type": "gateway.search", "query": "x", "version": 2},
            "version",
            "gateway.search version 2 is not one this release reads",
        ),
        (
            {"type": "gateway.run-start", "plan": {"goal": "g", "steps": [{"id": 3}]}},
            "plan.steps[0].id",
            "Expected `str`",
        ),
    ],
)
def test_a_request_that_does_not_decode_gets_a_failure_naming_the_field(
    runtime: journaled.Runtime,
    foreign: Foreign,
    message: dict[str, Any],
    field: str | None,
    words: str,
) -> None:
    """A4: bad tag or field type: deliver raises ProtocolError, the asker gets reply.failure."""
    before = runtime.journal.position()
    data = _envelope(foreign, {**message, "reply_to": foreign.address, "correlation": "bad"})
    with pytest.raises(ProtocolError, match=re.escape(words)):
        runtime.protocol.deliver(data)
    (reply,) = foreign.wait("bad")
    assert isinstance(reply, Failure)
    assert reply.error == "ProtocolError"
    assert words in reply.message
    assert reply.field == field
    assert runtime.journal.position() == before


@pytest.mark.parametrize(
    ("cls", "fields", "error", "field"),
    [
        (
            StartRun,
            {"plan": Plan(goal="g", steps=[Step("a", tool="echo"), Step("b", tool="nope")])},
            "PlanRejected",
            "plan.steps[1]",
        ),
        (
            StartRun,
            {"plan": Plan(goal="g", steps=[Step("a", tool="echo")]), "max_parallel_steps": 0},
            "ValueError",
            "max_parallel_steps",  # the argument at fault (docs/protocol.md, "Failures")
        ),
        (RememberRequest, {"text": "  "}, "InvalidFact", "text"),
        (ReadJournal, {"limit": 0}, "ProtocolError", "limit"),
        (ResumeRun, {"run_id": "run_nothing"}, "RunNotFound", None),
        (RunWhy, {"run_id": "run_nothing"}, "RunNotFound", None),
    ],
)
def test_a_request_the_runtime_refuses_gets_a_failure_and_stores_nothing(
    runtime: journaled.Runtime,
    foreign: Foreign,
    cls: type[GatewayRequest],
    fields: dict[str, Any],
    error: str,
    field: str | None,
) -> None:
    """A4/E1: an unknown step tool, a blank fact, a bad page: reply.failure, nothing appended."""
    runtime.register_tool("echo", lambda x: x)
    before = runtime.journal.position()
    reply = foreign.ask(cls, "bad", **fields)
    assert isinstance(reply, Failure)
    assert (reply.error, reply.field) == (error, field), reply
    assert runtime.journal.position() == before
    assert foreign.ask(ListRuns, "l1").run_ids == []


def test_bytes_that_are_no_envelope_raise_protocol_error(runtime: journaled.Runtime) -> None:
    """A4: bytes that are not msgpack, or JSON that is no envelope, raise ProtocolError."""
    with pytest.raises(ProtocolError, match="malformed"):
        runtime.protocol.deliver(b"\xc1\xc1")
    with pytest.raises(ProtocolError, match="invalid message"):
        runtime.protocol.deliver(b'{"to": "x"}', wire="json")
    assert runtime.journal.position() == 0


def test_a_plain_mailbox_and_send_work_in_process(runtime: journaled.Runtime) -> None:
    """A4: rt.protocol.register takes any object with tell; send checks fields like the wire."""
    got: list[Any] = []
    arrived = threading.Event()

    class Box:
        def tell(self, message: Any) -> None:
            got.append(message)
            arrived.set()

    runtime.protocol.register("plain/1", Box())
    runtime.protocol.send(SearchFacts(reply_to="plain/1", correlation="x", query=5))  # type: ignore[arg-type]
    assert arrived.wait(WAIT)
    assert isinstance(got[0], Failure)
    assert got[0].field == "query"
    arrived.clear()
    runtime.protocol.send(JournalPosition(reply_to="plain/1", correlation="y"))
    assert arrived.wait(WAIT)
    assert got[1].position == 0
    with pytest.raises(ProtocolError, match="not a gateway request"):
        runtime.protocol.send(Failure(correlation="z", error="E", message="m"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="taken"):
        runtime.protocol.register("plain/1", Box())
    runtime.protocol.unregister("plain/1")


def test_json_wire_round_trips_too(runtime: journaled.Runtime) -> None:
    """A4: a transport speaking JSON gets JSON envelopes back."""
    received: list[bytes] = []
    arrived = threading.Event()

    def take(data: bytes) -> None:
        received.append(data)
        arrived.set()

    runtime.protocol.register_bytes("json/1", take, "json")
    request = JournalPosition(reply_to="json/1", correlation="p")
    runtime.protocol.deliver(
        protocol.encode_json(protocol.Envelope(to=runtime.protocol.address, message=request)),
        wire="json",
    )
    assert arrived.wait(WAIT)
    envelope = protocol.decode_envelope_json(received[0])
    assert envelope.to == "json/1"
    assert envelope.message.position == 0  # type: ignore[union-attr]


def test_a_reply_that_cannot_be_encoded_is_answered_by_a_failure(
    runtime: journaled.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A4, ADR 0098: a reply that cannot cross the wire (a run's output keyed by a tuple, as an
    earlier release stored it, sent to a JSON client) reaches its asker as a reply.failure with
    its correlation, naming why; before, it was dropped and the client waited for ever."""
    # As an earlier release stored it (raising=False: that release had no such check).
    monkeypatch.setattr("journaled.actors.steps._key_problem", lambda _: None, raising=False)
    runtime.register_tool("keyed", lambda _: {(1, 2): "x"})
    received: list[Any] = []
    two = threading.Event()

    def take(data: bytes) -> None:
        received.append(protocol.decode_envelope_json(data).message)
        if len(received) == 2:
            two.set()

    runtime.protocol.register_bytes("json/1", take, "json")
    plan = Plan(goal="g", steps=[Step("a", tool="keyed")])
    runtime.protocol.send(StartRun(reply_to="json/1", correlation="c1", plan=plan))
    assert two.wait(WAIT), received
    ended = received[1]
    assert isinstance(ended, Failure)
    assert ended.correlation == "c1"
    assert ended.error == "ProtocolError"
    assert ended.message.startswith("the reply could not be sent: cannot encode run.ended")
    assert "str-like or number-like keys" in ended.message


def test_a_child_process_runs_a_plan_and_reads_memory_over_pipes(sqlite_url: str) -> None:
    """A4: a child speaking msgpack envelopes over stdin/stdout drives the parent's runtime."""
    with journaled.open(sqlite_url) as rt:
        rt.register_tool("double", lambda x: x * 2)
        child = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "gateway_foreign.py"), rt.protocol.address],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"PYTHONPATH": str(ROOT), "PATH": ""},
        )
        assert child.stdin is not None
        assert child.stdout is not None
        to_child = child.stdin
        lock = threading.Lock()

        def send(data: bytes) -> None:
            with lock:
                write_frame(to_child, data)

        rt.protocol.register_bytes("child/1", send)
        delivered: list[bytes] = []

        def pump() -> None:
            assert child.stdout is not None
            while (frame := read_frame(child.stdout)) is not None:
                delivered.append(frame)
                rt.protocol.deliver(frame)

        reader = threading.Thread(target=pump)
        reader.start()
        try:
            rc = child.wait(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
            reader.join(timeout=WAIT)
            to_child.close()
        assert child.stderr is not None
        stderr = child.stderr.read().decode()
        child.stdout.close()
        child.stderr.close()
        assert rc == 0, stderr
        summary = msgspec.json.decode(stderr.strip().splitlines()[-1])
        assert summary["ok"] is True
        assert summary["output"] == 42
        assert summary["started"] == summary["ended"]
        assert summary["hits"] == [summary["remembered"]]
        assert rt.memory.get(summary["remembered"]) is not None
        assert rt.runs.current(summary["started"]).ok
        assert len(delivered) == 3


def test_closing_the_runtime_stops_the_gateway(journal_url: str) -> None:
    """A4: after close, the gateway's address is free and no actor is left running."""
    rt = journaled.open(journal_url)
    address = rt.protocol.address
    assert rt._directory.lookup(address) is not None
    rt.close()
    assert rt._directory.lookup(address) is None


def test_the_foreign_actor_example_runs() -> None:
    """A4/X3: examples/foreign_actor.py, a user's pykka actor, drives journaled by messages."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "foreign_actor.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith(": releases ship on Fridays")
    assert lines[1] == "search found: ['releases ship on Fridays']"
    assert lines[-1] == "run ended ok=True: v2.0 is out, SHIP IT"


def test_only_the_gateway_and_registered_mailboxes_can_be_addressed(
    runtime: journaled.Runtime, foreign: Foreign
) -> None:
    """A4: deliver refuses internal actors' addresses and non-requests to the gateway."""
    internal = [
        a
        for a in runtime._directory.addresses()
        if a.startswith(runtime._directory.name) and a != runtime.protocol.address
    ]
    assert internal
    forged = protocol.Envelope(
        to=internal[0], message=Failure(correlation="c", error="E", message="m")
    )
    with pytest.raises(ProtocolError, match="not an address of the protocol"):
        runtime.protocol.deliver(protocol.encode_msgpack(forged))
    reply = protocol.Envelope(
        to=runtime.protocol.address, message=Failure(correlation="c", error="E", message="m")
    )
    with pytest.raises(ProtocolError, match="requests only"):
        runtime.protocol.deliver(protocol.encode_msgpack(reply))
    # A registered foreign mailbox can be addressed (two systems talking through one runtime).
    note = protocol.Envelope(
        to=foreign.address, message=Failure(correlation="n", error="E", message="m")
    )
    assert runtime.protocol.deliver(protocol.encode_msgpack(note)) is True
    assert foreign.wait("n")[0].error == "E"


def test_a_failing_transport_loses_its_reply_but_stops_nothing(
    runtime: journaled.Runtime, foreign: Foreign
) -> None:
    """A4: a sink that raises (a closed pipe) drops its replies; gateway and writer live on."""

    def broken(data: bytes) -> None:
        raise BrokenPipeError("the other side went away")

    runtime.protocol.register_bytes("gone/1", broken)
    for request in (
        RememberRequest(reply_to="gone/1", correlation="r", text="told to nobody"),
        JournalPosition(reply_to="gone/1", correlation="p"),
    ):
        runtime.protocol.send(request)
    # Both the writer (remember) and the gateway (position) answered the broken sink, and live.
    fact = foreign.ask(RememberRequest, "r2", text="still remembered")
    assert fact.fact.text == "still remembered"
    assert foreign.ask(JournalPosition, "p2").position == runtime.journal.position()
    assert {f.text for f in runtime.memory.all()} == {"told to nobody", "still remembered"}


def test_a_start_sent_again_is_answered_again_not_run_twice(
    runtime: journaled.Runtime, foreign: Foreign
) -> None:
    """A4: a resent run start (same reply_to and correlation) gets the same run id; one run."""
    runtime.register_tool("echo", lambda x: x)
    plan = Plan(goal="once", steps=[Step("a", tool="echo", input=1)])
    foreign.send(StartRun, "s1", plan=plan)
    first = foreign.wait("s1", 2)
    foreign.send(StartRun, "s1", plan=plan)
    again = foreign.wait("s1", 4)[2:]
    assert [tag(m) for m in again] == ["gateway.run-started", "run.ended"]
    assert again[0].run_id == first[0].run_id
    assert again[1].result == first[1].result
    assert foreign.ask(ListRuns, "l1").run_ids == [first[0].run_id]
    foreign.send(StartRun, "s2", plan=plan)
    assert foreign.wait("s2")[0].run_id != first[0].run_id


def test_a_request_naming_an_internal_reply_address_is_dropped(
    runtime: journaled.Runtime, foreign: Foreign
) -> None:
    """A4: answers go only to mailboxes registered through rt.protocol, never to our actors."""
    seen: list[Any] = []
    internal = runtime._directory.address("runs")
    original = runtime._directory.lookup(internal)
    assert original is not None

    class Spy:
        def tell(self, message: Any) -> None:
            seen.append(message)

    # Stand in for the internal mailbox to see whether the gateway tells it anything.
    runtime._directory.unregister(internal)
    runtime._directory.register(internal, Spy())
    try:
        for request in (
            JournalPosition(reply_to=internal, correlation="x"),
            RememberRequest(reply_to=internal, correlation="y", text="never stored"),
        ):
            runtime.protocol.deliver(
                protocol.encode_msgpack(
                    protocol.Envelope(to=runtime.protocol.address, message=request)
                )
            )
        # The gateway serves in order: once this is answered, the two before it were handled.
        assert foreign.ask(JournalPosition, "after").position == runtime.journal.position()
    finally:
        runtime._directory.unregister(internal)
        runtime._directory.register(internal, original)
    assert seen == []
    assert runtime.memory.all() == []
