"""The learner group: starts N `LearnerWorker` Ray actors of one role, wires torch.distributed
between them (gloo on CPU, NCCL on GPU) and fans calls out.

    start_ray(RayConfig())                               # loopback only (ray_start.py)
    policy = LearnerGroup(LearnerConfig(model_path=path, num_workers=2), role="policy")
    old_lp = policy.compute_logprobs(per_rank)           # per_rank[r]: rank r's micro-batches
    metrics = policy.train_step(per_rank, "ppo_clip", loss_cfg)
    policy.save_checkpoint(tmp_dir)                      # tmp_dir/model (HF) + tmp_dir/optim
    policy.shutdown()

The ranks' own process group rendezvous through a TCP store that rank 0 binds to its node's
address only (127.0.0.1 on the local Ray), and gloo/NCCL bind to `lo` when that address is
loopback. Joining a cluster (`ray.address`), the ranks may span nodes (`learner.placement`);
docs/ray_cluster.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, TypeVar

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from agentrl.batch import TrainBatch, micro_batches
from agentrl.ckpt import CheckpointError
from agentrl.learner import LearnerConfig, LearnerError, Role
from agentrl.learner.fsdp import ParamSpec, plan_buckets
from agentrl.learner.ray_start import start_ray
from agentrl.learner.worker import LearnerWorker
from agentrl.loss import reduce_metrics
from agentrl.types import ConfigError

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

    Worker = ActorHandle[LearnerWorker]  # a rank: its methods called as `w.method.remote(...)`

log = logging.getLogger(__name__)
P = typing.ParamSpec("P")  # not fsdp.ParamSpec: a function's parameters
T = TypeVar("T")


class LearnerGroup:
    """N FSDP2 ranks of one role. Calls block until every rank answers; errors re-raise here.

    The ranks live in one Ray placement group (a bundle per rank, `learner.placement`), so they
    may span nodes; they rendezvous through a TCP store on rank 0's node address (127.0.0.1 on
    the local loopback Ray)."""

    def __init__(self, cfg: LearnerConfig, role: Role = "policy", name: str | None = None):
        if not cfg.model_path:
            raise LearnerError(f"{role} learner: model_path is empty; set learner.model_path")
        if not ray.is_initialized():
            start_ray()
        self.cfg, self.role, self.world_size = cfg, role, cfg.num_workers
        self.name = name or role
        self.workers: list[Worker] = []
        self.pg = place_ranks(cfg, self.name)
        try:
            on_gpu = cfg.resolved_device() == "cuda"
            self.workers = [
                ray.remote(LearnerWorker)
                .options(
                    num_cpus=cfg.num_cpus_per_worker,
                    num_gpus=cfg.num_gpus_per_worker if on_gpu else 0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=self.pg, placement_group_bundle_index=r
                    ),
                )
                .remote(cfg, role, r, self.world_size)
                for r in range(self.world_size)
            ]
            store = self._get([self.workers[0].bind_store.remote()])[0]
            self.info = self._get([w.setup.remote(store) for w in self.workers])
        except Exception:
            self.shutdown()
            raise
        self._specs: dict[str | None, list[ParamSpec]] = {}
        first = self.info[0]
        # learner.micro_batch_tokens=auto is sized by each rank's GPU: the smallest holds
        self.micro_batch_tokens = min(int(i["micro_batch_tokens"]) for i in self.info)
        log.info(
            "%s learner: %d rank(s) on %s, bf16 %s, activation checkpointing %s, fused kernels %s, "
            "head kernel %s, attention %s, micro-batches of %d tokens%s",
            role, self.world_size, first["device"], first["bf16"], first["checkpointing"],
            first["fused_kernels"], first["head_kernel"], first["attention"],
            self.micro_batch_tokens,
            " (auto)" if cfg.micro_batch_tokens == "auto" else "",
        )  # fmt: skip
        niced = sorted({i["nice"] for i in self.info if i.get("nice", 0) > 0})
        if niced:
            log.warning(
                "%s ranks run at nice %s (the Ray cluster's worker niceness): they lose every CPU "
                "they share with the engine, sandbox or trainer. Start the cluster with "
                "RAY_worker_niceness=0 in its environment",
                role,
                niced,
            )

    def nodes(self) -> list[dict[str, str]]:
        """Per rank: the Ray node id and address it runs on."""
        return self._all(lambda w: w.node.remote())

    # -- fan-out: each call names the worker's method as an attribute, never as a string -------
    def _all(self, call: Callable[[Worker], ObjectRef]) -> list[Any]:
        """`call(worker)` on every rank (e.g. `lambda w: w.offload.remote()`); their results."""
        return self._get([call(w) for w in self.workers])

    def _get(self, refs: list[Any]) -> list[Any]:

        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as e:
            raise LearnerError(f"{self.name} learner worker died: {e}") from e
        except ray.exceptions.RayTaskError as e:
            raise rank_error(e) from None

    def _per_rank(
        self, what: str, per_rank: list[list[Any]], call: Callable[[Worker, list[Any]], ObjectRef]
    ) -> list[Any]:
        """`call(worker r, per_rank[r])` on every rank r (the same number of micro-batches each);
        `what` names the step in errors."""
        if len(per_rank) != self.world_size:
            raise ValueError(
                f"{self.name}.{what}: got micro-batches for {len(per_rank)} ranks, the group "
                f"has {self.world_size}; split the batch with num_ranks={self.world_size}"
            )
        counts = {len(mbs) for mbs in per_rank}
        if len(counts) > 1:  # FSDP collectives run once per micro-batch on every rank
            raise ValueError(
                f"{self.name}.{what}: ranks got different numbers of micro-batches "
                f"{[len(m) for m in per_rank]}; every rank must run the same number"
            )
        return self._get([call(w, mbs) for w, mbs in zip(self.workers, per_rank, strict=True)])

    # -- weight-sync rank halves (agentrl/learner/sync/) ----------------------------------------
    def on_ranks_async(
        self, cls: type[Any], fn: Callable[Concatenate[Any, P], T], *args: P.args
    ) -> list[ObjectRef]:
        """`fn(state, *args)` on every rank, `state` that rank's instance of `cls` (a transport's
        `Rank`; `fn` one of its methods, e.g. `TensorSync.Rank.bucket`); the ObjectRefs."""
        return [w.on_rank.remote(cls, fn, *args) for w in self.workers]

    def on_ranks(
        self, cls: type[Any], fn: Callable[Concatenate[Any, P], T], *args: P.args
    ) -> list[T]:
        """`on_ranks_async`, waited for: every rank's result."""
        return self._get(self.on_ranks_async(cls, fn, *args))

    def on_rank0_async(
        self, cls: type[Any], fn: Callable[Concatenate[Any, P], T], *args: P.args
    ) -> ObjectRef:
        """`fn(state, *args)` on rank 0 only; its ObjectRef."""
        return self.workers[0].on_rank.remote(cls, fn, *args)

    def on_rank0(self, cls: type[Any], fn: Callable[Concatenate[Any, P], T], *args: P.args) -> T:
        return self._get([self.on_rank0_async(cls, fn, *args)])[0]

    # -- compute --------------------------------------------------------------------------------
    def micro_batches(self, batch: TrainBatch) -> list[list[TrainBatch]]:
        """`batch` split for this group's ranks by `learner.micro_batch_tokens`, planned for its
        `attention_layout` (padded: runs of similar length; agentrl.batch.plan_micro_batches)."""
        padded = self.cfg.attention_layout == "padded"
        return micro_batches(batch, self.world_size, self.micro_batch_tokens, padded=padded)

    def compute_logprobs(self, per_rank: list[list[Any]], temperature: float = 1.0) -> list[Any]:
        """[rank][micro-batch] → logprobs [N] (CPU), for old/reference logprobs."""
        return self._per_rank(
            "compute_logprobs", per_rank, lambda w, mbs: w.compute_logprobs.remote(mbs, temperature)
        )

    def update_logprobs(self) -> list[Any]:
        return self._all(lambda w: w.update_logprobs.remote())

    def compute_values(self, per_rank: list[list[Any]]) -> list[Any]:
        return self._per_rank(
            "compute_values", per_rank, lambda w, mbs: w.compute_values.remote(mbs)
        )

    def train_step(
        self,
        per_rank: list[list[Any]],
        loss_name: str,
        loss_cfg: Any,
        temperature: float = 1.0,
        old_from_forward: bool = False,
    ) -> dict:
        """One optimizer step over all ranks' micro-batches; metrics named `<role>/<key>`:
        loss terms summed over ranks (the loss's shares add up to the full-batch value), plus
        grad_norm, lr, skipped (1 when a non-finite loss/grad skipped the step), step_s.
        `old_from_forward`: pi_old from the step's own forward (worker.train_step); then
        `update_logprobs()` gives them per rank and micro-batch, like `compute_logprobs`."""
        results = self._per_rank("train_step", per_rank, lambda w, mbs: w.train_step.remote(
            mbs, loss_name, loss_cfg, temperature, old_from_forward))  # fmt: skip
        out = reduce_metrics(r["sum"] for r in results)
        out.update(results[0]["global"])
        out["step_s"] = max(r["global"]["step_s"] for r in results)
        return {f"{self.role}/{k}": v for k, v in out.items()}

    # -- weights --------------------------------------------------------------------------------
    def param_specs(self, dtype: str | None = None) -> list[ParamSpec]:
        if dtype not in self._specs:
            self._specs[dtype] = self._get([self.workers[0].param_specs.remote(dtype)])[0]
        return self._specs[dtype]

    def model_dtype(self) -> str:
        return self._get([self.workers[0].model_dtype.remote()])[0]

    def buckets(self, bucket_mb: float, dtype: str | None = None) -> list[list[ParamSpec]]:
        return plan_buckets(self.param_specs(dtype), int(bucket_mb * 1024 * 1024))

    def full_state(self, dtype: str | None = None) -> dict[str, Any]:
        """Full weights on the driver (CPU tensors). Small models / tests only."""
        return self._all(lambda w: w.full_state.remote(dtype))[0]

    def save_hf(self, out_dir: str, bucket_mb: float = 512, dtype: str | None = None) -> None:
        buckets = self.buckets(bucket_mb, dtype)
        self._all(lambda w: w.save_hf.remote(str(out_dir), buckets))

    # -- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(
        self,
        path: str,
        optimizer: bool = True,
        fmt: str = "sharded",
        bucket_mb: float = 512,
        background: bool = False,
    ) -> int:
        """`path/model` (a transformers dir, fp32 master weights) and `path/optim`. With
        `background`, returns once the copies to host memory are queued; the files are written
        while training goes on, done when `finish_checkpoint` says so. Returns the most host
        buffers a rank had to allocate in the save (0 after `prepare_checkpoint`)."""
        buckets = self.buckets(bucket_mb)
        return max(self._all(lambda w: w.save_checkpoint.remote(
            str(path), buckets, optimizer, fmt, background)))  # fmt: skip

    def prepare_checkpoint(self, bucket_mb: float = 512) -> None:
        """Before the first background save: its host buffers (pinned on GPUs) are allocated
        in a thread behind the next steps instead of in the save."""
        buckets = self.buckets(bucket_mb)
        self._all(lambda w: w.prepare_checkpoint.remote(buckets))

    def finish_checkpoint(self, wait: bool = True) -> bool:
        """True when every rank has written its part of the last checkpoint."""
        return all(self._all(lambda w: w.finish_checkpoint.remote(wait)))

    def load_checkpoint(self, path: str, optimizer: bool = True) -> dict[str, tuple[Any, Any]]:
        """Loads on every rank; returns the optimizer settings that now differ from the
        checkpoint's (applied: `optim.apply_hparams`), {name: (then, now)}."""
        return self._all(lambda w: w.load_checkpoint.remote(str(path), optimizer))[0]

    # -- colocated mode -------------------------------------------------------------------------
    def peak_memory(self) -> dict[str, float]:
        """GiB of GPU memory the learner's allocator held at most per phase (logprobs, update,
        sync) since the last call, the most over ranks; empty on CPU."""
        out: dict[str, float] = {}
        for peaks in self._all(lambda w: w.peak_memory.remote()):
            for phase, gib in peaks.items():
                out[phase] = max(gib, out.get(phase, 0.0))
        return out

    def memory_stats(self) -> list[dict[str, Any]]:
        """Per rank: its GPU memory, and its host's (LearnerWorker.memory_stats)."""
        return self._all(lambda w: w.memory_stats.remote())

    def set_offload(self, mode: str) -> None:
        """learner.offload=auto: the mode the driver chose, on every rank."""
        self._all(lambda w: w.set_offload.remote(mode))

    def offload(self) -> None:
        self._all(lambda w: w.offload.remote())

    def onload(self) -> None:
        self._all(lambda w: w.onload.remote())

    # -- for tests: gradients without a step ----------------------------------------------------
    def accumulate_grads(
        self, per_rank: list[list[Any]], loss_name: str, loss_cfg: Any, temperature: float = 1.0
    ) -> list[float]:
        """Forward + backward without stepping; each rank's loss share."""
        return self._per_rank("accumulate_grads", per_rank, lambda w, mbs: (
            w.accumulate_grads.remote(mbs, loss_name, loss_cfg, temperature)))  # fmt: skip

    def full_grads(self) -> dict[str, Any]:
        """The full gradients (rank 0's, CPU) between `accumulate_grads` and `zero_grad`."""
        return self._all(lambda w: w.full_grads.remote())[0]

    def zero_grad(self) -> None:
        self._all(lambda w: w.zero_grad.remote())

    def shutdown(self) -> None:

        for w in self.workers:
            with contextlib.suppress(Exception):  # tearing down; the actor may be gone
                ray.get(w.shutdown.remote(), timeout=30)
            ray.kill(w)
        self.workers = []
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None


