"""reward/turn_sum and reward/return_mean (and eval/reward_turn_sum) over episodes of several
sequences (rollout.thinking=template, a rollout.context rewrite, an agent's fork): every
sequence's turns are the episode's, each sampled once, so their rewards all count."""

from __future__ import annotations

import pytest
from test_advantage import traj

from agentrl.evaluate import eval_metrics
from agentrl.metrics import rollout_metrics
from agentrl.types import Trajectory


def of(session: str, t: Trajectory) -> Trajectory:
    t.metadata["session"] = session
    return t


def test_turn_rewards_of_every_sequence_of_an_episode_count():
    # episode A: two sequences (turn rewards .5 and .25 | .25), outcome 1; episode B: one
    # sequence, turn reward 0, outcome 0. Turn sums per episode: A 1.0, B 0 -> mean .5;
    # returns: A 2.0, B 0 -> mean 1.0 (A's first sequence alone would read .375 and .875)
    a0 = of("A", traj(1.0, turns=[(2, 1), (1, 0)], turn_rewards=[0.5, 0.25]))
    a1 = of("A", traj(1.0, turn_rewards=[0.25]))
    b = of("B", traj(0.0, turn_rewards=[0.0]))
    m = rollout_metrics([a0, a1, b])
    assert m["reward/mean"] == 0.5
    assert m["reward/turn_sum"] == pytest.approx(0.5)
    assert m["reward/return_mean"] == pytest.approx(1.0)
    assert eval_metrics([a0, a1, b])["eval/reward_turn_sum"] == pytest.approx(0.5)


def test_turn_rewards_only_on_a_later_sequence_are_seen():
    # the first sequence has no per-turn reward, the second has: the metric is there
    a0 = of("A", traj(1.0))
    a1 = of("A", traj(1.0, turn_rewards=[0.4]))
    m = rollout_metrics([a0, a1])
    assert m["reward/turn_sum"] == pytest.approx(0.4)
    assert m["reward/return_mean"] == pytest.approx(1.4)
