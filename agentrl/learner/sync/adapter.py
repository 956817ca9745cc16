"""LoRA runs (`learner.lora.rank > 0`): only the adapters go to the engines, through SGLang's
LoRA routes, instead of the whole merged model.

    learner.lora.rank=8 learner.lora.sync=auto   # adapter | merged | auto

Each push: every learner rank gathers the adapter tensors (rank 8 on every linear of
Qwen2.5-1.5B: 9.2M parameters, 0.6 % of the model), rank 0 writes PEFT's adapter dir, every server loads it under a new
name (`/load_lora_adapter`), the client's requests name it from then on (`lora_path`), the
servers are stamped with the new `weight_version`, and the previous adapter is unloaded. The
engines serve the base model throughout (a resumed run's engines start from the base too and get
the checkpoint's adapter in the first push). Needs engines with LoRA serving: SGLang started with
`--enable-lora --max-lora-rank R --lora-target-modules …` (agentrl adds them to the servers it
starts) or the dev server. `sync=auto` takes this path when every server serves LoRA and falls back
to merged weights (the `weight_sync.method` transport) when one does not; `sync=adapter` makes
that an error. The adapter dir is read by the servers: same host, or `weight_sync.disk_dir` on a
file system they share.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from agentrl.engine import EngineClient, EngineConfig
from agentrl.learner import LoraConfig, fsdp, lora
from agentrl.learner.sync.base import Transport, WeightSyncError

log = logging.getLogger(__name__)

FIX = (
    "start SGLang with --enable-lora --max-lora-rank R --lora-target-modules all (and, colocated "
    "with --enable-memory-saver, --enable-weights-cpu-backup; agentrl does for servers it "
    "starts), or push merged weights with learner.lora.sync=merged"
)


def planned_mode(lora_cfg: LoraConfig, engine: EngineConfig) -> str | None:
    """None: no LoRA; else 'adapter' or 'merged', or 'ask' (auto with servers we do not start:
    `resolve_mode` asks them)."""
    if lora_cfg.rank == 0:
        return None
    if lora_cfg.sync != "auto":
        return lora_cfg.sync
    return "ask" if engine.urls else "adapter"


async def servers_without_lora(engine: EngineClient, colocate: bool = False) -> list[str]:
    """The servers whose server_info does not say `enable_lora` (SGLang's and the dev server's
    do when they serve adapters); colocated, also those that release their weights with the
    memory saver but keep no host copy (`enable_weights_cpu_backup`): their base comes back
    as garbage after the learner's turn, and an adapter push never rewrites it."""
    infos = await engine.control.server_info()
    return [
        u
        for u, i in zip(engine.urls, infos, strict=True)
        if not i.get("enable_lora")
        or (colocate and i.get("enable_memory_saver") and not i.get("enable_weights_cpu_backup"))
    ]


async def resolve_mode(
    planned: str | None, engine: EngineClient, colocate: bool = False
) -> str | None:
    """`planned_mode`'s 'ask', answered by the servers; colocated servers agentrl did not start
    are checked for a host copy of the base weights (adapter: an error without one)."""
    if planned not in ("ask", "adapter") or (planned == "adapter" and not colocate):
        return planned
    without = await servers_without_lora(engine, colocate)
    if without and planned == "adapter":
        raise WeightSyncError(f"learner.lora.sync=adapter: {without} cannot serve adapters "
                              f"colocated; {FIX}")  # fmt: skip
    if without:
        log.warning("learner.lora.sync=auto: %s serve no LoRA adapters; pushing merged weights "
                    "(%s)", without, FIX)  # fmt: skip
        return "merged"
    return "adapter"


def sglang_args(lora_cfg: LoraConfig, extra_args: list[str], colocate: bool = False) -> list[str]:
    """The launch flags SGLang needs to load adapters of this rank and these targets at run time
    (none if the user's engine.extra_args already enable LoRA). Colocated, the engine releases
    its weights' memory while the learner trains, and an adapter push never rewrites the base:
    `--enable-weights-cpu-backup` keeps a host copy that comes back on resume (without it the
    base came back as whatever the learner left in that memory: an H100 run served the trainer's
    model 0.69 nats per token off, against 0.002 with the copy)."""
    out = []
    if "--enable-lora" not in extra_args:
        t = lora_cfg.target_modules
        targets = ["all"] if t == "all-linear" else ([t] if isinstance(t, str) else list(t))
        out += ["--enable-lora", "--max-lora-rank", str(lora_cfg.rank),
                "--lora-target-modules", *targets]  # fmt: skip
    if colocate and "--enable-weights-cpu-backup" not in extra_args:
        out.append("--enable-weights-cpu-backup")
    return out


class AdapterSync(Transport):
    """Not a weight_sync.method of its own: learner.lora.sync picks it."""

    summary = "writes PEFT's adapter dir the servers load"
    shared_filesystem = True

    class Rank(Transport.Rank):
        def write(self, path: str, dtype: str) -> int:
            """Collective: every rank gathers the adapters; rank 0 writes PEFT's dir. Returns the
            bytes written."""
            w = self.worker
            tensors = fsdp.gather_adapters(w.model, getattr(torch, dtype))
            if w.rank == 0:
                lora.save_adapter_files(tensors, w.model, path)
            return sum(t.numel() * t.element_size() for t in tensors.values())

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.root: Path | None = None
        self.pushes = 0
        self.dtype = "float32"

    async def setup(self) -> None:
        self.dtype = self.learner.model_dtype() if self.cfg.dtype == "auto" else self.cfg.dtype
        if without := await servers_without_lora(self.engine):
            raise WeightSyncError(
                f"learner.lora.sync=adapter: {without} serve no LoRA adapters; {FIX}"
            )
        self.root = self._work_dir("agentrl-adapters")

    async def push(self, version: str) -> dict[str, float]:
        if self.root is None:
            await self.setup()
        assert self.root is not None
        t0 = time.perf_counter()
        self.pushes += 1
        name = f"agentrl-v{version}-{self.pushes}"  # a restarted server's push reuses a version
        path = self.root / name
        sizes = await asyncio.to_thread(self.ranks, AdapterSync.Rank.write, str(path), self.dtype)
        self.total_bytes = sizes[0]
        t_write = time.perf_counter() - t0
        await self.serve(name, path, version)
        for stale in self.root.glob("agentrl-v*"):
            if stale != path:
                shutil.rmtree(stale, ignore_errors=True)
        self.version = version
        out = self._metrics(time.perf_counter() - t0)
        return {**out, "sync/buckets": 1.0, "sync/write_seconds": t_write}

    async def serve(self, name: str, path: Path, version: str) -> None:
        """Every server loads the adapter dir `path` as `name`; requests name it from now on; the
        servers say `version`; the previous adapter is unloaded. A resumed run calls this with
        its checkpoint's adapter/ dir before the first rollout."""
        try:
            await self.engine.control.load_lora_adapter(name, str(path))
        except Exception as e:
            raise WeightSyncError(
                f"adapter v{version}: a server could not load {path} ({e}); the servers must see "
                "the learner's files (same host, or weight_sync.disk_dir on a shared file system)"
            ) from e
        old, self.engine.gen.lora = self.engine.gen.lora, name
        await self.engine.control.update_weight_version(version, abort_all_requests=False)
        if old is not None:
            try:
                await self.engine.control.unload_lora_adapter(old)
            except Exception as e:  # a restarted server never had it; the rest hold a spare
                log.warning("unloading LoRA adapter %s: %s", old, e)

    async def close(self) -> None:
        if self.root is not None and self.cfg.disk_dir is None:
            shutil.rmtree(self.root, ignore_errors=True)
