"""Runs at a glance (SPEC T2): a projection of one summary per run and orchestration.

The projection folds only run and orchestration events, keeps per run what a listing shows
(status, goal, start, last event, steps done / total, calls used, lineage), and is stored as a
snapshot beside the journal (key :data:`SUMMARIES_KEY`) together with the journal position it
reached: a reader restores it and folds only the run events after that position (ADR 0037).

The snapshot is a cache, never the truth: a missing, unreadable or other-schema one is folded
from the start. It holds goals (run content), so a run purge blanks it in its own transaction
and a snapshot folded before a purge is never stored after it (R2).

One status is not folded but judged when read: time passing appends no event, so whether a
``running`` run's owner is still executing it is asked at each read, from its owner, its last
event (heartbeats included) and the reader's clock (:attr:`RunSummaries.owner_gone`); a run
whose owner stopped without ending it reads ``interrupted`` (ADR 0088).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterable
from typing import Literal, get_args

import msgspec
from msgspec import UNSET, UnsetType

from journaled.events.base import Event
from journaled.events.codec import tag_of, topics_of
from journaled.events.compressed import deflate, inflate
from journaled.events.inputs import epoch_ms, iso_ms
from journaled.events.journal import Journal
from journaled.events.orchestration import (
    ORCHESTRATION_EVENTS,
    ApprovalRequested,
    BudgetAwaited,
    BudgetGiven,
    ClarificationRequested,
    OrchestrationEnded,
    OrchestrationResumed,
    OrchestrationStarted,
    OrchestrationSuspended,
    PassStarted,
    PlanProposed,
)
from journaled.events.run_state import forked_waiting
from journaled.events.runs import (
    RUN_EVENTS,
    BudgetRaised,
    RunFinished,
    RunForked,
    RunPurged,
    RunResumed,
    RunStarted,
    RunSuspended,
    StepFailed,
    StepRetrying,
    StepsSkipped,
    StepStarted,
    StepSucceeded,
    StepWaiting,
    WavePartitioned,
)
from journaled.events.tenancy import run_belongs_elsewhere, run_organization

SUMMARIES_KEY = "projection:run-summaries"
"""Snapshot key of the stored projection (one row beside the run snapshots)."""
SCHEMA = 7
"""Bump when the stored projection changes incompatibly: older ones are then refolded.
3: an orchestration's budget follows its resumes (2 kept the budget it started with).
4: each run keeps its organization (ADR 0074).
5: each run keeps its owner, so a read can judge it ``interrupted`` (ADR 0088).
6: an orchestration keeps the steps of its latest proposed plan (ADR 0088).
7: a fork lists the steps it waits on (``run.forked``'s ``waiting``)."""
EVERY = object()
"""``RunSummaries.read(EVERY)``: the runs of every organization (the projection's own view)."""
DEFAULT = object()
_RECHECKS = 4
"""How many times a read that judged a run ``interrupted`` folds what came since and judges
again before it answers (an owner may end its run, then stop, between fold and judgement)."""
SAVE_AFTER = 1000
"""A reader that may write stores the projection once it folded this many events past it."""
SummaryStatus = Literal[
    "running",
    "interrupted",
    "completed",
    "failed",
    "cancelled",
    "suspended",
    "forked",
    "waiting_for_budget",
    "waiting_for_input",
    "waiting_for_clarification",
    "waiting_for_approval",
    "dry_run",
    "purged",
]
"""A run summary's status, as a type (the MCP server's schema names them from it)."""
RUN_STATUSES: tuple[str, ...] = get_args(SummaryStatus)
"""Every status a summary can have; ``runs.list(status=...)`` accepts these. ``forked``: a fork
not yet resumed (F1); ``running``: started or resumed and not settled, its owner executing it
as far as can be told; ``interrupted``: not settled, but its owner stopped without ending it
(its process is gone, or it was silent past the lease): resumable (E14), judged when read
(ADR 0088)."""
OwnerGone = Callable[[str, str, int], bool]
"""``owner_gone(run_id, owner, last_at)``: whether an unsettled run's ``owner`` (``host/pid/
start-time``) has stopped executing it, its last event (heartbeats included) being at
``last_at`` epoch ms. Asked at each read, with the reader's clock (ADR 0088)."""
_FINISHED = {
    "completed": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
    "waiting": "waiting_for_input",
    "stopped_for_budget": "waiting_for_budget",
}
_SETTLED_STEP = frozenset({"succeeded", "failed", "skipped"})
_PURGED_TOPIC = tag_of(RunPurged) + "@"
TOPICS: tuple[str, ...] = tuple(
    t for cls in (*RUN_EVENTS, *ORCHESTRATION_EVENTS) for t in topics_of(cls)
)
"""Every stored topic the projection folds: the rest of the journal is never even decoded."""


_FIELDS: tuple[tuple[str, object], ...] = (
    ("kind", "run.started"),
    ("status", "running"),
    ("goal", ""),
    ("started_at", 0),
    ("started_position", 0),
    ("last_event", ""),
    ("last_at", 0),
    ("last_position", 0),
    ("steps_done", 0),
    ("steps_total", 0),
    ("calls_used", 0),
    ("call_budget", None),
    ("wave", 0),
    ("running", ()),
    ("waiting", ()),
    ("parent_run", None),
    ("parent_step", None),
    ("forked_from", None),
    ("forked_at", None),
    ("orchestration", None),
    ("pass_no", None),
    ("current_run", None),
)


class RunSummary(str):
    """One run or orchestration at a glance (T2), as ``rt.runs.list()`` returns it.

    It *is* its run id (a ``str`` equal to, hashing and sorting as the id), so code that treats
    ``runs.list()`` as a list of ids (``run_id in rt.runs.list()``, ``rt.runs.why(summary)``)
    keeps working, and it carries the run's summary as read-only attributes. Against a plain
    string it compares as its id; against another summary, by everything it says (two
    summaries of one run taken before and after a step differ). ``as_dict()`` is the JSON shape
    of ``journaled runs list --json``.
    """

    run_id: str
    kind: str
    """The run's first event: ``run.started``, ``run.forked`` or ``orchestration.started``."""
    status: str
    """One of :data:`RUN_STATUSES`."""
    goal: str
    """The plan's (or orchestration's) goal; empty once the run was purged."""
    started_at: int
    """Epoch ms of its first event."""
    started_position: int
    last_event: str
    """Tag of its latest event, e.g. ``run.step-succeeded``."""
    last_at: int
    last_position: int
    steps_done: int
    """Steps settled (succeeded, failed or skipped); for an orchestration, of its latest pass."""
    steps_total: int
    calls_used: int
    """Calls charged; for an orchestration, over all its passes."""
    call_budget: int | None
    wave: int
    """The latest wave partitioned (numbered from 1; 0 before the first)."""
    running: tuple[str, ...]
    """Steps started and not yet settled."""
    waiting: tuple[str, ...]
    """Steps waiting for an answer (E10)."""
    parent_run: str | None
    """A sub-agent's run: the run whose agent step started it (E9)."""
    parent_step: str | None
    forked_from: str | None
    """A fork: the run it was forked from (F2) ..."""
    forked_at: int | None
    """... and the journal position it was forked at."""
    orchestration: str | None
    """A pass of an orchestration: that orchestration (ADR 0010)."""
    pass_no: int | None
    """A pass: its number; an orchestration: the number of passes started."""
    current_run: str | None
    """An orchestration: the run of its latest pass."""

    def __new__(cls, run_id: str, **fields: object) -> RunSummary:
        """Build the summary of run ``run_id``; every other field is a keyword."""
        unknown = set(fields) - {name for name, _ in _FIELDS}
        if unknown:
            raise TypeError(f"RunSummary has no field {sorted(unknown)[0]!r}")
        self = super().__new__(cls, run_id)
        attrs = self.__dict__
        attrs["run_id"] = str(run_id)
        for name, default in _FIELDS:
            attrs[name] = fields.get(name, default)
        return self

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RunSummary):
            return self.__dict__ == other.__dict__
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return str.__hash__(self)  # equal summaries, and a summary and its id, share the id

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a RunSummary is read-only (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a RunSummary is read-only (cannot delete {name!r})")

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (self.as_dict(),))

    def __repr__(self) -> str:
        return (
            f"RunSummary({self.run_id!r}, kind={self.kind!r}, status={self.status!r}, "
            f"steps={self.steps_done}/{self.steps_total}, calls_used={self.calls_used})"
        )

    def as_dict(self) -> dict[str, object]:
        """Return every field by name; ``at`` repeats ``started_at``, as earlier listings had it."""
        out: dict[str, object] = {"run_id": self.run_id}
        out.update((name, self.__dict__[name]) for name, _ in _FIELDS)
        out["at"] = self.started_at
        return out


