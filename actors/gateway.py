"""The gateway: the one door through which other actor systems and processes drive a runtime (A4).

A foreign system registers its reply mailboxes (anything with ``tell``, or a function taking the
encoded bytes) and sends requests (:mod:`journaled.events.gateway_messages`) to the address
``<runtime>/gateway``. The gateway answers each by a typed reply told to the request's
``reply_to``, repeating its ``correlation`` (ADR 0030).

Where the work runs: memory reads and writes, run reads and a run's start (one commit) run in the
gateway's own thread, one request at a time, in arrival order; a remember is forwarded to the memory
writer with the asker's address, so it joins the writer's group commit and the writer answers the
asker directly. The gateway never waits for a run: the run's ``run.ended`` is told from the run's
own completion callback.
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Literal, Protocol

import msgspec
import pykka

from journaled.actors.directory import Directory, Mailbox, failure
from journaled.actors.runs import RunHandle
from journaled.events.base import Event
from journaled.events.errors import PlanRejected, ProtocolError
from journaled.events.gateway_messages import (
    CancelRunRequest,
    DeletedReply,
    DeleteFact,
    EventsReply,
    ExplainedReply,
    FactHistory,
    FactReply,
    FactsReply,
    FactWhy,
    GatewayRequest,
    GetFact,
    JournalEntry,
    JournalPosition,
    ListRuns,
    OrchestrationEnded,
    PositionReply,
    PurgedReply,
    PurgeFact,
    ReadJournal,
    RememberRequest,
    ResumeRun,
    RunAt,
    RunCancelledReply,
    RunIdsReply,
    RunStartedReply,
    RunStateReply,
    RunWhy,
    SearchFacts,
    SearchSemantic,
    StartRun,
)
from journaled.events.messages import Failure, Remember
from journaled.events.orchestration import Outcome
from journaled.events.plans import ExecuteResult, Limits, Plan
from journaled.events.protocol import (
    AnyMessage,
    Envelope,
    decode_envelope_json,
    decode_envelope_msgpack,
    decode_msgpack,
    encode_json,
    encode_msgpack,
    message_tag,
)
from journaled.events.run_messages import RunEnded

__all__ = ["GATEWAY", "MAX_PAGE", "Door", "Gateway", "ProtocolDoor", "Wire"]

log = logging.getLogger("journaled")

GATEWAY = "gateway"
"""The gateway's name within its runtime: its address is ``<runtime>/gateway``."""
MAX_PAGE = 1000
"""The most journal positions one ``gateway.journal-read`` covers."""
STOP_TIMEOUT = 10.0
REMEMBERED_STARTS = 1024
"""How many recent run starts the gateway recognises when they are sent again (ADR 0030)."""

Wire = Literal["msgpack", "json"]
"""The encodings a transport may speak: both carry the same tagged union."""


class Door(Protocol):
    """What the gateway drives: the runtime's public operations (given by the runtime)."""

    @property
    def memory(self) -> Any:
        """The runtime's memory (``rt.memory``)."""

    @property
    def runs(self) -> Any:
        """The runtime's runs (``rt.runs``)."""

    @property
    def journal(self) -> Any:
        """The runtime's journal handle (``rt.journal``)."""

    def start(
        self,
        plan: Plan,
        call_budget: int | None,
        max_parallel_steps: int,
        limits: Limits | None,
        /,
        *,
        step_timeout: float | None,
    ) -> RunHandle[ExecuteResult]:
        """Start a run; return its handle at once."""

    def resume_start(
        self,
        run_id: str,
        call_budget: int | None,
        answers: dict[str, str] | None,
        approve: bool,
        clarification: str | None,
        /,
    ) -> RunHandle[ExecuteResult | Outcome]:
        """Start resuming a run; return its handle at once."""

    def cancel(self, run_id: str) -> bool:
        """Cancel a run executing here, or end one no process executes (ADR 0075)."""


_PATH = re.compile(r"at `\$\.message\.?([^`]*)`|at `\$\.?([^`]*)`")


