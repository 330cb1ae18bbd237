"""Parse a journal URL into a :class:`JournalConfig` (J4).

One URL chooses the backend: ``memory://`` (an in-process journal for tests), ``sqlite:///path``
(the embedded default; a relative path after ``sqlite:///`` is relative to the working directory,
``sqlite:////abs/path`` is absolute), and ``postgresql://user:pass@host:port/db`` (or
``postgres://``; the port defaults to 5432, user and password may be percent-encoded). Query
parameters tune the backend: ``durability=normal|full`` for SQLite (``full`` fsyncs every commit;
``normal``, the default, loses nothing when a process is killed, only on power loss);
``pool_size=N`` for PostgreSQL (connections kept open per journal, default 5, 1 to 50).
Refused rather than read as another file or setting: a ``#`` (a URL ends there; PostgreSQL
names take it percent-encoded, ``%23``), a parameter given twice, and ``sqlite:/path`` or
``sqlite:path`` (not three slashes).

The password is kept in :class:`JournalConfig` for the adapter, but never in its ``url``, its
``repr`` or any error message.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

import msgspec

from journaled.events.errors import JournalUrlError

Backend = Literal["memory", "sqlite", "postgresql"]
Durability = Literal["normal", "full"]

DEFAULT_SQLITE_PATH = Path(".journaled") / "journal.sqlite"
DEFAULT_POSTGRES_PORT = 5432
DEFAULT_POOL_SIZE = 5
MAX_POOL_SIZE = 50
DEFAULT_LOCK_WAIT = 25.0
"""Seconds an append waits for the journal's write lock before it gives up with
:class:`~journaled.events.errors.JournalBusy`: 5/6 of the runtime's 30 s ask timeout, which
sets its own from its timeout (ADR 0039)."""


class JournalConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the journal adapter needs to open a backend, and nothing from the environment."""

    url: str
    """The URL as given, with any password masked."""
    backend: Backend
    path: str | None = None
    """SQLite database file (absolute)."""
    durability: Durability = "normal"
    host: str | None = None
    port: int | None = None
    user: str | None = None
    password: str | None = None
    """PostgreSQL password (decoded); never shown by ``repr``."""
    dbname: str | None = None
    pool_size: int = DEFAULT_POOL_SIZE
    """PostgreSQL connections kept open by one journal."""
    lock_wait: float = DEFAULT_LOCK_WAIT
    """Longest wait (seconds) of a write for the journal's lock, held by another connection or
    process (a backup, a VACUUM, an open shell transaction); then the write fails with
    ``JournalBusy`` and nothing is stored. Kept below the caller's ask timeout, so a caller told
    of a failure never finds the write appended later (SPEC §6)."""

    def __repr__(self) -> str:
        """Show every field but the password, which is masked when set."""
        fields = []
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if name == "password" and value is not None:
                value = "***"
            fields.append(f"{name}={value!r}")
        return f"JournalConfig({', '.join(fields)})"


def default_url(cwd: Path | None = None) -> str:
    """Return the embedded default: a SQLite file under the working directory."""
    base = cwd if cwd is not None else Path.cwd()
    return f"sqlite:///{(base / DEFAULT_SQLITE_PATH).resolve()}"


def _mask(url: str) -> str:
    """Hide the password (and any ``password=`` query value) of a URL, even a malformed one."""
    masked = re.sub(r"(?i)([?&][^=&#]*pass[^=&#]*=)[^&#]*", r"\1***", url)
    try:
        password = urlsplit(masked).password
    except ValueError:
        return re.sub(r"(://[^/@:]*:)[^/]*@", r"\1***@", masked)
    if password:
        return masked.replace(f":{password}@", ":***@", 1)
    return masked


def parse_url(url: str) -> JournalConfig:
    """Parse a journal URL, or raise :class:`JournalUrlError` naming what is wrong and the fix."""
    if not isinstance(url, str):
        raise JournalUrlError(
            f"journal URL must be a string, got {type(url).__name__}: pass "
            "url='sqlite:///path/journal.sqlite', 'memory://' or 'postgresql://…' to "
            "journaled.open()"
        )
    if any(0xD800 <= ord(c) <= 0xDFFF or ord(c) < 0x20 for c in url.strip()):
        raise JournalUrlError(
            f"journal URL {_mask(url)!r} holds a control character or a lone surrogate: "
            "write it as plain text"
        )
    if not url.strip():
        raise JournalUrlError(
            "journal URL is empty: pass url='sqlite:///path/journal.sqlite', 'memory://' or "
            "'postgresql://user:pass@host:port/db' to journaled.open(), or set JOURNALED_URL"
        )
    masked = _mask(url)
    if "#" in url:
        raise _fragment_refused(url.strip(), masked)
    try:
        parts = urlsplit(url.strip())
    except ValueError as exc:
        raise JournalUrlError(f"journal URL {masked!r} is malformed: {exc}") from None
    scheme = parts.scheme.lower()
    query = _query(parts.query, masked)
    if scheme == "memory":
        _no_params(query, masked, allowed=())
        return JournalConfig(url=masked, backend="memory")
    if scheme == "sqlite":
        _no_params(query, masked, allowed=("durability",))
        durability = query.get("durability", "normal")
        if durability not in ("normal", "full"):
            raise JournalUrlError(
                f"journal URL {masked!r}: durability={durability!r} is not one of 'normal', 'full'"
            )
        if parts.netloc:
            raise JournalUrlError(
                f"journal URL {masked!r} has a host {parts.netloc!r}: SQLite journals are files, "
                "write sqlite:///relative/path.sqlite or sqlite:////absolute/path.sqlite"
            )
        if not url.strip()[len("sqlite:") :].startswith("//"):
            # `sqlite:/abs/j.sqlite` would otherwise be read as `sqlite:///abs/j.sqlite`, the
            # relative path abs/j.sqlite under the working directory (ADR 0004's update).
            given = parts.path.lstrip("/") or "journal.sqlite"
            raise JournalUrlError(
                f"journal URL {masked!r} does not start with sqlite:/// (three slashes): write "
                f"sqlite:////{given} for the absolute path /{given}, or sqlite:///{given} for "
                "a path relative to the working directory"
            )
        raw = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not raw or raw.endswith("/"):
            raise JournalUrlError(
                f"journal URL {masked!r} names no database file: write sqlite:///path/journal.sqlite"
            )
        if raw == ":memory:":
            raise JournalUrlError(
                f"journal URL {masked!r}: SQLite ':memory:' databases are per connection and lose "
                "writes across threads; use 'memory://' for an in-process journal"
            )
        path = Path(raw).expanduser()
        resolved = path if path.is_absolute() else (Path.cwd() / path)
        return JournalConfig(
            url=masked,
            backend="sqlite",
            path=str(resolved.resolve()),
            durability="full" if durability == "full" else "normal",
        )
    if scheme in ("postgresql", "postgres"):
        return _postgres(parts, query, masked)
    raise JournalUrlError(
        f"journal URL {masked!r} has unknown scheme {parts.scheme!r}: use 'sqlite:///path', "
        "'memory://' or 'postgresql://user:pass@host:port/db'"
    )


