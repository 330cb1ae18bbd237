"""Semantic search, the embedders and their vector cache at their edges (M7, M10, R2; ADR 0048,
0065): a cache file deleted, unwritable or read by a backup, a late vector of a purged fact,
short answers, changed dimensions, unnamed model instances, broken or slow HTTP answers, and an
API key quoted back by the server."""

from __future__ import annotations

import asyncio
import contextvars
import json
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest
from local_http import serving

import journaled
import journaled.aio
from journaled.embedders import (
    EmbeddingsError,
    OpenAIEmbeddings,
    SentenceTransformerEmbeddings,
    digest,
)
from journaled.testing import KeywordEmbedder, ManualClock, wait_for

ROOT = Path(__file__).resolve().parent.parent
WORDS = ["cat", "dog", "fish", "bird"]
KEY = "sk-proj-" + "Q7" * 20  # an API key shaped like a real one


class NamedEmbedder(KeywordEmbedder):
    """A keyword embedder that names its model, so its vectors are kept beside the journal."""

    model = "keywords-v1"


def _cached(path: Path) -> set[tuple[str, bytes]]:
    """Return the (model, digest) keys in a vector cache file."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT model, digest FROM vectors").fetchall()
    db.close()
    return {(str(m), bytes(d)) for m, d in rows}


def _linked(path: Path) -> set[str]:
    """Return the fact ids a vector cache file links to vectors."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT fact_id FROM facts").fetchall()
    db.close()
    return {str(r[0]) for r in rows}


# -- an OpenAI-compatible server on 127.0.0.1 ------------------------------------------------------


def _keyword_vector(text: str, size: int) -> list[float]:
    words = text.lower().split()
    return [float(words.count(w)) for w in WORDS[:size]]


class _Handler(BaseHTTPRequestHandler):
    """Answer POST /v1/embeddings as the wire format says, or misbehave as ``mode`` says."""

    protocol_version = "HTTP/1.1"
    mode: ClassVar[str] = "ok"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        size = int(body.get("dimensions", len(WORDS)))
        data = [
            {"object": "embedding", "index": i, "embedding": _keyword_vector(t, size)}
            for i, t in enumerate(body["input"])
        ]
        raw = json.dumps({"object": "list", "data": data}).encode()
        if _Handler.mode == "truncated":  # promises more bytes than it sends, then hangs up
            self.send_response(200)
            self.send_header("Content-Length", str(len(raw) + 100))
            self.end_headers()
            self.wfile.write(raw)
            self.close_connection = True
        elif _Handler.mode == "garbage":  # not HTTP at all
            self.wfile.write(b"HELLO THERE\r\n\r\n")
            self.close_connection = True
        elif _Handler.mode == "echo-key":  # a proxy that quotes the credential it refuses
            auth = self.headers.get("Authorization", "")
            error = json.dumps({"error": {"message": f"invalid credential {auth}"}}).encode()
            self.send_response(401)
            self.send_header("Content-Length", str(len(error)))
            self.end_headers()
            self.wfile.write(error)
        elif _Handler.mode == "trickle":  # each byte well within the timeout, the whole not
            self.send_response(200)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            pause = 3.0 / len(raw)
            for i in range(len(raw)):
                self.wfile.write(raw[i : i + 1])
                self.wfile.flush()
                time.sleep(pause)
        else:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:
        """Keep the test output quiet."""


@pytest.fixture
def server() -> Iterator[str]:
    """Serve embeddings on 127.0.0.1; yield the API root URL."""
    _Handler.mode = "ok"
    with serving(_Handler) as url:
        yield url


# -- the vector cache file -------------------------------------------------------------------------


def test_a_cache_file_deleted_while_open_is_rebuilt_on_use(
    tmp_path: Path, clock: ManualClock
) -> None:
    """ADR 0048, M7: after the cache file is deleted, search still ranks by cosine."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    cache = tmp_path / "journal.sqlite.vectors"
    with journaled.open(url, clock=clock, embedder=NamedEmbedder(WORDS)) as rt:
        rt.memory.remember("cat dog")
        rt.memory.remember("dog fish")
        assert rt.memory.search_scored("cat", semantic=True)[1] == "semantic"
        cache.unlink()
        assert rt.memory.search_scored("cat", semantic=True)[1] == "semantic"
    assert _cached(cache) == {
        ("keywords-v1", digest("cat dog")),
        ("keywords-v1", digest("dog fish")),
    }


@pytest.mark.parametrize("made_unusable", ["deleted", "a directory"])
def test_a_committed_purge_returns_true_whatever_the_cache_file(
    tmp_path: Path, clock: ManualClock, made_unusable: str
) -> None:
    """M10, R2: a committed purge returns True, and its scrub runs, when the vector cache file
    was deleted (made again on use) or its path cannot be opened at all (the cache applies the
    purge at its next use)."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    cache = tmp_path / "journal.sqlite.vectors"
    with journaled.open(url, clock=clock, embedder=NamedEmbedder(WORDS)) as rt:
        gone = rt.memory.remember("cat secret plan")
        rt.memory.remember("dog")
        rt.memory.search_semantic("cat")
        cache.unlink()
        if made_unusable == "a directory":
            cache.mkdir()  # no file can be opened there
        assert rt.memory.purge(gone.id) is True
        assert rt.memory.get(gone.id) is None
        assert rt.memory.search("secret") == []