def protocol_failure(correlation: str, exc: ProtocolError) -> Failure:
    """Describe a message that did not decode, naming the field at fault (msgspec's path)."""
    found = _PATH.search(str(exc))
    field = next((g for g in found.groups() if g), None) if found else None
    return Failure(correlation=correlation, error="ProtocolError", message=str(exc), field=field)


def foreign(directory: Directory, address: str) -> bool:
    """Tell whether ``address`` names a mailbox registered through ``rt.protocol``."""
    return isinstance(directory.lookup(address), _Guarded)


def _entry(event: Event) -> JournalEntry:
    return JournalEntry(
        position=event.position, stream=event.stream, version=event.version, data=event.data
    )


class Gateway(pykka.ThreadingActor):
    """Answer foreign requests by address and correlation id; see the module docstring."""

    def __init__(self, door: Door, writer: Any, directory: Directory) -> None:
        super().__init__()
        self._door = door
        self._writer = writer
        self._directory = directory
        self._starts: OrderedDict[tuple[str, str], tuple[str, Future[Any]]] = OrderedDict()
        """Recent starts by (reply_to, correlation): a resent start is answered, not re-run."""

    def on_receive(self, message: object) -> object:
        """Answer one request; any error becomes a ``reply.failure`` to the asker."""
        if not isinstance(message, GatewayRequest):
            # Nobody to answer: a reply or an internal message sent here by mistake.
            log.warning("gateway dropped %s: not a gateway request", type(message).__name__)
            return None
        if not foreign(self._directory, message.reply_to):
            # Answers go only to mailboxes registered through rt.protocol: a reply_to naming one
            # of our own actors (the writer, an executor) would feed it messages it never expects.
            log.warning(
                "gateway dropped %s: reply_to %r is not registered through rt.protocol",
                message_tag(type(message)),
                message.reply_to,
            )
            return None
        try:
            reply = self._answer(message)
        except Exception as exc:
            reply = self._failure(message, exc)
        if reply is not None:
            self._directory.tell(message.reply_to, reply)
        return None

    def _failure(self, request: GatewayRequest, exc: Exception) -> Failure:
        reply = failure(request.correlation, exc)
        if isinstance(exc, PlanRejected) and isinstance(request, StartRun):
            ids = [step.id for step in request.plan.steps]
            where = f"plan.steps[{ids.index(exc.step_id)}]" if exc.step_id in ids else "plan"
            reply = msgspec.structs.replace(reply, field=where)
        return reply

    def _answer(self, request: GatewayRequest) -> AnyMessage | None:
        door, corr = self._door, request.correlation
        match request:
            case RememberRequest():
                fields = {
                    f: getattr(request, f)
                    for f in request.__struct_fields__
                    if f not in ("reply_to", "correlation")
                }
                # The writer answers the asker itself, after the group commit (ADR 0015).
                self._writer.tell(Remember(**fields, reply_to=request.reply_to, correlation=corr))
                return None
            case GetFact(fact_id=fact_id):
                return FactReply(correlation=corr, fact=door.memory.get(fact_id))
            case SearchFacts() | SearchSemantic():
                search = (
                    door.memory.search
                    if isinstance(request, SearchFacts)
                    else door.memory.search_semantic
                )
                facts = search(
                    request.query,
                    scopes=request.scopes,
                    domains=request.domains,
                    min_confidence=request.min_confidence,
                    limit=request.limit,
                    now=request.now,
                )
                return FactsReply(correlation=corr, facts=list(facts))
            case DeleteFact(fact_id=fact_id):
                return DeletedReply(correlation=corr, deletion=door.memory.delete(fact_id))
            case PurgeFact(fact_id=fact_id, reason=reason):
                return PurgedReply(correlation=corr, erased=door.memory.purge(fact_id, reason))
            case FactWhy(fact_id=fact_id):
                return ExplainedReply(correlation=corr, text=door.memory.why(fact_id))
            case FactHistory(fact_id=fact_id):
                events = [_entry(e) for e in door.memory.history(fact_id)]
                position = events[-1].position if events else 0
                return EventsReply(correlation=corr, events=events, position=position)
            case StartRun():
                key = (request.reply_to, corr)
                if key in self._starts:
                    self._follow(request, *self._starts[key])
                    return None
                handle = door.start(
                    request.plan,
                    request.call_budget,
                    request.max_parallel_steps,
                    request.limits,
                    step_timeout=request.step_timeout,
                )
                self._starts[key] = (handle.run_id, handle.future)
                if len(self._starts) > REMEMBERED_STARTS:
                    self._starts.popitem(last=False)
                self._follow(request, handle.run_id, handle.future)
                return None
            case ResumeRun():
                resumed = door.resume_start(
                    request.run_id,
                    request.call_budget,
                    request.answers,
                    request.approve,
                    request.clarification,
                )
                self._follow(request, resumed.run_id, resumed.future)
                return None
            case CancelRunRequest(run_id=run_id):
                return RunCancelledReply(correlation=corr, cancelled=door.cancel(run_id))
            case RunAt(run_id=run_id, position=position):
                result = (
                    door.runs.current(run_id)
                    if position is None
                    else door.runs.at(run_id, position)
                )
                return RunStateReply(correlation=corr, result=result)
            case RunWhy(run_id=run_id):
                return ExplainedReply(correlation=corr, text=door.runs.why(run_id))
            case ListRuns():
                return RunIdsReply(correlation=corr, run_ids=door.runs.ids())
            case JournalPosition():
                return PositionReply(correlation=corr, position=door.journal.position())
            case ReadJournal(after=after, limit=limit):
                return self._page(corr, after, limit)
        raise ProtocolError(f"{type(request).__name__} is not a request the gateway answers")

    def _page(self, corr: str, after: int, limit: int) -> EventsReply:
        if after < 0:
            raise _field_error("after", f"must be a journal position >= 0, got {after}")
        if not 1 <= limit <= MAX_PAGE:
            raise _field_error("limit", f"must be between 1 and {MAX_PAGE}, got {limit}")
        upto = min(after + limit, self._door.journal.position())
        if upto <= after:
            return EventsReply(correlation=corr, events=[], position=after)
        events = [_entry(e) for e in self._door.journal.read(after=after, upto=upto)]
        return EventsReply(correlation=corr, events=events, position=upto)

    def _follow(self, request: GatewayRequest, run_id: str, future: Future[Any]) -> None:
        """Answer the run id now and the result when the run stops, in that order."""
        reply_to, corr, directory = request.reply_to, request.correlation, self._directory
        directory.tell(reply_to, RunStartedReply(correlation=corr, run_id=run_id))

        def ended(done: Future[Any]) -> None:
            answer: AnyMessage
            try:
                result = done.result()
            except Exception as exc:
                answer = failure(corr, exc)
            else:
                answer = (
                    RunEnded(correlation=corr, result=result)
                    if isinstance(result, ExecuteResult)
                    else OrchestrationEnded(correlation=corr, outcome=result)
                )
            directory.tell(reply_to, answer)

        # Completed from the run's own thread, or at once here if the run already stopped.
        future.add_done_callback(ended)