def _postgres(parts: SplitResult, query: dict[str, str], masked: str) -> JournalConfig:
    """Parse ``postgresql://user:pass@host:port/db?pool_size=N``."""
    if "durability" in query:
        raise JournalUrlError(
            f"journal URL {masked!r}: durability applies to SQLite journals only; PostgreSQL "
            "commits durably by its own settings (synchronous_commit): remove ?durability="
        )
    _no_params(query, masked, allowed=("pool_size",))
    try:
        port = parts.port
    except ValueError:
        raise JournalUrlError(
            f"journal URL {masked!r} has an invalid port: write postgresql://user:pass@host:5432/db"
        ) from None
    host = parts.hostname
    if not host:
        raise JournalUrlError(
            f"journal URL {masked!r} names no host: write postgresql://user:pass@host:5432/db"
        )
    dbname = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
    if not dbname or "/" in dbname:
        raise JournalUrlError(
            f"journal URL {masked!r} names no database: write postgresql://user:pass@host:5432/db"
        )
    user = unquote(parts.username) if parts.username else ""
    if not user:
        raise JournalUrlError(
            f"journal URL {masked!r} names no user: write postgresql://user:pass@host:5432/db"
        )
    raw_size = query.get("pool_size", str(DEFAULT_POOL_SIZE))
    try:
        pool_size = int(raw_size)
    except ValueError:
        pool_size = 0
    if not 1 <= pool_size <= MAX_POOL_SIZE:
        raise JournalUrlError(
            f"journal URL {masked!r}: pool_size={raw_size!r} is not a whole number from 1 to "
            f"{MAX_POOL_SIZE}"
        )
    return JournalConfig(
        url=masked,
        backend="postgresql",
        host=host,
        port=port if port is not None else DEFAULT_POSTGRES_PORT,
        user=user,
        password=unquote(parts.password) if parts.password is not None else None,
        dbname=dbname,
        pool_size=pool_size,
    )


def _fragment_refused(url: str, masked: str) -> JournalUrlError:
    """Return the error for a URL holding ``#``: what follows it would be dropped as a fragment,
    so ``sqlite:////dir/my#1.sqlite`` would open ``/dir/my`` (ADR 0004's update)."""
    scheme = url.split(":", 1)[0].lower()
    if scheme in ("postgresql", "postgres"):
        # A '#' in a password cuts it short, and _mask would then miss it: show no userinfo,
        # and nothing after a '#' (a password given as ?password=...#... goes on there).
        head, at, tail = url.rpartition("@")
        shown = f"{head.split('://', 1)[0]}://***@{tail}" if at and "://" in head else masked
        shown = shown.split("#", 1)[0] + ("#..." if "#" in shown else "")
        return JournalUrlError(
            f"journal URL {shown!r} holds a '#', where a URL ends: percent-encode it as %23 in "
            "the user, password or database name"
        )
    if scheme == "sqlite":
        return JournalUrlError(
            f"journal URL {masked!r} holds a '#', where a URL ends (the rest would be dropped and "
            "another file opened), and a SQLite path is not percent-decoded: rename the file, or "
            "reach it through a path without '#' (a symbolic link)"
        )
    return JournalUrlError(f"journal URL {masked!r} holds a '#', where a URL ends: remove it")


def _query(text: str, masked: str) -> dict[str, str]:
    """Return a URL's query parameters, refusing one given twice (neither would win silently)."""
    pairs = parse_qsl(text, keep_blank_values=True)
    names = [name for name, _ in pairs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise JournalUrlError(
            f"journal URL {masked!r} gives {', '.join(twice)} more than once: give each "
            "parameter once"
        )
    return dict(pairs)


def _no_params(query: dict[str, str], masked: str, allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(query) - set(allowed))
    if unknown:
        hint = f" (this backend accepts: {', '.join(allowed)})" if allowed else ""
        raise JournalUrlError(
            f"journal URL {masked!r} has unknown parameter(s) {', '.join(unknown)}{hint}"
        )
