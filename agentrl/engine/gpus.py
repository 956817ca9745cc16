"""Which GPUs each local server, and the learner beside them, compute on: engine.gpus, else the
visible ones, shared out by server and TP rank (`own_gpus`), and split between the learner and
the servers when they do not share (`split_local_gpus`, engine.colocate=false)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from agentrl.engine.config import EngineConfig
from agentrl.engine.protocol import EngineUnavailable
from agentrl.types import ConfigError


def visible_gpus() -> list[str]:
    """The GPU ids this process sees, as the host names them: CUDA_VISIBLE_DEVICES, else all."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return visible.split(",")
    import torch  # CUDA is asked only when the environment does not say

    return [str(i) for i in range(torch.cuda.device_count())]


def _server_gpus(cfg: EngineConfig, env: Mapping[str, str]) -> list[str]:
    """The GPU ids the local servers share out: engine.gpus, else the visible ones."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    want = cfg.num_servers * cfg.tp
    return list(cfg.gpus) or (visible.split(",") if visible else [str(g) for g in range(want)])


def own_gpus(cfg: EngineConfig, index: int, env: Mapping[str, str] | None = None) -> list[str]:
    """The GPU ids (as this host names them) that local SGLang server `index` computes on:
    i*tp .. i*tp+tp-1 of engine.gpus, else of the visible ones; the only GPUs it sees when there
    are several servers or TP ranks (server_env). Too few for TP: EngineUnavailable."""
    env = os.environ if env is None else env
    gpus, want = _server_gpus(cfg, env), cfg.num_servers * cfg.tp
    if cfg.tp > 1 and len(gpus) < want:
        visible = env.get("CUDA_VISIBLE_DEVICES")
        where = f"engine.gpus={cfg.gpus}" if cfg.gpus else f"CUDA_VISIBLE_DEVICES={visible}"
        raise EngineUnavailable(
            f"{cfg.num_servers} server(s) x engine.tp={cfg.tp} need {want} GPUs; "
            f"{where} has {len(gpus)}"
        )
    if cfg.tp > 1:
        return gpus[index * cfg.tp : (index + 1) * cfg.tp]
    return [gpus[index % len(gpus)]]


def split_local_gpus(
    cfg: EngineConfig, learner_gpus: int, visible: list[str], nccl: bool
) -> tuple[list[str], EngineConfig] | None:
    """Disaggregated on one host (engine.colocate=false, SGLang servers started here): the
    learner's ranks take the first `learner_gpus` of the `visible` GPUs, the servers the next
    num_servers x tp (or engine.gpus as given, the learner the rest). Returns the learner's GPUs and
    the engine config with its GPUs named, or None when there is nothing to split (no GPU learner,
    colocated, dev or Ray-placed servers, running servers). With too few GPUs for both they share
    (disk sync works so), except over NCCL, which cannot put two ranks on one GPU: a ConfigError."""
    if (
        not learner_gpus
        or cfg.colocate
        or cfg.kind != "sglang"
        or cfg.placement != "local"
        or cfg.urls
    ):
        return None
    want = cfg.num_servers * cfg.tp
    if cfg.gpus:
        learner = [g for g in visible if g not in cfg.gpus][:learner_gpus]
        engine = list(cfg.gpus)
    else:
        learner, engine = visible[:learner_gpus], visible[learner_gpus : learner_gpus + want]
    if len(learner) >= learner_gpus and len(engine) >= want:
        return learner, cfg.model_copy(update={"gpus": engine})
    if nccl:
        raise ConfigError(
            f"engine.colocate=false with weight_sync.method=distributed: the learner's "
            f"{learner_gpus} rank(s) and {cfg.num_servers} server(s) x engine.tp={cfg.tp} need "
            f"{learner_gpus + want} GPUs of their own (NCCL cannot put two ranks on one GPU), "
            f"{len(visible)} visible ({','.join(visible) or 'none'}); use engine.colocate=true "
            "with weight_sync.method=tensor, or weight_sync.method=disk to share them"
        )
    return None