class _ReplyAddress(msgspec.Struct):
    reply_to: Any = None
    correlation: Any = None


class _Addressed(msgspec.Struct):
    """The one part of an envelope a failure reply needs; every other field is skipped unread."""

    message: _ReplyAddress | None = None


def _reply_address(data: bytes | str, wire: Wire) -> tuple[object, object, str | None] | None:
    """Return (reply_to, correlation, the field holding a lone surrogate or None) of a request
    that does not decode, or None.

    MessagePack: decoded for those two fields alone (the rest is skipped, not validated).
    JSON: read by the standard library, which takes a lone surrogate escape that msgspec
    refuses; bytes of invalid UTF-8 are replaced first.
    """
    try:
        if isinstance(data, str) or wire == "json":
            text = data if isinstance(data, str) else data.decode("utf-8", "replace")
            raw = json.loads(text)
            message = raw.get("message") if isinstance(raw, dict) else None
            if not isinstance(message, dict):
                return None
            bad = next((k for k, v in message.items() if _unencodable(v)), None)
            return message.get("reply_to"), message.get("correlation"), bad
        envelope = msgspec.msgpack.decode(data, type=_Addressed)
    except (ValueError, TypeError, RecursionError, msgspec.DecodeError):
        return None
    if envelope.message is None:
        return None
    return envelope.message.reply_to, envelope.message.correlation, None


