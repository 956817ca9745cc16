"""Which slice of each trained parameter each rank of a tensor-parallel SGLang engine holds
(`engine.tp`): the plan a push follows to hand every TP rank its own slices, from the learner
rank on the same GPU, without gathering the model on one GPU. Pure: names and shapes in, slices
out (`plan_tp`); `pack` cuts one rank's tensors into one flat buffer (what the colocated push sends
that rank, agentrl/learner/sync/tensor.py); `shard` cuts them one tensor each (the tests' check).

SGLang's layout (sglang/srt/layers/linear.py, vocab_parallel_embedding.py), tp ranks, H query
heads, K key/value heads of size d, intermediate size I, vocabulary V:
- q/k/v -> `qkv_proj` (QKVParallelLinear): rank r holds query heads [r H/tp, (r+1) H/tp) and, if
  tp <= K, kv heads [r K/tp, (r+1) K/tp); if tp > K, kv head r // (tp/K), one copy on each of
  tp/K ranks. Its rows are q | k | v (weights and biases alike).
- gate/up -> `gate_up_proj` (MergedColumnParallelLinear): rows [r I/tp, (r+1) I/tp) of each,
  gate | up.
- o_proj, down_proj (RowParallelLinear): columns (dim 1) [r n/tp, (r+1) n/tp).
- embed_tokens, lm_head (VocabParallelEmbedding, ParallelLMHead): rows [r V'/tp, (r+1) V'/tp) of
  the vocabulary padded to V' = a multiple of 64; a rank's rows past V are padding (zeros).
- anything else (layer norms, q_norm/k_norm): whole on every rank.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from agentrl.learner.ipc import FUSED
from agentrl.learner.memory import Heads

VOCAB_PAD = 64  # SGLang's DEFAULT_VOCAB_PADDING_SIZE
ROW_PARALLEL = ("o_proj", "down_proj")
VOCAB_PARALLEL = ("embed_tokens", "lm_head")


@dataclass(frozen=True)
class Piece:
    """Rows/columns [start, stop) of `source` along `dim` land at `offset` of `target` (along
    the same dim) on one TP rank, whose `target` has `target_size` along dim."""

    source: str
    target: str
    dim: int
    start: int
    stop: int
    offset: int
    target_size: int


def plan_tp(
    shapes: Sequence[tuple[str, tuple[int, ...]]], tp: int, heads: Heads
) -> list[list[Piece]]:
    """Per TP rank, the pieces of every parameter it holds (checkpoint names and full shapes)."""
    if tp < 1 or heads.num_heads % tp or (heads.num_kv_heads % tp and tp % heads.num_kv_heads):
        raise ValueError(
            f"engine.tp={tp} does not divide {heads.num_heads} query heads and "
            f"{heads.num_kv_heads} key/value heads (nor do they divide it)"
        )
    ranks: list[list[Piece]] = [[] for _ in range(tp)]
    fused: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {}
    for name, shape in shapes:
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in FUSED:
            target = ".".join([*parts[:-2], FUSED[parts[-2]][0], parts[-1]])
            fused.setdefault(target, {})[parts[-2]] = (name, shape)
            continue
        module = parts[-2] if len(parts) >= 2 else ""
        for r in range(tp):
            ranks[r].append(_plain(name, shape, module, r, tp))
    for target, members in fused.items():
        order = ("q_proj", "k_proj", "v_proj") if "qkv_proj" in target else ("gate_proj", "up_proj")
        if set(members) != set(order):
            raise ValueError(f"{target}: needs {list(order)}, got {sorted(members)}")
        for r in range(tp):
            rows = [_rows(m, members[m][1][0], r, tp, heads) for m in order]
            size = sum(stop - start for start, stop in rows)
            at = 0
            for m, (start, stop) in zip(order, rows, strict=True):
                ranks[r].append(Piece(members[m][0], target, 0, start, stop, at, size))
                at += stop - start
    return ranks


def _plain(name: str, shape: tuple[int, ...], module: str, r: int, tp: int) -> Piece:
    if module in ROW_PARALLEL and len(shape) == 2:
        n = _divide(shape[1], tp, name)
        return Piece(name, name, 1, r * n, (r + 1) * n, 0, n)
    if module in VOCAB_PARALLEL:
        per = _divide(-(-shape[0] // VOCAB_PAD) * VOCAB_PAD, tp, name)
        start, stop = min(r * per, shape[0]), min((r + 1) * per, shape[0])
        return Piece(name, name, 0, start, stop, 0, per)
    return Piece(name, name, 0, 0, shape[0], 0, shape[0])  # replicated (row-parallel biases too)


def _rows(module: str, rows: int, r: int, tp: int, heads: Heads) -> tuple[int, int]:
    """Rows [start, stop) of one fused member on rank r."""
    if module == "q_proj":
        n = heads.num_heads // tp * heads.head_dim
        return r * n, (r + 1) * n
    if module in ("k_proj", "v_proj"):
        k = heads.num_kv_heads
        first, count = (r * k // tp, k // tp) if tp <= k else (r // (tp // k), 1)
        return first * heads.head_dim, (first + count) * heads.head_dim
    n = _divide(rows, tp, module)
    return r * n, (r + 1) * n


def _divide(n: int, tp: int, what: str) -> int:
    if n % tp:
        raise ValueError(f"{what}: {n} is not divisible by engine.tp={tp}")
    return n // tp


def shard(full: dict[str, torch.Tensor], pieces: list[Piece]) -> dict[str, torch.Tensor]:
    """One TP rank's tensors, cut from the full ones by its pieces (padding rows are zeros)."""
    out: dict[str, torch.Tensor] = {}
    for p in pieces:
        src = full[p.source]
        if p.target not in out:
            shape = list(src.shape)
            shape[p.dim] = p.target_size
            out[p.target] = torch.zeros(shape, dtype=src.dtype)
        n = p.stop - p.start
        out[p.target].narrow(p.dim, p.offset, n).copy_(src.narrow(p.dim, p.start, n))
    return out


