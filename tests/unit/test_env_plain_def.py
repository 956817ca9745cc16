"""An env written with plain `def`s works as the async one does (its methods run in a worker
thread, so a blocking reward does not stall the other episodes); a ToolEnv with no tools is
said at start-up."""

from __future__ import annotations

import asyncio
import logging
import time

from agentrl.env import Env, ToolEnv
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.types import Message, Task


class PlainEnv(ToolEnv):
    def reward(self, trajectory):
        time.sleep(0.2)  # blocking work: fine in a plain def
        return 1.0

    def close(self):
        PlainEnv.closed += 1

    closed = 0


def test_plain_def_methods_are_awaited_in_threads():
    async def go():
        envs = [PlainEnv(Task(id=str(i), data={"prompt": "x"})) for i in range(4)]
        t0 = time.monotonic()
        rewards = await asyncio.gather(*(e.reward(None) for e in envs))
        took = time.monotonic() - t0
        await asyncio.gather(*(e.close() for e in envs))
        return rewards, took

    rewards, took = asyncio.run(go())
    assert rewards == [1.0] * 4 and took < 0.6  # concurrently, not 4 x 0.2 s in the loop
    assert PlainEnv.closed == 4
    assert asyncio.iscoroutinefunction(PlainEnv.reward)


class Inherits(PlainEnv):  # a subclass of a plain-def env keeps the wrapped methods
    pass


class AsyncEnv(Env):
    async def start(self):
        return [Message(role="user", content="x")]


def test_async_methods_stay_as_written_and_subclasses_inherit():
    assert asyncio.run(Inherits(Task(id="a", data={"prompt": "x"})).reward(None)) == 1.0
    assert asyncio.run(AsyncEnv(Task(id="a")).start())[0].content == "x"


class NoTools(ToolEnv):
    tools = []

    async def reward(self, trajectory):
        return 0.0


def test_a_tool_env_without_tools_is_said(qwen_tokenizer, caplog):
    caplog.set_level(logging.WARNING, logger="agentrl.rollout")
    Rollout.prepare(qwen_tokenizer, NoTools, RolloutConfig())
    Rollout.prepare(qwen_tokenizer, NoTools, RolloutConfig())  # start-up, then the rollout's
    said = [r for r in caplog.records if "NoTools is a ToolEnv with no tools" in r.getMessage()]
    assert len(said) == 1, "said once a run (it was twice)"
