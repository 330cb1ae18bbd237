"""Forks and provenance of runs: ``rt.runs`` fork, lineage, compare, stale and refresh.

A fork is a new run whose first event names its source and position (F1-F3, ADR 0032); staleness
is a projection of the memory reads runs journaled (P3, P4, ADR 0033). Neither executes anything:
``rt.resume`` runs a fork.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Collection, Mapping

import msgspec

from journaled.actors.errors import RunNotResumable
from journaled.actors.run_args import RUN_PREFIX, check_budget, new_run_id
from journaled.actors.run_reads import RunReads, check_run
from journaled.actors.steps import journalable
from journaled.events.base import Event, Pending
from journaled.events.codec import tag_of, topics_of
from journaled.events.errors import AppendRefused, ConcurrencyConflict
from journaled.events.fork import RunComparison, compare_states, downstream
from journaled.events.inputs import int_problem, short, text_problem
from journaled.events.journal import Journal
from journaled.events.orchestration import OrchestrationStarted, PassStarted
from journaled.events.plan_rules import step_problem
from journaled.events.plans import Plan, Step
from journaled.events.provenance import (
    Stale,
    carried_reads,
    forks_reads,
    read_events,
    stale_reads,
)
from journaled.events.redact import redact_data
from journaled.events.run_state import RunFold
from journaled.events.runs import (
    CarriedStep,
    MemoryRead,
    RunForked,
    RunPurged,
    StepFailed,
    StepRetrying,
    StepStarted,
    StepSucceeded,
    StepWaiting,
)

_FORKED = tag_of(RunForked)
"""The tag a fork's stream starts with."""

_APPENDS = 50
"""Appends of one fork tried while purges of other runs land before each (each is refused)."""
PURGE_TOPICS = tuple(topics_of(RunPurged))
"""A fork is refused when one of these lands after the read it copies from (R2)."""