def _rebuild(fields: dict[str, object]) -> RunSummary:
    fields = dict(fields)
    fields.pop("at", None)
    run_id = fields.pop("run_id")
    assert isinstance(run_id, str)
    return RunSummary(run_id, **fields)


class _Tracked(msgspec.Struct, kw_only=True):
    """The mutable fold of one stream; what the stored projection holds per run."""

    kind: str
    goal: str = ""
    started_at: int = 0
    started_position: int = 0
    last_event: str = ""
    last_at: int = 0
    last_position: int = 0
    steps: dict[str, str] = msgspec.field(default_factory=dict)
    calls_used: int = 0
    call_budget: int | None = None
    wave: int = 0
    waiting: list[str] = msgspec.field(default_factory=list)
    finished: str | None = None
    suspended: bool = False
    resumed: bool = False
    purged: bool = False
    parent_run: str | None = None
    parent_step: str | None = None
    forked_from: str | None = None
    forked_at: int | None = None
    passes: list[str] = msgspec.field(default_factory=list)
    asked: str | None = None
    """An orchestration: the request it waits on (clarification, approval, budget)."""
    ended: str | None = None
    organization: str | UnsetType | None = UNSET
    """The organization whose run it is (ADR 0074): only its runtimes list it (UNSET: a run
    of an earlier release, listed to all)."""
    owner: str = ""
    """The process that started or last resumed (or drove) it; empty before owners."""
    planned: list[str] = msgspec.field(default_factory=list)
    """An orchestration: the step ids of its latest proposed plan ..."""
    planned_pass: int = 0
    """... and the pass it was proposed for (a pass not started yet shows them pending)."""