def pack(
    get: Callable[[str], torch.Tensor],
    pieces: Sequence[Piece],
    dtype: torch.dtype,
    device: torch.device | str,
) -> tuple[torch.Tensor, list[tuple[str, torch.Tensor]]]:
    """One TP rank's tensors (SGLang's names and per-rank shapes) as named views of ONE flat
    `dtype` buffer on `device`: one allocation and one IPC handle per bucket. `get(name)` gives a
    full source tensor; each piece is cast and copied once, straight into its slot; rows past the
    last piece (the vocabulary's padding) are zeros."""
    sources = {p.source: get(p.source) for p in pieces}
    shapes: dict[str, list[int]] = {}
    filled: dict[str, int] = {}
    dims: dict[str, int] = {}
    for p in pieces:
        if p.target not in shapes:
            shape = list(sources[p.source].shape)
            shape[p.dim] = p.target_size
            shapes[p.target], filled[p.target], dims[p.target] = shape, 0, p.dim
        if p.offset != filled[p.target]:
            raise ValueError(f"{p.target}: pieces must fill it in order, got {p}")
        filled[p.target] += p.stop - p.start
    flat = torch.empty(sum(math.prod(s) for s in shapes.values()), dtype=dtype, device=device)
    views: dict[str, torch.Tensor] = {}
    at = 0
    for target, shape in shapes.items():
        views[target] = flat[at : at + math.prod(shape)].view(shape)
        at += math.prod(shape)
    for p in pieces:
        n = p.stop - p.start
        views[p.target].narrow(p.dim, p.offset, n).copy_(
            sources[p.source].narrow(p.dim, p.start, n)
        )
    for target, view in views.items():
        dim = dims[target]
        view.narrow(dim, filled[target], view.shape[dim] - filled[target]).zero_()
    return flat, list(views.items())
