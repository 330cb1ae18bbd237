"""``journaled.open()``: one runtime over one journal."""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

import msgspec

from journaled.actors import asking
from journaled.actors.clock import Clock, system_clock
from journaled.actors.directory import Directory, Inbox
from journaled.actors.errors import RunNotResumable, RuntimeClosed
from journaled.actors.gateway import ProtocolDoor
from journaled.actors.loop import LoopRunner
from journaled.actors.orchestrator import Orchestrations, Planner, driven_in_process
from journaled.actors.placement import Placement
from journaled.actors.run_reads import check_head
from journaled.actors.run_recorder import Progress, refuse_close_from_progress
from journaled.actors.runs import RunHandle, Runs, executing_in_process
from journaled.actors.runtime import MemoryActors
from journaled.actors.steps import AgentContext, AsyncAgentContext, Registry, Services
from journaled.errors import ConfigurationError, InvalidArgument
from journaled.events.base import Event
from journaled.events.catalog import codec
from journaled.events.inputs import INT64_MAX, INT64_MIN, short, text_problem
from journaled.events.journal import Journal, VerifyReport
from journaled.events.orchestration import Outcome
from journaled.events.plan_rules import Reserve
from journaled.events.plans import AgentResult, ExecuteResult, Limits, Plan, Retry, Step
from journaled.events.run_summaries import SAVE_AFTER
from journaled.events.snapshot_audit import verify as verify_snapshots
from journaled.events.tenancy import Boundary
from journaled.events.url import default_url, parse_url
from journaled.memory import Embedder, Memory
from journaled.organization import resolve_organization
from journaled.semantic import EMBED_TIMEOUT, check_embed_timeout
from journaled.subscriptions import (
    StoredSubscription,
    Subscription,
    check_name,
    names_of,
    stored_name,
)

AgentFunction = (
    Callable[[Step, AgentContext], AgentResult | Awaitable[AgentResult]]
    | Callable[[Step, AsyncAgentContext], Awaitable[AgentResult]]
)
"""An agent: ``fn(step, ctx) -> AgentResult``, or an ``async def`` returning one (A1), whose
``ctx`` may be typed :class:`AsyncAgentContext` (what ``ctx.execute`` returns on its loop)."""
ENV_URL = "JOURNALED_URL"
DRAIN = 10.0
"""Default seconds close() waits for steps in flight before suspending their runs (R3)."""
log = logging.getLogger("journaled")
SNAPSHOT_MIN_EVENTS = 500
"""On close, memory is snapshotted when at least this many events were folded since the last."""
_ORCHESTRATOR_STOP_SECONDS = 5.0
"""How long close() waits for orchestrators to stop once the runs are suspended (R3)."""


