"""Which Ray cluster ``RaySteps`` uses, and whether it can run a step at all (S1, ADR 0045).

Two checks keep a misconfiguration from turning into a silent hang:

- **Connecting.** An address nothing listens on is refused within :data:`CONNECT_TIMEOUT`
  (``ray.init`` would retry for ever), and an address naming another cluster than the one this
  process is already connected to is refused instead of being ignored.
- **Fitting.** A step whose resources no node of the cluster has would be queued by Ray for
  ever; it fails at submit time instead, naming the resource and what each node has. The nodes'
  resources are cached and read again before a step is refused, so a node that joined counts.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import ray

from journaled.errors import ConfigurationError

__all__ = [
    "CONNECT_TIMEOUT",
    "ClusterResources",
    "connect",
    "connect_probe",
    "demand",
    "shortfall",
]

CONNECT_TIMEOUT = 5.0
"""Seconds to wait for a cluster's address to accept a connection before refusing it."""

_ANY_CLUSTER = (None, "auto")
"""Addresses that accept whatever cluster this process is already connected to."""

_SHOWN_NODES = 5
"""How many nodes an error lists before it counts the rest."""


def connect(address: str | None, init: Mapping[str, Any]) -> bool:
    """Connect this process to the cluster at ``address``; return whether it connected now.

    Already connected: ``address`` must name that cluster (None and ``"auto"`` accept any) and
    ``init`` must be empty, since ``ray.init`` will not run again to apply it.

    Raises:
        ConfigurationError: another cluster named, ``init`` that cannot apply, a bad ``ray.init``
            keyword, or an address that does not answer within :data:`CONNECT_TIMEOUT`.
    """
    if ray.is_initialized():
        current = _current_address()
        if init:
            raise ConfigurationError(
                f"init={dict(init)!r} cannot apply: this process is already connected to the "
                f"Ray cluster at {current}; drop init= or pass it to the ray.init that connected"
            )
        if address not in _ANY_CLUSTER and not _same_cluster(address, current):
            raise ConfigurationError(
                f"RaySteps(address={address!r}) names another cluster than the one this process "
                f"is already connected to ({current}): pass address=None to use that one, or "
                "call ray.shutdown() first to connect to the other"
            )
        return False
    if "address" in init:
        raise ConfigurationError(
            "init must not hold 'address': pass it as RaySteps(address=...) instead"
        )
    target = _bootstrap(address)
    if target is not None:
        connect_probe(address, target)
    options = {"include_dashboard": False, "log_to_driver": False, **dict(init)}
    try:
        ray.init(address=address, **options)
    except Exception as exc:
        # Leave no half-made connection behind: the next RaySteps must start from scratch.
        with contextlib.suppress(Exception):
            ray.shutdown()
        if isinstance(exc, ConnectionError | TimeoutError):
            raise ConfigurationError(
                f"cannot connect to the Ray cluster at {address!r}: {_first_line(exc)}"
            ) from exc
        # TypeError or RuntimeError: a keyword ray.init does not know, a bad value, ...
        raise ConfigurationError(
            f"ray.init refused init={dict(init)!r}: {type(exc).__name__}: {_first_line(exc)}"
        ) from exc
    return True


def demand(options: Mapping[str, Any]) -> dict[str, float]:
    """Return what a task with these ``ray.remote`` options asks of one node, in Ray's names.

    A task that names no ``num_cpus`` takes one CPU, as Ray does; amounts of 0 ask nothing.
    """
    want: dict[str, float] = {"CPU": float(options.get("num_cpus", 1))}
    if "num_gpus" in options:
        want["GPU"] = float(options["num_gpus"])
    if "memory" in options:
        want["memory"] = float(options["memory"])
    for name, amount in dict(options.get("resources") or {}).items():
        want[str(name)] = float(amount)
    if options.get("accelerator_type"):
        want[f"accelerator_type:{options['accelerator_type']}"] = 0.001  # Ray's own request
    return {name: amount for name, amount in want.items() if amount > 0}


def shortfall(
    want: Mapping[str, float], nodes: Sequence[tuple[str, Mapping[str, float]]]
) -> str | None:
    """Say why no node among ``nodes`` ((address, resources) pairs) can run ``want``, or None.

    A task runs on one node, so two nodes of one CPU each cannot run a task asking for two.
    """
    if any(_fits(want, have) for _, have in nodes):
        return None
    asked = ", ".join(f"{name} {_amount(amount)}" for name, amount in want.items())
    missing = [
        f"{name} {_amount(amount)}"
        for name, amount in want.items()
        if not any(have.get(name, 0.0) >= amount for _, have in nodes)
    ]
    why = (
        f"no node has {' or '.join(missing)}"
        if missing
        else "no single node has all of it (a task runs on one node)"
    )
    shown = [
        f"{where} has " + ", ".join(f"{name} {_amount(have.get(name, 0.0))}" for name in want)
        for where, have in nodes[:_SHOWN_NODES]
    ]
    more = len(nodes) - _SHOWN_NODES
    listed = "; ".join(shown) + (f"; and {more} more nodes" if more > 0 else "")
    return f"it asks for {asked} and {why} ({listed or 'the cluster has no live node'})"


