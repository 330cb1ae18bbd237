"""Ray placement under misuse (SPEC S1-S3): resources no node has, the wrong or a dead cluster,
what cannot pickle, a shut-down placement, one placement for two runtimes.

Each case ends in a step error or a ConfigurationError that names what is wrong, never a hang.
The cluster is the session's (the ``ray_address`` fixture of conftest).
"""

from __future__ import annotations

import functools
import gc
import inspect
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, cast
from weakref import ref

import pytest
import ray
from crash import ROOT

import journaled
from journaled import Plan, Retry, Step, ray_cluster
from journaled.events.run_messages import RunStep
from journaled.events.runs import StepFailed, StepRetrying
from journaled.ray import RaySteps
from journaled.ray_cluster import ClusterResources, demand, shortfall

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]


@pytest.fixture
def steps(ray_address: str) -> RaySteps:
    """A placement on the session's cluster (already connected: it never shuts it down)."""
    return RaySteps()


def echo(value: Any) -> Any:
    """Return the input."""
    return value


@pytest.mark.parametrize(
    ("resources", "asked", "has"),
    [
        ({"num_gpus": 1}, "GPU 1", "CPU 2, GPU 0"),
        ({"resources": {"tpu": 1}}, "tpu 1", "CPU 2, tpu 0"),
        ({"num_cpus": 3}, "CPU 3", "CPU 2"),
        (
            {"accelerator_type": "A100"},
            "accelerator_type:A100 0.001",
            "CPU 2, accelerator_type:A100 0",
        ),
    ],
)
def test_resources_no_node_has_fail_the_step_at_once(
    steps: RaySteps, sqlite_url: str, resources: dict[str, Any], asked: str, has: str
) -> None:
    """S1: a step asking for resources no node of the cluster has fails at once (not queued for
    ever), naming the step, the resource and what each node has; the run's other steps run."""
    began = time.monotonic()
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("big", echo, resources=resources)
        rt.register_tool("echo", echo)
        result = rt.execute(
            Plan(goal="g", steps=[Step("a", tool="big", input=1), Step("b", tool="echo")]),
            step_timeout=20,
        )
    errors = {o.step_id: o.error or "" for o in result.observations}
    assert errors["a"].startswith("step 'a' cannot run on this Ray cluster: it asks for "), errors
    assert f"no node has {asked}" in errors["a"]
    assert f"has {has}" in errors["a"]
    assert "RaySteps(wait_for_resources=True)" in errors["a"]
    assert errors["b"] == ""
    assert time.monotonic() - began < 15


def test_wait_for_resources_keeps_the_step_queued(ray_address: str, sqlite_url: str) -> None:
    """S1: RaySteps(wait_for_resources=True) leaves a step no node can run queued in Ray (for
    an autoscaler): only its step timeout ends it."""
    with journaled.open(sqlite_url, steps=RaySteps(wait_for_resources=True)) as rt:
        rt.register_tool("tpu", echo, resources={"resources": {"tpu": 1}})
        result = rt.execute(Plan(goal="g", steps=[Step("a", tool="tpu")]), step_timeout=2)
    assert result.observations[0].error == "timed out after 2.0s"


def test_a_task_runs_on_one_node_so_resources_are_checked_per_node() -> None:
    """S1: two nodes of one CPU cannot run a task asking for two; a node with a CPU and another
    with a GPU cannot run one asking for both; the error says what each node has."""
    one_cpu = [("10.0.0.1", {"CPU": 1.0}), ("10.0.0.2", {"CPU": 1.0})]
    assert shortfall(demand({"num_cpus": 1}), one_cpu) is None
    assert shortfall(demand({"num_cpus": 2}), one_cpu) == (
        "it asks for CPU 2 and no node has CPU 2 (10.0.0.1 has CPU 1; 10.0.0.2 has CPU 1)"
    )
    split = [("a", {"CPU": 4.0}), ("b", {"CPU": 0.0, "GPU": 1.0})]
    assert shortfall(demand({"num_gpus": 1}), split) == (
        "it asks for CPU 1, GPU 1 and no single node has all of it (a task runs on one node) "
        "(a has CPU 4, GPU 0; b has CPU 0, GPU 1)"
    )
    assert shortfall(demand({"num_cpus": 0, "num_gpus": 1}), split) is None
    many = [(f"n{i}", {"CPU": 1.0}) for i in range(8)]
    assert (shortfall(demand({"num_cpus": 2}), many) or "").endswith("; and 3 more nodes)")


