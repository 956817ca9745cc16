"""rollout.truncated (train | mask | penalise): one group with one length-truncated episode under
each mode, against numbers computed by hand (the arithmetic is in the comments).

The group, every member 2 sampled tokens after a 2-token prompt:
    a completed R=1, b completed R=0, c completed R=0, d length (truncated) R=1
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentrl.advantage import (
    AdvantageConfig,
    Truncation,
    carries_gradient,
    compute_advantages,
    is_truncated,
)
from agentrl.batch import LossNorm, TrainBatch, trainable
from agentrl.config import compose
from agentrl.metrics import rollout_metrics
from agentrl.rollout import RolloutConfig
from agentrl.types import FinishReason, Message, StopReason, Trajectory, Turn

DR = AdvantageConfig(name="drgrpo")


def traj(
    reward: float, stop: StopReason = StopReason.COMPLETED, turn_rewards: list[float] | None = None
) -> Trajectory:
    """One turn: 2 prompt ids, 2 sampled ids."""
    turn = Turn(start=2, end=4, obs_end=4, weight_version="0", finish_reason=FinishReason.STOP,
                assistant=Message(role="assistant"), reward=(turn_rewards or [None])[0])  # fmt: skip
    return Trajectory(task_id="t", sample_index=0, token_ids=[0, 1, 2, 3], loss_mask=[0, 0, 1, 1],
                      logprobs=[0.0, 0.0, -0.5, -0.5], prompt_len=2, turns=[turn], messages=[],
                      stop_reason=stop, reward=reward)  # fmt: skip


def sampled(adv, t: Trajectory) -> list[float]:
    return adv[2:4].tolist()  # A = R - mean_G R: easy to check by hand


def group(last: StopReason = StopReason.LENGTH, r_last: float = 1.0):
    return [
        traj(1.0),
        traj(0.0),
        traj(0.0),
        traj(r_last, stop=last),
    ]


def advs(g, cfg=DR, truncation=None):
    out = compute_advantages([g], cfg, truncation=truncation or Truncation())
    return [sampled(a, t) for a, t in zip(out.advantages, g, strict=True)]


def test_which_stop_reasons_are_truncated() -> None:
    assert is_truncated(traj(0.0, stop=StopReason.LENGTH))
    assert is_truncated(traj(0.0, stop=StopReason.CONTEXT_OVERFLOW))
    for stop in (StopReason.COMPLETED, StopReason.MAX_TURNS, StopReason.PARSE_ERROR,
                 StopReason.REWARD_ERROR, StopReason.ABORTED):  # fmt: skip
        assert not is_truncated(traj(0.0, stop=stop)), stop


def test_train_is_todays_behaviour() -> None:
    # mean(1, 0, 0, 1) = 0.5 -> A = +0.5, -0.5, -0.5, +0.5: d scored and trained in full
    g = group()
    assert advs(g) == [[0.5, 0.5], [-0.5, -0.5], [-0.5, -0.5], [0.5, 0.5]]
    assert advs(g) == advs(g, truncation=Truncation("train"))
    batch = TrainBatch.from_trajectories(g, None, Truncation("train"))
    assert batch.source == [0, 1, 2, 3] and batch.norm == LossNorm(num_tokens=8, num_seqs=4)


def test_mask_keeps_the_baseline_and_drops_the_gradient() -> None:
    # d stays in the baseline: mean(1, 0, 0, 1) = 0.5 -> a, b, c exactly as under train; d: 0
    g, mask = group(), Truncation("mask")
    assert advs(g, truncation=mask) == [[0.5, 0.5], [-0.5, -0.5], [-0.5, -0.5], [0.0, 0.0]]
    # grpo: std (Bessel) of (1, 0, 0, 1) = sqrt(4 * 0.25 / 3) = 0.57735 -> 0.5 / 0.57735 = 0.866
    a = advs(g, AdvantageConfig(name="grpo"), mask)
    assert a[0] == pytest.approx([0.866025, 0.866025], abs=1e-5)
    assert a[1] == pytest.approx([-0.866025, -0.866025], abs=1e-5)
    assert a[3] == [0.0, 0.0]
    # the batch: d left out (loss mask 0 in effect), not counted in the normaliser: 3 seqs x 2
    out = compute_advantages([g], DR, truncation=mask)
    batch = TrainBatch.from_trajectories(g, out.advantages, mask)
    assert batch.source == [0, 1, 2]
    assert batch.norm == LossNorm(num_tokens=6, num_seqs=3)
    assert batch.advantages[batch.loss_mask].tolist() == [0.5, 0.5, -0.5, -0.5, -0.5, -0.5]
    assert [trainable(t, mask) for t in g] == [True, True, True, False]


def test_mask_counts_context_overflow_not_max_turns() -> None:
    mask = Truncation("mask")
    assert advs(group(StopReason.CONTEXT_OVERFLOW), truncation=mask)[3] == [0.0, 0.0]
    assert advs(group(StopReason.MAX_TURNS), truncation=mask)[3] == [0.5, 0.5]


def test_mask_whitening_skips_masked_tokens() -> None:
    # reinforce_pp_baseline: A = R - 0.5 = (.5 .5 | -.5 -.5 | -.5 -.5) over the trained tokens,
    # mean -1/6, std (Bessel, n=6) = sqrt((2 * (2/3)^2 + 4 * (1/3)^2) / 5) = sqrt(0.26667) = 0.5164
    a = advs(group(), AdvantageConfig(name="reinforce_pp_baseline"), Truncation("mask"))
    assert a[0] == pytest.approx([1.290994] * 2, abs=1e-5)  # (0.5 + 1/6) / 0.5164
    assert a[1] == pytest.approx([-0.645497] * 2, abs=1e-5)  # (-0.5 + 1/6) / 0.5164
    assert a[3] == [0.0, 0.0]


def test_penalise_replaces_the_reward_before_advantages() -> None:
    g = group()
    # truncated_reward 0: R = (1, 0, 0, 0), mean 0.25 -> A = 0.75, -0.25, -0.25, -0.25
    assert advs(g, truncation=Truncation("penalise", 0.0)) == [
        [0.75, 0.75], [-0.25, -0.25], [-0.25, -0.25], [-0.25, -0.25]
    ]  # fmt: skip
    # truncated_reward -1: R = (1, 0, 0, -1), mean 0 -> A = 1, 0, 0, -1; trained in full
    pen = Truncation("penalise", -1.0)
    assert advs(g, truncation=pen) == [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [-1.0, -1.0]]
    assert TrainBatch.from_trajectories(g, None, pen).source == [0, 1, 2, 3]
    assert g[3].reward == 1.0  # the trajectory keeps the env's reward (reward/* metrics)


def test_penalise_keeps_turn_rewards_of_finished_turns() -> None:
    # reward_level=turn, one turn each: d's turn reward 0.5 stays, its outcome 1 -> 0.
    # G_0 = (1, 0, 0, 0.5), mean 0.375 -> A = 0.625, -0.375, -0.375, 0.125
    g = [traj(1.0), traj(0.0), traj(0.0),
         traj(1.0, stop=StopReason.LENGTH, turn_rewards=[0.5])]  # fmt: skip
    cfg = AdvantageConfig(name="drgrpo", reward_level="turn")
    a = advs(g, cfg, Truncation("penalise", 0.0))
    assert [x[0] for x in a] == pytest.approx([0.625, -0.375, -0.375, 0.125])


def test_carries_gradient_under_each_mode() -> None:
    # a completed 1 and a truncated 1: equal under train/mask, unequal once penalised
    g = [traj(1.0), traj(1.0, stop=StopReason.LENGTH)]
    assert not carries_gradient(g, DR)
    assert not carries_gradient(g, DR, truncation=Truncation("mask"))
    assert carries_gradient(g, DR, truncation=Truncation("penalise"))
    # every member truncated: under mask nothing trains, whatever the rewards
    g = [traj(1.0, stop=StopReason.LENGTH), traj(0.0, stop=StopReason.CONTEXT_OVERFLOW)]
    assert carries_gradient(g, DR)
    assert not carries_gradient(g, DR, truncation=Truncation("mask"))
    assert not carries_gradient(g, DR, reward_penalty=True, truncation=Truncation("mask"))
    with pytest.raises(ValueError, match="rollout.truncated=mask"):
        TrainBatch.from_trajectories(g, None, Truncation("mask"))


def test_metrics_count_truncated_episodes() -> None:
    g = group() + [
        traj(0.0, stop=StopReason.CONTEXT_OVERFLOW),
        traj(0.0, stop=StopReason.MAX_TURNS),
    ]
    m = rollout_metrics(g)
    assert (m["rollout/truncated"], m["rollout/truncated_masked"]) == (2.0, 0.0)
    m = rollout_metrics(g, Truncation("mask"))
    assert (m["rollout/truncated_masked"], m["rollout/truncated_penalised"]) == (2.0, 0.0)
    m = rollout_metrics(g, Truncation("penalise"))
    assert (m["rollout/truncated_penalised"], m["reward/mean"]) == (2.0, 2.0 / 6)  # env's


def test_config_default_and_values() -> None:
    assert RolloutConfig().truncated == "train" and RolloutConfig().truncated_reward == 0.0
    assert "default" in RolloutConfig.model_fields["truncated"].description
    cfg = compose(["env=units", "rollout.truncated=penalise", "rollout.truncated_reward=-1"])
    assert (cfg.rollout.truncated, cfg.rollout.truncated_reward) == ("penalise", -1.0)
    with pytest.raises(ValidationError):
        RolloutConfig(truncated="clip")
