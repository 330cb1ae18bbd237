"""Embedders for semantic and hybrid memory search, and the vector cache beside the journal.

``OpenAIEmbeddings`` speaks the OpenAI embeddings wire format over HTTP with the standard library
(any compatible server: a hosted API, a local inference server). ``SentenceTransformerEmbeddings``
runs a sentence-transformers model in the process (``pip install "journaled[local]"``); it
imports the library only when built. See ADR 0048.
"""

from journaled.embedders.cache import VectorCache, digest
from journaled.embedders.http import EmbeddingsError, OpenAIEmbeddings
from journaled.embedders.local import SentenceTransformerEmbeddings
from journaled.embedders.spec import from_spec

__all__ = [
    "EmbeddingsError",
    "OpenAIEmbeddings",
    "SentenceTransformerEmbeddings",
    "VectorCache",
    "digest",
    "from_spec",
]
