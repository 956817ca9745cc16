"""Train an agent you already have: the README's add task as a LangGraph ReAct agent.

LangGraph's prebuilt ReAct graph on LangChain's `ChatOpenAI`, pointed at the base URL and key
agentrl hands `run`, so every completion it asks for is sampled by the policy in training and
recorded token-exact. The recursion limit allows `max_turns` model calls (a model call and its
tool calls are two graph steps); a model still calling tools on its last one scores 0 (the graph
then ends on its "need more steps" reply, or raises GraphRecursionError).

    python -m agentrl.train env=custom env._target_=agentrl.envs.examples.agent_langgraph.AddAgentGraph
"""

from __future__ import annotations

from typing import Any

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent

from agentrl.agent_env import AgentEnv
from agentrl.envs.examples.agent_openai import SYSTEM, add_tasks
from agentrl.types import Task


@tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


class AddAgentGraph(AgentEnv):
    max_turns = 4

    @classmethod
    def load_tasks(cls, n: int = 100, seed: int = 0) -> list[Task]:
        return add_tasks(n, seed)

    async def run(self, task: Task, client: Any) -> float:
        model = ChatOpenAI(
            model="policy", base_url=str(client.base_url), api_key=client.api_key, max_retries=0
        )
        agent = create_react_agent(model, [add], prompt=SYSTEM)
        try:
            state = await agent.ainvoke(
                {"messages": [("user", task.data["prompt"])]},
                {"recursion_limit": 2 * self.max_turns},
            )
        except GraphRecursionError:
            return 0.0
        return float(state["messages"][-1].text.strip() == task.data["answer"])
