"""`weight_sync.method=disk`: learner rank 0 writes a transformers dir (safetensors, one shard per
bucket) under `disk_dir/v<version>` (every rank gathers with it: `DiskSync.Rank.write`), then every
server reloads it with `/update_weights_from_disk` (the driver sends the path, nothing else).
Needs a file system the servers see; the slowest transport, and the one that works wherever the
others do not."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from agentrl.learner.fsdp import ParamSpec
from agentrl.learner.sync.base import SYNC_METHODS, Transport, WeightSyncError


@SYNC_METHODS.register("disk")
class DiskSync(Transport):
    summary = "writes a transformers dir the servers load"
    shared_filesystem = True  # the servers read what learner rank 0 writes

    class Rank(Transport.Rank):
        def write(self, out_dir: str, buckets: list[list[ParamSpec]]) -> None:
            """Collective: every rank gathers each bucket; rank 0 writes it as a shard."""
            self.worker.save_hf(out_dir, buckets, copy_aux=False)

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.root: Path | None = None

    async def setup(self) -> None:
        self._plan()
        self.root = self._work_dir("agentrl-weights")

    async def push(self, version: str) -> dict[str, float]:
        if self.root is None:
            await self.setup()
        assert self.root is not None
        t0 = time.perf_counter()
        final = self.root / f"v{version}"
        tmp = self.root / f".v{version}-{uuid.uuid4().hex[:8]}"
        # rank 0 writes; the others gather with it
        await asyncio.to_thread(self.ranks, DiskSync.Rank.write, str(tmp), self.buckets)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        t_write = time.perf_counter() - t0
        try:
            await self.engine.control.update_weights_from_disk(str(final), weight_version=version)
        except Exception as e:
            raise WeightSyncError(
                f"weights v{version}: a server could not load {final} ({e}); the servers must "
                "see the same file system as the learner (weight_sync.disk_dir)"
            ) from e
        for old in self.root.glob("v*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
        self.version = version
        return {**self._metrics(time.perf_counter() - t0), "sync/write_seconds": t_write}

    async def close(self) -> None:
        if self.root is not None and self.cfg.disk_dir is None:
            shutil.rmtree(self.root, ignore_errors=True)