class _Stored(msgspec.Struct, kw_only=True):
    schema: int
    position: int
    runs: dict[str, _Tracked]


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(_Stored)


def _decode(stored: bytes) -> _Stored:
    return _DECODER.decode(inflate(stored))


def _start(data: RunStarted, tracked: _Tracked) -> None:
    tracked.goal = data.plan.goal
    tracked.owner = data.owner
    tracked.call_budget = data.call_budget
    tracked.parent_run = data.parent_run
    tracked.parent_step = data.parent_step
    tracked.steps = dict.fromkeys((s.id for s in data.plan.steps), "pending")


def _fold_run(tracked: _Tracked, event: Event) -> None:
    data = event.data
    match data:
        case RunForked():
            _start(data.started, tracked)
            tracked.forked_from = data.source
            tracked.forked_at = data.position
            # The steps the fork waits on, as the source had them (E10); an earlier release's
            # fork did not say them, and its questions and answers tell them (ADR 0032).
            tracked.waiting = (
                list(data.waiting) if data.waiting is not None else forked_waiting(data)
            )
            for carried in data.carried:
                tracked.calls_used += carried.charged
                tracked.steps[carried.observation.step_id] = "succeeded"
        case WavePartitioned():
            tracked.wave = data.wave
            for step_id in (*(o.step_id for o in data.skipped), *data.unobserved):
                tracked.steps[step_id] = "skipped"
        case StepStarted():
            tracked.wave = data.wave  # its partition may be left out as implied (ADR 0035)
            tracked.steps[data.step_id] = "running"
        case StepSucceeded() | StepFailed():
            tracked.calls_used += data.charged
            tracked.steps[data.step_id] = (
                "succeeded" if isinstance(data, StepSucceeded) else "failed"
            )
        case StepRetrying():
            tracked.calls_used += data.charged
        case StepWaiting():
            tracked.calls_used += data.charged
            tracked.steps[data.step_id] = "pending"
            if data.step_id not in tracked.waiting:
                tracked.waiting.append(data.step_id)
        case StepsSkipped():
            for step_id in (*(o.step_id for o in data.observations), *data.unobserved):
                tracked.steps[step_id] = "skipped"
        case BudgetRaised():
            tracked.call_budget = data.budget
        case RunResumed():
            tracked.owner = data.owner or tracked.owner
            tracked.resumed = True
            tracked.finished = None
            tracked.suspended = False
            tracked.waiting = []
            for step_id in data.rerun:
                tracked.steps[step_id] = "pending"
        case RunFinished():
            tracked.finished = data.status
        case RunSuspended():
            tracked.suspended = True
        case _:
            pass  # heartbeats, cancel requests, answers, overruns and reads change no summary


