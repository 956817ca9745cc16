"""One learner rank's half of a checkpoint: `model/` (a transformers dir) and `optim/`.

With `background=True` (trainer.async_save) training does not wait for the files, and on a GPU
not for the copies either: the weights (gathered on rank 0) and the optimizer shards are copied
into this writer's own pinned host buffers on a side CUDA stream, and the next step's kernels wait
for those copies on the GPU (`guard`), so the save returns once the copies are queued (state that
`learner.offload` left in pinned host memory is copied in the writer's thread instead). Threads
then write the files from the host buffers while the next steps train (the optimizer through
`torch.distributed.checkpoint.save`, on a gloo group of its own, never the training group the
main thread uses meanwhile). The driver commits the checkpoint (agentrl/ckpt.py: COMPLETE marker,
rename, `latest`) only once every rank's `finish(wait)` says its writes are done, so a kill
during the copies or the writes leaves `latest` on the previous checkpoint.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from agentrl.learner import fsdp, lora
from agentrl.learner.fsdp import ParamSpec


class CheckpointWriter:
    # gathered weight buckets (rank 0, several ranks) alive on the GPU until their copies are done
    IN_FLIGHT_BUCKETS = 2

    def __init__(self, rank: int, device: torch.device) -> None:
        self.rank, self.device = rank, device
        self.group = dist.new_group(backend="gloo")  # collective: every rank builds it at setup
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-write")
        self.pending: list[Future] = []
        # host copies, kept between checkpoints (pinned on GPU hosts): fresh pageable memory
        # costs page faults on every save (7.5 s for 1.5B on an H100), and only pinned memory
        # lets the copies run on a side stream. Our own, not DCP's stager: its pinned
        # DefaultStager fails on FSDP2's DTensor optimizer state in torch 2.11 (KeyError in its
        # deepcopy)
        self.host: dict[Any, torch.Tensor] = {}
        cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if cuda else None
        self.copied: torch.cuda.Event | None = None  # the last save's copies, recorded on stream
        self.reserving: Future | None = None  # reserve()'s allocation
        self.fresh_in_save = 0
        # (host buffer, offloaded source) copies the next write() does in its thread
        self.deferred: list[tuple[torch.Tensor, torch.Tensor]] = []

    def save(
        self,
        model: torch.nn.Module,
        opt: torch.optim.Optimizer | None,
        sched: Any,
        path: str,
        buckets: list[list[ParamSpec]],
        model_src: str,
        fmt: str,
        background: bool,
    ) -> int:
        """Collective. Waits for the previous checkpoint's writes first. Returns how many host
        buffers it had to allocate itself (0 once `reserve` made them)."""
        self.finish(wait=True)
        self.fresh_in_save = 0
        if self.reserving is not None:
            self.reserving.result()
            self.reserving = None
        root = Path(path)
        if lora.is_lora(model):  # the adapters too: resume needs them (merged weights are final)
            adapters = fsdp.gather_adapters(model)
            if self.rank == 0:
                self.write(background, lora.save_adapter_files, adapters, model, root / "adapter")
        if not background:
            fsdp.write_hf_dir(model, root / "model", model_src, buckets, self.rank)
            if opt is not None:
                _save_optimizer(model, opt, sched, root / "optim", fmt, self.rank, None)
            dist.barrier()
            return 0
        if self.stream is not None:  # the copies read what the update wrote
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        staged, events = [], []
        for i, b in enumerate(buckets):
            if len(events) >= self.IN_FLIGHT_BUCKETS:  # bound the gathered weights on the GPU
                events.pop(0).synchronize()
            staged.append(self._stage(fsdp.gather_full(model, b, self.rank, self.device), ("w", i)))
            if self.stream is not None:
                events.append(self.stream.record_event())
        if self.rank == 0:
            args = (staged, len(staged), root / "model", model_src, model.config)
            self.write(True, fsdp.write_hf_files, *args)
        if opt is not None:
            _save_optimizer(model, opt, sched, root / "optim", fmt, self.rank, self)
        if self.stream is not None:
            self.copied = self.stream.record_event()
        _copy_all(self.deferred)  # staged for no write of this rank: copied now
        dist.barrier()
        return self.fresh_in_save

    def reserve(self, model: torch.nn.Module, opt: torch.optim.Optimizer | None, buckets) -> None:
        """Allocate the pinned host buffers of the next background save in a thread now (at
        start-up, while the first rollout runs): pinning the 18 GB of a 1.5B model's weights
        and moments took 15.6 s in its first save. `save` joins the thread first. (On CPU the
        buffers are plain memory, reserved the same way.)"""
        pin = self.stream is not None
        shapes: dict[Any, tuple[tuple[int, ...], torch.dtype]] = {}
        if self.rank == 0:
            for i, bucket in enumerate(buckets):
                for spec in bucket:
                    shapes[(("w", i), spec.name)] = (tuple(spec.shape), fsdp.to_dtype(spec.dtype))
        if opt is not None:  # AdamW's moments and step, shaped like the shards (also before
            for name, p in model.named_parameters():  # the first step, when it has no state)
                if p.requires_grad:
                    local = p.to_local() if isinstance(p, DTensor) else p
                    for moment in ("exp_avg", "exp_avg_sq"):
                        key = ((("optim", "state"), name), moment)
                        shapes[key] = (tuple(local.shape), local.dtype)
                    shapes[((("optim", "state"), name), "step")] = ((), torch.float32)

        def alloc() -> None:
            for key, (shape, dtype) in shapes.items():
                buf = self.host.get(key)
                if buf is None or tuple(buf.shape) != shape or buf.dtype != dtype:
                    self.host[key] = torch.empty(shape, dtype=dtype, pin_memory=pin)

        self.reserving = self.pool.submit(alloc)

    def guard(self) -> None:
        """Before anything changes the weights or the optimizer state in place (the next step):
        the current stream waits, on the GPU, for the last save's copies to the host."""
        if self.copied is not None:
            torch.cuda.current_stream(self.device).wait_event(self.copied)
            self.copied = None

    def write(self, background: bool, fn: Any, *args: Any) -> None:
        """Now, or in the writer's thread once the copies are done (finish() waits for it)."""
        if not background:
            fn(*args)
            return
        stream, copies, self.deferred = self.stream, self.deferred, []

        def run() -> Any:
            if stream is not None:
                stream.synchronize()  # the host buffers hold the copies
            _copy_all(copies)  # offloaded state: host to host, here instead of blocking
            return fn(*args)

        self.pending.append(self.pool.submit(run))

    def _stage(self, tensors: dict[Any, Any], key: Any) -> dict[Any, Any]:
        """Copies of `tensors` (a tree of dicts) in this writer's own host buffers: never the
        live tensors (with one rank on CPU a gathered tensor *is* the parameter, which the next
        step changes in place). On a GPU the copies are queued on the side stream; DTensors come
        back as DTensors over their host shard (what DCP saves)."""
        out: dict[Any, Any] = {}
        for name, t in tensors.items():
            if isinstance(t, dict):
                out[name] = self._stage(t, (key, name))
            elif isinstance(t, DTensor):
                local = self._copy(t.to_local(), (key, name))
                out[name] = DTensor.from_local(
                    local, t.device_mesh, t.placements, run_check=False, shape=t.shape,
                    stride=t.stride(),
                )  # fmt: skip
            elif isinstance(t, torch.Tensor):
                out[name] = self._copy(t, (key, name))
            else:
                out[name] = t
        return out

    def _copy(self, t: torch.Tensor, key: Any) -> torch.Tensor:
        buf = self.host.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = self.host[key] = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
            self.fresh_in_save += 1
        if t.is_cuda and self.stream is not None:
            with torch.cuda.stream(self.stream):
                buf.copy_(t, non_blocking=True)
            t.record_stream(self.stream)  # its memory is not reused before the copy is done
        elif self._offloaded(t):
            self.deferred.append((buf, t))
        else:
            buf.copy_(t)
        return buf

    def _offloaded(self, t: torch.Tensor) -> bool:
        """A GPU learner's state in pinned host memory: what `learner.offload` moved there. It
        is never written in place (the onload copies it to new GPU tensors, the next offload
        into new host blocks), so holding it until the writer's thread has copied it is a
        snapshot, and the host-to-host copy (18 GB at 1.5B with offload=all, whose saves blocked
        2.8-3.3 s against 1.5 s with offload=none) leaves the critical path. Anything else on the
        host (a CPU learner's parameters, Adam's step counters) is live and copied now."""
        return self.stream is not None and not t.is_cuda and t.is_pinned()

    def finish(self, wait: bool) -> bool:
        """True when this rank's writes are done (raising their error); `wait` blocks for them."""
        if not wait and not all(f.done() for f in self.pending):
            return False
        for f in self.pending:
            f.result()
        self.pending = []
        return True


