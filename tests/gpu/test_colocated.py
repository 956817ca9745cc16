"""The colocated hybrid engine on ONE GPU: SGLang (--enable-memory-saver) and the FSDP2 learner
share the device; per cycle the engine releases its memory, the learner onloads and trains, the
engine resumes its weights and receives the new ones over CUDA IPC (`weight_sync.method=tensor`),
the learner offloads, the engine resumes its KV cache and serves. SGLang then serves the trainer's
weights, and GPU memory does not grow from cycle to cycle.

With two GPUs the same cycles run with the learner as two FSDP2 ranks and ONE SGLang server at
tp=2 over both GPUs: each learner rank hands the TP rank on its GPU only that rank's slices
(agentrl/learner/tp.py), in SGLang's `direct` format."""

from __future__ import annotations

import asyncio

import pytest
import torch
from gpu_helpers import (
    MACHINE_GPUS,
    gpu_mib_of_my_processes,
    launch_sglang,
    make_batch,
    trainer_logprobs,
)

from agentrl.batch import micro_batches
from agentrl.engine import EngineClient, SamplingParams
from agentrl.learner import LearnerConfig
from agentrl.learner.group import LearnerGroup
from agentrl.loss import LossConfig
from agentrl.weight_sync import WeightSyncConfig, make_weight_sync

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
PPO = LossConfig(name="ppo_clip")
PROMPT = list(range(1000, 1032))


def score(group: LearnerGroup, completion: list[int]) -> torch.Tensor:
    return trainer_logprobs(group, PROMPT, completion)


def gpu_free_gib(tp: int) -> float:
    """What this test's processes leave free: minus what they use (NVML's per-process view), so
    other xdist workers on the GPU do not move it; where NVML cannot name our processes, the
    devices' free memory (then the test runs alone: conftest)."""
    mine = gpu_mib_of_my_processes()
    if mine is not None:
        return -mine / 1024
    return min(torch.cuda.mem_get_info(i)[0] for i in range(tp)) / 2**30


@pytest.mark.gpu_alone  # alone where only the device's free memory can tell (gpu_free_gib)
@pytest.mark.parametrize("tp", [1, 2])
def test_colocated_cycles_serve_trainer_weights_without_memory_growth(
    tp, ray_on, model_dir, tmp_path
):
    if tp > MACHINE_GPUS:
        pytest.skip(f"needs {tp} GPUs")
    gpus = ",".join(str(i) for i in range(tp))
    ray_on(gpus)
    cfg = LearnerConfig(model_path=str(model_dir), device="cuda", lr=2e-2, num_workers=tp)
    group = LearnerGroup(cfg)
    group.offload()
    sampling = SamplingParams(max_new_tokens=32, temperature=1.0, seed=3, ignore_eos=True)
    free_after: list[float] = []
    wcfg = WeightSyncConfig(method="tensor", bucket_mb=32, ranks_per_server=tp)

    async def cycles(url: str) -> tuple[float, float, dict]:
        async with EngineClient([url]) as engine:
            sync = make_weight_sync(wcfg, group, engine)
            await sync.setup()
            stale = fresh = float("nan")
            metrics: dict = {}
            for cycle in range(8):
                served = await engine.generate(PROMPT, sampling)
                await engine.control.release_memory_occupation()
                group.onload()
                group.train_step(micro_batches(make_batch(cycle), tp, 400), "ppo_clip", PPO)
                if cycle == 0:
                    stale = score(group, served.token_ids) - torch.tensor(served.logprobs)
                    stale = stale.abs().mean().item()
                await engine.control.resume_memory_occupation(["weights"])
                metrics = await sync.push(f"c{cycle}")
                group.offload()
                await engine.control.resume_memory_occupation(["kv_cache", "cuda_graph"])
                if cycle == 0:
                    now = await engine.generate(PROMPT, sampling)
                    assert now.weight_version == "c0"
                    group.onload()
                    fresh = score(group, now.token_ids) - torch.tensor(now.logprobs)
                    fresh = fresh.abs().mean().item()
                    group.offload()
                torch.cuda.synchronize()
                free_after.append(gpu_free_gib(tp))
            return stale, fresh, metrics

    try:
        extra = ["--enable-memory-saver", *(["--tp-size", str(tp)] if tp > 1 else [])]
        with launch_sglang(model_dir, tmp_path, gpus, *extra) as url:
            stale, fresh, metrics = asyncio.run(cycles(url))
    finally:
        group.shutdown()
    print(f"mean |logprob diff| before sync {stale:.4f}, after {fresh:.4f}; {metrics}")
    print("free GiB after each cycle:", [f"{x:.2f}" for x in free_after])
    assert stale > 0.2 and fresh < 0.05
    assert metrics["sync/direct"] == 1.0  # each TP rank took its slices straight in
    assert free_after[-1] > free_after[1] - 0.5, "GPU memory grows from cycle to cycle"
