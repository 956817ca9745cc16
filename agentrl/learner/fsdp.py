"""FSDP2 model and optimizer for one learner rank: build, shard, step, gather, save, offload.

Legend: B batch, T tokens, V vocab.

Everything here runs inside one worker process that already joined the learner's process group;
functions that gather (`gather_full`, `write_hf_dir`) are collectives: every rank calls them with
the same arguments, rank 0 gets (or writes) the full tensors, the other ranks get nothing.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from agentrl import moe
from agentrl.learner import Role, lora

# Files copied from the source model dir into every saved HF dir (besides config + weights), so
# a checkpoint is a complete `from_pretrained` / `--model-path` target on its own.
_HF_AUX_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)


@dataclass(frozen=True)
class ParamSpec:
    """Name, shape and dtype of one full (unsharded) parameter, as the rollout engine sees it."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32", "bfloat16", …

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=to_dtype(self.dtype)).element_size()


def to_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}; use float32, bfloat16 or float16")
    return dtype


# -- build --------------------------------------------------------------------------------------
def load_model(path: str | Path, role: Role) -> nn.Module:
    """A transformers model in fp32 (the master weights), its dropout off (`no_dropout`). The
    critic is the same backbone with a one-output token-classification head (its value per
    token)."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a "Loading weights" bar per rank and role is noise
    if role == "critic":
        model = AutoModelForTokenClassification.from_pretrained(
            path, num_labels=1, dtype=torch.float32
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return no_dropout(model)


def no_dropout(model: nn.Module) -> nn.Module:
    """Every dropout of `model` off (nn.Dropout modules, and the attention's own rate that
    transformers reads in training mode), in place. The update's forward must compute the
    policy the engine sampled from and the scoring pass computed: with dropout, pi / pi_old at
    the batch's first step is noise, not 1, and the critic's values move by noise against the
    values its clip compares with (a token-classification head adds dropout 0.1 by default:
    values 0.37 apart between two forwards of the tiny model)."""
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        for name, value in list(vars(m).items()):
            if "dropout" in name and isinstance(value, float):
                setattr(m, name, 0.0)
    return model


def fuse_kernels(model: nn.Module, mode: str, device_type: str) -> str:
    """learner.fused_kernels: liger-kernel's Triton RMSNorm, rotary embedding and SwiGLU in place
    of the model's own (far fewer kernels per block: the learner's update is launch-bound on
    GPUs); `auto` uses them on CUDA when liger-kernel is installed. Returns what was applied."""

    def unavailable(why: str) -> str:  # `liger` asked for them: an error; `auto`: without
        if mode == "liger":
            raise ValueError(f"learner.fused_kernels=liger {why}")
        return "off"

    if mode == "off":
        return "off"
    if device_type != "cuda":
        return unavailable("needs CUDA; use auto or off on CPU")
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError:
        return unavailable("needs liger-kernel: pip install 'agentrl[gpu]'")
    model_type = getattr(model.config, "model_type", "")
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        return unavailable(f"has no kernels for model type {model_type!r}")
    # the logits stay ours (forward.py computes them in chunks from the hidden states)
    _apply_liger_kernel_to_instance(
        model, rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
        fused_linear_cross_entropy=False,
    )  # fmt: skip
    return "liger"


def compile_blocks(model: nn.Module) -> int:
    """learner.compile: torch.compile each transformer block's `forward` (dynamic shapes: the
    micro-batches' lengths vary). Only the block's math is compiled; FSDP2's hooks and the
    activation-checkpointing wrapper around it stay eager. Returns how many blocks."""
    blocks = _blocks(model)
    for block in blocks:
        block.forward = torch.compile(block.forward, dynamic=True)
    return len(blocks)


def store_frozen_in(model: nn.Module, dtype: torch.dtype) -> int:
    """Keep the parameters that never train (a reference model, LoRA's base) in `dtype`: with
    bf16 compute they are cast to bf16 at every all-gather anyway, so an fp32 copy of them is
    memory spent on nothing (half a 7B base: 14 GB). Returns how many bytes this saved."""
    saved = 0
    for p in model.parameters():
        if not p.requires_grad and p.dtype != dtype and p.is_floating_point():
            saved += p.numel() * (p.element_size() - torch.empty((), dtype=dtype).element_size())
            p.data = p.data.to(dtype)
    return saved


def blocks(model: nn.Module) -> list[nn.Module]:
    """The model's transformer blocks, in order; call before `shard_model` (FSDP2 renames their
    classes, which is how they are found)."""
    return _blocks(model)


def set_checkpointed(blocks: list[nn.Module], count: int) -> None:
    """Recompute the first `count` blocks in backward, keep the others' activations (the blocks
    of a model on which `shard_model(checkpointing=True)` enabled checkpointing)."""
    for i, block in enumerate(blocks):
        block.gradient_checkpointing = i < count


def max_over_ranks(value: int, device: torch.device) -> int:
    """The largest `value` of all ranks (every rank then takes the same decision)."""
    t = torch.tensor([value], device=device, dtype=torch.int64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks (HF lists their class in `_no_split_modules`)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(
            f"{type(model).__name__}: found no transformer blocks to shard "
            f"(_no_split_modules={sorted(names)}); this model is not supported by the learner"
        )
    return blocks


def shard_model(
    model: nn.Module, device: torch.device, bf16: bool, checkpointing: bool, reshard: bool
) -> nn.Module:
    """Move to `device` and apply FSDP2: one unit per block, then the root (embeddings, head)."""
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.to(device)
    mp = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32
    )
    for block in _blocks(model):
        fully_shard(block, mp_policy=mp, reshard_after_forward=reshard)
    # The root (embeddings, final norm, head) stays unsharded between forward and backward:
    # batch.token_logprobs applies the head's weight to the hidden states *after* the forward.
    fully_shard(model, mp_policy=mp, reshard_after_forward=False)
    # The loss is already divided by the global token count (all ranks, all micro-batches), so
    # ranks' gradients must be summed, not averaged.
    for unit in model.modules():
        if isinstance(unit, FSDPModule):  # both setters act on one unit, not its children
            unit.set_gradient_divide_factor(1.0)
            if hasattr(unit, "set_force_sum_reduction_for_comms"):  # torch >= 2.8
                unit.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    # A rank whose micro-batch leaves a parameter unused (a padding micro-batch, an untied head)
    # still joins that parameter's reduce-scatter, with zeros.
    if hasattr(model, "set_reduce_scatter_unused_params"):
        model.set_reduce_scatter_unused_params(True)
    return model


# -- gather / save ------------------------------------------------------------------------------
def param_specs(model: nn.Module, dtype: str | None = None) -> list[ParamSpec]:
    """Full shapes of the parameters the engine needs (tied weights once), in a fixed order;
    with LoRA, the base model's, in its own names (adapters are merged in: lora.py)."""
    named = list(model.named_parameters())
    if lora.is_lora(model):
        params = dict(named)
        named = [(e, params[src]) for e, (src, *_) in lora.sources(model).items()]
    out = []
    for name, p in named:
        shape = tuple(p.shape)  # a DTensor reports its global shape
        out.append(ParamSpec(name, shape, dtype or str(p.dtype).removeprefix("torch.")))
    return out


