"""code_exec's format reward pays for an answer given, not for an empty answer tag."""

from __future__ import annotations

import pytest

from agentrl.envs.code_exec import CodeExecEnv
from agentrl.types import Message, StopReason, Task, Trajectory


async def score(text: str) -> dict[str, float]:
    env = CodeExecEnv(Task(id="t", data={"prompt": "Compute 6 * 7.", "answer": "42"}))
    env.format_reward = 0.1
    traj = Trajectory(task_id="t", sample_index=0, token_ids=[], loss_mask=[], logprobs=[],
                      prompt_len=0, turns=[], messages=[Message(role="assistant", content=text)],
                      stop_reason=StopReason.COMPLETED)  # fmt: skip
    return await env.reward(traj)


@pytest.mark.parametrize("text", ["<answer></answer>", "<answer> \n </answer>"])
async def test_an_empty_answer_tag_earns_no_format_reward(text: str) -> None:
    """A red-team pass: '<answer></answer>', no answer at all, was paid format_reward."""
    assert await score(text) == {"total": 0.0, "correct": 0.0, "format": 0.0}


async def test_an_answer_earns_the_format_reward_and_the_right_one_both() -> None:
    assert (await score("<answer>41</answer>"))["total"] == pytest.approx(0.1)
    assert (await score("<answer> 42 </answer>"))["total"] == pytest.approx(1.1)
