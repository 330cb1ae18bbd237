"""Semantic and hybrid search under attack: embedders that misbehave, the cache, tenants, the past.

SPEC M5-M7, M9, M10, M12, R1, R2; ADR 0047 (hybrid) and 0048 (embedders and their cache). Real
SQLite files, the PostgreSQL fixture, real threads, subprocesses and HTTP servers on 127.0.0.1.
"""

from __future__ import annotations

import json
import logging
import math
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
from journaled.embedders import EmbeddingsError, OpenAIEmbeddings, digest
from journaled.testing import KeywordEmbedder, ManualClock, ScriptedEmbedder

ROOT = Path(__file__).resolve().parent.parent
WORDS = ["cat", "dog", "fish", "bird"]
KEY = "sk-proj-" + "Z9" * 20  # an API key shaped like a real one


class NamedEmbedder(KeywordEmbedder):
    """A keyword embedder that names its model, so its vectors are kept beside the journal."""

    model = "keywords-v1"


class NamedScripted(ScriptedEmbedder):
    """A scripted embedder that names its model."""

    model = "scripted-v1"


def _rows(path: Path) -> list[tuple[str, bytes, bytes]]:
    """Return the (model, digest, vector bytes) rows of a vector cache file."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT model, digest, vector FROM vectors").fetchall()
    db.close()
    return [(str(m), bytes(d), bytes(v)) for m, d, v in rows]


def _linked(path: Path) -> set[str]:
    """Return the fact ids a vector cache file links to vectors."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT fact_id FROM facts").fetchall()
    db.close()
    return {str(r[0]) for r in rows}


def _ids(facts: list[journaled.Fact]) -> list[str]:
    return [f.id for f in facts]


def _await_purge(rt: journaled.Runtime, fact_id: str) -> None:
    """Wait until memory has folded another process's purge of ``fact_id``: it polls the
    journal every ``follow`` seconds, so a search right after the other process returned may
    still see the fact, in BM25 as anywhere."""
    deadline = time.monotonic() + 30
    while rt.memory.get(fact_id) is not None:
        assert time.monotonic() < deadline, f"memory never folded the purge of {fact_id}"
        time.sleep(0.01)


# -- an OpenAI-compatible server on 127.0.0.1 ------------------------------------------------------


def _keyword_vector(text: str) -> list[float]:
    words = text.lower().split()
    return [float(words.count(w)) for w in WORDS]


class _Handler(BaseHTTPRequestHandler):
    """Answer POST /v1/embeddings in the wire format, or misbehave as ``mode`` says."""

    protocol_version = "HTTP/1.1"
    mode: ClassVar[str] = "ok"
    seen: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Handler.seen.append({"input": body["input"], "auth": self.headers.get("Authorization")})
        data = [
            {"object": "embedding", "index": i, "embedding": _keyword_vector(t)}
            for i, t in enumerate(body["input"])
        ]
        mode = _Handler.mode
        if mode == "slow":
            time.sleep(2.0)
        if mode.startswith("status-"):
            self._send(int(mode[7:]), b'{"error": {"message": "refused"}}')
        elif mode == "not-json":
            self._send(200, b"<html>gateway</html>")
        elif mode == "nan":
            self._send(200, b'{"data": [{"index": 0, "embedding": [NaN, 1.0]}]}')
        elif mode == "huge":
            self._send(200, b'{"data": [{"index": 0, "embedding": [1e400, 1.0]}]}')
        elif mode == "bools":
            self._send(200, b'{"data": [{"index": 0, "embedding": [true, false]}]}')
        elif mode == "null":
            self._send(200, b'{"data": [{"index": 0, "embedding": null}]}')
        elif mode == "no-data":
            self._send(200, b'{"object": "list"}')
        elif mode == "drop-last":
            self._send(200, json.dumps({"data": data[:-1]}).encode())
        else:
            self._send(200, json.dumps({"object": "list", "data": data[::-1]}).encode())

    def _send(self, status: int, raw: bytes) -> None:
        self.send_response(status)
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
    _Handler.seen = []
    with serving(_Handler) as url:
        yield url


# -- what an embedder answers ----------------------------------------------------------------------

BAD_VECTORS: list[object] = [
    [math.nan, 1.0],
    [math.inf, 1.0],
    [-math.inf, 1.0],
    [],
    ["1.0", "0.0"],
    [True, False],
    None,
]
BAD_IDS = ["nan", "inf", "-inf", "empty", "strings", "bools", "none"]


