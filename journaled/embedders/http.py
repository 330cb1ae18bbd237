"""An embedder over HTTP in the OpenAI embeddings wire format, with the standard library only.

``POST {base_url}/embeddings`` with ``{"model", "input": [texts], "encoding_format": "float"}``;
the answer's ``data`` holds one ``{"index", "embedding"}`` per input. Hosted APIs and local
inference servers (vLLM, llama.cpp's server, Ollama, text-embeddings-inference, LocalAI) speak it.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from journaled.errors import JournaledError
from journaled.events.redact import redact

__all__ = ["EmbeddingsError", "OpenAIEmbeddings"]


class EmbeddingsError(JournaledError, RuntimeError):
    """An embeddings server refused a request or answered something that is not embeddings."""


class OpenAIEmbeddings:
    """Embed texts through an OpenAI-compatible ``/embeddings`` endpoint, in batches.

    Args:
        model: The model name the server knows (also the vector cache's key, ADR 0048).
        base_url: The API root, e.g. ``https://api.openai.com/v1`` or ``http://127.0.0.1:8080/v1``.
        api_key: Sent as a bearer token; defaults to ``$OPENAI_API_KEY``; none is sent if unset.
        batch_size: Most texts per request.
        timeout: Seconds a request may take, its answer read whole.
        dimensions: Ask the server for vectors of this length (models that support it).
    """

    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        api_key: str | None = None,
        batch_size: int = 64,
        timeout: float = 30.0,
        dimensions: int | None = None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty string, got {model!r}")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.batch_size = batch_size
        self.timeout = timeout
        self.dimensions = dimensions
        self._api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self._key_given = api_key is not None and api_key != os.environ.get("OPENAI_API_KEY")
        """Whether the key came from the caller rather than ``$OPENAI_API_KEY``."""
        self.requests = 0
        """How many requests were sent (batching is visible here)."""

    def __repr__(self) -> str:
        """Name the model and the endpoint, never the key."""
        return f"OpenAIEmbeddings(model={self.model!r}, base_url={_shown(self.base_url)!r})"

    def embedder_config(self) -> dict[str, object]:
        """Return the arguments that rebuild this embedder from a config (ADR 0092); never the key.

        Raises:
            ValueError: the key was passed as ``api_key``: a config would lose it, so the
                rebuilt embedder would be refused by the server and searches fall back to BM25.
        """
        if self._key_given:
            raise ValueError(
                "OpenAIEmbeddings was given api_key=, which a config never holds: build it "
                "without api_key= and set OPENAI_API_KEY wherever the config is loaded"
            )
        if _shown(self.base_url) != self.base_url:
            raise ValueError(
                f"OpenAIEmbeddings' base_url {_shown(self.base_url)!r} holds credentials "
                "(user:password@), which a config never holds: give the endpoint without "
                "them, and the key through OPENAI_API_KEY"
            )
        return {
            "model": self.model,
            "base_url": self.base_url,
            "batch_size": self.batch_size,
            "timeout": self.timeout,
            "dimensions": self.dimensions,
        }

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Return one vector per text, asking at most ``batch_size`` texts per request.

        Raises:
            EmbeddingsError: the server answered an error, or an answer that is not one vector
                of finite numbers per input.
        """
        out: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            out.extend(self._batch(texts[start : start + self.batch_size]))
        return out

    def _batch(self, texts: list[str]) -> list[list[float]]:
        body: dict[str, Any] = {"model": self.model, "input": texts, "encoding_format": "float"}
        if self.dimensions is not None:
            body["dimensions"] = self.dimensions
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        request = urllib.request.Request(  # noqa: S310 - the scheme is checked in __init__
            f"{self.base_url}/embeddings",
            data=json.dumps(body).encode("utf-8"),
            headers=headers,
            method="POST",
        )
        self.requests += 1
        deadline = time.monotonic() + self.timeout
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                answer = json.loads(_read_by(response, deadline))
        except urllib.error.HTTPError as exc:
            detail = self._hidden(exc.read()[:200].decode("utf-8", "replace"))
            raise EmbeddingsError(
                f"{_shown(self.base_url)}/embeddings answered HTTP {exc.code}: {detail}"
            ) from None
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise EmbeddingsError(
                f"{_shown(self.base_url)}/embeddings failed: {self._hidden(str(exc))}"
            ) from None
        return _vectors(answer, len(texts), _shown(self.base_url))

    def _hidden(self, text: str) -> str:
        """Return ``text`` without the API key, and with any secret in it redacted (M9)."""
        if self._api_key:
            text = text.replace(self._api_key, "[api key]")
        userinfo = urllib.parse.urlsplit(self.base_url).netloc.rpartition("@")[0]
        if userinfo:  # an error naming the host may quote what stood before it
            text = text.replace(userinfo, "***")
        return redact(text)


def _read_by(response: Any, deadline: float) -> bytes:
    """Read a response's body whole by ``deadline``: the socket's timeout bounds each read, and
    a server sending a byte at a time would otherwise hold a search for as long as it likes."""
    chunks: list[bytes] = []
    while chunk := response.read1(65536):
        chunks.append(chunk)
        if time.monotonic() > deadline:
            raise TimeoutError("the answer took longer than the timeout")
    body = b"".join(chunks)
    left = getattr(response, "length", None)
    if left:  # the connection closed before the Content-Length it announced
        raise http.client.IncompleteRead(body, left)
    return body


def _vectors(answer: object, expected: int, where: str) -> list[list[float]]:
    """Return the answer's vectors in input order, or raise naming what is wrong."""
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list) or len(data) != expected:
        got = len(data) if isinstance(data, list) else type(data).__name__
        raise EmbeddingsError(
            f"{where}/embeddings: expected {expected} embeddings in data, got {got}"
        )
    vectors: list[list[float] | None] = [None] * expected
    for item in data:
        index = item.get("index") if isinstance(item, dict) else None
        vector = item.get("embedding") if isinstance(item, dict) else None
        if not isinstance(index, int) or not 0 <= index < expected or vectors[index] is not None:
            raise EmbeddingsError(f"{where}/embeddings: bad or repeated index {index!r}")
        if not isinstance(vector, list) or not all(
            isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
            for x in vector
        ):
            raise EmbeddingsError(f"{where}/embeddings: embedding {index} is not a list of numbers")
        vectors[index] = [float(x) for x in vector]
    return [v for v in vectors if v is not None]


def _shown(url: str) -> str:
    """Return ``url`` with any credentials in it (``user:password@``) replaced by ``***``."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))
