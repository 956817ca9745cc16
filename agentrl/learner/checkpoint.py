"""One learner rank's half of a checkpoint: `model/` (a transformers dir) and `optim/`.

With `background=True` (trainer.async_save) only the copy to CPU memory blocks training: the
full weights are gathered onto rank 0's CPU, the optimizer shards staged by
`torch.distributed.checkpoint.async_save`, and files are written by threads while the next steps
train. The driver commits the checkpoint (agentrl/ckpt.py: COMPLETE marker, rename, `latest`)
only once every rank's `finish(wait)` says its writes are done, so a kill during the writes
leaves `latest` on the previous checkpoint. The writes' collectives (DCP's metadata gather) run
on a gloo group of their own, never on the training group the main thread uses meanwhile.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
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

from agentrl.learner import fsdp, lora
from agentrl.learner.fsdp import ParamSpec


class CheckpointWriter:
    def __init__(self, rank: int, device: torch.device) -> None:
        self.rank, self.device = rank, device
        self.group = dist.new_group(backend="gloo")  # collective: every rank builds it at setup
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-write")
        self.pending: list[Future] = []
        # host copies of the weights, kept between checkpoints (pinned on GPU hosts): fresh
        # pageable memory costs page faults on every save (7.5 s for 1.5B on an H100). The
        # optimizer goes through DCP's default staging: its pinned stager (DefaultStager) fails
        # on FSDP2's DTensor optimizer state in torch 2.11 (KeyError in its deepcopy)
        self.host: dict[str, torch.Tensor] = {}

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
    ) -> None:
        """Collective. Waits for the previous checkpoint's writes first."""
        self.finish(wait=True)
        root = Path(path)
        if lora.is_lora(model):  # the adapters too: resume needs them (merged weights are final)
            adapters = {n: fsdp.full_param(p).cpu().clone() for n, p in lora.adapter_params(model)}
            if self.rank == 0:
                self.write(background, lora.save_adapter_files, adapters, model, root / "adapter")
        if not background:
            fsdp.write_hf_dir(model, root / "model", model_src, buckets, self.rank)
            if opt is not None:
                _save_optimizer(model, opt, sched, root / "optim", fmt, self.rank, None)
            dist.barrier()
            return
        # the copy to CPU is the blocking part; the writes go on behind the next steps
        staged = [self._stage(fsdp.gather_full(model, b, self.rank, self.device)) for b in buckets]
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        if self.rank == 0:
            args = (staged, len(staged), root / "model", model_src, model.config)
            self.write(True, fsdp.write_hf_files, *args)
        if opt is not None:
            _save_optimizer(model, opt, sched, root / "optim", fmt, self.rank, self)
        dist.barrier()

    def write(self, background: bool, fn: Any, *args: Any) -> None:
        """Now, or in the writer's thread (finish() waits for it)."""
        if background:
            self.pending.append(self.pool.submit(fn, *args))
        else:
            fn(*args)

    def _stage(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Copies into this writer's own host buffers: never the live parameters (with one rank
        on CPU a gathered tensor *is* the parameter, which the next step changes in place)."""
        out = {}
        for name, t in full.items():
            buf = self.host.get(name)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                pin = t.is_cuda
                buf = self.host[name] = torch.empty(t.shape, dtype=t.dtype, pin_memory=pin)
            out[name] = buf.copy_(t, non_blocking=t.is_cuda)
        return out

    def finish(self, wait: bool) -> bool:
        """True when this rank's writes are done (raising their error); `wait` blocks for them."""
        if not wait and not all(f.done() for f in self.pending):
            return False
        for f in self.pending:
            f.result()
        self.pending = []
        return True


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
        # stages a CPU copy now (blocking), writes in DCP's own thread on the writer's group
        res = dcp.async_save(state, checkpoint_id=str(out), process_group=writer.group)
        writer.pending.append(getattr(res, "upload_completion", res))
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
