"""Train an agent you already have: the README's add task on the OpenAI Agents SDK.

An ordinary `agents.Agent` with a function tool, run by `Runner.run`. Its model is the SDK's
chat-completions model (`env.args.api=responses`: the SDK's default, the Responses API) on the
client agentrl hands `run`, so every completion it asks for is
sampled by the policy in training and recorded token-exact; tracing is off for the run (nothing
leaves the machine). A call to a tool it lacks is answered with an error, as the hand-written
loop does; a model that never stops calling tools spends `max_turns` and scores 0.

    python -m agentrl.train env=custom env._target_=agentrl.envs.examples.agent_openai_agents.AddAgentSDK
"""

from __future__ import annotations

from typing import Any

from agents import (
    Agent,
    MaxTurnsExceeded,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
)

from agentrl.agent_env import AgentEnv
from agentrl.envs.examples.agent_openai import SYSTEM, add_tasks
from agentrl.types import Task

MODELS = {"chat_completions": OpenAIChatCompletionsModel, "responses": OpenAIResponsesModel}


@function_tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


class AddAgentSDK(AgentEnv):
    max_turns = 4
    api: str = "chat_completions"  # or "responses" (the SDK's default): env.args.api=responses

    @classmethod
    def load_tasks(cls, n: int = 100, seed: int = 0) -> list[Task]:
        return add_tasks(n, seed)

    async def run(self, task: Task, client: Any) -> float:
        agent = Agent(
            name="adder",
            instructions=SYSTEM,
            tools=[add],
            model=MODELS[self.api](model="policy", openai_client=client),
        )
        try:
            result = await Runner.run(
                agent,
                task.data["prompt"],
                max_turns=self.max_turns,
                run_config=RunConfig(
                    tracing_disabled=True, tool_not_found_behavior="return_error_to_model"
                ),
            )
        except MaxTurnsExceeded:
            return 0.0
        return float(str(result.final_output).strip() == task.data["answer"])