def _fold_orchestration(tracked: _Tracked, event: Event) -> None:
    data = event.data
    match data:
        case PlanProposed():
            tracked.planned = [step.id for step in data.plan.steps]
            tracked.planned_pass = data.pass_no
        case PassStarted():
            tracked.passes.append(data.run)
            tracked.asked = None
        case ClarificationRequested():
            tracked.asked = "waiting_for_clarification"
        case ApprovalRequested():
            tracked.asked = "waiting_for_approval"
        case BudgetAwaited():
            tracked.asked = "waiting_for_budget"
        case OrchestrationSuspended():
            tracked.suspended = True
        case OrchestrationResumed():
            tracked.owner = data.owner or tracked.owner
            tracked.asked = None
            tracked.ended = None
            tracked.suspended = False
            if data.budget is not None:  # raised by the resume (O3)
                tracked.call_budget = data.budget
        case BudgetGiven():  # an older release's raise
            tracked.call_budget = data.budget
        case OrchestrationEnded():
            tracked.ended = data.status
        case _:
            pass


def fold(runs: dict[str, _Tracked], event: Event) -> None:
    """Fold one run or orchestration event into the summaries (pure: no clock, no reads)."""
    data = event.data
    tracked = runs.get(event.stream)
    if tracked is None:
        if isinstance(data, RunStarted | RunForked):
            tracked = runs[event.stream] = _Tracked(kind="run")
        elif isinstance(data, OrchestrationStarted):
            tracked = runs[event.stream] = _Tracked(kind="orchestration")
        else:
            return  # not a run's stream (or one whose start this journal does not hold)
        tracked.started_at = data.at
        tracked.started_position = event.position
        owner = run_organization(data)
        tracked.organization = owner if owner is None or isinstance(owner, str) else UNSET
    tracked.last_event = event.kind
    tracked.last_at = data.at
    tracked.last_position = event.position
    match data:
        case RunStarted():
            _start(data, tracked)
        case OrchestrationStarted():
            tracked.goal = data.goal
            tracked.call_budget = data.call_budget
            tracked.owner = data.owner
        case RunPurged():
            tracked.purged = True
            tracked.goal = ""
        case _ if tracked.kind == "orchestration":
            _fold_orchestration(tracked, event)
        case _:
            _fold_run(tracked, event)


def _run_status(tracked: _Tracked) -> str:
    if tracked.purged:
        return "purged"
    if tracked.finished is not None:
        return _FINISHED.get(tracked.finished, tracked.finished)
    if tracked.suspended:
        return "suspended"
    return "forked" if tracked.forked_from is not None and not tracked.resumed else "running"


