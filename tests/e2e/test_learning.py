"""CI proves learning, one run per algorithm family: a short PPO run of the shipped tiny model on
code_exec (the quick start's defaults, fewer steps, trainer.deterministic=true) must raise the
reward by a clear margin, with the whole stack real (dev server, sandbox, FSDP2 on Ray, weight
sync, a critic); GRPO's learning run in CI is the README's AddEnv on held-out names
(tests/e2e/test_learning_envs.py). Also checked on the PPO run: the policy calls the tool, trainer
and rollout logprobs of the sampled tokens agree, and the critic fits the returns.

The quick start's own GRPO run (with a frozen reference) is the mechanics in CI: 2 steps of 4
groups of 4, where the step-0 KL to the reference is ~0 and then is not, trainer and rollout
logprobs agree and every parameter moved; `AGENTRL_LEARN_ALL=1` runs it as the learning run it
was (6 steps, the evaluation rule: 0.125 -> 0.609 on 2026-11-27; 49 s of CI against 13 s)."""

import asyncio
import math
import os
from statistics import fmean

import pytest
import torch
from learning_rule import assert_learned, eval_overrides
from transformers import AutoModelForCausalLM

from agentrl.config import compose
from agentrl.train import train

pytestmark = pytest.mark.usefixtures("shared_ray")  # one Ray for the module's runs (conftest)

# GRPO's learning run (AGENTRL_LEARN_ALL=1; CI runs its mechanics, above): the bar, +0.25 on the
# evaluation set (learning_rule.py). The quick start's run is
# trainer.deterministic=true, 8 steps: 0.094 -> 0.562 (seed 0, the test's), and seeds 1-3 gave
# +0.47, +0.34, +0.70 (12 steps: +0.67, +0.67, +0.59, +0.78). Sampled freely it gave +0.39 to
# +0.61 in 12 steps here, but a CI run on a busy machine rose only 0.125 -> 0.297 (its steps'
# rewards flat at 0.1-0.36): a free run's draw is the machine's timing, a deterministic run is
# the same run on every machine and load, at the same cost (48 s for 8 steps, 48-52 s for 12 free).
# 6 steps since: evaluated every 2 steps the same run went 0.094, 0.297, 0.344, 0.547, 0.562
# (steps 0-8; an evaluation round is seeded apart from the training rounds, so each point is where
# a run of that many steps ends): steps 7-8 added +0.016 for about 9 s of CI
STEPS = 6
# The shipped model's third stage (2026-11-27, a better schema reader) gives this run 0.125 -> 0.609
# PPO +0.58, +0.56, +0.62 with the base build; the shipped model (its name-reading stage) gave a
# run that fell (0.156 -> 0.047) in a CI run, so the PPO run is trainer.deterministic=true too:
# 0.156 -> 0.594 in 8 steps (0.500 in 10; 0.094 -> 0.562 with 2 samples a task), the same run
# after run (GSPO, a GRPO-family loss, gave +0.63, +0.52, +0.64 in 10 steps; one learning test per
# algorithm family keeps CI short: GSPO's loss is checked in tests/unit/test_loss.py)
# 6 steps since: evaluated every 2 steps (seeded apart from training, as above) the PPO run went
# 0.094, 0.250, 0.344, 0.547, 0.562 (steps 0-8): steps 7-8 added +0.016 for about 14 s of CI
PRESET_STEPS = {"ppo": 6}
# with the third stage: 0.125 -> 0.547 in 6 steps (0.594 in 8)
# LoRA at lr 5e-3: +0.71, +0.65, +0.74, +0.65. At 1e-2 (before) one run of seeds 0-2 collapsed
# after step 8 (0.73 -> 0.0 at step 16, parse errors rising; evaluation 0.195 -> 0.180), as a CI
# run had (0.69 -> 0.16 at step 10). LoRA is no algorithm family: its learning run is not in CI
# (AGENTRL_LEARN_ALL=1 runs it). What it adds is checked in CI by
# tests/e2e/test_train_engines.py::test_lora_reaches_the_engine_and_a_resumed_run_serves_the_checkpoints
# (the first update follows the advantages; PEFT's adapter merges into what the engine serves;
# only the adapted projections move) and test_learner.py::test_lora_over_a_bf16_base_trains_...
LORA_STEPS, LORA_LR = 16, 5e-3
LEARN_ALL = bool(os.environ.get("AGENTRL_LEARN_ALL"))


# the GRPO run's mechanics in CI: 16 episodes a step; seed 1 solves one of them in step 1 (seed 0
# none: no update, and step 2's KL was 0)
MECHANICS = ["trainer.steps=2", "trainer.tasks_per_step=4", "rollout.group_size=4", "seed=1",
             "checkpoint.every=2", "logging=local"]  # fmt: skip