def test_node_resources_are_cached_and_read_again_on_a_miss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """S1: the nodes' resources are read once; a step that fits none reads them again, so a
    node that joined since is used instead of the step being refused."""
    reads: list[int] = []
    gpu_node = {"Alive": True, "NodeManagerAddress": "10.0.0.9", "Resources": {"GPU": 1.0}}
    nodes = [{"Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 2.0}}]

    def fake_nodes() -> list[dict[str, Any]]:
        reads.append(1)
        return list(nodes)

    monkeypatch.setattr(ray, "nodes", fake_nodes)
    cluster = ClusterResources()
    assert cluster.shortfall({"CPU": 1.0}) is None
    assert cluster.shortfall({"CPU": 2.0}) is None
    assert len(reads) == 1
    nodes.append(gpu_node)
    nodes.append({"Alive": False, "NodeManagerAddress": "10.0.0.3", "Resources": {"GPU": 8.0}})
    assert cluster.shortfall({"GPU": 1.0}) is None
    assert len(reads) == 2
    assert "no node has GPU 2" in (cluster.shortfall({"GPU": 2.0}) or "")
    assert len(reads) == 3


def test_an_address_naming_another_cluster_is_refused(ray_address: str) -> None:
    """S1: RaySteps(address=X) while this process is connected to another cluster raises a
    ConfigurationError naming both addresses; the cluster's own address, written with
    localhost, and "auto" are accepted."""
    other = "10.255.255.1:6379"
    with pytest.raises(journaled.ConfigurationError) as caught:
        RaySteps(address=other)
    message = str(caught.value)
    assert message.startswith(f"RaySteps(address={other!r}) names another cluster")
    assert ray_address in message
    port = ray_address.rpartition(":")[2]
    with pytest.raises(journaled.ConfigurationError, match="names another cluster"):
        RaySteps(address=f"127.0.0.1:{int(port) + 1}")
    for same in (ray_address, f"127.0.0.1:{port}", f"localhost:{port}", "auto", None):
        assert not RaySteps(address=same).connected_here
    assert ray.is_initialized()


def test_init_keywords_that_cannot_apply_are_refused(ray_address: str) -> None:
    """S1: init= while this process is already connected would be ignored: it is refused,
    naming the connection."""
    with pytest.raises(journaled.ConfigurationError, match=r"init=.* cannot apply: this process"):
        RaySteps(init={"runtime_env": {"env_vars": {"A": "1"}}})


UNREACHABLE = """
import json, socket, sys, time
import ray
import journaled
from journaled.events.run_messages import RunStep
from journaled.ray import RaySteps

silent = socket.create_server(("", 0))  # accepts connections, never speaks Ray
report = {}
for name, kwargs in [
    ("dead", {"address": "127.0.0.1:1"}),
    ("client", {"address": "ray://127.0.0.1:1"}),
    ("not ray", {"address": f"127.0.0.1:{silent.getsockname()[1]}"}),
    ("address in init", {"init": {"address": "127.0.0.1:1"}}),
    ("unknown keyword", {"init": {"no_such_keyword": 1}}),
]:
    began = time.monotonic()
    try:
        RaySteps(**kwargs)
    except journaled.ConfigurationError as exc:
        report[name] = [str(exc), time.monotonic() - began, ray.is_initialized()]
    else:
        report[name] = ["connected", time.monotonic() - began, ray.is_initialized()]
print(json.dumps(report))
"""


def test_an_unreachable_or_bad_connection_fails_in_bounded_time() -> None:
    """S1: an address nothing listens on (direct or Ray Client), one where something else
    listens, and init keywords ray.init refuses raise a ConfigurationError naming them within
    seconds, leaving the process unconnected."""
    done = subprocess.run(
        [sys.executable, "-c", UNREACHABLE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    dead, client, silent, in_init, unknown = (report[k] for k in report)
    assert dead[0].startswith("cannot reach the Ray cluster at '127.0.0.1:1' ("), dead
    assert "Connection refused" in dead[0]
    assert client[0].startswith("cannot reach the Ray cluster at 'ray://127.0.0.1:1' ("), client
    assert silent[0].startswith("the Ray cluster at '127.0.0.1:"), silent
    assert "accepts connections but does not answer as Ray does (no reply within 5s)" in silent[0]
    assert in_init[0] == "init must not hold 'address': pass it as RaySteps(address=...) instead"
    assert unknown[0].startswith("ray.init refused init={'no_such_keyword': 1}: RuntimeError: ")
    assert "no_such_keyword" in unknown[0]
    for message, seconds, connected in report.values():
        assert seconds < 30, message
        assert not connected, message


def test_an_address_that_never_answers_is_given_up_after_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """S1: an address whose host never answers is refused once the connect timeout passes,
    saying so (ray.init would retry for ever)."""
    asked: list[float] = []

    def never_answers(where: tuple[str, int], timeout: float) -> socket.socket:
        asked.append(timeout)
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", never_answers)
    with pytest.raises(journaled.ConfigurationError) as caught:
        ray_cluster.connect_probe("head:6379", "10.0.0.1:6379")
    assert str(caught.value) == (
        "cannot reach the Ray cluster at 'head:6379' (10.0.0.1:6379: no answer within 5s): "
        "start it with `ray start --head` or fix the address"
    )
    assert asked == [ray_cluster.CONNECT_TIMEOUT]


def test_an_unpicklable_lambda_fails_its_step_by_name(steps: RaySteps, sqlite_url: str) -> None:
    """S1: a lambda closing over a lock fails its step, naming the step, the tool and why."""
    lock = threading.Lock()
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("locked", lambda value: lock.locked())
        result = rt.execute(Plan(goal="g", steps=[Step("a", tool="locked")]))
    error = result.observations[0].error or ""
    assert error.startswith("tool 'locked' of step 'a' cannot be sent to Ray: its function must")
    assert "lock" in error


def returns_a_lock(value: Any) -> Any:
    """Return what can be neither journaled nor pickled."""
    return threading.Lock()


def agent_returns_a_lock(step: Step, ctx: Any) -> journaled.AgentResult:
    """Report an output that can be neither journaled nor pickled."""
    return journaled.AgentResult(ok=True, output=threading.Lock())


def test_an_output_that_cannot_come_back_fails_its_step_by_name(
    steps: RaySteps, sqlite_url: str
) -> None:
    """S1, E11: a tool or agent on Ray whose output cannot be journaled (nor pickled back)
    fails its step with an error naming it; the run and the executor carry on."""
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("lock", returns_a_lock)
        rt.register_agent("lock_agent", agent_returns_a_lock)
        rt.register_tool("echo", echo)
        result = rt.execute(
            Plan(
                goal="g",
                steps=[
                    Step("a", tool="lock"),
                    Step("b", agent="lock_agent"),
                    Step("c", tool="echo", input=1),
                ],
            )
        )
        after = rt.execute(Plan(goal="g", steps=[Step("d", tool="echo", input=2)]))
    errors = {o.step_id: o.error or "" for o in result.observations}
    assert errors["a"].startswith("the output of tool 'lock' cannot be journaled"), errors
    assert "lock_agent" in errors["b"], errors
    assert errors["c"] == ""
    assert after.ok


def test_a_shut_down_placement_fails_its_steps_and_is_refused(
    steps: RaySteps, sqlite_url: str
) -> None:
    """S1: steps of a runtime whose RaySteps was shut down fail, saying so; open() refuses a
    shut-down RaySteps; the cluster this process was connected to stays connected."""
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("echo", echo)
        assert rt.execute(Plan(goal="g", steps=[Step("a", tool="echo")])).ok
        steps.shutdown()
        result = rt.execute(Plan(goal="g", steps=[Step("b", tool="echo")]))
    assert result.observations[0].error == (
        "step 'b' could not run: its RaySteps was shut down; open the runtime with a new RaySteps()"
    )
    assert ray.is_initialized()
    with pytest.raises(journaled.ConfigurationError, match=r"^steps=RaySteps\(...\) was shut"):
        journaled.open("memory://", steps=steps)


def test_two_runtimes_share_one_placement(steps: RaySteps, sqlite_url: str, tmp_path: Any) -> None:
    """S1, S3: two runtimes using one RaySteps at once both finish every step; closing one
    leaves the other's placement working."""
    results: dict[str, journaled.ExecuteResult] = {}
    urls = [sqlite_url, f"sqlite:///{tmp_path / 'second.sqlite'}"]
    runtimes = [journaled.open(url, steps=steps) for url in urls]
    try:
        for rt in runtimes:
            rt.register_tool("echo", echo)

        def run(n: int) -> None:
            plan = Plan(goal=f"g{n}", steps=[Step(f"s{i}", tool="echo", input=i) for i in range(4)])
            results[f"r{n}"] = runtimes[n].execute(plan, max_parallel_steps=2)

        threads = [threading.Thread(target=run, args=(n,)) for n in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        runtimes[0].close()
        again = runtimes[1].execute(Plan(goal="g", steps=[Step("x", tool="echo", input=9)]))
    finally:
        for rt in runtimes:
            rt.close()
    assert sorted(results) == ["r0", "r1"]
    for result in results.values():
        assert result.ok, result.observations
        assert sorted(o.output for o in result.observations) == [0, 1, 2, 3]
    assert again.ok


RECONNECT = """
import sys
import ray
import journaled
from journaled import Plan, Step
from journaled.events.run_messages import RunStep
from journaled.ray import RaySteps

address = sys.argv[1]
ray.init(address=address, include_dashboard=False, log_to_driver=False)
steps = RaySteps()
with journaled.open("memory://", steps=steps) as rt:
    rt.register_tool("length", len)
    first = rt.execute(Plan(goal="g", steps=[Step("a", tool="length", input="ab")]))
    ray.shutdown()
    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    second = rt.execute(Plan(goal="g", steps=[Step("b", tool="length", input="abc")]))
ray.shutdown()
print([o.output for o in first.observations], [o.error or o.output for o in second.observations])
"""


def test_a_placement_follows_the_process_reconnecting(ray_address: str) -> None:
    """S1: after this process disconnects from Ray and connects again, a RaySteps made before
    runs steps again (what it had put in the old connection's object store is put again)."""
    done = subprocess.run(
        [sys.executable, "-c", RECONNECT, ray_address],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[2] [3]"


def test_the_readme_shows_the_raysteps_signature() -> None:
    """S3: the README's "Running on many hosts" shows RaySteps' keywords as they are."""
    shown = []
    for parameter in inspect.signature(RaySteps).parameters.values():
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and "*" not in shown:
            shown.append("*")
        shown.append(f"{parameter.name}={parameter.default!r}")
    readme = (Path(ROOT) / "README.md").read_text()
    assert f"`RaySteps({', '.join(shown)})`" in readme


SHUTDOWN_MID_STEP = """
import json, os, sys, time
from pathlib import Path
import ray
import journaled
from journaled import Plan, Step
from journaled.events.run_messages import RunStep
from journaled.ray import RaySteps
from journaled.testing import wait_for

mark = Path(sys.argv[1])

def slow(value):
    Path(value).write_text(str(os.getpid()))
    time.sleep(60)
    return "slept"

steps = RaySteps("local", init={"num_cpus": 1})  # its own cluster: shutdown() stops it
inside_at_disconnect = []
real_shutdown = ray.shutdown

def shutdown(*args, **kwargs):
    inside_at_disconnect.append(steps._inside)  # step threads still calling into Ray
    return real_shutdown(*args, **kwargs)

ray.shutdown = shutdown
with journaled.open("memory://", steps=steps) as rt:
    rt.register_tool("slow", slow)
    handle = rt.start(Plan(goal="g", steps=[Step("a", tool="slow", input=str(mark))]))
    wait_for(lambda: mark.exists() and mark.read_text() != "", 60)
    steps.shutdown()
    result = handle.result(timeout=60)
    print(json.dumps([[o.error for o in result.observations], inside_at_disconnect]))
"""


@pytest.mark.slow
def test_shutdown_while_a_step_runs_fails_that_step(tmp_path: Path) -> None:
    """S1, S2: shutdown() of a RaySteps that started its own cluster while a step runs there
    fails that step, saying so; the executor is not harmed and the run ends. The disconnect
    waits until no step thread is inside a Ray call: Ray ends the whole process (exit status 1,
    "the core worker has already been shutdown") when one calls into it after that."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [sys.executable, "-c", SHUTDOWN_MID_STEP, str(tmp_path / "running")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        ["step 'a' was cut off on Ray: its RaySteps was shut down while it ran"],
        [0],
    ]


class _Exits:
    """A placement whose engine ends the waiting thread with SystemExit (as ray.get does)."""

    def run_step(self, msg: RunStep, fn: Any, **kwargs: Any) -> Any:
        raise SystemExit(0)


def test_a_placement_ending_the_thread_fails_the_step_not_the_executor() -> None:
    """S1, E11: a placement that raises SystemExit fails its step, named; the run ends."""
    with journaled.open("memory://", steps=cast(Any, _Exits())) as rt:
        rt.register_tool("echo", echo)
        result = rt.execute(Plan(goal="g", steps=[Step("a", tool="echo")]))
    assert result.observations[0].error == "step 'a' could not be placed: SystemExit: 0"


def test_a_skill_refused_before_it_reaches_ray_is_charged_nothing(
    steps: RaySteps, sqlite_url: str, tmp_path: Path
) -> None:
    """R6, E8, S1: a skill step RaySteps refuses before submitting its task (resources no node
    has, a function that cannot pickle, a shut-down placement) made no model call: it is
    charged nothing and, under a retry policy, not tried again, as a missing skill is. A skill
    that ran and failed is still charged its call."""
    lock = threading.Lock()

    def locked(value: Any) -> Any:
        with lock:
            return value

    def fails(value: Any) -> Any:
        raise ValueError("no")

    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_skill("gpu", echo, resources={"num_gpus": 1})
        rt.register_skill("locked", locked)
        rt.register_skill(
            "gpu_retried", echo, resources={"num_gpus": 1}, retry=Retry(attempts=3, backoff=0.01)
        )
        rt.register_skill("fails", fails)
        result = rt.execute(
            Plan(
                goal="g",
                steps=[
                    Step("a", skill="gpu", input=1),
                    Step("b", skill="locked", input=1),
                    Step("c", skill="gpu_retried", input=1),
                    Step("d", skill="fails", input=1),
                ],
            ),
            call_budget=10,
        )
        events = [e.data for e in rt.runs.history(result.run_id)]
    errors = {o.step_id: o.error or "" for o in result.observations}
    assert "cannot run on this Ray cluster" in errors["a"], errors
    assert "cannot be sent to Ray" in errors["b"], errors
    assert "cannot run on this Ray cluster" in errors["c"], errors
    assert errors["d"] == "no", errors
    assert result.calls_used == 1  # the skill that ran
    assert not [e for e in events if isinstance(e, StepRetrying)]
    charged = {e.step_id: e.charged for e in events if isinstance(e, StepFailed)}
    assert charged == {"a": 0, "b": 0, "c": 0, "d": 1}

    placement = RaySteps()
    with journaled.open(f"sqlite:///{tmp_path / 'closed.sqlite'}", steps=placement) as rt:
        rt.register_skill("echo", echo, retry=Retry(attempts=3, backoff=0.01))
        placement.shutdown()
        closed = rt.execute(Plan(goal="g", steps=[Step("e", skill="echo")]), call_budget=10)
    assert (closed.observations[0].error or "").startswith(
        "step 'e' could not run: its RaySteps was shut down"
    )
    assert closed.calls_used == 0
    assert ray.is_initialized()


def assigned(value: Any) -> dict[str, float]:
    """Return the Ray resources this task was given."""
    return dict(ray.get_runtime_context().get_assigned_resources())  # type: ignore[no-untyped-call]


def test_registered_resources_replace_the_placements_defaults(
    ray_address: str, sqlite_url: str
) -> None:
    """S1, ADR 0045: RaySteps(resources=...) is what a step asks when its registration names
    none; a registration that names resources asks for those alone, never for a default it did
    not name (a custom resource here; num_gpus on a GPU fleet)."""
    steps = RaySteps(resources={"num_cpus": 1, "resources": {"special": 1}})
    with journaled.open(sqlite_url, steps=steps) as rt:
        rt.register_tool("cpu", assigned, resources={"num_cpus": 1})
        rt.register_tool("plain", assigned)
        result = rt.execute(
            Plan(goal="g", steps=[Step("a", tool="cpu", input=1), Step("b", tool="plain")])
        )
    assert result.ok, result.observations
    outputs = {o.step_id: o.output for o in result.observations}
    assert outputs == {"a": {"CPU": 1.0}, "b": {"CPU": 1.0, "special": 1.0}}


class Sized:
    """A callable object holding a payload, weakly referenceable as most callables are."""

    def __init__(self, size: int) -> None:
        self.payload = b"x" * size

    def __call__(self, value: Any) -> int:
        return len(self.payload)

    def method(self, value: Any) -> int:
        return len(self.payload) + 1


def sized(payload: bytes, value: Any) -> int:
    """The length of ``payload``, bound by a functools.partial."""
    return len(payload)


def test_a_replaced_function_is_released_by_the_placement(
    ray_address: str, sqlite_url: str
) -> None:
    """S1: RaySteps puts a function in Ray's object store once, but does not keep it (nor its
    stored copy) once nothing else does: a callable object, a bound method and a partial whose
    registrations were replaced, of a runtime since closed, are freed."""
    steps = RaySteps()
    with journaled.open(sqlite_url, steps=steps) as rt:
        tool, owner = Sized(1000), Sized(10)
        part = functools.partial(sized, b"y" * 100)
        rt.register_tool("t", tool)
        rt.register_tool("m", owner.method)
        rt.register_tool("p", part)
        plan = Plan(goal="g", steps=[Step(s, tool=s, input=1) for s in "tmp"])
        for _ in range(2):
            result = rt.execute(plan)
            assert result.ok, result.observations
        assert len(steps._functions) == 3  # each sent once, kept while registered
        for name in "tmp":
            rt.register_tool(name, echo)
    gone: list[ref[Any]] = [ref(tool), ref(owner), ref(part)]
    del tool, owner, part
    gc.collect()
    assert [r() for r in gone] == [None, None, None]
    assert steps._functions == {}


class Slotted:
    """A callable that cannot be weakly referenced (``__slots__`` without ``__weakref__``)."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, value: Any) -> int:
        return self.n


def test_a_callable_that_cannot_be_weakly_referenced_is_put_once_and_not_kept_for_ever(
    steps: RaySteps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S1: a callable with no weak reference is put in the object store once however many
    steps use it; only the last few such callables are kept, so none is held for ever."""
    from journaled import ray as placement_module

    puts: list[object] = []
    put = ray.put

    def counting(value: Any, **kwargs: Any) -> Any:
        puts.append(value)
        return put(value, **kwargs)

    monkeypatch.setattr(ray, "put", counting)  # the module journaled.ray calls
    first = Slotted(0)
    stored = steps._stored(first)
    assert steps._stored(first) is stored
    assert puts == [first]
    for n in range(1, placement_module._PINNED + 1):
        steps._stored(Slotted(n))
    assert len(steps._pinned) == placement_module._PINNED
    assert id(first) not in steps._pinned  # the least recently used went first
