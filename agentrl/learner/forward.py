"""Forward passes of the learner: per-token logprobs, entropies and critic values of a packed
micro-batch (`TrainBatch`), computed from the decoder's hidden states so the [N, V] logits never
exist at once.

Legend: N tokens (of a packed row), H hidden, V vocab, B rows, T columns of a padded batch.

    lp_N, ent_N = token_logprobs(model, mb, temperature=1.0, with_entropy=True)
    values_N = token_values(critic, mb)
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from torch import Tensor, nn

from agentrl import moe
from agentrl.batch import TrainBatch
from agentrl.learner import memory
from agentrl.learner.vocab_head import head_logprobs

# ---------------------------------------------------------------------------------------------
# Logprobs from a model


def logprobs_from_hidden(
    hidden_NH: Tensor,
    weight_VH: Tensor,
    token_ids_N: Tensor,
    position_ids_N: Tensor,
    mask_N: Tensor | None = None,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int | None = None,
    kernel: str = "torch",
    compiled: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Per-token logprobs (and entropies) of `token_ids_N` from the final hidden states.

    Output [N] aligned with the ids: out[t] = log p(token_t | the tokens before it in its
    sequence), read from hidden[t-1]; 0 at each sequence's first token, and (with `mask_N`) 0
    wherever the mask is 0 — those positions never reach the vocabulary projection. Logits are
    built `chunk_tokens` rows at a time and never kept: backward recomputes each chunk's
    (vocab_head.py), so memory holds one [chunk, V] block, not [N, V]. `kernel`: "triton" (CUDA)
    or "torch" for the softmax arithmetic; `compiled`: the torch one through torch.compile.
    """
    n = token_ids_N.numel()
    want = position_ids_N > 0
    if mask_N is not None:
        want = want & mask_N.bool()
    idx = want.nonzero().squeeze(-1)
    zeros = torch.zeros(n, dtype=torch.float32, device=hidden_NH.device)
    if idx.numel() == 0:
        if torch.is_grad_enabled() and (hidden_NH.requires_grad or weight_VH.requires_grad):
            # Nothing to score (a padding micro-batch): stay connected to the model with an exact
            # zero, so backward still runs and FSDP's gradient collectives stay in step across
            # ranks.
            zeros = zeros + (hidden_NH[:0].sum() + weight_VH[:0].sum()).float()
        return zeros, (zeros if with_entropy else None)
    lp, ent = head_logprobs(
        hidden_NH[idx - 1],
        weight_VH,
        token_ids_N[idx],
        temperature=temperature,
        with_entropy=with_entropy,
        kernel=kernel,
        chunk_tokens=chunk_tokens,
        compiled=compiled,
    )
    logprobs = zeros.index_copy(0, idx, lp)
    entropy = zeros.index_copy(0, idx, ent) if ent is not None else None
    return logprobs, entropy


def padded_rows(position_ids_N: Tensor) -> tuple[Tensor, Tensor]:
    """(row, column) of each token of a packed row when its sequences (each starting at position
    0) are laid out as the rows of a right-padded [B, T] batch."""
    n = position_ids_N.numel()
    starts = torch.nonzero(position_ids_N == 0).flatten()
    if starts.numel() == 0 or int(starts[0]) != 0:
        raise ValueError("a packed row must start a sequence at position 0")
    lengths = torch.diff(torch.cat([starts, starts.new_tensor([n])]))
    rows = torch.repeat_interleave(torch.arange(len(starts), device=starts.device), lengths)
    cols = torch.arange(n, device=starts.device) - starts[rows]
    return rows, cols


def last_hidden_state(
    model: torch.nn.Module, token_ids_N: Tensor, position_ids_N: Tensor, layout: str = "packed"
) -> Tensor:
    """Final hidden states [N, H] of a transformers causal LM on one packed row.

    `layout="packed"` runs the row as is (the model masks attention between its sequences: a
    dense [N, N] mask unless the attention kernel takes sequence boundaries); `"padded"` runs the
    sequences as the rows of a right-padded batch under a plain causal mask (cost: rows × the
    longest sequence², no mask tensor), then gathers the real tokens back into packed order.
    Calls the top-level module (so FSDP2's root hooks run) with `logits_to_keep` empty, so the
    model itself never builds logits, and reads the decoder's output through a forward hook.
    """
    if layout == "padded":
        rows, cols = padded_rows(position_ids_N)
        width = int(cols.max()) + 1
        ids_BT = token_ids_N.new_zeros((int(rows[-1]) + 1, width))
        ids_BT[rows, cols] = token_ids_N
        pos_BT = torch.arange(width, device=ids_BT.device).expand_as(ids_BT)
        return _decoder_output(model, ids_BT, pos_BT)[rows, cols]
    if layout != "packed":
        raise ValueError(f"unknown attention layout {layout!r}; use packed or padded")
    return _decoder_output(model, token_ids_N[None], position_ids_N[None])[0]


