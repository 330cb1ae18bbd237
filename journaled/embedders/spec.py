"""Build an embedder from one line of text, for the CLI and the environment (ADR 0048).

``openai:MODEL@BASE_URL``
    :class:`OpenAIEmbeddings` (key from ``$OPENAI_API_KEY``), e.g.
    ``openai:text-embedding-3-small@https://api.openai.com/v1``.
``local:MODEL``
    :class:`SentenceTransformerEmbeddings` over a model directory or name, e.g.
    ``local:/models/all-MiniLM-L6-v2``.
"""

from __future__ import annotations

from journaled.embedders.http import OpenAIEmbeddings
from journaled.embedders.local import SentenceTransformerEmbeddings

__all__ = ["ENV_EMBEDDER", "from_spec"]

ENV_EMBEDDER = "JOURNALED_EMBEDDER"
"""The environment variable the CLI reads an embedder spec from."""


def from_spec(spec: str) -> OpenAIEmbeddings | SentenceTransformerEmbeddings:
    """Return the embedder a spec names.

    Raises:
        ValueError: the spec names no known kind, or lacks its model or URL.
    """
    kind, _, rest = spec.partition(":")
    if kind == "openai":
        model, _, base_url = rest.partition("@")
        if not model or not base_url:
            raise ValueError(f"embedder {spec!r}: write openai:MODEL@BASE_URL")
        return OpenAIEmbeddings(model, base_url)
    if kind == "local":
        if not rest:
            raise ValueError(f"embedder {spec!r}: write local:MODEL_DIRECTORY_OR_NAME")
        return SentenceTransformerEmbeddings(rest)
    raise ValueError(f"embedder {spec!r}: expected openai:MODEL@BASE_URL or local:MODEL")
