"""The gateway's requests and replies: how another actor system drives a runtime (A4, ADR 0030).

Every request names its asker's address (``reply_to``) and a ``correlation`` id of the asker's
choosing; every answer is a tagged reply repeating that id, told to that address — or a
``reply.failure`` naming the error, its text and the field at fault. A run start is answered twice:
at once by ``gateway.run-started`` (the run id), and by ``run.ended`` (the result) when the run
stops, so a foreign actor never blocks on a run.
"""

from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING

import msgspec

from journaled.events.base import DomainEvent
from journaled.events.catalog import STORED_EVENTS
from journaled.events.memory import Fact
from journaled.events.messages import Deletion, Message
from journaled.events.orchestration import Outcome
from journaled.events.plans import ExecuteResult, Limits, Plan

if TYPE_CHECKING:
    StoredEvent = DomainEvent
else:
    # Every stored event type by its tag, so a journal page decodes to what was stored.
    StoredEvent = functools.reduce(operator.or_, STORED_EVENTS)


class GatewayRequest(Message, frozen=True, kw_only=True):
    """Base of every request to a runtime's gateway: who asks, and the id its answer repeats."""

    reply_to: str
    """The asker's address: every answer to this request is told there."""
    correlation: str
    """Chosen by the asker; repeated by each answer (idempotency key for its own bookkeeping)."""


class GatewayReply(Message, frozen=True, kw_only=True):
    """Base of the gateway's own replies (``memory.remembered``, ``run.ended`` and
    ``reply.failure`` are reused from the memory and run protocols)."""

    correlation: str


class JournalEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One journal event as it crosses the wire: its global position, stream and version."""

    position: int
    stream: str
    version: int
    data: StoredEvent
    """The event itself, with its tag in ``type``."""


# -- memory ---------------------------------------------------------------------------------------


class RememberRequest(GatewayRequest, frozen=True, kw_only=True, tag="gateway.remember"):
    """Store a fact (M2, M3); answered by ``memory.remembered`` once it is committed."""

    text: str
    scope: str = "project"
    domain: str | None = None
    confidence: float | None = None
    conflict_key: str | None = None
    source: str | None = None
    valid_from: int | None = None
    valid_until: int | None = None


class GetFact(GatewayRequest, frozen=True, kw_only=True, tag="gateway.get"):
    """Read one fact (M4); answered by ``gateway.fact``."""

    fact_id: str


class SearchFacts(GatewayRequest, frozen=True, kw_only=True, tag="gateway.search"):
    """Search by BM25 (M5, M6); answered by ``gateway.facts``."""

    query: str
    scopes: list[str] | None = None
    domains: list[str] | None = None
    min_confidence: float = 0.0
    limit: int = 10
    now: int | None = None


class SearchSemantic(GatewayRequest, frozen=True, kw_only=True, tag="gateway.search-semantic"):
    """Search by embeddings, falling back to BM25 (M7); answered by ``gateway.facts``."""

    query: str
    scopes: list[str] | None = None
    domains: list[str] | None = None
    min_confidence: float = 0.0
    limit: int = 10
    now: int | None = None


class DeleteFact(GatewayRequest, frozen=True, kw_only=True, tag="gateway.delete"):
    """Delete a fact (M8); answered by ``gateway.deleted``."""

    fact_id: str


class PurgeFact(GatewayRequest, frozen=True, kw_only=True, tag="gateway.purge"):
    """Delete a fact and erase its text (M10); answered by ``gateway.purged``."""

    fact_id: str
    reason: str | None = None


class FactWhy(GatewayRequest, frozen=True, kw_only=True, tag="gateway.why"):
    """Explain a fact's life (M11); answered by ``gateway.explained``."""

    fact_id: str


class FactHistory(GatewayRequest, frozen=True, kw_only=True, tag="gateway.history"):
    """Read a fact's events (M11); answered by ``gateway.events``."""

    fact_id: str


# -- runs -----------------------------------------------------------------------------------------


class StartRun(GatewayRequest, frozen=True, kw_only=True, tag="gateway.run-start"):
    """Execute a plan (E1-E13): ``gateway.run-started`` at once, ``run.ended`` when it stops."""

    plan: Plan
    call_budget: int | None = None
    max_parallel_steps: int = 2
    limits: Limits | None = None
    step_timeout: float | None = None


