"""The trainer is loud where a run would otherwise look healthy and learn nothing: crashing envs
stop the run with a traceback, a run with no reward variance says so, an engine that still serves
old weights after a push is named, the KL reward penalty reaches the advantages, and PPO's critic
is checkpointed and resumed with the policy (steps with nothing to train on, skipped and counted
until too many stop the run: tests/e2e/test_empty_steps.py). Real stack: dev server, sandbox,
FSDP2 on Ray."""

import asyncio
from pathlib import Path

import pytest

from agentrl.config import compose
from agentrl.envs.code_exec import CodeExecEnv
from agentrl.learner.sync import Transport
from agentrl.train import TrainingError, train

pytestmark = pytest.mark.usefixtures("shared_ray")  # one Ray for the module's runs (conftest)

SMALL = ["trainer.tasks_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=48",
         "rollout.max_turns=2", "ray.num_cpus=2", "logging=local"]  # fmt: skip


def cfg_for(tmp: Path, *extra: str, env: str | None = None):
    target = [f"env._target_={__name__}.{env}"] if env else []
    return compose([*SMALL, f"checkpoint.dir={tmp}/ckpt", *target, *extra])


class CrashingEnv(CodeExecEnv):
    """An env bug: every step raises."""

    async def step(self, turn):
        raise RuntimeError("boom in CrashingEnv.step")


class ConstantRewardEnv(CodeExecEnv):
    """Every episode scores 1: no group has reward variance, every advantage is 0."""

    async def reward(self, trajectory):
        return 1.0


def test_crashing_env_stops_the_run_with_its_traceback(tmp_path):
    cfg = cfg_for(tmp_path, "trainer.steps=3", env="CrashingEnv")
    with pytest.raises(TrainingError) as err:
        asyncio.run(train(cfg, tmp_path / "out"))
    msg = str(err.value)
    assert "crashed" in msg and "trainer.guards.max_aborted_frac=0.2" in msg
    assert "boom in CrashingEnv.step" in msg  # one episode's error, shown whole


class NoPushSync(Transport):
    """A user's transport with a bug: its push never reaches the engine."""

    async def push(self, version: str) -> dict[str, float]:
        return {}


def test_no_reward_variance_and_an_engine_left_on_old_weights_are_loud(tmp_path, capsys):
    """Two guards, one run: every reward equal (no group carries gradient), and pushes that never
    reach the engine."""
    method = f"weight_sync.method={__name__}:NoPushSync"
    cfg = cfg_for(tmp_path, "trainer.steps=2", "trainer.guards.no_signal_steps=2", method,
                  env="ConstantRewardEnv")  # fmt: skip
    history = asyncio.run(train(cfg, tmp_path / "out"))
    assert [h["train/no_signal_steps_in_a_row"] for h in history] == [1.0, 2.0]
    assert all(h["adv/std"] == 0.0 for h in history)
    assert history[0]["rollout/off_version_turns"] == 0  # step 1: nothing pushed yet
    assert history[1]["rollout/off_version_turns"] >= 8  # every turn of step 2 sampled v0
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "no learning signal for 2 steps" in out and "tool_call_rate" in out
    assert "not the trainer's '1'" in out and "weight push did not reach an engine" in out


class StampOnlySync(Transport):
    """A push that stamps the version but moves no weights (as a colocated LoRA engine whose base
    weights came back as garbage did): the versions agree, the models do not."""

    async def push(self, version: str) -> dict[str, float]:
        await self.engine.control.update_weight_version(version)
        return {}


def test_an_engine_serving_another_model_under_the_right_version_is_loud(tmp_path, capsys):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    # the learner trains a perturbed copy of the model the engine serves
    served = compose(SMALL).model.resolve()
    other = tmp_path / "other-model"
    shutil.copytree(served, other)
    torch.manual_seed(0)
    weights = load_file(str(other / "model.safetensors"))
    save_file({k: v + 0.1 * torch.randn_like(v) for k, v in weights.items()},
              str(other / "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
    method = f"weight_sync.method={__name__}:StampOnlySync"
    cfg = cfg_for(tmp_path, "trainer.steps=2", method, f"learner.model_path={other}")
    history = asyncio.run(train(cfg, tmp_path / "out"))
    assert [h["rollout/off_version_turns"] for h in history] == [0, 0]  # the stamps agree
    gaps = [h["train/logprob_diff"] for h in history]
    assert all(g > cfg.trainer.guards.warn_logprob_gap for g in gaps), gaps
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert out.count("engine does not serve the trained model") == 2  # every such step
    assert "step 1: the engine's logprobs of its own samples are" in out


def test_ppo_critic_with_kl_reward_penalty_checkpoints_and_resumes(tmp_path):
    kl = [
        "algo=ppo",
        "algo.loss.kl_mode=reward",
        "algo.loss.kl_coef=0.5",
        "checkpoint.every=1",
        "trainer.deterministic=true",
    ]  # the value-loss ratio below depends on the draws
    first = asyncio.run(train(cfg_for(tmp_path, "trainer.steps=2", *kl), tmp_path / "out1"))
    # step 1: the policy is the reference, so the penalty is exactly 0; then it is not
    assert first[0]["train/kl_reward_penalty"] == 0.0
    assert first[1]["train/kl_reward_penalty"] > 0.0
    for h in first:  # the critic trains beside the policy, on its own optimizer
        assert h["critic/vf_loss"] > 0 and h["critic/grad_norm"] > 0 and h["train/skipped"] == 0
        assert h["train/optimizer_steps"] == 2.0  # algo=ppo: 1 epoch x 2 mini-batches
    step2 = tmp_path / "ckpt" / "step_00000002"
    assert (step2 / "critic" / "model" / "config.json").exists()
    assert (step2 / "critic" / "optim").exists()
    again = asyncio.run(train(cfg_for(tmp_path, "trainer.steps=3", *kl), tmp_path / "out2"))
    assert [h["step"] for h in again] == [3.0]
    # resumed critic: its value loss continues from the trained one, not from a fresh head
    assert again[0]["critic/vf_loss"] < 10 * first[0]["critic/vf_loss"]
