"""A foreign actor system in miniature: it reaches a runtime only through encoded envelopes (A4).

Used by tests/test_gateway.py in process, and run as a child process (``python -m`` style, by path)
that speaks length-prefixed msgpack envelopes over its stdin and stdout.
"""

from __future__ import annotations

import struct
import sys
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import IO, Any

import msgspec

from journaled import Plan, Step
from journaled.events import protocol
from journaled.events.gateway_messages import (
    GatewayRequest,
    RememberRequest,
    SearchFacts,
    StartRun,
)

WAIT = 30.0


class Foreign:
    """A mailbox at ``address`` that sends and receives only bytes (msgpack envelopes)."""

    def __init__(self, address: str, gateway: str, transmit: Callable[[bytes], Any]) -> None:
        self.address = address
        self.gateway = gateway
        self._transmit = transmit
        self._replies: dict[str, list[Any]] = defaultdict(list)
        self._changed = threading.Condition()
        self.sent: list[bytes] = []
        self.received: list[bytes] = []

    def receive(self, data: bytes) -> None:
        """Take one encoded envelope addressed here."""
        envelope = protocol.decode_envelope_msgpack(data)
        assert envelope.to == self.address, envelope.to
        with self._changed:
            self.received.append(data)
            self._replies[envelope.message.correlation].append(envelope.message)  # type: ignore[union-attr]
            self._changed.notify_all()

    def send(self, cls: type[GatewayRequest], correlation: str, **fields: Any) -> None:
        """Encode a request to the gateway and hand it to the transport."""
        request = cls(reply_to=self.address, correlation=correlation, **fields)
        data = protocol.encode_msgpack(protocol.Envelope(to=self.gateway, message=request))
        self.sent.append(data)
        self._transmit(data)

    def wait(self, correlation: str, count: int = 1) -> list[Any]:
        """Return the first ``count`` replies repeating ``correlation`` (waiting for them)."""
        with self._changed:
            if not self._changed.wait_for(
                lambda: len(self._replies[correlation]) >= count, timeout=WAIT
            ):
                raise TimeoutError(f"no {count} replies to {correlation}: {self._replies}")
            return list(self._replies[correlation][:count])

    def ask(self, cls: type[GatewayRequest], correlation: str, **fields: Any) -> Any:
        """Send a request and return its one reply."""
        self.send(cls, correlation, **fields)
        return self.wait(correlation)[0]


def write_frame(stream: IO[bytes], data: bytes) -> None:
    """Write one length-prefixed frame and flush it."""
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def read_frame(stream: IO[bytes]) -> bytes | None:
    """Read one length-prefixed frame; None at the end of the stream."""
    head = _read_exact(stream, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">I", head)
    return _read_exact(stream, size)


def _read_exact(stream: IO[bytes], size: int) -> bytes | None:
    # A raw stream may return short reads; a buffered one returns short only at its end.
    data = b""
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _child(gateway: str) -> int:
    """Run a plan and read memory over stdin/stdout; print what came back on stderr."""

    out = sys.stdout.buffer
    foreign = Foreign("child/1", gateway, lambda data: write_frame(out, data))
    # Unbuffered: a daemon thread blocked in a buffered read aborts the interpreter at exit.
    stdin = open(0, "rb", buffering=0, closefd=False)  # noqa: SIM115 - read until the process ends
    reader = threading.Thread(target=_read_all, args=(foreign, stdin), daemon=True)
    reader.start()
    remembered = foreign.ask(RememberRequest, "r1", text="the child says releases ship on Fridays")
    hits = foreign.ask(SearchFacts, "s1", query="releases Fridays")
    plan = Plan(goal="double", steps=[Step("a", tool="double", input=21)])
    foreign.send(StartRun, "run1", plan=plan)
    started, ended = foreign.wait("run1", 2)
    summary = {
        "remembered": remembered.fact.id,
        "hits": [f.id for f in hits.facts],
        "started": started.run_id,
        "ended": ended.result.run_id,
        "output": ended.result.observations[0].output,
        "ok": ended.result.ok,
    }
    sys.stderr.write(msgspec.json.encode(summary).decode() + "\n")
    return 0


def _read_all(foreign: Foreign, stream: IO[bytes]) -> None:
    while (frame := read_frame(stream)) is not None:
        foreign.receive(frame)


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