@pytest.mark.parametrize("bad", BAD_VECTORS, ids=BAD_IDS)
def test_unusable_fact_vectors_are_ranked_out_and_never_cached(
    bad: object, tmp_path: Path, clock: ManualClock
) -> None:
    """M7: a fact whose vector is unusable is not ranked; only usable vectors reach the file."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    embedder = NamedScripted({"good fact": [1.0, 0.0], "bad fact": bad, "q": [1.0, 0.0]})  # type: ignore[dict-item]
    with journaled.open(url, clock=clock, embedder=embedder) as rt:
        good = rt.memory.remember("good fact")
        rt.memory.remember("bad fact")
        assert _ids(rt.memory.search_semantic("q")) == [good.id]
        assert _ids(rt.memory.search_hybrid("q")) == [good.id]
        assert embedder.calls.count(["bad fact"]) == 1  # asked again: nothing kept for it
    assert [d for _, d, _ in _rows(tmp_path / "journal.sqlite.vectors")] == [digest("good fact")]


class _Raising(NamedEmbedder):
    def embed(self, texts: list[str]) -> list[list[float]]:
        raise MemoryError("the model ran out of memory")


class _Hostile(NamedEmbedder):
    """Answer the facts, then something that is not a list of vectors for the query."""

    def __init__(self, answer: object) -> None:
        super().__init__(WORDS)
        self.answer = answer

    def embed(self, texts: list[str]) -> list[list[float]]:
        if texts == ["cat"]:
            return self.answer  # type: ignore[return-value]
        return super().embed(texts)


@pytest.mark.parametrize(
    "embedder",
    [
        _Raising(WORDS),
        _Hostile([[math.nan] * 4]),
        _Hostile([[math.inf, 0.0, 0.0, 0.0]]),
        _Hostile([]),
        _Hostile([[]]),
        _Hostile(None),
        _Hostile("cat"),
        _Hostile([["x"] * 4]),
        _Hostile(42),
    ],
    ids=["raises", "nan", "inf", "no-vector", "empty", "none", "a-string", "strings", "an-int"],
)
def test_an_embedder_that_cannot_help_answers_exactly_bm25(
    embedder: NamedEmbedder, journal_url: str, clock: ManualClock
) -> None:
    """M7, ADR 0047: raises or an unusable query vector: semantic and hybrid equal search()."""
    with journaled.open(journal_url, clock=clock, embedder=embedder) as rt:
        rt.memory.remember("cat dog")
        rt.memory.remember("a cat and a cat")
        rt.memory.remember("fish")
        expected = _ids(rt.memory.search("cat"))
        assert len(expected) == 2
        assert _ids(rt.memory.search_semantic("cat")) == expected
        assert _ids(rt.memory.search_hybrid("cat")) == expected
        assert rt.memory.search_scored("cat", semantic=True)[1] == "bm25"


def test_a_drifting_embedder_ranks_by_its_first_vectors(
    journal_url: str, clock: ManualClock
) -> None:
    """M7: a stable fact is embedded at most once per open runtime; later drift is not seen."""

    class Drifting:
        """Answer the facts' vectors swapped on every call after the first."""

        def __init__(self) -> None:
            self.calls: list[list[str]] = []

        def embed(self, texts: list[str]) -> list[list[float]]:
            self.calls.append(list(texts))
            swapped = len(self.calls) > 1
            table = {"north": [1.0, 0.0], "east": [0.0, 1.0], "q": [1.0, 0.1]}
            if swapped:
                table |= {"north": [0.0, 1.0], "east": [1.0, 0.0]}
            return [table[t] for t in texts]

    embedder = Drifting()
    with journaled.open(journal_url, clock=clock, embedder=embedder) as rt:
        north = rt.memory.remember("north")
        east = rt.memory.remember("east")
        first = _ids(rt.memory.search_semantic("q"))
        assert first == [north.id, east.id]
        for _ in range(3):
            assert _ids(rt.memory.search_semantic("q")) == first
            assert _ids(rt.memory.search_hybrid("q")) == first
    assert sorted(embedder.calls[0]) == ["east", "north"]
    assert all(c == ["q"] for c in embedder.calls[1:])