def plan_buckets(specs: list[ParamSpec], bucket_bytes: int) -> list[list[ParamSpec]]:
    """Greedy contiguous buckets of at most `bucket_bytes` (a bigger tensor gets its own)."""
    buckets: list[list[ParamSpec]] = []
    size = 0
    for s in specs:
        if not buckets or (size + s.nbytes > bucket_bytes and buckets[-1]):
            buckets.append([])
            size = 0
        buckets[-1].append(s)
        size += s.nbytes
    return buckets


def full_param(p: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Collective (with >1 shard): the full tensor of a (possibly FSDP-sharded) parameter. One
    shard is already the whole tensor: no collective, no copy. With `dtype` each shard is cast
    before the gather (the same numbers as casting after it; a bf16 gather moves half the bytes
    of an fp32 one)."""
    if isinstance(p, DTensor) and p.device_mesh.size() == 1:
        p = p.to_local()  # before anything else: DTensor ops cost ~15 us each on the host
    p = p.detach()
    if dtype is not None and p.dtype != dtype and p.is_floating_point():
        p = p.to(dtype)
    return p.full_tensor() if isinstance(p, DTensor) else p


def gather_adapters(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Collective: a LoRA model's adapter tensors, full, as host copies (in `dtype`, or their
    own), in the model's names: what `lora.save_adapter_files` writes."""
    return {n: full_param(p).to("cpu", dtype or p.dtype, copy=True)
            for n, p in lora.adapter_params(model)}  # fmt: skip


def gather_full(
    model: nn.Module,
    bucket: list[ParamSpec],
    rank: int,
    device: torch.device | None = None,
    every_rank: bool = False,
) -> dict[str, torch.Tensor]:
    """Collective: the full tensors of one bucket, cast to each spec's dtype, on rank 0 (on
    `device`, default CPU); an empty dict on other ranks, unless `every_rank` keeps them there
    too (each rank then cuts its own slices, e.g. for a tensor-parallel engine)."""
    keep = every_rank or rank == 0
    params = dict(model.named_parameters())
    srcs = lora.sources(model) if lora.is_lora(model) else None
    out: dict[str, torch.Tensor] = {}
    for s in bucket:
        if srcs is None:
            full = full_param(params[s.name], to_dtype(s.dtype))
        else:  # LoRA: the base weight with its adapter merged in
            base, a, b, scale = srcs[s.name]
            full = full_param(params[base])
            if a is not None and b is not None:
                la, lb = full_param(params[a]), full_param(params[b])
                full = lora.merged(full, la, lb, scale) if keep else full
        if keep:
            out[s.name] = full.to(device=device or "cpu", dtype=to_dtype(s.dtype)).contiguous()
        del full
    return out


def iter_full_buckets(
    model: nn.Module, buckets: list[list[ParamSpec]], rank: int, device: torch.device | None = None
) -> Iterator[dict[str, torch.Tensor]]:
    for bucket in buckets:
        yield gather_full(model, bucket, rank, device)


def write_hf_dir(
    model: nn.Module,
    out_dir: str | Path,
    src_dir: str | Path,
    buckets: list[list[ParamSpec]],
    rank: int,
    copy_aux: bool = True,
) -> None:
    """Collective: rank 0 writes a transformers model dir (config, safetensors shards + index,
    and with `copy_aux` the tokenizer files of `src_dir`), one shard per bucket, so memory stays
    one bucket."""
    shards = iter_full_buckets(model, buckets, rank)
    if rank != 0:
        for _ in shards:  # the gathers are collective
            pass
        return
    write_hf_files(shards, len(buckets), out_dir, src_dir, model.config, copy_aux)


def write_hf_files(
    shards: Iterable[dict[str, torch.Tensor]],
    n: int,
    out_dir: str | Path,
    src_dir: str | Path,
    config: Any,
    copy_aux: bool = True,
) -> None:
    """Rank 0's half of write_hf_dir: `n` shards of full tensors (gathered already) to files."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    for i, fused in enumerate(shards):
        # a checkpoint's layout (experts one by one, moe.py); a split expert is copied out of
        # its fused tensor (safetensors stores no views of a shared buffer)
        tensors = {n: t if n in fused else t.clone() for n, t in moe.to_checkpoint(fused.items())}
        fname = "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        for k, t in tensors.items():
            weight_map[k] = fname
            total += t.numel() * t.element_size()
    if n > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config.save_pretrained(out)
    for name in _HF_AUX_FILES if copy_aux else ():
        if (Path(src_dir) / name).exists() and not (out / name).exists():
            shutil.copy2(Path(src_dir) / name, out / name)


def load_full_state(model: nn.Module, hf_dir: str | Path) -> None:
    """Collective: load a saved HF dir's weights into the sharded model (rank 0 reads the files
    and broadcasts). Keys missing from the files (a tied head) keep their current values."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full: dict[str, torch.Tensor] = {}
    if dist.get_rank() == 0:
        if lora.is_lora(model):  # the adapters only; the base stays as loaded (lora.py)
            full = lora.load_adapter_file(hf_dir)
            want = {n for n, _ in lora.adapter_params(model)}
        else:
            for f in sorted(Path(hf_dir).glob("*.safetensors")):
                full.update(load_file(str(f)))
            want = {n for n, _ in model.named_parameters()}
            full = moe.from_checkpoint(full, want)  # experts stacked back (moe.py)
        missing = want - set(full)
        if missing:
            raise ValueError(f"{hf_dir}: checkpoint lacks {sorted(missing)[:5]}")
    set_model_state_dict(
        model,
        full,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False),
    )


