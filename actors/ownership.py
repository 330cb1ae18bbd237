"""Who executes a run, and whether that owner is still alive (J3, E14).

Exactly one executor may run a run at a time. Ownership is decided through the run's stream: the
executor that appends ``run.started`` or ``run.resumed`` names itself as owner, and a second process
appending at the same version loses. A resume of an unfinished run (one whose last pass never ended)
first asks whether its owner is alive:

- an owner on this host, in this PID namespace, is alive exactly while its process is: the owner
  id carries the host name with the namespace, the process id and its start time, checked in
  ``/proc`` (so a reused pid is not mistaken for the owner, and a
  process killed but not reaped yet, a zombie, is gone); a process ``/proc`` hides from the
  reader (``hidepid``) is asked of the kernel, and alive while it exists;
- an owner on another host, or in another PID namespace (a container beside this one, of the
  same host name), is presumed alive while its last event is younger than the lease:
  the executor appends a heartbeat when it has been quiet for :data:`HEARTBEAT_SECONDS`, and
  the lease is three heartbeats.

The same rules tell a run listing whether an unsettled run still executes (SPEC T2): one whose
owner stopped is ``interrupted`` (:func:`owner_stopped`, ADR 0088).
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable
from pathlib import Path

HEARTBEAT_SECONDS = 10.0
"""A busy executor that appended nothing for this long appends a heartbeat."""
LEASE_MS = int(3 * HEARTBEAT_SECONDS * 1000)
"""An owner on another host that was silent this long is presumed dead."""


_GONE_STATES = frozenset({"Z", "X", "x"})
"""Process states in ``/proc/<pid>/stat`` of a process that executes nothing any more, once its
thread count (field 20) is 1: a zombie (killed or exited, not reaped yet by its parent) or a
dead one."""


def _stat_fields(pid: int) -> list[str] | None:
    """Return the fields of ``/proc/<pid>/stat`` from the state on, or None when unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces or parentheses: fields start after the last ')'.
    return stat[stat.rfind(")") + 2 :].split()


def _live_start(fields: list[str]) -> str | None:
    """Return a process's start time from its stat fields, or None when it is gone."""
    if len(fields) <= 19:
        return None
    if fields[0] in _GONE_STATES and fields[17] in ("0", "1"):
        # Killed but not reaped (a busy supervisor, a container whose PID 1 reaps nothing),
        # it keeps its pid and start time, yet will never append again (E14). Only when no
        # thread is left: a process whose main thread ended while others run shows Z too.
        return None
    return fields[19]


def _start_time(pid: int) -> str | None:
    """Return a live process's start time, or None when it is gone (or a zombie)."""
    fields = _stat_fields(pid)
    return None if fields is None else _live_start(fields)


@functools.cache
def _pid_namespace() -> str:
    """Return ``#`` and the inode of this process's PID namespace, or "" where it cannot be read.

    Containers of one pod (a sidecar), or ``docker run --network host``, share a host name but
    not their pids: a pid is only comparable with one of the same namespace. A process's own
    PID namespace never changes (``unshare`` moves its children), so it is read once.
    """
    try:
        return f"#{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def _host() -> str:
    """Return where a pid means the same process: the host name and the PID namespace. An owner
    of another namespace (or of a release that did not say its own) is judged as one on another
    host, by the lease."""
    return f"{socket.gethostname()}{_pid_namespace()}"


def this_process() -> str:
    """Return this process's owner id: ``host/pid/start-time``."""
    pid = os.getpid()
    return f"{_host()}/{pid}/{_start_time(pid) or '?'}"


def owner_alive(owner: str, last_seen: int, now: int) -> bool:
    """Tell whether a run's owner may still be executing it."""
    host, _, rest = owner.partition("/")
    pid_text, _, started = rest.partition("/")
    if host == _host() and pid_text.isdigit():
        pid = int(pid_text)
        fields = _stat_fields(pid)
        if fields is not None:
            current = _live_start(fields)
            return current is not None and (started in ("?", current))
        if pid <= 0:
            return False
        # No entry we may read: the process is gone, or /proc hides another user's processes
        # from us (mounted with hidepid, systemd's ProtectProc), or there is no /proc. The
        # kernel tells: a live process we may not signal is alive (its start time unseen).
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return now - last_seen < LEASE_MS


def owner_stopped(owner: str, last_seen: int, now: int, executing_here: bool = False) -> bool:
    """Tell whether an unsettled run's owner has stopped executing it (T2 ``interrupted``).

    The rules a resume lives by (:func:`owner_alive`, ADR 0011), so ``interrupted`` means "a
    resume takes it over without ``take_over``" (ADR 0088):

    - no owner recorded (journals before owners): never judged stopped;
    - this very process: stopped when none of its runtimes executes the run
      (``executing_here`` False) and the run was silent for the lease, so a run that ends
      between the two reads is never called interrupted;
    - another process on this host: stopped exactly when that process is gone (or its pid was
      reused); a live one is never judged stopped, however slow its step;
    - another host: silent (no event, heartbeats included) for the lease, three heartbeats.
    """
    if not owner:
        return False
    if owner == this_process():
        return not executing_here and now - last_seen >= LEASE_MS
    return not owner_alive(owner, last_seen, now)


def owner_judge(
    clock: Callable[[], int], executing_here: Callable[[str], bool] = lambda _: False
) -> Callable[[str, str, int], bool]:
    """Return ``owner_gone(run_id, owner, last_seen)`` for the run-summary projection: the
    run's owner judged by :func:`owner_stopped` at the time ``clock`` reads then."""

    def owner_gone(run_id: str, owner: str, last_seen: int) -> bool:
        return owner_stopped(owner, last_seen, clock(), executing_here(run_id))

    return owner_gone