def test_a_backup_reading_the_cache_does_not_cost_the_semantic_answer(
    tmp_path: Path, clock: ManualClock
) -> None:
    """M7, ADR 0048: while another process holds a read lock on the cache, search is semantic."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    cache = tmp_path / "journal.sqlite.vectors"
    held = tmp_path / "held"
    done = tmp_path / "done"
    script = tmp_path / "backup.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sqlite3, sys, time
            cache, held, done = sys.argv[1:]
            db = sqlite3.connect(cache, isolation_level=None)
            db.execute("BEGIN")
            db.execute("SELECT count(*) FROM vectors").fetchone()  # a shared lock, as a backup
            open(held, "w").close()
            deadline = time.monotonic() + 50
            while not os.path.exists(done) and time.monotonic() < deadline:
                time.sleep(0.02)
            db.execute("COMMIT")
            """
        )
    )
    with journaled.open(url, clock=clock, embedder=NamedEmbedder(WORDS)) as rt:
        rt.memory.remember("cat dog")
        proc = subprocess.Popen(
            [sys.executable, str(script), str(cache), str(held), str(done)], cwd=ROOT
        )
        try:
            wait_for(held.exists, timeout=20)
            rt.memory.remember("dog fish")  # a text not cached yet: search must store it
            _, ranking = rt.memory.search_scored("cat", semantic=True)
            stored = _cached(cache)  # while the reader still holds its lock (WAL)
        finally:
            done.touch()
            proc.wait(timeout=60)
        assert ranking == "semantic"
        assert ("keywords-v1", digest("dog fish")) in stored


def test_a_late_put_cannot_bring_back_a_purged_facts_vector(
    tmp_path: Path, clock: ManualClock
) -> None:
    """R2, M10, ADR 0048: a vector of a text purged meanwhile by another process never lands."""
    journal = tmp_path / "journal.sqlite"
    url = f"sqlite:///{journal}"
    cache = tmp_path / "journal.sqlite.vectors"
    asked = tmp_path / "asked"
    go = tmp_path / "go"

    class Slow(NamedEmbedder):
        """Pause while embedding the fact texts, until the test says go."""

        def embed(self, texts: list[str]) -> list[list[float]]:
            if "cat secret plan" in texts:
                asked.touch()
                wait_for(go.exists, timeout=30)
            return super().embed(texts)

    with journaled.open(url, clock=clock) as rt:
        gone = rt.memory.remember("cat secret plan")
        kept = rt.memory.remember("dog fish")
    script = tmp_path / "purger.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import journaled
            from journaled.testing import KeywordEmbedder

            class Named(KeywordEmbedder):
                model = "keywords-v1"

            with journaled.open({url!r}, embedder=Named({WORDS!r})) as rt:
                assert rt.memory.purge({gone.id!r})
                rt.memory.search_semantic("dog")  # its cache catches up past the purge
            """
        )
    )
    errors: list[BaseException] = []
    with journaled.open(url, clock=clock, embedder=Slow(WORDS)) as rt:

        def search() -> None:
            try:
                rt.memory.search_semantic("cat")
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=search)
        thread.start()
        try:
            wait_for(asked.exists, timeout=20)
            done = subprocess.run([sys.executable, str(script)], cwd=ROOT, timeout=60, check=False)
            assert done.returncode == 0
        finally:
            go.touch()
            thread.join(timeout=30)
        assert not errors
    with journaled.open(url, clock=clock, embedder=NamedEmbedder(WORDS)) as rt:
        assert [f.id for f in rt.memory.search_semantic("dog")] == [kept.id]
    assert ("keywords-v1", digest("cat secret plan")) not in _cached(cache)
    assert gone.id not in _linked(cache)


# -- what an embedder answers ----------------------------------------------------------------------


def test_a_short_answer_is_not_cached_under_the_wrong_texts(
    tmp_path: Path, clock: ManualClock
) -> None:
    """M7: vectors of a batch with a missing one are never cached against other texts."""

    class DropsFirst(NamedEmbedder):
        """Lose the first vector of every batch of more than one text."""

        def embed(self, texts: list[str]) -> list[list[float]]:
            out = super().embed(texts)
            return out[1:] if len(texts) > 1 else out

    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, clock=clock, embedder=DropsFirst(WORDS)) as rt:
        cat = rt.memory.remember("cat cat")
        fish = rt.memory.remember("fish fish")
        assert cat.id < fish.id  # the batch is asked in candidate (id) order
        first = [f.id for f in rt.memory.search_semantic("fish")]
    with journaled.open(url, clock=clock, embedder=NamedEmbedder(WORDS)) as rt:
        later = [f.id for f in rt.memory.search_semantic("fish")]
    assert first == [fish.id]  # BM25's answer, or the right cosine
    assert later == [fish.id]  # "cat cat" must not be served fish's vector


def test_changing_dimensions_does_not_silence_semantic_search(
    server: str, tmp_path: Path, clock: ManualClock
) -> None:
    """M7, ADR 0048: vectors of another length under the same model name are not served."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, clock=clock, embedder=OpenAIEmbeddings("toy", server)) as rt:
        cat = rt.memory.remember("cat")
        rt.memory.remember("fish")
        assert [f.id for f in rt.memory.search_semantic("cat")] == [cat.id]
    smaller = OpenAIEmbeddings("toy", server, dimensions=3)
    with journaled.open(url, clock=clock, embedder=smaller) as rt:
        assert [f.id for f in rt.memory.search_semantic("cat")] == [cat.id]


