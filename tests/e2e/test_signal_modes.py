"""Dynamic sampling keeps every group whose advantages are non-zero, per-turn rewards included
(`advantage.carries_gradient`), and the no-signal warning stays quiet when they carry the signal.
Real stack on CPU: the tiny model, the dev server, FSDP2 on Ray."""

import asyncio
import json
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from agentrl.advantage import SIGNAL_ATOL, AdvantageConfig, compute_advantages
from agentrl.config import compose
from agentrl.envs.code_exec import CodeExecEnv
from agentrl.guards import Guards
from agentrl.train import train
from agentrl.types import Trajectory

pytestmark = pytest.mark.usefixtures("shared_ray")  # one Ray for the module's runs (conftest)

SMALL = ["trainer.tasks_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=48",
         "rollout.max_turns=2", "ray.num_cpus=2", "logging=local"]  # fmt: skip


class TurnRewardsOnlyEnv(CodeExecEnv):
    """Every episode's outcome is 1 (no group has outcome variance); every other episode of a
    task earns 0.5 on each turn the env steps: the per-turn rewards carry all the signal."""

    started: ClassVar[dict[str, int]] = {}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        n = TurnRewardsOnlyEnv.started.get(self.task.id, 0)
        TurnRewardsOnlyEnv.started[self.task.id] = n + 1
        self.pays = n % 2 == 0

    async def step(self, turn):
        result = await super().step(turn)
        result.reward = 0.5 if self.pays else 0.0
        return result

    async def reward(self, trajectory):
        return 1.0


def key(t: Trajectory) -> tuple:
    return t.task_id, t.sample_index, tuple(t.token_ids)


def test_turn_rewards_with_dynamic_sampling_keep_every_group_with_gradient(
    tmp_path: Path, monkeypatch, capsys
):
    judged: dict[tuple, list[Trajectory]] = {}  # every group dynamic sampling looked at
    carries = Guards.carries

    def recording(self, group):
        judged[tuple(key(t) for t in group)] = group
        return carries(self, group)

    monkeypatch.setattr(Guards, "carries", recording)
    cfg = compose([*SMALL, f"checkpoint.dir={tmp_path}/ckpt", "trainer.steps=2",
                   "checkpoint.every=2", f"env._target_={__name__}.TurnRewardsOnlyEnv",
                   "trainer.guards.no_signal_steps=1", "algo.advantage.reward_level=turn",
                   "trainer.sampling.dynamic_sampling=true"])  # fmt: skip
    history = asyncio.run(train(cfg, tmp_path / "out"))
    rows = (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()
    trained = {key(Trajectory.from_dict(json.loads(r))) for r in rows}

    turn = AdvantageConfig(name="grpo", reward_level="turn")
    live = 0
    for group in judged.values():
        adv = torch.cat(compute_advantages([group], turn).advantages)  # the estimator, by itself
        assert {t.reward for t in group} == {1.0}  # outcome rewards alone: no group has signal
        if adv.abs().max() > SIGNAL_ATOL:  # non-zero advantages: it must have been trained
            live += 1
            assert all(key(t) in trained for t in group)
    assert live >= 2  # the groups the outcome-reward filter used to drop
    for h in history:
        assert h["rollout/filtered_groups"] + h["rollout/trajectories"] / 4 >= 2
        assert h["train/no_signal_steps_in_a_row"] == 0.0
        assert h["adv/zero_std_groups"] == 0.0 and h["adv/max"] > 0
        assert h["reward/mean_all"] == 1.0 and h["reward/return_mean"] > 1.0
    assert "no learning signal" not in capsys.readouterr().out
