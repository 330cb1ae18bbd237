"""Reading runs: history, state, time travel, why and listing of ``rt.runs`` (O6, O7, T1, T2).

:class:`RunReads` answers from the journal alone (and the caches beside it: the checkpoint cache
of ADR 0034, the run-summary projection of ADR 0037); :class:`~journaled.actors.runs.Runs`, which
executes runs, is one. Any process answers the same.
"""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import Callable

from msgspec import UNSET

from journaled.actors.clock import FACT_ID_PREFIX, system_clock
from journaled.actors.errors import RunNotFound, RunNotResumable
from journaled.actors.ownership import owner_judge
from journaled.events.base import Event
from journaled.events.codec import tag_of, topics_of
from journaled.events.fork import Lineage
from journaled.events.inputs import INT64_MAX, int_problem, short
from journaled.events.journal import Journal
from journaled.events.orchestration import OrchestrationStarted, PassStarted
from journaled.events.orchestration_state import fold_orchestration
from journaled.events.plans import ExecuteResult, RunDiff, diff_results
from journaled.events.run_audit import explain_orchestration, explain_run
from journaled.events.run_checkpoints import RunCheckpoints
from journaled.events.run_state import RunFold, fold_run
from journaled.events.run_summaries import (
    SAVE_AFTER,
    RunSummaries,
    RunSummary,
    Since,
    Statuses,
    check_filters,
    select,
)
from journaled.events.runs import RunForked, RunStarted
from journaled.events.tenancy import Boundary

log = logging.getLogger("journaled")


class NotBegun(ValueError):
    """A time before a run's first event: the run had not begun then."""

    def __init__(self, run_id: str, at: int, began: int) -> None:
        super().__init__(f"run {run_id} had not begun at {at} (it began at {began})")
        self.run_id, self.at, self.began = run_id, at, began


