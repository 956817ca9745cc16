"""algo.advantage.reward_level=turn with episodes of several sequences (an AgentEnv's agent that
rewrote its history, or sampled n > 1, through the gateway): each episode counts once in the
per-turn baseline, as it does at reward_level=trajectory. Numbers computed by hand."""

from __future__ import annotations

import pytest
from test_advantage import sampled, traj

from agentrl.advantage import AdvantageConfig, carries_gradient, compute_advantages
from agentrl.types import Trajectory


def of(session: str, t: Trajectory) -> Trajectory:
    t.metadata["session"] = session  # the sequences of one episode share it
    return t


def first_advantages(group: list[Trajectory], cfg: AdvantageConfig) -> list[float]:
    out = compute_advantages([group], cfg)
    return [sampled(a, t)[0] for a, t in zip(out.advantages, group, strict=True)]


def test_a_forked_episode_counts_once_in_the_turn_baseline():
    # episodes A (forked: two sequences of one turn each, reward 1), B and C (reward 0)
    # episodes' G_0: 1, 0, 0 -> mean 1/3; A gets 2/3, B and C -1/3 (what trajectory level gives);
    # counting A's sequences apart would give the baseline (1 + 1 + 0 + 0) / 4 = 1/2
    group = [of("A", traj(1.0)), of("A", traj(1.0)), of("B", traj(0.0)), of("C", traj(0.0))]
    want = [2 / 3, 2 / 3, -1 / 3, -1 / 3]
    for level in ("trajectory", "turn"):
        cfg = AdvantageConfig(name="drgrpo", reward_level=level)
        assert first_advantages(group, cfg) == pytest.approx(want, abs=1e-6)


def test_rloo_leaves_the_whole_episode_out_of_its_own_turn_baseline():
    # rloo: A's baseline is the mean of B and C, 0 -> A gets 1; B's is mean(A=1, C=0) = 1/2 -> -1/2
    # (A's second sequence must not be B's or A's own comparison)
    group = [of("A", traj(1.0)), of("A", traj(1.0)), of("B", traj(0.0)), of("C", traj(0.0))]
    cfg = AdvantageConfig(name="rloo", reward_level="turn")
    assert first_advantages(group, cfg) == pytest.approx([1.0, 1.0, -0.5, -0.5], abs=1e-6)


def test_one_episode_of_several_sequences_has_nothing_to_compare_with():
    # one episode, two sequences with different turn rewards: one member, no baseline -> 0
    group = [of("A", traj(1.0, turn_rewards=[0.5])), of("A", traj(1.0, turn_rewards=[0.0]))]
    cfg = AdvantageConfig(name="grpo", reward_level="turn")
    assert first_advantages(group, cfg) == [0.0, 0.0]
    assert not carries_gradient(group, cfg)


def test_grpo_turn_baseline_scales_by_the_episodes_std():
    # episodes' G_0: A 1 (two sequences), B 0, C 0, D 1 -> mean .5, sample std sqrt(1/3)
    group = [of("A", traj(1.0)), of("A", traj(1.0)), of("B", traj(0.0)), of("C", traj(0.0)),
             of("D", traj(1.0))]  # fmt: skip
    s = (1 / 3) ** 0.5
    want = [0.5 / s, 0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s]
    cfg = AdvantageConfig(name="grpo", reward_level="turn")
    assert first_advantages(group, cfg) == pytest.approx(want, abs=1e-5)


def test_a_forked_episodes_reward_penalty_is_all_its_sequences():
    """kl_mode=reward at trajectory level: episode A (two sequences, KL penalties 0.1 and 0.2 on
    their two sampled tokens) and B (one, 0.1), both rewarded 1. A's score is 1 - 0.3, B's
    1 - 0.1: drgrpo's baseline 0.8, A -0.1 on every token of both sequences, B +0.1. Before, A
    was scored by its first sequence alone (0.9): both 0, the second sequence's KL unseen."""
    import torch

    group = [of("A", traj(1.0)), of("A", traj(1.0)), of("B", traj(1.0))]
    pen = [torch.tensor([0, 0, 0.05, 0.05]), torch.tensor([0, 0, 0.1, 0.1]),
           torch.tensor([0, 0, 0.05, 0.05])]  # fmt: skip
    out = compute_advantages([group], AdvantageConfig(name="drgrpo"), token_penalties=pen)
    got = [sampled(a, t) for a, t in zip(out.advantages, group, strict=True)]
    assert got == [pytest.approx([-0.1, -0.1]), pytest.approx([-0.1, -0.1]),
                   pytest.approx([0.1, 0.1])]  # fmt: skip


def test_gae_charges_each_sequence_its_episodes_other_penalties():
    """gae (gamma = lam = 1, values 0, not whitened: A_t = the rewards from t on), kl_mode=reward:
    episode A of two sequences (penalties .05, .05 and .1, .1; reward 1), B of one (.05, .05).
    Each sequence's last token gets the outcome less its episode's other sequences' penalties:
    A's first sequence 1 - .2, its second 1 - .1, so from each one's first token the return is
    A's score 1 - .3 (what drgrpo reads above): [.7, .75] and [.7, .8]; B [.9, .95]. Before, A's
    first sequence got [.9, .95], the KL of the sequence its episode went on in unseen."""
    import torch

    group = [of("A", traj(1.0)), of("A", traj(1.0)), of("B", traj(1.0))]
    pen = [torch.tensor([0, 0, 0.05, 0.05]), torch.tensor([0, 0, 0.1, 0.1]),
           torch.tensor([0, 0, 0.05, 0.05])]  # fmt: skip
    cfg = AdvantageConfig(name="gae", gamma=1.0, lam=1.0, whiten=False)
    out = compute_advantages([group], cfg, [torch.zeros(4)] * 3, pen)
    got = [sampled(a, t) for a, t in zip(out.advantages, group, strict=True)]
    assert got == [pytest.approx([0.7, 0.75]), pytest.approx([0.7, 0.8]),
                   pytest.approx([0.9, 0.95])]  # fmt: skip
    # the critic's targets are the same returns (values 0)
    assert [sampled(r, t) for r, t in zip(out.returns, group, strict=True)] == got


def test_one_episode_of_two_sequences_carries_no_kl_signal_alone():
    """kl_mode=reward: a group whose only valid episode (the other lost its sandbox) left two
    sequences has one member, no baseline, advantage 0 whatever its KL: dynamic sampling must
    drop it. Its sequences were counted as two members, and it was kept as carrying gradient."""
    from agentrl.types import StopReason

    lost = traj(0.0, stop=StopReason.SANDBOX_UNAVAILABLE)
    group = [of("A", traj(1.0)), of("A", traj(1.0)), of("B", lost)]
    cfg = AdvantageConfig(name="grpo")
    assert not carries_gradient(group, cfg, reward_penalty=True)
    assert carries_gradient([*group, of("C", traj(1.0))], cfg, reward_penalty=True)
