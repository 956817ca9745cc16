"""Trainer → rollout engines: the policy's full weights after each optimizer step, one module per
transport (see base.py for the contract):

    distributed  a trainer+servers process group, rank 0 broadcasts (gloo on CPU, NCCL on GPU)
    disk         rank 0 writes a transformers dir; the servers reload it
    tensor       colocated GPUs: CUDA-IPC handles of one buffer per bucket, each learner rank
                 posting them to the server on its GPU

and, for LoRA runs (learner.lora.sync, not a method), only the adapters, through SGLang's LoRA routes (adapter.py).

All gather the FSDP shards bucket by bucket (`bucket_mb`), so no process holds more than one
bucket of full tensors beyond its shard, and all stamp the servers with the new `weight_version`
(on the last bucket), which every later Completion carries.
"""

from agentrl.learner.sync.adapter import AdapterSync
from agentrl.learner.sync.base import (
    SYNC_METHODS,
    Transport,
    WeightSyncConfig,
    WeightSyncError,
)
from agentrl.learner.sync.disk import DiskSync
from agentrl.learner.sync.distributed import DistributedSync
from agentrl.learner.sync.tensor import TensorSync, is_vocab_param, plan_direct

__all__ = [
    "SYNC_METHODS",
    "AdapterSync",
    "DiskSync",
    "DistributedSync",
    "TensorSync",
    "Transport",
    "WeightSyncConfig",
    "WeightSyncError",
    "is_vocab_param",
    "plan_direct",
]
