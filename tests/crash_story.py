"""The story of the crash matrix, run in a child process: ``python crash_story.py CONFIG``.

The story mixes memory writes and one run, in this order (every fact's ``source`` names its op):

- A: remember ``s1`` then ``s2`` under the conflict key ``deploy-target`` (``s2`` supersedes
  ``s1``), ``s3`` in the logical scope ``session``, ``s4`` in ``user`` (to be purged later);
- the run: wave 1 fans out tools ``a``, ``b`` and skill ``c`` (two at a time); wave 2 is agent
  ``d``, which raises NeedsInput until it has an answer, and skill ``e``; wave 3 is tool ``f`` and
  skills ``g``, ``h``. The call budget (2) lets waves 1 and 2 run; the run then waits for ``d``;
- B (before the answer): remember ``s5`` (supersedes ``s2``) and ``s6``, delete ``s6``;
- the answer: ``d`` runs again and reports 1 call; the budget gate stops before wave 3;
- C (before raising the budget): delete ``s5`` (``s2`` is active again), purge ``s4``,
  checkpoint memory; the budget becomes 5 and wave 3 runs: the run completes with 5 calls;
- D: remember ``s7`` and ``s8`` under ``release-day`` (``s8`` supersedes ``s7``), purge ``s7``.

Every process runs the same driver: it reads from the journal which ops are done and what the run
waits for, and carries on from there, so a process killed anywhere is followed by one that finishes
the story. Every execution of a step appends its id to the record file (fsynced) before returning.

``kill_at`` (a journal position) or ``kill_after`` (a number of events appended by this process):
a thread SIGKILLs the process as soon as the journal reaches that position.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

import msgspec

import journaled

BUDGET = 2
RAISED_BUDGET = 5
ANSWER = "blue"
PURGED_TEXTS = (
    "The pager rotation lives in the vault under ops/pager-7731",
    "The release train leaves on Thursdays from platform 9",
)
MEMORY_A: list[tuple[str, str, dict[str, Any]]] = [
    ("s1", "The deploy target is staging", {"conflict_key": "deploy-target"}),
    ("s2", "The deploy target is production", {"conflict_key": "deploy-target"}),
    ("s3", "Nightly builds run at two in the morning", {"scope": "session"}),
    ("s4", PURGED_TEXTS[0], {"scope": "user", "domain": "ops"}),
]
MEMORY_B: list[tuple[str, str, dict[str, Any]]] = [
    ("s5", "The deploy target is canary", {"conflict_key": "deploy-target"}),
    ("s6", "Scratch note for the standup", {"confidence": 0.4}),
]
MEMORY_D: list[tuple[str, str, dict[str, Any]]] = [
    ("s7", PURGED_TEXTS[1], {"conflict_key": "release-day"}),
    ("s8", "The release train leaves on Wednesdays", {"conflict_key": "release-day"}),
]
STEP_SECONDS = 0.01
"""How long a step works: long enough for a kill to land while steps are in flight."""


def plan() -> journaled.Plan:
    """Return the story's plan: three waves, fan-out in each."""
    step = journaled.Step
    return journaled.Plan(
        goal="ship the release",
        steps=[
            step("a", tool="fetch", input={"url": "a"}),
            step("b", tool="fetch", input={"url": "b"}),
            step("c", skill="summarize", input="c"),
            step("d", agent="confirm", input="colour?", depends_on=["a", "b"]),
            step("e", skill="summarize", input="e", depends_on=["c"]),
            step("f", tool="fetch", input={"url": "f"}, depends_on=["d"]),
            step("g", skill="summarize", input="g", depends_on=["d", "e"]),
            step("h", skill="summarize", input="h", depends_on=["e"]),
        ],
    )


