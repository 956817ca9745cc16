"""Trainer → rollout engines: push the policy's full weights after each optimizer step.

Methods, by name (the key is exactly `weight_sync.method`):

    distributed  a weight-update process group (SGLang's protocol): learner rank 0 is rank 0, each
                 server joins with `/init_weights_update_group` (once); per bucket, the servers get
                 `/update_weights_from_distributed` (names, dtypes, shapes) while rank 0 broadcasts
                 the tensors in that order. gloo on CPU, NCCL on GPU.
    disk         rank 0 writes a transformers dir (safetensors, one shard per bucket) under
                 `disk_dir/v<version>`, then every server gets `/update_weights_from_disk`.
    tensor       colocated GPUs: each bucket is flattened into one CUDA tensor whose IPC handle
                 goes to `/update_weights_from_tensor` (load_format="flattened_bucket").

Both gather the FSDP shards bucket by bucket (`bucket_mb`), so no process holds more than one
bucket of full tensors beyond its shard, and both stamp the servers with the new `weight_version`
(on the last bucket), which every later Completion carries.

    sync = make_weight_sync(WeightSyncConfig(method="distributed"), policy_group, engine_client)
    await sync.setup()                     # joins the group (distributed); no-op for disk
    metrics = await sync.push(version="3") # after optimizer step 3
    await sync.close()

Adding a method: a class with async setup/push/close, decorated `@register("name")`.
The trainer side of the group binds its store socket to `master_address` (127.0.0.1 by default),
never to all interfaces.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

if TYPE_CHECKING:
    from agentrl.engine import EngineClient
    from agentrl.learner.fsdp import ParamSpec
    from agentrl.learner.group import LearnerGroup

log = logging.getLogger(__name__)

_METHODS: dict[str, type] = {}


def register(name: str) -> Callable[[type], type]:
    def deco(cls: type) -> type:
        _METHODS[name] = cls
        return cls

    return deco


def known_methods() -> list[str]:
    return sorted(_METHODS)


class WeightSyncConfig(BaseModel):
    """`weight_sync` in the config."""

    model_config = ConfigDict(extra="forbid")

    method: str = Field("distributed", description="distributed | disk")
    bucket_mb: float = Field(256.0, gt=0, description="gathered and sent per bucket")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="dtype sent to the engines; auto: the model checkpoint's dtype"
    )
    backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="auto: nccl on GPU")
    master_address: str = Field("127.0.0.1", description="where learner rank 0 listens")
    group_name: str = "weight_update_group"
    ranks_per_server: int = Field(1, ge=1, description="an SGLang server's TP size")
    disk_dir: str | None = Field(None, description="disk: where versions are written")
    load_format: Literal["auto", "direct", "flattened_bucket"] = Field(
        "auto",
        description="tensor: direct = fused SGLang names, copied straight into the parameters "
        "(Llama/Qwen layouts, TP 1); flattened_bucket = the model's own load_weights; auto: "
        "direct, falling back to flattened_bucket if the server rejects it",
    )
    timeout_s: float = Field(600.0, gt=0, description="forming the group; one broadcast")

    @field_validator("method")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in _METHODS:
            raise ValueError(
                f"unknown weight_sync.method {v!r}; known: {', '.join(known_methods())}"
            )
        return v


class WeightSyncError(RuntimeError):
    """A push that did not reach every server; the message names the server and what to do."""


def make_weight_sync(cfg: WeightSyncConfig, learner: LearnerGroup, engine: EngineClient) -> Any:
    return _METHODS[cfg.method](cfg, learner, engine)


class _Base:
    def __init__(self, cfg: WeightSyncConfig, learner: LearnerGroup, engine: EngineClient):
        self.cfg, self.learner, self.engine = cfg, learner, engine
        self.buckets: list[list[ParamSpec]] = []
        self.version: str | None = None

    def _plan(self) -> None:
        dtype = self.learner.model_dtype() if self.cfg.dtype == "auto" else self.cfg.dtype
        self.buckets = self.learner.buckets(self.cfg.bucket_mb, dtype)
        self.total_bytes = sum(s.nbytes for b in self.buckets for s in b)
        self.total_params = sum(math.prod(s.shape) for b in self.buckets for s in b)

    def _metrics(self, seconds: float) -> dict[str, float]:
        mb = self.total_bytes / 2**20
        return {
            "sync/seconds": seconds,
            "sync/mb": mb,
            "sync/s_per_mb": seconds / mb if mb else 0.0,
            "sync/buckets": float(len(self.buckets)),
        }

    async def close(self) -> None:
        return None


@register("distributed")
class DistributedSync(_Base):
    """Broadcast over a trainer+servers process group (SGLang `update_weights_from_distributed`)."""

    async def setup(self) -> None:
        self._plan()
        backend = self.cfg.backend
        if backend == "auto":
            backend = "nccl" if self.learner.cfg.resolved_device() == "cuda" else "gloo"
        name, addr = self.cfg.group_name, self.cfg.master_address
        port = self.learner.call_rank0("prepare_weight_update_group", name, addr)
        world = 1 + len(self.engine.urls) * self.cfg.ranks_per_server
        trainer = self.learner.workers[0].init_weight_update_group.remote(
            name, addr, port, world, backend, self.cfg.timeout_s
        )
        servers = self.engine.init_weights_update_group(
            addr, port, group_name=name, backend=backend,
            ranks_per_server=self.cfg.ranks_per_server,
        )  # fmt: skip
        try:
            await asyncio.wait_for(
                asyncio.gather(_await_ref(trainer), servers), timeout=self.cfg.timeout_s
            )
        except Exception as e:
            raise WeightSyncError(
                f"weight-update group {name!r} did not form at {addr}:{port} with "
                f"{', '.join(self.engine.urls)} ({type(e).__name__}: {e}); check that the servers "
                f"can reach {addr} and support backend={backend}, or use weight_sync.method=disk"
            ) from e
        self._ready = True

    async def push(self, version: str) -> dict[str, float]:
        if not getattr(self, "_ready", False):
            await self.setup()
        t0 = time.perf_counter()
        refs = self.learner.call_async("broadcast_weights", self.buckets, self.cfg.group_name)
        try:
            for i, bucket in enumerate(self.buckets):
                last = i == len(self.buckets) - 1
                request = self.engine.update_weights_from_distributed(
                    [s.name for s in bucket],
                    [s.dtype for s in bucket],
                    [list(s.shape) for s in bucket],
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
        await asyncio.gather(*(_await_ref(r) for r in refs))
        self.version = version
        return self._metrics(time.perf_counter() - t0)

    async def close(self) -> None:
        """Leave the group on both sides. Best effort, bounded: after a failed push rank 0 may
        still be blocked in its broadcast (until the group's timeout)."""
        if getattr(self, "_ready", False):
            self._ready = False
            worker = self.learner.workers[0].destroy_weight_update_group.remote(self.cfg.group_name)
            await asyncio.gather(
                asyncio.wait_for(
                    self.engine.destroy_weights_update_group(self.cfg.group_name), timeout=30
                ),
                asyncio.wait_for(_await_ref(worker), timeout=30),
                return_exceptions=True,
            )


@register("disk")
class DiskSync(_Base):
    """Write a transformers dir per version; servers reload it (`update_weights_from_disk`)."""

    async def setup(self) -> None:
        self._plan()
        root = self.cfg.disk_dir or os.path.join(
            os.environ.get("TMPDIR", "/tmp"), f"agentrl-weights-{uuid.uuid4().hex[:8]}"
        )
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    async def push(self, version: str) -> dict[str, float]:
        if not hasattr(self, "root"):
            await self.setup()
        t0 = time.perf_counter()
        final = self.root / f"v{version}"
        tmp = self.root / f".v{version}-{uuid.uuid4().hex[:8]}"
        await asyncio.to_thread(
            self.learner.call, "save_hf", str(tmp), self.buckets, False
        )  # rank 0 writes; others gather with it
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        t_write = time.perf_counter() - t0
        try:
            await self.engine.update_weights_from_disk(str(final), weight_version=version)
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
        if hasattr(self, "root") and self.cfg.disk_dir is None:
            shutil.rmtree(self.root, ignore_errors=True)


@register("tensor")
class TensorSync(_Base):
    """Colocated GPUs: CUDA-IPC handles of the full weights, one buffer per bucket and request
    (SGLang `/update_weights_from_tensor`). `load_format` picks how the server loads them (see
    agentrl/learner/ipc.py): `direct` copies fused tensors straight into its parameters, about
    twice as fast as `flattened_bucket`, which runs the model's `load_weights`. The learner and
    the servers must share the host (and, for speed, the GPU)."""

    async def setup(self) -> None:
        if self.learner.cfg.resolved_device() != "cuda":
            raise WeightSyncError(
                "weight_sync.method=tensor shares CUDA memory and needs the learner on a GPU; "
                "use weight_sync.method=distributed (or disk) on CPU"
            )
        self._plan()
        fmt, self.groups = self.cfg.load_format, []
        if fmt == "direct" or (fmt == "auto" and self.cfg.ranks_per_server == 1):
            self.buckets, self.groups = plan_direct(
                [s for b in self.buckets for s in b], self.cfg.bucket_mb
            )

    async def push(self, version: str) -> dict[str, float]:
        if not self.buckets:
            await self.setup()
        t0 = time.perf_counter()
        try:
            await self._send(version)
        except WeightSyncError as e:
            if not (self.cfg.load_format == "auto" and self.groups):
                raise
            log.warning("direct weight load rejected (%s); using flattened_bucket from now on", e)
            self.groups = []
            self._plan()
            await self._send(version)  # every parameter again: the model's own loader
        self.version = version
        return {
            **self._metrics(time.perf_counter() - t0),
            "sync/direct": float(bool(self.groups)),
            "sync/learner_s": self.learner_s,  # gather + pack + IPC handles (learner rank 0)
            "sync/engine_s": self.engine_s,  # the servers' update requests
        }

    async def _send(self, version: str) -> None:
        self.learner_s = self.engine_s = 0.0
        for i, bucket in enumerate(self.buckets):
            last = i == len(self.buckets) - 1
            direct = bool(self.groups) and self.groups[i] is not None
            fmt = "direct" if direct else "flattened_bucket"
            if direct:
                call = ("ipc_direct_bucket", bucket, self.groups[i])
            else:
                call = ("ipc_bucket", bucket)
            t0 = time.perf_counter()
            payload = (await asyncio.to_thread(self.learner.call, *call))[0]
            t1 = time.perf_counter()
            try:
                await self.engine.update_weights_from_tensor(
                    [payload] * self.cfg.ranks_per_server,
                    weight_version=version if last else None,
                    load_format=fmt,
                    flush_cache=last,
                )
            except Exception as e:
                raise WeightSyncError(
                    f"weights v{version}: a server rejected bucket {i} over CUDA IPC "
                    f"(load_format={fmt}: {e}); the servers must run on this host's GPUs "
                    "(or use weight_sync.method=distributed)"
                ) from e
            finally:
                # the server has copied the bucket: drop the buffer. Not awaited: the actor runs
                # calls in order, so it is freed before the next bucket or anything else
                self.learner.call_async("release_ipc")
            self.learner_s += t1 - t0
            self.engine_s += time.perf_counter() - t1


def plan_direct(specs: list[ParamSpec], bucket_mb: float) -> tuple[list[list], list]:
    """(buckets of specs, per bucket its fused groups or None) for `TensorSync` in `direct`
    format. A fused group (agentrl/learner/ipc.py) is never split across requests. Vocabulary-
    sized tensors (embeddings, lm_head) whose vocabulary the engine pads (SGLang: up to a multiple
    of `VOCAB_PAD`) come first, in a bucket of their own (groups None) that the model's own loader
    takes: a direct copy with a mismatched shape kills the server."""
    from agentrl.learner.ipc import direct_groups

    by_name = {s.name: s for s in specs}
    vocab = [n for n, s in by_name.items() if is_vocab_param(n) and s.shape[0] % VOCAB_PAD]
    limit = bucket_mb * 2**20
    buckets: list[list] = [[by_name[n] for n in vocab]] if vocab else []
    groups: list = [None] if vocab else []
    size = limit
    for target, names in direct_groups([n for n in by_name if n not in vocab]):
        nbytes = sum(by_name[n].nbytes for n in names)
        if size + nbytes > limit:
            buckets.append([])
            groups.append([])
            size = 0
        buckets[-1] += [by_name[n] for n in names]
        groups[-1].append((target, names))
        size += nbytes
    return buckets, groups


# SGLang pads the vocabulary dimension (TP 1) up to a multiple of this; a vocabulary that is
# already a multiple (Qwen's 151936) keeps its size and can be copied directly
VOCAB_PAD = 64


def is_vocab_param(name: str) -> bool:
    """Embedding and output-head weights, whose first dimension the engines may pad."""
    return name.endswith(("embed_tokens.weight", "lm_head.weight", "wte.weight"))


async def _await_ref(ref: Any) -> Any:
    """Await a Ray ObjectRef, re-raising the task's own exception."""
    import ray

    try:
        return await ref
    except ray.exceptions.RayTaskError as e:
        raise e.as_instanceof_cause() from None


# -- trainer side of the group (runs in learner rank 0's process) -------------------------------
def bind_listen_socket(address: str) -> socket.socket:
    """A listening TCP socket on `address` (a free port), for the group's store to adopt."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, 0))
    sock.listen(128)
    return sock


def init_update_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str,
    timeout_s: float,
    listen_sock: socket.socket | None = None,
) -> Any:
    """Join a process group beside the default one, as SGLang's servers build it: one TCP store
        (hosted by rank 0), keys prefixed with `group_name`. Rank 0 hosts the store on `listen_sock`
        (bound to `master_address` only) when given; the caller keeps that socket open as long as the
    group lives. Blocks until all `world_size` ranks joined."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import PrefixStore, _new_process_group_helper, _world

    timeout = timedelta(seconds=timeout_s)
    kw: dict[str, Any] = {}
    if rank == 0 and listen_sock is not None:
        kw["master_listen_fd"] = listen_sock.fileno()
    store = dist.TCPStore(master_address, master_port, world_size, rank == 0, timeout=timeout, **kw)
    prefixed = PrefixStore(group_name, store)
    pg = _new_process_group_helper(
        world_size, rank, [], backend, prefixed, group_name=group_name, timeout=timeout
    )
    pg = pg[0] if isinstance(pg, tuple) else pg
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg
