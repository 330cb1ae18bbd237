"""A throwaway PostgreSQL server for the test suite (J3, J4).

:class:`PostgresServer` runs ``initdb`` and ``pg_ctl`` from :data:`PG_BIN` in a temporary directory,
listening on 127.0.0.1 and a free port only, with ``trust`` authentication for every role but
:data:`PASSWORD_ROLE`, which must give :data:`PASSWORD` (the tests of wrong passwords need one role
that checks). The server refuses to run as root: under root it runs as the ``postgres`` system user
(created with ``useradd`` if missing) through ``runuser``. Durability is off (``fsync=off``): the
data are thrown away with the directory when the session ends. Benchmarks pass ``durable=True``
(``fsync``, ``synchronous_commit`` and ``full_page_writes`` on): settings given on the server's
command line outrank ``ALTER SYSTEM``, so they cannot be turned on afterwards.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import pwd
import queue
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

PG_BIN = Path(os.environ.get("JOURNALED_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
"""Where ``initdb``, ``pg_ctl`` and ``postgres`` live (override with $JOURNALED_TEST_PG_BIN)."""
SUPERUSER = "postgres"
PASSWORD_ROLE = "journaled_pw"
PASSWORD = "correct-horse-battery-staple"  # a test role on a throwaway server
SERVICE_USER = "postgres"
_BINARIES = ("initdb", "pg_ctl", "postgres")


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL binaries are not installed: the tests that need a server are skipped."""


def missing_binaries(bin_dir: Path = PG_BIN) -> list[Path]:
    """Return the server programs missing from ``bin_dir`` (empty when all are there)."""
    return [bin_dir / name for name in _BINARIES if not os.access(bin_dir / name, os.X_OK)]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _service_user() -> pwd.struct_passwd | None:
    """Return the unprivileged user to run the server as (None: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/bin/false", SERVICE_USER],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(SERVICE_USER)


class PostgresServer:
    """One PostgreSQL server in a temporary directory; :meth:`stop` removes every trace."""

    def __init__(self, bin_dir: Path = PG_BIN, *, durable: bool = False) -> None:
        missing = missing_binaries(bin_dir)
        if missing:
            raise PostgresUnavailable(
                f"PostgreSQL server binaries not found: {', '.join(map(str, missing))} "
                "(install postgresql-15, or point $JOURNALED_TEST_PG_BIN at its bin directory)"
            )
        self.bin_dir = bin_dir
        self.durable = durable
        self.user = _service_user()
        self.root = Path(tempfile.mkdtemp(prefix="journaled-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = 0
        self._running = False
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        atexit.register(self.stop)

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user.pw_name, "--", *command]
        done = subprocess.run(
            command, cwd=self.root, capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:
            log = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise RuntimeError(
                f"{' '.join(command)} failed ({done.returncode}):\n"
                f"{done.stdout}\n{done.stderr}\n{log}"
            )
        return done

    def start(self) -> None:
        """Create the cluster and start the server on a free port (retrying a taken port)."""
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        )
        (self.data / "pg_hba.conf").write_text(
            "local all all trust\n"
            f"host all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n"
            "host all all 127.0.0.1/32 trust\n"
        )
        durability = "on" if self.durable else "off"
        options = " ".join(
            [
                "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={self.root}",
                f"-c fsync={durability}",
                f"-c synchronous_commit={durability}",
                f"-c full_page_writes={durability}",
                "-c max_connections=200",
                "-c shared_buffers=32MB",
                "-c autovacuum=off",
            ]
        )
        self._options = options
        for attempt in range(3):
            self.port = _free_port()
            try:
                self._pg_ctl_start()
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        self._running = True
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {PASSWORD_ROLE} LOGIN SUPERUSER PASSWORD '{PASSWORD}'")

    def _pg_ctl_start(self) -> None:
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            f"{self._options} -p {self.port}",
            "-w",
            "-t",
            "60",
            "start",
        )

    def crash_and_restart(self) -> None:
        """Stop the server as a crash would (no shutdown checkpoint, unwritten WAL lost), then
        start it again on the same port: it recovers from its write-ahead log."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self._pg_ctl_start()

    def url(self, dbname: str, *, user: str = SUPERUSER, password: str | None = None) -> str:
        """Return the URL of a database on this server."""
        auth = f"{user}:{password}" if password is not None else user
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}"

    def stop(self) -> None:
        """Stop the server at once and delete its directory. Idempotent."""
        if self._running:
            self._running = False
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


_counter = itertools.count(1)
_counter_lock = threading.Lock()


@contextlib.contextmanager
def slow_wal_writer_server() -> Iterator[PostgresServer]:
    """Start a durable server whose WAL writer runs every 10 s (its longest delay), so that log
    records no commit flushes stay unflushed for seconds, as on an idle server whose WAL writer
    hibernates (ADR 0052); stop it at the end.

    Raises:
        PostgresUnavailable: the server binaries are missing.
    """
    import psycopg

    server = PostgresServer(durable=True)
    server.start()
    try:
        with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
            conn.execute("SELECT pg_reload_conf()")
        yield server
    finally:
        server.stop()


def _with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}", query=""))


def create_database(admin_url: str) -> str:
    """Create an empty database ``test_<n>`` on the server of ``admin_url``; return its URL."""
    import psycopg

    with _counter_lock:
        name = f"test_{next(_counter)}"
    with psycopg.connect(_with_database(admin_url, "postgres"), autocommit=True) as conn:
        # FILE_COPY (PostgreSQL 15+) copies the template's files after a checkpoint, which
        # concurrent creations share; the default WAL_LOG writes all 7 MB to the WAL each time.
        strategy = " STRATEGY FILE_COPY" if conn.info.server_version >= 150000 else ""
        conn.execute(f"CREATE DATABASE {name}{strategy}")
    return _with_database(admin_url, name)


def drop_database(url: str) -> None:
    """Drop the database a URL names, disconnecting anyone still on it."""
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(_with_database(url, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Databases:
    """Fresh databases made ahead of need by a background thread, and dropped after use.

    ``CREATE DATABASE`` copies the template (about 7 MB, 0.05-0.2 s here): making the next few
    on two threads while tests run keeps the per-test cost to taking one from a queue.
    """

    def __init__(self, admin_url: str, ahead: int = 4, workers: int = 2) -> None:
        self.admin_url = admin_url
        self._ready: queue.Queue[str] = queue.Queue(maxsize=ahead)
        self._used: queue.Queue[str] = queue.Queue()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._work, name=f"pg-databases-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        try:
            while not self._stop.is_set():
                with contextlib.suppress(queue.Empty):
                    while True:
                        drop_database(self._used.get_nowait())
                if self._ready.full():
                    time.sleep(0.005)
                    continue
                url = create_database(self.admin_url)
                while not self._stop.is_set():
                    with contextlib.suppress(queue.Full):
                        self._ready.put(url, timeout=0.1)
                        break
        except BaseException as exc:  # reported by take(), never lost in a thread
            self._error = exc

    def take(self) -> str:
        """Return the URL of a fresh, empty database."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self._error is not None:
                raise RuntimeError(f"could not create a test database: {self._error}")
            with contextlib.suppress(queue.Empty):
                return self._ready.get(timeout=0.1)
        raise RuntimeError("no test database was created within 60 s")

    def give_back(self, url: str) -> None:
        """Have a used database dropped in the background."""
        self._used.put(url)

    def close(self) -> None:
        """Stop making databases (the server's directory goes with the rest)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
