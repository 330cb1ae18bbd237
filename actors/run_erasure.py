"""Erasing a finished run's content from storage while its events keep their shape (R2).

Since version 2 of the run and orchestration events that carry content, the journal keeps that
content in its forgettable side table under ``<stream>@<version>`` (ADR 0018). Purging a run
deletes those rows, appends a ``run.purged`` event to each stream it reached in the same
transaction and blanks the runs' snapshots; the caller scrubs the files, as after a fact's purge
(ADR 0005, actors/scrubber.py).
"""

from __future__ import annotations

from collections.abc import Callable, Set

from journaled.actors.errors import RunNotPurgeable
from journaled.actors.run_reads import check_run
from journaled.events.base import Pending
from journaled.events.codec import topics_of
from journaled.events.errors import AppendRefused, ConcurrencyConflict
from journaled.events.journal import Journal
from journaled.events.orchestration import OrchestrationStarted
from journaled.events.orchestration_state import fold_orchestration
from journaled.events.redact import redact
from journaled.events.run_state import fold_run
from journaled.events.run_summaries import SUMMARIES_KEY
from journaled.events.runs import RunForked, RunPurged, RunStarted

__all__ = ["purge_run"]

_ATTEMPTS = 5
"""Family reads before giving up while forks of the run land at each (each is refused)."""
_APPENDS = 50
"""Appends of one family's purge tried while forks of other runs land before each."""
_FORK_TOPICS = tuple(topics_of(RunForked))
"""A purge is refused when one of these lands after it read the run's family (R2)."""


def purge_run(
    journal: Journal,
    run_id: str,
    reason: str,
    *,
    now: int,
    executing: Set[str] = frozenset(),
    elsewhere: Callable[[str], bool] | None = None,
) -> int:
    """Erase a finished run's content, and that of every run started under it or forked from it.

    The goal, step inputs, outputs, errors, agent data, questions, answers, clarifications and
    summaries of the run, of every run its agent steps started and, for an orchestration, of its
    passes (transitively) are deleted from the side table and scrubbed from the files; statuses,
    times, calls and step ids stay, and read as ``[purged]`` where content was. Each stream
    whose content is erased gets a ``run.purged`` event naming the reason, in the same
    transaction.

    Args:
        journal: The journal.
        run_id: The run or orchestration to purge.
        reason: Why, kept in the journal (redacted like all run data).
        now: The time of the purge, epoch ms.
        executing: Runs executing in this process now.
        elsewhere: Names runs of another organization (ADR 0074), which this purge may not touch.

    Returns:
        How many events had their content erased (0 when it already was).

    Raises:
        RunNotFound: no such run.
        RunNotPurgeable: the run was started by another run (purge that one), the run or one of
            its child runs is not finished, or an older release stored its content inside its
            events; nothing was appended.
        ValueError: the reason is not a non-empty string.
    """
    check_reason(reason)
    for _ in range(_ATTEMPTS):
        erased = _purge_once(journal, run_id, reason, now, executing, elsewhere)
        if erased is not None:
            return erased
    raise RunNotPurgeable(
        f"run {run_id}: runs were forked each time it was being purged; nothing was erased, "
        "try again"
    )


def check_reason(reason: object) -> None:
    """Raise ValueError unless a purge's reason is a non-empty string. A purge checks it before
    it looks at the run, so the answer is the same for every id (ADR 0074)."""
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("reason must be a non-empty string saying why the run is purged")