def _unencodable(value: object, depth: int = 0) -> bool:
    """Tell whether a JSON value holds a string UTF-8 cannot encode (a lone surrogate)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if depth > 64:
        return False
    if isinstance(value, dict):
        return any(
            _unencodable(k, depth + 1) or _unencodable(v, depth + 1) for k, v in value.items()
        )
    if isinstance(value, list):
        return any(_unencodable(v, depth + 1) for v in value)
    return False


def _field_error(field: str, text: str) -> ProtocolError:
    """Return a ProtocolError naming the request field whose value is out of range."""
    error = ProtocolError(f"{field} {text}")
    error.field = field  # type: ignore[attr-defined]
    return error


class _Guarded:
    """A foreign mailbox whose errors are logged and dropped, never raised into our actors.

    Replies are told from the gateway's, the memory writer's and the executors' threads: a
    transport that fails (a closed pipe) must not stop any of them. The reply is lost, as one
    to an address nobody holds (at most once).
    """

    def __init__(self, address: str, mailbox: Mailbox) -> None:
        self.address = address
        self.mailbox = mailbox

    def tell(self, message: Any) -> None:
        """Hand the message on; log and drop it if the foreign side fails."""
        try:
            self.mailbox.tell(message)
        except pykka.ActorDeadError:
            raise  # the directory frees the address of a stopped actor
        except Exception:
            log.exception("reply to %s dropped: its mailbox failed", self.address)


class _BytesMailbox:
    """A mailbox that hands each message, encoded in an envelope, to a transport's function."""

    def __init__(self, address: str, send: Callable[[bytes], Any], wire: Wire) -> None:
        self.address = address
        self._send = send
        self._encode = encode_msgpack if wire == "msgpack" else encode_json

    def tell(self, message: Any) -> None:
        """Encode the message addressed to this mailbox and hand it to the transport.

        A reply that cannot be encoded (a value stored before its shape was checked) is
        answered by a ``reply.failure`` with its correlation, naming why: dropped, it would
        leave its asker waiting for ever.
        """
        try:
            data = self._encode(Envelope(to=self.address, message=message))
        except ProtocolError as exc:
            correlation = getattr(message, "correlation", None)
            if not isinstance(correlation, str) or isinstance(message, Failure):
                raise
            log.warning("reply to %s could not be encoded: %s", self.address, exc)
            answer = Failure(
                correlation=correlation,
                error="ProtocolError",
                message=f"the reply could not be sent: {exc}",
            )
            data = self._encode(Envelope(to=self.address, message=answer))
        self._send(data)


