"""Parse a journal URL into a :class:`JournalConfig` (J4).

One URL chooses the backend: ``memory://`` (an in-process journal for tests), ``sqlite:///path``
(the embedded default; a relative path after ``sqlite:///`` is relative to the working directory,
``sqlite:////abs/path`` is absolute), and ``postgresql://user:pass@host:port/db``. Query parameters
tune the backend: ``durability=normal|full`` for SQLite (``full`` fsyncs every commit; ``normal``,
the default, loses nothing when a process is killed, only on power loss).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, urlsplit

import msgspec

from events.errors import JournalUrlError

Backend = Literal["memory", "sqlite", "postgresql"]
Durability = Literal["normal", "full"]

DEFAULT_SQLITE_PATH = Path(".journaled") / "journal.sqlite"


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
    dbname: str | None = None


def default_url(cwd: Path | None = None) -> str:
    """Return the embedded default: a SQLite file under the working directory."""
    base = cwd if cwd is not None else Path.cwd()
    return f"sqlite:///{(base / DEFAULT_SQLITE_PATH).resolve()}"


def _mask(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@", 1)
    return url


def parse_url(url: str) -> JournalConfig:
    """Parse a journal URL, or raise :class:`JournalUrlError` naming what is wrong and the fix."""
    if not isinstance(url, str) or not url.strip():
        raise JournalUrlError(
            "journal URL is empty: pass url='sqlite:///path/journal.sqlite', 'memory://' or "
            "'postgresql://user:pass@host:port/db' to journaled.open(), or set JOURNALED_URL"
        )
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    masked = _mask(url)
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
        raise JournalUrlError(
            f"journal URL {masked!r}: PostgreSQL journals are not available in this release; "
            "use sqlite:///path/journal.sqlite (the embedded default) or memory://"
        )
    raise JournalUrlError(
        f"journal URL {masked!r} has unknown scheme {parts.scheme!r}: use 'sqlite:///path', "
        "'memory://' or 'postgresql://user:pass@host:port/db'"
    )


def _no_params(query: dict[str, str], masked: str, allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(query) - set(allowed))
    if unknown:
        hint = f" (this backend accepts: {', '.join(allowed)})" if allowed else ""
        raise JournalUrlError(
            f"journal URL {masked!r} has unknown parameter(s) {', '.join(unknown)}{hint}"
        )