class JournalHandle:
    """``rt.journal``: the runtime's view of its journal."""

    def __init__(self, journal: Journal, organization: str | None = None) -> None:
        self._journal = journal
        self._organization = organization
        self._boundary = Boundary(organization, journal.first, journal.firsts)

    @property
    def url(self) -> str:
        """Return the journal URL as given (password masked)."""
        return self._journal.config.url

    @property
    def path(self) -> str | None:
        """Return the SQLite journal's file as an absolute path (None on other backends): what
        a relative ``sqlite:///`` URL named when the journal was opened."""
        return self._journal.config.path

    def position(self) -> int:
        """Return the global position of the last event (J1)."""
        return self._journal.position()

    def read(self, after: int = 0, upto: int | None = None) -> list[Event]:
        """Return events after ``after`` up to ``upto`` in the journal's global order (J1).

        Events about another organization's facts are left out (R1): positions may skip.
        """
        return self._boundary.visible(self._journal.read(after=after, upto=upto))

    def verify(self, head: str | None = None) -> VerifyReport:
        """Check the whole journal against its digest chain; report the first problem (R7).

        ``head``, the head digest of an earlier report kept outside the journal, must still be
        in the chain: else commits were cut off its end (or it was recomputed).

        Returns:
            ``ok``, the events checked, the position the chain starts at (events before it were
            written by an older release: decoded but not chain-checked), the head digest, and the
            first position altered, removed, reordered or undecodable, with the reason; then
            each snapshot is compared with the fold of its events (``snapshot-altered``).
        """
        return verify_snapshots(self._journal, head)

    def subscribe(
        self,
        after: int = 0,
        topics: Iterable[str] | str | None = None,
        name: str | None = None,
    ) -> Subscription:
        """Follow the journal: events after ``after``, then each new one, in order (A3).

        Catches up in bounded pages, then waits for appends by this process and others, on
        every backend. ``topics`` keeps only events of those tags (``"run.started"``,
        ``"memory.fact-remembered"``: :attr:`Event.kind`), filtered by the database. Another
        organization's facts and runs are never delivered (R1). A ``name`` keeps the acknowledged
        position in the journal's database: the subscription starts after the larger of it and
        ``after``, and ``sub.ack(position)`` stores it (at-least-once, ADR 0026). Names are the
        organization's own: another organization's of the same name is another subscription
        (ADR 0077).

        Raises:
            InvalidArgument: a negative ``after``, or one past the journal's end (ADR 0063), an
                unknown tag, a bad name.
        """
        return Subscription(self, after, topics, name)

    def subscriptions(self) -> list[StoredSubscription]:
        """Return every named subscription with its acknowledged position, by name (A3).

        Only this runtime's organization's: each organization names its own (R1, ADR 0077).
        """
        mine = names_of(self._organization, self._journal.subscriptions())
        return [StoredSubscription(name=n, position=p) for n, p in mine]

    def unsubscribe(self, name: str) -> bool:
        """Drop a named subscription's stored position; tell whether one was stored (A3).

        Subscribing by that name again starts from the ``after`` it is given. Another
        organization's subscription of the same name is another one, left as it is (R1).
        """
        return self._journal.forget_subscription(self._stored_name(check_name(name)))

    def _stored_name(self, name: str) -> str:
        return stored_name(self._organization, name)


def verify(url: str | None = None, head: str | None = None) -> VerifyReport:
    """Check a journal's digest chain without starting a runtime (R7).

    Opens the journal alone, so a journal whose memory no longer folds (a payload deleted behind
    its back) can still be checked. Nothing is created: a missing journal is an error. ``head``:
    as for :meth:`JournalHandle.verify`.

    Raises:
        JournalUrlError: no journal at that URL.
    """
    resolved = url if url is not None else os.environ.get(ENV_URL) or default_url()
    journal = Journal(parse_url(resolved), codec(), create=False)
    try:
        return verify_snapshots(journal, head)
    finally:
        journal.close()