_STRATEGIES = {"pack": "PACK", "spread": "SPREAD", "strict_pack": "STRICT_PACK",
               "strict_spread": "STRICT_SPREAD"}  # fmt: skip


def place_ranks(cfg: LearnerConfig, name: str) -> PlacementGroup:
    """A placement group of one bundle per rank, placed within `cfg.placement_timeout_s`, or a
    LearnerError that names what the cluster lacks."""
    on_gpu = cfg.resolved_device() == "cuda"
    # Ray refuses a bundle of only zeros; a hundredth of a CPU reserves nothing that matters
    bundle = {"CPU": max(cfg.num_cpus_per_worker, 0.01)}
    if on_gpu and cfg.num_gpus_per_worker:
        bundle["GPU"] = cfg.num_gpus_per_worker
    strategy = _STRATEGIES[cfg.placement]
    pg = placement_group([dict(bundle) for _ in range(cfg.num_workers)], strategy=strategy,
                         name=f"agentrl-{name}-{os.getpid()}-{id(cfg):x}")  # fmt: skip
    if pg.wait(timeout_seconds=cfg.placement_timeout_s):
        return pg
    remove_placement_group(pg)
    nodes = [f"{n['NodeManagerAddress']} {_fmt(n['Resources'])}" for n in ray.nodes() if n["Alive"]]
    raise LearnerError(
        f"{name} learner: Ray could not place {cfg.num_workers} ranks of {_fmt(bundle)} each "
        f"(learner.placement={cfg.placement}: {strategy}) within {cfg.placement_timeout_s:g}s; "
        f"free now: {_fmt(ray.available_resources())}; nodes: {'; '.join(nodes) or 'none'}. "
        "Add nodes or resources, lower learner.num_workers / num_cpus_per_worker / "
        "num_gpus_per_worker, or use learner.placement=pack"
    )


def _fmt(resources: dict[str, float]) -> str:
    keep = {k: v for k, v in resources.items()
            if k in ("CPU", "GPU") or not (k.startswith("node:") or "memory" in k
                                           or k.startswith("bundle_group"))}  # fmt: skip
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(keep.items())) + "}"


def rank_error(e: ray.exceptions.RayTaskError) -> BaseException:
    """What a rank raised, to raise in the driver: agentrl's errors for people (a damaged
    checkpoint, a config mistake) as they are, so the command prints their one line; Ray's
    copy of the others, its remote traceback in its message. A checkpoint whose optimizer
    shards were cut short printed the whole remote traceback as its `error:` line."""
    if isinstance(e.cause, ConfigError | CheckpointError):
        return e.cause
    return e.as_instanceof_cause()
