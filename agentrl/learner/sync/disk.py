"""`weight_sync.method=disk`: learner rank 0 writes a transformers dir (safetensors, one shard per
bucket) under `disk_dir/v<version>` (every rank gathers with it), then every server reloads it
with `/update_weights_from_disk`. Needs a file system the servers see; the slowest transport, and
the one that works wherever the others do not."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from pathlib import Path

from agentrl.learner.sync.base import SYNC_METHODS, Transport, WeightSyncError


@SYNC_METHODS.register("disk")
class DiskSync(Transport):
    name = "disk"
    root: Path | None = None

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
        await asyncio.to_thread(self.learner.call, "save_hf", str(tmp), self.buckets, False)
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