def _copy_all(copies: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """(host buffer, source) pairs copied, then dropped: the sources' memory may be reused."""
    for buf, src in copies:
        buf.copy_(src)
    copies.clear()


def _save_optimizer(
    model, opt, sched, out: Path, fmt: str, rank: int, writer: CheckpointWriter | None
) -> None:
    """Writes `out` now, or with a writer behind the next steps (its finish() waits)."""
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        torch.save({"format": fmt, "scheduler": sched.state_dict()}, out / "schedule.pt")
    dist.barrier()
    if fmt == "sharded":
        state = {"optim": get_optimizer_state_dict(model, opt)}
        if writer is None:
            dcp.save(state, checkpoint_id=str(out))
            return
        # host copies queued now; DCP writes them in the writer's thread on the writer's group
        staged = {"optim": writer._stage(state["optim"], "optim")}  # the keys reserve() made
        save = partial(dcp.save, checkpoint_id=str(out), process_group=writer.group)
        writer.write(True, save, staged)
        return
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_optimizer_state_dict(model, opt, options=opts)  # CPU copies on rank 0
    if rank == 0:
        if writer is None:
            torch.save(full, out / "optim.pt")
        else:
            writer.write(True, torch.save, full, out / "optim.pt")


def load_optimizer(model, opt, sched, src: Path, rank: int) -> None:
    meta = torch.load(src / "schedule.pt", weights_only=True)
    if meta["format"] == "sharded":
        state = {"optim": get_optimizer_state_dict(model, opt)}
        dcp.load(state, checkpoint_id=str(src))
        set_optimizer_state_dict(model, opt, state["optim"])
    else:
        full = torch.load(src / "optim.pt", weights_only=True) if rank == 0 else {}
        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_optimizer_state_dict(model, opt, full, options=opts)
    sched.load_state_dict(meta["scheduler"])
