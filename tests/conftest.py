"""Shared fixtures: journal backends, a manual clock, and a guard against leaked actors."""

from __future__ import annotations

import importlib.util
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pg
import pykka
import pytest
from aio_facade import open_runtime
from required import unavailable

import journaled
from journaled.testing import ManualClock

BACKENDS = ["memory", "sqlite", "postgresql"]


RAY_MODULES = ("test_ray.py", "test_ray_attack.py", "test_ray_tracing_attack.py")
"""The modules whose tests share the session's Ray cluster (the ``ray_address`` fixture)."""


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``--dist loadgroup``, send every test of :data:`RAY_MODULES` to one worker: one
    cluster, started once, as in a serial run (ADR 0050); every other test is its own group.

    pytest-xdist's own groups are written into the node id, which pytest 9.2 no longer lets a
    plugin change, so the grouping is done here, where the controller schedules node ids.
    """
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class RayTogether(LoadScopeScheduling):  # type: ignore[misc] # untyped base
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.partition("::")[0].rpartition("/")[2]
            return "ray" if module in RAY_MODULES else nodeid

    return RayTogether(config, log)


@pytest.fixture(autouse=True)
def no_held_interrupts() -> Iterator[None]:
    """Fail a test that leaves SIGINT's handler changed (ADR 0076): every later Ctrl-C of the
    process would go astray. A section whose exit was cut short heals (``heal``) first."""
    import signal

    from journaled.events.interrupts import heal

    before = signal.getsignal(signal.SIGINT)
    yield
    heal()
    after = signal.getsignal(signal.SIGINT)
    if after is not before:
        signal.signal(signal.SIGINT, before)
        pytest.fail(f"test left SIGINT's handler {after!r} (it was {before!r})")


@pytest.fixture(autouse=True)
def no_leaked_actors() -> Iterator[None]:
    """Fail a test that leaves actors running (they would keep the interpreter alive)."""
    yield
    leaked = pykka.ActorRegistry.get_all()
    if leaked:
        futures = [ref.stop(block=False) for ref in leaked]
        for future in futures:
            future.get(timeout=10)
        pytest.fail(
            f"test leaked {len(leaked)} actor(s): {[r.actor_class.__name__ for r in leaked]}"
        )


@pytest.fixture(params=BACKENDS)
def journal_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Yield a fresh journal URL for every backend of the contract suite."""
    if request.param == "memory":
        return "memory://"
    if request.param == "postgresql":
        url: str = request.getfixturevalue("pg_url")
        return url
    return f"sqlite:///{tmp_path / 'journal.sqlite'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def durable_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A journal other processes and runtimes share: a SQLite file or a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'journal.sqlite'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture(scope="session")
def postgres_databases() -> Iterator[pg.Databases]:
    """Start a throwaway PostgreSQL server for the session; make fresh databases on it.

    Skips (naming the missing path) when the server binaries or psycopg are not installed, or
    fails instead when $JOURNALED_TEST_REQUIRE_POSTGRES is set (CI must not skip them silently).
    """
    missing = pg.missing_binaries()
    if missing:
        unavailable(
            "POSTGRES",
            f"PostgreSQL tests need the server binaries: {', '.join(map(str, missing))} not found "
            "(install postgresql-15 or set JOURNALED_TEST_PG_BIN)",
        )
    if importlib.util.find_spec("psycopg") is None:
        unavailable(
            "POSTGRES", "PostgreSQL tests need the postgres extra: pip install -e '.[postgres]'"
        )
    server = pg.PostgresServer()
    try:
        server.start()
        databases = pg.Databases(server.url("postgres"))
        try:
            yield databases
        finally:
            databases.close()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def durable_postgres_databases(postgres_databases: pg.Databases) -> Iterator[pg.Databases]:
    """Start a second throwaway server that fsyncs and commits synchronously, as production does
    (the session's shared one does neither, for speed); only tests that ask for it start it."""
    server = pg.PostgresServer(durable=True)
    try:
        server.start()
        databases = pg.Databases(server.url("postgres"))
        try:
            yield databases
        finally:
            databases.close()
    finally:
        server.stop()


@pytest.fixture
def durable_pg_url(durable_postgres_databases: pg.Databases) -> Iterator[str]:
    """Yield the URL of a fresh database on the durable server (fsync and synchronous commit on)."""
    url = durable_postgres_databases.take()
    yield url
    durable_postgres_databases.give_back(url)


@pytest.fixture(scope="session")
def postgres_url(postgres_databases: pg.Databases) -> str:
    """Return a superuser URL to one database on the session's PostgreSQL server (shared)."""
    return postgres_databases.take()


@pytest.fixture
def pg_url(postgres_databases: pg.Databases) -> Iterator[str]:
    """Yield the URL of a fresh, empty database on the session's PostgreSQL server."""
    url = postgres_databases.take()
    yield url
    postgres_databases.give_back(url)


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """Start one local Ray cluster for the session (2 CPUs, a custom resource ``special``);
    return its GCS address and stop it at the end. Only the Ray tests ask for it (S1-S3)."""
    import ray  # the rest of the suite runs without Ray imported

    ray.init(
        num_cpus=2,
        resources={"special": 1},
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        yield str(ray.get_runtime_context().gcs_address)
    finally:
        ray.shutdown()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """Return the URL of a fresh SQLite journal file."""
    return f"sqlite:///{tmp_path / 'journal.sqlite'}"


@pytest.fixture
def clock() -> ManualClock:
    """Return a manual clock that steps 1 ms per reading."""
    return ManualClock(start=1_700_000_000_000, step=1)


@pytest.fixture
def flavour() -> str:
    """Name the runtime the ``rt`` fixtures open: ``sync``; a module that also runs its tests
    through the asyncio runtime overrides this with ``params=aio_facade.FLAVOURS`` (A1)."""
    return "sync"


@pytest.fixture
def rt(journal_url: str, clock: ManualClock, flavour: str) -> Iterator[journaled.Runtime]:
    """Yield an open runtime on each backend, closed after the test."""
    with open_runtime(flavour, journal_url, clock=clock) as runtime:
        yield runtime


@pytest.fixture
def sigint_reaches_children() -> Iterator[None]:
    """Make the processes a test starts take SIGINT as from a terminal (Ctrl-C).

    A run started in the background by a shell without job control inherits SIGINT ignored, and
    an ignored signal stays ignored across exec: the children would never see the test's SIGINT.
    A handled one is reset to the default in them, so Python installs its KeyboardInterrupt.
    """
    before = signal.getsignal(signal.SIGINT)
    if before is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
