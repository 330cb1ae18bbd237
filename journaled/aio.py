"""``journaled.aio``: the runtime for asyncio programs (SPEC A1, ADR 0025).

``async with journaled.aio.open(url) as rt`` (or ``rt = await journaled.aio.open(url)``) opens the
same runtime as :func:`journaled.open` and exposes each of its public methods as a coroutine:
``await rt.memory.remember(...)``, ``await rt.execute(plan)``, ``await rt.runs.why(run_id)``,
``async for event in await rt.journal.subscribe()``. None of them blocks the event loop:

- waiting for a run or a remember awaits the future its actor completes
  (``asyncio.wrap_future``): no thread is held while a run executes;
- every other call (a search, a journal read, opening and closing) runs in a bounded thread pool
  this runtime owns, not the loop's default executor, which the application sizes for itself.

``async def`` skills, tools and agents run on the loop the runtime was opened on, so they may use
clients bound to it; a step that blocks that loop stalls the application (sync steps still run on
worker threads). Registration stays plain methods.
"""

from __future__ import annotations

import asyncio
import builtins
import contextvars
import functools
import threading
from collections.abc import Callable, Generator, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any, Generic, ParamSpec, TypeVar

from journaled.actors.asking import ASK_TIMEOUT
from journaled.actors.clock import Clock
from journaled.actors.errors import RuntimeClosed
from journaled.actors.orchestrator import Planner
from journaled.actors.placement import Placement
from journaled.actors.run_recorder import Progress, on_progress_wait, refuse_close_from_progress
from journaled.actors.runs import RunHandle, Runs, check_timeout
from journaled.errors import ConfigurationError
from journaled.events.base import Event
from journaled.events.fork import Lineage, RunComparison
from journaled.events.journal import VerifyReport
from journaled.events.memory import Fact, FactRemembered
from journaled.events.messages import Deletion, Remember, Remembered
from journaled.events.orchestration import Outcome
from journaled.events.plan_rules import Reserve
from journaled.events.plans import ExecuteResult, Limits, Plan, RunDiff, Step
from journaled.events.provenance import Stale, Use
from journaled.events.run_state import RunFold
from journaled.events.run_summaries import RunSummary, Since, Statuses
from journaled.memory import Embedder, Memory, MemoryView
from journaled.runtime import DRAIN, AgentFunction, JournalHandle, Runtime
from journaled.semantic import EMBED_TIMEOUT
from journaled.subscriptions import (
    AsyncSubscription,
    OpeningSubscription,
    StoredSubscription,
    on_own_thread,
)

__all__ = [
    "WORKERS",
    "AsyncJournal",
    "AsyncMemory",
    "AsyncMemoryView",
    "AsyncRunHandle",
    "AsyncRuns",
    "AsyncRuntime",
    "Registered",
    "open",
]

WORKERS = 8
"""Default size of the thread pool an asyncio runtime runs its blocking calls in."""

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R")


