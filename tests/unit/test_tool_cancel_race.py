"""A cancel an episode accepted (its group dropped) is never lost, even when it comes in the
loop iteration in which the episode's tool call, its turn loop or its agent ends: on Python 3.11
`asyncio.wait_for` then returned the result instead, and the dropped episode ran on (its next
turns, its reward) while the step waited for it (agentrl/tool.py, rollout.py, agent_rollout.py).
Each case asserts the rule itself: cancel() said yes, so the episode ends cancelled."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from agentrl.agent_env import AgentEnv
from agentrl.agent_rollout import AgentEpisodes
from agentrl.env import StepResult, ToolEnv
from agentrl.gateway import Gateway
from agentrl.parsers import get_parser
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.tool import Tool, ToolContext, ToolResult
from agentrl.types import Completion, FinishReason, Task

EPISODE: dict[str, asyncio.Task] = {}
ACCEPTED: list[bool] = []  # what the producer's cancel() answered
WENT_ON: list[str] = []  # what the episode did after it


def drop_the_group_now() -> None:
    """The producer's cancel, in the next callback of the loop (while the work just ends)."""
    ACCEPTED.clear()
    WENT_ON.clear()
    asyncio.get_running_loop().call_soon(lambda: ACCEPTED.append(EPISODE["task"].cancel()))


async def ends_cancelled_if_it_accepted(coro: Any) -> None:
    EPISODE["task"] = task = asyncio.ensure_future(coro)
    try:
        await task
    except asyncio.CancelledError:
        assert ACCEPTED == [True]
    else:
        assert ACCEPTED == [False], f"an accepted cancel was lost; the episode did {WENT_ON}"


class EndsAsTheGroupDrops(Tool):
    name = "ends_as_the_group_drops"
    description = "answers"

    class Args(BaseModel):
        pass

    async def __call__(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        drop_the_group_now()
        return ToolResult(content="done")


async def test_a_tool_call_that_ends_as_the_group_drops() -> None:
    async def episode() -> None:
        await EndsAsTheGroupDrops().invoke({}, ToolContext(session="s", timeout_s=5.0))
        await asyncio.sleep(0)  # its next turn
        WENT_ON.append("its next turn")

    await ends_cancelled_if_it_accepted(episode())


class OneTurn:
    """An engine that answers every prompt with end-of-turn at once."""

    async def generate(self, input_ids, params, key=None) -> Completion:
        return Completion([151645], [-0.5], FinishReason.STOP, weight_version="0")


class LastStepAsTheGroupDrops(ToolEnv):
    tools: list = []

    async def step(self, turn: Any) -> StepResult:
        drop_the_group_now()
        return StepResult(done=True)

    async def reward(self, trajectory: Any) -> float:
        WENT_ON.append("its reward")
        await asyncio.sleep(0)
        return 1.0


async def test_an_episode_whose_last_turn_ends_as_the_group_drops(qwen_tokenizer) -> None:
    ro = Rollout(OneTurn(), qwen_tokenizer, LastStepAsTheGroupDrops, RolloutConfig())
    await ends_cancelled_if_it_accepted(ro.run_episode(Task(id="t", data={"prompt": "hi"})))


class ReturnsAsTheGroupDrops(AgentEnv):
    async def run(self, task: Task, client: Any) -> float:
        drop_the_group_now()
        return 1.0

    async def close(self) -> None:
        WENT_ON.append("its scoring and close")
        await asyncio.sleep(0)


async def test_an_agent_that_returns_as_the_group_drops(qwen_tokenizer) -> None:
    gateway = Gateway(OneTurn(), qwen_tokenizer, get_parser("hermes"))
    agents = AgentEpisodes(gateway, ReturnsAsTheGroupDrops, {}, None, 5.0, 30.0, lambda t: {})
    try:
        await ends_cancelled_if_it_accepted(agents.run_episode(Task(id="t", data={})))
    finally:
        await agents.aclose()


@pytest.fixture(autouse=True)
def _fresh() -> None:
    ACCEPTED.clear()
    WENT_ON.clear()