class Runtime:
    """A running journaled runtime: memory actors over one journal. Close it when done."""

    def __init__(
        self,
        url: str | None = None,
        *,
        organization: str | None = None,
        clock: Clock | None = None,
        embedder: Embedder | None = None,
        agents: bool = True,
        create: bool = True,
        follow: float | None = 0.2,
        drain: float = DRAIN,
        loop: asyncio.AbstractEventLoop | None = None,
        steps: Placement | None = None,
        lock_wait: float | None = None,
        embed_timeout: float | None = EMBED_TIMEOUT,
    ) -> None:
        """Open the journal and start the actors; see :func:`open`.

        ``loop``: the event loop ``async def`` skills, tools and agents run on (the asyncio
        runtime passes its own); None: a loop this runtime owns, started on first use.
        """
        self._drain = _check_drain(drain)
        resolved = url if url is not None else os.environ.get(ENV_URL) or default_url()
        config = msgspec.structs.replace(parse_url(resolved), lock_wait=_check_lock_wait(lock_wait))
        organization = resolve_organization(organization)
        if not isinstance(agents, bool):
            raise ConfigurationError(f"agents must be True or False, got {agents!r}")
        if clock is not None and not callable(clock):
            raise ConfigurationError("clock must be a callable returning epoch milliseconds")
        if clock is not None:
            clock = _checked_clock(clock)
        if embedder is not None and not callable(getattr(embedder, "embed", None)):
            raise ConfigurationError("embedder must have an embed(list[str]) -> list[list[float]]")
        try:
            embed_timeout = check_embed_timeout(embed_timeout)
        except ValueError as exc:
            hint = "pass e.g. embed_timeout=10 to journaled.open()"
            raise ConfigurationError(f"{exc}: {hint}") from exc
        if steps is not None and not callable(getattr(steps, "run_step", None)):
            raise ConfigurationError(
                "steps must be a placement such as journaled.ray.RaySteps(), got "
                f"{type(steps).__name__}"
            )
        if steps is not None and getattr(steps, "closed", False) is True:
            raise ConfigurationError(
                f"steps={type(steps).__name__}(...) was shut down: pass a new one to open()"
            )
        self.organization = organization
        self.agents = agents
        self._journal = Journal(config, codec(), create=create)
        try:
            if follow is not None and (
                isinstance(follow, bool) or not isinstance(follow, int | float) or follow <= 0
            ):
                raise ConfigurationError(
                    f"follow must be a positive number of seconds or None, got {follow!r}"
                )
            following = follow if config.backend != "memory" else None
            self._directory = Directory()
            self._actors = MemoryActors(
                self._journal, clock or system_clock, organization, following, self._directory
            )
        except BaseException:
            self._journal.close()
            raise
        self.journal = JournalHandle(self._journal, organization)
        self.memory = Memory(
            self._journal,
            self._actors.writer,
            self._actors.scopes,
            clock or system_clock,
            embedder,
            organization,
            self._actors.scrubber,
            Inbox(self._directory, "memory"),
            self._actors.shelves,
            self._actors.desk,
            self._actors.mark,
            embed_timeout,
        )
        self._registry = Registry(agents_enabled=agents)
        self._services = Services(
            self._registry,
            self._directory,
            loop=LoopRunner(loop),
            memory=self.memory,
            placement=steps,
        )
        self.runs = Runs(
            self._journal,
            self._registry,
            clock or system_clock,
            agents,
            self._actors.scrubber,
            self._services,
        )
        self.runs.summaries_writable = create and config.backend != "memory"
        boundary = Boundary(organization, self._journal.first, self._journal.firsts)
        self.runs.hidden_fact = boundary.fact_elsewhere
        self.runs.boundary = boundary
        self.runs.summaries.visible_to = organization
        self.runs.catch_up_memory = self._actors.catch_up
        self._orchestrations = Orchestrations(
            self._journal, self.runs, clock or system_clock, self._directory
        )
        # A run this process owns is interrupted only once none of its runtimes executes or
        # drives it (T2, ADR 0088).
        self.runs.executing_here = lambda run_id: (
            executing_in_process(run_id) or driven_in_process(run_id)
        )
        self.protocol = ProtocolDoor(self, self._actors.writer, self._directory)
        """The door for other actor systems and processes: requests by message (A4, ADR 0030)."""
        self._closed = False
        self._close_lock = threading.Lock()
        self._close_done = threading.Event()
        """Set once the first close() has finished: later callers wait for it (R3)."""
        _OPEN.add(self)

    # -- registration ----------------------------------------------------------------------------

    def register_skill(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        resources: Mapping[str, Any] | None = None,
        retry: Retry | None = None,
    ) -> None:
        """Register a skill: ``fn(input) -> output``; raising fails the step; costs 1 model call.

        A function declaring a keyword parameter ``ctx`` is called ``fn(input, ctx=ctx)``:
        ``ctx.memory`` reads are journaled with the step (P1). ``resources`` (``num_cpus``,
        ``num_gpus``, ``memory``, ``resources``, ``accelerator_type``) say what each step needs
        from the placement given as ``open(steps=...)`` (S1); ``retry`` is the policy for its
        failed attempts, on every placement (S2). Each attempt of a skill costs 1 model call.

        Raises:
            ValueError: a bad name, ``resources`` or ``retry``, named; nothing is registered.
        """
        self._registry.register("skill", name, fn, resources=resources, retry=retry)

    def register_tool(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        resources: Mapping[str, Any] | None = None,
        retry: Retry | None = None,
    ) -> None:
        """Register a tool: ``fn(input) -> output``; raising fails the step; costs no model call.

        A function declaring a keyword parameter ``ctx`` is called ``fn(input, ctx=ctx)``:
        ``ctx.memory`` reads are journaled with the step (P1). ``resources`` and ``retry`` as
        for :meth:`register_skill` (S1, S2).
        """
        self._registry.register("tool", name, fn, resources=resources, retry=retry)

    def register_agent(
        self,
        name: str,
        fn: AgentFunction,
        *,
        resources: Mapping[str, Any] | None = None,
        retry: Retry | None = None,
    ) -> None:
        """Register an agent: ``fn(step, ctx) -> AgentResult``; raise NeedsInput to wait.

        ``resources`` and ``retry`` as for :meth:`register_skill` (S1, S2).
        """
        self._registry.register("agent", name, fn, resources=resources, retry=retry)

    # -- runs ------------------------------------------------------------------------------------

    def execute(
        self,
        plan: Plan,
        call_budget: int | None = None,
        max_parallel_steps: int = 2,
        limits: Limits | None = None,
        reserve: Reserve | None = None,
        on_progress: Progress | None = None,
        *,
        step_timeout: float | None = None,
    ) -> ExecuteResult:
        """Execute a plan as a journaled run and return its result (E1-E13).

        Raises:
            PlanRejected: the plan is malformed (nothing was appended).
            ValueError: a bad budget, parallelism, limit or timeout.
        """
        return self.runs.execute(
            plan,
            call_budget,
            max_parallel_steps,
            limits,
            reserve,
            on_progress,
            step_timeout=step_timeout,
        )

    def start(
        self,
        plan: Plan,
        call_budget: int | None = None,
        max_parallel_steps: int = 2,
        limits: Limits | None = None,
        reserve: Reserve | None = None,
        on_progress: Progress | None = None,
        *,
        step_timeout: float | None = None,
    ) -> RunHandle[ExecuteResult]:
        """Start executing a plan as a journaled run and return its handle at once (A2).

        Same arguments and rules as :meth:`execute`. The handle's ``run_id`` can be read in the
        journal as soon as this returns; ``handle.result(timeout)`` waits for the run to stop,
        ``handle.cancel()`` cancels it, ``handle.state()`` reads it as it is now.

        Raises:
            PlanRejected: the plan is malformed (nothing was appended).
            ValueError: a bad budget, parallelism, limit or timeout.
            RuntimeClosed: the runtime is closing.
        """
        self._check_open()
        return self.runs.start(
            plan,
            call_budget,
            max_parallel_steps,
            limits,
            reserve,
            on_progress,
            step_timeout=step_timeout,
        )

    def orchestrate(
        self,
        goal: str,
        planner: Planner,
        mode: str = "execute",
        call_budget: int | None = None,
        partial: bool = False,
        require_approval: bool = False,
        *,
        reserve: Reserve | None = None,
        on_progress: Progress | None = None,
        max_passes: int = 3,
    ) -> Outcome:
        """Plan toward a goal and run it under the budget and approval policy; wait (O1-O5).

        The planner is ``planner(goal, observations, clarifications) -> Plan | Clarify | Gaps``.
        A planner failure is a ``failed`` outcome, never an exception out of here. In
        ``"orchestrate"`` mode a failed pass is replanned, up to ``max_passes`` passes in all
        (3 by default; O2's bound): a planner that keeps proposing a failing plan is asked at
        most that many times, and the orchestration then ends ``failed`` with the last pass's
        failure.

        Raises:
            RuntimeClosed: the runtime is closing (or closed while a pass ran: that pass was
                suspended and the orchestration can be resumed in a new runtime).
        """
        return self.orchestrate_start(
            goal,
            planner,
            mode,
            call_budget,
            partial,
            require_approval,
            reserve=reserve,
            on_progress=on_progress,
            max_passes=max_passes,
        ).result()

    def orchestrate_start(
        self,
        goal: str,
        planner: Planner,
        mode: str = "execute",
        call_budget: int | None = None,
        partial: bool = False,
        require_approval: bool = False,
        *,
        reserve: Reserve | None = None,
        on_progress: Progress | None = None,
        max_passes: int = 3,
    ) -> RunHandle[Outcome]:
        """Start an orchestration like :meth:`orchestrate`; return its handle at once (A2, A4).

        Everything :meth:`orchestrate` refuses is refused here, before anything is appended. The
        planner and the passes run on the orchestration's actor, never in the caller's thread;
        ``handle.result(timeout)`` waits for its :class:`Outcome`, ``handle.cancel()`` cancels it.

        Raises:
            RuntimeClosed: the runtime is closing (the handle raises it too when the runtime
                closes while the orchestration is driven; it can be resumed in a new runtime).
        """
        self._check_open()
        problem = text_problem(goal, empty=False)
        if problem:
            raise InvalidArgument("goal", problem)
        for name, flag in (("partial", partial), ("require_approval", require_approval)):
            if not isinstance(flag, bool):  # "no" would be journaled as True
                raise InvalidArgument(
                    name, f"must be True or False, got {type(flag).__name__} {short(flag)}"
                )
        return self._orchestrations.start(
            goal,
            planner,
            mode,
            call_budget,
            partial,
            require_approval,
            reserve=reserve,
            on_progress=on_progress,
            max_passes=max_passes,
        )

    def resume(
        self,
        run_id: str,
        call_budget: int | None = None,
        answers: dict[str, str] | None = None,
        approve: bool = False,
        clarification: str | None = None,
        *,
        planner: Planner | None = None,
        reserve: Reserve | None = None,
        on_progress: Progress | None = None,
        take_over: bool = False,
    ) -> ExecuteResult | Outcome:
        """Rebuild a run from the journal and carry on (E14, O3, O4).

        Returns an ExecuteResult for a run started by ``execute`` and an Outcome for one started
        by ``orchestrate``. ``call_budget`` is the new total budget; ``answers`` answer waiting
        steps; ``approve`` approves a plan awaiting approval; ``clarification`` answers the
        planner's question (or the one waiting step). ``take_over`` resumes an unfinished run
        even though its owner looks alive (use it only when you know that process is gone).
        """
        return self.resume_start(
            run_id,
            call_budget,
            answers,
            approve,
            clarification,
            planner=planner,
            reserve=reserve,
            on_progress=on_progress,
            take_over=take_over,
        ).result()

    def resume_start(
        self,
        run_id: str,
        call_budget: int | None = None,
        answers: dict[str, str] | None = None,
        approve: bool = False,
        clarification: str | None = None,
        *,
        planner: Planner | None = None,
        reserve: Reserve | None = None,
        on_progress: Progress | None = None,
        take_over: bool = False,
    ) -> RunHandle[ExecuteResult | Outcome]:
        """Start resuming a run like :meth:`resume` and return its handle at once (A2).

        Everything :meth:`resume` refuses is refused here, before anything is appended; the
        handle's result is what :meth:`resume` would have returned.
        """
        self._check_open()
        _check_run_id(run_id)
        if not isinstance(approve, bool):
            # Read by truth, "no" would approve the plan: an act that cannot be taken back.
            raise RunNotResumable(
                f"run {run_id}: approve must be True or False, got {type(approve).__name__}"
            )
        if clarification is not None:
            problem = text_problem(clarification, empty=False)
            if problem:
                raise RunNotResumable(f"run {run_id}: the clarification {problem}")
        if answers is not None:
            if not isinstance(answers, Mapping):
                raise RunNotResumable(
                    f"answers must be a dict {{step_id: answer}}, got {type(answers).__name__}"
                )
            for step_id, answer in answers.items():
                problem = text_problem(answer, empty=False)  # as a clarification (O4)
                if problem:
                    raise RunNotResumable(
                        f"run {run_id}: the answer for step {step_id!r} {problem}"
                    )
        check_head(run_id, self._journal.head(run_id))
        if self._orchestrations.is_orchestration(run_id):
            orchestration: RunHandle[Any] = self._orchestrations.resume_start(
                run_id,
                call_budget,
                answers,
                approve,
                clarification,
                planner=planner,
                reserve=reserve,
                on_progress=on_progress,
                take_over=take_over,
            )
            return orchestration
        if approve or clarification is not None:
            self.runs._check_here(run_id)  # another organization's run is unknown (ADR 0074)
            raise RunNotResumable(
                f"run {run_id} was started by execute(): it has no plan approval or planner "
                "question; pass answers= for waiting steps"
            )
        handle: RunHandle[ExecuteResult | Outcome] = self.runs.resume_start(  # type: ignore[assignment]
            run_id,
            call_budget,
            answers,
            reserve=reserve,
            on_progress=on_progress,
            take_over=take_over,
        )
        return handle

    def cancel(self, run_id: str) -> bool:
        """Ask a running run or orchestration to stop scheduling (E5). Safe from any thread.

        A run no process executes (waiting for an answer or budget, suspended, or left by a
        crash) ends cancelled here and now, nothing of it run; an orchestration at rest ends
        failed, its pass cancelled (ADR 0075). False when there is nothing to cancel: it
        finished, is unknown, or another live process executes it.
        """
        _check_run_id(run_id)
        orchestration = self._orchestrations.cancel(run_id)
        if self.runs.cancel(run_id) or orchestration:
            return True
        if self.runs.closing:
            return False  # a closed runtime takes nothing up (R3): the run stays as it is
        if self._orchestrations.is_orchestration(run_id):
            return self._orchestrations.cancel_at_rest(run_id)
        return self.runs.cancel_at_rest(run_id)

    def refresh(self) -> int:
        """Fold events other processes appended since; return the position reached."""
        return self._actors.catch_up()

    def _check_open(self) -> None:
        if self.runs.closing:
            raise RuntimeClosed("the runtime is closed: open a new one with journaled.open()")

    def close(self, drain: float | None = None) -> None:
        """Stop taking work, drain, suspend what is unfinished, and close the journal (R3).

        No run starts from now on. Steps in flight get up to ``drain`` seconds (default: the
        ``drain`` given to :func:`open`, 10 s) to finish and journal their results; then every
        run still executing is journaled ``run.suspended`` — steps still in flight run again on
        resume — and stays resumable by ``rt.resume`` in a new runtime. Nothing is cancelled:
        only ``cancel(run_id)`` cancels. Idempotent.

        Raises:
            RuntimeError: called from a run's ``on_progress``: the close would wait for that run,
                which cannot go on until on_progress returns (nothing is closed).
        """
        refuse_close_from_progress()
        self._close(drain, "close")

    def _close(self, drain: float | None, cause: str) -> None:
        wait = self._drain if drain is None else _check_drain(drain)
        with self._close_lock:
            first = not self._closed
            self._closed = True
        # Before any door refuses: a step calling back into this runtime from now on is cut
        # short by the close, not failed by it (R3).
        self._services.closing.set()
        if not first:
            # Another thread is closing: return once it has, so that whoever returns from
            # close() finds the runs suspended and the journal closed (R3). That close is
            # bounded (drain, then the stop timeouts), whatever its steps do.
            self._close_done.wait()
            return
        try:
            _OPEN.discard(self)
            # No foreign request is served from here on; runs it started still answer run.ended.
            self.protocol.close()
            still = self.runs.close(wait, cause)
            if still:
                log.warning("closing with run(s) %s still executing", ", ".join(still))
            still = self._orchestrations.close(_ORCHESTRATOR_STOP_SECONDS)
            if still:
                log.warning("closing with orchestration(s) %s still driven", ", ".join(still))
            if self.runs.summaries_writable:
                # Off the append path: readers then fold only the run events after it (T2).
                self.runs._save_summaries(SAVE_AFTER)
            try:
                if self.runs.summaries_writable:  # a read-only runtime writes nothing (T4)
                    self._actors.save_snapshot(SNAPSHOT_MIN_EVENTS)
            except Exception as exc:  # a cache: a read-only or full journal still closes cleanly
                log.warning("memory snapshot not saved on close (only a cache): %s", exc)
                log.debug("why the memory snapshot was not saved", exc_info=True)
            finally:
                self._stop()
        finally:
            self._close_done.set()

    def _stop(self) -> None:
        try:
            self._actors.stop()
        finally:
            self._services.loop.close()
            self.memory._close_inbox()
            self.runs._close_inbox()
            self._journal.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _checked_clock(clock: Clock) -> Clock:
    """Wrap a caller's clock so that an answer that is no epoch-ms int is refused naming it.

    Checked at every reading, not once at open: a manual clock that steps on each call must
    not be advanced by a check, and a clock may go wrong later. The wall clock is not wrapped.
    """

    def checked() -> int:
        now = clock()
        if type(now) is not int or not INT64_MIN <= now <= INT64_MAX:  # a bool too
            raise ConfigurationError(
                f"the clock passed to journaled.open() answered {short(now)} "
                f"({type(now).__name__}): it must return epoch milliseconds as an int"
            )
        return now

    return checked