# -- offload (colocated mode: the engine and the learner take turns on one GPU) -----------------
def move_optimizer_state(opt: torch.optim.Optimizer, device: torch.device | str) -> None:
    for state in opt.state.values():
        for k, v in state.items():
            if isinstance(v, torch.Tensor) and k != "step":
                state[k] = v.to(device, non_blocking=True)


def offload(
    model: nn.Module | None, opt: torch.optim.Optimizer | None, device: str = "cpu"
) -> None:
    """Move the (sharded) parameters and gradients, and the optimizer state, to `device` ("cpu"
    to free the GPU, "cuda" to bring them back). None: leave that part where it is.

    Every copy is non_blocking: a CUDA tensor copied to the CPU that way lands in pinned host
    memory (torch's caching host allocator, reused at the next offload), so both directions run
    at the link's speed and are queued back to back; one synchronisation ends the offload, and
    the onload's copies are ordered before the update's kernels on the same stream. Blocking
    copies into pageable memory ran at a fraction of it (bench/weight_sync_colocated.py)."""
    if model is not None:
        model.to(device, non_blocking=True)
    if opt is not None:
        move_optimizer_state(opt, device)
    if device == "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def set_deterministic() -> None:
    """torch's deterministic kernels (trainer.deterministic), set before CUDA makes a cuBLAS
    handle; an op with none (CUDA only) warns rather than stops the run."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


def set_worker_env(master_ip: str = "127.0.0.1") -> None:
    """With the process group's master on loopback (one node), bind gloo/NCCL's own sockets to
    `lo` unless the user chose an interface; across nodes leave the choice to the user
    (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME: `lo` would be wrong there). SGLang runs NCCL with
    NCCL_CUMEM_ENABLE=0; a trainer that joins its weight-update group with cuMem on fails in
    the P2P transport setup ("Cuda failure 'invalid argument'"), so match it."""
    if is_loopback(master_ip):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_CUMEM_ENABLE", "0")


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def host_state_bytes(model: nn.Module, opt: torch.optim.Optimizer | None) -> int:
    """Bytes of a rank's weights, gradients and optimizer state now in host memory (an
    offloaded learner's: the host's available memory does not count them)."""
    tensors = [t for p in model.parameters() for t in (p, p.grad) if t is not None]
    if opt is not None:
        tensors += [v for st in opt.state.values() for v in st.values()]
    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    return sum(
        t.numel() * t.element_size()
        for t in local
        if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dim() > 0
    )
