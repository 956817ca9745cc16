"""`carries_gradient`: whether a group's advantages can be non-zero, the one test behind dynamic
sampling, the no-signal warning and adv/zero_std_groups; against advantages computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.advantage import SIGNAL_ATOL, AdvantageConfig, carries_gradient, compute_advantages
from agentrl.guards import ignored_turn_rewards
from agentrl.metrics import rollout_metrics, sampled_reward_metrics
from agentrl.types import FinishReason, Message, StopReason, Trajectory, Turn

TURN = AdvantageConfig(name="grpo", reward_level="turn")
TRAJ = AdvantageConfig(name="grpo")


def traj(
    reward: float,
    turn_rewards: tuple[float | None, ...] = (None, None),
    sampled: int = 2,
    stop: StopReason = StopReason.COMPLETED,
) -> Trajectory:
    """Prompt of 2 tokens, then per turn `sampled` sampled tokens and 1 observation token."""
    pos, turns, mask = 2, [], [0, 0]
    for r in turn_rewards:
        turns.append(Turn(start=pos, end=pos + sampled, obs_end=pos + sampled + 1,
                          weight_version="0", finish_reason=FinishReason.STOP,
                          assistant=Message(role="assistant"), reward=r))  # fmt: skip
        mask += [1] * sampled + [0]
        pos += sampled + 1
    return Trajectory(task_id="t", sample_index=0, token_ids=list(range(pos)), loss_mask=mask,
                      logprobs=[-0.5 * m for m in mask], prompt_len=2, turns=turns, messages=[],
                      stop_reason=stop, reward=reward)  # fmt: skip


def max_abs(group: list[Trajectory], cfg: AdvantageConfig, **kw) -> float:
    return float(torch.cat(compute_advantages([group], cfg, **kw).advantages).abs().max())


def test_equal_outcomes_with_different_turn_rewards_carry_gradient_at_turn_level():
    # outcome 1 for both; turn rewards (.3, 0) vs (0, 0): G_0 = 1.3 vs 1.0, G_1 = 1.0 vs 1.0.
    # turn 0: mean 1.15, sample std .3/sqrt(2) = .2121 -> A = +-.15/.2121 = +-.7071; turn 1: 0
    group = [traj(1.0, (0.3, 0.0)), traj(1.0, (0.0, 0.0))]
    assert carries_gradient(group, TURN)
    out = compute_advantages([group], TURN)
    assert out.advantages[0].tolist() == pytest.approx([0, 0, 0.7071, 0.7071, 0, 0, 0, 0], abs=1e-4)
    assert out.metrics["adv/zero_std_groups"] == 0.0
    # the old test (outcome rewards only) called this group flat: it would have been dropped
    assert len({t.reward for t in group}) == 1


def test_trajectory_level_ignores_turn_rewards_and_says_so():
    group = [traj(1.0, (0.3, 0.0)), traj(1.0, (0.0, 0.0))]
    assert not carries_gradient(group, TRAJ)
    assert max_abs(group, TRAJ) == 0  # the estimator agrees: every advantage 0
    msg = ignored_turn_rewards(group, "trajectory")
    assert msg is not None and "algo.advantage.reward_level=turn" in msg and "1 non-zero" in msg
    assert ignored_turn_rewards(group, "turn") is None
    assert ignored_turn_rewards([traj(1.0, (0.0, None))], "trajectory") is None  # nothing lost


def test_all_equal_everything_carries_nothing():
    for cfg in (TURN, TRAJ, AdvantageConfig(name="rloo", reward_level="turn"),
                AdvantageConfig(name="drgrpo")):  # fmt: skip
        group = [traj(1.0, (0.3, 0.0)), traj(1.0, (0.3, 0.0)), traj(1.0, (0.3, 0.0))]
        assert not carries_gradient(group, cfg)
        assert max_abs(group, cfg) <= SIGNAL_ATOL  # rloo leaves ~2e-16 of rounding: not signal


def test_different_outcomes_carry_and_infra_failures_do_not_count():
    assert carries_gradient([traj(1.0), traj(0.0)], TRAJ)
    # the member that differs is an infrastructure failure: one valid member, no baseline
    lone = [traj(1.0), traj(0.0, stop=StopReason.SANDBOX_UNAVAILABLE)]
    assert not carries_gradient(lone, TRAJ) and max_abs(lone, TRAJ) == 0
    assert not carries_gradient([traj(0.0, sampled=0), traj(1.0, sampled=0)], TRAJ)  # no token


def test_critic_values_make_every_group_carry_gradient():
    # gae: equal rewards, but A_t = r_t + V_{t+1} - V_t + ... moves with the values, known only
    # after the critic's pass: a group with a sampled token carries gradient
    gae = AdvantageConfig(name="gae", whiten=False)
    group = [traj(1.0), traj(1.0)]
    assert carries_gradient(group, gae)
    values = [torch.full((len(t.token_ids),), 0.5) for t in group]
    assert max_abs(group, gae, values=values) > 0  # e.g. last sampled token: 1 - .5 = .5
    assert not carries_gradient([traj(1.0, stop=StopReason.ABORTED)], gae)


def test_kl_reward_penalty_carries_gradient_in_equal_groups_of_two_or_more():
    # kl_mode=reward: rewards 1, 1 minus summed KL .1 vs .3 -> scores .9, .7: grpo A = +-.7071,
    # full scale from the KL alone (verl does the same)
    group = [traj(1.0, (None,)), traj(1.0, (None,))]
    assert not carries_gradient(group, TRAJ)
    assert carries_gradient(group, TRAJ, reward_penalty=True)
    pens = [torch.tensor([0, 0, 0.05, 0.05, 0]), torch.tensor([0, 0, 0.15, 0.15, 0])]
    a = compute_advantages([group], TRAJ, token_penalties=pens).advantages
    assert a[0][2].item() == pytest.approx(1 / math.sqrt(2), abs=1e-4)
    assert a[1][2].item() == pytest.approx(-1 / math.sqrt(2), abs=1e-4)
    lone = [traj(1.0, (None,)), traj(1.0, (None,), stop=StopReason.ABORTED)]
    assert not carries_gradient(lone, TRAJ, reward_penalty=True)  # one member: A = 0, KL or not


def test_step_whitening_is_not_signal():
    # reinforce_pp_baseline whitens the step: the flat group gets only the step's common shift
    cfg = AdvantageConfig(name="reinforce_pp_baseline")
    flat, live = [traj(1.0), traj(1.0)], [traj(1.0, sampled=3), traj(0.0, sampled=1)]
    assert not carries_gradient(flat, cfg) and carries_gradient(live, cfg)
    out = compute_advantages([flat, live], cfg)
    assert out.metrics["adv/zero_std_groups"] == 0.5


def test_reward_metrics_count_turn_rewards_and_mean_all():
    group = [traj(1.0, (0.3, None)), traj(0.0, (0.0, 0.5))]
    m = rollout_metrics(group)
    assert m["reward/mean"] == 0.5  # the outcome only, as before
    assert m["reward/turn_sum"] == pytest.approx(0.4)  # (.3 + .5) / 2
    assert m["reward/return_mean"] == pytest.approx(0.9)
    assert "reward/turn_sum" not in rollout_metrics([traj(1.0)])  # an env without them
    m = sampled_reward_metrics([group, [traj(1.0), traj(1.0, stop=StopReason.ABORTED)]])
    assert m["reward/mean_all"] == 2 / 3 and m["reward/min_all"] == 0.0
    assert all(math.isnan(v) for v in sampled_reward_metrics([]).values())


def test_a_mixtures_envs_get_their_reward_over_every_group_sampled_too():
    """env/<name>/reward_mean covers the kept groups (as reward/mean); under dynamic sampling
    env/<name>/reward_mean_all covers every group sampled, the dropped ones too (an audit)."""

    def of(env: str, *rewards: float) -> list[Trajectory]:
        group = [traj(r) for r in rewards]
        for t in group:
            t.metadata["env"] = env
        return group

    seen = [of("code", 1.0, 0.0), of("code", 0.0, 0.0), of("units", 1.0, 1.0)]
    m = sampled_reward_metrics(seen)
    assert m["env/code/reward_mean_all"] == 0.25 and m["env/units/reward_mean_all"] == 1.0
    assert m["reward/mean_all"] == 0.5
    assert not any(k.startswith("env/") for k in sampled_reward_metrics([[traj(1.0)]]))
