"""Helpers for testing code that uses journaled: a manual clock, scripted embedders, waiting.

They are public so users can test their own agents against journaled deterministically; journaled's
own tests use them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence


class ManualClock:
    """A clock that moves only when told: ``clock()`` returns epoch milliseconds.

    Each call returns the current time and then advances it by ``step`` ms (0 by default), so
    events stamped in a row can be told apart without sleeping.
    """

    def __init__(self, start: int = 1_700_000_000_000, step: int = 0) -> None:
        self._now = start
        self._step = step
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            now = self._now
            self._now += self._step
            return now

    def advance(self, ms: int) -> int:
        """Move the clock forward by ``ms`` and return the new time."""
        with self._lock:
            self._now += ms
            return self._now

    def set(self, now: int) -> None:
        """Set the clock to ``now`` epoch milliseconds."""
        with self._lock:
            self._now = now

    @property
    def now(self) -> int:
        """Return the current time without advancing."""
        return self._now


class KeywordEmbedder:
    """A deterministic embedder: one dimension per vocabulary word, counting occurrences.

    ``calls`` records every batch it was asked to embed, so tests can check caching.
    """

    def __init__(self, vocabulary: Sequence[str]) -> None:
        self.vocabulary = [w.lower() for w in vocabulary]
        self.calls: list[list[str]] = []

    def embedder_config(self) -> dict[str, object]:
        """Return the arguments that rebuild this embedder from a config (ADR 0092)."""
        return {"vocabulary": list(self.vocabulary)}

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Return one count vector per text."""
        self.calls.append(list(texts))
        out = []
        for text in texts:
            words = text.lower().split()
            out.append([float(sum(w.strip(".,;:!?") == v for w in words)) for v in self.vocabulary])
        return out


class ScriptedEmbedder:
    """An embedder that answers from a table of text -> vector, or raises, as scripted."""

    def __init__(
        self,
        vectors: Mapping[str, list[float]],
        default: list[float] | None = None,
        fail: BaseException | None = None,
    ) -> None:
        self.vectors = dict(vectors)
        self.default = default
        self.fail = fail
        self.calls: list[list[str]] = []

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Return the scripted vector of each text, or raise the scripted error."""
        self.calls.append(list(texts))
        if self.fail is not None:
            raise self.fail
        return [
            self.vectors.get(t, self.default if self.default is not None else []) for t in texts
        ]


def wait_for(condition: Callable[[], bool], timeout: float = 5.0, interval: float = 0.01) -> None:
    """Wait until ``condition()`` is true, or raise ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        time.sleep(interval)


class ScriptedModel:
    """A deterministic stand-in for a language model: answers prompts from a script.

    Each reply is chosen by the first key that occurs in the prompt (case-insensitive); prompts
    matching no key get ``default``. Every call is recorded in ``calls``, so tests can assert what
    the model was asked and how many model calls a run made.
    """

    def __init__(self, replies: Mapping[str, str], default: str = "I have nothing to add.") -> None:
        self.replies = dict(replies)
        self.default = default
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def complete(self, prompt: str) -> str:
        """Return the scripted reply for a prompt."""
        with self._lock:
            self.calls.append(prompt)
        lowered = prompt.lower()
        for key, reply in self.replies.items():
            if key.lower() in lowered:
                return reply
        return self.default


class LoopLag:
    """Measure how late an event loop wakes up: a probe task sleeps ``interval`` s in a loop.

    ``async with LoopLag() as lag:`` around the work; then ``lag.max``, ``lag.percentile(99)``
    (seconds). Each sample is the wake-up's overshoot beyond the sleep asked for: a call that
    blocks the loop for 200 ms shows as a sample of about 200 ms.
    """

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.samples: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._since = time.perf_counter()

    async def _probe(self) -> None:
        while True:
            self._since = time.perf_counter()
            await asyncio.sleep(self.interval)
            self.samples.append(max(0.0, time.perf_counter() - self._since - self.interval))

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._probe())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        # The sleep in progress counts too: a loop blocked until now shows as one long sample.
        self.samples.append(max(0.0, time.perf_counter() - self._since - self.interval))
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @property
    def max(self) -> float:
        """Return the largest overshoot seen (0.0 before any sample)."""
        return max(self.samples, default=0.0)

    def percentile(self, p: float) -> float:
        """Return the ``p``-th percentile overshoot (nearest rank; 0.0 before any sample)."""
        if not self.samples:
            return 0.0
        ordered = sorted(self.samples)
        rank = max(1, math.ceil(p / 100 * len(ordered)))
        return ordered[rank - 1]
