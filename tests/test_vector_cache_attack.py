"""The vector cache beside the journal under attack: purges another process applied, rows owed to
the file, in-memory caches, unreadable files, late embedder answers.

SPEC M7, M10, R2; ADR 0048, ADR 0065 (and its updates), ADR 0067. Real SQLite files, the
PostgreSQL fixture, real threads and subprocesses.
"""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import journaled
from journaled.events.journal import truncate_wal
from journaled.events.memory import Fact
from journaled.testing import KeywordEmbedder, ManualClock

ROOT = Path(__file__).resolve().parent.parent
WORDS = ["cat", "dog", "fish", "bird"]
SECRET = "cat secret plan"


class NamedEmbedder(KeywordEmbedder):
    """A keyword embedder that names its model, so its vectors are kept beside the journal."""

    model = "keywords-v1"


class Gated(NamedEmbedder):
    """A named keyword embedder whose calls wait while ``gate`` is closed."""

    def __init__(self, vocabulary: list[str]) -> None:
        super().__init__(vocabulary)
        self.gate = threading.Event()
        self.gate.set()
        self.answered = threading.Event()

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Wait for the gate, then answer as the keyword embedder does."""
        self.gate.wait(30)
        try:
            return super().embed(texts)
        finally:
            self.answered.set()


def _linked(path: Path) -> set[str]:
    """Return the fact ids a vector cache file links to vectors."""
    db = sqlite3.connect(path)
    try:
        return {str(r[0]) for r in db.execute("SELECT fact_id FROM facts")}
    finally:
        db.close()


def _embedded(embedder: KeywordEmbedder, text: str) -> bool:
    return any(text in t for call in embedder.calls for t in call)


def _purge_elsewhere(tmp_path: Path, url: str, fact_id: str, search: bool) -> None:
    """Purge a fact in another process; with ``search``, search there too with the same named
    model, which moves the cache file's position past the purge."""
    body = f"""
        import journaled
        from journaled.testing import KeywordEmbedder

        class Named(KeywordEmbedder):
            model = {NamedEmbedder.model!r}

        with journaled.open({url!r}, embedder=Named({WORDS!r})) as rt:
            assert rt.memory.purge({fact_id!r}, reason="asked to forget")
            if {search!r}:
                rt.memory.search_semantic("cat")
        """
    script = tmp_path / "purge.py"
    script.write_text(textwrap.dedent(body))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, timeout=60, check=False, capture_output=True
    )
    assert done.returncode == 0, done.stderr.decode()


@contextmanager
def _embedded_then_secret(
    url: str, clock: ManualClock
) -> Iterator[tuple[journaled.Runtime, NamedEmbedder, Fact, Fact]]:
    """A runtime on ``url`` that does not follow other processes, its memory holding "cat dog",
    embedded by a search, then SECRET, not embedded yet; yield it, its embedder and both facts."""
    embedder = NamedEmbedder(WORDS)
    with journaled.open(url, clock=clock, embedder=embedder, follow=None) as rt:
        kept = rt.memory.remember("cat dog")
        rt.memory.search_semantic("cat")
        gone = rt.memory.remember(SECRET)
        yield rt, embedder, kept, gone


# -- in-memory caches: PostgreSQL journals, embedders without a model name -------------------------


