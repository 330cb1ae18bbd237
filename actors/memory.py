"""Memory as actors: one scope actor per physical scope (:mod:`actors.scope`), and one writer.

A scope actor owns the projection of one physical scope (``user``, ``project``,
``repository``, ``organization``) and answers reads. The :class:`MemoryWriter` is the only actor
that appends memory events: it decides a command against the scope actors' state, appends every
event of the command in one transaction (J2), then tells each scope actor to fold the events that
concern it. Because those tells are queued before the writer answers, a read sent after a write
returns always sees it.

The writer never blocks on a scope actor that could ask it back: scope actors ask nobody.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, cast

import msgspec
import pykka

from journaled.actors.asking import ask, ask_all
from journaled.actors.clock import FACT_ID_PREFIX, Clock, new_fact_id
from journaled.actors.desk import GROUP_MAX as _GROUP_MAX
from journaled.actors.desk import WriterDesk
from journaled.actors.directory import CountingInbox, Directory, failure
from journaled.actors.errors import InvalidFact, MemoryBehind
from journaled.actors.group_commit import Answer, commit_remembers, unknown_remember
from journaled.actors.remember_rules import validate_remember
from journaled.actors.run_reads import opens_run
from journaled.actors.scope import FoldMark, ScopeShelf, Unsettled, read_in_place
from journaled.events.base import DomainEvent, Event, Pending
from journaled.events.catalog import NOT_MEMORY
from journaled.events.codec import tag_of
from journaled.events.errors import (
    AppendOutcomeUnknown,
    ConcurrencyConflict,
    CorruptEvent,
    JournalBusy,
)
from journaled.events.inputs import decode_text
from journaled.events.journal import Journal
from journaled.events.memory import (
    MEMORY_EVENTS,
    ConflictKeyClaimed,
    Fact,
    FactDeleted,
    FactEvent,
    FactPurged,
    FactRelinked,
    FactRemembered,
    FactRestored,
    FactSuperseded,
    FactUnlinked,
    key_stream,
    remembered_fact,
)
from journaled.events.memory_state import (
    MEMORY_SNAPSHOT_DECODER,
    MEMORY_SNAPSHOT_PREFIX,
    MEMORY_SNAPSHOT_SCHEMA,
    MemorySnapshot,
    ScopeSnapshot,
    ScopeState,
    memory_snapshot_key,
)
from journaled.events.messages import (
    Apply,
    CatchUp,
    Delete,
    Deletion,
    ExportScope,
    Get,
    Purge,
    Remember,
    Remembered,
    RestoreScope,
    SaveSnapshot,
    SupersessionLinks,
    SupersessionLinksAnswer,
    WithKey,
)
from journaled.events.redact import redact, redact_report
from journaled.events.snapshot_audit import backed_scopes
from journaled.events.tenancy import Boundary, home_scope

"""Seconds any ask inside memory waits before it raises :class:`ActorTimeout`."""
_RETRIES = 50
_FOLD_BATCH = 2000
_SNAPSHOT_ATTEMPTS = 5
"""Snapshots refused by purges of other processes before memory gives up until the next one."""
_PURGED_TOPIC = tag_of(FactPurged) + "@"
"""Every version of the purge event's stored topic."""
log = logging.getLogger("journaled.memory")

T = TypeVar("T")

_ENCODER = msgspec.msgpack.Encoder()
Staged = tuple[str, DomainEvent]
"""An event decided but not yet versioned: (stream, event)."""


_WHOLE_TAIL = 20_000
"""Events of a live catch-up folded at once, the scopes' lock held (read first, outside it)."""


def _batches(events: Iterator[Event], size: int) -> Iterator[list[Event]]:
    """Cut an event stream into lists of ``size`` (the last may be shorter)."""
    batch: list[Event] = []
    for event in events:
        batch.append(event)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


_RETRY_FOLDS = 1000
"""Events folded before an automatic snapshot put off by a deferred index is asked again."""


def _empty_scope(physical: str) -> ScopeSnapshot:
    """Return an empty scope's state, freshly made (a restore adopts its containers)."""
    return ScopeState(physical).export()


