"""Advantage estimators against numbers computed by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.advantage import (
    AdvantageConfig,
    compute_advantages,
    discounted_returns,
    gae,
    get_estimator,
    group_stats,
    known_estimators,
)
from agentrl.types import FinishReason, Message, StopReason, Trajectory, Turn


def traj(
    reward: float,
    turns: list[tuple[int, int]] = ((2, 0),),  # (sampled, observation) tokens per turn
    prompt: int = 2,
    stop: StopReason = StopReason.COMPLETED,
    turn_rewards: list[float | None] | None = None,
) -> Trajectory:
    pos, ts, mask = prompt, [], [0] * prompt
    for k, (a, o) in enumerate(turns):
        ts.append(
            Turn(
                start=pos,
                end=pos + a,
                obs_end=pos + a + o,
                weight_version="0",
                finish_reason=FinishReason.STOP,
                assistant=Message(role="assistant"),
                reward=None if turn_rewards is None else turn_rewards[k],
            )
        )
        mask += [1] * a + [0] * o
        pos += a + o
    return Trajectory(
        task_id="t",
        sample_index=0,
        token_ids=list(range(pos)),
        loss_mask=mask,
        logprobs=[-0.5 * m for m in mask],
        prompt_len=prompt,
        turns=ts,
        messages=[],
        stop_reason=stop,
        reward=reward,
    )


def sampled(adv: torch.Tensor, t: Trajectory) -> list[float]:
    return adv[torch.tensor(t.loss_mask, dtype=torch.bool)].tolist()


def test_grpo_hand_numbers_and_masking():
    # rewards 1,0,0,0: mean .25; deviations .75,-.25,-.25,-.25; sum sq .75; sample var .75/3 = .25
    # std .5 -> A = 1.5, -.5, -.5, -.5 on every sampled token, 0 on prompt/observation tokens
    group = [traj(1.0, turns=[(2, 3), (1, 0)]), traj(0.0), traj(0.0), traj(0.0)]
    out = compute_advantages([group], AdvantageConfig(name="grpo"))
    assert out.advantages[0].tolist() == pytest.approx([0, 0, 1.5, 1.5, 0, 0, 0, 1.5], abs=1e-5)
    for a in out.advantages[1:]:
        assert a.tolist() == pytest.approx([0, 0, -0.5, -0.5], abs=1e-5)
    assert out.returns is None
    assert out.metrics["adv/infra_excluded"] == 0


def test_grpo_without_std_and_drgrpo_are_mean_baselines():
    group = [traj(1.0), traj(0.0), traj(0.0), traj(0.0)]
    for cfg in (AdvantageConfig(name="grpo", norm_std=False), AdvantageConfig(name="drgrpo")):
        out = compute_advantages([group], cfg)
        assert [sampled(a, t)[0] for a, t in zip(out.advantages, group, strict=True)] == (
            pytest.approx([0.75, -0.25, -0.25, -0.25])
        )


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo", "reinforce_pp_baseline"])
def test_all_equal_rewards_give_zero_not_nan(name):
    out = compute_advantages([[traj(1.0), traj(1.0), traj(1.0)]], AdvantageConfig(name=name))
    flat = torch.cat(out.advantages)
    assert not torch.isnan(flat).any()
    assert flat.abs().max() == 0
    assert out.metrics["adv/zero_std_groups"] == 1.0


def test_infra_failure_is_excluded_from_baseline_and_gets_zero():
    # valid rewards 1,0,0: mean 1/3; deviations 2/3,-1/3,-1/3; sum sq 6/9; var (6/9)/2 = 1/3
    # std 1/sqrt(3) = .57735 -> A = (2/3)*sqrt(3) = 1.1547, -(1/3)*sqrt(3) = -.57735
    group = [traj(1.0), traj(0.0), traj(0.0, stop=StopReason.SANDBOX_UNAVAILABLE), traj(0.0)]
    out = compute_advantages([group], AdvantageConfig(name="grpo"))
    first = [sampled(a, t)[0] for a, t in zip(out.advantages, group, strict=True)]
    r3 = 1 / math.sqrt(3)  # (eps=1e-6 in the std moves these by ~2e-6)
    assert first == pytest.approx([2 * r3, -r3, 0.0, -r3], abs=1e-5)
    assert out.advantages[2].abs().max() == 0
    assert out.metrics["adv/infra_excluded"] == 1


def test_single_valid_member_has_no_signal():
    group = [traj(1.0), traj(0.0, stop=StopReason.ABORTED)]
    for name in ("grpo", "rloo", "drgrpo"):
        out = compute_advantages([group], AdvantageConfig(name=name))
        assert torch.cat(out.advantages).abs().max() == 0


def test_rloo_leave_one_out():
    # A_0 = 1 - mean(0,0,0) = 1;  A_i = 0 - mean(1,0,0) = -1/3 for the others
    group = [traj(1.0), traj(0.0), traj(0.0), traj(0.0)]
    out = compute_advantages([group], AdvantageConfig(name="rloo"))
    first = [sampled(a, t)[0] for a, t in zip(out.advantages, group, strict=True)]
    assert first == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])


def test_reinforce_pp_baseline_whitens_over_the_batch():
    # group 0: rewards 1,0 -> .5,-.5 (2 tokens each); group 1: 1,1 -> 0 (1 and 3 tokens)
    # tokens .5,.5,-.5,-.5,0,0,0,0: mean 0, sum sq 1, sample var 1/7 -> A = .5*sqrt(7) = 1.3229
    g0 = [traj(1.0), traj(0.0)]
    g1 = [traj(1.0, turns=[(1, 0)]), traj(1.0, turns=[(3, 0)])]
    out = compute_advantages([g0, g1], AdvantageConfig(name="reinforce_pp_baseline"))
    s = 0.5 * math.sqrt(7)
    assert sampled(out.advantages[0], g0[0]) == pytest.approx([s, s], abs=1e-5)
    assert sampled(out.advantages[1], g0[1]) == pytest.approx([-s, -s], abs=1e-5)
    assert sampled(out.advantages[3], g1[1]) == pytest.approx([0, 0, 0], abs=1e-6)


def test_turn_rewards_discounted_onto_turn_tokens():
    # traj a: turn rewards (0, none) + outcome 1 -> r = (0, 1); gamma .5: G = (.5*1, 1) = (.5, 1)
    # traj b: one turn, outcome 0 -> G = (0).  turn 0 baseline (drgrpo) = mean(.5, 0) = .25
    # a: turn 0 tokens .5-.25 = .25; turn 1: only a reached it -> no baseline, 0;  b: -.25
    a = traj(1.0, turns=[(2, 1), (1, 0)], turn_rewards=[0.0, None])
    b = traj(0.0, turn_rewards=[None])
    cfg = AdvantageConfig(name="drgrpo", reward_level="turn", gamma=0.5)
    out = compute_advantages([[a, b]], cfg)
    assert out.advantages[0].tolist() == pytest.approx([0, 0, 0.25, 0.25, 0, 0])
    assert sampled(out.advantages[1], b) == pytest.approx([-0.25, -0.25])
    # per-turn rewards are ignored at reward_level=trajectory: R = Trajectory.reward only
    a2 = traj(1.0, turns=[(2, 1), (1, 0)], turn_rewards=[5.0, None])
    out = compute_advantages([[a2, b]], AdvantageConfig(name="drgrpo"))
    assert sampled(out.advantages[0], a2) == pytest.approx([0.5, 0.5, 0.5])


def test_per_turn_baselines_over_the_members_that_reached_the_turn():
    # gamma 1.  a: 3 turns, r = (.2, 0, 1) -> G = (1.2, 1, 1);  b: 2 turns, r = (.2, 0) -> G = (.2, 0)
    # c: 1 turn, r = (1) -> G = (1).  d: infra failure (excluded everywhere)
    # turn 0 over a,b,c: G_0 = 1.2, .2, 1 -> mean .8 -> drgrpo .4, -.6, .2
    # turn 1 over a,b:   G_1 = 1, 0       -> mean .5 -> .5, -.5
    # turn 2: only a -> 0
    a = traj(1.0, turns=[(1, 1), (1, 1), (1, 0)], turn_rewards=[0.2, None, None])
    b = traj(0.0, turns=[(1, 1), (1, 0)], turn_rewards=[0.2, None])
    c = traj(1.0, turns=[(1, 0)])
    d = traj(5.0, turns=[(1, 1), (1, 0)], stop=StopReason.ABORTED)
    group = [a, b, c, d]
    out = compute_advantages([group], AdvantageConfig(name="drgrpo", reward_level="turn"))
    got = [sampled(x, t) for x, t in zip(out.advantages, group, strict=True)]
    assert got == [pytest.approx(v) for v in ([0.4, 0.5, 0.0], [-0.6, -0.5], [0.2], [0, 0])]
    # grpo: turn 0 std = sqrt((.16 + .36 + .04) / 2) = .52915; turn 1 std = .70711
    out = compute_advantages([group], AdvantageConfig(name="grpo", reward_level="turn"))
    s0, s1 = math.sqrt(0.28), math.sqrt(0.5)
    assert sampled(out.advantages[0], a) == pytest.approx([0.4 / s0, 0.5 / s1, 0.0], abs=1e-5)
    assert sampled(out.advantages[1], b) == pytest.approx([-0.6 / s0, -0.5 / s1], abs=1e-5)
    # rloo: turn 0: a 1.2 - mean(.2, 1) = .6, b .2 - 1.1 = -.9, c 1 - .7 = .3; turn 1: ±1
    out = compute_advantages([group], AdvantageConfig(name="rloo", reward_level="turn"))
    got = [sampled(x, t) for x, t in zip(out.advantages[:3], group[:3], strict=True)]
    assert got == [pytest.approx(v) for v in ([0.6, 1.0, 0.0], [-0.9, -1.0], [0.3])]


def test_identical_trajectories_with_turn_rewards_get_exactly_zero():
    # the old bug: turn 1 compared with the episode baseline b_0 = 1.5 and divided by eps:
    # (1 - 1.5) / 1e-6 = -500000 on every later turn
    group = [traj(1.0, turns=[(1, 1), (1, 0)], turn_rewards=[0.5, None]) for _ in range(4)]
    for name in ("grpo", "drgrpo", "rloo"):
        out = compute_advantages([group], AdvantageConfig(name=name, reward_level="turn"))
        assert torch.cat(out.advantages).abs().max() == 0, name


def test_discounted_returns_and_turn_mode_reduces_to_trajectory_mode():
    assert discounted_returns(torch.tensor([1.0, 0.0, 2.0]), 0.5).tolist() == [1.5, 1.0, 2.0]
    group = [traj(1.0, turns=[(2, 1), (2, 0)]), traj(0.0, turns=[(1, 1), (1, 0)])]
    by_turn = compute_advantages([group], AdvantageConfig(reward_level="turn"))
    by_traj = compute_advantages([group], AdvantageConfig(reward_level="trajectory"))
    for x, y in zip(by_turn.advantages, by_traj.advantages, strict=True):
        assert torch.equal(x, y)


def test_sample_with_no_trainable_tokens():
    # a trajectory with no turns still counts in the baseline: mean(1, 0, .5) = .5
    group = [traj(1.0), traj(0.0), traj(0.5, turns=[])]
    out = compute_advantages([group], AdvantageConfig(name="drgrpo"))
    assert sampled(out.advantages[0], group[0]) == pytest.approx([0.5, 0.5])
    assert sampled(out.advantages[1], group[1]) == pytest.approx([-0.5, -0.5])
    assert out.advantages[2].tolist() == [0.0, 0.0]


def test_kl_reward_penalty_enters_the_score():
    # a: R = 1 - (.1 + .3) = .6; b: R = 0;  drgrpo mean .3 -> A = .3, -.3
    a, b = traj(1.0), traj(0.0)
    pens = [torch.tensor([0.0, 0.0, 0.1, 0.3]), torch.zeros(4)]
    out = compute_advantages([[a, b]], AdvantageConfig(name="drgrpo"), token_penalties=pens)
    assert sampled(out.advantages[0], a) == pytest.approx([0.3, 0.3])
    assert sampled(out.advantages[1], b) == pytest.approx([-0.3, -0.3])


def test_gae_hand_numbers():
    # prompt 1, turn 1: 2 sampled + 1 obs, turn 2: 1 sampled. V on sampled = .5, .25, .5; R = 1
    # gamma 1, lam .5, rewards on sampled tokens (0, 0, 1):
    #   t2: delta = 1 - .5 = .5,            A = .5
    #   t1: delta = 0 + .5 - .25 = .25,     A = .25 + .5*.5 = .5
    #   t0: delta = 0 + .25 - .5 = -.25,    A = -.25 + .5*.5 = 0
    # returns = A + V = .5, .75, 1
    t = traj(1.0, turns=[(2, 1), (1, 0)], prompt=1)
    values = [torch.tensor([9.0, 0.5, 0.25, 9.0, 0.5])]  # 9: off the mask, ignored
    cfg = AdvantageConfig(name="gae", lam=0.5, whiten=False)
    out = compute_advantages([[t]], cfg, values=values)
    assert out.advantages[0].tolist() == pytest.approx([0, 0.0, 0.5, 0, 0.5])
    assert out.returns[0].tolist() == pytest.approx([0, 0.5, 0.75, 0, 1.0])
    # with a turn reward .2 on turn 1 (turn level): rewards (0, .2, 1)
    #   t1: delta = .2 + .5 - .25 = .45, A = .45 + .25 = .7;  t0: A = -.25 + .5*.7 = .1
    t2 = traj(1.0, turns=[(2, 1), (1, 0)], prompt=1, turn_rewards=[0.2, None])
    cfg = AdvantageConfig(name="gae", lam=0.5, whiten=False, reward_level="turn")
    out = compute_advantages([[t2]], cfg, values=values)
    assert out.advantages[0].tolist() == pytest.approx([0, 0.1, 0.7, 0, 0.5])
    a, r = gae(torch.tensor([0.0, 1.0]), torch.tensor([0.0, 0.0]), 0.5, 1.0)
    assert a.tolist() == [0.5, 1.0] and r.tolist() == [0.5, 1.0]


def test_gae_whitens_by_default_and_needs_values():
    t = traj(1.0, turns=[(3, 0)])
    out = compute_advantages([[t]], AdvantageConfig(name="gae"), values=[torch.zeros(5)])
    s = torch.tensor(sampled(out.advantages[0], t))
    assert s.mean().abs() < 1e-6
    with pytest.raises(ValueError, match="gae needs critic values"):
        compute_advantages([[t]], AdvantageConfig(name="gae"))


def test_group_stats_primitives():
    scores = torch.tensor([3.0, 1.0, 100.0])
    valid = torch.tensor([True, True, False])
    b, s = group_stats(scores, valid, "mean_std", eps=0.0)
    assert b.tolist() == [2.0, 2.0, 2.0] and s[0].item() == pytest.approx(math.sqrt(2))
    b, _ = group_stats(scores, valid, "loo", eps=0.0)
    assert b[:2].tolist() == [1.0, 3.0]


def test_unknown_name_is_one_line_listing_known():
    with pytest.raises(ValueError) as e:
        get_estimator("ppo")
    msg = str(e.value)
    assert "\n" not in msg and "'ppo'" in msg
    for name in known_estimators():
        assert name in msg
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        AdvantageConfig(name="ppo")
    with pytest.raises(ValueError):
        AdvantageConfig(nmae="grpo")