def test_two_unnamed_model_instances_do_not_share_vectors(
    tmp_path: Path, clock: ManualClock
) -> None:
    """ADR 0048: two different models handed over as instances never share cached vectors."""

    class SentenceTransformer:
        """A model in the library's shape: encode() answers an array-like of rows."""

        def __init__(self, words: list[str]) -> None:
            self.words = words

        def encode(self, texts: list[str], **_: object) -> Any:
            rows = [[float(t.split().count(w)) for w in self.words] for t in texts]

            class Rows(list[list[float]]):
                def tolist(self) -> list[list[float]]:
                    return list(self)

            return Rows(rows)

    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    first = SentenceTransformerEmbeddings(instance=SentenceTransformer(["cat", "dog"]))
    with journaled.open(url, clock=clock, embedder=first) as rt:
        rt.memory.remember("cat")
        rt.memory.remember("dog")
        rt.memory.search_semantic("cat")
    other = SentenceTransformer(["dog", "cat"])  # another model: another vector space
    asked: list[list[str]] = []
    real_encode = other.encode

    def encode(texts: list[str], **kw: object) -> Any:
        asked.append(list(texts))
        return real_encode(texts, **kw)

    other.encode = encode  # type: ignore[method-assign]
    second = SentenceTransformerEmbeddings(instance=other)
    with journaled.open(url, clock=clock, embedder=second) as rt:
        rt.memory.search_semantic("cat")
    assert sorted(asked[0]) == ["cat", "dog"]  # the fact texts embedded by this model


# -- the HTTP adapter ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["truncated", "garbage"])
def test_a_broken_http_answer_is_an_embeddings_error(server: str, mode: str) -> None:
    """ADR 0048: a truncated body or a non-HTTP reply raises EmbeddingsError."""
    _Handler.mode = mode
    with pytest.raises(EmbeddingsError):
        OpenAIEmbeddings("toy", server, timeout=5).embed(["cat", "dog"])


def test_an_error_answer_quoting_the_key_does_not_leak_it(server: str) -> None:
    """M9, ADR 0048: the API key never appears in an EmbeddingsError's message."""
    _Handler.mode = "echo-key"
    with pytest.raises(EmbeddingsError, match="HTTP 401") as raised:
        OpenAIEmbeddings("toy", server, api_key=KEY).embed(["cat"])
    assert KEY not in str(raised.value)
    assert KEY not in repr(raised.value)


def test_the_timeout_bounds_the_whole_request(server: str) -> None:
    """ADR 0048: an answer trickled over longer than the timeout is an EmbeddingsError."""
    _Handler.mode = "trickle"  # ~3 s in all, each byte within 0.05 s
    with pytest.raises(EmbeddingsError):
        OpenAIEmbeddings("toy", server, timeout=1.0).embed(["cat"])


# -- an embedder that does not answer (ADR 0067) ---------------------------------------------------


