"""Steps on a Ray cluster: ``journaled.open(..., steps=RaySteps())`` (S1-S3, ADR 0045).

Each skill, tool and agent step runs as a Ray task in a worker process of the cluster, with the
resources its registration names (``register_tool(name, fn, resources={"num_cpus": 2})``).
The run's executor stays in the opening process and remains the run's single writer: a step
worker thread there submits the task, waits for its observation through Ray's object store and
tells it to the executor as for a local step. So batches, caps, the call budget, waiting,
deadlines, cancellation and resume behave as in E*; a step's deadline or a cancel of its run
cancels its task (``ray.cancel``, forced: the worker process is stopped).

A worker process lost mid-step (killed, out of memory, its node gone) fails that attempt with an
observation naming the loss; a registration's :class:`journaled.Retry` policy tries it again.
Ray's own task retries are off, so every attempt is journaled.

A step asking for resources no live node has fails at submit time, naming them and what each
node has, instead of being queued by Ray for ever (``wait_for_resources=True`` queues it, for
autoscaling clusters). Connecting is checked too (:mod:`journaled.ray_cluster`): another
cluster than the current connection, or an address that does not answer as Ray, is refused.

What does not cross: a remote step has no ``ctx.memory`` (it is None) and an agent cannot start
child runs with ``ctx.execute``; the function, its input and its output must pickle. Requires
the ``ray`` extra (``pip install 'journaled[ray]'``); ``import journaled`` never imports Ray.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import ray
from ray import exceptions as ray_errors

from journaled.actors.loop import LoopRunner, StepToken
from journaled.actors.placement import Placed, resources_problem
from journaled.actors.steps import ToolContext, run_agent, run_callable, storable_text
from journaled.errors import ConfigurationError
from journaled.events.plans import CANCELLED_ABORT, Observation, Step
from journaled.events.run_messages import RunStep
from journaled.ray_cluster import ClusterResources, connect, demand

__all__ = ["RaySteps", "lost_error"]

DEFAULT_RESOURCES: Mapping[str, Any] = {"num_cpus": 1}
"""What a step asks of the cluster when its registration names no ``resources``."""

_POLL = 0.1
"""Seconds a step thread waits on Ray at a time before it looks whether shutdown() was called."""
_PINNED = 64
"""Functions that cannot be weakly referenced whose stored copy is kept for later steps."""
_SHUTDOWN_WAIT = 10.0
"""Seconds shutdown() waits for step threads to leave Ray before it disconnects anyway."""
_CLOSED = (
    "step {step!r} could not run: its RaySteps was shut down; open the runtime with a new "
    "RaySteps()"
)


class RaySteps:
    """Run a runtime's steps as Ray tasks: pass it as ``journaled.open(..., steps=RaySteps())``.

    Args:
        address: the cluster to join (``"auto"``, ``"ray://head:10001"``, ``"head:6379"``).
            None: the cluster this process is already connected to, else ``$RAY_ADDRESS``,
            else a local cluster started now (and stopped with the process). If this process
            is already connected, the address must name that cluster (None and ``"auto"``
            accept it whatever it is).
        resources: what a step asks when its registration names none (default one CPU).
        init: more keywords for ``ray.init`` when this object connects (``runtime_env``,
            ``namespace``, ``num_cpus`` for a local cluster, ...); refused when this process
            is already connected, since they could not apply.
        wait_for_resources: False (the default): a step asking for resources no live node
            of the cluster has (a GPU on a CPU-only cluster, more CPUs than any one node has)
            fails at once, naming them and what each node has. True: it is queued until a
            node that has them joins, as an autoscaling cluster does (give such runs a
            ``step_timeout``).

    Raises:
        ConfigurationError: a bad keyword, named; an address that names another cluster than
            the one this process is connected to; an address that does not accept a
            connection within ``journaled.ray_cluster.CONNECT_TIMEOUT`` seconds.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        resources: Mapping[str, Any] | None = None,
        init: Mapping[str, Any] | None = None,
        wait_for_resources: bool = False,
    ) -> None:
        if address is not None and (not isinstance(address, str) or not address):
            raise ConfigurationError(f"address must be a non-empty string or None, got {address!r}")
        if not isinstance(wait_for_resources, bool):
            raise ConfigurationError(
                f"wait_for_resources must be True or False, got {wait_for_resources!r}"
            )
        if init is not None and not isinstance(init, Mapping):
            raise ConfigurationError(
                f"init must be a dict of ray.init keywords, got {type(init).__name__}"
            )
        chosen = dict(DEFAULT_RESOURCES if resources is None else resources)
        problem = resources_problem(chosen)
        if problem:
            raise ConfigurationError(f"resources {problem}")
        self._defaults = chosen
        self._wait = wait_for_resources
        self.connected_here = connect(address, init or {})
        """Whether this object connected the process to Ray (then :meth:`shutdown` disconnects)."""
        self.closed = False
        """Whether :meth:`shutdown` was called: no step runs here any more."""
        self._task = ray.remote(max_retries=0)(_run_remote)
        self._functions: dict[int, tuple[weakref.ref[Any], Any]] = {}
        """id(fn) -> (a weak reference to fn, its ObjectRef): a function is sent to the object
        store once, and its entry (so its stored copy) goes when the function does."""
        self._pinned: collections.OrderedDict[int, tuple[Callable[..., Any], Any]] = (
            collections.OrderedDict()
        )
        """id(fn) -> (fn, its ObjectRef) for functions that cannot be weakly referenced: the
        last :data:`_PINNED` used are kept, so none is held for ever nor sent on every step."""
        self._tasks: dict[str, tuple[Any, dict[str, float]]] = {}
        """Resources (as text) -> the remote function with those options, and what it asks."""
        self._cluster = ClusterResources()
        self._session = _session()
        """The connection the caches belong to: an ObjectRef is void in a later one."""
        self._lock = threading.Lock()
        self._inside = 0
        """Step threads between their first Ray call and their last: :meth:`shutdown` waits for
        them to leave before it disconnects, since Ray ends the process (exit status 1) when a
        thread calls into it after the disconnect."""
        self._left = threading.Condition()

    def shutdown(self) -> None:
        """Stop running steps here; disconnect from Ray if this object connected.

        A local cluster it started stops with it. A runtime still opened with this placement
        fails its next steps, saying so; open it again with a new ``RaySteps()``.
        """
        self.closed = True
        with self._left:  # steps waiting on Ray see ``closed`` within a poll and leave
            self._left.wait_for(lambda: self._inside == 0, _SHUTDOWN_WAIT)
        if self.connected_here and ray.is_initialized():
            ray.shutdown()
        self.connected_here = False
        with self._lock:
            self._functions.clear()
            self._pinned.clear()

    def run_step(
        self,
        msg: RunStep,
        fn: Callable[..., Any],
        *,
        with_ctx: bool,
        resources: Mapping[str, Any] | None,
        token: StepToken,
    ) -> Placed:
        """Run one step attempt as a Ray task and return its observation (S1, S2).

        A step refused before its task was submitted is returned with ``ran=False``: it made
        no call, so it is charged nothing and not retried (R6).
        """
        step = msg.step
        with self._calling_ray():
            if self.closed:
                return _refused(step, _CLOSED.format(step=step.id))
            if not ray.is_initialized():
                error = f"step {step.id!r} could not run: this process is no longer connected"
                return _refused(step, f"{error} to Ray")
            self._follow_session()
            try:
                function = self._stored(fn)
            except Exception as exc:  # TypeError, or what the function's __reduce__ raised
                error = (
                    f"{step.kind or 'step'} {step.target!r} of step {step.id!r} cannot be sent to "
                    f"Ray: its function must pickle ({_first_line(exc)})"
                )
                return _refused(step, storable_text(error))
            try:
                task, wants = self._task_for(resources)
            except Exception as exc:  # resources Ray refuses (a custom resource named "CPU", ...)
                error = f"step {step.id!r} could not be submitted to Ray: {_first_line(exc)}"
                return _refused(step, storable_text(error))
            # Ray queues a task no node can run without a word, for ever: refuse it here instead.
            missing = None if self._wait else self._cluster.shortfall(wants)
            if missing is not None:
                error = (
                    f"step {step.id!r} cannot run on this Ray cluster: {missing}; add such a node, "
                    "or pass RaySteps(wait_for_resources=True) to wait for an autoscaler to add one"
                )
                return _refused(step, storable_text(error))
            try:
                ref = task.remote(function, msg, with_ctx)
            except Exception as exc:  # Ray shutting down, ...
                error = f"step {step.id!r} could not be submitted to Ray: {_first_line(exc)}"
                return _refused(step, storable_text(error))
            # A cancel of the run or the step's deadline stops the task where it runs: a worker
            # busy in user code cannot be asked, so the cancel is forced.
            held = [ref]  # the hook must not keep the ref alive past the step (see shutdown())
            token.on_set(lambda: _cancel(held[0]) if held else None)
            try:
                return Placed(*self._outcome(step, ref, token))
            finally:
                held.clear()

    @contextlib.contextmanager
    def _calling_ray(self) -> Iterator[None]:
        """Count this thread among those :meth:`shutdown` waits for before it disconnects."""
        with self._left:
            self._inside += 1
        try:
            yield
        finally:
            with self._left:
                self._inside -= 1
                self._left.notify_all()

    def _outcome(self, step: Step, ref: Any, token: StepToken) -> tuple[Observation, str | None]:
        """Wait for a submitted step's task and return its observation, or why it has none."""
        try:
            while True:
                try:
                    observation, question = ray.get(ref, timeout=_POLL)
                    break
                except ray_errors.GetTimeoutError:
                    if self.closed:  # shutdown() waits for this thread before it disconnects
                        _cancel(ref)
                        why = "its RaySteps was shut down"
                        cut = f"step {step.id!r} was cut off on Ray: {why} while it ran"
                        return _failed(step, cut), None
        except SystemExit:
            # Ray ends a thread blocked in ray.get this way when the process disconnects.
            why = (
                "its RaySteps was shut down"
                if self.closed
                else "this process disconnected from Ray (ray.shutdown())"
            )
            return _failed(step, f"step {step.id!r} was cut off on Ray: {why} while it ran"), None
        except ray_errors.TaskCancelledError:
            return _cancelled(step), None
        except ray_errors.RayTaskError as exc:
            # Not user code (that is observed inside the task): its function or input could
            # not be loaded there — a module not installed on that host, most often.
            cause = getattr(exc, "cause", None)
            why = (
                f"{type(cause).__name__}: {_first_line(cause)}"
                if isinstance(cause, BaseException)
                else _first_line(exc)
            )
            error = f"the Ray task of step {step.id!r} failed: {why}"
            return _failed(step, storable_text(error)), None
        except ray_errors.RayError as exc:
            if token.is_set():
                return _cancelled(step), None
            return _failed(step, lost_error(step, exc)), None
        if not isinstance(observation, Observation):
            return _failed(step, f"the Ray task of step {step.id!r} returned no observation"), None
        if (
            self.closed
            and not observation.ok
            and (observation.error or "").startswith("SystemExit")
        ):
            # The shutdown ended the worker under the step's code, which observed the SystemExit
            # Ray raised there before this thread was cut off: the same cut, seen from the task.
            why = "its RaySteps was shut down"
            return _failed(step, f"step {step.id!r} was cut off on Ray: {why} while it ran"), None
        return observation, question

    def _task_for(self, resources: Mapping[str, Any] | None) -> tuple[Any, dict[str, float]]:
        """Return the remote function with these resources and what it asks of one node, made
        once per distinct set.

        A registration naming resources asks for those alone; one naming none (or ``{}``) asks
        for the placement's defaults, which are never merged under it (ADR 0045).
        """
        options = dict(resources) if resources else self._defaults
        key = repr(sorted(options.items()))
        with self._lock:
            made = self._tasks.get(key)
            if made is None:
                made = self._tasks[key] = (self._task.options(**options), demand(options))
            return made

    def _follow_session(self) -> None:
        """Forget what belongs to an earlier connection (this process reconnected to Ray)."""
        session = _session()
        if session == self._session:
            return
        with self._lock:
            self._functions.clear()
            self._pinned.clear()
            self._session = session
        self._cluster.forget()

    def _stored(self, fn: Callable[..., Any]) -> Any:
        """Return the ObjectRef of ``fn``'s pickled copy, put in the object store on first use.

        The cache holds ``fn`` weakly: once the function is gone (its registration replaced,
        its runtime closed) its entry and ObjectRef are dropped, so Ray frees the copy. A
        callable that cannot be weakly referenced is kept among the last few used instead.
        """
        key = id(fn)
        with self._lock:
            held = self._functions.get(key)
            if held is not None and held[0]() is fn:
                return held[1]
            pinned = self._pinned.get(key)
            if pinned is not None and pinned[0] is fn:
                self._pinned.move_to_end(key)
                return pinned[1]
        ref = ray.put(fn)
        functions = self._functions

        def forget(gone: weakref.ref[Any]) -> None:
            # Called as fn is freed, maybe by the garbage collector inside a ``with self._lock``
            # of this thread: no lock here, a dict operation is atomic. The id is not reused
            # before fn is freed, so the entry found is fn's unless a later put replaced it.
            entry = functions.get(key)
            if entry is not None and entry[0] is gone:
                functions.pop(key, None)

        try:
            weak = weakref.ref(fn, forget)
        except TypeError:  # no __weakref__ slot (a callable with __slots__, some builtins)
            with self._lock:
                self._pinned[key] = (fn, ref)
                self._pinned.move_to_end(key)
                while len(self._pinned) > _PINNED:
                    self._pinned.popitem(last=False)
            return ref
        with self._lock:
            functions[key] = (weak, ref)
        return ref


