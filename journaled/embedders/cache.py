"""Fact vectors kept across restarts: a projection beside the journal, never in it (ADR 0048).

Vectors are keyed by ``(model, sha256 of the text)`` (of the organization and the text, for a
fact of an organization's own scope), so a text is embedded once per model however many facts
hold it and however often the runtime restarts; each fact that led to a vector is
linked to it, so a purge can find what to drop. Only texts of facts are stored: every one of them
was redacted before it reached the journal (M9), and query texts are never kept.

Purge reaches the cache twice: ``forget_facts`` at once, from the purging runtime, and
``catch_up`` before every use, which reads the journal's ``memory.fact-purged`` events after the
position the cache last saw, so purges by another process, or while no runtime was open, are
applied before any vector is served. Deleted rows are overwritten on disk (``secure_delete``),
and the file's write-ahead log is then emptied (:meth:`VectorCache.scrub`), as the journal's is
after an erasure (ADR 0005): a checkpoint another connection holds back is owed, retried at the
cache's next use and by every scrub of the runtime, which reports it pending meanwhile.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from array import array
from collections.abc import Iterable, Iterator, Sequence
from contextlib import closing, contextmanager, suppress

from journaled.events.codec import topics_of
from journaled.events.journal import Journal, truncate_wal
from journaled.events.memory import FactPurged

__all__ = ["VectorCache", "digest"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS vectors (
    model TEXT NOT NULL, digest BLOB NOT NULL, vector BLOB NOT NULL,
    PRIMARY KEY (model, digest));
CREATE TABLE IF NOT EXISTS facts (
    model TEXT NOT NULL, fact_id TEXT NOT NULL, digest BLOB NOT NULL,
    PRIMARY KEY (model, fact_id));
CREATE INDEX IF NOT EXISTS facts_by_id ON facts (fact_id);
CREATE TABLE IF NOT EXISTS position (id INTEGER PRIMARY KEY CHECK (id = 0), seen INTEGER NOT NULL);
"""

_KEYING = 2
"""The file's ``user_version`` once vectors are keyed as :func:`digest` keys them now."""
_PURGED_TOPICS = topics_of(FactPurged)
_BUSY = 2.0
"""Seconds a write waits for another process's: a cache that stays busy is skipped, not
waited for (search answers with the vectors it computed, M7)."""


def _purged_ids(journal: Journal, after: int, upto: int) -> list[str]:
    """Return the ids of the facts the journal purged after ``after``, up to ``upto``."""
    return [
        e.data.fact_id
        for e in journal.read(after=after, upto=upto, topics=_PURGED_TOPICS)
        if isinstance(e.data, FactPurged)
    ]


def _logged(path: str) -> bool:
    """Tell whether a cache file has a write-ahead log that is not empty."""
    try:
        return os.path.getsize(path + "-wal") > 0
    except OSError:
        return False


def digest(text: str, owner: str | None = None) -> bytes:
    """Return the cache key of a text: its SHA-256 over UTF-8.

    The text of a fact of an organization's own scope is keyed with that ``owner``: a vector
    cached for it never serves, nor tells of, another organization's fact of the same text
    (R1, ADR 0078). Shared scopes' facts are everyone's, and so are their vectors.
    """
    if owner is None:
        return hashlib.sha256(text.encode("utf-8")).digest()
    # The owner's own digest first, fixed in length: no (owner, text) pair keys another's.
    return hashlib.sha256(hashlib.sha256(owner.encode()).digest() + text.encode()).digest()


