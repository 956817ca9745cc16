"""CUDA-IPC payloads for SGLang's `/update_weights_from_tensor` (the colocated hybrid engine).

One bucket of full tensors is flattened into ONE contiguous uint8 CUDA tensor (SGLang's
`flattened_bucket` load format), so a whole bucket crosses the process boundary as a single
CUDA-IPC handle instead of one handle per parameter. The payload is what SGLang itself expects:
`MultiprocessingSerializer.serialize({"flattened_tensor", "metadata"}, output_str=True)` with
SGLang's torch-reduction patch (devices named by UUID, so the server maps them to its own index).

The `direct` layout goes further: SGLang's `load_format="direct"` copies each tensor straight into
the server parameter of that name, skipping the model's `load_weights` (name mapping, q/k/v and
gate/up fusing, one Python call per checkpoint tensor), which dominates the naive update. So the
learner fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj` (the layout of SGLang's
QKV/merged-column linears at TP 1) while packing them into ONE flat buffer, and sends views of
it: one CUDA-IPC memory handle per bucket (the receiver opens a storage once and caches it).
`direct_groups` is a pure plan of that fusing; unknown layouts fall back (weight_sync.py).

The sender must keep the flattened tensor alive until the server has loaded it: `IpcHold` keeps
the last payload's tensor until `release()`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from agentrl import moe

# checkpoint module name -> (SGLang's fused module, position in it): Llama/Qwen2/Qwen3/Mistral
FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
         "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}  # fmt: skip
FUSED_SIZE = {"qkv_proj": 3, "gate_up_proj": 2}


def direct_groups(names: Sequence[str]) -> list[tuple[str, list[str]]]:
    """[(SGLang parameter name, the checkpoint names concatenated into it along dim 0, in
    order)], in first-appearance order; unfused names map to themselves. Raises ValueError when
    a fused group is incomplete (e.g. a bucket split it)."""
    groups: dict[str, tuple[int, list[tuple[int, str]]]] = {}  # target -> (parts, members)
    for name in names:
        parts = name.split(".")
        if moe.fused_expert(name):  # SGLang's fused-MoE parameter, the same layout (moe.py)
            target, pos, want = ".".join([*parts[:-1], moe.SGLANG_DIRECT[parts[-1]]]), 0, 1
        elif len(parts) >= 2 and parts[-2] in FUSED:
            fused, pos = FUSED[parts[-2]]
            target, want = ".".join([*parts[:-2], fused, parts[-1]]), FUSED_SIZE[fused]
        else:  # copied as is (also a checkpoint that is fused already)
            target, pos, want = name, 0, 1
        groups.setdefault(target, (want, []))[1].append((pos, name))
    out = []
    for target, (want, members) in groups.items():
        if sorted(p for p, _ in members) != list(range(want)):
            raise ValueError(f"{target}: needs {want} parts, got {[n for _, n in members]}")
        out.append((target, [n for _, n in sorted(members)]))
    return out


def pack_direct(
    get: Callable[[str], torch.Tensor],
    groups: list[tuple[str, list[str]]],
    dtype: torch.dtype,
    device: torch.device | str,
    mark: Callable[[str], None] | None = None,
) -> tuple[torch.Tensor, list[tuple[str, torch.Tensor]]]:
    """One flat `dtype` buffer on `device` holding every group's concatenation along dim 0, and
    the named views of it SGLang's `direct` loader copies from. `get(name)` gives the full source
    tensor; each is cast and copied once, straight into its slot. `mark(part)` is called after
    each part (gather, alloc, copy) for the caller's timings."""
    mark = mark or (lambda _: None)
    parts = [[get(n) for n in names] for _, names in groups]
    mark("gather")
    total = sum(t.numel() for ts in parts for t in ts)
    flat = torch.empty(total, dtype=dtype, device=device)
    mark("alloc")
    views, slots, at = [], [], 0
    for (target, _), ts in zip(groups, parts, strict=True):
        shape = (sum(t.shape[0] for t in ts), *ts[0].shape[1:])
        view = flat[at : at + math.prod(shape)].view(shape)
        row = 0
        for t in ts:
            slots.append(view[row : row + t.shape[0]])
            row += t.shape[0]
        views.append((target, view))
        at += view.numel()
    # one multi-tensor cast-and-copy instead of a launch per tensor (host-bound otherwise)
    torch._foreach_copy_(slots, [t for ts in parts for t in ts])
    mark("copy")
    return flat, views


def serialize(data: object) -> str:
    """SGLang's base64 payload of tensors shared over CUDA IPC (its torch-reduction patch names
    devices by UUID, so the server maps them to its own index)."""
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions

    monkey_patch_torch_reductions()
    return MultiprocessingSerializer.serialize(data, output_str=True)


def flattened_payload(named: list[tuple[str, torch.Tensor]]) -> tuple[str, torch.Tensor]:
    """(base64 payload for one server rank, the flattened CUDA tensor it points to)."""
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    bucket = FlattenedTensorBucket(named_tensors=named)
    flat = bucket.get_flattened_tensor()
    return serialize({"flattened_tensor": flat, "metadata": bucket.get_metadata()}), flat


class IpcHold:
    """Tensors whose IPC handles are in flight; dropped once the server has answered."""

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []

    def keep(self, t: torch.Tensor) -> None:
        self.tensors.append(t)

    def release(self) -> None:
        self.tensors.clear()
