"""LoRA on ONE GPU, colocated with SGLang: a random-weight Qwen2.5-1.5B shape, the policy trains
rank-8 adapters only (learner.lora.rank=8), and each of 3 cycles trains a step and pushes the
merged weights over CUDA IPC (`weight_sync.method=tensor`), or only the adapters through SGLang's
LoRA routes (`route=adapter`, learner.lora.sync's default). After each push SGLang serves the
adapted model: its logprobs of a sampled completion (as sampled, and scored again in one prefill)
match the trainer's as closely as identical weights do before any training (the bf16 floor of
this shape), and the completion it sampled before the push no longer
matches (the adapters moved the model)."""

from __future__ import annotations

import asyncio
from statistics import fmean

import pytest
import torch
from gpu_helpers import (
    launch_sglang,
    make_batch,
    prefill_logprobs,
    shared_build,
    trainer_logprobs,
)

from agentrl.batch import micro_batches
from agentrl.engine import EngineClient, SamplingParams
from agentrl.learner import LearnerConfig, LoraConfig
from agentrl.learner.group import LearnerGroup
from agentrl.loss import LossConfig
from agentrl.weight_sync import WeightSyncConfig, lora_sglang_args, make_weight_sync

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
PPO = LossConfig(name="ppo_clip")
PROMPT = [9707, 11, 1879, 0, 4340, 525, 498] * 4


@pytest.fixture(scope="module")
def qwen15_dir():
    from agentrl.assets.build import build_random_qwen25

    # built once for every xdist worker: each case starts its own server, so they spread
    return shared_build("qwen25-1.5b", lambda d: build_random_qwen25(d, "1.5b"))


def my_logprobs(group: LearnerGroup, completion: list[int]) -> list[float]:
    return trainer_logprobs(group, PROMPT, completion).tolist()


def gap(a: list[float], b: list[float]) -> float:
    return fmean(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("precision,route", [("bf16", "merged"), ("fp16", "merged"),
                                             ("fp16", "adapter")])  # fmt: skip
def test_lora_adapters_reach_colocated_sglang_after_each_push(
    ray_on, qwen15_dir, tmp_path, precision, route
):
    """bf16: the two stacks' floor at this shape (0.017) is above the issue's 0.01. fp16: the
    learner computes in fp32 and SGLang serves float16 (its RMSNorm kernel takes no float32), 3
    more mantissa bits than bf16, so the floor drops and the gap after a push must be ≤ 0.01."""
    ray_on("0")
    fp16 = precision == "fp16"
    cfg = LearnerConfig(model_path=str(qwen15_dir), device="cuda", lr=2e-3, lora=LoraConfig(rank=8),
                        **({"mixed_precision": "fp32", "head_kernel": "torch"} if fp16 else {}))  # fmt: skip
    group = LearnerGroup(cfg)
    group.offload()
    sampling = SamplingParams(max_new_tokens=128, temperature=1.0, seed=3, ignore_eos=True)
    rows: list[dict] = []

    async def cycles(url: str) -> dict[str, float]:
        async with EngineClient([url]) as engine:
            ws = WeightSyncConfig(
                method="tensor", bucket_mb=512, dtype="float16" if fp16 else "auto"
            )
            sync = make_weight_sync(ws, group, engine, adapters=route == "adapter")
            await sync.setup()
            first = await engine.generate(PROMPT, sampling)
            scored = await prefill_logprobs(url, PROMPT + first.token_ids, len(PROMPT))
            group.onload()
            mine = my_logprobs(group, first.token_ids)
            floor = {"sampled": gap(mine, first.logprobs), "prefill": gap(mine, scored)}
            group.offload()
            served = first
            for cycle in range(3):
                await engine.control.release_memory_occupation()
                group.onload()
                for k in range(2):
                    batch = make_batch(10 * cycle + k)
                    group.train_step(micro_batches(batch, 1, 4096), "ppo_clip", PPO)
                stale = gap(my_logprobs(group, served.token_ids), served.logprobs)
                await engine.control.resume_memory_occupation(["weights"])
                metrics = await sync.push(f"lora{cycle}")
                group.offload()
                await engine.control.resume_memory_occupation(["kv_cache", "cuda_graph"])
                now = await engine.generate(PROMPT, sampling)
                assert now.weight_version == f"lora{cycle}"
                scored = await prefill_logprobs(url, PROMPT + now.token_ids, len(PROMPT),
                                                engine.gen.lora)  # fmt: skip
                group.onload()
                mine = my_logprobs(group, now.token_ids)
                group.offload()
                rows.append({"stale": stale, "fresh": gap(mine, now.logprobs),
                             "fresh_prefill": gap(mine, scored),
                             "push_s": round(metrics["sync/seconds"], 2),
                             "push_mb": round(metrics["sync/mb"], 1)})  # fmt: skip
                served = now
            return floor

    try:
        extra = ["--dtype", "float16"] if fp16 else []
        if route == "adapter":
            extra += lora_sglang_args(cfg.lora, [], colocate=True)
        with launch_sglang(qwen15_dir, tmp_path, "0", "--enable-memory-saver", *extra) as url:
            floor = asyncio.run(cycles(url))
    finally:
        group.shutdown()
    print(f"\nLORA 1.5B {precision} {route} on {torch.cuda.get_device_name()}: mean |logprob diff| before "
          f"training (same weights: the {precision} floor) sampled {floor['sampled']:.4f}, "
          f"prefill-scored {floor['prefill']:.4f}")  # fmt: skip
    for i, r in enumerate(rows):
        print(f"LORA cycle {i}: before the push {r['stale']:.4f}, after: sampled {r['fresh']:.4f}, "
              f"prefill-scored {r['fresh_prefill']:.4f}; push {r['push_s']} s, "
              f"{r['push_mb']} MB")  # fmt: skip
    for r in rows:
        if fp16:  # no bf16 floor to hide behind: the bar
            assert r["fresh"] <= 0.01 and r["fresh_prefill"] <= 0.01
        # after a push the engine serves the trainer's model: about as far from it as identical
        # weights are (the floor), or within 0.01. Merged, the engine's weights are W + s·BA
        # rounded to bf16 once more than the learner's: 1.27-1.57x the floor on an H100
        # (2026-11-27), where the stale model is 4-5x
        bound = 2.0 if route == "merged" else 1.5
        assert r["fresh"] < max(bound * floor["sampled"], 0.01)
        assert r["fresh_prefill"] < max(bound * floor["prefill"], 0.01)
        # and what the engine served before the push is measurably off the trained model
        assert r["stale"] > 2 * r["fresh"]
