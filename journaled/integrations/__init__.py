"""Integrations with the agent frameworks users already run (SPEC section 9).

Each integration is a submodule behind its own extra, imported only when asked for, so that
``import journaled`` and ``import journaled.integrations`` import none of those frameworks (T4,
ADR 0041):

- :mod:`journaled.integrations.autogen` (``pip install 'journaled[autogen]'``): a journaled
  ``autogen_core.memory.Memory``, and AutoGen Core agents as journaled agent steps (X1).
"""

from __future__ import annotations

__all__: list[str] = []
