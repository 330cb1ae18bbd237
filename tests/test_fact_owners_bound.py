"""A boundary keeps the owners of the facts it last used only (R1, ADR 0017, ADR 0093): over
any number of facts of two organizations its cache stays within its bound, and a fact of acme
the cache let go, or never kept, is still hidden from another organization, or from none, in
every read the boundary guards, and still acme's own to read.

The reads are those :meth:`Boundary.scrub_reads` and :meth:`Boundary.scrub_links` serve: the
log (``rt.journal.read``), subscriptions, a run's history and why (the ``run.memory-read`` of a
run of an earlier release, which every runtime sees), and a shared fact's history and why (the
expiry of acme's fact that superseded it or that it was re-linked to). Real SQLite files, real
runtimes of both organizations, real threads; every wait is bounded.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import msgspec
import pytest

import journaled
from journaled import Deletion, Plan, Step
from journaled.actors.runs import Runs
from journaled.events import tenancy
from journaled.events.base import Event
from journaled.events.memory import FactRelinked, FactRemembered, FactSuperseded
from journaled.events.runs import MemoryRead
from journaled.events.tenancy import FACT_OWNERS_KEPT, Boundary
from journaled.testing import ManualClock

KEPT = 2
"""The bound most tests set: smaller than every batch of ids a scrub sorts at once."""
FACTS = 6
"""Acme's organization facts, each superseding a shared fact: three times ``KEPT``."""
ORGS = ["other", None]
WAIT = 10.0
SECRET = "acme will acquire globex in march"
EXPIRY_OFFSET = 987_654_321
"""How long after the clock's start acme's facts expire: a value no other field has."""


@dataclass(frozen=True)
class Acme:
    """What acme stored in one journal: its own facts, the shared facts they superseded (by
    conflict key), a shared fact re-linked to one of them, and a run of an earlier release
    that read them all."""

    private: tuple[str, ...]
    """Acme's organization-scope facts, the superseders of ``shared``, in order."""
    shared: tuple[str, ...]
    """The shared facts, each superseded by the acme fact of the same index."""
    expires: tuple[int, ...]
    """When each of ``private`` expires."""
    relinked: str
    """A shared fact re-linked to ``head`` when the fact between them was deleted (M8)."""
    head: str
    """Acme's fact ``relinked`` is re-linked to."""
    head_expires: int
    plain: str
    """A current shared fact the run read too."""
    run: str
    """A run that recorded no organization (an earlier release's): everyone sees it."""

    @property
    def hidden(self) -> set[str]:
        return {*self.private, self.head}

    @property
    def expiries(self) -> set[int]:
        return {*self.expires, self.head_expires}


@pytest.fixture
def small_bound(monkeypatch: pytest.MonkeyPatch) -> int:
    """Make every boundary opened from here on keep the owners of ``KEPT`` facts."""
    monkeypatch.setattr(tenancy, "FACT_OWNERS_KEPT", KEPT)
    return KEPT