class Story:
    """The driver: find where the story stands in the journal, and carry it on to its end."""

    def __init__(self, rt: journaled.Runtime, record: str) -> None:
        self.rt = rt
        self.record = record
        self.lock = threading.Lock()
        rt.register_tool("fetch", self.fetch)
        rt.register_skill("summarize", self.summarize)
        rt.register_agent("confirm", self.confirm)

    # -- steps: each execution is recorded before it returns ------------------------------------

    def note(self, line: str) -> None:
        """Append one line to the record file, durably."""
        with self.lock, open(self.record, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def fetch(self, data: dict[str, str]) -> str:
        """Tool: pretend to fetch a URL."""
        self.note(data["url"])
        time.sleep(STEP_SECONDS)
        return f"page {data['url']}"

    def summarize(self, text: str) -> str:
        """Skill: pretend to summarise (one model call)."""
        self.note(text)
        time.sleep(STEP_SECONDS)
        return f"summary of {text}"

    def confirm(self, step: journaled.Step, ctx: journaled.AgentContext) -> journaled.AgentResult:
        """Agent: wait for a human answer, then report one model call."""
        self.note(f"{ctx.step_id} {'answered' if ctx.answer else 'asked'}")
        time.sleep(STEP_SECONDS)
        if ctx.answer is None:
            raise journaled.NeedsInput("which colour should the release be?")
        return journaled.AgentResult(output=f"colour {ctx.answer}", calls_used=1)

    # -- what the journal says is done ------------------------------------------------------------

    def memory_done(self) -> tuple[dict[str, str], set[str]]:
        """Return (source -> fact id of every remembered op, ids deleted or purged)."""
        ids: dict[str, str] = {}
        gone: set[str] = set()
        for event in self.rt.journal.read():
            tag = type(event.data).__struct_config__.tag
            if tag == "memory.fact-remembered":
                ids[event.data.source] = event.data.fact_id  # type: ignore[attr-defined]
            elif tag in ("memory.fact-deleted", "memory.fact-purged"):
                gone.add(f"{tag}:{event.data.fact_id}")  # type: ignore[attr-defined]
        return ids, gone

    def remember(self, ops: list[tuple[str, str, dict[str, Any]]]) -> None:
        """Remember each op not yet in the journal."""
        ids, _ = self.memory_done()
        for source, text, options in ops:
            if source not in ids:
                self.rt.memory.remember(text, source=source, **options)

    def forget(self, how: str, source: str) -> None:
        """Delete or purge the fact of ``source`` unless the journal already says so."""
        ids, gone = self.memory_done()
        fact_id = ids[source]
        if how == "delete" and f"memory.fact-deleted:{fact_id}" not in gone:
            assert self.rt.memory.delete(fact_id).primary
        if how == "purge" and f"memory.fact-purged:{fact_id}" not in gone:
            assert self.rt.memory.purge(fact_id, reason="it named a vault path")
            self.rt.memory.checkpoint()

    # -- the story ---------------------------------------------------------------------------------

    def run(self) -> str:
        """Carry the story on to its end; return the run id."""
        self.remember(MEMORY_A)
        runs = self.rt.runs.ids()
        if not runs:
            self.rt.execute(plan(), call_budget=BUDGET, max_parallel_steps=2)
            runs = self.rt.runs.ids()
        (run_id,) = runs
        for _ in range(20):
            state = self.rt.runs.state(run_id)
            if state.run_status == "completed":
                break
            if state.waiting:
                self.remember(MEMORY_B)
                self.forget("delete", "s6")
                self.rt.resume(run_id, answers=dict.fromkeys(state.waiting, ANSWER))
            elif state.stopped_for_budget or state.budget != BUDGET:
                self.forget("delete", "s5")
                self.forget("purge", "s4")
                self.rt.resume(run_id, call_budget=RAISED_BUDGET)
            else:
                self.rt.resume(run_id)
        else:
            raise AssertionError(f"run {run_id} did not complete: {self.rt.runs.why(run_id)}")
        self.remember(MEMORY_D)
        self.forget("purge", "s7")
        return run_id


def kill_at(rt: journaled.Runtime, position: int) -> None:
    """SIGKILL this process as soon as the journal reaches ``position``."""

    def watch() -> None:
        while rt.journal.position() < position:
            time.sleep(0.0005)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="crash-matrix-kill", daemon=True).start()


def main(argv: list[str]) -> None:
    """Run the story with the configuration in ``argv[1]`` (JSON)."""
    cfg = json.loads(argv[1])
    with journaled.open(cfg["url"]) as rt:
        if cfg.get("kill_at") is not None:
            kill_at(rt, cfg["kill_at"])
        elif cfg.get("kill_after") is not None:
            kill_at(rt, rt.journal.position() + cfg["kill_after"])
        story = Story(rt, cfg["record"])
        run_id = story.run()
        print(msgspec.json.encode({"run_id": run_id, "position": rt.journal.position()}).decode())


if __name__ == "__main__":
    main(sys.argv)
