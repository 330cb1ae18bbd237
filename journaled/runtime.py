"""``journaled.open()``: one runtime over one journal."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from types import TracebackType
from typing import Any

from journaled.actors.clock import Clock, system_clock
from journaled.actors.errors import RunNotFound, RunNotResumable
from journaled.actors.orchestrator import Orchestrations, Planner
from journaled.actors.run_recorder import Progress
from journaled.actors.runs import Runs
from journaled.actors.runtime import MemoryActors
from journaled.actors.steps import AgentContext, Registry
from journaled.errors import ConfigurationError
from journaled.events.base import Event
from journaled.events.catalog import codec
from journaled.events.journal import Journal
from journaled.events.orchestration import Outcome
from journaled.events.plan_rules import Reserve
from journaled.events.plans import AgentResult, ExecuteResult, Limits, Plan, Step
from journaled.events.url import default_url, parse_url
from journaled.memory import Embedder, Memory

ENV_URL = "JOURNALED_URL"
CLOSE_WAIT = 30.0
"""Seconds close() waits for cancelled runs to stop before closing the journal under them."""
log = logging.getLogger("journaled")
SNAPSHOT_MIN_EVENTS = 500
"""On close, memory is snapshotted when at least this many events were folded since the last."""
ENV_ORGANIZATION = "JOURNALED_ORGANIZATION"


class JournalHandle:
    """``rt.journal``: the runtime's view of its journal."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    @property
    def url(self) -> str:
        """Return the journal URL (password masked)."""
        return self._journal.config.url

    def position(self) -> int:
        """Return the global position of the last event (J1)."""
        return self._journal.position()

    def read(self, after: int = 0, upto: int | None = None) -> list[Event]:
        """Return events after ``after`` up to ``upto`` in the journal's global order (J1)."""
        return list(self._journal.read(after=after, upto=upto))


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
    ) -> None:
        resolved = url if url is not None else os.environ.get(ENV_URL) or default_url()
        config = parse_url(resolved)
        if organization is None:
            organization = os.environ.get(ENV_ORGANIZATION) or None
        if organization is not None and (
            not isinstance(organization, str) or not organization.strip()
        ):
            raise ConfigurationError(
                f"organization must be a non-empty string, got {organization!r}: pass "
                'organization="acme" to journaled.open() or unset JOURNALED_ORGANIZATION'
            )
        if clock is not None and not callable(clock):
            raise ConfigurationError("clock must be a callable returning epoch milliseconds")
        if embedder is not None and not callable(getattr(embedder, "embed", None)):
            raise ConfigurationError("embedder must have an embed(list[str]) -> list[list[float]]")
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
            self._actors = MemoryActors(
                self._journal, clock or system_clock, organization, following
            )
        except BaseException:
            self._journal.close()
            raise
        self.journal = JournalHandle(self._journal)
        self.memory = Memory(
            self._journal,
            self._actors.writer,
            self._actors.scopes,
            clock or system_clock,
            embedder,
            organization,
        )
        self._registry = Registry(agents_enabled=agents)
        self.runs = Runs(self._journal, self._registry, clock or system_clock, agents)
        self._orchestrations = Orchestrations(self._journal, self.runs, clock or system_clock)
        self._closed = False

    # -- registration ----------------------------------------------------------------------------

    def register_skill(self, name: str, fn: Callable[[Any], Any]) -> None:
        """Register a skill: ``fn(input) -> output``; raising fails the step; costs 1 model call."""
        self._registry.register("skill", name, fn)

    def register_tool(self, name: str, fn: Callable[[Any], Any]) -> None:
        """Register a tool: ``fn(input) -> output``; raising fails the step; costs no model call."""
        self._registry.register("tool", name, fn)

    def register_agent(self, name: str, fn: Callable[[Step, AgentContext], AgentResult]) -> None:
        """Register an agent: ``fn(step, ctx) -> AgentResult``; raise NeedsInput to wait."""
        self._registry.register("agent", name, fn)

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
        """Plan toward a goal and run it under the budget and approval policy (O1-O5).

        The planner is ``planner(goal, observations, clarifications) -> Plan | Clarify | Gaps``.
        A planner failure is a ``failed`` outcome, never an exception out of here.
        """
        return self._orchestrations.orchestrate(
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
        if self._journal.first(run_id) is None:
            raise RunNotFound(f"no run {run_id!r} in this journal")
        if self._orchestrations.is_orchestration(run_id):
            return self._orchestrations.resume(
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
        if approve or clarification is not None:
            raise RunNotResumable(
                f"run {run_id} was started by execute(): it has no plan approval or planner "
                "question; pass answers= for waiting steps"
            )
        return self.runs.resume(
            run_id,
            call_budget,
            answers,
            reserve=reserve,
            on_progress=on_progress,
            take_over=take_over,
        )

    def cancel(self, run_id: str) -> bool:
        """Ask a running run or orchestration to stop scheduling (E5). Safe from any thread."""
        orchestration = self._orchestrations.cancel(run_id)
        return self.runs.cancel(run_id) or orchestration

    def refresh(self) -> int:
        """Fold events other processes appended since; return the position reached."""
        return self._actors.catch_up()

    def close(self) -> None:
        """Stop every actor and close the journal. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.runs.cancel_all()
        # Cancelled runs finish their steps in flight and journal how they ended before the
        # journal closes; a step stuck in user code past the wait is abandoned (at-least-once).
        still = self.runs.wait_idle(CLOSE_WAIT)
        if still:
            log.warning("closing with run(s) %s still executing a step", ", ".join(still))
        try:
            if self._journal.config.backend != "memory":
                self._actors.save_snapshot(SNAPSHOT_MIN_EVENTS)
        except Exception as exc:  # a cache: a read-only or full journal still closes cleanly
            log.warning("memory snapshot not saved on close (only a cache): %s", exc)
            log.debug("why the memory snapshot was not saved", exc_info=True)
        finally:
            self._stop()

    def _stop(self) -> None:
        try:
            self._actors.stop()
        finally:
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


def open(
    url: str | None = None,
    *,
    organization: str | None = None,
    clock: Clock | None = None,
    embedder: Embedder | None = None,
    agents: bool = True,
    follow: float | None = 0.2,
) -> Runtime:
    """Open a runtime over the journal at ``url`` (default ``$JOURNALED_URL``, then the
    embedded SQLite file ``./.journaled/journal.sqlite``), replaying it into the actors.

    ``follow`` is how often (seconds) memory polls the journal for what other processes append
    (None: only on ``rt.refresh()`` or a write conflict); in-process journals never poll.
    """
    return Runtime(
        url,
        organization=organization,
        clock=clock,
        embedder=embedder,
        agents=agents,
        follow=follow,
    )
