"""Per-turn credit on the whole stack: code_exec with a per-turn reward (the first tool call whose
whole output is the answer earns 0.3 on its turn, the exact answer 1.0 at the end), trained with
`algo.advantage.reward_level=turn`. Turn k's tokens are compared with turn k of the other samples
of the same task; the advantages stay bounded (the old episode-baseline bug gave -500000).

It learned here by the evaluation rule (+0.53, +0.63, +0.63 over seeds 0-2 in 12 steps, 35 s,
under the old per-turn rule: the answer among the printed words, every turn; under today's rule
seed 0 gave +0.67, 0.125 -> 0.797, 2026-11-28, `AGENTRL_LEARN_ALL=1`; with only a turn's
last call paid, one guess a turn: +0.58, 0.156 -> 0.734, the same day); CI
keeps one learning run per algorithm family (per-turn credit is GRPO's), so this runs 3 steps of
4 groups of 4 and checks the mechanics; tests/unit/test_advantage.py checks the per-turn baselines
by hand.
`AGENTRL_LEARN_ALL=1` runs the learning version."""

import asyncio
import os

import pytest
from learning_rule import assert_learned, eval_overrides

from agentrl.config import compose
from agentrl.train import train

pytestmark = pytest.mark.usefixtures("shared_ray")  # one Ray for the module's runs (conftest)

LEARN = bool(os.environ.get("AGENTRL_LEARN_ALL"))
STEPS = 12 if LEARN else 3  # learning: the evaluation rose by 0.53, 0.63, 0.63 over seeds 0-2
MECHANICS = [f"trainer.steps={STEPS}", "trainer.tasks_per_step=4", "rollout.group_size=4",
             "logging=local", "trainer.deterministic=true"]  # fmt: skip


def test_tiny_model_learns_with_per_turn_rewards(tmp_path):
    learn = eval_overrides(STEPS) if LEARN else MECHANICS
    cfg = compose(["env=code_exec_turns", "algo.advantage.reward_level=turn", *learn,
                   f"checkpoint.dir={tmp_path}/ckpt"])  # fmt: skip
    history = asyncio.run(train(cfg, tmp_path / "out"))
    print("reward per step:", [round(h["reward/mean"], 3) for h in history])
    if LEARN:
        assert_learned(tmp_path / "out", STEPS, 0.2, "per-turn credit")
    assert any(h["adv/max"] > 0 for h in history)  # turns got credit
    assert all(-10 < h["adv/min"] <= h["adv/max"] < 10 for h in history)
    assert all(h["rollout/turns"] > 1.0 for h in history[1:])  # tool turns, then answers