def _purge_once(
    journal: Journal,
    run_id: str,
    reason: str,
    now: int,
    executing: Set[str],
    elsewhere: Callable[[str], bool] | None,
) -> int | None:
    """Purge from what the journal holds now; None when a fork of the family landed after the
    family was read (it copies this run's content: the caller reads the family again)."""
    seen = journal.position()
    first = journal.first(run_id)
    check_run(run_id, first)
    assert first is not None
    if isinstance(first.data, RunStarted) and first.data.parent_run is not None:
        # A pass's plan is a copy of its orchestration's plan-proposed, and a child run feeds
        # its parent's observation: erasing the child alone would leave its content in storage.
        root = _root(journal, first.data.parent_run)
        raise RunNotPurgeable(
            f"run {run_id} was started by run {first.data.parent_run}, whose events hold its "
            f"content too; purge its root run {root}, which erases it with the rest"
        )
    streams = _family(journal, run_id)
    if elsewhere is not None and any(elsewhere(s) for s in streams):
        # Only a run of an earlier release, which every organization sees, has such a family.
        # Erasing it alone would leave its content in those runs' copies (R2); erasing them
        # would change another organization's runs; naming them would tell they exist.
        raise RunNotPurgeable(
            f"run {run_id} cannot be purged from here: runs forked from it or started under it "
            "belong to another organization, and keep copies of its content; nothing was erased"
        )
    busy = sorted(set(streams) & set(executing))
    if busy:
        raise RunNotPurgeable(
            f"run {run_id} is not finished: {', '.join(busy)} is executing in this runtime; "
            "wait for it or cancel it, then purge"
        )
    # The version each stream had when it was seen finished: run.purged goes right after it, so
    # a resume (or a child run it starts) appended since then makes the purge conflict instead
    # of succeeding on an executing run whose new child runs it never saw.
    checked = {stream: _check_finished(journal, run_id, stream) for stream in streams}
    pending: list[Pending] = []
    forget: list[str] = []
    for stream in streams:
        keys, inline, _last = journal.content_keys(stream)
        if inline:
            raise RunNotPurgeable(
                f"run {stream} was recorded by an older release that kept its content inside "
                f"its events (first at position {inline[0]}); erasing it would mean rewriting "
                "the journal, so it cannot be purged"
            )
        if not keys:
            continue
        forget += keys
        purged = RunPurged(at=now, reason=redact(reason), root=run_id, erased=len(keys))
        pending.append(Pending(stream=stream, version=checked[stream] + 1, data=purged))
    if not pending:
        return 0
    # A run's snapshot holds its content too: replace it with nothing (unreadable, so the next
    # read folds the events, which no longer carry content).
    blank = {p.stream: (p.version, b"") for p in pending}
    blank[SUMMARIES_KEY] = (0, b"")  # the run-summary projection holds goals (ADR 0037)
    family = set(streams)
    for _ in range(_APPENDS):
        try:
            # A fork landing after the family was read would keep copies of what is erased
            # (R2): the append is refused then, and the forks since are looked at.
            journal.append(
                pending, forget=forget, snapshots=blank, refuse_after=(seen, _FORK_TOPICS)
            )
        except AppendRefused:
            upto = journal.position()
            forks = journal.read(after=seen, upto=upto, topics=_FORK_TOPICS)
            if any(isinstance(e.data, RunForked) and e.data.source in family for e in forks):
                return None  # one copies this family: read it again, that fork included
            seen = upto  # other runs' forks alone: the family read is still whole
            continue
        except ConcurrencyConflict as exc:
            raise RunNotPurgeable(
                f"run {run_id} changed while it was being purged (another process appended to "
                "it); nothing was erased, try again"
            ) from exc
        return len(forget)
    raise RunNotPurgeable(
        f"run {run_id}: other runs were forked at each try to purge it; nothing was erased, "
        "try again"
    )


def _root(journal: Journal, run_id: str) -> str:
    """Return the run at the top of the chain of parents that ``run_id`` belongs to."""
    seen = {run_id}
    while True:
        first = journal.first(run_id)
        if first is None or not isinstance(first.data, RunStarted):
            return run_id
        parent = first.data.parent_run
        if parent is None or parent in seen:
            return run_id
        seen.add(parent)
        run_id = parent


def _family(journal: Journal, run_id: str) -> list[str]:
    """Return the run and every run started under it or forked from it, transitively.

    A fork holds copies of the outputs it kept from its source (ADR 0032): erasing the source
    alone would leave them in storage (R2).
    """
    children: dict[str, list[str]] = {}
    for event in journal.read(topics=[*topics_of(RunStarted), *topics_of(RunForked)]):
        data = event.data
        if isinstance(data, RunStarted) and data.parent_run is not None:
            children.setdefault(data.parent_run, []).append(event.stream)
        elif isinstance(data, RunForked):
            children.setdefault(data.source, []).append(event.stream)
    family = [run_id]
    seen = {run_id}
    index = 0
    while index < len(family):
        for child in children.get(family[index], ()):
            if child not in seen:
                seen.add(child)
                family.append(child)
        index += 1
    return family


def _check_finished(journal: Journal, run_id: str, stream: str) -> int:
    """Raise RunNotPurgeable unless the stream ended its pass; return its last version."""
    events = journal.stream(stream)
    if events and isinstance(events[0].data, OrchestrationStarted):
        finished = fold_orchestration(events).ended is not None
    else:
        state = fold_run(events)
        # A fork never resumed has no pass to end, and nobody executes it (F1).
        finished = state.is_finished or (state.forked is not None and not state.resumptions)
    if not finished:
        which = "it" if stream == run_id else f"its child run {stream}"
        raise RunNotPurgeable(
            f"run {run_id} is not finished: {which} has not ended its pass (it may still be "
            "executing, or have stopped mid-step); resume or cancel it first, then purge"
        )
    return events[-1].version