class ProtocolDoor:
    """``rt.protocol``: how a foreign system registers reply mailboxes and sends requests (A4).

    Raises from every method are :class:`ProtocolError` for data that is not a message of the
    protocol; an error in serving a well-formed request is a ``reply.failure`` to its asker.
    """

    def __init__(self, door: Door, writer: Any, directory: Directory) -> None:
        self._directory = directory
        self.address = directory.address(GATEWAY)
        """The gateway's address: where every request goes."""
        self._gateway = Gateway.start(door, writer, directory)
        directory.register(self.address, self._gateway)

    def register(self, address: str, mailbox: Mailbox) -> None:
        """Give a foreign mailbox (anything with ``tell(message)``) an address for replies.

        Raises:
            ValueError: the address is taken.
        """
        self._directory.register(address, _Guarded(address, mailbox))

    def register_bytes(
        self, address: str, send: Callable[[bytes], Any], wire: Wire = "msgpack"
    ) -> None:
        """Give a transport an address: ``send(data)`` gets each reply as an encoded envelope.

        Raises:
            ValueError: the address is taken, or ``wire`` is neither msgpack nor json.
        """
        if wire not in ("msgpack", "json"):
            raise ValueError(f"wire must be 'msgpack' or 'json', got {wire!r}")
        self._directory.register(address, _Guarded(address, _BytesMailbox(address, send, wire)))

    def unregister(self, address: str) -> None:
        """Free an address registered here: replies to it are dropped from now on."""
        box = self._directory.lookup(address)
        if isinstance(box, _Guarded):
            self._directory.unregister(address, box)

    def send(self, message: GatewayRequest) -> None:
        """Send a request to the gateway, checked as if it had come over the wire.

        A request whose fields do not decode is answered by a ``reply.failure`` naming the field.

        Raises:
            ProtocolError: it is not a gateway request, or it cannot be encoded at all.
        """
        if not isinstance(message, GatewayRequest):
            raise ProtocolError(
                f"{type(message).__name__} is not a gateway request: see docs/protocol.md"
            )
        try:
            checked = decode_msgpack(encode_msgpack(message))
        except ProtocolError as exc:
            if isinstance(message.reply_to, str) and isinstance(message.correlation, str):
                if foreign(self._directory, message.reply_to):
                    self._directory.tell(
                        message.reply_to, protocol_failure(message.correlation, exc)
                    )
                return
            raise
        self._gateway.tell(checked)

    def deliver(self, data: bytes | str, wire: Wire = "msgpack") -> bool:
        """Decode an envelope from a transport and route its message to its address.

        Only the gateway and mailboxes registered through this door can be addressed: the
        runtime's internal actors are not reachable from outside (ADR 0030).

        Returns:
            False when the address was freed meanwhile (the message is dropped).

        Raises:
            ProtocolError: the data is not an envelope of the protocol (bad bytes, unknown tag,
                a field of the wrong type), or it is addressed elsewhere than the gateway or a
                registered mailbox, or it brings the gateway something other than a request.
                When undecodable data still names ``reply_to`` and ``correlation``, the asker
                is also told a ``reply.failure`` naming the field.
        """
        if wire not in ("msgpack", "json"):
            raise ValueError(f"wire must be 'msgpack' or 'json', got {wire!r}")
        try:
            if wire == "msgpack":
                if not isinstance(data, bytes):
                    raise ProtocolError(f"msgpack data must be bytes, got {type(data).__name__}")
                envelope = decode_envelope_msgpack(data)
            else:
                envelope = decode_envelope_json(data)
        except ProtocolError as exc:
            self._answer_malformed(data, wire, exc)
            raise
        if not self._public(envelope.to):
            raise ProtocolError(
                f"{envelope.to!r} is not an address of the protocol: send requests to "
                f"{self.address!r} (or to an address registered through rt.protocol)"
            )
        if envelope.to == self.address and not isinstance(envelope.message, GatewayRequest):
            raise ProtocolError(
                f"the gateway answers requests only, not {type(envelope.message).__name__}: "
                "see docs/protocol.md"
            )
        return self._directory.tell(envelope.to, envelope.message)

    def _public(self, address: str) -> bool:
        """Tell whether a transport may address ``address``: the gateway or a foreign mailbox."""
        return address == self.address or foreign(self._directory, address)

    def _answer_malformed(self, data: bytes | str, wire: Wire, exc: ProtocolError) -> None:
        """Tell the asker of a request that could not be read why, when its address can be:
        read leniently (a string of invalid UTF-8, a lone surrogate, elsewhere in the message
        must not leave the asker waiting for nothing, A4)."""
        address = _reply_address(data, wire)
        if address is None:
            return
        reply_to, corr, bad = address
        if (
            isinstance(reply_to, str)
            and isinstance(corr, str)
            and foreign(self._directory, reply_to)
        ):
            reply = protocol_failure(corr, exc)
            if bad is not None and reply.field is None:
                reply = msgspec.structs.replace(
                    reply,
                    field=bad,
                    message=f"{bad} holds text that is not valid Unicode (a lone surrogate)",
                )
            self._directory.tell(reply_to, reply)

    def close(self) -> None:
        """Stop the gateway: requests sent from now on are dropped."""
        self._directory.unregister(self.address, self._gateway)
        self._gateway.stop(block=False).get(timeout=STOP_TIMEOUT)