def _acme(url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> Acme:
    """Store acme's facts, links and a run of an earlier release reading them."""
    with journaled.open(url, organization="acme", clock=clock) as acme:
        private, shared, expires = [], [], []
        for n in range(FACTS):
            key = f"acme-key-{n}"
            old = acme.memory.remember(f"the shared value {n}", conflict_key=key)
            until = clock.now + EXPIRY_OFFSET + n
            mine = acme.memory.remember(
                f"{SECRET} {n}", scope="organization", conflict_key=key, valid_until=until
            )
            assert mine.supersedes == (old.id,)
            private.append(mine.id)
            shared.append(old.id)
            expires.append(until)
        first = acme.memory.remember("the launch is in may", conflict_key="relink")
        middle = acme.memory.remember("the launch is in june", conflict_key="relink")
        head_expires = clock.now + EXPIRY_OFFSET + FACTS
        head = acme.memory.remember(
            SECRET, scope="organization", conflict_key="relink", valid_until=head_expires
        )
        assert head.supersedes == (middle.id,)
        assert acme.memory.delete(middle.id) == Deletion(primary=True, relationships=2)
        plain = acme.memory.remember("deploys need a review")
        ids = [*private, head.id, plain.id]
        acme.register_tool("get", lambda ids, ctx: [ctx.memory.get(i).id for i in ids])
        with monkeypatch.context() as patch:
            # journaled as an earlier release did: with no organization recorded (ADR 0074)
            patch.setattr(Runs, "_organization", property(lambda _: msgspec.UNSET))
            done = acme.execute(Plan(goal="g", steps=[Step("a", tool="get", input=ids)]))
        assert done.ok, done.observations
    return Acme(
        private=tuple(private),
        shared=tuple(shared),
        expires=tuple(expires),
        relinked=first.id,
        head=head.id,
        head_expires=head_expires,
        plain=plain.id,
        run=done.run_id,
    )


def _own_facts(url: str, organization: str | None, count: int) -> list[str]:
    """Have a runtime of ``organization`` remember ``count`` facts of its own scope."""
    scope = "organization" if organization is not None else "project"
    with journaled.open(url, organization=organization) as rt:
        return [rt.memory.remember(f"our note {n}", scope=scope).id for n in range(count)]


def _boundaries(rt: journaled.Runtime) -> list[Boundary]:
    """Return the runtime's boundaries that sort facts: the log's (and its subscriptions'),
    memory's and the runs'."""
    assert rt.runs.boundary is not None
    return [rt.journal._boundary, rt.memory._boundary, rt.runs.boundary]


def _forget(rt: journaled.Runtime, acme: Acme, own: list[str]) -> None:
    """Make every boundary of ``rt`` let go of acme's facts, by using ``own`` facts after them."""
    for boundary in _boundaries(rt):
        for fact_id in own:
            assert boundary.fact_elsewhere(fact_id) is False
        assert not acme.hidden & set(boundary._elsewhere._items)


def _subscribed(rt: journaled.Runtime, count: int) -> list[Event]:
    with rt.journal.subscribe() as sub:
        events = []
        for _ in range(count):
            event = sub.poll(WAIT)
            assert event is not None, "the subscription delivered too little"
            events.append(event)
        assert sub.poll(0.05) is None
    return events


def _check_log(events: list[Event], acme: Acme, sees: bool) -> None:
    """Check a page of the log, as read or subscribed, shows exactly what it should."""
    streams = {e.stream for e in events}
    if sees:
        assert acme.hidden <= streams
    else:
        assert not acme.hidden & streams
    reads = [e.data for e in events if isinstance(e.data, MemoryRead)]
    assert len(reads) == 1
    _check_read(reads[0], acme, sees)
    by_shared = {e.stream: e.data for e in events if isinstance(e.data, FactSuperseded)}
    for n, shared in enumerate(acme.shared):
        _check_superseded(by_shared[shared], acme, n, sees)
    links = [d for d in by_shared.values() if isinstance(d, FactSuperseded) and d.by in acme.hidden]
    assert len(links) == FACTS + 1  # the deleted fact between the re-linked one and acme's too
    assert all((d.by_valid_until is not None) is sees for d in links)
    relinks = [e.data for e in events if isinstance(e.data, FactRelinked)]
    assert len(relinks) == 1
    _check_relinked(relinks[0], acme, sees)
    if not sees:
        shown = repr(events)
        assert SECRET not in shown
        assert not [t for t in acme.expiries if str(t) in shown]


def _check_read(read: object, acme: Acme, sees: bool) -> None:
    assert isinstance(read, MemoryRead)
    expected = {*acme.hidden, acme.plain} if sees else {acme.plain}
    assert set(read.fact_ids) == expected


def _check_superseded(data: object, acme: Acme, n: int, sees: bool) -> None:
    assert isinstance(data, FactSuperseded)
    assert data.by == acme.private[n]  # its id alone: accepted by ADR 0017
    assert data.by_valid_until == (acme.expires[n] if sees else None)


def _check_relinked(data: object, acme: Acme, sees: bool) -> None:
    assert isinstance(data, FactRelinked)
    assert data.to == acme.head
    assert data.to_valid_until == (acme.head_expires if sees else None)


def _check_every_path(rt: journaled.Runtime, acme: Acme, sees: bool) -> None:
    """Check every read the boundary guards shows acme's facts exactly when ``sees``."""
    log = rt.journal.read()
    _check_log(log, acme, sees)
    _check_log(_subscribed(rt, len(log)), acme, sees)
    _check_run(rt, acme, sees)
    for n in range(FACTS):
        _check_shared(rt, acme, n, sees)
    _check_relink(rt, acme, sees)
    for fact_id in acme.hidden:
        assert bool(rt.memory.history(fact_id)) is sees


def _check_run(rt: journaled.Runtime, acme: Acme, sees: bool) -> None:
    reads = [e.data for e in rt.runs.history(acme.run) if isinstance(e.data, MemoryRead)]
    assert len(reads) == 1
    _check_read(reads[0], acme, sees)
    why = rt.runs.why(acme.run)
    assert acme.plain in why
    assert all((i in why) is sees for i in acme.hidden)


def _check_shared(rt: journaled.Runtime, acme: Acme, n: int, sees: bool) -> None:
    history = rt.memory.history(acme.shared[n])
    assert [e.kind for e in history] == ["memory.fact-remembered", "memory.fact-superseded"]
    _check_superseded(history[1].data, acme, n, sees)
    assert ("until" in rt.memory.why(acme.shared[n])) is sees


def _check_relink(rt: journaled.Runtime, acme: Acme, sees: bool) -> None:
    history = rt.memory.history(acme.relinked)
    _check_relinked(history[-1].data, acme, sees)
    assert (str(acme.head_expires) in repr(history)) is sees


# -- the bound holds -------------------------------------------------------------------------------


def test_the_default_bound_holds_over_more_facts_than_it(sqlite_url: str) -> None:
    """R1 (ADR 0093): a boundary keeps at most FACT_OWNERS_KEPT facts' owners, however many
    facts of two organizations it sorts, and one left out is read again, not taken as shared."""
    with journaled.open(sqlite_url, organization="other") as rt:
        boundary = rt.journal._boundary
        for n in range(FACT_OWNERS_KEPT + 100):
            remembered = FactRemembered(
                at=0,
                fact_id=f"mem_{n:010d}",
                scope="organization",
                organization=("acme", "other")[n % 2],
            )
            event = Event(position=n + 1, stream=remembered.fact_id, version=1, data=remembered)
            assert boundary.hides(event) is (n % 2 == 0)
            assert len(boundary._elsewhere) <= FACT_OWNERS_KEPT
        assert len(boundary._elsewhere) == FACT_OWNERS_KEPT
        assert "mem_0000000000" not in boundary._elsewhere
        assert boundary.fact_elsewhere("mem_0000000000") is False  # left out, and no fact


@pytest.mark.parametrize("organization", ORGS)
def test_the_fact_owner_cache_never_exceeds_its_bound(
    sqlite_url: str,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    small_bound: int,
    organization: str | None,
) -> None:
    """R1 (ADR 0093): over many facts of acme and of the reader, every read path leaves no
    boundary of either runtime keeping more facts' owners than its bound."""
    acme = _acme(sqlite_url, clock, monkeypatch)
    own = _own_facts(sqlite_url, organization, 3 * FACTS)
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        for fact_id in own:
            assert rt.memory.history(fact_id)
            assert max(len(b._elsewhere) for b in _boundaries(rt)) <= small_bound
        _check_every_path(rt, acme, sees=False)
        assert max(len(b._elsewhere) for b in _boundaries(rt)) <= small_bound
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        _check_every_path(rt, acme, sees=True)
        assert max(len(b._elsewhere) for b in _boundaries(rt)) <= small_bound


# -- a fact let go is still hidden -----------------------------------------------------------------


@pytest.mark.parametrize("organization", ORGS)
def test_acmes_fact_let_go_by_the_cache_is_still_hidden_and_still_acmes(
    sqlite_url: str,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    organization: str | None,
) -> None:
    """R1 (ADR 0017, 0093): a fact of acme the reader's boundaries learnt and then let go, for
    facts of the reader's own used after it, is read again, and every path still hides it;
    acme's runtime, after letting go of its own facts alike, still sees them all."""
    monkeypatch.setattr(tenancy, "FACT_OWNERS_KEPT", 3 * FACTS)
    acme = _acme(sqlite_url, clock, monkeypatch)
    mine = _own_facts(sqlite_url, organization, 3 * FACTS)
    theirs = _own_facts(sqlite_url, "acme", 3 * FACTS)
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        _check_every_path(rt, acme, sees=False)
        assert acme.hidden <= set(rt.journal._boundary._elsewhere._items)
        assert acme.hidden <= set(rt.memory._boundary._elsewhere._items)
        _forget(rt, acme, mine)
        _check_every_path(rt, acme, sees=False)
        for boundary in _boundaries(rt):
            _forget(rt, acme, mine)
            assert all(boundary.fact_elsewhere(i) for i in acme.hidden)
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        _check_every_path(rt, acme, sees=True)
        _forget(rt, acme, theirs)
        _check_every_path(rt, acme, sees=True)


@pytest.mark.parametrize("organization", ORGS)
def test_with_a_tiny_bound_every_path_hides_acmes_facts_exactly(
    sqlite_url: str,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    small_bound: int,
    organization: str | None,
) -> None:
    """R1 (ADR 0093): with room for two facts' owners, fewer than any scrub sorts at once, the
    log, subscriptions, a run's reads and a shared fact's links hide each of acme's facts from
    the reader and show each to acme: no scrub decides from an entry let go since it sorted."""
    acme = _acme(sqlite_url, clock, monkeypatch)
    mine = _own_facts(sqlite_url, organization, FACTS)
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        _check_every_path(rt, acme, sees=False)
        _forget(rt, acme, mine)
        _check_every_path(rt, acme, sees=False)
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        _check_every_path(rt, acme, sees=True)


@pytest.mark.parametrize("organization", ORGS)
def test_a_boundary_reading_first_events_one_by_one_scrubs_as_exactly(
    sqlite_url: str,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    small_bound: int,
    organization: str | None,
) -> None:
    """R1 (ADR 0093): a boundary given no ``firsts()`` (one ``first()`` per fact) and room for
    two owners scrubs a run's reads and the links of the whole log as exactly."""
    acme = _acme(sqlite_url, clock, monkeypatch)
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        journal = rt._journal
        run = journal.stream(acme.run)
        log = list(journal.read())
        for reader, sees in ((organization, False), ("acme", True)):
            boundary = Boundary(reader, journal.first)
            reads = [e.data for e in boundary.scrub_reads(run) if isinstance(e.data, MemoryRead)]
            _check_read(reads[0], acme, sees)
            _check_log(boundary.visible(log), acme, sees)
            assert len(boundary._elsewhere) <= small_bound


# -- threads ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("organization", ORGS)
def test_threads_reading_while_others_fill_the_cache_see_exactly(
    sqlite_url: str,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    small_bound: int,
    organization: str | None,
) -> None:
    """R1 (ADR 0093): while threads keep filling the reader's boundaries with facts of its own
    (letting acme's go), threads reading every path never see acme's facts, and no boundary
    keeps more than its bound."""
    acme = _acme(sqlite_url, clock, monkeypatch)
    mine = _own_facts(sqlite_url, organization, 4 * FACTS)
    failures: list[BaseException] = []
    stop = threading.Event()
    with journaled.open(sqlite_url, organization=organization, clock=clock) as rt:
        boundaries = _boundaries(rt)

        def fill(offset: int) -> None:
            try:
                while not stop.is_set():
                    for n, fact_id in enumerate(mine):
                        assert boundaries[(n + offset) % 3].fact_elsewhere(fact_id) is False
            except BaseException as exc:  # reported by the main thread
                failures.append(exc)
                stop.set()

        def read(path: int) -> None:
            try:
                for _ in range(15):
                    if path == 0:
                        _check_log(rt.journal.read(), acme, sees=False)
                    elif path == 1:
                        _check_run(rt, acme, sees=False)
                    else:
                        for n in range(FACTS):
                            _check_shared(rt, acme, n, sees=False)
                        _check_relink(rt, acme, sees=False)
            except BaseException as exc:  # reported by the main thread
                failures.append(exc)

        fillers = [threading.Thread(target=fill, args=(n,)) for n in range(3)]
        readers = [threading.Thread(target=read, args=(n % 3,)) for n in range(6)]
        for thread in fillers + readers:
            thread.start()
        for thread in readers:
            thread.join(WAIT * 3)
        stop.set()
        for thread in fillers:
            thread.join(WAIT)
        assert not [t for t in fillers + readers if t.is_alive()]
        assert failures == []
        assert max(len(b._elsewhere) for b in boundaries) <= small_bound
        _check_every_path(rt, acme, sees=False)
