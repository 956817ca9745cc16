"""The learner's optimizer: AdamW (fused on CUDA) with its state made up front, the lr schedule,
the step's clipping and the all-ranks finiteness vote, and a resumed run's hyperparameters."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from agentrl.learner import LearnerConfig


def lr_factor(
    step: int, warmup: int, total: int | None, schedule: str, min_ratio: float = 0.0
) -> float:
    """Multiplier of the base lr before optimizer step `step` (0-based): linear warm-up to 1,
    then constant, or linear/cosine decay to `min_ratio` at `total`."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant" or not total or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / (total - warmup))
    decay = 1.0 - progress if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
    return min_ratio + (1.0 - min_ratio) * decay


def make_optimizer(
    model: nn.Module, cfg: LearnerConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    params = [p for p in model.parameters() if p.requires_grad]
    # CUDA: the fused kernel (foreach allocates full-size fp32 temporaries at every step)
    fused = True if params and params[0].device.type == "cuda" else None
    opt = torch.optim.AdamW(
        params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
        fused=fused,
    )  # fmt: skip
    init_adam_state(opt)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: lr_factor(
            s, cfg.warmup_steps, cfg.total_steps, cfg.lr_schedule, cfg.min_lr_ratio
        ),
    )
    return opt, sched


def init_adam_state(opt: torch.optim.Optimizer) -> None:
    """Adam's moments and step now, as its first step would make them (zeros, step 0, on the
    devices and in the dtypes torch chooses). Made lazily, they land in the blocks the first
    backward freed and pin those segments for the rest of the run; made here, they sit beside the
    weights, and the first update already plans around them. Same numbers either way."""
    for group in opt.param_groups:
        on_device = group.get("fused") or group.get("capturable")
        for p in group["params"]:
            state = opt.state[p]
            if state:
                continue
            dev = p.device if on_device else "cpu"
            state["step"] = torch.zeros((), dtype=torch.float32, device=dev)
            for key in ("exp_avg", "exp_avg_sq") + (
                ("max_exp_avg_sq",) if group["amsgrad"] else ()
            ):
                state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)


def apply_hparams(
    opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LambdaLR, cfg: LearnerConfig
) -> dict[str, tuple[Any, Any]]:
    """After a resume: the optimizer's hyperparameters are this run's config, not the
    checkpoint's (loading an optimizer state restores its param groups' lr, betas, eps and
    weight decay, and the schedule's base lr, silently). The schedule's position is kept: the
    new lr takes over at the step the run resumes from. Returns what changed, {setting:
    (checkpoint's, now)}, for the driver to print."""
    want = {"betas": tuple(cfg.betas), "eps": cfg.eps, "weight_decay": cfg.weight_decay}
    changed: dict[str, tuple[Any, Any]] = {}
    old_base = list(sched.base_lrs)
    if any(not math.isclose(b, cfg.lr, rel_tol=1e-12, abs_tol=0.0) for b in old_base):
        changed["lr"] = (old_base[0], cfg.lr)
    sched.base_lrs = [cfg.lr for _ in opt.param_groups]
    factors = [lam(sched.last_epoch) for lam in sched.lr_lambdas]
    for group, factor in zip(opt.param_groups, factors, strict=True):
        group["initial_lr"] = cfg.lr
        group["lr"] = cfg.lr * factor
        for key, value in want.items():
            have = tuple(group[key]) if key == "betas" else group[key]
            if have != value:
                changed.setdefault(key, (have, value))
                group[key] = value
    sched._last_lr = [g["lr"] for g in opt.param_groups]  # what get_last_lr() reports
    return changed


def grad_norm_and_clip(model: nn.Module, max_norm: float) -> float:
    """Global L2 norm of all gradients (over ranks); clips in place when max_norm > 0."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)


def all_ranks_finite(value: float, device: torch.device) -> bool:
    """True when `value` is finite on every rank (so all ranks agree to step or to skip)."""
    flag = torch.tensor([0.0 if math.isfinite(value) else 1.0], device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() == 0.0