def _session() -> tuple[str, str]:
    """Name this process's current Ray connection: its cluster and its job."""
    try:
        context = ray.get_runtime_context()
        return str(context.gcs_address), str(context.get_job_id())
    except Exception:  # a Ray Client connection may not say: its caches are kept
        return "", ""


def lost_error(step: Step, exc: BaseException) -> str:
    """Say that the worker running ``step`` was lost, and how (S2)."""
    reason = f"{type(exc).__name__}: {_first_line(exc)}" if str(exc).strip() else type(exc).__name__
    return storable_text(f"lost: the Ray worker running step {step.id!r} died ({reason})")


def _first_line(exc: BaseException) -> str:
    """Return the first line of an exception's message (Ray's run to many, in colour), or its
    type."""
    text = _COLOUR.sub("", str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
"""Terminal colour codes, which Ray puts in its messages."""


def _cancel(ref: Any) -> None:
    try:
        ray.cancel(ref, force=True)
    except Exception:  # already finished, or Ray is shutting down: nothing left to stop
        return


def _failed(step: Step, error: str) -> Observation:
    return Observation(
        step_id=step.id,
        ok=False,
        error=error,
        skill=step.skill,
        tool=step.tool,
        agent=step.agent,
        code="agent-failed" if step.agent is not None else None,
    )


def _refused(step: Step, error: str) -> Placed:
    """Fail a step refused before its task was submitted: it did not run (R6)."""
    return Placed(_failed(step, error), ran=False)


def _cancelled(step: Step) -> Observation:
    return Observation(
        step_id=step.id,
        ok=False,
        error=CANCELLED_ABORT,
        skill=step.skill,
        tool=step.tool,
        agent=step.agent,
        code="cancelled",
    )


@functools.cache
def _worker_loop() -> LoopRunner:
    """Return this worker process's loop for ``async def`` steps, started on first use.

    A Ray worker runs one task at a time, so the first call is never raced.
    """
    return LoopRunner()


def _run_remote(
    fn: Callable[..., Any], msg: RunStep, with_ctx: bool
) -> tuple[Observation, str | None]:
    """Run one step attempt in a Ray worker process, as a step worker would (E9-E11)."""
    step = msg.step
    loop = _worker_loop()
    if step.agent is not None:
        return run_agent(step, fn, msg, loop=loop, child_runner=_no_child_runs, ending=_terminating)
    ctx = ToolContext(msg, None) if with_ctx else None
    return run_callable(step.kind or "tool", step, fn, loop, None, ctx, ending=_terminating), None


def _terminating(exc: BaseException) -> bool:
    """Tell the SystemExit Ray raises to end its worker (its SIGTERM handler: ``ray stop``, a
    node drained, a pod pre-empted) from one user code raised (``sys.exit()``).

    Ray raises it with ``ray_terminate_msg`` set, which a plain SystemExit never has: let it
    through and the worker exits, so the step is observed as lost (S2). A user's own
    ``sys.exit()`` still fails its step, as on a local worker.
    """
    return isinstance(exc, SystemExit) and getattr(exc, "ray_terminate_msg", None) is not None


def _no_child_runs(*args: Any, **kwargs: Any) -> Any:
    """Refuse ``ctx.execute`` on Ray: a child run needs the runtime that owns its parent."""
    raise RuntimeError(
        "ctx.execute is not available to an agent running on Ray: a child run needs the local "
        "runtime; register this agent in a runtime opened without steps="
    )