class RunForks(RunReads):
    """The fork and provenance half of ``rt.runs``: new runs from old ones, never executed here."""

    def __init__(self, journal: Journal, clock: Callable[[], int]) -> None:
        super().__init__(journal, clock)
        self._clock = clock
        self.catch_up_memory: Callable[[], object] | None = None
        """Fold into memory what other processes appended (the runtime's ``refresh``), called
        before a resumed run's steps read it (P4)."""
        self.hidden_fact: Callable[[str], bool] = lambda _: False
        """Names facts this runtime must not see (another organization's, R1): ``stale`` skips
        them. The runtime sets it from its memory's tenant boundary."""

    def fork(
        self,
        run_id: str,
        at: int | None = None,
        *,
        replace: Mapping[str, Step] | None = None,
        answers: Mapping[str, str] | None = None,
        call_budget: int | None = None,
    ) -> str:
        """Create a run from another's state at a journal position; return its id (F1, F2).

        Steps succeeded at ``at`` (default: now) keep their observations and never run again;
        every other step is pending, and so is each replaced step and everything downstream of
        it. Reads the journal only: the source may be executing elsewhere, and is never
        modified. Nothing runs until ``rt.resume(new_id)``.
        """
        return self._fork(run_id, at, replace, answers, call_budget)

    def _fork(
        self,
        run_id: str,
        at: int | None,
        replace: Mapping[str, Step] | None,
        answers: Mapping[str, str] | None,
        call_budget: int | None,
        unheld: Collection[str] = (),
        *,
        carried_budget: bool = False,
    ) -> str:
        """Fork as :meth:`fork` says; ``unheld`` names steps whose held answers are not kept.

        ``carried_budget``: ``call_budget`` is the source's own, carried over (``refresh``), not
        the caller's: below the calls the fork carries (a step overran it, R6), the fork is
        made as the source stands, out of budget, rather than refused.
        """
        first = self._first(run_id)
        if isinstance(first.data, OrchestrationStarted):
            raise ValueError(
                f"run_id {run_id} is an orchestration: fork one of its pass runs instead "
                "(`runs history` names them at each pass-started)"
            )
        end = self._journal.position()
        if at is None:
            at = end
        elif int_problem(at, low=0):
            raise ValueError(f"at must be a journal position (an int >= 0), got {short(at)}")
        if at < first.position:
            raise ValueError(
                f"at {at} is before run {run_id} began (its first event is at {first.position})"
            )
        if at > end:
            raise ValueError(f"at {at} is past the end of the journal ({end})")
        if self.state(run_id).purged is not None:
            raise RunNotResumable(f"run {run_id} was purged: its inputs are gone, it cannot fork")
        events = self._journal.stream(run_id, upto=at)
        state = RunFold()
        state.apply_all(events)
        charged = self._kept_charges(run_id, events, {run_id})
        started = state.started
        assert started is not None
        budget = check_budget("call_budget", call_budget) if call_budget is not None else None
        steps = dict(state.steps)
        replaced = self._replacements(run_id, steps, replace)
        steps.update(replaced)
        plan_steps = [steps[i] for i in state.order]
        repended = downstream(plan_steps, replaced)
        fresh = _fork_answers(run_id, at, state.waiting, answers)
        # Answers given before `at` (with an earlier fork, or to a resume whose step had not
        # finished by then) are the source's state there: a step that runs again gets its
        # answer as it would have in the source (F1). Not a step a replacement re-pends: its
        # question may be another. An answer given with this fork replaces one held.
        held = {
            i: a
            for i, a in state.answers.items()
            if state.status.get(i, "succeeded") != "succeeded"
            and i not in repended
            and i not in unheld
        }
        given = {**held, **fresh}
        asked = [i for i in state.order if i in state.waiting or i in held]
        kept = {o.step_id: o for o in state.observations if state.status[o.step_id] == "succeeded"}
        carried = tuple(
            CarriedStep(observation=kept[i], charged=charged.get(i, 0))
            for i in state.order
            if state.status[i] == "succeeded" and i not in repended and i in kept
        )
        carried_calls = sum(c.charged for c in carried)
        if budget is not None and budget < carried_calls and not carried_budget:
            # As resume refuses it: the fork would stop for budget at once, reading "3 of 2".
            raise ValueError(
                f"call_budget must be at least the {carried_calls} model call(s) the fork "
                f"carries (calls used carry over), got {budget}"
            )
        now = self._clock()
        new_id = new_run_id(now)
        plan = Plan(
            goal=started.plan.goal,
            steps=[msgspec.structs.replace(s, status="pending") for s in plan_steps],
            id=new_id.replace(RUN_PREFIX, "plan_", 1),
        )
        opening = msgspec.structs.replace(
            started,
            at=now,
            run_id=new_id,
            plan=plan,
            call_budget=budget if call_budget is not None else state.budget,
            parent_run=None,
            parent_step=None,
            parent_call=None,
            owner="",
            reserve=state.reserve,
            organization=self._organization,  # the fork is this runtime's (ADR 0074)
        )
        forked = RunForked(
            at=now,
            run_id=new_id,
            source=run_id,
            position=at,
            started=opening,
            carried=carried,
            replaced=tuple(i for i in state.order if i in replaced),
            repended=tuple(repended),
            answers=given,
            questions={i: state.questions[i] for i in asked if i in state.questions},
            budget_from=state.budget,
            # Still waiting there (E10): a resume or a fork of the fork may answer them. Not a
            # step a replacement re-pends (its question may be another) or one answered here.
            waiting=tuple(i for i in state.waiting if i not in repended and i not in fresh),
        )
        # Redacted as every other run event is where it is staged (M9, ADR 0018): the
        # replacements' inputs and the answers given here are new content.
        forked = forked.map_content(redact_data)
        opening_event = [Pending(stream=new_id, version=1, data=forked)]
        for _ in range(_APPENDS):
            try:
                # Not after a purge of the source since `end`: it erased what this fork copies
                # (R2). The purge's own guard refuses it when this fork lands first (it then
                # reads the family again, this fork included).
                self._journal.append(opening_event, refuse_after=(end, PURGE_TOPICS))
            except AppendRefused:
                upto = self._journal.position()
                purges = self._journal.read(after=end, upto=upto, topics=PURGE_TOPICS)
                if any(e.stream == run_id for e in purges):
                    raise RunNotResumable(
                        f"run {run_id} was purged: its inputs are gone, it cannot fork"
                    ) from None
                end = upto  # other runs' purges alone: what was copied is still there
                continue
            except ConcurrencyConflict:
                # The id is new: only this append writes it. A connection lost after its
                # commit, and retried, finds it there.
                if self._journal.head(new_id) is None:
                    raise
            return new_id
        raise ConcurrencyConflict(
            [], f"other runs were purged at each try to fork run {run_id}; nothing was stored"
        )

    def _kept_charges(
        self, run_id: str, events: builtins.list[Event], seen: set[str]
    ) -> dict[str, int]:
        """Return what each step succeeded in these events of a run was charged (F1, R6).

        A step that ran here has what each of its attempts was charged: its
        ``step-succeeded``'s, and those of the attempts that failed and were retried or that
        waited for the answer it succeeded with (the work its output rests on, ADR 0083's
        update). A step the run carried, as a fork, has the charge its ``run.forked``
        recorded, so calls carry over through forks of forks. A fork of a fork stored before
        ADR 0083 recorded 0 for the steps it carried in turn: a 0 of a step that is not a
        tool's, in a fork whose source is a fork too, is looked up in that source, up to the
        fork's position (``seen``: the runs walked).
        """
        charged: dict[str, int] = {}
        for event in events:
            data = event.data
            if isinstance(data, StepSucceeded | StepRetrying | StepWaiting | StepFailed):
                charged[data.step_id] = charged.get(data.step_id, 0) + data.charged
            elif isinstance(data, RunForked):
                charged.update(self._carried_charges(data, seen))
        return charged

    def _carried_charges(self, forked: RunForked, seen: set[str]) -> dict[str, int]:
        """Return the charge of each step a fork carried, repaired as :meth:`_kept_charges` says."""
        charged = {c.observation.step_id: c.charged for c in forked.carried}
        doubtful = [c.observation.step_id for c in forked.carried if _maybe_lost(c)]
        source = forked.source
        if not doubtful or source in seen:
            return charged
        head = self._journal.head(source)  # a fork of a fork: the source is read only then
        if head is None or head[1] != _FORKED:
            return charged
        events = self._journal.stream(source, upto=forked.position)
        origin = self._kept_charges(source, events, seen | {source})
        for step_id in doubtful:
            charged[step_id] = origin.get(step_id, 0)
        return charged

    def _replacements(
        self, run_id: str, steps: dict[str, Step], replace: Mapping[str, Step] | None
    ) -> dict[str, Step]:
        """Check ``replace`` against the source's steps; return the normalised replacements."""
        if replace is None:
            return {}
        if not isinstance(replace, Mapping):
            raise ValueError(
                f"replace must be a dict {{step_id: Step}}, got {type(replace).__name__}"
            )
        out: dict[str, Step] = {}
        for step_id, step in replace.items():
            where = f"replace[{step_id!r}]"
            if step_id not in steps:
                raise ValueError(
                    f"{where}: run {run_id} has no step {step_id!r} (its steps: {', '.join(steps)})"
                )
            if not isinstance(step, Step):
                raise ValueError(f"{where} must be a journaled.Step, got {type(step).__name__}")
            old = steps[step_id]
            if step.id != step_id:
                raise ValueError(f"{where}.id must stay {step_id!r}, got {short(step.id)}")
            if step.kind is None:
                raise ValueError(f"{where} must name exactly one of skill, tool or agent")
            # Checked as a plan's step is (E1): journaled as given, a name that is not one
            # text would make the fork's first event unreadable.
            problem = step_problem(step)
            if problem:
                raise ValueError(f"{where}: {problem}")
            # A replacement that names no dependencies keeps the step's (F1, ADR 0084).
            if step.depends_on and sorted(step.depends_on) != sorted(old.depends_on):
                raise ValueError(
                    f"{where}.depends_on must stay {sorted(old.depends_on)}, "
                    f"got {sorted(step.depends_on)}: a fork keeps a step's dependencies; "
                    "leave depends_on out to keep them"
                )
            try:
                data = journalable(step.input, "its input")
            except ValueError as exc:
                raise ValueError(f"{where}.input: {exc}") from exc
            out[step_id] = msgspec.structs.replace(
                step, input=data, depends_on=list(old.depends_on), status="pending"
            )
        return out

    def compare(self, run_a: str, run_b: str) -> RunComparison:
        """Compare two runs step by step: status and output in each, and calls used (F3)."""
        for name, rid in (("run_a", run_a), ("run_b", run_b)):
            if isinstance(self._first(rid).data, OrchestrationStarted):
                raise ValueError(f"{name} {rid} is an orchestration: compare its pass runs")
        return compare_states(run_a, self.state(run_a), run_b, self.state(run_b))

    # -- provenance (P3, P4) ----------------------------------------------------------------------

    def stale(self, run_id: str | None = None) -> builtins.list[Stale]:
        """Return the steps whose read facts were since superseded, deleted, purged or expired (P3).

        For one run, or every run when ``run_id`` is None; expiry is judged at the clock's now.
        A projection of the journal alone: any process answers the same.

        Raises:
            RunNotFound: ``run_id`` names no run.
        """
        carried: list[tuple[Event, str]] = []
        if run_id is None:
            reads = read_events(self._journal)
            for fork, event, source in forks_reads(self._journal, reads):
                carried.append((msgspec.structs.replace(event, stream=fork), source))
            reads += [e for e, _ in carried]
        else:
            first = self._journal.first(run_id) if isinstance(run_id, str) else None
            check_run(run_id, first)
            assert first is not None
            self._check_here(run_id, first)
            if isinstance(first.data, OrchestrationStarted):
                # Its steps run, and read, in its pass runs: theirs are its stale steps.
                return [s for p in self._passes(run_id) for s in self.stale(p)]
            reads = [e for e in self._journal.stream(run_id) if isinstance(e.data, MemoryRead)]
            if isinstance(first.data, RunForked):
                carried = carried_reads(self._journal, first.data, {run_id}, self._recorded_reads)
                reads += [msgspec.structs.replace(e, stream=run_id) for e, _ in carried]
        origin = {e.position: source for e, source in carried}
        if run_id is None and self.boundary is not None:
            here = self.boundary
            reads = [e for e in reads if not here.run_elsewhere(e.stream)]  # ADR 0074
        return stale_reads(reads, self._journal.stream, self._clock(), self.hidden_fact, origin)

    def _passes(self, run_id: str) -> builtins.list[str]:
        """Return an orchestration's pass runs, in the order they began."""
        passes = (
            e.data.run for e in self._journal.stream(run_id) if isinstance(e.data, PassStarted)
        )
        return list(dict.fromkeys(passes))

    def _recorded_reads(self, run_id: str, upto: int) -> builtins.list[Event]:
        """Return the read events a run recorded up to a journal position."""
        stream = self._journal.stream(run_id, upto=upto)
        return [e for e in stream if isinstance(e.data, MemoryRead)]

    def refresh(self, run_id: str) -> str:
        """Fork the run just before its earliest stale step (P4); return the new run's id.

        The fork is at the journal position just before the start of the earliest stale
        attempt, under F1's rules: the steps succeeded there keep their outputs, and every
        other step (the stale ones, their dependents, whatever had not succeeded by then) is
        pending. A stale step that a fork carried from its source succeeded before the fork
        began: the fork is then at the run's first position, that step replaced by its own
        definition, so it and its dependents re-pend (F1). The run's latest call budget
        carries over, as do its calls used (ADR 0086). The new run is not executed:
        ``rt.resume(new_id)`` runs it against today's memory.

        Raises:
            RunNotFound: ``run_id`` names no run.
            ValueError: the run has no stale step.
        """
        if not isinstance(run_id, str):
            check_run(run_id, None)  # None would ask for every run's stale steps
        found = self.stale(run_id)
        if isinstance(self._first(run_id).data, OrchestrationStarted):
            where = ", ".join(dict.fromkeys(s.run_id for s in found)) or "none has a stale step"
            raise ValueError(
                f"run_id {run_id} is an orchestration: refresh one of its pass runs instead, "
                f"where its steps ran and read memory (pass runs with stale steps: {where})"
            )
        if not found:
            raise ValueError(f"run_id: run {run_id!r} has no stale step to refresh")
        at, carried = refresh_point(self._journal.stream(run_id), found)
        state = self.state(run_id)
        replace = {i: state.steps[i] for i in carried if i in state.steps}
        # fork (F1) owns the fork rules; refresh only chooses where, and what a fork carried.
        # A stale step's answer was given to a question asked against what it read: it asks
        # again (ADR 0086's update). The resume that runs it folds memory up to the journal
        # first (P4).
        stale_steps = {s.step_id for s in found}
        return self._fork(
            run_id, at, replace or None, None, state.budget, stale_steps, carried_budget=True
        )