class VectorCache:
    """Vectors of fact texts by (model, text digest), in memory or in a SQLite file.

    Thread-safe. A file cache opens a connection per operation, so it holds no handle between
    calls and needs no closing; an in-memory cache (``path=None``) lives as long as the runtime.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._vectors: dict[tuple[str, bytes], list[float]] = {}
        self._facts: dict[tuple[str, str], bytes] = {}
        self._seen = 0
        self._purged: set[str] = set()
        self._applied = 0
        """The journal position up to which this process applied purges to its memo and owed
        rows itself (a file's own position may be ahead: another process moved it)."""
        self._unwritten: dict[tuple[str, str], tuple[bytes, list[float]]] = {}
        """File-cache rows by (model, fact id) that the memo holds and the file does not yet:
        a write failed (a full disk) or was held back (no catch-up vouched for it)."""
        self._unscrubbed = path is not None and _logged(path)
        """Whether the file's write-ahead log may still hold rows deleted from it: a checkpoint
        after a delete was held back by another connection, or the log was left by a process
        that may have stopped before its own (ADR 0065 update). It stays set while a checkpoint
        is being tried, so a reader of :attr:`scrub_pending` never sees it clear too early."""
        self._deletes = 0
        """Deletes made so far: a checkpoint clears the debt only if none came during it."""
        if path is not None:
            with self._connect():
                pass  # made (or checked) now: a file that cannot be is known at once

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """Open the file, making its tables if it lost them (deleted while open: rebuilt on
        use). WAL, so that a reader (a backup) never holds up a write; a writer waits for
        another at most :data:`_BUSY` seconds, and the caller goes on without the cache."""
        assert self.path is not None
        if self._unscrubbed:  # owed since a reader held the log: tried again at each use
            self._scrub_quietly()
        with closing(sqlite3.connect(self.path, timeout=_BUSY, isolation_level=None)) as db:
            db.execute("PRAGMA secure_delete = ON")
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                with suppress(sqlite3.OperationalError):  # a reader holds it: next time
                    db.execute("PRAGMA journal_mode = WAL")
            tables = db.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
                " AND name IN ('vectors', 'facts', 'position')"
            ).fetchone()[0]
            if tables < 3:  # a new file, or one deleted while open: made again (a read else)
                db.executescript(_SCHEMA)
                db.execute("INSERT OR IGNORE INTO position (id, seen) VALUES (0, 0)")
                db.execute(f"PRAGMA user_version = {_KEYING}")
                with self._lock:  # what the file held is embedded and stored again
                    self._vectors.clear()
                    self._facts.clear()
            elif db.execute("PRAGMA user_version").fetchone()[0] < _KEYING:
                # Kept by an earlier release, which keyed an organization's fact vectors by
                # their text alone: one would still answer another organization's same text
                # (ADR 0078). A cache: emptied once, its vectors are embedded again on use.
                db.execute("DELETE FROM facts")
                db.execute("DELETE FROM vectors")
                db.execute(f"PRAGMA user_version = {_KEYING}")
                with self._lock:
                    self._vectors.clear()
                    self._facts.clear()
            db.execute("BEGIN")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def get(self, model: str, digests: Sequence[bytes]) -> dict[bytes, list[float]]:
        """Return the cached vectors among ``digests`` for ``model``."""
        with self._lock:
            found = {d: self._vectors[model, d] for d in digests if (model, d) in self._vectors}
        missing = [d for d in dict.fromkeys(digests) if d not in found]
        if self.path is None or not missing:
            return found
        loaded: dict[bytes, list[float]] = {}
        with self._connect() as db:
            for d in missing:
                row = db.execute(
                    "SELECT vector FROM vectors WHERE model = ? AND digest = ?", (model, d)
                ).fetchone()
                if row is not None:
                    loaded[d] = array("d", row[0]).tolist()
        with self._lock:
            self._vectors.update(((model, d), v) for d, v in loaded.items())
        return found | loaded

    def put(
        self, model: str, entries: Iterable[tuple[str, bytes, list[float]]], write: bool = True
    ) -> None:
        """Store ``(fact_id, digest, vector)`` entries; facts purged by this runtime are skipped.

        The memo takes them at once. A file cache writes them with every row a write before
        failed or held back; with ``write`` False (the caller could not apply the journal's
        purges first, R2) they wait for the next write instead. A write that raises leaves
        them waiting too, so vectors embedded on a full disk reach the file once it has room.
        """
        with self._lock:
            rows = [(f, d, list(v)) for f, d, v in entries if f not in self._purged]
            for fact_id, d, vector in rows:
                self._vectors[model, d] = vector
                self._facts[model, fact_id] = d
            if self.path is None:
                return
            for fact_id, d, vector in rows:
                self._unwritten[model, fact_id] = (d, vector)
            if not write or not self._unwritten:
                return
            owed = [
                (key, row) for key, row in self._unwritten.items() if key[1] not in self._purged
            ]
        with self._connect() as db:
            db.executemany(
                "INSERT OR REPLACE INTO vectors (model, digest, vector) VALUES (?, ?, ?)",
                [(m, d, array("d", v).tobytes()) for (m, _), (d, v) in owed],
            )
            db.executemany(
                "INSERT OR REPLACE INTO facts (model, fact_id, digest) VALUES (?, ?, ?)",
                [(m, f, d) for (m, f), (d, _) in owed],
            )
        with self._lock:
            for key, row in owed:
                if self._unwritten.get(key) is row:  # not put again meanwhile
                    del self._unwritten[key]

    @property
    def owes_writes(self) -> bool:
        """Tell whether the memo holds rows the file cache has not been written yet."""
        with self._lock:
            return bool(self._unwritten)

    def forget_facts(self, fact_ids: Iterable[str]) -> int:
        """Drop the facts' links, and every vector no remaining fact links to; return how many."""
        ids = set(fact_ids)
        if not ids:
            return 0
        with self._lock:
            self._purged.update(ids)
            for link in [k for k in self._unwritten if k[1] in ids]:
                del self._unwritten[link]
            dropped = {d for (_, f), d in self._facts.items() if f in ids}
            for link in [k for k in self._facts if k[1] in ids]:
                del self._facts[link]
            if self.path is not None:
                # The file decides what is still linked; the memo just forgets and re-reads.
                for key in [k for k in self._vectors if k[1] in dropped]:
                    del self._vectors[key]
            else:
                keep = {(m, d) for (m, _), d in self._facts.items()}
                gone = [k for k in self._vectors if k not in keep]
                for key in gone:
                    del self._vectors[key]
                return len(gone)
        with self._connect() as db:
            linked = [
                row
                for i in sorted(ids)
                for row in db.execute("SELECT digest FROM facts WHERE fact_id = ?", (i,))
            ]
            db.executemany("DELETE FROM facts WHERE fact_id = ?", [(i,) for i in sorted(ids)])
            cursor = db.execute(
                "DELETE FROM vectors WHERE NOT EXISTS (SELECT 1 FROM facts"
                " WHERE facts.model = vectors.model AND facts.digest = vectors.digest)"
            )
        with self._lock:
            stale = {row[0] for row in linked}
            for key in [k for k in self._vectors if k[1] in stale]:
                del self._vectors[key]
            self._unscrubbed = True
            self._deletes += 1
        self._scrub_quietly()
        return cursor.rowcount

    @property
    def scrub_pending(self) -> bool:
        """Tell whether rows deleted from the file may still be in its write-ahead log."""
        with self._lock:
            return self._unscrubbed

    def scrub(self, wait: float) -> bool:
        """Empty the file's write-ahead log, so that no frame of it keeps a deleted vector (M10).

        The journal's way (ADR 0005): the deletes zeroed the rows (``secure_delete``), and a
        checkpoint that gives way to readers and writers, repeated for up to ``wait`` seconds,
        copies the zeroed pages into the file and truncates the log. Runs whether or not this
        process deleted anything, so a log another process left is emptied too.

        Returns:
            True once the log is empty (or there is no file); False when another connection kept
            reading older data for ``wait`` seconds: the checkpoint stays owed.

        Raises:
            sqlite3.OperationalError: the disk is full; the checkpoint stays owed.
        """
        if self.path is None or not os.path.exists(self.path):
            with self._lock:
                self._unscrubbed = False
            return True
        with self._lock:
            seen = self._deletes
        done = truncate_wal(self.path, wait)  # a full disk: raised, the debt stays
        if done:
            with self._lock:
                if self._deletes == seen:  # a delete during the checkpoint may be after it
                    self._unscrubbed = False
        return done

    def _scrub_quietly(self) -> None:
        """Try the owed checkpoint once, giving way at once: a failure leaves it owed."""
        with suppress(sqlite3.Error, OSError):
            self.scrub(0.0)

    def catch_up(self, journal: Journal) -> int:
        """Apply every purge the journal recorded after the position this cache last saw;
        return the journal position it applied them up to.

        A file's position may have been moved by another process, which applied the purges up
        to it to the file but not to this process's memo, nor to the rows owed to the file
        (:meth:`put`): those learn of the purges between this cache's own position and the
        file's first, so a fact purged there is never served from the memo nor written back.
        """
        if self.path is None:
            seen = self._seen
        else:
            with self._connect() as db:
                row = db.execute("SELECT seen FROM position WHERE id = 0").fetchone()
            seen = 0 if row is None else int(row[0])
        # The journal's position after the file's: another process that moves the file past a
        # purge in between has committed the purge, which then lies before ``last`` (R2).
        last = journal.position()
        if self.path is not None:
            with self._lock:
                mine = self._applied
            if mine < min(seen, last):
                self._forget_here(_purged_ids(journal, mine, min(seen, last)))
                with self._lock:
                    self._applied = max(self._applied, min(seen, last))
        if last <= seen:
            return seen
        self.forget_purged(journal, seen, last)
        if self.path is None:
            self._seen = last
            return last
        with self._connect() as db:
            db.execute("INSERT OR IGNORE INTO position (id, seen) VALUES (0, 0)")
            db.execute("UPDATE position SET seen = ? WHERE id = 0 AND seen < ?", (last, last))
        with self._lock:
            self._applied = max(self._applied, last)
        return last

    def forget_purged(self, journal: Journal, after: int, upto: int | None = None) -> None:
        """Drop the vectors of the facts the journal purged after a position.

        Also what a caller runs after storing vectors it embedded from a catch-up at ``after``:
        another process may have purged one of those facts, and moved this file's position past
        that purge, meanwhile (R2).
        """
        end = journal.position() if upto is None else upto
        if end <= after:
            return
        purged = _purged_ids(journal, after, end)
        if purged:
            self.forget_facts(purged)

    def learn(self, journal: Journal) -> None:
        """Apply the purges the journal recorded since this process last applied any to its memo
        and the rows it owes the file alone: what a search does when the file cannot be read
        now (its next catch-up applies them to the file), and before it writes rows, so a
        purged fact is still neither served from the memo, embedded, nor written back (R2)."""
        last = journal.position()
        with self._lock:
            mine = self._applied
        if mine < last:
            self._forget_here(_purged_ids(journal, mine, last))
            with self._lock:
                self._applied = max(self._applied, last)

    def _forget_here(self, fact_ids: list[str]) -> None:
        """Apply purges the file applied already to this process alone: its memo of their
        vectors and the rows it owes the file."""
        ids = set(fact_ids)
        if not ids:
            return
        with self._lock:
            self._purged.update(ids)
            dropped = {d for (_, f), d in self._facts.items() if f in ids}
            for link in [k for k in self._facts if k[1] in ids]:
                del self._facts[link]
            for link in [k for k in self._unwritten if k[1] in ids]:
                del self._unwritten[link]
            for key in [k for k in self._vectors if k[1] in dropped]:
                del self._vectors[key]

    def purged(self, fact_ids: Iterable[str]) -> set[str]:
        """Return those of ``fact_ids`` this cache knows purged (their texts are never embedded)."""
        with self._lock:
            return {f for f in fact_ids if f in self._purged}

    def __len__(self) -> int:
        """Return how many vectors are stored."""
        if self.path is None:
            with self._lock:
                return len(self._vectors)
        with self._connect() as db:
            return int(db.execute("SELECT count(*) FROM vectors").fetchone()[0])