class RunReads:
    """The reading half of ``rt.runs``: every answer is a projection of the journal."""

    def __init__(self, journal: Journal, clock: Callable[[], int] = system_clock) -> None:
        self._journal = journal
        self.summaries = RunSummaries(journal)
        """The run-summary projection behind :meth:`list` (T2, ADR 0037)."""
        self.executing_here: Callable[[str], bool] = lambda _: False
        """Whether a runtime of this process executes (or drives) a run now: a run this
        process owns that none does is interrupted once silent for the lease (ADR 0088). The
        runtime sets it."""
        self.summaries.owner_gone = owner_judge(clock, self._executing_here)
        self.summaries_writable = True
        """Whether :meth:`list` and ``close`` may store the projection (a read-only runtime
        never writes)."""
        self.checkpoints = RunCheckpoints()
        """Time travel's cache of folded runs (T1, ADR 0034); replace it to change its bounds."""
        self._checkpoints_lock = threading.Lock()
        self.boundary: Boundary | None = None
        """The runtime's tenant boundary (R1): another organization's run is unknown here, and
        the run events it shows (history, why) name none of another organization's facts. The
        runtime sets it."""

    def _executing_here(self, run_id: str) -> bool:
        return self.executing_here(run_id)  # read when judged: the runtime sets it later

    @property
    def _organization(self) -> str | None:
        """The organization this runtime's runs belong to (its boundary's), or None."""
        return self.boundary.organization if self.boundary is not None else None

    def _check_here(self, run_id: str, first: Event | None = None) -> None:
        """Raise RunNotFound for another organization's run: here it is unknown (ADR 0074).

        ``first``, when given, is the run's first event, just read: its owner is learnt from it.
        """
        boundary = self.boundary
        if boundary is None or not isinstance(run_id, str):
            return
        if first is not None:
            elsewhere = boundary.learn_run(first)
        else:
            elsewhere = boundary.run_elsewhere(run_id)
        if elsewhere:
            raise no_run(run_id)

    def _check_may_resume(self, run_id: str, owner: object | None = None) -> None:
        """Refuse, for a runtime of an organization, to carry on a run of an earlier release.

        Such a run recorded no organization, so every runtime sees it (ADR 0074): what this
        organization's steps would read from its scope would land in a run everyone reads. A
        fork of it is this organization's alone. ``owner``, when given, is the run's recorded
        organization, already folded (no first event is read).

        Raises:
            RunNotFound: another organization's run.
            RunNotResumable: a run of an earlier release, and this runtime has an organization.
        """
        boundary = self.boundary
        if owner is None:
            self._check_here(run_id)
        if boundary is None or boundary.organization is None or not isinstance(run_id, str):
            return
        if (boundary.run_owner(run_id) if owner is None else owner) is UNSET:
            raise RunNotResumable(
                f"run {run_id} was journaled by an earlier release, which recorded no "
                "organization, so every runtime sees it: carried on here, what its steps read "
                f"from organization {boundary.organization!r} would be seen by all. Fork it "
                "(rt.runs.fork) and resume the fork, which is this organization's alone"
            )

    def _check_started(self, run_id: str, state: RunFold) -> None:
        """As :meth:`_check_here`, from a folded state's opening (no first event read again)."""
        started = state.started
        boundary = self.boundary
        elsewhere = (
            boundary is not None
            and started is not None
            and boundary.note_run(run_id, started.organization)
        )
        if elsewhere:
            raise no_run(run_id)

    def history(self, run_id: str) -> list[Event]:
        """Return every event of a run, oldest first."""
        events = self._journal.stream(run_id)
        check_run(run_id, events[0] if events else None)
        self._check_here(run_id, events[0])
        return self._seen(events)

    def _seen(self, events: list[Event]) -> list[Event]:
        """Return run events as this runtime may show them (R1, :attr:`boundary`)."""
        return events if self.boundary is None else self.boundary.scrub_reads(events)

    def _first(self, run_id: str) -> Event:
        first = self._journal.first(run_id)
        check_run(run_id, first)
        assert first is not None
        self._check_here(run_id, first)
        return first

    def state(self, run_id: str, position: int | None = None) -> RunFold:
        """Fold a run's events (up to a journal position) into its state.

        The latest state starts from the run's snapshot, when there is one, and folds only the
        events after it; a past state folds the prefix of the stream.
        """
        # Its position and kind only: the first event holds the whole plan, decoded below
        # from the snapshot or the stream anyway.
        began = self._journal.head(run_id)
        check_head(run_id, began)
        assert began is not None
        if began[1] == _ORCHESTRATION_TAG:
            self._check_here(run_id)
            raise ValueError(
                f"run_id {run_id} is an orchestration: read the state of one of its pass runs "
                "(`runs history` names them at each pass-started)"
            )
        if position is not None:
            check_position(position)
            self._check_end([position])
            self._check_here(run_id)  # before the run's first position is named (ADR 0074)
            if position < began[0]:
                raise ValueError(
                    f"position {position} is before run {run_id} began "
                    f"(its first event is at {began[0]})"
                )
            state = fold_run(self._journal.stream(run_id, upto=position))
            self._check_started(run_id, state)
            return state
        snapshot = self._journal.snapshot(run_id)
        restored = RunFold.restore(snapshot[1]) if snapshot is not None else None
        if restored is None:
            state = fold_run(self._journal.stream(run_id))
            self._check_started(run_id, state)
            return state
        state = restored
        self._check_started(run_id, state)
        for event in self._journal.stream(run_id, after_version=state.version):
            state.apply(event)
        return state

    def current(self, run_id: str) -> ExecuteResult:
        """Return a run (an orchestration: its current pass) as the journal holds it now."""
        return self.at(run_id, self._journal.position())

    def at(self, run_id: str, position: int) -> ExecuteResult:
        """Return the run exactly as it was at a journal position (O7, T1).

        For an orchestration, this is the run of the pass that was current at that position.
        A run's state is its nearest checkpoint plus the few events after it (ADR 0034).
        """
        return self._results_at(run_id, [position])[0]

    def _results_at(
        self, run_id: str, positions: builtins.list[int]
    ) -> builtins.list[ExecuteResult]:
        """Return a run (an orchestration: its current pass) at each position, checked in turn.

        Time travel answers from the journal's events alone, never from a snapshot: a snapshot
        is a cache that ``journal verify`` checks but an answer could not (ADR 0034). A run this
        runtime has not visited yet (every command-line call) is read once, up to the last
        position, and folded plainly: its first event comes with that read, so it is decoded
        once (a run's first event holds its whole plan).
        """
        for position in positions:
            check_position(position)
        if max(positions) > INT64_MAX:
            self._check_end(positions)  # past any journal's end: said before a read that'd fail
        with self._checkpoints_lock:
            first = self.checkpoints.first(run_id)
        prefix: builtins.list[Event] | None = None
        if first is None:
            prefix = self._read_after(run_id, 0, max(positions))
            if not prefix or max(positions) > prefix[-1].position:
                self._check_end(positions)  # else an event of the run is at the last position
            first = prefix[0] if prefix else self._first(run_id)
            check_run(run_id, first)
        else:
            self._check_end(positions)
        self._check_here(run_id, first)
        for position in positions:
            if position < first.position:
                raise ValueError(
                    f"position {position} is before run {run_id} began "
                    f"(its first event is at {first.position})"
                )
        if not isinstance(first.data, OrchestrationStarted):
            results = self._checkpointed(run_id, positions, prefix)
            assert None not in results  # the run's first event is at or before each position
            return [r for r in results if r is not None]
        out = []
        for position in positions:
            # The current pass's run, never an earlier one: after a replan the failed pass is
            # history, and the new pass has no run until its pass-started.
            then = fold_orchestration(self._journal.stream(run_id, upto=position))
            current = then.current_run
            result = self._checkpointed(current, [position])[0] if current else None
            out.append(result if result is not None else then.not_yet_run())
        return out

    def _checkpointed(
        self,
        run_id: str,
        positions: builtins.list[int],
        prefix: builtins.list[Event] | None = None,
    ) -> builtins.list[ExecuteResult | None]:
        """Return a run at positions through the checkpoint cache; None before it began.

        ``prefix``, when given, is the run's stream up to the last position, just read. The
        first call for a run folds its prefix plainly, and the next builds the run's
        checkpoints from the events it kept (ADR 0034).
        """
        with self._checkpoints_lock:
            if prefix is None and run_id not in self.checkpoints:
                prefix = self._read_after(run_id, 0, max(positions))
            if prefix is not None and run_id not in self.checkpoints:
                return self.checkpoints.first_results(run_id, prefix, positions)
            return self.checkpoints.results_at(run_id, positions, self._read_after)

    def _check_end(self, positions: builtins.list[int]) -> None:
        """Raise ValueError for a position past the journal's end."""
        end = self._journal.position()
        for position in positions:
            if position > end:
                raise ValueError(f"position {position} is past the end of the journal ({end})")

    def _read_after(self, run_id: str, version: int, upto: int | None) -> list[Event]:
        return self._journal.stream(run_id, after_version=version, upto=upto)

    def diff(self, run_id: str, a: int, b: int) -> RunDiff:
        """Say what changed in a run from position ``a`` to position ``b`` (O7)."""
        check_position(a, "a")
        check_position(b, "b")
        if b < a:
            raise ValueError(f"diff needs a <= b, got a={a}, b={b}")
        before, after = self._results_at(run_id, [a, b])
        return diff_results(run_id, a, b, before, after)

    def position_at(self, run_id: str, at: int) -> int:
        """Return the journal position of a run's last event recorded by an epoch-ms time.

        That is the last of the run's first events (in journal order) recorded at or before
        ``at``: an event after one recorded later is not counted, whatever time it carries (two
        processes whose clocks disagree). For an orchestration, the events of its passes count
        too.

        Raises:
            ValueError: ``at`` is not an epoch-ms int.
            NotBegun: the run had not begun at ``at`` (a ValueError).
        """
        problem = int_problem(at, unit="epoch milliseconds (int)")
        if problem:
            raise ValueError(f"at {problem}")
        events = self.history(run_id)
        if at < events[0].data.at:
            raise NotBegun(run_id, at, events[0].data.at)
        with_passes = list(events)
        for e in events:
            if isinstance(e.data, PassStarted):
                with_passes += self._journal.stream(e.data.run)
        # The events of its longest prefix all recorded by then: with clocks that disagree (two
        # processes), a later event may carry an earlier time, and the run was not yet past an
        # event recorded after ``at`` whatever follows it.
        found = events[0].position
        for e in sorted(with_passes, key=_position):
            if e.data.at > at:
                break
            found = e.position
        return found

    def at_time(self, run_id: str, at: int) -> ExecuteResult:
        """Return the run as it was at an epoch-ms time: after its last event recorded by then."""
        return self.at(run_id, self.position_at(run_id, at))

    def why(self, run_id: str) -> str:
        """Explain, from events alone, why a run or orchestration is in its state (O6).

        A fork's why names its lineage, root first, when it is a fork of a fork (F2). Its
        head names the status :meth:`list` shows; ``interrupted``, which no event records, is
        the listing's judgement of the owner now (T2, ADR 0088).
        """
        events = self.history(run_id)
        first = events[0].data
        interrupted = {
            r
            for r, s in self.summaries.read(self._organization).items()
            if s.status == "interrupted"
        }
        if isinstance(first, OrchestrationStarted):
            return explain_orchestration(
                run_id,
                events,
                lambda stream: self._seen(self._journal.stream(stream)),
                interrupted=interrupted,
            )
        chain = self.lineage(run_id) if isinstance(first, RunForked) else []
        return explain_run(run_id, events, chain, interrupted=run_id in interrupted)

    def lineage(self, run_id: str) -> builtins.list[Lineage]:
        """Return the chain of forks that led to a run, root first (F2)."""
        chain: builtins.list[Lineage] = []
        seen: set[str] = set()
        first: Event | None = self._first(run_id)  # a run id that is not a str is no run either
        current: str | None = run_id
        while current is not None and current not in seen:
            seen.add(current)
            data = (first if first is not None else self._first(current)).data
            first = None
            if isinstance(data, RunForked):
                chain.append(Lineage(run_id=current, forked_from=data.source, at=data.position))
                current = data.source
            else:
                chain.append(Lineage(run_id=current))
                current = None
        return chain[::-1]

    def list(
        self, status: Statuses = None, since: Since = None, limit: int | None = None
    ) -> builtins.list[RunSummary]:
        """Return a summary of each run and orchestration, oldest first (T2).

        Each :class:`RunSummary` is its run's id (a ``str``) carrying the summary as attributes,
        so the listing still serves where run ids are expected.

        From the run-summary projection: its stored copy plus the run events after it, never a
        read of every event of every run (ADR 0037). A runtime that may write stores the
        projection once it is :data:`SAVE_AFTER` events ahead of the stored copy.

        Args:
            status: keep only runs in this status (one of ``RUN_STATUSES``), or in any of
                several (a list or set of them).
            since: keep only runs active at or after this time: epoch ms, a ``datetime``
                (naive: UTC) or an ISO-8601 text. A run is active when its last event is at or
                after it, or when it is running now.
            limit: keep only the newest ``limit`` runs (by start), still oldest first.

        Raises:
            ValueError: a filter is not of the documented kind; the message names it.
        """
        filters = check_filters(status, since, limit)
        found = self.summaries.read(self._organization)
        if self.summaries_writable and self.summaries.unsaved >= SAVE_AFTER:
            self._save_summaries(0)
        return select(found.values(), filters)

    def summary(self, run_id: str) -> RunSummary:
        """Return one run's or orchestration's summary (T2), caught up with the journal.

        Raises:
            RunNotFound: no run or orchestration has that id.
        """
        found = self.summaries.read(self._organization).get(run_id)
        if found is None:
            raise no_run(run_id)
        return found

    def _save_summaries(self, min_events: int) -> None:
        try:
            self.summaries.save_if_behind(min_events)
        except Exception as exc:  # a cache: a read-only or full journal still answers
            log.warning("run summaries not stored (only a cache): %s", exc)

    def ids(self) -> builtins.list[str]:
        """Return the ids of every run and orchestration in the journal, oldest first."""
        topics = [*topics_of(RunStarted), *topics_of(RunForked), *topics_of(OrchestrationStarted)]
        firsts = [e for e in self._journal.read(topics=topics) if e.version == 1]
        boundary = self.boundary
        return [e.stream for e in firsts if boundary is None or not boundary.learn_run(e)]