def refresh_point(
    events: builtins.list[Event], found: builtins.list[Stale]
) -> tuple[int, builtins.list[str]]:
    """Return where ``refresh`` forks a run, and the carried stale steps it replaces (P4).

    ``events`` are the run's stream, ``found`` its stale reads. A stale read in the stream
    began with its attempt's ``run.step-started``: the fork is just before the earliest such
    start. A stale read of its source's (a fork's carried step, ADR 0062) has no start here:
    the fork is then at the run's first event, and those steps are returned to be replaced.
    """
    reads = {e.position: e.data for e in events if isinstance(e.data, MemoryRead)}
    starts = {
        (e.data.step_id, e.data.attempt): e.position
        for e in events
        if isinstance(e.data, StepStarted)
    }
    begins: builtins.list[int] = []
    carried: builtins.list[str] = []
    for stale in found:
        read = reads.get(stale.position)
        start = starts.get((read.step_id, read.attempt)) if read is not None else None
        if start is not None:
            begins.append(start)
        elif stale.step_id not in carried:
            carried.append(stale.step_id)
    if carried or not begins:
        return events[0].position, carried
    return min(begins) - 1, []


def _maybe_lost(carried: CarriedStep) -> bool:
    """Tell whether a carried step's 0 may be a charge an earlier release lost (ADR 0083).

    A tool step is free (E8), so its 0 is its charge; a skill's or an agent's may not be.
    """
    return carried.charged == 0 and carried.observation.tool is None


def _fork_answers(
    run_id: str, at: int, waiting: list[str], answers: Mapping[str, str] | None
) -> dict[str, str]:
    """Check the answers a fork gives: only to steps waiting at ``at``, as text (F1)."""
    if answers is None:
        return {}
    if not isinstance(answers, Mapping):
        raise ValueError(
            f"answers must be a dict {{step_id: answer}}, got {type(answers).__name__}"
        )
    for step_id, answer in answers.items():
        if step_id not in waiting:
            raise ValueError(
                f"answers[{step_id!r}]: that step of run {run_id} was not waiting for an answer "
                f"at {at} (waiting then: {', '.join(waiting) or 'none'})"
            )
        problem = text_problem(answer, empty=False)  # a clarification, as resume's (O4)
        if problem:
            raise ValueError(f"answers[{step_id!r}] {problem}")
    return dict(answers)