def test_vectors_of_another_length_score_zero_and_are_dropped(
    journal_url: str, clock: ManualClock
) -> None:
    """M7: cosine is 0 between vectors of different lengths, and hits <= 0 are dropped."""
    embedder = ScriptedEmbedder(
        {"q": [1.0, 0.0], "flat": [1.0, 0.2], "tall": [1.0, 0.0, 0.0], "away": [-1.0, 0.0]}
    )
    with journaled.open(journal_url, clock=clock, embedder=embedder) as rt:
        flat = rt.memory.remember("flat")
        rt.memory.remember("tall")
        rt.memory.remember("away")
        assert _ids(rt.memory.search_semantic("q")) == [flat.id]
        scored, ranking = rt.memory.search_scored("q", semantic=True)
        assert ranking == "semantic"
        assert [f.id for _, f in scored] == [flat.id]


# -- the HTTP adapter ------------------------------------------------------------------------------


def test_a_server_slower_than_the_timeout_makes_search_fall_back(
    server: str, sqlite_url: str, clock: ManualClock
) -> None:
    """M7, ADR 0048: a request past its timeout raises EmbeddingsError; search answers BM25."""
    embedder = OpenAIEmbeddings("toy", server, api_key=KEY, timeout=0.5)
    with journaled.open(sqlite_url, clock=clock, embedder=embedder) as rt:
        rt.memory.remember("cat dog")
        rt.memory.remember("fish")
        _Handler.mode = "slow"
        with pytest.raises(EmbeddingsError, match="failed") as raised:
            embedder.embed(["cat"])
        assert KEY not in str(raised.value)
        assert _ids(rt.memory.search_semantic("cat")) == _ids(rt.memory.search("cat"))
        assert _ids(rt.memory.search_hybrid("cat")) == _ids(rt.memory.search("cat"))


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("status-400", "HTTP 400"),
        ("status-401", "HTTP 401"),
        ("status-404", "HTTP 404"),
        ("status-500", "HTTP 500"),
        ("status-503", "HTTP 503"),
        ("not-json", "failed"),
        ("nan", "not a list of numbers"),
        ("huge", "not a list of numbers"),
        ("bools", "not a list of numbers"),
        ("null", "not a list of numbers"),
        ("no-data", "expected 1 embeddings"),
        ("drop-last", "expected 1 embeddings"),
    ],
)
def test_every_bad_answer_is_an_embeddings_error_without_the_key(
    server: str, mode: str, message: str
) -> None:
    """ADR 0048: errors and malformed answers raise EmbeddingsError; the key is never in it."""
    _Handler.mode = mode
    embedder = OpenAIEmbeddings("toy", server, api_key=KEY, timeout=5)
    with pytest.raises(EmbeddingsError, match=message) as raised:
        embedder.embed(["cat"])
    assert KEY not in str(raised.value)
    assert KEY not in repr(raised.value)
    assert KEY not in repr(embedder)
    assert _Handler.seen[-1]["auth"] == f"Bearer {KEY}"  # it was sent, as a bearer token


@pytest.mark.parametrize(
    ("count", "batches"), [(1, [1]), (3, [3]), (4, [3, 1]), (6, [3, 3]), (7, [3, 3, 1])]
)
def test_batches_split_at_their_boundaries(server: str, count: int, batches: list[int]) -> None:
    """ADR 0048: one request per batch_size texts, vectors back in input order."""
    texts = [" ".join(WORDS[: 1 + i % 4]) + f" n{i}" for i in range(count)]
    embedder = OpenAIEmbeddings("toy", server, batch_size=3)
    assert embedder.embed(texts) == [_keyword_vector(t) for t in texts]
    assert [len(s["input"]) for s in _Handler.seen] == batches
    assert embedder.requests == len(batches)