def test_tiny_model_trains_code_exec_with_a_reference(tmp_path):
    steps = STEPS if LEARN_ALL else 2
    cfg = compose(
        [
            *(eval_overrides(STEPS) if LEARN_ALL else MECHANICS),
            f"checkpoint.dir={tmp_path}/ckpt",
            "algo.reference=true",
            "trainer.deterministic=true",
        ]  # fmt: skip
    )
    assert cfg.model.path == "builtin:tiny"
    history = asyncio.run(train(cfg, tmp_path / "out"))
    assert len(history) == steps
    print("reward per step:", [round(h["reward/mean"], 3) for h in history])
    if LEARN_ALL:
        assert_learned(tmp_path / "out", STEPS, 0.25)
    assert all(h["rollout/tool_call_rate"] > 0 for h in history)
    # the reference is a frozen copy of the initial policy: identical before the first update
    assert abs(history[0]["train/kl_ref"]) < 1e-6
    assert history[-1]["train/kl_ref"] > 1e-4
    # what the learner trains on is what the engine sampled (same weights, same temperature)
    assert max(h["train/logprob_diff"] for h in history) <= 0.01
    final = tmp_path / "ckpt" / (tmp_path / "ckpt" / "latest").read_text().strip() / "policy"
    trained = dict(AutoModelForCausalLM.from_pretrained(final / "model").named_parameters())
    base = AutoModelForCausalLM.from_pretrained(cfg.model.resolve())
    unchanged = [n for n, p in base.named_parameters() if torch.equal(p, trained[n])]
    assert not unchanged, f"parameters never updated: {unchanged}"


PRESETS = {
    # PPO with a critic: GAE over sampled tokens, value clipping, 2 optimizer steps per batch
    "ppo": ["algo=ppo", "trainer.deterministic=true"],
}


@pytest.mark.parametrize("algo", sorted(PRESETS))
def test_tiny_model_learns_code_exec_with(algo, tmp_path):
    steps = PRESET_STEPS[algo]
    cfg = compose([*eval_overrides(steps), f"checkpoint.dir={tmp_path}/ckpt", *PRESETS[algo]])
    history = asyncio.run(train(cfg, tmp_path / "out"))
    print(f"{algo} reward per step:", [round(h["reward/mean"], 3) for h in history])
    # a step's 8 tasks may come mostly from a family the policy still gets wrong (docs/algorithms.md
    # "Reading a dip": a PPO run in CI dipped 0.438 -> 0.125 at step 6): the fixed evaluation
    # set judges the policy, not the draw
    assert_learned(tmp_path / "out", steps, 0.25, algo)
    assert all(h["rollout/tool_call_rate"] > 0 for h in history)
    assert max(h["train/logprob_diff"] for h in history) <= 0.01
    assert all(h["train/skipped"] == 0 for h in history)
    if algo == "ppo":
        assert all(math.isfinite(h["critic/vf_loss"]) for h in history)
        vf = [h["critic/vf_loss"] for h in history]
        assert fmean(vf[-3:]) < vf[0], f"critic did not fit the returns: {vf}"
        # the critic follows the rising return: with the third stage the step rewards went
        # 0.109 -> 0.266 over the 6 steps and the values 0.261 -> 0.419 (0.499 at step 8, where
        # the reward reached 0.812); the second stage's run rose more in its steps, and the bar
        # was +0.2 then
        assert history[-1]["critic/value_mean"] > history[0]["critic/value_mean"] + 0.1


@pytest.mark.skipif(not LEARN_ALL, reason="a learning run outside CI: AGENTRL_LEARN_ALL=1 runs it")
def test_tiny_model_learns_code_exec_with_lora(tmp_path):
    """learner.lora.rank=8: only the adapters train (PEFT), the engine samples from the merged
    weights; the quick start still learns by the same rule. The checkpoint's adapter/ is PEFT's
    own format: merged onto the base by PEFT it gives the checkpoint's model/ (what the engine
    served), and every weight the adapters do not touch is the base's, bit for bit."""
    from peft import PeftModel

    cfg = compose([*eval_overrides(LORA_STEPS), f"checkpoint.dir={tmp_path}/ckpt",
                   "learner.lora.rank=8", f"learner.lr={LORA_LR}"])  # fmt: skip
    history = asyncio.run(train(cfg, tmp_path / "out"))
    print("lora reward per step:", [round(h["reward/mean"], 3) for h in history])
    assert_learned(tmp_path / "out", LORA_STEPS, 0.25, "lora")
    # the engine sampled from exactly the weights the learner trains (adapters merged)
    assert max(h["train/logprob_diff"] for h in history) <= 0.01
    final = tmp_path / "ckpt" / (tmp_path / "ckpt" / "latest").read_text().strip() / "policy"
    served = dict(AutoModelForCausalLM.from_pretrained(final / "model").named_parameters())
    base = AutoModelForCausalLM.from_pretrained(cfg.model.resolve())
    peft = PeftModel.from_pretrained(base, final / "adapter").merge_and_unload()
    merged = dict(peft.named_parameters())
    assert max((merged[n] - p).abs().max().item() for n, p in served.items()) < 1e-5
    base = dict(AutoModelForCausalLM.from_pretrained(cfg.model.resolve()).named_parameters())
    moved = {n for n, p in served.items() if not torch.equal(p, base[n])}
    assert moved and all(n.endswith("proj.weight") for n in moved), sorted(moved)[:5]
