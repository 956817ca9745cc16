"""A reward component (a key of the dict `Env.reward` returns, beside `total`) that is not a
finite number is the env's error, as a non-finite total is: the episode ends `reward_error`
(scored 0, in its group) with a message naming the component, and no NaN reaches reward/*."""

from __future__ import annotations

import math

import pytest

from agentrl.env import ToolEnv, finish_episode, read_reward
from agentrl.metrics import reward_metrics
from agentrl.types import Message, StopReason, Task, Trajectory


class BrokenJudgeEnv(ToolEnv):
    """An env whose judge component divides by zero on this answer (0/0 in numpy is NaN)."""

    bad: float = math.nan

    async def reward(self, trajectory: Trajectory) -> dict[str, float]:
        return {"total": 1.0, "format": 1.0, "judge": self.bad}


def episode() -> Trajectory:
    return Trajectory(task_id="t", sample_index=0, token_ids=[], loss_mask=[], logprobs=[],
                      prompt_len=0, turns=[], messages=[Message(role="assistant", content="x")],
                      stop_reason=StopReason.COMPLETED, metadata={"session": "s"})  # fmt: skip


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
async def test_a_non_finite_component_is_a_reward_error_naming_it(bad: float) -> None:
    env = BrokenJudgeEnv(Task(id="t", data={"prompt": "p"}))
    env.bad = bad
    traj = episode()
    await finish_episode(env, traj)
    assert traj.stop_reason is StopReason.REWARD_ERROR and traj.reward == 0.0
    assert "'judge'" in traj.error
    metrics = reward_metrics([traj])
    assert all(math.isfinite(v) for v in metrics.values()), metrics


def test_read_reward_refuses_a_non_finite_component_as_it_does_a_total() -> None:
    with pytest.raises(ValueError, match=r"reward\['judge'\] is nan"):
        read_reward({"total": 1.0, "judge": float("nan")})
    with pytest.raises(ValueError, match="reward is inf"):
        read_reward({"total": float("inf")})
    assert read_reward({"total": 0.5, "judge": 0.25}) == (0.5, {"total": 0.5, "judge": 0.25})