def test_a_short_batch_caches_nothing_and_search_falls_back(
    server: str, tmp_path: Path, clock: ManualClock
) -> None:
    """M7, ADR 0048: a batch answered with a missing embedding fails whole; nothing is cached."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    embedder = OpenAIEmbeddings("toy", server, batch_size=2)
    with journaled.open(url, clock=clock, embedder=embedder) as rt:
        for text in ["cat", "cat dog", "dog fish", "bird"]:
            rt.memory.remember(text)
        _Handler.mode = "drop-last"
        assert _ids(rt.memory.search_hybrid("cat")) == _ids(rt.memory.search("cat"))
        assert _rows(tmp_path / "journal.sqlite.vectors") == []
        _Handler.mode = "ok"
        assert rt.memory.search_scored("fish", semantic=True)[1] == "semantic"
    assert len(_rows(tmp_path / "journal.sqlite.vectors")) == 4


def test_the_api_key_reaches_neither_journal_nor_cache_nor_logs(
    server: str, tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """M9, ADR 0048: the key goes only into the Authorization header, through errors too."""
    caplog.set_level(logging.DEBUG)
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    embedder = OpenAIEmbeddings("toy", server, api_key=KEY, batch_size=1)
    with journaled.open(url, clock=clock, embedder=embedder) as rt:
        rt.memory.remember("cat dog")
        rt.memory.search_hybrid("cat")
        _Handler.mode = "status-401"
        rt.memory.remember("fish")
        rt.memory.search_hybrid("fish")
        _Handler.mode = "not-json"
        rt.memory.search_semantic("fish")
        assert KEY not in json.dumps([str(e.data) for e in rt.journal.read()])
    assert {s["auth"] for s in _Handler.seen} == {f"Bearer {KEY}"}
    for path in tmp_path.iterdir():
        assert KEY.encode() not in path.read_bytes(), path.name
    assert KEY not in caplog.text


def test_the_server_and_the_cache_see_only_redacted_fact_texts(
    server: str, tmp_path: Path, clock: ManualClock
) -> None:
    """M9, ADR 0048: fact secrets reach neither embedder nor cache; queries are not kept."""
    secret = "ghp_" + "x1Y2" * 9
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, clock=clock, embedder=OpenAIEmbeddings("toy", server)) as rt:
        fact = rt.memory.remember(f"the cat token is {secret}")
        assert secret not in fact.text
        rt.memory.search_hybrid("cat token")
        rt.memory.search_semantic("dog bird query")
    sent = [t for s in _Handler.seen for t in s["input"]]
    assert fact.text in sent
    assert all(secret not in t for t in sent)
    cache = tmp_path / "journal.sqlite.vectors"
    assert [d for _, d, _ in _rows(cache)] == [digest(fact.text)]
    raw = cache.read_bytes()
    for trace in [secret.encode(), digest(f"the cat token is {secret}"), b"dog bird query"]:
        assert trace not in raw
    for query in ["cat token", "dog bird query"]:
        assert digest(query) not in raw


# -- the cache file --------------------------------------------------------------------------------


def _write_script(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body))
    return path


def test_a_purge_by_another_process_reaches_an_open_runtimes_cache(
    tmp_path: Path, clock: ManualClock
) -> None:
    """R2, M10, ADR 0048: another process's purge drops the vector before any is served."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    cache = tmp_path / "journal.sqlite.vectors"
    embedder = NamedEmbedder(WORDS)
    with journaled.open(url, clock=clock, embedder=embedder) as rt:
        gone = rt.memory.remember("cat secret plan")
        kept = rt.memory.remember("cat dog")
        assert _ids(rt.memory.search_semantic("cat")) == [gone.id, kept.id]
        assert digest("cat secret plan") in {d for _, d, _ in _rows(cache)}
        script = _write_script(
            tmp_path / "purge.py",
            f"""
            import journaled
            with journaled.open({url!r}) as rt:
                assert rt.memory.purge({gone.id!r}, reason="asked to forget")
            """,
        )
        done = subprocess.run([sys.executable, str(script)], cwd=ROOT, timeout=60, check=False)
        assert done.returncode == 0
        _await_purge(rt, gone.id)
        assert _ids(rt.memory.search_semantic("cat")) == [kept.id]
        assert _ids(rt.memory.search_hybrid("cat")) == [kept.id]
        assert all("cat secret plan" not in t for c in embedder.calls[1:] for t in c)
        assert {d for _, d, _ in _rows(cache)} == {digest("cat dog")}
        assert gone.id not in _linked(cache)
    with journaled.open(url, clock=clock, embedder=NamedEmbedder(WORDS)) as rt:
        assert _ids(rt.memory.search_semantic("cat")) == [kept.id]
    assert {d for _, d, _ in _rows(cache)} == {digest("cat dog")}
    assert b"cat secret plan" not in cache.read_bytes()


