"""The units example env's reward: a reply that float() reads but that is no number ("nan",
"inf", "1e999") earns neither the answer nor the format reward (red-team finding: with
`format_reward` > 0 the policy was paid for "nan")."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.envs.examples.units import UnitsEnv
from agentrl.types import FinishReason, Message, StopReason, Task, Trajectory, Turn


def scored(reply: str, answer: str = "3.28") -> dict[str, float]:
    env = UnitsEnv(Task(id="t", data={"prompt": "1 m in feet?", "answer": answer}))
    env.format_reward = 0.1
    turn = Turn(start=2, end=4, obs_end=4, weight_version="0", finish_reason=FinishReason.STOP,
                assistant=Message(role="assistant", content=reply))  # fmt: skip
    traj = Trajectory(task_id="t", sample_index=0, token_ids=[0, 1, 2, 3], loss_mask=[0, 0, 1, 1],
                      logprobs=[0.0] * 4, prompt_len=2, turns=[turn],
                      messages=[Message(role="assistant", content=reply)],
                      stop_reason=StopReason.COMPLETED)  # fmt: skip
    return asyncio.run(env.reward(traj))


@pytest.mark.parametrize("reply", ["nan", "NaN", "inf", "-Infinity", "1e999", " nan "])
def test_non_finite_replies_earn_nothing(reply: str) -> None:
    assert scored(reply) == {"total": 0.0, "correct": 0.0, "format": 0.0}


def test_a_number_earns_the_format_reward_and_the_right_one_the_answer() -> None:
    assert scored("3.28") == {"total": 1.1, "correct": 1.0, "format": 1.0}
    assert scored("7") == {"total": 0.1, "correct": 0.0, "format": 1.0}
    assert scored("seven")["total"] == 0.0
