"""kv_store: tools that see their episode — one reads the task, one keeps state for the reward.

    agentrl preview env=custom env._target_=agentrl.envs.examples.kv_store.KVEnv

Each task hides a small key-value store in its data; the prompt asks for one key's value. The
model calls `lookup(key)`, which reads the store from `ctx.task` (the episode's task), then calls
`answer(value)`, which keeps the value in `ctx.extra` (a dict of this episode alone) and ends the
episode (`ends_episode=True`). The reward reads the same dict through the env's `self.ctx`:
1.0 for the right value, and only when it was looked up first. Tools are listed once on the class
and shared by every episode, so what an episode needs lives in its context, never on the tool.
"""

from __future__ import annotations

import random

from pydantic import BaseModel, Field

from agentrl.env import ToolEnv
from agentrl.tool import Tool, ToolContext, ToolResult
from agentrl.types import Task, Trajectory

KEYS = ("apple", "pear", "plum", "fig", "lime")


class Lookup(Tool):
    name, description = "lookup", "Look up the value stored under a key."

    class Args(BaseModel):
        key: str = Field(description="the key to look up")

    async def __call__(self, args: Lookup.Args, ctx: ToolContext) -> ToolResult:
        store = ctx.task.data["store"]
        if args.key not in store:  # the model's mistake: an error it reads, counted as one
            return ToolResult(content=f"no key {args.key!r}; keys: {sorted(store)}", is_error=True)
        ctx.extra.setdefault("looked_up", []).append(args.key)
        return ToolResult(content=str(store[args.key]))


class Answer(Tool):
    name, description = "answer", "Give your final answer; the episode ends."

    class Args(BaseModel):
        value: str = Field(description="the value you found")

    async def __call__(self, args: Answer.Args, ctx: ToolContext) -> ToolResult:
        ctx.extra["answer"] = args.value.strip()
        return ToolResult(content="Answer received.", ends_episode=True)


class KVEnv(ToolEnv):
    tools = [Lookup(), Answer()]
    max_turns = 4
    system_prompt = "Look the key up with the lookup tool, then give its value with answer."

    @classmethod
    def load_tasks(cls, n: int = 200, seed: int = 0) -> list[Task]:
        rng = random.Random(seed)
        tasks = []
        for i in range(n):
            store = {k: str(rng.randint(1, 99)) for k in rng.sample(KEYS, 3)}
            key = rng.choice(sorted(store))
            data = {"prompt": f"What is stored under {key}?", "key": key, "store": store}
            tasks.append(Task(id=str(i), data=data))
        return tasks

    async def reward(self, trajectory: Trajectory) -> float:
        key, got = self.task.data["key"], self.ctx.extra.get("answer")
        looked = key in self.ctx.extra.get("looked_up", [])
        return float(looked and got == self.task.data["store"][key])
