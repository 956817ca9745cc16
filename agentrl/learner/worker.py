"""One learner rank: a Ray actor holding an FSDP2 shard of a model and its optimizer.

The worker is algorithm-blind. It runs forwards and backwards over the packed micro-batches it is
given (`agentrl.batch.TrainBatch`, already split per rank) with the loss named by the caller
(`agentrl.loss.get_loss`), and gathers/saves/broadcasts weights. `LearnerGroup` (group.py) starts
N of these, wires torch.distributed between them and fans calls out; nothing else calls them.

Roles: `policy` (trains; its weights go to the rollout engines), `reference` (frozen; logprobs for
KL), `critic` (token-classification head with one output: values; trains with a value loss).

Size: one Ray actor class, whose methods are every call the driver makes on a rank and share its
model, optimizer and device state; its building blocks live in fsdp.py, forward.py, memory.py,
rank_memory.py.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import ray
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from agentrl.learner import LearnerConfig, Role, forward, fsdp, lora, memory, optim
from agentrl.learner.checkpoint import CheckpointWriter, load_optimizer
from agentrl.learner.fsdp import ParamSpec
from agentrl.learner.rank_memory import RankMemory
from agentrl.learner.update_group import bind_listen_socket
from agentrl.loss import LossInputs, get_loss, reduce_metrics

T = TypeVar("T")


class LearnerWorker:
    """Plain class; group.py wraps it with `ray.remote`. Call `setup()` before anything else."""

    def __init__(
        self,
        cfg: LearnerConfig,
        role: Role,
        rank: int,
        world_size: int,
        init_method: str | None = None,
    ):
        self.cfg, self.role = cfg, role
        self.rank, self.world_size, self.init_method = rank, world_size, init_method
        self._store_sock: socket.socket | None = None  # rank 0: the process group's store
        self.device_type = cfg.resolved_device()
        self.model: Any = None
        self.opt: torch.optim.Optimizer | None = None
        self.sched: Any = None
        self._rank_states: dict[type, Any] = {}  # weight-sync rank halves, by their class
        self._ckpt: CheckpointWriter | None = None  # made at the first save (a collective)
        self.offload_mode = "all" if cfg.offload == "auto" else cfg.offload  # auto: set_offload
        self.steps_done = 0
        self.compiled = False  # learner.compile, resolved for this rank's device in setup()
        self.head_kernel = "torch"  # learner.head_kernel, resolved likewise
        # activation_checkpointing=auto on CUDA: the blocks, and activation bytes per token of
        # one kept block and of one recomputed one (its input); the count recomputed last step
        self._ckpt_blocks: list[Any] = []
        self._block_bytes = self._block_input_bytes = 0
        self.checkpointed_blocks = 0
        self._update_lps: list[torch.Tensor] = []  # pi_old of the last train_step, per micro-batch

    # -- lifecycle ------------------------------------------------------------------------------
    def node(self) -> dict[str, str]:
        """Where Ray placed this rank: its node's id and address."""
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address()}

    def bind_store(self) -> tuple[str, int]:
        """Rank 0: a listening socket on this node's address (only there, never on every
        interface) for the process group's TCP store; the other ranks connect to it."""
        ip = ray.util.get_node_ip_address()
        self._store_sock = bind_listen_socket(ip)
        return ip, self._store_sock.getsockname()[1]

    def setup(self, store: tuple[str, int] | None = None) -> dict[str, Any]:
        """Join the process group (through rank 0's TCP store at `store`, from `bind_store`, or
        this worker's `init_method`), load + shard the model, build the optimizer."""
        t0 = time.perf_counter()
        attention = self._set_device(store)
        self._join_process_group(store)
        torch.manual_seed(self.cfg.seed)
        model, kernels = self._build_model()
        n_blocks, checkpointing, frozen_saved = self._shard(model, kernels)
        if self.role == "reference":
            self.model.eval()
        else:
            self.opt, self.sched = optim.make_optimizer(self.model, self.cfg)
        n = sum(p.numel() for p in self.model.parameters())
        return {
            "micro_batch_tokens": self._micro_batch_tokens(n_blocks),
            "rank": self.rank,
            "params": n,
            "device": str(self.device),
            "bf16": self.cfg.use_bf16(self.device_type),
            "checkpointing": ("auto" if self._ckpt_blocks else True) if checkpointing else False,
            "fused_kernels": kernels,
            "compiled": self.compiled,
            "head_kernel": self.head_kernel,
            "attention": attention,
            "frozen_bf16_gb": frozen_saved / 2**30,
            "setup_s": time.perf_counter() - t0,
            "nice": os.nice(0),
        }

    def _set_device(self, store: tuple[str, int] | None) -> str:
        """This process's settings (threads, determinism, its device, the attention backends);
        the attention backends on, joined by "+"."""
        fsdp.set_worker_env(store[0] if store else "127.0.0.1")
        torch.set_num_threads(self.cfg.threads_per_worker)
        if self.cfg.deterministic:  # trainer.deterministic; before CUDA makes a cuBLAS handle
            fsdp.set_deterministic()
        attention = "sdpa"
        if self.device_type == "cuda":
            torch.cuda.set_device(0)  # Ray exposes exactly this worker's GPU(s)
            self.device = torch.device("cuda", 0)
            # process-wide switches (this process is this rank's): they hold in backward too,
            # where activation checkpointing runs the forward again
            on = self.cfg.sdpa_backends()
            for name, enabled in on.items():
                getattr(torch.backends.cuda, f"enable_{name}_sdp")(enabled)
            attention = "+".join(n for n, enabled in on.items() if enabled)
        else:
            self.device = torch.device("cpu")
        self.mem = RankMemory(self.device, self.device_type)  # peaks, retries, memory now
        return attention

    def _join_process_group(self, store: tuple[str, int] | None) -> None:
        """The ranks' process group: NCCL on GPUs, gloo on CPU."""
        timeout = timedelta(seconds=self.cfg.dist_timeout_s)
        rendezvous: dict[str, Any] = {"init_method": self.init_method}
        if store is not None:
            fd = {"master_listen_fd": self._store_sock.fileno()} if self._store_sock else {}
            rendezvous = {
                "store": dist.TCPStore(
                    *store, self.world_size, self.rank == 0, timeout=timeout, **fd
                )
            }
        dist.init_process_group(
            backend="nccl" if self.device_type == "cuda" else "gloo",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timeout,
            **rendezvous,
        )

    def _build_model(self) -> tuple[Any, Any]:
        """The role's model, unsharded: kernels fused, LoRA added, frozen or compiled as the
        config says; and the fused kernels' description."""
        model = fsdp.load_model(self.cfg.model_path, self.role)
        self.compiled = self.cfg.use_compile(self.device_type)
        self.head_kernel = self.cfg.head_kernel_for(self.device_type)
        # the compiler fuses what liger's kernels fuse and cannot trace them: auto gives way
        # (an explicit liger beside compile is refused by the config)
        fused = "off" if self.compiled else self.cfg.fused_kernels
        kernels = fsdp.fuse_kernels(model, fused, self.device_type)
        if self.cfg.lora.rank and self.role == "policy":
            model = lora.add_lora(model, self.cfg.lora)
        if self.role == "reference":
            model.requires_grad_(False)
        if self.compiled:
            fsdp.compile_blocks(model)
        return model, kernels

    def _shard(self, model: Any, kernels: str) -> tuple[int, bool, int]:
        """Shard `model` into `self.model`, planning activation checkpointing (auto: the blocks
        and their bytes per token, `_plan_checkpointing` chooses each step); the number of
        blocks, whether checkpointing is on, the bytes frozen weights saved by bf16 storage."""
        bf16 = self.cfg.use_bf16(self.device_type)
        checkpointing = self.cfg.use_checkpointing(self.device_type) and self.role != "reference"
        # one token's activations per block: what activation checkpointing=auto and
        # micro_batch_tokens=auto size by
        blocks = fsdp.blocks(model)
        self._block_bytes = memory.block_activation_bytes(model.config, 2 if bf16 else 4, kernels)
        if checkpointing and self.cfg.activation_checkpointing == "auto":
            # as few blocks recomputed as each step's memory allows (_plan_checkpointing)
            self._ckpt_blocks = blocks
            self._block_input_bytes = (2 if bf16 else 4) * int(model.config.hidden_size)
        frozen_saved = fsdp.store_frozen_in(model, torch.bfloat16) if bf16 else 0
        self.model = fsdp.shard_model(
            model,
            self.device,
            bf16=bf16,
            checkpointing=checkpointing,
            reshard=self.cfg.reshard_after_forward,
        )
        return len(blocks), checkpointing, frozen_saved

    def _micro_batch_tokens(self, n_blocks: int) -> int:
        """learner.micro_batch_tokens, auto sized by this rank's GPU (the least on CPU)."""
        mb_tokens = self.cfg.micro_batch_tokens
        if mb_tokens == "auto":
            on_gpu = self.device_type == "cuda"
            per_token = n_blocks * self._block_bytes
            mb_tokens = (
                self._auto_micro_batch_tokens(per_token) if on_gpu else memory.MIN_MICRO_BATCH
            )
        return mb_tokens

    def shutdown(self) -> None:
        for state in self._rank_states.values():
            state.close()
        self._rank_states.clear()
        if dist.is_initialized():
            dist.destroy_process_group()
        if self._store_sock is not None:
            self._store_sock.close()
            self._store_sock = None

    # -- forward-only passes --------------------------------------------------------------------
    @torch.no_grad()
    def compute_logprobs(self, micro_batches: list[Any], temperature: float = 1.0) -> list[Any]:
        """Per micro-batch: logprobs [N] of each token given its prefix (CPU, fp32)."""
        self.model.eval()
        out = []
        with self.mem.peak("logprobs"):
            for mb in micro_batches:
                with forward.replayed(
                    self.model, mb := mb.to(self.device), self.cfg.attention_layout
                ):
                    lp, _ = forward.token_logprobs(
                        self.model,
                        mb,
                        temperature=temperature,
                        layout=self.cfg.attention_layout,
                        kernel=self.head_kernel,
                        compiled=self.compiled,
                    )
                out.append(lp.float().cpu())
            self.model.reshard()  # no backward follows: free the root's gathered weights
        return out

    @torch.no_grad()
    def compute_values(self, micro_batches: list[Any]) -> list[Any]:
        """Critic only: per micro-batch, values [N] (CPU, fp32)."""
        self._require("critic", "compute_values")
        self.model.eval()
        out = [
            forward.token_values(self.model, mb.to(self.device), self.cfg.attention_layout)
            .float()
            .cpu()
            for mb in micro_batches
        ]
        self.model.reshard()
        return out

    # -- training -------------------------------------------------------------------------------
    def train_step(
        self,
        micro_batches: list[Any],
        loss_name: str,
        loss_cfg: Any,
        temperature: float = 1.0,
        old_from_forward: bool = False,
    ) -> dict[str, Any]:
        """Forward + backward every micro-batch with `loss_name`, then one optimizer step.

        `old_from_forward`: a micro-batch without `trainer_old_logprobs` takes this forward's
        own logprobs, detached, as pi_old (right when this is the batch's only optimizer step:
        a separate pass before it would compute the same numbers); `update_logprobs` returns
        them afterwards.
        A non-finite loss or gradient norm (on any rank) skips the step: gradients are dropped,
        the lr schedule does not advance, and `skipped` is 1 in the returned metrics.
        Returns {"sum": metrics to add over ranks, "global": metrics equal on every rank}."""
        if self.opt is None:
            raise RuntimeError(f"the {self.role} learner has no optimizer; it cannot train")
        self._update_lps = []
        loss_fn = get_loss(loss_name)
        self.model.train()
        if self._ckpt_blocks:
            self._plan_checkpointing(micro_batches)
        t0 = time.perf_counter()
        retries0 = self.mem.alloc_retries()
        per_mb, loss_sum, tokens, batch_tokens = [], 0.0, 0, 0
        expandable = self.mem.expandable(self.cfg.update_memory == "expandable")
        with self.mem.peak("update"), expandable, self._profiled(self.steps_done + 1):
            for mb in micro_batches:
                with forward.replayed(
                    self.model, mb := mb.to(self.device), self.cfg.attention_layout
                ):  # backward's recompute too
                    loss, metrics = self._loss(mb, loss_fn, loss_cfg, temperature, old_from_forward)
                    loss.backward()
                loss_sum += float(loss.detach())
                tokens += int(mb.loss_mask.sum())
                batch_tokens += 0 if getattr(mb, "is_padding", False) else mb.token_ids.numel()
                per_mb.append(metrics)
            retries1 = self.mem.alloc_retries()  # the optimizer step's own, apart
            grad_norm, ok, lr = self._step_if_finite(loss_sum)
        summed = reduce_metrics(per_mb)
        summed.update(
            loss=loss_sum,
            tokens=float(tokens),
            batch_tokens=float(batch_tokens),
            micro_batches=float(len(micro_batches)),
            alloc_retries=float(self.mem.alloc_retries() - retries0),
            alloc_retries_optimizer=float(self.mem.alloc_retries() - retries1),
        )
        return {
            "sum": summed,
            "global": {
                "grad_norm": grad_norm if math.isfinite(grad_norm) else float("nan"),
                "lr": lr,
                "skipped": 0.0 if ok else 1.0,
                "checkpointed_blocks": float(self.checkpointed_blocks),
                "step_s": time.perf_counter() - t0,
            },
        }

    def _step_if_finite(self, loss_sum: float) -> tuple[float, bool, float]:
        """Clip the gradients and step the optimizer and schedule, unless the loss or the
        gradient norm is non-finite on any rank; the gradients are dropped either way. Returns
        (grad norm, stepped, the lr the step used)."""
        grad_norm = optim.grad_norm_and_clip(self.model, self.cfg.grad_clip)
        ok = optim.all_ranks_finite(loss_sum, self.device) and math.isfinite(grad_norm)
        lr = self.sched.get_last_lr()[0]
        if ok:
            if self._ckpt is not None:  # a background save's copies read these in place
                self._ckpt.guard()
            self.opt.step()
            self.sched.step()
            self.steps_done += 1
        self.opt.zero_grad(set_to_none=True)
        return grad_norm, ok, lr

    def _auto_micro_batch_tokens(self, per_token: int) -> int:
        """memory.auto_micro_batch_tokens for this rank: its state counted as it will be at the
        update (16 bytes per trained parameter: weights, gradients, two moments; frozen weights
        as stored), every block's activations (`per_token` bytes) kept."""
        state = sum(
            (16 if p.requires_grad else p.element_size())
            * (p.to_local() if isinstance(p, DTensor) else p).numel()
            for p in self.model.parameters()
        )
        total = torch.cuda.mem_get_info(self.device)[1]
        return memory.auto_micro_batch_tokens(
            total, state, forward.head_bytes(self.model), per_token
        )

    def _plan_checkpointing(self, micro_batches: list[Any]) -> None:
        """activation_checkpointing=auto: recompute the fewest blocks that let this step's largest
        micro-batch keep its activations in the GPU memory free now (the engine has released its
        own), beside the gradients the backward will allocate and the head's logits chunks. The
        largest count over the ranks, so their collectives stay in the same order."""
        tokens = max(
            (forward.activation_tokens(mb, self.cfg.attention_layout) for mb in micro_batches),
            default=0,
        )
        free, _ = torch.cuda.mem_get_info(self.device)
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        grads = sum(
            4 * (p.to_local() if isinstance(p, DTensor) else p).numel()
            for p in self.model.parameters()
            if p.requires_grad and p.grad is None
        )
        budget = (
            0.9 * (free + cached - grads - forward.head_bytes(self.model)) - memory.RESERVE_BYTES
        )
        count = memory.blocks_to_checkpoint(
            len(self._ckpt_blocks), tokens, self._block_bytes, self._block_input_bytes, budget
        )
        self.checkpointed_blocks = fsdp.max_over_ranks(count, self.device)
        fsdp.set_checkpointed(self._ckpt_blocks, self.checkpointed_blocks)

    @contextlib.contextmanager
    def _profiled(self, step: int) -> Iterator[None]:
        """torch.profiler over the update of step `learner.profile_step` (else nothing): writes
        the ops by device time and a trace to learner.profile_dir; with `learner.profile_memory`
        (CUDA) also the allocator's history over that update (memory_rank<r>.pickle)."""
        if step != self.cfg.profile_step:
            yield
            return
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU]
        if self.device_type == "cuda":
            acts.append(ProfilerActivity.CUDA)
        out = Path(self.cfg.profile_dir)
        out.mkdir(parents=True, exist_ok=True)
        history = self.device_type == "cuda" and self.cfg.profile_memory
        if history:
            torch.cuda.memory._record_memory_history(max_entries=500_000)
        with profile(activities=acts) as prof:
            yield
            if self.device_type == "cuda":
                torch.cuda.synchronize()
        if history:
            torch.cuda.memory._dump_snapshot(str(out / f"memory_rank{self.rank}.pickle"))
            torch.cuda.memory._record_memory_history(enabled=None)
        key = "cuda_time_total" if self.device_type == "cuda" else "cpu_time_total"
        table = prof.key_averages().table(sort_by=key, row_limit=40)
        (out / f"update_rank{self.rank}.txt").write_text(table)
        trace = out / f"update_rank{self.rank}.json"
        prof.export_chrome_trace(str(trace))
        with open(trace, "rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        trace.unlink()

    def _loss(
        self,
        mb: Any,
        loss_fn: Any,
        loss_cfg: Any,
        temperature: float,
        old_from_forward: bool = False,
    ) -> tuple[Any, dict]:
        """This micro-batch's loss share and metrics. A padding micro-batch (a rank with no data
        left) still runs forward + backward with a zero loss, so FSDP's collectives line up."""
        if getattr(mb, "is_padding", False):
            if old_from_forward:
                self._update_lps.append(torch.zeros(0))
            hidden = forward.last_hidden_state(self.model, mb.token_ids, mb.position_ids)
            return hidden.float().sum() * 0.0, {}
        if self.role == "critic":
            return loss_fn(
                LossInputs.from_batch(
                    mb, values=forward.token_values(self.model, mb, self.cfg.attention_layout)
                ),
                loss_cfg,
            )
        entropy = getattr(loss_cfg, "entropy_coef", 0.0) > 0
        lp, ent = forward.token_logprobs(
            self.model,
            mb,
            with_entropy=entropy,
            temperature=temperature,
            layout=self.cfg.attention_layout,
            kernel=self.head_kernel,
            compiled=self.compiled,
        )
        extra = {}
        if getattr(mb, "trainer_old_logprobs", None) is not None:
            extra["trainer_old_logprobs"] = mb.trainer_old_logprobs
        elif old_from_forward:
            extra["trainer_old_logprobs"] = lp.detach()
            # kept on the device until update_logprobs: a host copy here would wait for this
            # forward before the backward could be queued, once per micro-batch
            self._update_lps.append(lp.detach().float())
        return loss_fn(LossInputs.from_batch(mb, lp, entropy=ent, **extra), loss_cfg)

    def update_logprobs(self) -> list[Any]:
        """The last train_step's pi_old per micro-batch, when it took them from its own forward
        (`old_from_forward`): the logprobs before that step, as `compute_logprobs` gives them."""
        return [lp.cpu() for lp in self._update_lps]

    # -- weights out ----------------------------------------------------------------------------
    def param_specs(self, dtype: str | None = None) -> list[ParamSpec]:
        return fsdp.param_specs(self.model, dtype)

    def model_dtype(self) -> str:
        """The dtype of the source checkpoint (what the rollout engines serve by default); the
        loaded model's config says float32, the dtype of the master weights."""
        cfg = json.loads((Path(self.cfg.model_path) / "config.json").read_text())
        dt = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
        return str(dt).removeprefix("torch.")

    def peak_memory(self) -> dict[str, float]:
        """GiB per phase (logprobs, update, sync) since the last call; empty on CPU."""
        return self.mem.take_peaks()

    def memory_stats(self) -> dict[str, Any]:
        """GPU memory of this rank and its host's (RankMemory.stats)."""
        return self.mem.stats(self.model, self.opt)

    def _host_state_bytes(self) -> int:
        """Bytes of this rank's state now in host memory (fsdp.host_state_bytes)."""
        return fsdp.host_state_bytes(self.model, self.opt)

    def full_state(self, dtype: str | None = None) -> dict[str, torch.Tensor]:
        """Collective: the full weights on rank 0 (CPU), {} elsewhere. For tests and small
        models; syncs and checkpoints stream buckets instead."""
        return fsdp.gather_full(self.model, self.param_specs(dtype), self.rank)

    def full_grads(self) -> dict[str, torch.Tensor]:
        """Collective, for tests: the full gradients on rank 0 (call between backward and step
        via `accumulate_grads`)."""
        out = {}
        for name, p in self.model.named_parameters():
            g = p.grad
            if g is None:
                continue
            full = g.full_tensor() if isinstance(g, DTensor) else g
            if self.rank == 0:
                out[name] = full.detach().float().cpu()
        return out

    def accumulate_grads(
        self, micro_batches: list[Any], loss_name: str, loss_cfg: Any, temperature: float = 1.0
    ) -> float:
        """For tests: forward + backward without stepping; returns this rank's loss share."""
        self.model.train()
        total = 0.0
        for mb in micro_batches:
            loss, _ = self._loss(mb.to(self.device), get_loss(loss_name), loss_cfg, temperature)
            loss.backward()
            total += float(loss.detach())
        return total

    def zero_grad(self) -> None:
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=True)

    def save_hf(self, out_dir: str, buckets: list[list[ParamSpec]], copy_aux: bool = True) -> None:
        """Collective: rank 0 writes a transformers dir (one safetensors shard per bucket);
        `copy_aux` adds the tokenizer/generation files of the source model."""
        fsdp.write_hf_dir(
            self.model, out_dir, self.cfg.model_path, buckets, self.rank, copy_aux=copy_aux
        )
        dist.barrier()

    # -- weight sync ----------------------------------------------------------------------------
    def on_rank(self, cls: type[Any], fn: Callable[..., T], *args: Any) -> T:
        """`fn(state, *args)`: `fn` a method of `cls`, a transport's rank half (`Transport.Rank`,
        agentrl/learner/sync/), `state` its one instance in this rank, made on first use."""
        if not any(vars(k).get(fn.__name__) is fn for k in cls.__mro__):
            raise TypeError(f"{fn.__qualname__} is not a method of {cls.__qualname__}")
        if cls not in self._rank_states:
            self._rank_states[cls] = cls(self)
        with self.mem.peak("sync", keep_max=True):  # a push is several calls: the most of them
            return fn(self._rank_states[cls], *args)

    # -- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(
        self,
        path: str,
        buckets: list[list[ParamSpec]],
        optimizer: bool,
        fmt: str,
        background: bool = False,
    ) -> int:
        """Collective: `path/model` (transformers dir) and `path/optim` (optimizer, schedule);
        with `background`, written behind the next steps (finish_checkpoint says when done).
        Returns the host buffers the save had to allocate (CheckpointWriter.save)."""
        if self._ckpt is None:
            self._ckpt = CheckpointWriter(self.rank, self.device)
        opt = self.opt if optimizer else None
        args = (self.model, opt, self.sched, path, buckets, self.cfg.model_path, fmt, background)
        return self._ckpt.save(*args)

    def prepare_checkpoint(self, buckets: list[list[ParamSpec]]) -> None:
        """Collective (the writer's group): allocate the next background save's host buffers
        in a thread (pinned on GPUs)."""
        if self._ckpt is None:
            self._ckpt = CheckpointWriter(self.rank, self.device)
        self._ckpt.reserve(self.model, self.opt, buckets)

    def finish_checkpoint(self, wait: bool) -> bool:
        return self._ckpt is None or self._ckpt.finish(wait)

    def load_checkpoint(self, path: str, optimizer: bool = True) -> dict[str, tuple[Any, Any]]:
        """Collective: inverse of save_checkpoint (the world size may differ for `sharded`); the
        optimizer then takes this run's hyperparameters: those that changed, {name: (then, now)}."""
        root = Path(path)
        if self._ckpt is not None:
            self._ckpt.guard()
        lora_model = lora.is_lora(self.model)  # merged weights cannot be split: the adapters
        fsdp.load_full_state(self.model, root / ("adapter" if lora_model else "model"))
        changed: dict[str, tuple[Any, Any]] = {}
        if optimizer and self.opt is not None and (root / "optim").exists():
            load_optimizer(self.model, self.opt, self.sched, root / "optim", self.rank)
            changed = optim.apply_hparams(self.opt, self.sched, self.cfg)
        dist.barrier()
        return changed

    # -- offload (colocated mode) ---------------------------------------------------------------
    def offload(self) -> None:
        fsdp.offload(*self._movable(), "cpu")

    def onload(self) -> None:
        fsdp.offload(*self._movable(), str(self.device))

    def set_offload(self, mode: str) -> None:
        """learner.offload=auto: the mode the driver chose (agentrl/learner/memory.py)."""
        self.offload_mode = mode

    def _movable(self) -> tuple[Any, Any]:
        """(model, optimizer) to move in colocated mode per `learner.offload`; None stays."""
        what = self.offload_mode
        return (self.model if what == "all" else None), (self.opt if what != "none" else None)

    def _require(self, role: str, what: str) -> None:
        if self.role != role:
            raise RuntimeError(f"{what} needs the {role} role, this learner is {self.role}")
