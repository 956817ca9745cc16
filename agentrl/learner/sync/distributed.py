"""`weight_sync.method=distributed`: broadcast over a trainer+servers process group (SGLang's
`update_weights_from_distributed`). gloo on CPU, NCCL on GPU.

Learner rank 0 is rank 0 of the group and hosts its store on `master_address` (by default its
Ray node's address: loopback on the local Ray, the node's own across a cluster); each server joins with `/init_weights_update_group` (once). Per push and bucket, every
learner rank gathers the bucket's full tensors, rank 0 broadcasts them in order, while the
servers get `/update_weights_from_distributed` (names, dtypes, shapes) and receive them. The last
bucket stamps the servers with the new weight version. The weights go from rank 0 straight to the
servers; the driver sends only what it planned itself (the names, dtypes and shapes).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import torch
import torch.distributed as dist

from agentrl import moe
from agentrl.learner import fsdp
from agentrl.learner.fsdp import ParamSpec
from agentrl.learner.sync.base import SYNC_METHODS, Transport, WeightSyncError, await_ref
from agentrl.learner.update_group import bind_listen_socket, init_update_group
from agentrl.tool import gather_all


@SYNC_METHODS.register("distributed")
class DistributedSync(Transport):
    summary = "broadcasts over a process group the servers join"
    needs_nccl_group = True  # on GPUs: NCCL, which cannot put two ranks on one GPU

    class Rank(Transport.Rank):
        def __init__(self, worker: Any) -> None:
            super().__init__(worker)
            self.groups: dict[str, Any] = {}
            self.socks: dict[str, Any] = {}

        def prepare(self, group_name: str, master_address: str) -> tuple[str, int]:
            """Rank 0: bind the group's store socket on `master_address` (auto: this node's
            address); returns the address and port."""
            if self.worker.rank != 0:
                return "", 0
            if master_address == "auto":
                master_address = self.worker.node()["ip"]
            sock = bind_listen_socket(master_address)
            self.socks[group_name] = sock
            return master_address, sock.getsockname()[1]

        def join(self, group_name: str, addr: str, port: int, world: int, backend: str,
                 timeout_s: float) -> None:  # fmt: skip
            """Rank 0 joins as rank 0 of the trainer→engines group (blocks until all joined)."""
            if self.worker.rank != 0:
                return
            self.groups[group_name] = init_update_group(
                addr, port, 0, world, group_name, backend, timeout_s, self.socks.get(group_name)
            )

        def broadcast(self, buckets: list[list[ParamSpec]], group_name: str) -> float:
            """Collective over the learner: gather each bucket; rank 0 broadcasts every tensor,
            in bucket order, to the engines' group. Returns the seconds spent."""
            w = self.worker
            t0 = time.perf_counter()
            pg = self.groups.get(group_name)
            if w.rank == 0 and pg is None:
                raise RuntimeError(f"weight-update group {group_name!r} is not initialised")
            on_gpu = w.device_type == "cuda"
            for bucket in buckets:
                tensors = fsdp.gather_full(w.model, bucket, w.rank, w.device if on_gpu else None)
                # in a checkpoint's names and order (experts one by one: moe.py), as announced
                for _, t in moe.to_checkpoint(tensors.items()) if w.rank == 0 else ():
                    dist.broadcast(t.contiguous(), group=pg, group_src=0)
            if on_gpu:
                torch.cuda.synchronize()
            return time.perf_counter() - t0

        def leave(self, group_name: str) -> None:
            pg = self.groups.pop(group_name, None)
            if pg is not None:
                dist.destroy_process_group(pg)
            sock = self.socks.pop(group_name, None)
            if sock is not None:
                sock.close()

        def close(self) -> None:
            for name in list(self.groups) + list(self.socks):
                self.leave(name)

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.ready = False

    async def setup(self) -> None:
        self._plan()
        backend = self.cfg.backend
        if backend == "auto":
            backend = "nccl" if self.learner.cfg.resolved_device() == "cuda" else "gloo"
        name = self.cfg.group_name
        addr, port = self.learner.on_rank0(
            self.Rank, DistributedSync.Rank.prepare, name, self.cfg.master_address
        )
        world = 1 + len(self.engine.urls) * self.cfg.ranks_per_server
        trainer = self.learner.on_rank0_async(
            self.Rank, DistributedSync.Rank.join, name, addr, port, world, backend,
            self.cfg.timeout_s,
        )  # fmt: skip
        servers = self.engine.control.init_weights_update_group(
            addr, port, group_name=name, backend=backend,
            ranks_per_server=self.cfg.ranks_per_server,
        )  # fmt: skip
        try:
            await asyncio.wait_for(
                gather_all([await_ref(trainer), servers]), timeout=self.cfg.timeout_s
            )
        except Exception as e:
            raise WeightSyncError(
                f"weight-update group {name!r} did not form at {addr}:{port} with "
                f"{', '.join(self.engine.urls)} ({type(e).__name__}: {e}); check that the servers "
                f"can reach {addr} and support backend={backend}, or use weight_sync.method=disk"
            ) from e
        self.ready = True

    async def push(self, version: str) -> dict[str, float]:
        if not self.ready:
            await self.setup()
        t0 = time.perf_counter()
        refs = self.learner.on_ranks_async(
            self.Rank, DistributedSync.Rank.broadcast, self.buckets, self.cfg.group_name
        )
        try:
            for i, bucket in enumerate(self.buckets):
                last = i == len(self.buckets) - 1
                named = [(n, shape, s.dtype) for s in bucket
                         for n, shape in moe.checkpoint_shapes(s.name, s.shape)]  # fmt: skip
                request = self.engine.control.update_weights_from_distributed(
                    [n for n, _, _ in named],
                    [d for _, _, d in named],
                    [list(shape) for _, shape, _ in named],
                    group_name=self.cfg.group_name,
                    weight_version=version if last else None,
                    flush_cache=last,
                )
                await asyncio.wait_for(request, timeout=self.cfg.timeout_s)
        except Exception as e:
            raise WeightSyncError(
                f"weights v{version}: a server failed during the broadcast ({e}); the group is "
                "now unusable: restart the servers and the learner, or use weight_sync.method=disk"
            ) from e
        await gather_all(await_ref(r) for r in refs)  # one rank fails: the others' waits end
        self.version = version
        return self._metrics(time.perf_counter() - t0)

    async def close(self) -> None:
        """Leave the group on both sides. Best effort, bounded: after a failed push rank 0 may
        still be blocked in its broadcast (until the group's timeout)."""
        if self.ready:
            self.ready = False
            name = self.cfg.group_name
            worker = self.learner.on_rank0_async(self.Rank, DistributedSync.Rank.leave, name)
            await asyncio.gather(
                asyncio.wait_for(
                    self.engine.control.destroy_weights_update_group(name), timeout=30
                ),
                asyncio.wait_for(await_ref(worker), timeout=30),
                return_exceptions=True,
            )