def _position(event: Event) -> int:
    return event.position


def check_position(position: object, name: str = "position") -> None:
    """Refuse a journal position that is not an int (a bool, a float, a string, None)."""
    if not isinstance(position, int) or isinstance(position, bool):
        raise TypeError(
            f"{name}: a journal position is an int, got {type(position).__name__} {position!r}"
        )


_ORCHESTRATION_TAG = tag_of(OrchestrationStarted)
_OPENING_TAGS = frozenset(tag_of(cls) for cls in (RunStarted, RunForked, OrchestrationStarted))
"""The tags of the events a run's or an orchestration's stream starts with."""


def opens_run(head: tuple[int, str] | None) -> bool:
    """Tell whether a stream's head (``Journal.head``) opens a run or an orchestration."""
    return head is not None and head[1] in _OPENING_TAGS


def no_run(run_id: str) -> RunNotFound:
    """The one answer for an id that opens no run here: never used, another organization's, or
    a stream of another kind (a fact's), told apart by nothing the journal holds (R1, ADR 0017).
    An id shaped as a fact's gets a hint from its shape alone."""
    hint = ""
    if isinstance(run_id, str) and run_id.startswith(FACT_ID_PREFIX):
        hint = f" (ids starting {FACT_ID_PREFIX!r} name facts, not runs: see `memory why`)"
    return RunNotFound(f"no run {short(run_id)} in this journal{hint}")


def check_head(run_id: str, head: tuple[int, str] | None) -> None:
    """Raise RunNotFound unless a stream's head (``Journal.head``) opens a run or an
    orchestration; as :func:`check_run`, without decoding the first event."""
    if head is None or head[1] not in _OPENING_TAGS:
        raise no_run(run_id)


def check_run(run_id: str, first: Event | None) -> None:
    """Raise RunNotFound unless ``first`` opens a run or an orchestration."""
    if first is None or not isinstance(first.data, RunStarted | RunForked | OrchestrationStarted):
        raise no_run(run_id)
