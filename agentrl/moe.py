"""Mixture-of-experts routing, read and replayed (learner.routing_replay; R3, rollout routing
replay).

A sparse MoE layer's router scores every expert for a token and keeps the top k. Two forwards of
the same weights can keep different experts for a token (bf16 in the engine against fp32 in the
learner, another kernel's summation order), and one flipped expert moves that token's logprob by
far more than rounding does: the policy ratio then compares two different networks. With replay
the engine returns the experts it routed each position to, and the learner's forward uses them:

    with replay(model, routes_MR):       # routes_MR [tokens in the forward's order, layers * k]
        out = model(...)                 # every router keeps the engine's experts (-1: its own)

The experts' weights still come from the learner's router, softmax over its logits at the
replayed experts (renormalised as the router renormalises), so the router still learns. The
engine side reads routes the same way (`capture`): the dev server (agentrl/engine/dev) answers
`return_routed_experts` with them, as SGLang does with --enable-return-routed-experts.

Routers are found by their transformers shape: modules named `*TopKRouter` returning
(router_logits, router_scores, router_indices) (Qwen2/3-MoE, Qwen3.5-MoE, Mixtral, OLMoE,
gpt-oss, …), in layer order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn


def routers(model: nn.Module) -> list[nn.Module]:
    """The model's MoE routers, in layer order (empty for a dense model)."""
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]


def top_k(model: nn.Module) -> tuple[int, int]:
    """(MoE layers, experts per token); (0, 0) for a dense model."""
    found = routers(model)
    return (len(found), int(found[0].top_k)) if found else (0, 0)


@contextmanager
def capture(model: nn.Module) -> Iterator[list[Tensor]]:
    """Inside, every forward appends the experts each router kept: one [tokens, k] int tensor
    per router call, in call order (layer order within a forward)."""
    seen: list[Tensor] = []
    hooks = [
        r.register_forward_hook(lambda _m, _a, out: seen.append(out[2].detach().to(torch.int32)))
        for r in routers(model)
    ]
    try:
        yield seen
    finally:
        for h in hooks:
            h.remove()


def routes_of(model: nn.Module, ids: list[int]) -> Tensor:
    """[len(ids), layers * k] int32: the experts `model` routes each position of `ids` to in one
    forward (the dev server's answer to return_routed_experts)."""
    layers, k = top_k(model)
    if not layers:
        raise ValueError("the model has no mixture-of-experts router to return routes of")
    device = next(model.parameters()).device
    with torch.no_grad(), capture(model) as seen:
        model(input_ids=torch.tensor([ids], device=device), use_cache=False, logits_to_keep=1)
    return torch.cat([s.reshape(len(ids), k) for s in seen], dim=1).cpu()


def _weights(router: nn.Module, logits: Tensor, idx: Tensor) -> Tensor:
    """The experts `idx`'s mixing weights from the router's own logits: softmax over all experts
    at `idx`, renormalised over them unless the router does not (Qwen's norm_topk_prob=False)."""
    if getattr(router, "norm_topk_prob", True):
        return torch.softmax(logits.float().gather(-1, idx), dim=-1)
    return torch.softmax(logits.float(), dim=-1).gather(-1, idx)


@contextmanager
def replay(model: nn.Module, routes_MR: Tensor | None) -> Iterator[None]:
    """Every router call inside keeps the experts of `routes_MR` ([M tokens in the forward's
    flattened order, layers * k]; a row of -1: the router's own choice), layer l reading columns
    l*k:(l+1)*k. Covers backward too when the block recomputes its forward (activation
    checkpointing): keep the context open over forward and backward. None: no replay."""
    if routes_MR is None:
        yield
        return
    found = routers(model)
    layers, k = len(found), int(found[0].top_k) if found else 0
    if not found or routes_MR.shape[1] != layers * k:
        raise ValueError(
            f"routing replay: the routes have {routes_MR.shape[1]} experts per position, the "
            f"model has {layers} MoE layers x {k} experts per token; learner.routing_replay "
            "needs the engine to serve the same model"
        )

    def hook_for(layer: int) -> Any:
        def hook(router: nn.Module, _args: Any, out: tuple[Tensor, Tensor, Tensor]) -> Any:
            logits, scores, idx = out
            given = routes_MR[:, layer * k : (layer + 1) * k].to(idx.device, idx.dtype)
            if given.shape[0] != idx.shape[0]:
                raise ValueError(
                    f"routing replay: {given.shape[0]} routed positions for a router call over "
                    f"{idx.shape[0]} tokens"
                )
            use = given[:, :1] >= 0
            idx = torch.where(use, given, idx)
            return logits, _weights(router, logits, idx).to(scores.dtype), idx

        return hook

    hooks = [r.register_forward_hook(hook_for(n)) for n, r in enumerate(found)]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