class _Pool:
    """The bounded thread pool one asyncio runtime runs its blocking calls in."""

    def __init__(self, workers: int, loop: asyncio.AbstractEventLoop) -> None:
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="journaled-aio")
        self.loop = loop
        """The loop the runtime was opened on: its ``async def`` steps run there."""
        self.closed = False

    def check_loop(self) -> None:
        """Refuse a call from another event loop than the one the runtime was opened on.

        Raises:
            RuntimeError: the running loop is another one (its async steps would run on a loop
                that may be stopped: open one runtime per loop).
        """
        if asyncio.get_running_loop() is not self.loop:
            raise RuntimeError(
                "this journaled.aio runtime was opened on another event loop: open it in the "
                "loop that uses it (e.g. inside the coroutine given to asyncio.run)"
            )

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` in the pool; the loop goes on meanwhile.

        Raises:
            RuntimeClosed: the runtime was closed (its pool with it).
        """
        self.check_loop()
        if self.closed:
            raise RuntimeClosed("the runtime is closed: open a new one with journaled.aio.open()")
        # The caller's context variables go along, as with asyncio.to_thread (a current span, T3).
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await self.loop.run_in_executor(self.executor, call)

    async def run_apart(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` on a thread of its own, not one of the pool's: the pool's workers may all
        be held by calls this one ends (a close, whose drain bounds it, R3)."""
        self.check_loop()
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await on_own_thread(call, "journaled-aio-apart", self.loop)

    def shutdown(self) -> None:
        """Refuse further calls; the workers end (nothing is left running once close returned)."""
        self.closed = True
        self.executor.shutdown(wait=False)


class Registered:
    """What an asyncio runtime's ``register_*`` returns: the registration is done already.

    A registration reads no journal and never blocks, so it needs no coroutine; but A1 says every
    method of the asyncio runtime is one, so this may be awaited as well (``await
    rt.register_tool(...)``), completing at once. Left unawaited, it warns of nothing.
    """

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        yield from ()

    def __repr__(self) -> str:
        return "Registered()"


_REGISTERED = Registered()


class AsyncRunHandle(Generic[R]):
    """A started run for asyncio (A2): ``await handle`` or ``await handle.result(timeout)``.

    Waiting awaits the future the run's executor completes: no thread waits for the run.
    """

    def __init__(self, handle: RunHandle[R], pool: _Pool) -> None:
        self._handle = handle
        self._pool = pool
        self.run_id = handle.run_id
        self.future: Future[R] = handle.future
        """Completed with the result (or the error) when the run stops executing; the caller's
        to wait on, not to stop the run (its ``cancel()`` answers False, see
        :attr:`RunHandle.future`)."""

    async def result(self, timeout: float | None = None) -> R:
        """Wait for the run to stop and return its result (see :meth:`RunHandle.result`).

        Cancelling the awaiting task, or the timeout, stops the wait only: the run goes on.

        Raises:
            TimeoutError: it did not stop within ``timeout`` seconds.
            ValueError: ``timeout`` is not None nor a non-negative number.
        """
        check_timeout(timeout)
        self._pool.check_loop()  # another loop's wait would be woken on this one's (ADR 0025)
        if self.future.done():  # at once: a wrapped future settles only on the loop's next turn
            return self.future.result()
        reporter = self._handle._waits_on_caller()
        if reporter is not None:
            raise RuntimeError(on_progress_wait(reporter, self.run_id, "awaits"))
        waited = asyncio.shield(asyncio.wrap_future(self.future))
        return await asyncio.wait_for(waited, timeout)

    def done(self) -> bool:
        """Tell whether the run stopped executing."""
        return self._handle.done()

    async def cancel(self) -> bool:
        """Ask the run to stop scheduling (E5); False when it is not executing any more."""
        return await self._pool.run(self._handle.cancel)

    async def state(self) -> ExecuteResult:
        """Return the run as the journal holds it now."""
        return await self._pool.run(self._handle.state)

    def __await__(self) -> Generator[Any, None, R]:
        return self.result().__await__()

    def __repr__(self) -> str:
        status = "done" if self.future.done() else "executing"
        return f"<AsyncRunHandle {self.run_id} {status}>"


class AsyncMemoryView:
    """:class:`MemoryView` whose methods are coroutines: memory as of one journal position."""

    def __init__(self, view: MemoryView, pool: _Pool) -> None:
        self._view = view
        self._pool = pool
        self.position = view.position
        """The journal position this view reflects."""

    async def get(self, fact_id: str) -> Fact | None:
        """Return the fact as it was then, or None."""
        return await self._pool.run(self._view.get, fact_id)

    async def all(self) -> list[Fact]:
        """Return every fact stored then."""
        return await self._pool.run(self._view.all)

    async def search(self, query: str, **options: Any) -> list[Fact]:
        """Search as the store would have then (see :meth:`MemoryView.search`)."""
        return await self._pool.run(self._view.search, query, **options)

    async def search_semantic(self, query: str, **options: Any) -> list[Fact]:
        """Rank semantically as the store would have then (M7)."""
        return await self._pool.run(self._view.search_semantic, query, **options)

    async def search_hybrid(self, query: str, **options: Any) -> list[Fact]:
        """Fuse BM25 and semantic ranks as the store would have then (ADR 0047)."""
        return await self._pool.run(self._view.search_hybrid, query, **options)


class AsyncMemory:
    """``rt.memory`` for asyncio: every method of :class:`journaled.Memory` as a coroutine."""

    def __init__(self, memory: Memory, pool: _Pool) -> None:
        self._memory = memory
        self._pool = pool

    @property
    def embedder(self) -> Embedder | None:
        """Return the embedder semantic and hybrid searches rank with (None: BM25 only, M7)."""
        return self._memory.embedder

    @property
    def embed_timeout(self) -> float | None:
        """Return how long one semantic or hybrid search waits for the embedder, in seconds
        (None: for as long as it takes; ADR 0067)."""
        return self._memory.embed_timeout

    async def remember(
        self,
        text: str,
        scope: str = "project",
        domain: str | None = None,
        confidence: float | None = None,
        conflict_key: str | None = None,
        source: str | None = None,
        valid_from: int | None = None,
        valid_until: int | None = None,
    ) -> Fact:
        """Store a fact (M2, M3) and await the writer's reply; no thread waits for it.

        Raises:
            RuntimeError: called from another event loop than the runtime's (ADR 0025).
        """
        self._pool.check_loop()
        request = Remember(
            text=text,
            scope=scope,
            domain=domain,
            confidence=confidence,
            conflict_key=conflict_key,
            source=source,
            valid_from=valid_from,
            valid_until=valid_until,
        )
        correlation, reply = self._memory.request_remember(request)
        try:
            answer: Remembered = await asyncio.wait_for(asyncio.wrap_future(reply), ASK_TIMEOUT)
        finally:
            self._memory._inbox.forget(correlation)
        return answer.fact

    def request_remember(self, request: Remember) -> tuple[str, Future[Remembered]]:
        """Tell the writer a remember and return (correlation, future) at once (no wait)."""
        return self._memory.request_remember(request)

    def read_mark(self) -> tuple[int | None, int]:
        """Return where a read begun now starts, as :meth:`Memory.read_mark` (ADR 0062)."""
        return self._memory.read_mark()

    async def get(self, fact_id: str) -> Fact | None:
        """Return a fact from any traversed scope, or None (M4)."""
        return await self._pool.run(self._memory.get, fact_id)

    async def all(self) -> list[Fact]:
        """Return every stored fact across scopes (M4)."""
        return await self._pool.run(self._memory.all)

    async def search(
        self,
        query: str,
        scopes: Iterable[str] | None = None,
        domains: Iterable[str] | None = None,
        min_confidence: float = 0.0,
        limit: int = 10,
        now: int | None = None,
    ) -> list[Fact]:
        """Rank the filtered candidates by BM25 (M5, M6)."""
        return await self._pool.run(
            self._memory.search, query, scopes, domains, min_confidence, limit, now
        )

    async def search_semantic(
        self,
        query: str,
        scopes: Iterable[str] | None = None,
        domains: Iterable[str] | None = None,
        min_confidence: float = 0.0,
        limit: int = 10,
        now: int | None = None,
    ) -> list[Fact]:
        """Rank by cosine similarity, falling back to BM25 (M7); the embedder runs in the pool."""
        return await self._pool.run(
            self._memory.search_semantic, query, scopes, domains, min_confidence, limit, now
        )

    async def search_hybrid(
        self,
        query: str,
        scopes: Iterable[str] | None = None,
        domains: Iterable[str] | None = None,
        min_confidence: float = 0.0,
        limit: int = 10,
        now: int | None = None,
    ) -> list[Fact]:
        """Fuse BM25 and semantic ranks, falling back to BM25 (ADR 0047); runs in the pool."""
        return await self._pool.run(
            self._memory.search_hybrid, query, scopes, domains, min_confidence, limit, now
        )

    async def search_scored(
        self,
        query: str,
        scopes: Iterable[str] | None = None,
        domains: Iterable[str] | None = None,
        min_confidence: float = 0.0,
        limit: int = 10,
        now: int | None = None,
        *,
        semantic: bool = False,
    ) -> tuple[list[tuple[float, Fact]], str]:
        """Search keeping each hit's score (see :meth:`Memory.search_scored`)."""
        return await self._pool.run(
            self._memory.search_scored,
            query,
            scopes,
            domains,
            min_confidence,
            limit,
            now,
            semantic=semantic,
        )

    async def delete(self, fact_id: str) -> Deletion:
        """Delete a fact and heal the supersession chain around it (M8)."""
        return await self._pool.run(self._memory.delete, fact_id)

    async def purge(self, fact_id: str, reason: str | None = None) -> bool:
        """Delete a fact and erase its text from the journal (M10)."""
        return await self._pool.run(self._memory.purge, fact_id, reason)

    async def scrub(self, timeout: float = 10.0) -> None:
        """Remove erased texts' bytes from the journal's files now (see :meth:`Memory.scrub`)."""
        await self._pool.run(self._memory.scrub, timeout)

    async def scrub_pending(self) -> bool:
        """Tell whether bytes of an erased text may still be in the journal's files.

        A coroutine method here (``await rt.memory.scrub_pending()``), where the sync runtime has
        a property: it reads the journal.
        """
        return await self._pool.run(lambda: self._memory.scrub_pending)

    async def history(self, fact_id: str) -> list[Event]:
        """Return the events of a fact's life, oldest first (M11)."""
        return await self._pool.run(self._memory.history, fact_id)

    async def why(self, fact_id: str) -> str:
        """Explain a fact's life in plain words from its events (M11)."""
        return await self._pool.run(self._memory.why, fact_id)

    async def used_by(self, fact_id: str) -> list[Use]:
        """Return every step that read the fact, from the journal (P2)."""
        return await self._pool.run(self._memory.used_by, fact_id)

    async def as_of(self, position: int | None = None, at: int | None = None) -> AsyncMemoryView:
        """View the store as it was at a journal position or a time (M12)."""
        view = await self._pool.run(self._memory.as_of, position, at)
        return AsyncMemoryView(view, self._pool)

    async def checkpoint(self) -> bool:
        """Snapshot the memory projection now (see :meth:`Memory.checkpoint`)."""
        return await self._pool.run(self._memory.checkpoint)

    async def remembered(self, fact_id: str) -> FactRemembered | None:
        """Return the event that remembered a fact (even after delete), or None."""
        return await self._pool.run(self._memory.remembered, fact_id)