def _journal_and_embedder(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[str, KeywordEmbedder]:
    """A journal of ``backend`` and an embedder whose vectors are cached in memory only: one
    without a model name on SQLite, any on PostgreSQL."""
    url = (
        str(request.getfixturevalue("pg_url"))
        if backend == "postgresql"
        else f"sqlite:///{tmp_path / 'journal.sqlite'}"
    )
    embedder = NamedEmbedder(WORDS) if backend == "postgresql" else KeywordEmbedder(WORDS)
    return url, embedder


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_an_in_memory_cache_never_embeds_a_fact_another_process_purged(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> None:
    """R2, ADR 0065 update: a runtime whose memory has not folded another process's purge
    (``follow=None``) never sends the purged text to its embedder, whatever its cache: the
    in-memory one (an embedder without a model name, a PostgreSQL journal) as the file."""
    url, embedder = _journal_and_embedder(backend, request, tmp_path)
    with journaled.open(url, clock=clock, embedder=embedder, follow=None) as rt:
        gone = rt.memory.remember(SECRET)
        kept = rt.memory.remember("cat dog")
        _purge_elsewhere(tmp_path, url, gone.id, search=False)
        assert rt.memory.get(gone.id) is not None  # not followed: memory still holds it
        found = rt.memory.search_semantic("cat")
        assert not _embedded(embedder, SECRET)
        assert [f.id for f in found] == [kept.id]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_an_in_memory_memo_never_serves_a_vector_another_process_purged(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> None:
    """R2: a vector the in-memory memo holds for a fact another process then purged is not
    ranked: the semantic ranking treats the fact as memory will once it folds the purge."""
    url, embedder = _journal_and_embedder(backend, request, tmp_path)
    with journaled.open(url, clock=clock, embedder=embedder, follow=None) as rt:
        gone = rt.memory.remember(SECRET)
        kept = rt.memory.remember("cat dog")
        rt.memory.search_semantic("cat")  # both embedded and memoized
        _purge_elsewhere(tmp_path, url, gone.id, search=False)
        scored, ranking = rt.memory.search_scored("cat", semantic=True)
        assert ranking == "semantic"
        assert [f.id for _, f in scored] == [kept.id]


# -- a cache file that cannot be read --------------------------------------------------------------


def test_a_cache_file_unreadable_now_still_learns_purges_from_the_journal(
    tmp_path: Path, clock: ManualClock
) -> None:
    """R2, M7: the cache file turns unreadable while the runtime is open (its catch-up fails);
    the purges another process recorded are still read from the journal, so the text of a fact
    memory has not folded the purge of is not sent to the embedder, and the search answers."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    cache = tmp_path / "journal.sqlite.vectors"
    with _embedded_then_secret(url, clock) as (rt, embedder, kept, gone):
        for extra in ("-wal", "-shm"):
            Path(str(cache) + extra).unlink(missing_ok=True)
        cache.write_bytes(b"this is not a database" * 200)
        _purge_elsewhere(tmp_path, url, gone.id, search=False)
        scored, ranking = rt.memory.search_scored("cat", semantic=True)
        assert not _embedded(embedder, SECRET)
        assert (ranking, [f.id for _, f in scored]) == ("semantic", [kept.id])


# -- late embedder answers (ADR 0067) --------------------------------------------------------------


def _join_embed_threads() -> None:
    for thread in threading.enumerate():
        if thread.name == "journaled-embed":
            thread.join(10)


def test_a_late_answer_after_close_never_writes_a_purged_fact_to_the_file(
    tmp_path: Path, clock: ManualClock
) -> None:
    """R2, ADR 0067: a search gave up on its embedder; another process then purged one of the
    facts it had asked about and moved the file's position past the purge; the runtime closed.
    The embedder's late answer must not put the purged fact's vector and link in the file,
    where no later catch-up would ever look for that purge."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    cache = tmp_path / "journal.sqlite.vectors"
    embedder = Gated(WORDS)
    with journaled.open(url, clock=clock, embedder=embedder, follow=None, embed_timeout=0.3) as rt:
        rt.memory.remember("cat dog")
        gone = rt.memory.remember(SECRET)
        embedder.gate.clear()
        rt.memory.search_semantic("cat")  # gives up after 0.3 s: BM25
        _purge_elsewhere(tmp_path, url, gone.id, search=True)
        assert gone.id not in _linked(cache)
    embedder.gate.set()
    assert embedder.answered.wait(10)
    _join_embed_threads()
    time.sleep(0.2)
    assert gone.id not in _linked(cache)
    with journaled.open(url, clock=clock, embedder=NamedEmbedder(WORDS)) as rt:
        assert gone.id not in {f.id for f in rt.memory.search_semantic("cat")}
    assert gone.id not in _linked(cache)


# -- another process between the catch-up's two reads ----------------------------------------------


def test_a_purge_between_the_catch_ups_two_reads_is_never_embedded(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2: another process purges a fact, and moves the cache file's position past the purge,
    just after this runtime's catch-up read the journal's position and before it read the
    file's. The catch-up must not vouch for the file's position while it applied purges only
    up to the journal's it read: the purged text is neither embedded nor written to the file."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    cache = tmp_path / "journal.sqlite.vectors"
    with _embedded_then_secret(url, clock) as (rt, embedder, kept, gone):
        semantic = rt.memory._semantic
        journal, vectors = semantic._journal, semantic.cache
        real_position, real_connect = journal.position, vectors._connect
        reads: list[str] = []

        def between(read: str) -> None:
            # At the second of the catch-up's two reads, before it is made.
            if read not in reads:
                reads.append(read)
                if len(reads) == 2:
                    _purge_elsewhere(tmp_path, url, gone.id, search=True)

        def position() -> int:
            between("journal")
            return real_position()

        def connect() -> Any:
            between("file")
            return real_connect()

        monkeypatch.setattr(journal, "position", position)
        monkeypatch.setattr(vectors, "_connect", connect)
        rt.memory.search_semantic("cat")
        monkeypatch.undo()
        assert len(reads) == 2
        assert not _embedded(embedder, SECRET)
        assert gone.id not in _linked(cache)
        assert [f.id for f in rt.memory.search_semantic("cat")] == [kept.id]
    assert gone.id not in _linked(cache)


# -- the cache file's write-ahead log (ADR 0065 update 2026-12-08) --------------------------------


class Hashed(NamedEmbedder):
    """A named embedder whose vectors are the text's SHA-256 bytes: each text's vector bytes
    are its own, so a raw read of the files finds exactly that fact's vector."""

    model = "hashed-v1"

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Return one vector per text, from its digest."""
        self.calls.append(list(texts))
        return [[1.0 + b / 997 for b in hashlib.sha256(t.encode()).digest()[:8]] for t in texts]


def _vector_bytes(text: str) -> bytes:
    return array("d", Hashed(WORDS).embed([text])[0]).tobytes()


def _files_holding(directory: Path, data: bytes) -> list[str]:
    """Return the names of the files in ``directory`` whose raw bytes hold ``data``."""
    return sorted(p.name for p in directory.iterdir() if p.is_file() and data in p.read_bytes())


@contextmanager
def _reading(path: Path) -> Iterator[threading.Event]:
    """Hold a read transaction on ``path`` in another thread (a backup copying it) until the
    yielded event is set or the block ends."""
    started, done = threading.Event(), threading.Event()

    def read() -> None:
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute("BEGIN")
            db.execute("SELECT count(*) FROM vectors").fetchone()
            started.set()
            done.wait(30)
            db.execute("COMMIT")
        finally:
            db.close()

    reader = threading.Thread(target=read)
    reader.start()
    assert started.wait(10)
    try:
        yield done
    finally:
        done.set()
        reader.join(10)


def test_a_purged_vector_leaves_the_cache_files_log_while_another_connection_keeps_it_open(
    tmp_path: Path, clock: ManualClock
) -> None:
    """M10, R2, ADR 0065 update: a purge empties the cache file's write-ahead log, as the
    journal's (ADR 0005): a connection that keeps the file open (a monitoring tool) kept the log,
    and the purged fact's vector in it, after the purge, the scrub and the close."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    cache = tmp_path / "journal.sqlite.vectors"
    vector = _vector_bytes(SECRET)
    with journaled.open(url, clock=clock, embedder=Hashed(WORDS)) as rt:
        rt.memory.remember("cat dog")
        rt.memory.search_semantic("cat")
        idle = sqlite3.connect(cache)
        try:
            idle.execute("SELECT count(*) FROM sqlite_master").fetchone()
            gone = rt.memory.remember(SECRET)
            rt.memory.search_semantic("secret")
            assert _files_holding(tmp_path, vector) != []
            assert rt.memory.purge(gone.id, reason="asked to forget")
            assert _files_holding(tmp_path, vector) == []
            assert not rt.memory.scrub_pending
        finally:
            idle.close()


def test_a_reader_holding_the_cache_file_keeps_the_scrub_pending_until_it_ends(
    tmp_path: Path, clock: ManualClock
) -> None:
    """M10, ADR 0065 update: a reader holding older data of the cache file (a backup) holds the
    checkpoint back; the purge still returns, ``scrub_pending`` says so and ``scrub`` raises
    ScrubPending naming the vector cache; once the reader ends a scrub empties the log."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    cache = tmp_path / "journal.sqlite.vectors"
    vector = _vector_bytes(SECRET)
    with journaled.open(url, clock=clock, embedder=Hashed(WORDS)) as rt:
        gone = rt.memory.remember(SECRET)
        rt.memory.remember("cat dog")
        rt.memory.search_semantic("cat")
        with _reading(cache) as done:
            assert rt.memory.purge(gone.id, reason="asked to forget")
            assert rt.memory.scrub_pending
            with pytest.raises(journaled.ScrubPending, match="vector cache"):
                rt.memory.scrub(timeout=0.1)
            assert _files_holding(tmp_path, vector) != []  # the file's pages, or its log's
            done.set()
        rt.memory.scrub(timeout=10)
        assert not rt.memory.scrub_pending
        assert _files_holding(tmp_path, vector) == []
        assert gone.id not in _linked(cache)


def test_a_purge_the_catch_up_applies_empties_the_cache_files_log(
    tmp_path: Path, clock: ManualClock
) -> None:
    """M10, ADR 0048, ADR 0065 update: a purge made by a runtime without the embedder reaches
    the file at the next search's catch-up, and that catch-up empties the file's log too, while
    another connection keeps the file (and so its log) open."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    cache = tmp_path / "journal.sqlite.vectors"
    vector = _vector_bytes(SECRET)
    with journaled.open(url, clock=clock, embedder=Hashed(WORDS)) as rt:
        gone = rt.memory.remember(SECRET)
        kept = rt.memory.remember("cat dog")
        rt.memory.search_semantic("cat")
    idle = sqlite3.connect(cache)
    try:
        idle.execute("SELECT count(*) FROM sqlite_master").fetchone()
        with journaled.open(url, clock=clock) as rt:
            assert rt.memory.purge(gone.id, reason="asked to forget")
        assert _files_holding(tmp_path, vector) != []  # nobody with the cache saw it yet
        with journaled.open(url, clock=clock, embedder=Hashed(WORDS)) as rt:
            assert [f.id for f in rt.memory.search_semantic("cat")] == [kept.id]
            assert _files_holding(tmp_path, vector) == []
            assert not rt.memory.scrub_pending
    finally:
        idle.close()


def test_the_cache_stays_pending_while_a_checkpoint_is_being_tried(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """M10, ADR 0065 update: while one thread tries the owed checkpoint (the scrubber's, in the
    background), ``scrub_pending`` still says the log may hold the deleted rows; and a delete
    made during a checkpoint that then succeeds keeps the debt for the next. Before, the flag
    was cleared when the attempt began, so a purge's caller could read "nothing pending"
    while the vector was still in the log."""
    from journaled.embedders import cache as cache_module  # where the cache looks it up

    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, clock=clock, embedder=Hashed(WORDS)) as rt:
        gone = rt.memory.remember(SECRET)
        other = rt.memory.remember("cat dog")
        rt.memory.search_semantic("cat")
        vectors: Any = rt.memory._semantic.cache
        entered, leave = threading.Event(), threading.Event()
        real = truncate_wal
        trying: threading.Thread | None = None

        def slow(path: str, wait: float) -> bool:
            if threading.current_thread() is trying:  # the other calls pass straight through
                entered.set()
                assert leave.wait(10)
            return real(path, wait)

        with _reading(tmp_path / "journal.sqlite.vectors") as done:
            assert rt.memory.purge(gone.id, reason="asked to forget")
            assert vectors.scrub_pending
            monkeypatch.setattr(cache_module, "truncate_wal", slow)
            trying = threading.Thread(target=vectors.scrub, args=(0.0,))
            trying.start()
            assert entered.wait(10)
            assert vectors.scrub_pending  # mid-attempt: still owed
            vectors.forget_facts([other.id])  # a delete during it; its own try meets the reader
            assert vectors.scrub_pending
            done.set()
        leave.set()
        trying.join(10)
        assert vectors.scrub_pending  # that attempt began before the delete: owed still
        monkeypatch.setattr(cache_module, "truncate_wal", real)
        assert vectors.scrub(10)
        assert not vectors.scrub_pending