def _decoder_output(model: torch.nn.Module, ids_BT: Tensor, pos_BT: Tensor) -> Tensor:
    decoder = model.get_decoder()  # type: ignore[operator]
    seen: list[Tensor] = []
    handle = decoder.register_forward_hook(lambda _m, _i, out: seen.append(out[0]))
    try:
        model(
            input_ids=ids_BT,
            position_ids=pos_BT,
            attention_mask=None,
            use_cache=False,
            logits_to_keep=torch.zeros(0, dtype=torch.long, device=ids_BT.device),
        )
    finally:
        handle.remove()
    if len(seen) != 1:
        raise RuntimeError(f"expected one decoder call in the model's forward, saw {len(seen)}")
    return seen[0]


def token_logprobs(
    model: torch.nn.Module,
    mb: TrainBatch,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int | None = None,
    all_tokens: bool = False,
    layout: str = "packed",
    kernel: str = "torch",
    compiled: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Trainer logprobs [N] (and entropies) of a packed micro-batch, aligned with mb.token_ids.

    Only loss_mask 1 tokens are computed (others are 0) unless `all_tokens`. `temperature` must
    match the one the engine's logprobs were computed at.
    """
    hidden = last_hidden_state(model, mb.token_ids, mb.position_ids, layout)
    weight = model.get_output_embeddings().weight  # type: ignore[operator]
    return logprobs_from_hidden(
        hidden,
        weight,
        mb.token_ids,
        mb.position_ids,
        None if all_tokens else mb.loss_mask,
        temperature=temperature,
        with_entropy=with_entropy,
        chunk_tokens=chunk_tokens,
        kernel=kernel,
        compiled=compiled,
    )


def routes_in_order(mb: TrainBatch, layout: str = "packed") -> Tensor | None:
    """The micro-batch's replayed routes (learner.routing_replay) in the order its forward
    flattens tokens: packed, the row as it is; padded, the [B, T] batch row by row, -1 on the
    padding. None without routes."""
    if mb.routes is None:
        return None
    if layout != "padded":
        return mb.routes
    rows, cols = padded_rows(mb.position_ids)
    width = int(cols.max()) + 1
    out = mb.routes.new_full(((int(rows[-1]) + 1) * width, mb.routes.shape[1]), -1)
    out[rows * width + cols] = mb.routes
    return out


def token_values(model: nn.Module, mb: TrainBatch, layout: str = "padded") -> torch.Tensor:
    """Critic values [N] of a packed micro-batch, aligned like logprobs: values[t] is the value of
    the state in which token t was chosen (read at position t-1); 0 at each sequence's start.
    `layout` as in `last_hidden_state` (padded: rows of a right-padded batch under a
    causal mask; packed: one row, the model masks between sequences)."""
    if layout == "padded":
        rows, cols = padded_rows(mb.position_ids)
        width = int(cols.max()) + 1
        ids_BT = mb.token_ids.new_zeros((int(rows[-1]) + 1, width))
        ids_BT[rows, cols] = mb.token_ids
        pos_BT = torch.arange(width, device=ids_BT.device).expand_as(ids_BT)
        out = model(input_ids=ids_BT, position_ids=pos_BT, attention_mask=None, use_cache=False)
        v = out.logits[rows, cols, 0].float()
    else:
        out = model(
            input_ids=mb.token_ids[None],
            position_ids=mb.position_ids[None],
            attention_mask=None,
            use_cache=False,
        )
        v = out.logits[0, :, 0].float()
    shifted = torch.cat([v.new_zeros(1), v[:-1]])
    return torch.where(mb.position_ids > 0, shifted, 0.0)


def replayed(model: nn.Module, mb: TrainBatch, layout: str) -> AbstractContextManager[None]:
    """learner.routing_replay: the MoE routers keep the engine's experts for `mb`'s tokens
    (agentrl/moe.py), over forward and backward; a no-op for a batch without routes."""
    if mb.is_padding or mb.routes is None:
        return nullcontext()
    return moe.replay(model, routes_in_order(mb, layout))


def head_bytes(model: nn.Module) -> int:
    """The vocabulary head's fp32 logit chunks in flight (none for a critic's value head)."""
    out_emb = model.get_output_embeddings()
    return memory.head_chunk_bytes(out_emb.weight.shape[0]) if out_emb is not None else 0


def activation_tokens(mb: TrainBatch, layout: str) -> int:
    """Token positions a micro-batch's forward holds activations for: its tokens when packed,
    rows x the longest sequence when right-padded."""
    n = int(mb.token_ids.numel())
    if layout != "padded" or n == 0:
        return n
    return int((mb.position_ids == 0).sum()) * (int(mb.position_ids.max()) + 1)
