"""Your own pykka actor drives journaled by messages alone (SPEC A4, docs/protocol.md).

The actor below knows nothing of journaled's Python API: it only sends requests to the gateway's
address and reacts to the replies told to its own address. It remembers a fact, searches for it,
runs a two-step plan, and stops when the run's result arrives. Offline; run it with

    python examples/foreign_actor.py
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path
from typing import Any

import pykka

import journaled
from journaled import Plan, Step
from journaled.events.gateway_messages import (
    GatewayRequest,
    RememberRequest,
    RunStartedReply,
    SearchFacts,
    StartRun,
)
from journaled.events.messages import Failure, Remembered
from journaled.events.run_messages import RunEnded

ME = "example/release-bot"


class ReleaseBot(pykka.ThreadingActor):
    """A user's actor: one conversation with journaled, step by step, driven by replies."""

    def __init__(self, gateway: str, send: Any, done: threading.Event) -> None:
        super().__init__()
        self.gateway = gateway
        self.send = send
        self.done = done
        self.log: list[str] = []

    def ask(self, cls: type[GatewayRequest], correlation: str, **fields: Any) -> None:
        self.send(cls(reply_to=ME, correlation=correlation, **fields))

    def on_receive(self, message: Any) -> Any:
        match message:
            case "go":
                self.ask(RememberRequest, "remember", text="releases ship on Fridays", domain="ops")
            case Remembered(fact=fact):
                self.log.append(f"remembered {fact.id}: {fact.text}")
                self.ask(SearchFacts, "search", query="when do releases ship")
            case _ if getattr(message, "correlation", None) == "search":
                self.log.append(f"search found: {[f.text for f in message.facts]}")
                plan = Plan(
                    goal="announce the release",
                    steps=[
                        Step("draft", tool="draft", input="v2.0"),
                        Step("shout", tool="shout", input="ship it", depends_on=["draft"]),
                    ],
                )
                self.ask(StartRun, "release", plan=plan, call_budget=5)
            case RunStartedReply(run_id=run_id):
                self.log.append(f"run {run_id} started; carrying on without waiting")
            case RunEnded(result=result):
                outputs = {o.step_id: o.output for o in result.observations}
                self.log.append(f"run ended ok={result.ok}: {outputs['draft']}, {outputs['shout']}")
                self.done.set()
            case Failure(error=error, message=text, field=field):
                self.log.append(f"failed: {error} at {field}: {text}")
                self.done.set()
            case "log":
                return list(self.log)
        return None


def main() -> None:
    """Open a runtime, let the bot talk to it, print the conversation."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'journal.sqlite'}"
        with journaled.open(url) as rt:
            rt.register_tool("draft", lambda version: f"{version} is out")
            rt.register_tool("shout", lambda text: str(text).upper())
            done = threading.Event()
            bot = ReleaseBot.start(rt.protocol.address, rt.protocol.send, done)
            try:
                # The bot's ref is its mailbox: any object with tell(message) can be one.
                rt.protocol.register(ME, bot)
                bot.tell("go")
                if not done.wait(30):
                    raise SystemExit("no answer from journaled within 30 s")
                for line in bot.ask("log", timeout=10):
                    print(line)
            finally:
                rt.protocol.unregister(ME)
                bot.stop(timeout=10)


if __name__ == "__main__":
    main()
