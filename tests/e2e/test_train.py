"""`python -m agentrl.train` end to end on CPU: the tiny tool-caller, the dev server, FSDP2 on Ray
(gloo), distributed weight sync, checkpoints; resume after SIGKILL; and the failure paths."""

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from readme_kit import readme_add_env
from train_kit import overrides
from transformers import AutoModelForCausalLM

from agentrl.config import compose
from agentrl.envs.code_exec import CodeExecEnv
from agentrl.learner.ray_start import stop_ray
from agentrl.train import TrainingError, train
from agentrl.types import ConfigError

pytestmark = pytest.mark.usefixtures("shared_ray")  # one Ray for the module's runs (conftest)


class ThreadsSeenEnv(CodeExecEnv):
    """Records the torch CPU threads of the trainer process its rewards run in."""

    seen: list[int] = []

    async def reward(self, trajectory):
        ThreadsSeenEnv.seen.append(torch.get_num_threads())
        return await super().reward(trajectory)


def test_train_runs_evaluates_checkpoints_and_syncs(tmp_path, capsys):
    """Three steps, each sampled by the weights the step before pushed, a checkpoint each; the
    trainer's torch threads while it runs. trainer.eval.every: the untrained policy first (a
    step-0 row), then after every N steps and the last; the eval episodes are not trained on
    (trajectories.jsonl has the training groups only), and the eval set comes from
    env.eval_tasks when given. Resumed for one more step with another lr: no second step-0
    evaluation, one after the new last step, and the new lr from that step on."""
    args = ["checkpoint.every=1", "trainer.sampling.oversample_groups=1",
            f"env._target_={__name__}.ThreadsSeenEnv", "trainer.eval.every=2",
            "trainer.eval.size=3", "trainer.eval.samples=2", "+env.eval_tasks.seed=7",
            "+env.eval_tasks.n=20"]  # fmt: skip
    cfg = compose(overrides(tmp_path, "trainer.steps=3", *args))
    base = AutoModelForCausalLM.from_pretrained(cfg.model.resolve())  # the weights we start from
    torch.set_num_threads(2)
    history = asyncio.run(train(cfg, tmp_path / "out"))
    # trainer.driver_threads=1 while it runs (spinning threads starved the servers), then restored
    assert set(ThreadsSeenEnv.seen) == {1} and torch.get_num_threads() == 2
    assert [h["step"] for h in history] == [1.0, 2.0, 3.0]
    for h in history:
        assert h["train/skipped"] == 0 and h["sync/seconds"] > 0 and h["timing_s/update"] > 0
        # 3 groups launched, the first 2 to finish kept (2 x 4 samples), the third aborted
        assert h["rollout/trajectories"] == 8 and h["rollout/oversampled_dropped"] == 1
        assert h["rollout/off_version_turns"] == 0  # every turn from the weights just pushed
    rows = [
        json.loads(x) for x in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 3 * 8  # 2 tasks x 4 samples per step, nothing of the evaluations
    # step 1 sampled the initial weights, step 2 the weights pushed after step 1, and so on
    for step in (1, 2, 3):
        assert {t["weight_version"] for r in rows if r["step"] == step for t in r["turns"]} == {
            str(step - 1)
        }
    latest = (tmp_path / "ckpt" / "latest").read_text().strip()
    assert latest == "step_00000003"
    model_dir = tmp_path / "ckpt" / latest / "policy" / "model"
    trained = AutoModelForCausalLM.from_pretrained(model_dir)
    moved = [n for n, p in trained.named_parameters()
             if not torch.equal(p, dict(base.named_parameters())[n])]  # fmt: skip
    assert moved or all(h["train/grad_norm"] == 0 for h in history), "training changed no parameter"
    assert history[-1]["train/lr"] == pytest.approx(1e-3)  # the tiny model's (constant) lr
    metrics = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    evals = {int(r["step"]): r for r in metrics if "eval/reward_mean" in r}
    assert sorted(evals) == [0, 2, 3]  # before step 1, every 2 steps, after the last
    for r in evals.values():
        assert r["eval/episodes"] == 6 and r["eval/failed"] == 0
        assert 0 <= r["eval/reward_mean"] <= 1.5 and "eval/reward_correct" in r
    assert "eval/reward_mean" not in history[0] and "eval/reward_mean" in history[1]
    # resumed with another lr: it applies from the next step and the run says so (the
    # optimizer state from the checkpoint used to keep the old one, silently)
    more = compose(overrides(tmp_path, "trainer.steps=4", "learner.lr=5e-3", *args))
    again = asyncio.run(train(more, tmp_path / "out"))
    assert again[-1]["step"] == 4.0 and again[-1]["train/lr"] == pytest.approx(5e-3)
    assert "learner.lr 0.001 → 0.005 from step 4" in capsys.readouterr().out
    metrics = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [int(r["step"]) for r in metrics if "eval/reward_mean" in r] == [0, 2, 3, 4]
    with pytest.raises(ConfigError, match=r"env.eval_tasks.bogus: unknown option"):
        bad = compose(overrides(tmp_path / "b", "trainer.eval.every=1", "+env.eval_tasks.bogus=1"))
        asyncio.run(train(bad, tmp_path / "bad"))


class NaNRewardEnv(CodeExecEnv):
    """A reward bug: NaN. Scored as reward_error (0, kept visible), and since every episode has
    it, the run stops at once with one of them instead of training on a poisoned batch."""

    async def reward(self, trajectory):
        return float("nan")


def test_nan_reward_stops_the_run_before_any_update(tmp_path):
    cfg = compose(overrides(tmp_path, "trainer.steps=6", f"env._target_={__name__}.NaNRewardEnv"))
    with pytest.raises(TrainingError, match=r"stop reasons \['reward_error'\]") as err:
        asyncio.run(train(cfg, tmp_path / "out"))
    assert "reward is nan; rewards must be finite" in str(err.value)
    assert not (tmp_path / "ckpt" / "latest").exists()


class NaNLossEnv(CodeExecEnv):
    """A loss that is non-finite while every reward is finite: without std normalisation
    (drgrpo) the advantages of rewards this large overflow float32. (Rewards are clipped to
    agentrl.env.REWARD_BOUND since a red-team pass; the test lifts the bound to reach the loss.)"""

    async def reward(self, trajectory):
        return 1e39 * (trajectory.sample_index % 2)


def test_nan_loss_skips_steps_then_stops_the_run(tmp_path, monkeypatch):
    import agentrl.env

    monkeypatch.setattr(agentrl.env, "REWARD_BOUND", float("inf"))
    cfg = compose(overrides(tmp_path, "trainer.steps=6", "trainer.guards.max_skipped_steps=2",
                            "algo=drgrpo", f"env._target_={__name__}.NaNLossEnv"))  # fmt: skip
    with pytest.raises(TrainingError, match="2 optimizer steps in a row had a non-finite loss"):
        asyncio.run(train(cfg, tmp_path / "out"))
    rows = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/skipped"] for r in rows] == [1.0]  # the 2nd skip raised before logging
    assert not (tmp_path / "ckpt" / "latest").exists()


USER_ALGO = '''
import os
import re
from pathlib import Path

def mean_baseline(episodes, cfg):
    """A user estimator: reward minus the group mean, on every sampled token."""
    by_group = {}
    for e in episodes:
        by_group.setdefault(e.group, []).append(e.score)
    return [e.loss_mask_T.float() * (e.score - sum(by_group[e.group]) / len(by_group[e.group]))
            for e in episodes], None

def reinforce(inp, cfg):
    """A user loss, run inside the learner workers (another process)."""
    Path(os.environ["USER_LOSS_MARKER"]).touch()
    m = inp.loss_mask.float()
    return -(inp.logprobs * inp.advantages * m).sum() / max(inp.norm.num_tokens, 1), {}
'''


@pytest.mark.own_ray  # a fresh Ray (below): after the tests sharing one (conftest)
def test_a_user_estimator_and_loss_train_from_their_own_module(tmp_path, monkeypatch):
    """No edit under agentrl/: the config names them by import path; the learner workers import
    the module too (it must be importable there: installed, or on PYTHONPATH)."""
    (tmp_path / "my_algo.py").write_text(USER_ALGO)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("USER_LOSS_MARKER", str(tmp_path / "loss_ran"))
    stop_ray()  # Ray workers inherit the environment of the Ray that starts them: a fresh one
    cfg = compose(overrides(tmp_path, "trainer.steps=1", "algo.advantage.name=my_algo:mean_baseline",
                            "algo.loss.name=my_algo:reinforce"))  # fmt: skip
    history = asyncio.run(train(cfg, tmp_path / "out"))
    assert (tmp_path / "loss_ran").exists(), "the user's loss never ran in the learner"
    assert history[0]["train/skipped"] == 0 and math.isfinite(history[0]["train/grad_norm"])


def test_the_agentrl_command_imports_the_users_env_from_the_working_directory(devserver, tmp_path):
    """The README's `agentrl preview env=custom env._target_=my_env.AddEnv`, run where my_env.py
    lies: a console script has only its bin/ on sys.path, unlike `python -m`. The user's own
    packages are named `tools`, `envs` and `sandbox`: ours are agentrl.tools (...) and cannot
    shadow them. It samples from the session's dev server (engine.urls: a server start fewer;
    what it samples is not checked)."""
    block = readme_add_env()
    for pkg in ("tools", "envs", "sandbox"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
        (tmp_path / pkg / "mine.py").write_text(f"NAME = 'the user\\'s {pkg}'\n")
    mine = "import envs.mine\nimport sandbox.mine\nimport tools.mine\n\n"
    (tmp_path / "my_env.py").write_text(mine + block)
    agentrl = Path(sys.executable).parent / "agentrl"
    done = subprocess.run(
        [str(agentrl), "preview", "env=custom", "env._target_=my_env.AddEnv", "preview.tasks=1",
         "rollout.group_size=2", "preview.show=1", "rollout.max_new_tokens=16",
         f"engine.urls=[{devserver}]"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "What is" in done.stdout  # an AddEnv task was rolled out and shown