def test_a_purge_the_file_applied_before_this_runtime_looked_is_never_written_back(
    tmp_path: Path, clock: ManualClock
) -> None:
    """R2, M10, ADR 0065 update: another process purges a fact and moves the cache file's
    position past the purge with a search of its own; this runtime, whose memory has not
    folded the purge (it does not follow the journal), searches next. The purged text is
    neither embedded nor written back to the file, now or by a later runtime."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    cache = tmp_path / "journal.sqlite.vectors"
    embedder = NamedEmbedder(WORDS)
    with journaled.open(url, clock=clock, embedder=embedder, follow=None) as rt:
        gone = rt.memory.remember("cat secret plan")
        kept = rt.memory.remember("cat dog")
        script = _write_script(
            tmp_path / "purge.py",
            f"""
            import journaled
            from journaled.testing import KeywordEmbedder

            class Named(KeywordEmbedder):
                model = {NamedEmbedder.model!r}

            with journaled.open({url!r}, embedder=Named({WORDS!r})) as rt:
                assert rt.memory.purge({gone.id!r}, reason="asked to forget")
                assert [f.id for f in rt.memory.search_semantic("cat")] == [{kept.id!r}]
            """,
        )
        done = subprocess.run([sys.executable, str(script)], cwd=ROOT, timeout=60, check=False)
        assert done.returncode == 0
        assert rt.memory.get(gone.id) is not None  # not followed: memory still holds it
        rt.memory.search_semantic("cat")
        assert gone.id not in _linked(cache)
        assert digest("cat secret plan") not in {d for _, d, _ in _rows(cache)}
        assert all("cat secret plan" not in t for c in embedder.calls for t in c)
    with journaled.open(url, clock=clock, embedder=NamedEmbedder(WORDS)) as rt:
        assert _ids(rt.memory.search_semantic("cat")) == [kept.id]
    assert gone.id not in _linked(cache)
    assert b"cat secret plan" not in cache.read_bytes()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_purge_by_another_process_is_never_ranked(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> None:
    """R2, M10: after another process purges a fact, neither semantic nor hybrid returns it."""
    url = (
        str(request.getfixturevalue("pg_url"))
        if backend == "postgresql"
        else f"sqlite:///{tmp_path / 'journal.sqlite'}"
    )
    embedder = KeywordEmbedder(WORDS)  # no model name: M7's per-runtime cache
    with journaled.open(url, clock=clock, embedder=embedder) as rt:
        gone = rt.memory.remember("cat secret plan")
        kept = rt.memory.remember("cat dog")
        assert set(_ids(rt.memory.search_hybrid("cat"))) == {kept.id, gone.id}
        script = _write_script(
            tmp_path / "purge.py",
            f"""
            import journaled
            with journaled.open({url!r}) as rt:
                assert rt.memory.purge({gone.id!r})
            """,
        )
        done = subprocess.run([sys.executable, str(script)], cwd=ROOT, timeout=60, check=False)
        assert done.returncode == 0
        _await_purge(rt, gone.id)
        for found in [rt.memory.search_semantic("cat"), rt.memory.search_hybrid("cat")]:
            assert _ids(found) == [kept.id]
            assert all("secret" not in f.text for f in found)
        view = rt.memory.as_of(position=rt.journal.position())
        assert _ids(view.search_semantic("cat")) == [kept.id]


def test_a_corrupt_cache_file_leaves_search_semantic(tmp_path: Path, clock: ManualClock) -> None:
    """M7, ADR 0048: a cache file that is not a database costs the cache, never the answer."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    cache = tmp_path / "journal.sqlite.vectors"
    with journaled.open(url, clock=clock) as rt:
        cat = rt.memory.remember("cat dog")
        rt.memory.remember("fish")
    garbage = b"this is not a database" * 200
    cache.write_bytes(garbage)
    embedder = NamedEmbedder(WORDS)
    with journaled.open(url, clock=clock, embedder=embedder) as rt:
        for _ in range(2):
            scored, ranking = rt.memory.search_scored("cat", semantic=True)
            assert (ranking, [f.id for _, f in scored]) == ("semantic", [cat.id])
        assert _ids(rt.memory.search_hybrid("cat")) == [cat.id]
    assert embedder.calls[0] == ["cat dog", "fish"]
    assert embedder.calls[1:] == [["cat"]] * (len(embedder.calls) - 1)  # kept in memory