class ResumeRun(GatewayRequest, frozen=True, kw_only=True, tag="gateway.run-resume"):
    """Resume a run (E14, O3, O4): ``gateway.run-started`` at once, then ``run.ended`` (or
    ``gateway.orchestration-ended`` for an orchestration) when it stops."""

    run_id: str
    answers: dict[str, str] | None = None
    call_budget: int | None = None
    approve: bool = False
    clarification: str | None = None


class CancelRunRequest(GatewayRequest, frozen=True, kw_only=True, tag="gateway.run-cancel"):
    """Ask a run executing in this runtime to stop scheduling, or end one at rest (E5, ADR 0075);
    ``gateway.run-cancelled``."""

    run_id: str


class RunAt(GatewayRequest, frozen=True, kw_only=True, tag="gateway.run-at"):
    """Read a run now, or as it was at a journal position (O7); ``gateway.run-state``."""

    run_id: str
    position: int | None = None


class RunWhy(GatewayRequest, frozen=True, kw_only=True, tag="gateway.run-why"):
    """Explain a run's state from its events (O6); answered by ``gateway.explained``."""

    run_id: str


class ListRuns(GatewayRequest, frozen=True, kw_only=True, tag="gateway.run-list"):
    """List every run and orchestration id, oldest first; answered by ``gateway.run-ids``."""


# -- journal --------------------------------------------------------------------------------------


class JournalPosition(GatewayRequest, frozen=True, kw_only=True, tag="gateway.journal-position"):
    """Read the global position of the last event (J1); answered by ``gateway.position``."""


class ReadJournal(GatewayRequest, frozen=True, kw_only=True, tag="gateway.journal-read"):
    """Read one page of the journal after a position (J1); answered by ``gateway.events``."""

    after: int = 0
    limit: int = 100
    """At most this many positions (1 to 1000) are read; ask again from the reply's position."""


# -- replies --------------------------------------------------------------------------------------


class FactReply(GatewayReply, frozen=True, kw_only=True, tag="gateway.fact"):
    """The fact asked for, or None when there is none."""

    fact: Fact | None


class FactsReply(GatewayReply, frozen=True, kw_only=True, tag="gateway.facts"):
    """Search hits, best first."""

    facts: list[Fact]


class DeletedReply(GatewayReply, frozen=True, kw_only=True, tag="gateway.deleted"):
    """What a delete did."""

    deletion: Deletion


class PurgedReply(GatewayReply, frozen=True, kw_only=True, tag="gateway.purged"):
    """Whether a text was erased (False for an unknown or already purged fact)."""

    erased: bool


class ExplainedReply(GatewayReply, frozen=True, kw_only=True, tag="gateway.explained"):
    """An explanation in plain words, from events alone."""

    text: str


class EventsReply(GatewayReply, frozen=True, kw_only=True, tag="gateway.events"):
    """Journal events in order, and the position read up to (the next page starts after it)."""

    events: list[JournalEntry]
    position: int


class RunStartedReply(GatewayReply, frozen=True, kw_only=True, tag="gateway.run-started"):
    """The run is executing under this id; its ``run.ended`` follows when it stops."""

    run_id: str


class RunCancelledReply(GatewayReply, frozen=True, kw_only=True, tag="gateway.run-cancelled"):
    """Whether the run was executing here and was told to stop."""

    cancelled: bool


class RunStateReply(GatewayReply, frozen=True, kw_only=True, tag="gateway.run-state"):
    """A run as the journal held it at the position asked (now, when none was given)."""

    result: ExecuteResult


class RunIdsReply(GatewayReply, frozen=True, kw_only=True, tag="gateway.run-ids"):
    """Every run and orchestration id in the journal, oldest first."""

    run_ids: list[str]


class PositionReply(GatewayReply, frozen=True, kw_only=True, tag="gateway.position"):
    """The global position of the journal's last event."""

    position: int


class OrchestrationEnded(
    GatewayReply, frozen=True, kw_only=True, tag="gateway.orchestration-ended"
):
    """A resumed orchestration stopped: its outcome."""

    outcome: Outcome
