"""An asyncio application uses journaled without blocking its event loop (SPEC A1, A2, X3).

The app remembers what it learns, runs a two-step plan whose tool and skill are ``async def``
functions (the skill asks a scripted model, so it runs offline), and keeps serving its own work
meanwhile: a heartbeat task ticks while the run executes. Then it asks the journal why the run
ended as it did. Run it with

    python examples/asyncio_app.py
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import journaled
import journaled.aio
from journaled import Plan, Step
from journaled.testing import ScriptedModel

MODEL = ScriptedModel({"summarize": "Release 2.0 ships on Friday after the freeze."})


async def fetch_notes(version: str) -> str:
    """A tool: fetch release notes (an I/O call in a real app; here a pause on the loop)."""
    await asyncio.sleep(0.01)
    return f"{version}: freeze on Wednesday, ship on Friday"


async def summarize(notes: str) -> str:
    """A skill: ask the (scripted) model for a one-line summary; costs one model call."""
    await asyncio.sleep(0)
    return MODEL.complete(f"Summarize: {notes}")


async def heartbeat(stop: asyncio.Event, ticks: list[int]) -> None:
    """The app's own work: it keeps running while journaled executes the plan."""
    while not stop.is_set():
        ticks.append(1)
        await asyncio.sleep(0.001)


async def main() -> None:
    """Open an asyncio runtime, remember, run a plan beside a heartbeat, explain the run."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'journal.sqlite'}"
        async with journaled.aio.open(url) as rt:
            rt.register_tool("fetch_notes", fetch_notes)
            rt.register_skill("summarize", summarize)
            fact = await rt.memory.remember("the release freeze starts on Wednesday", domain="ops")
            print(f"remembered {fact.id}: {fact.text}")
            found = await rt.memory.search("when does the freeze start")
            print(f"search found: {[f.text for f in found]}")

            plan = Plan(
                goal="announce release 2.0",
                steps=[
                    Step("notes", tool="fetch_notes", input="2.0"),
                    Step("summary", skill="summarize", input="release 2.0", depends_on=["notes"]),
                ],
            )
            stop, ticks = asyncio.Event(), list[int]()
            beating = asyncio.create_task(heartbeat(stop, ticks))
            handle = await rt.start(plan, call_budget=3)
            print(f"run {handle.run_id} started; the app carries on")
            result = await handle
            stop.set()
            await beating
            outputs = {o.step_id: o.output for o in result.observations}
            print(f"run ended ok={result.ok} calls_used={result.calls_used}: {outputs['summary']}")
            print(f"the loop stayed free: heartbeat ticked during the run: {bool(ticks)}")
            why = await rt.runs.why(handle.run_id)
            print(f"why: {why}")


if __name__ == "__main__":
    asyncio.run(main())
