"""The tenant boundary: which facts of a shared journal belong to another organization (R1).

A journal may be shared by runtimes of several organizations. The ``user``, ``project`` and
``repository`` scopes are shared by all of them; the ``organization`` scope of each is its own.
A fact remembered into another organization's scope — or into any organization's scope, seen by
a runtime with no organization — must behave as unknown: no read, audit, log view or command of
this runtime may show or touch it (ADR 0017).

Runs are an organization's own in the same way: a run (or orchestration) records the
organization of the runtime that started it, and to a runtime of any other organization — or of
none, for a run of one — it is unknown, its events included: its inputs and outputs may hold
what its steps read from the organization's scope (ADR 0074).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable
from typing import Generic, TypeVar

import msgspec
from msgspec import UNSET

from journaled.events.base import DomainEvent, Event
from journaled.events.memory import (
    MEMORY_EVENTS,
    FactRelinked,
    FactRemembered,
    FactSuperseded,
    physical_scope,
)
from journaled.events.orchestration import ORCHESTRATION_EVENTS, OrchestrationStarted
from journaled.events.runs import RUN_EVENTS, MemoryRead, RunForked, RunStarted

__all__ = [
    "FACT_OWNERS_KEPT",
    "RUN_OWNERS_KEPT",
    "Boundary",
    "belongs_elsewhere",
    "home_scope",
    "run_belongs_elsewhere",
    "run_organization",
]

_RUN_KINDS = (*RUN_EVENTS, *ORCHESTRATION_EVENTS)
"""The events of a run's or an orchestration's stream."""
_NOT_A_RUN = object()
_V = TypeVar("_V")
_D = TypeVar("_D")

RUN_OWNERS_KEPT = 10_000
"""How many runs' owners a :class:`Boundary` keeps in memory, the runs last used (ADR 0093).

A long-lived runtime sees runs without end; a run left out is read again, with one
``first()``, when next checked, so the bound costs reads, never a wrong answer. Ten thousand
entries are one or two MB, and exceed a subscription's page (500 events) twenty times over."""

FACT_OWNERS_KEPT = 10_000
"""How many facts' owners (another organization's or not) a :class:`Boundary` keeps in
memory, the facts last used (ADR 0093).

A fact left out is read again, with one ``first()`` (or in a page's one ``firsts()``), when
next checked; a check decides from what it read itself, never from the cache after filling it,
so the bound costs reads, never a wrong answer."""


def belongs_elsewhere(remembered: FactRemembered, organization: str | None) -> bool:
    """Tell whether a remembered fact is another organization's, seen from ``organization``."""
    if physical_scope(remembered.scope) != "organization":
        return False
    return organization is None or remembered.organization != organization


def home_scope(
    remembered: FactRemembered, scopes: Container[str], organization: str | None
) -> str | None:
    """Return the physical scope a view of ``scopes`` seen from ``organization`` keeps a
    remembered fact in, or None when the fact is outside it (another organization's, or a
    scope the view does not hold): the one routing rule of memory's writer and every fold."""
    physical = physical_scope(remembered.scope)
    if physical not in scopes or belongs_elsewhere(remembered, organization):
        return None
    return physical


def run_organization(data: DomainEvent) -> object:
    """Return the organization a run's first event records (None: none; ``msgspec.UNSET``: a
    run of an earlier release, which recorded none), or a sentinel of its own when ``data``
    opens no run."""
    match data:
        case RunStarted():
            return data.organization
        case RunForked():
            return data.started.organization
        case OrchestrationStarted():
            return data.organization
    return _NOT_A_RUN


def run_belongs_elsewhere(owner: object, organization: str | None) -> bool:
    """Tell whether a run recorded as ``owner``'s (:func:`run_organization`) is another
    organization's, seen from ``organization``. A run of an earlier release is everyone's."""
    return owner is not UNSET and owner is not _NOT_A_RUN and owner != organization


