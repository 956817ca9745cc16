"""Trainer → rollout engines, the driver's side: `make_weight_sync` picks the transport that
`weight_sync.method` names (agentrl/learner/sync/: distributed, disk, tensor, or an import path).

    sync = make_weight_sync(WeightSyncConfig(method="distributed"), policy_group, engine_client)
    await sync.setup()                     # joins the group (distributed); no-op for disk
    metrics = await sync.push(version="3") # after optimizer step 3
    await sync.close()
"""

from __future__ import annotations

from agentrl.engine import EngineClient
from agentrl.learner.sync import SYNC_METHODS, Transport, WeightSyncConfig, WeightSyncError
from agentrl.learner.sync.base import Learner

__all__ = ["Transport", "WeightSyncConfig", "WeightSyncError", "make_weight_sync"]


def make_weight_sync(cfg: WeightSyncConfig, learner: Learner, engine: EngineClient) -> Transport:
    cls = SYNC_METHODS.get(cfg.method)
    if not (isinstance(cls, type) and issubclass(cls, Transport)):
        raise WeightSyncError(
            f"weight_sync.method={cfg.method!r} is not a subclass of agentrl.weight_sync.Transport"
        )
    if cls.name != cfg.method and cfg.method not in SYNC_METHODS:
        # an import-path transport: the workers resolve it by the same path
        cls = type(cls.__name__, (cls,), {"name": cfg.method})
    return cls(cfg, learner, engine)
