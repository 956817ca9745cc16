"""Weight sync, learner (2 FSDP ranks on Ray) → a real dev server on loopback: after a push the
server's logprobs equal the trainer's, and before it they do not, for the built-in
methods and for one written outside agentrl/ (named by import path)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from agentrl.batch import TrainBatch, global_norm, micro_batches
from agentrl.engine import EngineClient, SamplingParams
from agentrl.learner import LearnerConfig, RayConfig
from agentrl.learner.group import LearnerGroup
from agentrl.learner.memory import heads_of
from agentrl.learner.ray_start import start_ray, stop_ray
from agentrl.learner.sync import SYNC_METHODS
from agentrl.learner.sync.tensor import TensorSync, plan_direct
from agentrl.learner.tp import Heads, plan_tp, shard
from agentrl.loss import LossConfig
from agentrl.weight_sync import WeightSyncConfig, make_weight_sync

pytestmark = pytest.mark.own_ray  # stops the shared Ray (conftest): runs after its users

PROMPT = [9707, 11, 1879, 0, 4340, 525, 498, 1207, 33, 271]
SAMPLING = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7, ignore_eos=True)
TOL = 1e-4


def sequence(prompt: list[int], completion: list[int], adv: float = 0.0) -> TrainBatch:
    n = len(prompt) + len(completion)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[len(prompt) :] = True
    seq = torch.zeros(n, dtype=torch.long)
    return TrainBatch(
        torch.tensor(prompt + completion),
        torch.arange(n),
        mask,
        torch.where(mask, -9.0, 0.0),
        torch.where(mask, adv, 0.0),
        seq,
        global_norm(mask, seq),
        trainer_old_logprobs=torch.where(mask, -9.0, 0.0),
    )


def trainer_logprobs(policy: LearnerGroup, completion: list[int]) -> torch.Tensor:
    mb = sequence(PROMPT, completion)
    lp = policy.compute_logprobs([[mb]] * policy.world_size)[0][0]
    return lp[len(PROMPT) :]


def train_once(policy: LearnerGroup, completion: list[int], adv: float) -> None:
    batch = sequence(PROMPT, completion, adv)
    policy.train_step(micro_batches(batch, policy.world_size, 1000), "ppo_clip", LossConfig())


# A transport written outside agentrl/ (one file, named by import path): every rank gathers each
# bucket, rank 0 hands the full tensors back through Ray's object store, the driver posts them to
# the servers. Its rank half runs inside the learner workers (the driver names its methods by
# reference: `self.ranks(ObjectStoreSync.Rank.bucket, …)`), so they must import this module.
USER_TRANSPORT = """
import time
from agentrl.engine import encode_named_tensors
from agentrl.learner import fsdp
from agentrl.learner.sync import Transport

class ObjectStoreSync(Transport):
    class Rank(Transport.Rank):
        def bucket(self, bucket):
            w = self.worker
            return fsdp.gather_full(w.model, bucket, w.rank)

    async def push(self, version):
        if not self.buckets:
            await self.setup()
        t0 = time.perf_counter()
        for i, bucket in enumerate(self.buckets):
            tensors = self.ranks(ObjectStoreSync.Rank.bucket, bucket)[0]
            last = i == len(self.buckets) - 1
            await self.engine.control.update_weights_from_tensor(
                [encode_named_tensors(tensors)], weight_version=version if last else None,
                load_format="safetensors", flush_cache=last)
        self.version = version
        return self._metrics(time.perf_counter() - t0)
