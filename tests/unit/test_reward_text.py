"""A reward that is text is the env's error (reward_error), never read as a number: float() takes
'1_000', ' 1e6 ' and Arabic digits, so text passed on as a reward is the policy's to set."""

from __future__ import annotations

import pytest

from agentrl.env import ToolEnv, finish_episode, read_reward
from agentrl.types import Message, StopReason, Task, Trajectory


class JudgedEnv(ToolEnv):
    """A user env whose judge replies in text, passed on as the reward (a plausible mistake)."""

    async def reward(self, trajectory: Trajectory) -> str:
        return f"{self.final_text(trajectory)}"  # the judge echoes a score the answer claims


def episode(text: str) -> Trajectory:
    return Trajectory(task_id="t", sample_index=0, token_ids=[], loss_mask=[], logprobs=[],
                      prompt_len=0, turns=[], messages=[Message(role="assistant", content=text)],
                      stop_reason=StopReason.COMPLETED, metadata={"session": "s"})  # fmt: skip


@pytest.mark.parametrize("claim", ["1_000", " 1e6 ", "\u0661\u0660"])
async def test_a_reward_given_as_text_is_an_error_not_a_number(claim: str) -> None:
    """A red-team pass: the policy wrote its own score (1_000 earned 1000.0, '١٠' 10.0)."""
    traj = episode(claim)
    await finish_episode(JudgedEnv(Task(id="t", data={"prompt": "p"})), traj)
    assert traj.stop_reason is StopReason.REWARD_ERROR and traj.reward == 0.0
    assert "is text" in traj.error


def test_numbers_of_any_kind_are_still_read() -> None:
    import numpy as np

    assert read_reward(True) == (1.0, {}) and read_reward(np.float32(0.5)) == (0.5, {})
    assert read_reward({"total": np.int64(1), "ok": False}) == (1.0, {"total": 1.0, "ok": 0.0})
    with pytest.raises(TypeError, match=r"reward\['judge'\] is text"):
        read_reward({"total": 1.0, "judge": "0.9"})


async def test_a_turn_reward_given_as_text_is_a_reward_error_not_an_abort() -> None:
    """It raised TypeError out of the step (the episode aborted: out of its group's baseline)."""
    from agentrl.env import AssistantTurn, Env, StepResult, take_step
    from agentrl.types import FinishReason, Turn

    class Shaped(Env):
        async def step(self, turn: AssistantTurn) -> StepResult:
            return StepResult(done=True, reward="0.3")

    said = Message(role="assistant", content="hi")
    turn = Turn(0, 0, 0, "0", FinishReason.STOP, said)
    env = Shaped(Task(id="t", data={}))
    assert await take_step(env, AssistantTurn(said, "hi"), turn) is StopReason.REWARD_ERROR
    assert turn.reward == 0.0


def test_a_reward_that_is_not_a_number_says_what_to_return() -> None:
    """A new user's reward() fell off its end (None): float()'s own TypeError named no fix."""
    with pytest.raises(
        TypeError, match=r"reward is NoneType \(None\), not a number: return a float"
    ):
        read_reward(None)
    with pytest.raises(TypeError, match=r"reward\['ok'\] is list \(\[1\]\), not a number"):
        read_reward({"total": 1.0, "ok": [1]})
    with pytest.raises(
        ValueError, match=r"needs a 'total' key .*got \['correct'\]: e\.g\. \{'total'"
    ):
        read_reward({"correct": 1.0})
