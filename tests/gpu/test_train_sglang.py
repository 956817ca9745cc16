"""`python -m agentrl.train` on ONE GPU with real SGLang, colocated: the shipped tiny model on
code_exec, FSDP2 (bf16) learner and SGLang sharing the GPU, CUDA-IPC weight sync, a frozen
reference. The same invariants as the CPU learning test (tests/e2e/test_learning.py), over a
shorter run: the policy calls the tool, step-0 KL to the reference is ~0, SGLang's sampled
logprobs match the trainer's, each step samples the weights of the step before, every parameter
moves."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from gpu_helpers import sglang_test_args
from transformers import AutoModelForCausalLM

from agentrl.config import compose
from agentrl.train import train

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
STEPS = 4


def test_tiny_model_trains_on_colocated_sglang(tmp_path):
    pytest.importorskip("sglang")
    cfg = compose([
        "engine=sglang", sglang_test_args(cuda_graphs=True), "learner=gpu", "weight_sync.method=tensor",
        "algo.reference=true",
        f"trainer.steps={STEPS}", f"checkpoint.every={STEPS}", f"checkpoint.dir={tmp_path}/ckpt",
        "logging=local",
    ])  # fmt: skip
    history = asyncio.run(train(cfg, tmp_path / "out"))
    for h in history:
        print({k: round(v, 4) for k, v in h.items() if k.split("/")[0] in {"reward", "train",
               "timing_s", "sync"}})  # fmt: skip
    assert [h["step"] for h in history] == [float(s) for s in range(1, STEPS + 1)]
    assert all(h["rollout/tool_call_rate"] > 0 for h in history)
    assert abs(history[0]["train/kl_ref"]) < 1e-3
    # SGLang (bf16) samples what the bf16 learner scores, within bf16 noise
    assert max(h["train/logprob_diff"] for h in history) <= 0.02
    rows = [
        json.loads(x)
        for x in (tmp_path / "out" / "trajectories.jsonl").read_text().split("\n")
        if x
    ]
    last = {t["weight_version"] for r in rows if r["step"] == STEPS for t in r["turns"]}
    assert last == {str(STEPS - 1)}
    ckpt = tmp_path / "ckpt" / (tmp_path / "ckpt" / "latest").read_text().strip() / "policy"
    trained = dict(AutoModelForCausalLM.from_pretrained(ckpt / "model").named_parameters())
    base = AutoModelForCausalLM.from_pretrained(cfg.model.resolve())
    unchanged = [n for n, p in base.named_parameters() if torch.equal(p, trained[n])]
    assert not unchanged, f"parameters never updated: {unchanged}"
