"""trainer.mode=async on ONE GPU with real SGLang: the shipped tiny model on code_exec, SGLang and
the FSDP2 learner both resident (engine.colocate=false; NCCL cannot place two ranks on one GPU, so
weights go through disk). Rollouts run on while the learner trains; every trained turn carries a
weight version agentrl set, within trainer.async.max_staleness of the weights it updates, and
SGLang's logprobs of turns sampled with the current weights match the learner's."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from gpu_helpers import sglang_test_args

from agentrl.config import compose
from agentrl.train import train

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
STEPS, STALENESS = 6, 1


def test_async_training_on_sglang_keeps_versions_within_the_bound(tmp_path):
    pytest.importorskip("sglang")
    cfg = compose([
        "engine=sglang", sglang_test_args(), "engine.colocate=false", "learner=gpu", "weight_sync.method=disk",
        "trainer.mode=async", f"trainer.async.max_staleness={STALENESS}", f"trainer.steps={STEPS}",
        f"checkpoint.every={STEPS}", f"checkpoint.dir={tmp_path}/ckpt", "logging=local",
    ])  # fmt: skip
    history = asyncio.run(train(cfg, tmp_path / "out"))
    for h in history:
        print({k: round(v, 4) for k, v in h.items() if k.split("/")[0] in {"reward", "async",
               "timing_s", "sync"} or k == "train/logprob_diff"})  # fmt: skip
    assert [h["step"] for h in history] == [float(s) for s in range(1, STEPS + 1)]
    assert max(h["async/staleness_max"] for h in history) == STALENESS
    rows = [
        json.loads(x)
        for x in (tmp_path / "out" / "trajectories.jsonl").read_text().split("\n")
        if x
    ]
    fresh = []
    for r in rows:
        trained_at = int(r["step"]) - 1
        for t in r["turns"]:
            assert 0 <= trained_at - int(t["weight_version"]) <= STALENESS
        if all(int(t["weight_version"]) == trained_at for t in r["turns"]):
            fresh.append(r)
    # trajectories sampled entirely with the weights being updated: SGLang and the learner agree
    assert fresh, "no trajectory was sampled with the current weights"
    diffs = [abs(a - b) for r in fresh for a, b, m in zip(r["logprobs"], r["trainer_logprobs"],
             r["loss_mask"], strict=True) if m]  # fmt: skip
    assert sum(diffs) / len(diffs) <= 0.02