def test_many_threads_searching_at_once_agree_and_fill_one_row_per_text(
    tmp_path: Path, clock: ManualClock
) -> None:
    """M7, ADR 0048: concurrent searches answer alike; the file holds each text once."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    texts = [f"{a} {b}" for a in WORDS for b in WORDS if a < b] + WORDS
    with journaled.open(url, clock=clock, embedder=NamedEmbedder(WORDS)) as rt:
        for text in texts:
            rt.memory.remember(text)
        answers: list[tuple[str, list[str]]] = []
        errors: list[BaseException] = []
        start = threading.Barrier(8)

        def search(n: int) -> None:
            try:
                start.wait(timeout=20)
                for i in range(6):
                    word = WORDS[(n + i) % 4]
                    found = rt.memory.search_semantic(word, limit=20)
                    hybrid = rt.memory.search_hybrid(word, limit=20)
                    answers.append((word, _ids(found)))
                    assert set(_ids(hybrid)) >= set(_ids(found))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=search, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not errors, errors
    cache = tmp_path / "journal.sqlite.vectors"
    assert sorted(d for _, d, _ in _rows(cache)) == sorted(digest(t) for t in texts)
    cache.unlink()  # no runtime is open: a fresh, single-threaded reference
    with journaled.open(url, clock=clock, embedder=NamedEmbedder(WORDS)) as reference:
        expected = {w: _ids(reference.memory.search_semantic(w, limit=20)) for w in WORDS}
    assert len(answers) == 48
    assert all(found == expected[word] for word, found in answers)


def test_two_models_filled_at_once_by_processes_keep_their_own_vectors(
    tmp_path: Path, clock: ManualClock
) -> None:
    """ADR 0048: keys are (model, digest): processes filling one file never mix two models."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    texts = ["cat", "cat dog", "dog fish", "fish bird", "bird cat cat"]
    with journaled.open(url, clock=clock) as rt:
        for text in texts:
            rt.memory.remember(text)
    go = tmp_path / "go"
    script = _write_script(
        tmp_path / "fill.py",
        f"""
        import os, sys, time
        import journaled
        from journaled.testing import KeywordEmbedder

        class Named(KeywordEmbedder):
            model = sys.argv[1]

        words = {WORDS!r} if sys.argv[1] == "forward" else {WORDS[::-1]!r}
        deadline = time.monotonic() + 30
        while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:
            time.sleep(0.01)
        with journaled.open({url!r}, embedder=Named(words)) as rt:
            for word in words:
                assert rt.memory.search_scored(word, semantic=True)[1] == "semantic"
        """,
    )
    procs = [
        subprocess.Popen([sys.executable, str(script), model], cwd=ROOT)
        for model in ["forward", "backward", "forward", "backward"]
    ]
    go.touch()
    codes = [p.wait(timeout=60) for p in procs]
    assert codes == [0, 0, 0, 0]
    rows = _rows(tmp_path / "journal.sqlite.vectors")
    assert len(rows) == 2 * len(texts)
    by_digest = {digest(t): t for t in texts}
    for model, d, raw in rows:
        words = WORDS if model == "forward" else WORDS[::-1]
        vector = list(memoryview(raw).cast("d"))
        assert vector == KeywordEmbedder(words).embed([by_digest[d]])[0], (model, by_digest[d])


# -- filters, limits, tenants and the past ---------------------------------------------------------


