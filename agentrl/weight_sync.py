"""Trainer → rollout engines, the driver's side: `make_weight_sync` picks the transport that
`weight_sync.method` names (agentrl/learner/sync/: distributed, disk, tensor, or an import path).

    sync = make_weight_sync(WeightSyncConfig(method="distributed"), policy_group, engine_client)
    await sync.setup()                     # joins the group (distributed); no-op for disk
    metrics = await sync.push(version="3") # after optimizer step 3
    await sync.close()
"""

from __future__ import annotations

from agentrl.engine import EngineClient
from agentrl.learner.sync import (
    SYNC_METHODS,
    AdapterSync,
    Transport,
    WeightSyncConfig,
    WeightSyncError,
)
from agentrl.learner.sync.adapter import planned_mode as planned_lora_sync
from agentrl.learner.sync.adapter import resolve_mode as resolve_lora_sync
from agentrl.learner.sync.adapter import sglang_args as lora_sglang_args
from agentrl.learner.sync.base import Learner

__all__ = [
    "SYNC_METHODS", "AdapterSync", "Transport", "WeightSyncConfig", "WeightSyncError", "lora_sglang_args",
    "make_weight_sync", "planned_lora_sync", "resolve_lora_sync",
]  # fmt: skip


def make_weight_sync(
    cfg: WeightSyncConfig, learner: Learner, engine: EngineClient, *, adapters: bool = False
) -> Transport:
    """`adapters`: a LoRA run whose engines get the adapters only (learner.lora.sync)."""
    if adapters:
        return AdapterSync(cfg, learner, engine)
    cls = SYNC_METHODS.get(cfg.method)
    if not (isinstance(cls, type) and issubclass(cls, Transport)):
        raise WeightSyncError(
            f"weight_sync.method={cfg.method!r} is not a subclass of agentrl.weight_sync.Transport"
        )
    if cls.gpu_only and learner.cfg.resolved_device() != "cuda":
        raise WeightSyncError(
            f"weight_sync.method={cfg.method} {cls.summary} and needs the learner on a GPU; "
            "use weight_sync.method=distributed (or disk) on CPU"
        )
    return cls(cfg, learner, engine)
