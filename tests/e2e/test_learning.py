"""CI proves learning: a short GRPO run of the shipped tiny model on code_exec (the quick start's
defaults, fewer steps) must raise the reward by a clear margin, with the whole stack real (dev
server, sandbox, FSDP2 on Ray, weight sync, frozen reference). Also checked on the same run: the
policy calls the tool, the step-0 KL to the reference is ~0, trainer and rollout logprobs of the
sampled tokens agree, and every parameter moved."""

import asyncio
import math
from statistics import fmean

import pytest
import torch
from learning_rule import assert_learned, eval_overrides
from transformers import AutoModelForCausalLM

from agentrl.config import compose
from agentrl.train import train

pytestmark = pytest.mark.usefixtures("shared_ray")  # one Ray for the module's runs (conftest)

# the bar, +0.25 on the evaluation set (learning_rule.py), and what runs of seeds 0-3 gave:
STEPS = 12  # the quick start: +0.51, +0.53, +0.62, +0.52
PRESET_STEPS = {"ppo": 10}  # PPO +0.58, +0.56, +0.62 (GSPO, a GRPO-family loss, gave +0.63,
# +0.52, +0.64 in 10 steps; one learning test per algorithm family keeps CI short: GSPO's loss is
# checked in tests/unit/test_loss.py)
# LoRA at lr 5e-3: +0.71, +0.65, +0.74, +0.65. At 1e-2 (before) one run of seeds 0-2 collapsed
# after step 8 (0.73 -> 0.0 at step 16, parse errors rising; evaluation 0.195 -> 0.180), as a CI
# run had (0.69 -> 0.16 at step 10)
LORA_STEPS, LORA_LR = 16, 5e-3


def test_tiny_model_learns_code_exec(tmp_path):
    cfg = compose(
        [*eval_overrides(STEPS), f"checkpoint.dir={tmp_path}/ckpt", "algo.reference=true"]
    )
    assert cfg.model.path == "builtin:tiny"
    history = asyncio.run(train(cfg, tmp_path / "out"))
    assert len(history) == STEPS
    print("reward per step:", [round(h["reward/mean"], 3) for h in history])
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
    "ppo": ["algo=ppo"],
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
        # the critic follows the rising return (values start near 0 from a fresh head)
        assert history[-1]["critic/value_mean"] > history[0]["critic/value_mean"] + 0.2


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