class MemoryWriter(pykka.ThreadingActor):
    """Decide memory commands, append their events atomically, and fan them out to scopes."""

    use_daemon_thread = True
    """A program that ends without ``close()`` must still exit; the runtime's exit hook drains
    and closes first (R3)."""

    _create_actor_inbox = staticmethod(CountingInbox)

    auto_snapshot_events: int = 10_000
    """Folded events after which memory snapshots itself (see :meth:`_auto_snapshot_due`)."""

    def __init__(
        self,
        journal: Journal,
        scopes: dict[str, Any],
        clock: Clock,
        organization: str | None,
        directory: Directory,
        shelves: dict[str, ScopeShelf] | None = None,
        desk: WriterDesk | None = None,
        mark: FoldMark | None = None,
    ) -> None:
        super().__init__()
        self.mark = mark if mark is not None else FoldMark()
        """The position up to which every fold is queued for the scopes (ADR 0062)."""
        self.command_lock = threading.Lock()
        """Held for every message the actor handles, and by a caller doing a remember here."""
        self._done = 0
        """Messages the actor finished, counted holding :attr:`command_lock`."""
        self._serving = False
        """Whether the open's replay is done, so that readers may be reading memory."""
        if desk is not None:
            desk.writer = self
        self.directory = directory
        self.journal = journal
        self.scopes = scopes
        self.shelves = shelves or {}
        """The scope actors' states, folded and read here when their actors are idle."""
        self.send_lock = (
            next(iter(self.shelves.values())).lock if self.shelves else threading.Condition()
        )
        """The scopes' lock, held while folding or queueing a batch for the scopes, so that a
        reader in place sees every scope's part of it, or none (ADR 0053)."""
        self.clock = clock
        self.organization = organization
        self.runs = Boundary(organization, journal.first)
        """Whose each run named as provenance is: another organization's is no run here (R1)."""
        self.position = 0
        self.versions: dict[str, int] = {}
        self.route: dict[str, str | None] = {}
        self.purged: set[str] = set()
        self.hidden_superseders: dict[str, str] = {}
        """Another organization's superseded fact -> its superseder: a delete heals it too."""
        self.hidden_valid_until: dict[str, int | None] = {}
        """Another organization's live facts -> their expiry, for a delete that re-links to one."""
        self._since_snapshot = 0
        self._snapshot_position = 0
        self._snapshot_owed = False
        """The stored snapshot failed to fold on (ADR 0060): the next save writes one anyway."""
        self._auto_snapshot_queued = False
        self._auto_snapshot_backoff = 0
        self._backlog: list[tuple[ScopeState, int]] = []
        """The scopes an open's (or a rebuild's) fold left facts pending in, each with its count
        of settles then: that backlog is pending until the scope next settles (ADR 0056)."""
        self._group: list[Remember] = []
        self._group_keys: set[str] = set()
        self._stale = False
        """The projection fell behind the journal (a fold failed after a commit): rebuild it."""
        self._deadline: float | None = None
        """When the command being decided must hold the journal's lock (its earliest caller's
        ``deadline``): its appends wait for the lock no longer (ADR 0039)."""

    # -- dispatch --------------------------------------------------------------------------------

    def on_receive(self, message: object) -> object:
        """Handle one message holding :attr:`command_lock`, and count it finished."""
        with self.command_lock:
            try:
                return self._handle(message)
            finally:
                self._done += 1

    def remember_here(self, group: Sequence[Remember], answer: Answer) -> bool:
        """Store remembers on the caller's thread, if the writer is idle (ADR 0054, 0055).

        Idle means: no message of the writer's queued or in hand, no remember grouped, and the
        actor not stopped. The remembers are then decided, appended in one transaction and
        folded exactly as the actor would store a group, holding :attr:`command_lock`, so the
        actor waits meanwhile, and each gets its fact or its error through ``answer``.
        Otherwise it answers none and returns False: their callers send them.
        """
        if not self.command_lock.acquire(blocking=False):
            return False
        try:
            inbox = self.actor_inbox
            assert isinstance(inbox, CountingInbox)
            if inbox.puts != self._done or self._group or self.actor_stopped.is_set():
                return False
            try:
                self._rebuild_if_behind()
                self._refuse_if_behind()
            except Exception as exc:
                for message in group:
                    answer(message, None, exc)
                return True
            self._commit(list(group), answer)
            return True
        finally:
            self.command_lock.release()

    def _rebuild_if_behind(self) -> None:
        """Rebuild memory from the journal if it is behind it or a scope failed to fold."""
        if self._stale or self._broken():
            self._rebuild()

    def _refuse_if_behind(self) -> None:
        """Refuse to decide or snapshot against memory a rebuild could not make whole yet."""
        if self._stale:
            raise MemoryBehind("memory is behind the journal and could not be rebuilt yet")

    def _broken(self) -> bool:
        """Whether a scope failed to fold a change (on its own thread): rebuild memory then."""
        return any(shelf.broken for shelf in self.shelves.values())

    def _handle(self, message: object) -> object:
        """Dispatch one command; a remember with a reply joins the group being committed."""
        self._rebuild_if_behind()
        if isinstance(message, Remember) and message.reply_to is not None:
            try:
                self._refuse_if_behind()
                self._join_group(message)
            except Exception as exc:  # told, not asked: an escaping error would stop the writer
                self._answer(message, None, exc)
            return None
        self._commit_group()  # whatever else comes is decided against stored remembers
        if isinstance(message, Remember | Delete | Purge):
            self._refuse_if_behind()
        match message:
            case Remember(deadline=deadline):
                return self._before(deadline, lambda: self._remember(message))
            case Delete(fact_id=fact_id, deadline=deadline):
                return self._before(deadline, lambda: self._delete(fact_id))
            case Purge(fact_id=fact_id, reason=reason, deadline=deadline):
                return self._before(deadline, lambda: self._purge(fact_id, reason))
            case CatchUp(initial=initial):
                if initial:
                    self._replay()
                    self._serving = True  # the door exists from now on: readers may read
                else:
                    self._catch_up()
                return self.position
            case SaveSnapshot(min_events=min_events, auto=False):
                return self._save_snapshot(min_events)
            case SaveSnapshot(auto=True):
                self._auto_snapshot_queued = False
                due = self._auto_snapshot_due()
                if self._backlog_pending() > due:
                    # The export would first index more facts than the snapshot is due for
                    # (the whole log a cold open deferred to the first search, ADR 0056),
                    # holding every scope meanwhile: that search, or the close, first. Asked
                    # again after some more folds, not after each. The facts remembered since
                    # the last search or snapshot (ADR 0091) are no backlog: each export
                    # indexes them, however many a burst folded before it was asked.
                    self._auto_snapshot_backoff = max(0, self._since_snapshot - due) + _RETRY_FOLDS
                    return None
                try:
                    self._save_snapshot(self._auto_snapshot_due())
                except Exception as exc:  # a cache write must not stop memory: the next retries
                    log.warning("memory snapshot not saved (only a cache): %s", exc)
                    log.debug("why the memory snapshot was not saved", exc_info=True)
                    self._auto_snapshot_backoff = self._since_snapshot  # retry later, not per fold
                return None
        raise TypeError(f"memory writer got an unknown message {type(message).__name__}")

    def on_stop(self) -> None:
        """Store and answer the remembers still grouped when the actor is stopped (after a
        remember being stored here, if one is)."""
        with self.command_lock:
            self._commit_group()

    # -- group commit ----------------------------------------------------------------------------

    def _join_group(self, message: Remember) -> None:
        """Add a remember to the group, committing the group when nothing else is waiting.

        Remembers that queue up while the writer is busy (concurrent callers) are stored in one
        transaction instead of one each; a lone caller is never kept waiting, since an empty
        inbox commits at once. A conflict key already claimed in the group commits the group
        first: the later claim must see the earlier one to supersede it.
        """
        key = message.conflict_key
        # A key that is no string is refused when decided; it must not reach the set first.
        if key is not None and (not isinstance(key, str) or key in self._group_keys):
            self._commit_group()
        self._group.append(message)
        if isinstance(key, str):
            self._group_keys.add(key)
        if len(self._group) >= _GROUP_MAX or self.actor_inbox.empty():
            self._commit_group()

    def _commit_group(self) -> None:
        """Store the grouped remembers in one transaction and answer each (never raises).

        A remember whose caller has given up waiting (its deadline passed while the writer
        waited for a busy journal) is answered ``JournalBusy`` and not stored; the others wait
        for the journal's lock only until the earliest of their deadlines.
        """
        group, self._group = self._group, []
        self._group_keys.clear()
        self._commit(group, self._answer)

    def _commit(self, group: list[Remember], answer: Answer) -> None:
        """Store remembers in one transaction and give each its answer (never raises)."""
        now = time.time()
        for message in group:
            if message.deadline is not None and message.deadline <= now:
                answer(message, None, self._busy(message.deadline))
        group = [m for m in group if m.deadline is None or m.deadline > now]
        if group:
            self._deadline = min((m.deadline for m in group if m.deadline), default=None)
            try:
                commit_remembers(
                    group,
                    decide=self._decide_remember,
                    append=lambda staged, payloads: self._append(staged, payloads=payloads),
                    catch_up=self._catch_up,
                    attempts=_RETRIES,
                    answer=answer,
                )
            finally:
                self._deadline = None

    def _answer(self, message: Remember, fact: Fact | None, error: Exception | None) -> None:
        """Tell a remember's asker its stored fact or its error, by address (A4)."""
        correlation = message.correlation or ""
        reply = failure(correlation, error) if error is not None else None
        if reply is None:
            assert fact is not None
            self.directory.tell(message.reply_to, Remembered(correlation=correlation, fact=fact))
        else:
            self.directory.tell(message.reply_to, reply)

    def _before(self, deadline: float | None, decide_and_append: Callable[[], Any]) -> Any:
        """Decide and append a command whose appends must hold the lock by ``deadline``."""
        self._deadline = deadline
        try:
            return self._retrying(decide_and_append)
        finally:
            self._deadline = None

    def _busy(self, deadline: float) -> JournalBusy:
        """Return the error for a command whose deadline passed before it held the lock."""
        config = self.journal.config
        return JournalBusy(config.url, max(0.0, config.lock_wait - (deadline - time.time())))

    def _retrying(self, decide_and_append: Callable[[], Any]) -> Any:
        for attempt in range(_RETRIES):
            try:
                return decide_and_append()
            except ConcurrencyConflict:
                # Another process wrote first: see its events and decide again. Random backoff
                # breaks the symmetry between writers hammering one conflict key.
                time.sleep(random.uniform(0, min(0.05, 0.001 * 2**attempt)))
                self._catch_up()
        raise ConcurrencyConflict([], f"gave up after {_RETRIES} conflicting attempts")

    # -- commands --------------------------------------------------------------------------------

    def _remember(self, msg: Remember) -> Fact:
        pending, text, fact = self._decide_remember(msg)
        try:
            self._append(pending, payloads={fact.id: text.encode("utf-8")})
        except AppendOutcomeUnknown as exc:
            raise unknown_remember(exc, fact) from exc
        return fact

    def _decide_remember(self, msg: Remember) -> tuple[list[Staged], str, Fact]:
        """Decide a remember's events against the stored state: (events, redacted text, fact)."""
        fields = validate_remember(msg, self.organization)
        if msg.run_id is not None and (
            not opens_run(self.journal.head(msg.run_id)) or self.runs.run_elsewhere(msg.run_id)
        ):
            # Provenance is a claim the record makes (P1): it names a run that exists, and
            # another organization's run is unknown here, refused with the same words (R1).
            raise InvalidFact(
                "run_id", f"names no run of this journal ({msg.run_id!r}): give the run's id"
            )
        now = self.clock()
        fact_id = new_fact_id(now)
        text, found = redact_report(msg.text)
        source = None
        if msg.source is not None:
            source, in_source = redact_report(msg.source)
            found = [*found, *(k for k in in_source if k not in found)]
        kinds = tuple(found)
        pending: list[Staged] = []
        superseded: list[str] = []
        key = msg.conflict_key
        if key is not None:
            for fact, superseder_until in self._with_key(key):
                if fact.id == fact_id:
                    continue
                active = fact.superseded_by is None or (
                    superseder_until is not None and superseder_until < now
                )
                if not active:
                    continue
                superseded.append(fact.id)
                pending.append(
                    (
                        fact.id,
                        FactSuperseded(
                            at=now,
                            fact_id=fact.id,
                            by=fact_id,
                            conflict_key=key,
                            by_valid_until=msg.valid_until,
                        ),
                    )
                )
            pending.append(
                (key_stream(key), ConflictKeyClaimed(at=now, conflict_key=key, fact_id=fact_id))
            )
        remembered = FactRemembered(
            at=now,
            fact_id=fact_id,
            scope=msg.scope,
            organization=self.organization if fields.physical == "organization" else None,
            domain=msg.domain,
            confidence=fields.confidence,
            conflict_key=key,
            source=source,
            valid_from=msg.valid_from,
            valid_until=msg.valid_until,
            supersedes=tuple(superseded),
            redacted=kinds,
            run_id=msg.run_id,
            step_id=msg.step_id,
        )
        pending.insert(0, (fact_id, remembered))
        return pending, text, remembered_fact(remembered, text)

    def _delete(self, fact_id: str) -> Deletion:
        target = self._get(fact_id)
        if target is None and self._appended_elsewhere(fact_id):
            target = self._get(fact_id)
        if target is None:
            return Deletion(primary=False, relationships=0)
        pending, relationships = self._cascade(target, self.clock())
        self._append(pending)
        return Deletion(primary=True, relationships=relationships)

    def _purge(self, fact_id: str, reason: str | None) -> bool:
        # Another organization's fact is routed nowhere here: unknown, like a fact never seen (R1).
        if fact_id in self.purged:
            return False
        if self.route.get(fact_id) is None:
            self._appended_elsewhere(fact_id)  # folds it if another runtime just wrote it
            if self.route.get(fact_id) is None:
                return False
        now = self.clock()
        pending: list[Staged] = []
        target = self._get(fact_id)
        if target is not None:
            pending, _ = self._cascade(target, now)
        reason = redact(reason) if reason is not None else None  # M9: reasons are text too
        pending.append((fact_id, FactPurged(at=now, fact_id=fact_id, reason=reason)))
        # Erased once this commits; scrubbing the files is the caller's cleanup (actors.scrubber),
        # so that readers holding old data never hold up this writer.
        self._append(pending, forget=[fact_id], drop_snapshots=MEMORY_SNAPSHOT_PREFIX)
        return True

    def _appended_elsewhere(self, fact_id: str) -> bool:
        """Fold the journal when a fact unknown here has a stream in it (another runtime or
        process remembered it after this writer's position); tell whether it folded.

        A delete or a purge of such a fact then acts on it instead of calling it unknown: a
        runtime that follows late, or not at all, can still erase what another wrote (M8, M10,
        R2). An id with no stream costs one indexed read and folds nothing.
        """
        if not isinstance(fact_id, str) or not fact_id.startswith(FACT_ID_PREFIX):
            return False
        if self.journal.head(fact_id) is None:
            return False
        self._catch_up()
        return True

    def _cascade(self, target: Fact, now: int) -> tuple[list[Staged], int]:
        """Decide a delete's events: heirs re-linked or restored, listers stripped (M8).

        Another organization's facts take part unseen (R1): those the target superseded are
        healed too, and a superseder of its becomes their heir, but none is counted in the
        returned number of relationships — it would tell the deleter that they exist.
        """
        heir = self._heir(target)
        here = self._in_place(
            lambda states: [
                SupersessionLinksAnswer(
                    listing=tuple(s.listing(target.id)),
                    superseded=tuple(s.superseded_by(target.id)),
                )
                for s in states
            ]
        )
        answers: list[SupersessionLinksAnswer] = (
            here
            if not isinstance(here, Unsettled)
            else ask_all(self._traversed(), SupersessionLinks(fact_id=target.id))
        )
        listing = {f.id: f for a in answers for f in a.listing if f.id != target.id}
        superseded = sorted({f.id for a in answers for f in a.superseded if f.id != target.id})
        hidden = sorted(f for f, by in self.hidden_superseders.items() if by == target.id)
        pending: list[Staged] = []
        for fact_id in [*superseded, *hidden]:
            if heir is not None:
                event: DomainEvent = FactRelinked(
                    at=now, fact_id=fact_id, deleted=target.id, to=heir[0], to_valid_until=heir[1]
                )
            else:
                event = FactRestored(at=now, fact_id=fact_id, deleted=target.id)
            pending.append((fact_id, event))
        gained = (*superseded, *hidden) if heir is not None else ()
        lister_ids = sorted(listing)
        # A superseder lists what it supersedes: one of another organization's is not among
        # the listers found here (they are read from this organization's scopes), so it is
        # stripped of the target by id, as its own organization's delete would (M8, R1).
        hidden_heir = heir is not None and heir[0] in self.hidden_valid_until
        if heir is not None and (gained or hidden_heir) and heir[0] not in listing:
            lister_ids.append(heir[0])
        for fact_id in lister_ids:
            gains = gained if heir is not None and fact_id == heir[0] else ()
            pending.append(
                (fact_id, FactUnlinked(at=now, fact_id=fact_id, deleted=target.id, gained=gains))
            )
        touched = {f for f in (*superseded, *lister_ids) if f not in self.hidden_valid_until}
        relationships = len(touched)
        pending.append(
            (target.id, FactDeleted(at=now, fact_id=target.id, relationships=relationships))
        )
        return pending, relationships

    def _heir(self, target: Fact) -> tuple[str, int | None] | None:
        """Return the fact that supersedes ``target`` (its id and expiry), if it still exists."""
        by = target.superseded_by
        if by is None:
            return None
        if by in self.hidden_valid_until:  # another organization's: known here by id only
            return by, self.hidden_valid_until[by]
        heir = self._get(by)
        return (heir.id, heir.valid_until) if heir is not None else None

    # -- journal ---------------------------------------------------------------------------------

    def _append(
        self,
        staged: list[Staged],
        payloads: dict[str, bytes] | None = None,
        forget: Sequence[str] = (),
        drop_snapshots: str | None = None,
    ) -> None:
        counters: dict[str, int] = {}
        pending: list[Pending] = []
        for stream, data in staged:
            version = counters.get(stream, self.versions.get(stream, 0)) + 1
            counters[stream] = version
            pending.append(Pending(stream=stream, version=version, data=data))
        left: float | None = None
        if self._deadline is not None:
            left = self._deadline - time.time()
            if left <= 0:  # the caller gives up before the lock could be had: append nothing
                raise self._busy(self._deadline)
        positions = self.journal.append(
            pending,
            payloads=payloads,
            forget=forget,
            drop_snapshots=drop_snapshots,
            lock_wait=left,
        )
        # Committed: the command has happened, and its callers are told so whatever folding it
        # costs. A fold that fails leaves the projection behind the journal; it is rebuilt
        # from the journal, never reported as a failed write (which would invite a retry that
        # stores the fact twice).
        try:
            if positions and positions[0] != self.position + 1:
                self._catch_up(upto=positions[0] - 1)  # others appended in between: log order
            texts = {k: v.decode("utf-8") for k, v in (payloads or {}).items()}
            events = [
                Event(position=pos, stream=p.stream, version=p.version, data=p.data)
                for pos, p in zip(positions, pending, strict=True)
            ]
            self._fold(events, texts)
        except Exception as exc:
            log.warning(
                "stored, but folding it failed (%s): rebuilding memory from the journal", exc
            )
            log.debug("why folding a stored command failed", exc_info=True)
            self._rebuild()
        except BaseException:
            # Interrupted (Ctrl-C, SystemExit) part way, on a caller's thread most likely: the
            # position may have moved past events the scopes lack. Rebuilt before the next
            # command or read, never snapshotted so.
            self._set_stale(True)
            raise

    def _rebuild(self) -> None:
        """Fold memory again from the journal into empty scopes; on failure, retry later.

        Until it succeeds, every command first tries again (see :meth:`on_receive`): deciding
        against a projection known to be behind could supersede or cascade wrongly.
        """
        self._set_stale(True)
        try:
            self._empty()
            # From the journal's start: the snapshot may be what broke the scopes (ADR 0060),
            # and the next save replaces it.
            self._replay(from_snapshot=False)
            self._snapshot_owed = True
        except Exception as exc:
            log.warning("memory could not be rebuilt from the journal yet: %s", exc)
            log.debug("why memory could not be rebuilt", exc_info=True)
            return
        self._set_stale(False)

    def _empty(self) -> None:
        """Give every scope an empty state and forget what the writer folded."""
        ask_all(
            list(self.scopes.values()),
            None,
            messages=[RestoreScope(state=_empty_scope(name)) for name in self.scopes],
            sent_under=self.send_lock,
        )
        self.position = self._snapshot_position = self._since_snapshot = 0
        self.mark.position = 0
        self.versions = {}
        self.route = {}
        self.purged = set()
        self.hidden_superseders = {}
        self.hidden_valid_until = {}

    def _set_stale(self, stale: bool) -> None:
        """Mark memory behind the journal (or whole again), for readers too (ADR 0053).

        Marking it behind sets the flags before taking the scopes' lock to wake waiting readers:
        an interrupt while waiting for that lock must not leave memory unmarked. Marking it whole
        first waits for every scope actor to finish what is queued (an empty fold, asked).
        """
        if stale:
            self._stale = True
            for shelf in self.shelves.values():
                shelf.stale = True
        else:
            # A read asked by message while memory was behind may still wait at a scope, queued
            # ahead of the folds that make it whole: each scope gets through its queue first,
            # refusing such reads as behind, and only then is memory whole again for readers.
            ask_all(list(self.scopes.values()), Apply(events=()))
        with self.send_lock:
            if not stale:
                self._stale = False
                for shelf in self.shelves.values():
                    shelf.stale = False
            self.send_lock.notify_all()

    def _save_snapshot(self, min_events: int) -> bool:
        """Store memory's state at the current position, so the next open folds only the tail."""
        self._refuse_if_behind()  # empty or partial scopes: a snapshot would lose facts for good
        if self._since_snapshot < min_events and not self._snapshot_owed:
            return False
        # Fold what other processes appended first, even when this runtime does not follow: a
        # purge among it is then folded before the first try instead of refusing it (R2).
        self._catch_up()
        key = memory_snapshot_key(self.organization)
        for _ in range(_SNAPSHOT_ATTEMPTS):
            exported = ask_all(list(self.scopes.values()), ExportScope())
            scopes = {
                name: msgspec.Raw(data) for name, data in zip(self.scopes, exported, strict=True)
            }
            snapshot = MemorySnapshot(
                position=self.position,
                organization=self.organization,
                versions=self.versions,
                route=self.route,
                purged=sorted(self.purged),
                hidden_superseders=self.hidden_superseders,
                hidden_valid_until=self.hidden_valid_until,
                scopes=scopes,
            )
            # Refused when another process purged after our position: our state may still hold
            # the erased text, which must never be written back (R2). Fold the purge, retry.
            if self.journal.save_snapshot(
                key, self.position, _ENCODER.encode(snapshot), unless_after=(_PURGED_TOPIC,)
            ):
                break
            self._catch_up()
        else:
            return False
        self._since_snapshot = 0
        self._snapshot_position = self.position
        self._auto_snapshot_backoff = 0
        self._snapshot_owed = False
        return True

    def _backlog_pending(self) -> int:
        """Return how many facts wait in the scopes an open's fold left pending, until each
        settles (a search or an export indexes everything pending in it)."""
        self._backlog = [(s, n) for s, n in self._backlog if s.settles == n and s.pending]
        return sum(s.pending_count for s, _ in self._backlog)

    def _auto_snapshot_due(self) -> int:
        """Return how many folded events call for a snapshot without anyone asking.

        At least :attr:`auto_snapshot_events`, and half the log the last snapshot covered: a
        snapshot costs time in proportion to memory's size, so spacing them geometrically keeps
        that cost a constant share of folding, while a process that is killed and never closes
        still reopens from a snapshot no more than a third of the log old.
        """
        return max(self.auto_snapshot_events, self._snapshot_position // 2)

    def _queue_auto_snapshot(self) -> None:
        if (
            not self._auto_snapshot_queued
            and self.journal.config.backend != "memory"
            and self._since_snapshot >= self._auto_snapshot_due() + self._auto_snapshot_backoff
        ):
            self._auto_snapshot_queued = True
            self.actor_ref.tell(SaveSnapshot(auto=True))

    def _restore_snapshot(self) -> bool:
        """Start from memory's latest snapshot, if a usable one exists (a cache of the fold);
        tell whether one was restored."""
        stored = self.journal.snapshot(memory_snapshot_key(self.organization))
        if stored is None:
            return False
        try:
            snapshot = MEMORY_SNAPSHOT_DECODER.decode(stored[1])
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False  # unreadable: fold from the start instead
        if (
            snapshot.schema != MEMORY_SNAPSHOT_SCHEMA
            or snapshot.organization != self.organization
            or set(snapshot.scopes) != set(self.scopes)
            or snapshot.position > self.journal.position()
        ):
            return False
        scopes, unbacked = backed_scopes(snapshot, self.journal.payloads, self.journal.firsts)
        if unbacked is not None:
            # Snapshots are outside the digest chain (ADR 0021); payloads are inside it. Never
            # serve a text the journal does not hold: fold the events instead (R7).
            log.warning(
                "memory snapshot %s does not match the journal (%s): folding its events instead",
                memory_snapshot_key(self.organization),
                unbacked,
            )
            return False
        ask_all(
            list(self.scopes.values()),
            None,
            messages=[RestoreScope(state=scopes[name]) for name in self.scopes],
            sent_under=self.send_lock,
        )
        self.position = self._snapshot_position = snapshot.position
        self.mark.position = self.position
        self.versions = dict(snapshot.versions)
        self.route = dict(snapshot.route)
        self.purged = set(snapshot.purged)
        self.hidden_superseders = dict(snapshot.hidden_superseders)
        self.hidden_valid_until = dict(snapshot.hidden_valid_until)
        return True

    def _replay(self, *, from_snapshot: bool = True) -> None:
        """Fold the journal on open — from memory's snapshot when there is one and
        ``from_snapshot`` — reading every payload once, and check that no fact lost its text
        unpurged (J5)."""
        served = from_snapshot and self._restore_snapshot()
        missing: dict[str, int] = {}
        try:
            self._catch_up(missing=missing)
        except Exception as exc:
            if not served:
                raise
            # The snapshot passed the open's check, but folding after it failed: a posting the
            # check could not read, say (ADR 0060). Fold the journal from its start instead, and
            # store a snapshot of that, so the next open is not served the same one.
            log.warning(
                "folding after memory snapshot %s failed (%s): folding the journal from its start",
                memory_snapshot_key(self.organization),
                exc,
            )
            self._empty()
            self._replay(from_snapshot=False)
            self._snapshot_owed = True  # the next snapshot (the close's at the latest) replaces it
            return
        self._backlog = [
            (shelf.state, shelf.state.settles)
            for shelf in self.shelves.values()
            if shelf.state.pending
        ]
        lost = {k: v for k, v in missing.items() if k not in self.purged}
        if lost:
            fact_id, position = min(lost.items(), key=lambda kv: kv[1])
            raise CorruptEvent(
                position,
                "memory.fact-remembered",
                f"the text of fact {fact_id} is missing from the payload table and the fact was "
                f"never purged ({len(lost)} fact(s) affected)",
            )

    def _catch_up(self, upto: int | None = None, missing: dict[str, int] | None = None) -> None:
        """Fold the journal after the writer's position in batches, with the facts' texts.

        With ``missing``, note remembered facts whose text is gone (the open-time J5 check).
        Runs' and orchestrations' events are left out by the database (not even decoded), and
        the writer's position still moves past them.

        Readers in place must see each command whole (ADR 0053), and batches end where they
        end, not where commands do. So while readers may read (after the open, memory not
        stale), a tail of up to :data:`_WHOLE_TAIL` events is read first, outside the scopes'
        lock, and then folded holding it, all at once; a longer one marks memory behind the
        journal until it is folded, and readers wait for it by asking the writer.
        """
        end = self.journal.position() if upto is None else upto
        events = self.journal.read(after=self.position, upto=end, skip_prefixes=NOT_MEMORY)
        if self._serving and not self._stale:
            tail: list[tuple[list[Event], dict[str, str]]] = []
            held = 0
            for batch in _batches(events, _FOLD_BATCH):
                tail.append((batch, self._texts(batch)))
                held += len(batch)
                if held > _WHOLE_TAIL:
                    break
            else:
                with self.send_lock:
                    for batch, texts in tail:
                        self._fold_batch(batch, missing, texts)
                    self.position = max(self.position, end)
                    self.mark.position = self.position
                return
            self._set_stale(True)  # too long to hold whole: readers wait for the writer instead
            for batch, texts in tail:
                self._fold_batch(batch, missing, texts)
            for batch in _batches(events, _FOLD_BATCH):
                self._fold_batch(batch, missing)
            self.position = max(self.position, end)
            self.mark.position = self.position
            self._set_stale(False)
            return
        for batch in _batches(events, _FOLD_BATCH):
            self._fold_batch(batch, missing)
        self.position = max(self.position, end)
        self.mark.position = self.position

    def _fold_batch(
        self,
        batch: list[Event],
        missing: dict[str, int] | None,
        texts: dict[str, str] | None = None,
    ) -> None:
        if texts is None:
            texts = self._texts(batch)
        if missing is not None:
            for event in batch:
                data = event.data
                if isinstance(data, FactRemembered) and data.fact_id not in texts:
                    missing[data.fact_id] = event.position
        self._fold(batch, texts)

    def _texts(self, events: Sequence[Event]) -> dict[str, str]:
        at = {e.data.fact_id: e for e in events if isinstance(e.data, FactRemembered)}
        if not at:
            return {}
        found = self.journal.payloads(list(at))
        try:
            return {k: v.decode("utf-8") for k, v in found.items()}
        except UnicodeDecodeError:  # name the first event whose text is not UTF-8 (J5)
            return {k: decode_text(v, k, at[k].position, at[k].kind) for k, v in found.items()}

    def _fold(self, events: Sequence[Event], texts: dict[str, str]) -> None:
        """Track versions and routes, and tell each scope actor the events about its facts.

        Whatever interrupts it part way (an error, Ctrl-C on a caller's thread) may leave the
        position past events the scopes lack: memory is then marked behind the journal, and
        rebuilt before the next command or read.
        """
        try:
            self._fold_events(events, texts)
        except BaseException:
            self._set_stale(True)
            raise

    def _fold_events(self, events: Sequence[Event], texts: dict[str, str]) -> None:
        # Each scope's part of the batch: its events, and the texts of the facts it remembers.
        per_scope: dict[str, tuple[list[FactEvent], dict[str, str]]] = {}
        self._since_snapshot += len(events)
        versions, route, scopes, organization = (
            self.versions,
            self.route,
            self.scopes,
            self.organization,
        )
        for event in events:
            data = event.data
            if not isinstance(data, MEMORY_EVENTS):
                continue  # runs and orchestrations are not memory's to track
            versions[event.stream] = event.version
            if isinstance(data, FactRemembered):  # most of a log: routed, and done
                new_id = data.fact_id
                home = route[new_id] = home_scope(data, scopes, organization)
                if home is None:
                    self.hidden_valid_until[new_id] = data.valid_until
                    continue
                part = per_scope.get(home)
                if part is None:
                    part = per_scope[home] = ([], {})
                part[0].append(data)
                text = texts.get(new_id)
                if text is not None:
                    part[1][new_id] = text
                continue
            if isinstance(data, FactPurged):
                self.purged.add(data.fact_id)
            fact_id = getattr(data, "fact_id", None)
            if isinstance(data, ConflictKeyClaimed) or not isinstance(fact_id, str):
                continue
            physical_or_none = route.get(fact_id)
            if physical_or_none is not None:
                part = per_scope.get(physical_or_none)
                if part is None:
                    part = per_scope[physical_or_none] = ([], {})
                part[0].append(cast(FactEvent, data))
            elif fact_id in route:
                self._track_hidden(data)
        if events:
            # Once, after the loop: whatever stops it part way leaves memory stale (see _fold),
            # and a rebuild folds from the start.
            self.position = events[-1].position
        applies = [
            (physical, scopes[physical], Apply(events=tuple(scoped), texts=scope_texts))
            for physical, (scoped, scope_texts) in per_scope.items()
        ]
        with self.send_lock:  # every scope's part of the batch at once (ADR 0053)
            for physical, ref, apply in applies:
                shelf = self.shelves.get(physical)
                if shelf is None or not shelf.fold_here(apply):
                    ref.tell(apply)
            self.mark.position = self.position
        self._queue_auto_snapshot()

    def _track_hidden(self, data: DomainEvent) -> None:
        """Follow which fact supersedes each fact of another organization (and nothing else)."""
        fact_id: str = data.fact_id  # type: ignore[attr-defined]
        by: str | None = None
        match data:
            case FactSuperseded():
                by = data.by
            case FactRelinked():
                by = data.to
            case FactRestored():
                pass
            case FactDeleted() | FactPurged():
                self.hidden_valid_until.pop(fact_id, None)
            case _:
                return
        if by is None:
            self.hidden_superseders.pop(fact_id, None)
        else:
            self.hidden_superseders[fact_id] = by

    # -- reads through scope actors --------------------------------------------------------------

    def _traversed(self) -> list[Any]:
        return list(self.scopes.values())

    def _in_place(self, read: Callable[[list[ScopeState]], T]) -> T | Unsettled:
        """Read every scope in place if all are idle (never waiting: the writer's own folds
        are the ones they would be busy with); else :data:`UNSETTLED`."""
        return read_in_place(list(self.shelves.values()), read, 0.0)

    def _get(self, fact_id: str) -> Fact | None:
        physical = self.route.get(fact_id)
        if physical is None:
            return None
        shelf = self.shelves.get(physical)
        found = read_in_place([shelf] if shelf else [], lambda s: s[0].get(fact_id), 0.0)
        if not isinstance(found, Unsettled):
            return found
        fact: Fact | None = ask(self.scopes[physical], Get(fact_id=fact_id))
        return fact

    def _with_key(self, key: str) -> list[tuple[Fact, int | None]]:
        found: list[tuple[Fact, int | None]] = []
        here = self._in_place(
            lambda states: [(f, s.superseder_until(f.id)) for s in states for f in s.with_key(key)]
        )
        if not isinstance(here, Unsettled):
            found = here
        else:
            for holders in ask_all(self._traversed(), WithKey(conflict_key=key)):
                found.extend(holders)
        return sorted(found, key=lambda pair: pair[0].id)
