"""Group commit: remembers that queued up together are decided, stored in one append, answered.

The memory writer collects remembers that carry a reply while more messages wait in its inbox
(ADR 0015) and hands the group here. Each remember is decided on its own — an invalid one fails
alone — and all the decided ones are appended in one transaction, so they are stored together or
not at all. A version conflict (another process claimed one of the keys first) means deciding the
group again on the caught-up state.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

from journaled.events.base import DomainEvent
from journaled.events.errors import AppendOutcomeUnknown, ConcurrencyConflict
from journaled.events.memory import Fact
from journaled.events.messages import Remember

__all__ = ["Answer", "commit_remembers"]

GROUP_ATTEMPTS = 3
"""Conflicting attempts at storing a group together before its remembers are stored one by one."""

Decide = Callable[[Remember], tuple[list[tuple[str, DomainEvent]], str, Fact]]
"""Decide one remember against the stored state: (its events by stream, its text, its fact)."""
Answer = Callable[[Remember, Fact | None, Exception | None], None]
"""Tell a remember's asker its fact, or the error that kept it from being stored."""
Append = Callable[[list[tuple[str, DomainEvent]], dict[str, bytes]], None]
"""Append events and fact texts in one transaction, then fold them. Raises only when nothing was
stored: once the transaction commits, a failing fold is the writer's to repair (it rebuilds its
projection from the journal), never the callers' failure."""


def commit_remembers(
    group: Sequence[Remember],
    *,
    decide: Decide,
    append: Append,
    catch_up: Callable[[], None],
    attempts: int,
    answer: Answer,
) -> None:
    """Decide every remember of the group, append them in one transaction, answer each caller.

    Never raises: every caller gets its fact or its error through its reply. A failed append
    fails every caller whose remember was decided, none of which was stored; an append whose
    outcome the journal could not learn (the database unreachable) tells each caller its fact's
    id; a committed group answers every caller with its fact.
    """
    pending = list(group)
    together = attempts if len(pending) == 1 else min(attempts, GROUP_ATTEMPTS)
    for attempt in range(together):
        decided: list[tuple[Remember, Fact]] = []
        staged: list[tuple[str, DomainEvent]] = []
        payloads: dict[str, bytes] = {}
        for message in pending:
            try:
                events, text, fact = decide(message)
            except Exception as exc:  # invalid, or a scope actor failed: this caller only
                answer(message, None, exc)
                continue
            decided.append((message, fact))
            staged += events
            payloads[fact.id] = text.encode("utf-8")
        if not decided:
            return
        pending = [message for message, _ in decided]
        try:
            append(staged, payloads)
        except ConcurrencyConflict:
            # Random backoff breaks the symmetry between writers hammering one conflict key.
            time.sleep(random.uniform(0, min(0.05, 0.001 * 2**attempt)))
            try:
                catch_up()
            except Exception as exc:
                _fail(pending, exc, answer)
                return
            continue
        except AppendOutcomeUnknown as exc:
            # Stored whole or not at all, unknown which: each caller is told its own fact's id,
            # which a read names once the database is back (ADR 0095).
            for message, fact in decided:
                answer(message, None, unknown_remember(exc, fact))
            return
        except Exception as exc:
            _fail(pending, exc, answer)
            return
        for message, fact in decided:
            answer(message, fact, None)
        return
    if len(pending) > 1:
        # A key other processes keep claiming must not hold up (or fail) the rest of the group:
        # each remember gets the retries it would have had alone.
        for message in pending:
            commit_remembers(
                [message],
                decide=decide,
                append=append,
                catch_up=catch_up,
                attempts=attempts,
                answer=answer,
            )
        return
    error = ConcurrencyConflict([], f"gave up after {attempts} conflicting attempts")
    _fail(pending, error, answer)


def unknown_remember(exc: AppendOutcomeUnknown, fact: Fact) -> AppendOutcomeUnknown:
    """Return the error for one remember of an append whose outcome is unknown: its fact's id
    and events (ADR 0095)."""
    own = [a for a in exc.appended if a.rpartition("@")[0] == fact.id]
    return AppendOutcomeUnknown(exc.journal, exc.waited, exc.detail, own, fact_id=fact.id)


def _fail(group: Sequence[Remember], error: Exception, answer: Answer) -> None:
    for message in group:
        answer(message, None, error)