class _Recent(Generic[_V]):
    """The ``size`` entries of a mapping last read or written; its owner holds the lock."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, _V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def get(self, key: str, default: _D) -> _V | _D:
        """Return the entry of ``key``, now the last used, or ``default`` when not kept."""
        try:
            value = self._items[key]
        except KeyError:
            return default
        self._items.move_to_end(key)
        return value

    def put(self, key: str, value: _V) -> None:
        """Keep ``value`` for ``key`` as the last used, leaving out the least recently used."""
        self._items[key] = value
        self._items.move_to_end(key)
        if len(self._items) > self.size:
            self._items.popitem(last=False)


class Boundary:
    """Sort journal events into this organization's view and what it must not see (R1).

    A fact's owner is read from the event that remembered it, the first of its stream; a run's
    from its first event. Neither ever changes, so each is kept for the facts
    (:data:`FACT_OWNERS_KEPT`) and runs (:data:`RUN_OWNERS_KEPT`) last used, and read from the
    journal again when not kept (ADR 0093). Every check decides from the answers it found or
    read itself, so an entry let go in between by another thread changes nothing. Thread-safe.
    """

    def __init__(
        self,
        organization: str | None,
        first: Callable[[str], Event | None],
        firsts: Callable[[list[str]], dict[str, Event]] | None = None,
    ) -> None:
        self.organization = organization
        self._first = first
        self._firsts = firsts
        """The first events of many streams in one read, to sort many fact ids at once."""
        self._elsewhere: _Recent[bool] = _Recent(FACT_OWNERS_KEPT)
        """Fact id -> whether it is another organization's, for the facts last used: one not
        kept is read from its first event again (ADR 0093). Unknown ids are not kept."""
        self._runs: _Recent[object] = _Recent(RUN_OWNERS_KEPT)
        """Run id -> its owner (:func:`run_organization`; a run's owner never changes), for the
        runs last used: one not kept is read from its first event again (ADR 0093)."""
        self._lock = threading.Lock()

    def fact_elsewhere(self, fact_id: str) -> bool:
        """Tell whether a fact id names another organization's fact (unknown ids: False)."""
        with self._lock:
            known = self._elsewhere.get(fact_id, None)
        if known is not None:
            return known
        first = self._first(fact_id)
        return first is not None and self._learn_fact(fact_id, first)

    def _learn_fact(self, fact_id: str, first: Event) -> bool:
        """Return whether a fact is elsewhere from its first event, just read, keeping the
        answer for reuse; a stream that opens with no remembered fact is unknown: not kept."""
        data = first.data
        if not isinstance(data, FactRemembered):
            return False
        elsewhere = belongs_elsewhere(data, self.organization)
        with self._lock:
            self._elsewhere.put(fact_id, elsewhere)
        return elsewhere

    def run_elsewhere(self, run_id: str) -> bool:
        """Tell whether a run id names another organization's run or orchestration (ADR 0074).

        An unknown id, or a stream that is no run's, is not elsewhere: it is unknown anyway.
        """
        return run_belongs_elsewhere(self.run_owner(run_id), self.organization)

    def run_owner(self, run_id: str) -> object:
        """Return whose a run is (:func:`run_organization`: ``msgspec.UNSET`` for a run of an
        earlier release), read once per run; a sentinel of its own for an id that is no run's."""
        with self._lock:
            owner = self._runs.get(run_id, _NOT_A_RUN)
        if owner is not _NOT_A_RUN:
            return owner
        first = self._first(run_id)
        return self._learn_owner(first) if first is not None else _NOT_A_RUN

    def note_run(self, run_id: str, owner: object) -> bool:
        """Learn whose a run is from its opening, folded elsewhere (no first event read);
        return whether it is elsewhere."""
        with self._lock:
            self._runs.put(run_id, owner)
        return run_belongs_elsewhere(owner, self.organization)

    def learn_run(self, first: Event) -> bool:
        """Learn whose a run is from its first event, just read; return whether it is elsewhere."""
        return run_belongs_elsewhere(self._learn_owner(first), self.organization)

    def _learn_owner(self, first: Event) -> object:
        """Return whose a run is from its first event, just read, and keep it."""
        owner = run_organization(first.data)
        if owner is not _NOT_A_RUN:
            with self._lock:
                self._runs.put(first.stream, owner)
        return owner

    def hides(self, event: Event) -> bool:
        """Tell whether an event is about another organization's fact (a key claim included)
        or belongs to another organization's run."""
        data = event.data
        if isinstance(data, _RUN_KINDS):
            if event.version == 1:
                return self.learn_run(event)
            return self.run_elsewhere(event.stream)
        if isinstance(data, FactRemembered):
            elsewhere = belongs_elsewhere(data, self.organization)
            with self._lock:
                self._elsewhere.put(data.fact_id, elsewhere)
            return elsewhere
        if not isinstance(data, MEMORY_EVENTS):
            return False
        fact_id = getattr(data, "fact_id", None)
        return isinstance(fact_id, str) and self.fact_elsewhere(fact_id)

    def visible(self, events: Iterable[Event]) -> list[Event]:
        """Return the events this organization may see, in their order, with the reads of run
        steps naming none of another organization's facts (:meth:`scrub_reads`) and the links
        to them saying nothing but their ids (:meth:`scrub_links`)."""
        events = list(events)
        owners = self._run_owners(events)
        shown = [
            e
            for e in events
            if not (
                run_belongs_elsewhere(owners[e.stream], self.organization)
                if isinstance(e.data, _RUN_KINDS)
                else self.hides(e)
            )
        ]
        return self.scrub_links(self.scrub_reads(shown))

    def scrub_links(self, events: list[Event]) -> list[Event]:
        """Return ``events`` with the expiry of another organization's fact left out where a
        fact of this one's view is superseded by it or re-linked to it: the audit names such a
        superseder by its id alone (R1, ADR 0017); and with the step left out of a fact's
        provenance where another organization's run remembered it: the run is named by its id
        alone, its step being a name from that organization's plan (ADR 0074). Every other event
        is returned as it is."""
        events = self._scrub_provenance(events)
        links = {
            e.data.by if isinstance(e.data, FactSuperseded) else e.data.to
            for e in events
            if (isinstance(e.data, FactSuperseded) and e.data.by_valid_until is not None)
            or (isinstance(e.data, FactRelinked) and e.data.to_valid_until is not None)
        }
        if not links:
            return events
        elsewhere = self._elsewhere_among(links)
        if not elsewhere:
            return events
        out = []
        for event in events:
            data = event.data
            if isinstance(data, FactSuperseded) and data.by in elsewhere:
                data = msgspec.structs.replace(data, by_valid_until=None)
            elif isinstance(data, FactRelinked) and data.to in elsewhere:
                data = msgspec.structs.replace(data, to_valid_until=None)
            out.append(event if data is event.data else msgspec.structs.replace(event, data=data))
        return out

    def _scrub_provenance(self, events: list[Event]) -> list[Event]:
        """Return ``events`` with ``step_id`` left out of each fact remembered by a step of
        another organization's run (a shared fact: its text is everyone's, its plan is not)."""
        runs = {
            e.data.run_id
            for e in events
            if isinstance(e.data, FactRemembered)
            and e.data.run_id is not None
            and e.data.step_id is not None
        }
        if not runs:
            return events
        elsewhere = {
            run_id
            for run_id in runs
            if run_belongs_elsewhere(self.run_owner(run_id), self.organization)
        }
        if not elsewhere:
            return events
        return [
            msgspec.structs.replace(e, data=msgspec.structs.replace(e.data, step_id=None))
            if isinstance(e.data, FactRemembered) and e.data.run_id in elsewhere
            else e
            for e in events
        ]

    def _run_owners(self, events: list[Event]) -> dict[str, object]:
        """Return whose each run with events here is: from its first event when here, else
        as kept, else read, all in one ``firsts()`` when the journal offers it. The answer
        holds for the whole batch, however many runs it has beyond those kept (ADR 0093)."""
        streams = {e.stream for e in events if isinstance(e.data, _RUN_KINDS)}
        owners = {e.stream: self._learn_owner(e) for e in events if e.version == 1}
        missing = []
        with self._lock:
            for stream in streams - owners.keys():
                owner = self._runs.get(stream, _NOT_A_RUN)
                if owner is _NOT_A_RUN:
                    missing.append(stream)
                else:
                    owners[stream] = owner
        if missing and self._firsts is not None:
            firsts = self._firsts(sorted(missing))
            owners.update((run_id, self._learn_owner(first)) for run_id, first in firsts.items())
        elif missing:
            owners.update((run_id, self.run_owner(run_id)) for run_id in missing)
        return {stream: owners.get(stream, _NOT_A_RUN) for stream in streams}

    def scrub_reads(self, events: list[Event]) -> list[Event]:
        """Return ``events`` with another organization's fact ids left out of every
        ``run.memory-read``: a step of that organization read them, and to this one such an id
        behaves as unknown (R1). Every other event is returned as it is."""
        reads = [e for e in events if isinstance(e.data, MemoryRead) and e.data.fact_ids]
        if not reads:
            return events
        ids = {i for e in reads for i in e.data.fact_ids}  # type: ignore[attr-defined]
        elsewhere = self._elsewhere_among(ids)
        if not elsewhere:
            return events
        out = []
        for event in events:
            data = event.data
            if isinstance(data, MemoryRead) and not elsewhere.isdisjoint(data.fact_ids):
                kept = tuple(i for i in data.fact_ids if i not in elsewhere)
                data = msgspec.structs.replace(data, fact_ids=kept)
                out.append(msgspec.structs.replace(event, data=data))
            else:
                out.append(event)
        return out

    def _elsewhere_among(self, fact_ids: set[str]) -> set[str]:
        """Return which of these fact ids name another organization's fact: as kept, else
        from their first events, read in one ``firsts()`` when the journal offers it.

        The answer is built from what was found and read here, never by looking the cache up
        again after filling it: with the cache bounded, another thread may have let an entry go
        in between, and a missing entry must never read as "not elsewhere" (ADR 0093).
        """
        elsewhere: set[str] = set()
        unknown = []
        with self._lock:
            for fact_id in fact_ids:
                known = self._elsewhere.get(fact_id, None)
                if known is None:
                    unknown.append(fact_id)
                elif known:
                    elsewhere.add(fact_id)
        if not unknown:
            return elsewhere
        if self._firsts is None:
            elsewhere.update(i for i in unknown if self.fact_elsewhere(i))
            return elsewhere
        found = self._firsts(unknown)
        elsewhere.update(i for i, first in found.items() if self._learn_fact(i, first))
        return elsewhere
