"""A forgotten `await` (a reward, a tool or `start` returning a coroutine) is named as such, with
no 'never awaited' warning besides; a reward that fails in every episode is a few lines, not one
per episode (64 a step at the quick start's settings hid the step lines)."""

from __future__ import annotations

import asyncio
import logging
import warnings

import pytest
from pydantic import BaseModel

from agentrl.env import ToolEnv, checked_messages, finish_episode, read_reward
from agentrl.repeats import warn_episode
from agentrl.tool import Tool, ToolContext, ToolResult
from agentrl.types import FinishReason, Message, StopReason, Task, Trajectory, Turn


class Add(Tool):
    name, description = "add", "Add two integers."

    class Args(BaseModel):
        a: int
        b: int

    async def __call__(self, args, ctx: ToolContext) -> ToolResult:
        return ToolResult(content=str(args.a + args.b))


async def _grade() -> float:
    return 1.0


def test_a_forgotten_await_is_named_and_python_does_not_warn_as_well():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a 'coroutine ... was never awaited' RuntimeWarning
        with pytest.raises(TypeError, match=r"reward is a coroutine of _grade: an `await` is miss"):
            read_reward(_grade())
        with pytest.raises(TypeError, match=r"start\(\): got a coroutine of _grade: an `await`"):
            checked_messages(_grade(), "MyEnv.start()")


def test_a_tool_that_forgets_await_is_logged_as_such(caplog):
    class NoAwait(Add):
        async def __call__(self, args, ctx):
            return self.compute(args)

        async def compute(self, args):
            return ToolResult(content="3")

    with caplog.at_level(logging.ERROR, logger="agentrl.tool"):
        result = asyncio.run(NoAwait().invoke({"a": 1, "b": 2}, ToolContext()))
    assert result.is_error and result.is_tool_fault
    assert "returned a coroutine of " in caplog.text and "an `await` is missing" in caplog.text


def _episode(session: str) -> Trajectory:
    turn = Turn(start=1, end=2, obs_end=2, weight_version="0", finish_reason=FinishReason.STOP,
                assistant=Message(role="assistant", content="x"))  # fmt: skip
    return Trajectory(task_id="t", sample_index=0, token_ids=[1, 2], loss_mask=[0, 1],
                      logprobs=[0.0, -1.0], prompt_len=1, turns=[turn], messages=[],
                      stop_reason=StopReason.COMPLETED, metadata={"session": session})  # fmt: skip


def test_a_reward_that_fails_in_every_episode_is_not_a_wall_of_warnings(caplog):
    """One line per episode (64 a step at the quick start's settings) hid the step lines."""

    class TextReward(ToolEnv):
        async def reward(self, trajectory):
            return "1"

    with caplog.at_level(logging.WARNING, logger="agentrl.env"):
        for i in range(12):
            traj = _episode(f"s{i}")
            asyncio.run(finish_episode(TextReward(Task(id="t", data={"prompt": "p"})), traj))
            assert traj.stop_reason is StopReason.REWARD_ERROR
    lines = [r for r in caplog.records if "reward failed: TypeError: reward is text" in r.message]
    assert len(lines) == 2  # the 1st and the 10th


def test_repeated_warnings_are_counted_without_object_addresses(caplog):
    log = logging.getLogger("agentrl.test_mistakes")
    with caplog.at_level(logging.WARNING, logger=log.name):
        for i in range(5):
            warn_episode(log, f"s{i}", f"aborted: got <coroutine object f at 0x7f{i:010x}>")
    assert len(caplog.records) == 1