def _summaries(
    runs: dict[str, _Tracked], owner_gone: OwnerGone | None = None
) -> dict[str, RunSummary]:
    """Return the summaries of the folded runs; ``owner_gone`` judges the ``running`` ones."""
    owner = {run: (orch, n) for orch, t in runs.items() for n, run in enumerate(t.passes, 1)}
    out: dict[str, RunSummary] = {}
    for run_id, t in runs.items():
        steps, calls, status = t.steps, t.calls_used, _run_status(t)
        running = tuple(s for s, v in t.steps.items() if v == "running")
        waiting, wave = tuple(t.waiting), t.wave
        orchestration, pass_no = owner.get(run_id, (None, None))
        current = t.passes[-1] if t.passes else None
        if t.kind == "orchestration":
            calls = sum(runs[r].calls_used for r in t.passes if r in runs)
            last = runs.get(current) if current is not None else None
            if t.planned_pass > len(t.passes) or last is None:
                # A settled plan whose pass has not started (it waits for approval or budget,
                # or is a dry run), or whose run has not begun: its steps, none done (T2).
                last = None
                steps = dict.fromkeys(t.planned, "pending")
            else:
                steps = last.steps
            running = tuple(s for s, v in steps.items() if v == "running")
            waiting, wave = (tuple(last.waiting), last.wave) if last is not None else ((), 0)
            pass_no = len(t.passes)
            status = _orchestration_status(t, runs.get(current) if current is not None else None)
        latest = t
        if t.kind == "orchestration":
            # Its passes' events are its own as much as its own events are (T2, as position_at
            # counts them): a pass still running keeps it active.
            for r in t.passes:
                if r in runs and runs[r].last_position > latest.last_position:
                    latest = runs[r]
        if (
            status == "running"
            and owner_gone is not None
            and t.owner
            and owner_gone(run_id, t.owner, latest.last_at)
        ):
            status = "interrupted"  # judged now, not folded: no event says time passed (0088)
        out[run_id] = RunSummary(
            run_id=run_id,
            kind=_first_event(t),
            status=status,
            goal=t.goal,
            started_at=t.started_at,
            started_position=t.started_position,
            last_event=latest.last_event,
            last_at=latest.last_at,
            last_position=latest.last_position,
            steps_done=sum(1 for v in steps.values() if v in _SETTLED_STEP),
            steps_total=len(steps),
            calls_used=calls,
            call_budget=t.call_budget,
            wave=wave,
            running=running,
            waiting=waiting,
            parent_run=t.parent_run,
            parent_step=t.parent_step,
            forked_from=t.forked_from,
            forked_at=t.forked_at,
            orchestration=orchestration,
            pass_no=pass_no,
            current_run=current,
        )
    return out


def _visible(runs: dict[str, _Tracked], organization: str | object | None) -> dict[str, _Tracked]:
    """Keep the runs an organization sees (its own and earlier releases'); EVERY: all."""
    if organization is EVERY:
        return runs
    return {
        r: t
        for r, t in runs.items()
        if not run_belongs_elsewhere(t.organization, organization)  # type: ignore[arg-type]
    }


def _first_event(t: _Tracked) -> str:
    if t.kind == "orchestration":
        return tag_of(OrchestrationStarted)
    return tag_of(RunForked) if t.forked_from is not None else tag_of(RunStarted)


def _orchestration_status(t: _Tracked, last: _Tracked | None) -> str:
    if t.purged:
        return "purged"
    if t.ended is not None:
        return t.ended
    if t.asked is not None:
        return t.asked
    if t.suspended:
        return "suspended"  # its own event says so (ADR 0087) ...
    if last is not None and last.suspended and last.finished is None:
        return "suspended"  # ... as, before it, its pass's suspension alone did (R3)
    return "running"


