"""A mixture-of-experts model on ONE GPU with real SGLang, colocated: a random Qwen3-MoE (8
experts, 2 per token) trained 2 steps with routing replay, its weights pushed by each CUDA-IPC
format. The push must reach the server in the layout it reads (agentrl/moe.py: SGLang's fused-MoE
parameters for `direct`, the hub's per-expert tensors for `flattened_bucket`): the server keeps
serving, the second step samples the first step's weights and scores within bf16 noise of the
learner, and the checkpoint is in the hub's layout (what SGLang loads)."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from gpu_helpers import sglang_test_args
from safetensors import safe_open

from agentrl.assets.build import build_tiny_moe
from agentrl.config import compose
from agentrl.train import train

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("load_format", ["direct", "flattened_bucket"])
def test_a_moe_model_trains_and_its_pushes_reach_sglang(load_format, tmp_path):
    pytest.importorskip("sglang")
    # head_dim 64 for SGLang's kernels; its own output head, as SGLang's Qwen3-MoE never ties one
    model = build_tiny_moe(tmp_path / "moe", hidden_size=256, tied=False)
    cfg = compose([
        f"model.path={model}", "engine=sglang", sglang_test_args(), "learner=gpu", "weight_sync.method=tensor",
        f"weight_sync.load_format={load_format}", "learner.routing_replay=true",
        "env=custom", "env._target_=agentrl.envs.synthetic.FixedLengthEnv", "env.tasks.n=16",
        "env.tasks.prompt_words=32", "env.args.turns=2", "rollout.max_new_tokens=32",
        "rollout.ignore_eos=true", "trainer.steps=2", "trainer.tasks_per_step=4",
        "rollout.group_size=4", "checkpoint.every=2", f"checkpoint.dir={tmp_path}/ckpt",
        "logging=local",
    ])  # fmt: skip
    history = asyncio.run(train(cfg, tmp_path / "out"))
    print([{k: round(v, 4) for k, v in h.items() if k.startswith(("train/", "sync/"))}
           for h in history])  # fmt: skip
    assert [h["step"] for h in history] == [1.0, 2.0]
    assert all(h["rollout/routed_positions"] > 0 for h in history)
    assert max(h["train/logprob_diff"] for h in history) <= 0.02
    assert history[-1]["sync/direct"] == float(load_format == "direct")
    rows = [json.loads(x) for x in (tmp_path / "out" / "trajectories.jsonl").read_text().split("\n") if x]  # fmt: skip
    assert {t["weight_version"] for r in rows if r["step"] == 2 for t in r["turns"]} == {"1"}
    ckpt = tmp_path / "ckpt" / (tmp_path / "ckpt" / "latest").read_text().strip() / "policy"
    names = set()
    for f in (ckpt / "model").glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            names |= set(st.keys())
    assert "model.layers.0.mlp.experts.7.down_proj.weight" in names
    assert not any(n.endswith(("experts.gate_up_proj", "experts.down_proj")) for n in names)
