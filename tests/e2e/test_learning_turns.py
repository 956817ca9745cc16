"""Per-turn credit learns: the shipped tiny model on code_exec with a per-turn reward (a tool call
that prints the answer earns 0.3 on its turn, the exact answer 1.0 at the end), trained with
`algo.advantage.reward_level=turn`. Turn k's tokens are compared with turn k of the other samples
of the same task; the advantages stay bounded (the old episode-baseline bug gave -500000)."""

import asyncio
from statistics import fmean

import pytest

from agentrl.config import compose
from agentrl.train import train

pytestmark = pytest.mark.usefixtures("shared_ray")  # one Ray for the module's runs (conftest)

STEPS = 12


def test_tiny_model_learns_with_per_turn_rewards(tmp_path):
    cfg = compose([
        "env=code_exec_turns", "algo.advantage.reward_level=turn", f"trainer.steps={STEPS}",
        f"trainer.every={STEPS}", f"trainer.dir={tmp_path}/ckpt", "logging=local",
    ])  # fmt: skip
    history = asyncio.run(train(cfg, tmp_path / "out"))
    rewards = [round(h["reward/mean"], 3) for h in history]
    print("reward per step:", rewards)
    assert fmean(rewards[-3:]) >= fmean(rewards[:2]) + 0.2, f"reward did not rise: {rewards}"
    assert all(-10 < h["adv/min"] <= h["adv/max"] < 10 for h in history)
    assert all(h["rollout/turns"] > 1.0 for h in history[1:])  # tool turns, then answers