Statuses = str | Iterable[str] | None
"""``runs.list(status=...)``: one status, or several (a run in any of them is kept)."""
Since = int | dt.datetime | str | None
"""``runs.list(since=...)``: epoch ms, a ``datetime`` (naive: UTC), or an ISO-8601 text."""


class Filters(msgspec.Struct, frozen=True):
    """``runs.list``'s filters, checked and in one form: statuses, since (epoch ms), limit."""

    statuses: frozenset[str] | None = None
    since: int | None = None
    limit: int | None = None


def check_filters(status: object, since: object, limit: object) -> Filters:
    """Return ``runs.list``'s filters in one form, or reject a bad one with a one-line error
    naming the argument. ``status`` is read once (an iterator of statuses is used up).

    Raises:
        ValueError: ``status`` holds no known status, ``since`` is no time, ``limit`` not >= 1.
    """
    statuses, after = _statuses(status), _since_ms(since)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ValueError(f"limit: give a number of runs >= 1, got {limit!r}")
    return Filters(statuses, after, limit)


def _statuses(status: object) -> frozenset[str] | None:
    if status is None:
        return None
    given = [status] if isinstance(status, str) else status
    if isinstance(given, bytes | dict) or not isinstance(given, Iterable):
        raise ValueError(f"status: give a run status or several, got {status!r}")
    wanted = list(given)
    if not wanted:
        raise ValueError("status: give at least one run status (None: every run)")
    for one in wanted:
        if one not in RUN_STATUSES:
            raise ValueError(
                f"status: {one!r} is no run status; use one of {', '.join(RUN_STATUSES)}"
            )
    return frozenset(wanted)


def _since_ms(since: object) -> int | None:
    if since is None:
        return None
    if isinstance(since, str):
        ms = iso_ms(since)
        if ms is None:
            raise ValueError(
                f"since: cannot read the time {since!r}: give epoch milliseconds, a datetime or "
                "ISO 8601, e.g. 2026-11-30T07:00:00Z"
            )
        since = ms
    if isinstance(since, dt.datetime):
        since = epoch_ms(since)
    if not isinstance(since, int) or isinstance(since, bool) or since < 0:
        raise ValueError(
            f"since: give a time as epoch milliseconds (an int >= 0), a datetime or ISO 8601, "
            f"got {since!r}"
        )
    return since


EVERY_RUN = Filters()
"""No filter: every run."""


def select(summaries: Iterable[RunSummary], filters: Filters = EVERY_RUN) -> list[RunSummary]:
    """Filter summaries, oldest first (by start), as the journal has them.

    Its statuses keep runs in any of them; ``since`` keeps runs active at or after it: whose
    last event is at or after it, or that are running now (a run inside one long step appends
    nothing); ``limit`` keeps the newest ``limit`` of them.
    """
    wanted, after, limit = filters.statuses, filters.since, filters.limit
    kept = [
        s
        for s in summaries
        if (wanted is None or s.status in wanted)
        and (after is None or s.last_at >= after or s.status == "running")
    ]
    kept.sort(key=lambda s: s.started_position)
    return kept if limit is None else kept[-limit:]


def check_stored(journal: Journal, state: bytes) -> tuple[int, str] | None:
    """Compare a stored projection with a fold of the journal up to its position (R7).

    Returns:
        None when it matches (or is blank, unreadable or of another schema: a cache miss);
        else (its position, why it differs).
    """
    try:
        stored = _decode(state)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if stored.schema != SCHEMA:
        return None
    if stored.position > journal.position():
        return stored.position, "it claims a position past the journal's end"
    runs: dict[str, _Tracked] = {}
    for event in journal.read(upto=stored.position, topics=TOPICS):
        fold(runs, event)
    if runs == stored.runs:
        return None
    differ = sorted(set(runs) ^ set(stored.runs)) or sorted(
        r for r in runs if runs[r] != stored.runs[r]
    )
    return stored.position, f"the summary of run {differ[0]} differs"


