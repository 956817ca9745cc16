"""rollout/truncated, rollout/truncated_masked and rollout/truncated_penalised count episodes, as
documented: an episode a rollout.context rewrite (or rollout.thinking=template) made several
sequences, which then overflowed, is one truncated episode, not one per sequence."""

from __future__ import annotations

from test_advantage import traj

from agentrl.advantage import Truncation
from agentrl.metrics import rollout_metrics
from agentrl.types import StopReason, Trajectory


def of(session: str, t: Trajectory) -> Trajectory:
    t.metadata["session"] = session
    return t


def test_an_episode_of_three_sequences_that_overflowed_is_one_truncated_episode():
    over = StopReason.CONTEXT_OVERFLOW  # every sequence carries the episode's stop reason
    group = [of("A", traj(0.0, stop=over)), of("A", traj(0.0, stop=over)),
             of("A", traj(0.0, stop=over)), of("B", traj(1.0)), of("C", traj(0.0, stop=over))]  # fmt: skip
    for mode, key in (("mask", "rollout/truncated_masked"),
                      ("penalise", "rollout/truncated_penalised")):  # fmt: skip
        m = rollout_metrics(group, Truncation(mode))
        assert m["rollout/truncated"] == 2.0  # episodes A and C
        assert m[key] == 2.0
    assert rollout_metrics(group)["stop/context_overflow"] == 4.0  # trajectories, as documented
