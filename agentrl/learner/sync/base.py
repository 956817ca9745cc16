"""What every weight-sync transport shares: its settings, its registry, and the base class.

A transport moves the policy's full weights to the rollout engines after an optimizer step. It is
one class with two halves, in one file under `agentrl/learner/sync/`:

- the rank half (`Transport.Rank`), one instance inside every learner rank (a Ray actor), created
  on first use and kept by its class: the weights leave from here. It gathers the FSDP shards
  (a collective) and sends them itself: a broadcast (distributed), files (disk), or its own
  HTTP request to the server on its GPU (tensor: CUDA-IPC handles, `agentrl.engine.post_each`);
- the driver half (`setup`, `push(version)`, `close`), in the trainer process, only orders the
  steps: it runs the rank half's methods and tells the engines what they need to know (SGLang's
  HTTP protocol through `engine.control`: memory, versions, cache, the names of a broadcast).

The driver runs a rank method by reference, never by its name, so a type checker follows the
call and its arguments:

    self.ranks(TensorSync.Rank.gpu_id)                 # every rank; their results
    self.learner.on_rank0(self.Rank, DistributedSync.Rank.prepare, name, address)

Each transport states what it needs of the deployment as class attributes (`same_host`,
`shared_filesystem`, `needs_nccl_group`, `gpu_only`); the config and the run check those of the
resolved class, never the method's name.

Adding a transport is one new module here (plus its import in `__init__.py`), or none at all: a
class anywhere, named in the config by import path (`weight_sync.method=my_pkg.sync:MySync`).
"""

from __future__ import annotations

import math
import os
import typing
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Concatenate, Literal, Protocol, TypeVar

import ray
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentrl.engine import EngineClient
from agentrl.learner import LearnerConfig
from agentrl.learner.fsdp import ParamSpec
from agentrl.registry import Registry

if TYPE_CHECKING:
    from agentrl.learner.worker import LearnerWorker

P = typing.ParamSpec("P")  # not fsdp.ParamSpec: a function's parameters
T = TypeVar("T")
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
        found = SYNC_METHODS.get(SYNC_METHODS.check(v))
        if not (isinstance(found, type) and issubclass(found, Transport)):
            raise ValueError(  # its requirements (`same_host`, ...) are read from the class
                f"weight_sync.method={v!r} is not a subclass of agentrl.weight_sync.Transport"
            )
        return v

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
    world_size: int

    def on_ranks(
        self, cls: type[Any], fn: Callable[Concatenate[Any, P], T], *args: P.args
    ) -> list[T]: ...
    def on_ranks_async(
        self, cls: type[Any], fn: Callable[Concatenate[Any, P], T], *args: P.args
    ) -> list[Any]: ...
    def on_rank0(
        self, cls: type[Any], fn: Callable[Concatenate[Any, P], T], *args: P.args
    ) -> T: ...
    def on_rank0_async(
        self, cls: type[Any], fn: Callable[Concatenate[Any, P], T], *args: P.args
    ) -> Any: ...
    def model_dtype(self) -> str: ...
    def buckets(self, bucket_mb: float, dtype: str | None = None) -> list[list[ParamSpec]]: ...


class Transport:
    """Base of the transports. Subclasses implement `push`, define their `Rank` half when they
    need state in the ranks, and say what they need of the deployment (checked by the config
    and the run before anything starts)."""

    default_bucket_mb: ClassVar[float] = 256.0  # weight_sync.bucket_mb=auto
    # what the transport does, for errors that name a requirement ("hands CUDA-IPC handles ...")
    summary: ClassVar[str] = "sends the weights"
    same_host: ClassVar[bool] = False  # the servers must run on the learner's host
    shared_filesystem: ClassVar[bool] = False  # the servers read files the learner writes
    needs_nccl_group: ClassVar[bool] = False  # a process group with the servers (NCCL on GPU)
    gpu_only: ClassVar[bool] = False  # the learner must run on CUDA

    class Rank:
        """The rank half: state kept inside one learner worker (e.g. a process group)."""

        def __init__(self, worker: LearnerWorker) -> None:
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

    def ranks(self, fn: Callable[Concatenate[Any, P], T], *args: P.args) -> list[T]:
        """`fn(state, *args)` on every learner rank (blocking), `state` the rank's instance of
        this transport's `Rank` and `fn` one of its methods (`MySync.Rank.bucket`); the results
        in rank order."""
        return self.learner.on_ranks(self.Rank, fn, *args)

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
