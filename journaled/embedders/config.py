"""Write an embedder into a config as its class's import path and JSON arguments (ADR 0092).

An embedder is an object, and a config (AutoGen's ``dump_component``, a file) holds only JSON.
An embedder class that can be written down says so with one method::

    class MyEmbedder:
        def embedder_config(self) -> dict[str, object]:
            '''Return the JSON keyword arguments MyEmbedder(**arguments) rebuilds me from.'''

:func:`describe` turns such an embedder into ``(provider, arguments)``; :func:`build` turns
them back into an embedder. Anything else is refused with an error naming the embedder, so a
config never stands for a runtime that ranks otherwise than the one it was written from.
Secrets (an API key) are never arguments: the rebuilt embedder reads them where the first did.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from journaled.errors import ConfigurationError

if TYPE_CHECKING:  # journaled.semantic imports this package: only for the type
    from journaled.semantic import Embedder

__all__ = ["DESCRIBE", "build", "describe", "name_of"]

DESCRIBE = "embedder_config"
"""The method an embedder class defines to be written into a config (ADR 0092)."""


def name_of(embedder: object) -> str:
    """Return how errors name an embedder: its class's import path, and its model if any."""
    cls = type(embedder)
    model = getattr(embedder, "model", None)  # as journaled.semantic.model_of reads it
    where = f"{cls.__module__}.{cls.__qualname__}"
    return f"{where} (model {model!r})" if isinstance(model, str) and model else where


def describe(embedder: object) -> tuple[str, dict[str, Any]]:
    """Return ``(provider, arguments)``: the import path of the embedder's class and the JSON
    keyword arguments that class rebuilds an equal embedder from.

    Raises:
        ConfigurationError: the embedder cannot be written down, saying why and what to do.
    """
    cls = type(embedder)
    provider = f"{cls.__module__}.{cls.__qualname__}"
    name = name_of(embedder)
    method = getattr(embedder, DESCRIBE, None)
    if not callable(method):
        raise ConfigurationError(
            f"embedder {name} cannot be written into a config: give {cls.__qualname__} an "
            f"{DESCRIBE}() method returning the JSON keyword arguments "
            f"{cls.__qualname__}(**arguments) rebuilds it from (ADR 0092)"
        )
    try:
        found = _resolve(provider)
    except Exception:  # no module of that path, or one failing to import: not this class
        found = None
    if found is not cls:
        raise ConfigurationError(
            f"embedder {name} cannot be written into a config: its class cannot be imported "
            f"as {provider!r}; define it at the top level of a module"
        )
    try:
        arguments = method()
    except (ConfigurationError, ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"embedder {name} cannot be written into a config: {exc}"
        ) from None
    if not isinstance(arguments, Mapping) or not all(isinstance(k, str) for k in arguments):
        raise ConfigurationError(
            f"embedder {name}: {DESCRIBE}() must return a dict of keyword arguments, got "
            f"{type(arguments).__name__}"
        )
    try:
        # Through JSON and back: what is returned is what a config file gives build().
        written = json.loads(json.dumps(dict(arguments), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"embedder {name}: {DESCRIBE}() returned arguments that are not JSON: {exc}"
        ) from None
    return provider, written


def build(provider: str, arguments: Mapping[str, Any]) -> Embedder:
    """Return the embedder ``provider(**arguments)``, as :func:`describe` wrote it down.

    Only a class that defines :data:`DESCRIBE` is built: a config cannot make the loading
    process call any other function it names.

    Raises:
        ConfigurationError: the provider cannot be imported, is no such class, or its
            construction fails; the message names the provider.
    """
    try:
        cls = _resolve(provider)
    except Exception as exc:  # importing runs the module, which may raise anything
        why = exc if isinstance(exc, ImportError) else f"{type(exc).__name__}: {exc}"
        raise ConfigurationError(f"embedder {provider!r} cannot be imported: {why}") from None
    if cls is None:
        raise ConfigurationError(
            f"embedder {provider!r} cannot be imported: write module.Class, as "
            f"{DESCRIBE}() describes it"
        )
    if not isinstance(cls, type) or not callable(getattr(cls, DESCRIBE, None)):
        raise ConfigurationError(
            f"embedder {provider!r} is not an embedder class with an {DESCRIBE}() method "
            "(ADR 0092): only such a class is built from a config"
        )
    try:
        embedder = cls(**arguments)
    except Exception as exc:
        raise ConfigurationError(
            f"embedder {provider} cannot be built from its arguments: {exc}"
        ) from None
    if not callable(getattr(embedder, "embed", None)):
        raise ConfigurationError(
            f"embedder {provider} built an object without an embed(list[str]) method"
        )
    built: Embedder = embedder
    return built


def _resolve(provider: str) -> object:
    """Return the object ``module.Qual.Name`` names, or None when the path names nothing.

    Raises:
        ImportError: no module of that path can be imported.
    """
    parts = provider.split(".")
    if not all(part.isidentifier() for part in parts):
        return None  # "", ".x" (relative), "a..b": importlib would raise ValueError, TypeError
    for cut in range(len(parts) - 1, 0, -1):
        module_path = ".".join(parts[:cut])
        try:
            found: object = importlib.import_module(module_path)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (module_path + ".").startswith(exc.name + "."):
                continue  # a shorter module path may hold the rest as attributes
            raise
        for attribute in parts[cut:]:
            found = getattr(found, attribute, None)
            if found is None:
                return None
        return found
    raise ImportError(f"no module of {provider!r} can be imported")