class AsyncRuns:
    """``rt.runs`` for asyncio: every method of :class:`journaled.Runs` as a coroutine."""

    def __init__(self, runs: Runs, pool: _Pool) -> None:
        self._runs = runs
        self._pool = pool

    async def execute(self, plan: Plan, *args: Any, **options: Any) -> ExecuteResult:
        """Execute a plan as a new run (E1-E13) and await its result."""
        return await (await self.start(plan, *args, **options))

    async def start(self, plan: Plan, *args: Any, **options: Any) -> AsyncRunHandle[ExecuteResult]:
        """Start a run (A2); returns once its opening events are committed."""
        handle = await self._pool.run(self._runs.start, plan, *args, **options)
        return AsyncRunHandle(handle, self._pool)

    async def validate(self, plan: Plan) -> None:
        """Reject a plan this runtime cannot run (E1), raising PlanRejected."""
        await self._pool.run(self._runs.validate, plan)

    async def resume(self, run_id: str, *args: Any, **options: Any) -> ExecuteResult:
        """Rebuild a run of ``execute`` from the journal and carry on (E14); await its result."""
        return await (await self.resume_start(run_id, *args, **options))

    async def resume_start(
        self, run_id: str, *args: Any, **options: Any
    ) -> AsyncRunHandle[ExecuteResult]:
        """Start resuming a run of ``execute`` and return its handle (A2)."""
        handle = await self._pool.run(self._runs.resume_start, run_id, *args, **options)
        return AsyncRunHandle(handle, self._pool)

    async def check_free(self, run_id: str, take_over: bool = False) -> None:
        """Raise RunOwnedElsewhere when another live process owns the run (R8)."""
        await self._pool.run(self._runs.check_free, run_id, take_over)

    async def cancel(self, run_id: str) -> bool:
        """Ask a run to stop scheduling (E5)."""
        return await self._pool.run(self._runs.cancel, run_id)

    async def cancel_at_rest(self, run_id: str, timeout: float = 30.0) -> bool:
        """End as cancelled a run no process executes (E5, ADR 0075)."""
        return await self._pool.run(self._runs.cancel_at_rest, run_id, timeout)

    async def close(self, drain: float, cause: str = "close") -> list[str]:
        """Stop starting runs, drain, suspend the rest (the runtime's close does this)."""
        return await self._pool.run(self._runs.close, drain, cause)

    @property
    def closing(self) -> bool:
        """Tell whether the runtime is closing (no run starts any more)."""
        return self._runs.closing

    async def purge(self, run_id: str, reason: str) -> int:
        """Erase a finished run's data from the journal (see :meth:`Runs.purge`)."""
        return await self._pool.run(self._runs.purge, run_id, reason)

    async def history(self, run_id: str) -> list[Event]:
        """Return a run's events, oldest first."""
        return await self._pool.run(self._runs.history, run_id)

    async def state(self, run_id: str, position: int | None = None) -> RunFold:
        """Return a run's folded state, now or at a journal position."""
        return await self._pool.run(self._runs.state, run_id, position)

    async def current(self, run_id: str) -> ExecuteResult:
        """Return the run as the journal holds it now."""
        return await self._pool.run(self._runs.current, run_id)

    async def at(self, run_id: str, position: int) -> ExecuteResult:
        """Return the run as it was at a journal position."""
        return await self._pool.run(self._runs.at, run_id, position)

    async def diff(self, run_id: str, a: int, b: int) -> RunDiff:
        """Return what changed in a run between two journal positions."""
        return await self._pool.run(self._runs.diff, run_id, a, b)

    async def position_at(self, run_id: str, at: int) -> int:
        """Return the journal position of a run as of a time."""
        return await self._pool.run(self._runs.position_at, run_id, at)

    async def at_time(self, run_id: str, at: int) -> ExecuteResult:
        """Return the run as it was at a time."""
        return await self._pool.run(self._runs.at_time, run_id, at)

    async def why(self, run_id: str) -> str:
        """Explain a run in plain words from its events."""
        return await self._pool.run(self._runs.why, run_id)

    async def fork(
        self,
        run_id: str,
        at: int | None = None,
        *,
        replace: Mapping[str, Step] | None = None,
        answers: Mapping[str, str] | None = None,
        call_budget: int | None = None,
    ) -> str:
        """Fork a run at a journal position into a new, unexecuted run; return its id (F1)."""
        return await self._pool.run(
            self._runs.fork,
            run_id,
            at,
            replace=replace,
            answers=answers,
            call_budget=call_budget,
        )

    async def lineage(self, run_id: str) -> list[Lineage]:
        """Return the chain of forks that led to a run, root first (F2)."""
        return await self._pool.run(self._runs.lineage, run_id)

    async def compare(self, run_a: str, run_b: str) -> RunComparison:
        """Compare two runs step by step (F3)."""
        return await self._pool.run(self._runs.compare, run_a, run_b)

    async def wait_idle(self, timeout: float) -> list[str]:
        """Wait up to ``timeout`` s for this runtime's runs to stop; return those still running."""
        return await self._pool.run(self._runs.wait_idle, timeout)

    async def active(self) -> list[str]:
        """Return the runs this runtime is executing."""
        return await self._pool.run(self._runs.active)

    async def cancel_all(self) -> list[str]:
        """Cancel every run this runtime is executing; return their ids."""
        return await self._pool.run(self._runs.cancel_all)

    async def list(
        self, status: Statuses = None, since: Since = None, limit: int | None = None
    ) -> builtins.list[RunSummary]:
        """Return a summary of each run and orchestration, oldest first (T2)."""
        return await self._pool.run(self._runs.list, status, since, limit)

    async def summary(self, run_id: str) -> RunSummary:
        """Return one run's or orchestration's summary (T2)."""
        return await self._pool.run(self._runs.summary, run_id)

    async def ids(self) -> builtins.list[str]:
        """Return every run id in the journal, oldest first."""
        return await self._pool.run(self._runs.ids)

    async def stale(self, run_id: str | None = None) -> builtins.list[Stale]:
        """Return the steps whose read facts changed since they read them (P3)."""
        return await self._pool.run(self._runs.stale, run_id)

    async def refresh(self, run_id: str) -> str:
        """Fork the run just before its earliest stale step; return the new run's id (P4)."""
        return await self._pool.run(self._runs.refresh, run_id)