"""


@pytest.fixture(scope="module")
def policy(tiny_model_dir, tmp_path_factory):
    plugin = tmp_path_factory.mktemp("plugin")
    (plugin / "user_transport.py").write_text(USER_TRANSPORT)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(plugin))  # the driver, and (through PYTHONPATH) the Ray workers
        mp.setenv("PYTHONPATH", os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")]))
        stop_ray()  # the workers need this PYTHONPATH: a Ray of its own, not the shared one
        start_ray(RayConfig(num_cpus=2, object_store_mb=100))
        group = LearnerGroup(LearnerConfig(model_path=str(tiny_model_dir), num_workers=2, lr=1e-2))
        yield group
        group.shutdown()
        stop_ray()


@pytest.mark.parametrize("method", ["distributed", "disk", "user_transport:ObjectStoreSync"])
async def test_server_serves_trainer_weights_after_push(
    method: str, policy, scratch_devserver, tmp_path: Path
) -> None:
    """Each method on the e2e tests' scratch server (conftest; its gloo end binds loopback), one
    after another: whatever the method before pushed, a training step moves the trainer off it."""
    cfg = WeightSyncConfig(method=method, bucket_mb=0.15, disk_dir=str(tmp_path / "weights"))
    async with EngineClient([scratch_devserver]) as engine:
        sync = make_weight_sync(cfg, policy, engine)
        await sync.setup()
        assert len(sync.buckets) > 3  # several buckets, the embedding alone in one
        try:
            for version, adv in (("1", 1.0), ("2", -1.0)):
                served = await engine.generate(PROMPT, SAMPLING)
                train_once(policy, served.token_ids, adv)
                before = trainer_logprobs(policy, served.token_ids)
                stale = (before - torch.tensor(served.logprobs)).abs().max().item()
                assert stale > 1e-2, "the training step did not change the logprobs"

                metrics = await sync.push(version)

                fresh = await engine.generate(PROMPT, SAMPLING)
                assert fresh.weight_version == version
                after = trainer_logprobs(policy, fresh.token_ids)
                diff = (after - torch.tensor(fresh.logprobs)).abs().max().item()
                assert diff < TOL, f"{method} v{version}: server differs by {diff}"
                assert metrics["sync/mb"] == pytest.approx(sync.total_bytes / 2**20)
        finally:
            await sync.close()
    if method == "disk":
        assert [p.name for p in (tmp_path / "weights").iterdir()] == ["v2"]  # older removed


@pytest.mark.parametrize("tp_size", [2, 4])
def test_each_learner_rank_cuts_its_tp_ranks_slices(policy, tiny_model_dir, tp_size: int) -> None:
    """The colocated push to a tensor-parallel engine (`method=tensor`, `engine.tp` > 1): each of
    the two FSDP ranks packs the slices of the TP ranks it serves (t mod 2), from the bucket it
    gathered, and they are the shard plan's cut of the full weights. The CUDA-IPC hand-off itself
    needs GPUs; this is everything before it, on the real sharded learner."""
    specs = [s for b in policy.buckets(0.1, "float32") for s in b]
    buckets, groups = plan_direct(specs, 0.1)
    assert sum(g is not None for g in groups) > 2  # several direct buckets
    heads = heads_of(AutoConfig.from_pretrained(tiny_model_dir))
    assert heads == Heads(4, 2, 16)
    user = SYNC_METHODS.get("user_transport:ObjectStoreSync")
    for bucket, fused in zip(buckets, groups, strict=True):
        if fused is None:  # a vocabulary the engine pads: full tensors, the server's loader
            continue
        per_rank = policy.on_ranks(TensorSync.Rank, TensorSync.Rank.tp_views, bucket, tp_size)
        full = policy.on_ranks(user.Rank, user.Rank.bucket, bucket)[0]
        plan = plan_tp([(s.name, s.shape) for s in bucket], tp_size, heads)
        for rank, got in enumerate(per_rank):
            assert sorted(got) == [t for t in range(tp_size) if t % 2 == rank]
            for t, (flat, views) in got.items():
                want = shard(full, plan[t])
                assert [n for n, _ in views] == list(want)
                assert flat.numel() == sum(v.numel() for _, v in views)
                for name, view in views:
                    assert torch.equal(view, want[name]), (t, name)
        # two servers whose TP ranks' GPUs hold the learner ranks the other way round: each
        # learner rank cuts the slices it packs, for both servers
        swapped = [[(t + 1) % 2 for t in range(tp_size)]] * 2
        mine = policy.on_ranks(TensorSync.Rank, TensorSync.Rank.tp_views, bucket, tp_size, swapped)
        assert [sorted(got) for got in mine] == [
            [t for t in range(tp_size) if (t + 1) % 2 == r] for r in (0, 1)
        ]


def test_a_bf16_gather_casts_each_shard_first_and_gives_the_same_numbers(policy) -> None:
    """A push in bf16 from fp32 shards casts each shard before the all-gather (half the bytes
    on the wire); the full tensors equal the fp32 gather cast afterwards, bit for bit."""
    bf16 = [s for b in policy.buckets(1.0, "bfloat16") for s in b]
    fp32 = [s for b in policy.buckets(1.0, "float32") for s in b]
    assert [s.name for s in bf16] == [s.name for s in fp32]
    user = SYNC_METHODS.get("user_transport:ObjectStoreSync")  # the class the config names
    got = policy.on_ranks(user.Rank, user.Rank.bucket, bf16)[0]
    ref = policy.on_ranks(user.Rank, user.Rank.bucket, fp32)[0]
    assert got and set(got) == set(ref)
    for name, t in got.items():
        assert t.dtype == torch.bfloat16 and torch.equal(t, ref[name].to(torch.bfloat16)), name


def test_unknown_method_is_rejected_with_the_known_ones() -> None:
    with pytest.raises(
        ValueError,
        match="unknown weight-sync method 'nccl'; set weight_sync.method to one of: "
        "disk, distributed, tensor",
    ):
        WeightSyncConfig(method="nccl")
