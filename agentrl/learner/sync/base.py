"""What every weight-sync transport shares: its settings, its registry, and the 30-line base.

A transport moves the policy's full weights to the rollout engines after an optimizer step. It is
one class with two halves, in one file under `agentrl/learner/sync/`:

- the driver half (`setup`, `push(version)`, `close`), in the trainer process: it asks the learner
  group to gather and send, and tells the engines what arrives (SGLang's HTTP protocol);
- the rank half (`Transport.Rank`), one instance inside every learner rank, created on first use:
  the driver reaches it with `learner.call("sync_call", name, "method", ...)` (every rank, a
  collective such as gathering a bucket) or `learner.call_rank0(...)`.

Adding a transport is one new module here (plus its import in `__init__.py`), or none at all: a
class anywhere, named in the config by import path (`weight_sync.method=my_pkg.sync:MySync`).
"""

from __future__ import annotations

import math
import os
import uuid
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import ray
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentrl.engine import EngineClient
from agentrl.learner import LearnerConfig
from agentrl.learner.fsdp import ParamSpec
from agentrl.registry import Registry

SYNC_METHODS: Registry[type[Transport]] = Registry("weight-sync method", "weight_sync.method")


class WeightSyncConfig(BaseModel):
    """`weight_sync` in the config."""

    model_config = ConfigDict(extra="forbid")

    method: str = Field(
        "distributed", description="distributed | disk | tensor, or an import path module:Class"
    )
    bucket_mb: float | Literal["auto"] = Field(
        "auto",
        description="gathered and sent per bucket; auto: the method's own (tensor 4096: one "
        "request per 2B bf16 parameters, each server request costs ~5 ms, the bucket is a "
        "transient GPU buffer; distributed and disk 256)",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="dtype sent to the engines; auto: the model checkpoint's dtype"
    )
    backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="auto: nccl on GPU")
    master_address: str = Field(
        "auto",
        description="where learner rank 0 listens for the engines; auto: its Ray node's address "
        "(127.0.0.1 on the local loopback Ray)",
    )
    group_name: str = "weight_update_group"
    ranks_per_server: int = Field(1, ge=1, description="an SGLang server's TP size")
    disk_dir: str | None = Field(None, description="disk: where versions are written")
    load_format: Literal["auto", "direct", "flattened_bucket"] = Field(
        "auto",
        description="tensor: direct = fused SGLang names, copied straight into the parameters "
        "(Llama/Qwen layouts; at TP > 1 each TP rank gets only its own slices); "
        "flattened_bucket = the model's own load_weights; auto: direct, falling back to "
        "flattened_bucket if the server rejects it",
    )
    timeout_s: float = Field(600.0, gt=0, description="forming the group; one broadcast")

    @field_validator("method")
    @classmethod
    def _known(cls, v: str) -> str:
        return SYNC_METHODS.check(v)

    @field_validator("bucket_mb")
    @classmethod
    def _positive(cls, v: float | str) -> float | str:
        if v != "auto" and not v > 0:
            raise ValueError(f"weight_sync.bucket_mb must be > 0 or auto, got {v}")
        return v


class WeightSyncError(RuntimeError):
    """A push that did not reach every server; the message names the server and what to do."""


class Learner(Protocol):
    """What a transport needs of the policy's `LearnerGroup` (agentrl/learner/group.py)."""

    cfg: LearnerConfig
    workers: list[Any]

    def call(self, method: str, *args: Any) -> list[Any]: ...
    def call_async(self, method: str, *args: Any) -> list[Any]: ...
    def call_rank0(self, method: str, *args: Any) -> Any: ...
    def model_dtype(self) -> str: ...
    def buckets(self, bucket_mb: float, dtype: str | None = None) -> list[list[ParamSpec]]: ...


class Transport:
    """Base of the transports. Subclasses set `name` (what `learner.call("sync_call", …)` resolves
    in the worker: a registered name or an import path) and implement `push`."""

    name: ClassVar[str] = ""
    default_bucket_mb: ClassVar[float] = 256.0  # weight_sync.bucket_mb=auto

    class Rank:
        """The rank half: state kept inside one learner worker (e.g. a process group)."""

        def __init__(self, worker: Any) -> None:
            self.worker = worker  # the LearnerWorker: .model, .rank, .device, .world_size

        def close(self) -> None:
            return None

    def __init__(self, cfg: WeightSyncConfig, learner: Learner, engine: EngineClient) -> None:
        self.cfg, self.learner, self.engine = cfg, learner, engine
        # per server, the GPU ids it computes on, when this run started the servers on this
        # host (Fleet.gpus; None otherwise): a colocated push packs on the ranks beside them
        self.server_gpus: list[list[str]] | None = None
        self.buckets: list[list[ParamSpec]] = []
        self.total_bytes = self.total_params = 0
        self.version: str | None = None

    async def setup(self) -> None:
        self._plan()

    @property
    def bucket_mb(self) -> float:
        """weight_sync.bucket_mb, auto resolved to this method's own."""
        b = self.cfg.bucket_mb
        return self.default_bucket_mb if b == "auto" else float(b)

    async def push(self, version: str) -> dict[str, float]:
        """Send the current weights; stamp the engines with `version`; return `sync/*` metrics."""
        raise NotImplementedError

    async def close(self) -> None:
        return None

    def rank_call(self, method: str, *args: Any) -> list[Any]:
        """Run `Rank.method(*args)` on every learner rank (blocking); their results."""
        return self.learner.call("sync_call", self.name, method, *args)

    def _plan(self) -> None:
        dtype = self.learner.model_dtype() if self.cfg.dtype == "auto" else self.cfg.dtype
        self.buckets = self.learner.buckets(self.bucket_mb, dtype)
        self.total_bytes = sum(s.nbytes for b in self.buckets for s in b)
        self.total_params = sum(math.prod(s.shape) for b in self.buckets for s in b)

    def _work_dir(self, prefix: str) -> Path:
        """Where rank 0 writes what the servers read: weight_sync.disk_dir, or a fresh dir under
        $TMPDIR (`close` removes that one)."""
        root = self.cfg.disk_dir or os.path.join(
            os.environ.get("TMPDIR", "/tmp"), f"{prefix}-{uuid.uuid4().hex[:8]}"
        )
        Path(root).mkdir(parents=True, exist_ok=True)
        return Path(root)

    def _metrics(self, seconds: float) -> dict[str, float]:
        mb = self.total_bytes / 2**20
        return {
            "sync/seconds": seconds,
            "sync/mb": mb,
            "sync/s_per_mb": seconds / mb if mb else 0.0,
            "sync/buckets": float(len(self.buckets)),
        }


async def await_ref(ref: Any) -> Any:
    """Await a Ray ObjectRef, re-raising the task's own exception."""
    try:
        return await ref
    except ray.exceptions.RayTaskError as e:
        raise e.as_instanceof_cause() from None