def _check_run_id(run_id: object) -> None:
    if not isinstance(run_id, str):
        raise InvalidArgument("run_id", f"must be a string, got {type(run_id).__name__}")


def open(
    url: str | None = None,
    *,
    organization: str | None = None,
    clock: Clock | None = None,
    embedder: Embedder | None = None,
    agents: bool = True,
    follow: float | None = 0.2,
    drain: float = DRAIN,
    steps: Placement | None = None,
    lock_wait: float | None = None,
    embed_timeout: float | None = EMBED_TIMEOUT,
) -> Runtime:
    """Open a runtime over the journal at ``url`` (default ``$JOURNALED_URL``, then the
    embedded SQLite file ``./.journaled/journal.sqlite``), replaying it into the actors.

    ``follow`` is how often (seconds) memory polls the journal for what other processes append
    (None: only on ``rt.refresh()`` or a write conflict); in-process journals never poll.
    ``drain`` is how long ``close()`` waits for steps in flight before suspending their runs
    (R3); a process that exits without closing its runtimes closes them the same way.
    ``steps`` is where skill, tool and agent functions run: None, in threads of this process;
    ``journaled.ray.RaySteps()``, as tasks on a Ray cluster (S1). The run's executor stays here.
    ``lock_wait`` is how long a write waits for the journal's lock while another process holds
    it (a backup, a VACUUM, a shell's open transaction) before it fails with
    :class:`JournalBusy`, nothing stored (None: 5/6 of the 30 s a caller waits for an answer;
    it must stay below that, so a caller told of a failure never finds the write made later).
    ``embed_timeout`` is how long one semantic or hybrid search waits for the embedder before
    it answers as BM25 does (M7; default 30 s, None: no bound); a late answer is still cached,
    and searches fall back at once until it comes (ADR 0067).
    """
    return Runtime(
        url,
        organization=organization,
        clock=clock,
        embedder=embedder,
        agents=agents,
        follow=follow,
        drain=drain,
        steps=steps,
        lock_wait=lock_wait,
        embed_timeout=embed_timeout,
    )


LOCK_WAIT_SHARE = 5 / 6
"""The default ``lock_wait`` as a share of the ask timeout: what remains covers the append itself
and the answer's way back (ADR 0039)."""


def _check_lock_wait(lock_wait: object) -> float:
    """Return the lock wait to journal with: ``lock_wait``, checked, or the default."""
    ask = asking.ASK_TIMEOUT  # read now: the timeout this runtime's callers will wait
    if lock_wait is None:
        return ask * LOCK_WAIT_SHARE
    if (
        isinstance(lock_wait, bool)
        or not isinstance(lock_wait, int | float)
        or not 0 < lock_wait < ask
    ):
        raise ConfigurationError(
            f"lock_wait must be a number of seconds above 0 and below {ask:g} (how long a caller "
            f"waits for an answer), got {lock_wait!r}: pass e.g. lock_wait={ask / 2:g} to "
            "journaled.open()"
        )
    return float(lock_wait)


def _check_drain(drain: object) -> float:
    if (
        isinstance(drain, bool)
        or not isinstance(drain, int | float)
        or not 0 <= drain < float("inf")
    ):
        raise ConfigurationError(f"drain must be a non-negative number of seconds, got {drain!r}")
    return float(drain)


_OPEN: weakref.WeakSet[Runtime] = weakref.WeakSet()
"""Runtimes not closed yet: the interpreter closes them on exit (R3)."""


def _close_at_exit() -> None:
    """Close (drain, then suspend) every runtime the program left open (R3).

    Registered to run when the main thread ends — before the interpreter waits for other
    non-daemon threads, so a thread blocked in ``execute`` gets its suspended run back and ends.
    """
    for runtime in list(_OPEN):
        try:
            runtime._close(None, "exit")
        except Exception:
            log.exception("closing a runtime at exit failed")


def _register_at_exit() -> None:
    # threading's own exit hooks run before non-daemon threads are joined (concurrent.futures
    # uses them for the same reason); plain atexit would run only after those threads ended.
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        register(_close_at_exit)
    else:  # pragma: no cover - other interpreters
        atexit.register(_close_at_exit)


_register_at_exit()