class AsyncJournal:
    """``rt.journal`` for asyncio: reads, verification and subscriptions as coroutines."""

    def __init__(self, journal: JournalHandle, pool: _Pool) -> None:
        self._journal = journal
        self._pool = pool

    @property
    def url(self) -> str:
        """Return the journal URL (password masked)."""
        return self._journal.url

    @property
    def path(self) -> str | None:
        """Return the SQLite journal's file as an absolute path (None on other backends)."""
        return self._journal.path

    async def position(self) -> int:
        """Return the global position of the last event (J1)."""
        return await self._pool.run(self._journal.position)

    async def read(self, after: int = 0, upto: int | None = None) -> list[Event]:
        """Return events after ``after`` up to ``upto`` in journal order (J1)."""
        return await self._pool.run(self._journal.read, after, upto)

    async def verify(self, head: str | None = None) -> VerifyReport:
        """Check the whole journal against its digest chain (R7)."""
        return await self._pool.run(self._journal.verify, head)

    def subscribe(
        self,
        after: int = 0,
        topics: Iterable[str] | str | None = None,
        name: str | None = None,
    ) -> OpeningSubscription:
        """Follow the journal (A3): ``async for e in rt.journal.subscribe()``, or ``sub = await
        rt.journal.subscribe()`` for the :class:`AsyncSubscription` (``poll``, ``ack``)."""
        # Opened in the pool: the constructor reads a named subscription's stored position; its
        # acks are written there too.
        run = self._pool.run
        return OpeningSubscription(
            lambda: run(AsyncSubscription, self._journal, after, topics, name, run=run)
        )

    async def subscriptions(self) -> list[StoredSubscription]:
        """Return every named subscription with its acknowledged position (A3)."""
        return await self._pool.run(self._journal.subscriptions)

    async def unsubscribe(self, name: str) -> bool:
        """Drop a named subscription's stored position (A3)."""
        return await self._pool.run(self._journal.unsubscribe, name)