class ClusterResources:
    """The resources of each live node of the connected cluster, read once and on a miss."""

    def __init__(self) -> None:
        self._nodes: list[tuple[str, dict[str, float]]] | None = None
        self._lock = threading.Lock()

    def shortfall(self, want: Mapping[str, float]) -> str | None:
        """Say why no node can run ``want`` (after reading the nodes again), or None."""
        with self._lock:
            nodes = self._nodes
        if nodes is not None and shortfall(want, nodes) is None:
            return None
        nodes = self.refresh()
        return shortfall(want, nodes)

    def refresh(self) -> list[tuple[str, dict[str, float]]]:
        """Read every live node's total resources from the cluster."""
        nodes = [
            (
                str(node.get("NodeManagerAddress") or node.get("NodeID") or "a node"),
                {str(k): float(v) for k, v in dict(node.get("Resources") or {}).items()},
            )
            for node in ray.nodes()  # type: ignore[no-untyped-call]
            if node.get("Alive")
        ]
        with self._lock:
            self._nodes = nodes
        return nodes

    def forget(self) -> None:
        """Drop what was read (this process connected to another cluster)."""
        with self._lock:
            self._nodes = None


def _fits(want: Mapping[str, float], have: Mapping[str, float]) -> bool:
    return all(have.get(name, 0.0) >= amount for name, amount in want.items())


def _amount(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _current_address() -> str:
    """Return the GCS address of the cluster this process is connected to."""
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # a Ray Client connection may not say
        return "an unknown address"


def _same_cluster(address: str, current: str) -> bool:
    """Whether ``address`` names the cluster whose GCS is at ``current``.

    A ``ray://`` address names the Ray Client server, on another port of the head: only its
    host can be compared.
    """
    if address.startswith("ray://"):
        wanted = _split(address.removeprefix("ray://").split("/", 1)[0])
        here = _split(current)
        return wanted is not None and here is not None and _host(wanted[0]) == _host(here[0])
    canonical = _bootstrap(address)
    if canonical is None:
        return False
    wanted, here = _split(canonical), _split(current)
    return (
        wanted is not None
        and here is not None
        and wanted[1] == here[1]
        and _host(wanted[0]) == _host(here[0])
    )


def _bootstrap(address: str | None) -> str | None:
    """Return the ``host:port`` that connecting to ``address`` reaches, or None (a new local
    cluster, or an address Ray resolves itself)."""
    if address is not None and address.startswith("ray://"):
        return address.removeprefix("ray://").split("/", 1)[0]
    try:
        from ray._private.services import canonicalize_bootstrap_address  # noqa: PLC0415

        found = canonicalize_bootstrap_address(address)  # type: ignore[arg-type]
    except Exception:  # no cluster for "auto" (ray.init says so), or a Ray without this helper
        return address if address not in _ANY_CLUSTER else None
    return None if found is None else str(found)


def connect_probe(address: str | None, target: str) -> None:
    """Refuse ``address`` unless its ``host:port`` answers as a gRPC server within the bound.

    ``ray.init`` retries for ever on an address nothing listens on, or where a server that is
    not Ray's listens. Ray's GCS and its Client server speak gRPC: one answers an HTTP/2
    preface with a SETTINGS frame at once. With ``RAY_USE_TLS`` set, only the connection is
    checked (the handshake would be TLS).
    """
    parts = _split(target)
    if parts is None:
        raise ConfigurationError(f"Ray address {address!r} is not host:port (got {target!r})")
    host, port = parts
    where = f"the Ray cluster at {address or target!r} ({host}:{port}"
    try:
        conn = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
    except OSError as exc:
        reason = (
            f"no answer within {CONNECT_TIMEOUT:g}s"
            if isinstance(exc, TimeoutError)
            else str(exc) or type(exc).__name__
        )
        raise ConfigurationError(
            f"cannot reach {where}: {reason}): start it with `ray start --head` or fix the address"
        ) from exc
    with conn:
        if os.environ.get("RAY_USE_TLS", "0").lower() not in ("0", "false", ""):
            return
        try:
            conn.sendall(_HTTP2_PREFACE)
            answer = conn.recv(9)
        except OSError as exc:
            answer = b""
            why = (
                f"no reply within {CONNECT_TIMEOUT:g}s"
                if isinstance(exc, TimeoutError)
                else str(exc)
            )
        else:
            why = "no gRPC reply"
        if len(answer) < 4 or answer[3] != _SETTINGS_FRAME:
            raise ConfigurationError(
                f"{where}) accepts connections but does not answer as Ray does ({why}): give "
                "the head's GCS port (6379 by default) or ray://head:10001"
            )


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
"""An HTTP/2 client's connection preface followed by an empty SETTINGS frame."""

_SETTINGS_FRAME = 4
"""The type byte of an HTTP/2 SETTINGS frame, the first thing a gRPC server sends."""


def _split(address: str) -> tuple[str, int] | None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _host(host: str) -> str:
    """Return ``host`` as an IP address, resolved (localhost names this node, as Ray does)."""
    try:
        ip = socket.gethostbyname(host)
    except OSError:
        return host
    if ip.startswith("127.") or host == "localhost":
        try:
            return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        except Exception:  # not connected: compare as written
            return ip
    return ip


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
