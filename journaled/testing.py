"""Helpers for testing code that uses journaled: a manual clock, scripted embedders, waiting.

They are public so users can test their own agents against journaled deterministically; journaled's
own tests use them too.
"""

from __future__ import annotations

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