class AsyncRuntime:
    """A journaled runtime for asyncio: the sync :class:`Runtime`'s methods as coroutines."""

    def __init__(self, runtime: Runtime, pool: _Pool) -> None:
        self._sync = runtime
        self._pool = pool
        self.organization = runtime.organization
        self.agents = runtime.agents
        self.memory = AsyncMemory(runtime.memory, pool)
        self.runs = AsyncRuns(runtime.runs, pool)
        self.journal = AsyncJournal(runtime.journal, pool)
        self.protocol = runtime.protocol
        """The door for other actor systems (A4, docs/protocol.md): the same as the sync runtime's;
        its methods only tell messages, so they never block this loop."""
        self._closing: asyncio.Future[None] | None = None

    # -- registration: plain methods ---------------------------------------------------------------

    def register_skill(self, name: str, fn: Callable[..., Any], **placing: Any) -> Registered:
        """Register a skill: ``fn(input) -> output`` or an ``async def`` (runs on this loop).

        Done when it returns; ``await rt.register_skill(...)`` works too (see :class:`Registered`).
        """
        self._sync.register_skill(name, fn, **placing)
        return _REGISTERED

    def register_tool(self, name: str, fn: Callable[..., Any], **placing: Any) -> Registered:
        """Register a tool: ``fn(input) -> output`` or an ``async def`` (runs on this loop).

        Done when it returns; ``await rt.register_tool(...)`` works too (see :class:`Registered`).
        """
        self._sync.register_tool(name, fn, **placing)
        return _REGISTERED

    def register_agent(self, name: str, fn: AgentFunction, **placing: Any) -> Registered:
        """Register an agent: ``fn(step, ctx)``, sync or ``async def``; raise NeedsInput to wait.

        Done when it returns; ``await rt.register_agent(...)`` works too (see :class:`Registered`).
        """
        self._sync.register_agent(name, fn, **placing)
        return _REGISTERED

    # -- runs --------------------------------------------------------------------------------------

    async def execute(
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
        """Execute a plan as a journaled run and await its result (E1-E13)."""
        handle = await self.start(
            plan,
            call_budget,
            max_parallel_steps,
            limits,
            reserve,
            on_progress,
            step_timeout=step_timeout,
        )
        return await handle.result()

    async def start(
        self,
        plan: Plan,
        call_budget: int | None = None,
        max_parallel_steps: int = 2,
        limits: Limits | None = None,
        reserve: Reserve | None = None,
        on_progress: Progress | None = None,
        *,
        step_timeout: float | None = None,
    ) -> AsyncRunHandle[ExecuteResult]:
        """Start a run and return its handle once its opening events are committed (A2)."""
        handle = await self._pool.run(
            self._sync.start,
            plan,
            call_budget,
            max_parallel_steps,
            limits,
            reserve,
            on_progress,
            step_timeout=step_timeout,
        )
        return AsyncRunHandle(handle, self._pool)

    async def orchestrate(
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
        """Plan toward a goal and run it (O1-O5); await its outcome.

        The planner is called by the orchestration's planner worker (a thread), never on this loop.
        In ``"orchestrate"`` mode a failed pass is replanned, up to ``max_passes`` passes in all
        (O2's bound), as :meth:`journaled.Runtime.orchestrate` says.
        """
        handle = await self.orchestrate_start(
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
        return await handle.result()

    async def orchestrate_start(
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
    ) -> AsyncRunHandle[Outcome]:
        """Start an orchestration and return its handle once it is journaled (A2, O1-O5)."""
        handle = await self._pool.run(
            self._sync.orchestrate_start,
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
        return AsyncRunHandle(handle, self._pool)

    async def resume(
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
        """Rebuild a run from the journal and carry on (E14, O3, O4); await its result."""
        handle = await self.resume_start(
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
        return await handle.result()

    async def resume_start(
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
    ) -> AsyncRunHandle[ExecuteResult | Outcome]:
        """Start resuming a run like :meth:`resume` and return its handle (A2)."""
        handle = await self._pool.run(
            self._sync.resume_start,
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
        return AsyncRunHandle(handle, self._pool)

    async def cancel(self, run_id: str) -> bool:
        """Ask a running run or orchestration to stop scheduling (E5)."""
        return await self._pool.run(self._sync.cancel, run_id)

    async def refresh(self) -> int:
        """Fold events other processes appended since; return the position reached."""
        return await self._pool.run(self._sync.refresh)

    async def close(self, drain: float | None = None) -> None:
        """Drain, suspend what is unfinished, close the journal (R3), then the pool. Idempotent.

        A second call waits for the first; cancelling the awaiting task does not stop the close.

        Raises:
            RuntimeError: awaited from a run's ``on_progress`` (see :meth:`Runtime.close`), or
                from another event loop than the one the runtime was opened on; nothing is
                closed, and a close from its own loop works after.
            ConfigurationError: a bad ``drain``; nothing is closed.
        """
        refuse_close_from_progress()
        self._pool.check_loop()  # before anything is begun: a refused close changes nothing
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close(drain))
        await asyncio.shield(self._closing)

    async def _close(self, drain: float | None) -> None:
        try:
            # Not in the pool: its workers may all wait on calls the close releases (a search
            # for its embedder), and the close must end within its drain (R3).
            await self._pool.run_apart(self._sync.close, drain)
        except asyncio.CancelledError:
            self._pool.shutdown()  # the close goes on in its thread
            raise
        except BaseException:
            if not self._sync._closed:
                # Refused before it began (a bad drain): the runtime still serves, and a later
                # close may try again.
                self._closing = None
                raise
            self._pool.shutdown()
            raise
        self._pool.shutdown()

    async def __aenter__(self) -> AsyncRuntime:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class _Opening:
    """What :func:`open` returns: ``await`` it, or use it as ``async with``."""

    def __init__(self, url: str | None, workers: int, options: dict[str, Any]) -> None:
        self._url = url
        self._workers = workers
        self._options = options
        self._runtime: AsyncRuntime | None = None

    async def _open(self) -> AsyncRuntime:
        loop = asyncio.get_running_loop()
        pool = _Pool(self._workers, loop)
        # Opening replays the journal: in the pool, never on the loop.
        call = functools.partial(contextvars.copy_context().run, Runtime, self._url, loop=loop)
        opening = pool.executor.submit(call, **self._options)
        try:
            runtime = await asyncio.wrap_future(opening, loop=loop)
        except BaseException:
            # A cancel (a timeout, a shutdown) while the pool opens: the runtime it may still
            # open is nobody's, so it is closed as soon as it is there (an open that failed
            # opened nothing).
            opening.add_done_callback(_close_unclaimed)
            pool.shutdown()
            raise
        return AsyncRuntime(runtime, pool)

    def __await__(self) -> Generator[Any, None, AsyncRuntime]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncRuntime:
        self._runtime = await self._open()
        return self._runtime

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runtime is not None:
            await self._runtime.close()


def _close_unclaimed(opening: Future[Runtime]) -> None:
    """Close the runtime an open given up on has opened, on a thread of its own (this callback
    may run on the loop, which a close must not block: it drains, then stops actors)."""
    if opening.cancelled() or opening.exception() is not None:
        return
    runtime = opening.result()
    threading.Thread(target=runtime.close, name="journaled-aio-unclaimed").start()


def open(
    url: str | None = None,
    *,
    organization: str | None = None,
    clock: Clock | None = None,
    embedder: Embedder | None = None,
    agents: bool = True,
    follow: float | None = 0.2,
    drain: float = DRAIN,
    workers: int = WORKERS,
    steps: Placement | None = None,
    lock_wait: float | None = None,
    embed_timeout: float | None = EMBED_TIMEOUT,
) -> _Opening:
    """Open an asyncio runtime over the journal at ``url``: ``await`` it or ``async with`` it.

    Takes the keywords of :func:`journaled.open`, plus ``workers``: the size of the thread pool
    the runtime's blocking calls run in (default 8). ``async def`` steps run on the loop that
    opens it.

    Raises:
        ConfigurationError: a bad keyword (raised when awaited).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigurationError(f"workers must be a positive int, got {workers!r}")
    options: dict[str, Any] = {
        "organization": organization,
        "clock": clock,
        "embedder": embedder,
        "agents": agents,
        "follow": follow,
        "drain": drain,
        "steps": steps,
        "lock_wait": lock_wait,
        "embed_timeout": embed_timeout,
    }
    return _Opening(url, workers, options)