class StuckEmbedder(KeywordEmbedder):
    """A keyword embedder whose calls wait for ``release`` while ``stuck`` is set."""

    model = "keywords-stuck"

    def __init__(self, vocabulary: list[str]) -> None:
        super().__init__(vocabulary)
        self.stuck = threading.Event()
        self.release = threading.Event()
        self.threads: list[str] = []

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Wait while stuck (bounded), then answer as a keyword embedder."""
        self.threads.append(threading.current_thread().name)
        if self.stuck.is_set():
            self.release.wait(30.0)
        return super().embed(texts)


def test_a_stuck_embedder_costs_a_search_its_bound_then_its_answer_is_cached(
    sqlite_url: str,
) -> None:
    """M7, ADR 0067: a search waits ``embed_timeout`` for the embedder, then answers as BM25
    does (it waited for ever); while that call is out, searches fall back at once without
    another call; the late vectors are cached, so the next search embeds only its query."""
    embedder = StuckEmbedder(WORDS)
    with journaled.open(sqlite_url, embedder=embedder, embed_timeout=0.3) as rt:
        for text in ("cat cat dog", "dog fish", "bird cat"):
            rt.memory.remember(text)
        bm25 = rt.memory.search("cat")
        embedder.stuck.set()
        began = time.monotonic()
        assert rt.memory.search_semantic("cat") == bm25
        assert 0.25 <= time.monotonic() - began < 5.0
        assert rt.memory.search_hybrid("cat") == rt.memory.search("cat")
        calls = len(embedder.calls)
        began = time.monotonic()
        assert rt.memory.search_semantic("cat") == bm25  # at once: the first call is still out
        assert time.monotonic() - began < 0.25
        assert len(embedder.calls) == calls
        embedder.stuck.clear()
        embedder.release.set()
        wait_for(lambda: rt.memory._semantic._late == 0, timeout=10.0)
        before = len(embedder.calls)
        semantic = rt.memory.search_semantic("cat")
        assert [f.text for f in semantic] == ["cat cat dog", "bird cat"]
        assert embedder.calls[before:] == [["cat"]]  # the facts' vectors came late and were kept
        assert "journaled-embed" in embedder.threads[0]


def test_without_a_bound_the_embedder_runs_on_the_callers_thread(sqlite_url: str) -> None:
    """ADR 0067: ``embed_timeout=None`` calls the embedder as before: on the searching thread."""
    embedder = StuckEmbedder(WORDS)
    with journaled.open(sqlite_url, embedder=embedder, embed_timeout=None) as rt:
        rt.memory.remember("cat dog")
        assert [f.text for f in rt.memory.search_semantic("cat")] == ["cat dog"]
    assert set(embedder.threads) == {threading.current_thread().name}


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "10", True])
def test_a_bad_embed_timeout_is_a_configuration_error(sqlite_url: str, bad: object) -> None:
    """ADR 0067: ``embed_timeout`` must be a positive, finite number of seconds, or None."""
    with pytest.raises(journaled.ConfigurationError, match="embed_timeout must be a positive"):
        journaled.open(sqlite_url, embed_timeout=bad)  # type: ignore[arg-type]


def test_the_embedders_thread_sees_the_callers_context(sqlite_url: str) -> None:
    """ADR 0067, T3: the bounded call runs in the searching caller's context variables (a
    current span is one), not in an empty context."""
    seen: list[object] = []
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")

    class Looking(KeywordEmbedder):
        def embed(self, texts: list[str]) -> list[list[float]]:
            seen.append(marker.get())
            return super().embed(texts)

    with journaled.open(sqlite_url, embedder=Looking(WORDS), embed_timeout=5.0) as rt:
        rt.memory.remember("cat dog")
        marker.set("caller's")
        rt.memory.search_semantic("cat")
    assert seen
    assert set(seen) == {"caller's"}


def test_the_asyncio_door_takes_embed_timeout(tmp_path: Path) -> None:
    """ADR 0067 on the asyncio door: ``journaled.aio.open(embed_timeout=...)`` bounds it too."""
    embedder = StuckEmbedder(WORDS)

    async def main() -> list[str]:
        url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
        async with journaled.aio.open(url, embedder=embedder, embed_timeout=0.2) as rt:
            await rt.memory.remember("cat dog")
            embedder.stuck.set()
            try:
                return [f.text for f in await asyncio.wait_for(rt.memory.search_semantic("cat"), 5)]
            finally:
                embedder.release.set()

    assert asyncio.run(main()) == ["cat dog"]  # BM25's answer, within the bound
