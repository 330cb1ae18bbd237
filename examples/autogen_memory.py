"""An AutoGen Core agent with journaled memory, run as a journaled agent step (SPEC X1, X3).

What it shows, offline (a scripted model stands in for the LLM; needs ``journaled[autogen]``):

1. ``JournaledMemory`` is the AutoGen agent's memory: what is added through AutoGen becomes a
   journaled fact, and a newer fact with the same conflict key supersedes the older one.
2. The agent's handler calls ``memory.update_context`` on its model context, as AutoGen's agents
   do, so the model reads the relevant facts in a ``SystemMessage``.
3. The agent, hosted on AutoGen's ``SingleThreadedAgentRuntime``, is a journaled agent step: the
   plan's step sends it a ``StepMessage``, it asks for approval first (the run waits), the answer
   given to ``rt.resume`` reaches it, its reply is the step's output and the model request it
   reports is charged as one call.
4. ``rt.memory.why`` explains the fact; ``memory.clear()`` deletes the scope's facts, journaled.

Run it with

    python examples/autogen_memory.py
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from autogen_core import MessageContext, RoutedAgent, SingleThreadedAgentRuntime, message_handler
from autogen_core.memory import MemoryContent, MemoryMimeType
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import RequestUsage, UserMessage

import journaled
from journaled import ExecuteResult, Plan, Step
from journaled.integrations.autogen import (
    JournaledMemory,
    StepMessage,
    StepReply,
    register_autogen_agent,
)
from journaled.testing import ScriptedModel


class DeployAgent(RoutedAgent):
    """An AutoGen agent that plans a deployment from what its memory knows."""

    def __init__(self, memory: JournaledMemory, model: ScriptedModel) -> None:
        super().__init__("plans deployments from memory")
        self._memory = memory
        self._model = model

    @message_handler
    async def on_step(self, message: StepMessage, ctx: MessageContext) -> StepReply:
        if message.answer is None:
            return StepReply(needs_input=f"approve: {message.task}?")
        if message.answer != "yes":
            return StepReply(error=f"not approved ({message.answer})")
        context = UnboundedChatCompletionContext()
        await context.add_message(UserMessage(content=str(message.task), source="operator"))
        await self._memory.update_context(context)  # adds the relevant facts
        prompt = "\n".join(str(m.content) for m in await context.get_messages())
        print("the model reads:", prompt.splitlines()[-1])
        answer = self._model.complete(prompt)
        usage = RequestUsage(prompt_tokens=len(prompt.split()), completion_tokens=len(answer))
        return StepReply(output=answer, usage=[usage])


async def main(url: str) -> None:
    model = ScriptedModel({"eu-west-1": "deploying billing to eu-west-1"})
    async with journaled.aio.open(url) as rt:
        memory = JournaledMemory(rt, scope="session")
        for region in ("us-east-1", "eu-west-1"):
            await memory.add(
                MemoryContent(
                    content=f"staging runs in {region}",
                    mime_type=MemoryMimeType.TEXT,
                    metadata={"conflict_key": "staging-region", "source": "ops-chat"},
                )
            )
        found = await memory.query("staging region")
        print("memory knows:", [item.content for item in found.results])

        runtime = SingleThreadedAgentRuntime()
        await DeployAgent.register(runtime, "deployer", lambda: DeployAgent(memory, model))
        runtime.start()
        try:
            register_autogen_agent(rt, "deployer", runtime=runtime, agent_type="deployer")
            plan = Plan(
                goal="ship billing",
                steps=[Step("deploy", agent="deployer", input="deploy billing to staging")],
            )
            first = await rt.execute(plan)
            print("waiting:", first.waiting, "-", first.observations[-1].error)
            done = await rt.resume(first.run_id, answers={"deploy": "yes"})
        finally:
            await runtime.stop()
        assert isinstance(done, ExecuteResult)
        print("step output:", done.observations[-1].output)
        print("calls charged:", done.calls_used)

        fact_id = found.results[0].metadata["id"] if found.results[0].metadata else ""
        print("why:", (await rt.memory.why(fact_id)).splitlines()[1].strip())
        await memory.clear()
        left = [f for f in await rt.memory.all() if f.scope == "session"]
        last = (await rt.memory.why(fact_id)).splitlines()[-1].strip()
        print(f"after clear: {len(left)} facts; why: {last}")
        await memory.close()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(main(f"sqlite:///{Path(folder) / 'journal.sqlite'}"))