def test_hybrid_reads_past_its_window_when_the_limit_is_larger(
    tmp_path: Path, clock: ManualClock
) -> None:
    """ADR 0047: each ranking is read to max(limit, 100); a large limit returns every hit."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    vectors = {f"note {i}": [1.0, i / 200] for i in range(130)} | {"q": [1.0, 0.0]}
    vectors |= {"unrelated": [-1.0, 0.0]}
    with journaled.open(url, clock=clock, embedder=NamedScripted(vectors)) as rt:
        for text in vectors:
            if text != "q":
                rt.memory.remember(text)
        everything = rt.memory.search_hybrid("q", limit=1000)
        assert len(everything) == 130  # "unrelated": cosine < 0 and no shared word
        assert [f.text for f in everything] == [f"note {i}" for i in range(130)]
        assert rt.memory.search_hybrid("q", limit=120) == everything[:120]
        assert rt.memory.search_semantic("q", limit=1000) == everything
        assert rt.memory.search_semantic("q", limit=0) == []
        assert rt.memory.search_hybrid("q", limit=0) == []


def test_hybrid_and_semantic_keep_every_filter(journal_url: str, clock: ManualClock) -> None:
    """M5, M7, ADR 0047: scopes, domains, min_confidence and validity bound both rankings."""
    embedder = KeywordEmbedder(WORDS)
    with journaled.open(journal_url, clock=clock, embedder=embedder) as rt:
        inside = rt.memory.remember("cat", scope="session", domain="pets", confidence=0.9)
        rt.memory.remember("cat cat", scope="user", domain="pets", confidence=0.9)
        rt.memory.remember("cat dog", scope="session", domain="work", confidence=0.9)
        rt.memory.remember("cat fish", scope="session", domain="pets", confidence=0.2)
        rt.memory.remember("cat bird", scope="session", domain="pets", valid_until=1)
        filters: dict[str, Any] = {
            "scopes": ["session"],
            "domains": ["pets"],
            "min_confidence": 0.5,
        }
        for search in [rt.memory.search_semantic, rt.memory.search_hybrid, rt.memory.search]:
            assert _ids(search("cat", **filters)) == [inside.id]
        seen = {t for call in embedder.calls for t in call}
        assert seen == {"cat"}  # filtered-out facts are never embedded


def test_a_punctuation_query_finds_nothing_by_words_nor_by_a_zero_vector(
    journal_url: str, clock: ManualClock
) -> None:
    """M6, M7: a query of punctuation has no BM25 terms; its zero vector scores 0 everywhere."""
    with journaled.open(journal_url, clock=clock, embedder=KeywordEmbedder(WORDS)) as rt:
        rt.memory.remember("cat dog")
        for query in ["?!", "...", "—", "¿¡"]:
            assert rt.memory.search(query) == []
            assert rt.memory.search_semantic(query) == []
            assert rt.memory.search_hybrid(query) == []


def test_another_organizations_facts_are_never_embedded_nor_returned(
    tmp_path: Path, clock: ManualClock
) -> None:
    """R1, M1: a runtime of organization b neither ranks nor embeds organization a's facts."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, clock=clock, organization="a") as rt:
        theirs = rt.memory.remember("cat plans of a", scope="organization")
    embedder = NamedEmbedder(WORDS)
    with journaled.open(url, clock=clock, organization="b", embedder=embedder) as rt:
        ours = rt.memory.remember("cat plans of b", scope="organization")
        mine = rt.memory.remember("cat dog")
        for found in [
            rt.memory.search_semantic("cat"),
            rt.memory.search_hybrid("cat", limit=500),
            rt.memory.as_of(position=rt.journal.position()).search_semantic("cat"),
            rt.memory.as_of(position=rt.journal.position()).search_hybrid("cat"),
            rt.memory.search_semantic("cat", scopes=["organization"]),
        ]:
            assert theirs.id not in _ids(found)
            assert set(_ids(found)) <= {ours.id, mine.id}
            assert ours.id in _ids(found)
    seen = {t for call in embedder.calls for t in call}
    assert "cat plans of a" not in seen
    assert digest("cat plans of a") not in {
        d for _, d, _ in _rows(tmp_path / "journal.sqlite.vectors")
    }


def test_past_views_rank_as_then_and_never_show_a_purged_text(
    journal_url: str, clock: ManualClock
) -> None:
    """M12, M10: a past view ranks the facts of then; a fact purged since shows no text."""
    embedder = KeywordEmbedder(WORDS)
    with journaled.open(journal_url, clock=clock, embedder=embedder) as rt:
        gone = rt.memory.remember("cat secret plan")
        kept = rt.memory.remember("cat dog")
        then = rt.journal.position()
        later = rt.memory.remember("cat cat")
        older = rt.memory.remember("cat fish", conflict_key="pet")
        before_supersession = rt.journal.position()
        rt.memory.remember("dog fish", conflict_key="pet")  # supersedes "cat fish"
        assert rt.memory.purge(gone.id)
        asked_from = len(embedder.calls)
        view = rt.memory.as_of(position=then)
        for found in [view.search_semantic("cat"), view.search_hybrid("cat")]:
            assert kept.id in _ids(found)
            assert later.id not in _ids(found)
            assert all("secret" not in f.text for f in found)
        assert all("secret" not in t for c in embedder.calls[asked_from:] for t in c)
        past = rt.memory.as_of(position=before_supersession)
        assert older.id in _ids(past.search_semantic("cat", limit=50))
        assert older.id in _ids(past.search_hybrid("cat", limit=50))
        assert older.id not in _ids(rt.memory.search_hybrid("cat", limit=50))
        assert older.id not in _ids(rt.memory.search_semantic("cat", limit=50))