# -- expert weights: the learner's layout and a checkpoint's ---------------------------------
# transformers >= 5 holds a sparse layer's experts as one 3-D parameter per projection:
# `...mlp.experts.gate_up_proj` [E, 2I, H] (each expert's gate rows, then its up rows) and
# `...mlp.experts.down_proj` [E, H, I]. Checkpoints on the hub and the loaders of SGLang and vLLM
# keep one 2-D weight per expert: `...mlp.experts.{e}.gate_proj.weight` [I, H], `.up_proj.weight`
# and `.down_proj.weight` [H, I] (Qwen2-MoE, Qwen3-MoE, Qwen3.5-MoE, OLMoE). `to_checkpoint` splits
# (views, no copy: a push through a server's load_weights, a checkpoint's files),
# `from_checkpoint` stacks back (resume, the dev server); SGLang's fused-MoE parameters
# (`w13_weight` [E, 2I, H], gate first, `w2_weight` [E, H, I]) have the learner's layout already,
# so the `direct` push copies them as they are (`SGLANG_DIRECT`). Dense names pass unchanged.

# fused parameter -> the per-expert projections stacked in it, in order along dim 0 of an expert
FUSED_EXPERTS = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}
SGLANG_DIRECT = {"gate_up_proj": "w13_weight", "down_proj": "w2_weight"}


def fused_expert(name: str) -> tuple[str, str] | None:
    """(the experts module's name, the fused parameter) for a fused expert parameter's name,
    e.g. ("model.layers.0.mlp.experts", "gate_up_proj"); None for any other name."""
    head, _, leaf = name.rpartition(".")
    return (head, leaf) if head.endswith(".experts") and leaf in FUSED_EXPERTS else None


def to_checkpoint(items: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's (name, tensor) pairs of the learner's: fused experts split per expert."""
    for name, t in items:
        fused = fused_expert(name)
        if fused is None or t.dim() != 3:
            yield name, t
            continue
        head, leaf = fused
        projs = FUSED_EXPERTS[leaf]
        for e in range(t.shape[0]):
            for proj, part in zip(projs, t[e].chunk(len(projs), dim=0), strict=True):
                yield f"{head}.{e}.{proj}.weight", part


def checkpoint_shapes(name: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
    """`to_checkpoint`'s names and shapes for one parameter, without its tensor."""
    return [
        (n, tuple(t.shape)) for n, t in to_checkpoint([(name, torch.empty(shape, device="meta"))])
    ]


def from_checkpoint(
    tensors: dict[str, torch.Tensor], want: Iterable[str]
) -> dict[str, torch.Tensor]:
    """`tensors` (a checkpoint's) with every fused expert parameter in `want` that they lack
    stacked from its per-expert tensors (experts 0, 1, … while they last), which are dropped.
    Raises ValueError naming the missing weight when an expert has some of its projections but
    not all; a stack with experts missing is caught by the loaders' shape checks."""
    out = dict(tensors)
    for name in want:
        fused = fused_expert(name)
        if fused is None or name in out:
            continue
        head, leaf = fused
        projs = FUSED_EXPERTS[leaf]
        experts = []
        e = 0
        while f"{head}.{e}.{projs[0]}.weight" in out:
            keys = [f"{head}.{e}.{p}.weight" for p in projs]
            missing = [k for k in keys if k not in out]
            if missing:
                raise ValueError(f"checkpoint lacks {missing[0]}")
            experts.append(torch.cat([out.pop(k) for k in keys], dim=0))
            e += 1
        if experts:
            out[name] = torch.stack(experts)
    return out