class RunSummaries:
    """The run-summary projection of one journal: restored, caught up on read, stored on demand.

    Thread-safe. ``read()`` never writes; ``save()`` stores the projection (off the append path:
    a closing runtime, or a reader that may write, calls it).
    """

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self.visible_to: str | object | None = EVERY
        """Whose runs :meth:`read` returns by default: a runtime sets its organization, so its
        ``runs.summaries`` shows none of another's (ADR 0074); EVERY: all of them."""
        self.owner_gone: OwnerGone | None = None
        """Judges, at each read, whether a ``running`` run's owner stopped executing it (then
        it reads ``interrupted``); None: never judged. A runtime and the command line set it
        (``actors.ownership.owner_stopped`` with their clock, ADR 0088)."""
        self._lock = threading.Lock()
        self._runs: dict[str, _Tracked] | None = None
        self._position = 0
        self._stored = 0
        """The position of the stored projection this one started from (0: none)."""

    def _restore(self) -> None:
        found = self._journal.snapshot(SUMMARIES_KEY)
        self._runs, self._position = {}, 0
        if found is None or not found[1]:
            return
        try:
            stored = _decode(found[1])
        except (msgspec.DecodeError, msgspec.ValidationError):
            return  # a cache miss: fold from the start
        # A watermark past the journal's end (a copied or forged snapshot) would hide every run
        # appended below it: a cache miss.
        if (
            stored.schema == SCHEMA
            and stored.position == found[0]
            and stored.position <= self._journal.position()
        ):
            self._runs, self._position = stored.runs, stored.position
            self._stored = stored.position

    def _catch_up(self) -> dict[str, _Tracked]:
        if self._runs is None:
            self._restore()
        runs = self._runs
        assert runs is not None
        for event in self._journal.read(after=self._position, topics=TOPICS):
            fold(runs, event)
            self._position = event.position
        return runs

    @property
    def position(self) -> int:
        """Return the journal position the projection has folded up to."""
        return self._position

    @property
    def unsaved(self) -> int:
        """Return how far (in positions) the projection is ahead of the stored one."""
        return self._position - self._stored

    def read(self, organization: str | object | None = DEFAULT) -> dict[str, RunSummary]:
        """Catch up with the journal and return every run's summary by run id.

        ``organization`` (None included) keeps only that organization's runs, and those of
        earlier releases: to a runtime, another's are unknown (R1, ADR 0074). By default, those
        :attr:`visible_to`; :data:`EVERY` returns all.
        """
        if organization is DEFAULT:
            organization = self.visible_to
        with self._lock:
            runs = self._catch_up()
            for _ in range(_RECHECKS):
                found = _summaries(_visible(runs, organization), self.owner_gone)
                if all(s.status != "interrupted" for s in found.values()):
                    return found
                # An owner that ended its run and then stopped between the fold and the
                # judgement appended its last events before it stopped: they are in the journal
                # now. Fold them and judge again, so a run that ended is never interrupted.
                before = self._position
                runs = self._catch_up()
                if self._position == before:
                    return found
            return _summaries(_visible(runs, organization), self.owner_gone)

    def save_if_behind(self, min_events: int = SAVE_AFTER) -> bool:
        """Store the projection when the journal is ``min_events`` positions past the stored one."""
        with self._lock:
            if self._runs is None:
                self._restore()
            behind = self._journal.position() - self._stored
        return behind >= min_events and self.save()

    def save(self) -> bool:
        """Catch up and store the projection; False if a run purge came in between (R2)."""
        with self._lock:
            runs = self._catch_up()
            state = deflate(
                _ENCODER.encode(_Stored(schema=SCHEMA, position=self._position, runs=runs))
            )
            saved = self._journal.save_snapshot(
                SUMMARIES_KEY, self._position, state, unless_after=(_PURGED_TOPIC,)
            )
            if saved:
                self._stored = self._position
            else:
                self._runs = None  # a purge erased goals since: refold from what is stored
            return saved
