"""AutoGen Core and journaled (SPEC X1, ADR 0041): ``pip install 'journaled[autogen]'``.

Two directions:

- :class:`JournaledMemory` is an ``autogen_core.memory.Memory`` over ``rt.memory`` and one scope:
  what an AutoGen agent adds is a journaled fact (redacted, superseded by conflict key, explained
  by ``why``), what it queries is ranked by BM25 or, when the runtime has an embedder, by meaning.
- :func:`register_autogen_agent` makes an agent hosted on an AutoGen runtime a journaled agent
  step: the step sends it a :class:`StepMessage`, its reply is the step's output, the model
  requests it reports are charged as calls, and a question it asks leaves the step waiting for
  an answer (E10).

Both work with a runtime from :func:`journaled.open` or from :func:`journaled.aio.open`; neither
blocks the event loop (the sync runtime's calls run in a thread).
"""

from __future__ import annotations

try:
    import autogen_core  # noqa: F401 - only to say which extra is missing
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "journaled.integrations.autogen needs autogen-core: pip install 'journaled[autogen]'"
    ) from exc

from journaled.integrations._autogen_agents import (
    LOOP_POLL,
    AutoGenStopped,
    StepMessage,
    StepReply,
    register_autogen_agent,
)
from journaled.integrations._autogen_memory import (
    FACT_FIELDS,
    HELD_MIME_TYPES,
    RESULT_FIELDS,
    JournaledEmbedderConfig,
    JournaledMemory,
    JournaledMemoryConfig,
)

__all__ = [
    "FACT_FIELDS",
    "HELD_MIME_TYPES",
    "LOOP_POLL",
    "RESULT_FIELDS",
    "AutoGenStopped",
    "JournaledEmbedderConfig",
    "JournaledMemory",
    "JournaledMemoryConfig",
    "StepMessage",
    "StepReply",
    "register_autogen_agent",
]
