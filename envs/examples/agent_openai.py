"""Train an agent you already have: a hand-written tool loop on the `openai` SDK.

The agent below is ordinary OpenAI-client code. agentrl runs it once per episode with a client
that leads to its gateway, so every completion it asks for is sampled by the policy in training
and recorded token-exact; `run` returns the reward.

    python -m agentrl.train env=custom env._target_=agentrl.envs.examples.agent_openai.AddAgent
"""

from __future__ import annotations

import json
from typing import Any

from agentrl.agent_env import AgentEnv
from agentrl.types import Task

SYSTEM = "Use the add tool, then reply with the number only."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def add_tool(arguments: str) -> str:
    try:
        args = json.loads(arguments)
        return str(int(args["a"]) + int(args["b"]))
    except (ValueError, KeyError, TypeError) as e:
        return f"Error: {type(e).__name__}: {e}"


def add_tasks(n: int = 100, seed: int = 0) -> list[Task]:
    """The README's AddEnv tasks: "What is i + (i+1)?"."""
    return [
        Task(id=str(i), data={"prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)})
        for i in range(n)
    ]


class AddAgent(AgentEnv):
    max_turns = 4

    @classmethod
    def load_tasks(cls, n: int = 100, seed: int = 0) -> list[Task]:
        return add_tasks(n, seed)

    async def run(self, task: Task, client: Any) -> float:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": task.data["prompt"]},
        ]
        answer = ""
        for _ in range(self.max_turns):
            out = await client.chat.completions.create(
                model="policy", messages=messages, tools=TOOLS
            )
            msg = out.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            answer = msg.content or ""
            if not msg.tool_calls:
                break
            for call in msg.tool_calls:
                result = add_tool(call.function.arguments)
                if call.function.name != "add":
                    result = f"Error: unknown tool {call.function.name!r}"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return float(answer.strip() == task.data["answer"])
