"""Trajectories -> TrainBatch -> packed micro-batches per data-parallel rank (data only: the
forward passes that read them are in agentrl/learner/forward.py).

Legend: N tokens (of a batch: sequences concatenated, no padding), S sequences, H hidden, V vocab.

What train.py and the learner do with it:

    from agentrl.batch import TrainBatch, micro_batches
    from agentrl.learner.forward import token_logprobs
    batch = TrainBatch.from_trajectories(trajs, adv.advantages)        # the whole step
    per_rank = micro_batches(batch, dp_size, max_tokens=8192)         # [rank][micro-batch]
    for mb in per_rank[rank]:                                          # same count on every rank
        logprobs, entropy = token_logprobs(model, mb, with_entropy=True)
        loss, metrics = get_loss(name)(LossInputs.from_batch(mb, logprobs, entropy=entropy), cfg)
        loss.backward()  # ranks' gradients are summed (learner/fsdp.py); see agentrl/loss.py

A micro-batch is itself a TrainBatch: one row of whole sequences, position_ids restarting at 0 at
each sequence. transformers 5.x reads those restarts as sequence boundaries and builds a
block-diagonal causal mask (sdpa/eager; flash-attention varlen reads the same restarts) when the
model is called with `attention_mask=None` and `use_cache=False`. tests/unit/test_batch.py checks
packed == unpacked logprobs on a real Qwen3 for sdpa and eager.
Every micro-batch carries the GLOBAL loss normaliser of the step (`norm`), so summing the losses of
all micro-batches on all ranks gives the full-batch loss (see agentrl/loss.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from agentrl.advantage import Truncation
from agentrl.types import Trajectory


@dataclass(frozen=True)
class LossNorm:
    """Global counts over all ranks and micro-batches of one optimizer step: what a loss divides
    by, so that splitting a batch into micro-batches does not change it."""

    num_tokens: int  # tokens with loss_mask 1
    num_seqs: int  # sequences with at least one such token


_OPTIONAL = ("trainer_old_logprobs", "ref_logprobs", "values", "returns")


def trainable(t: Trajectory, truncation: Truncation | None = None) -> bool:
    """Whether a trajectory has a token to train on: it is not an infrastructure failure, it
    sampled something, and it is not masked as truncated (rollout.truncated=mask:
    `Truncation.masked`). The one rule `TrainBatch.from_trajectories` and the trainer's
    empty-step check share."""
    masked = truncation is not None and truncation.masked(t)
    return not t.stop_reason.is_infra_failure and t.num_sampled > 0 and not masked


@dataclass
class TrainBatch:
    """Aligned per-token tensors of whole sequences, concatenated. Every tensor is [N].

    Worked example: two sequences. Sequence 0 is prompt / assistant (tool call) / tool /
    assistant; sequence 1 is prompt / assistant. (P prompt, A sampled, O observation = tool output
    plus the template tokens around it; l logprob from the engine; a advantage.)

        token:          P  P  P  A  A  A  O  O  O  O  A  A  |  P  P  A  A
        token_ids:      p0 p1 p2 a0 a1 a2 o0 o1 o2 o3 a3 a4 |  q0 q1 b0 b1
        position_ids:   0  1  2  3  4  5  6  7  8  9  10 11 |  0  1  2  3
        seq_ids:        0  0  0  0  0  0  0  0  0  0  0  0  |  1  1  1  1
        loss_mask:      0  0  0  1  1  1  0  0  0  0  1  1  |  0  0  1  1
        old_logprobs:   0  0  0  l  l  l  0  0  0  0  l  l  |  0  0  l  l
        advantages:     0  0  0  a  a  a  0  0  0  0  a  a  |  0  0  a' a'
        norm:           LossNorm(num_tokens=7, num_seqs=2)

    old_logprobs[t] is log pi(token_t | tokens before it), from the rollout engine; the trainer's
    logprobs from `token_logprobs` are aligned the same way. Only loss_mask 1 tokens are trained on.
    `norm` is the step's global normaliser; micro-batches keep the one of the batch they came from.
    `source[s]` is the index, in the list given to `from_trajectories`, of sequence s.
    Optional [N] tensors: trainer_old_logprobs (the policy's logprobs recomputed by the trainer
    before the batch's first optimizer step: the PPO/GSPO denominator, see agentrl/loss.py),
    ref_logprobs (reference policy), values (critic before the update), returns (critic targets).
    """

    token_ids: Tensor  # int64
    position_ids: Tensor  # int64, 0.. within each sequence
    loss_mask: Tensor  # bool
    old_logprobs: Tensor  # float32
    advantages: Tensor  # float32
    seq_ids: Tensor  # int64, 0..S-1, non-decreasing
    norm: LossNorm
    source: list[int] = field(default_factory=list)
    trainer_old_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    values: Tensor | None = None
    returns: Tensor | None = None
    # learner.routing_replay: [N, layers * k] int32, the experts the engine routed each token to
    # (-1: none known, the learner's router decides; agentrl/moe.py)
    routes: Tensor | None = None
    is_padding: bool = False  # a dummy micro-batch so every rank runs the same number

    def __post_init__(self) -> None:
        n = self.token_ids.numel()
        named = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for k, v in named.items():
            if k == "routes" and v is not None and v.dim() == 2 and v.shape[0] == n:
                continue  # one row of experts per token
            if isinstance(v, Tensor) and (v.dim() != 1 or v.numel() != n):
                raise ValueError(f"TrainBatch.{k} has shape {tuple(v.shape)}, token_ids has ({n},)")
        if self.loss_mask.dtype != torch.bool:
            raise ValueError(f"TrainBatch.loss_mask must be bool, got {self.loss_mask.dtype}")
        if n == 0:
            raise ValueError("TrainBatch is empty (no sequence has a trainable token)")
        starts = _starts(self.seq_ids)
        step = torch.diff(self.seq_ids)
        if int(self.seq_ids[0]) != 0 or bool(((step != 0) & (step != 1)).any()):
            raise ValueError("TrainBatch.seq_ids must start at 0 and step by 0 or 1")
        expected = torch.arange(n) - starts.repeat_interleave(_lengths(self.seq_ids))
        if not torch.equal(self.position_ids.cpu(), expected):
            raise ValueError("TrainBatch.position_ids must count 0, 1, … within each sequence")
        if self.source and len(self.source) != self.num_seqs:
            raise ValueError(
                f"TrainBatch.source has {len(self.source)} entries for {self.num_seqs} seqs"
            )

    @property
    def num_tokens(self) -> int:
        return self.token_ids.numel()

    @property
    def num_seqs(self) -> int:
        return int(self.seq_ids[-1]) + 1

    @property
    def seq_lens(self) -> list[int]:
        return _lengths(self.seq_ids).tolist()

    def per_sequence(self, x_N: Tensor) -> list[Tensor]:
        """Split an [N] tensor aligned with this batch back into one tensor per sequence."""
        return list(torch.split(x_N, self.seq_lens))

    def replace(self, **changes: Any) -> TrainBatch:
        """A copy with some fields replaced (checked again), e.g. ref_logprobs=… or advantages=…."""
        return dataclasses.replace(self, **changes)

    def to(self, device: torch.device | str) -> TrainBatch:
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), Tensor)
        }
        return dataclasses.replace(self, **moved)

    @classmethod
    def from_trajectories(
        cls,
        trajs: Sequence[Trajectory],
        advantages: Sequence[Tensor | Sequence[float]] | None,
        truncation: Truncation | None = None,
        **optional: Sequence[Tensor | Sequence[float]] | None,
    ) -> TrainBatch:
        """Concatenate trajectories (each one sequence), with their per-token advantages.

        Trajectories that ended with an infrastructure failure, those with no sampled token and,
        given `truncation` (rollout.truncated=mask), truncated ones are left out (`trainable`):
        they carry no loss and do not count in the normaliser. Their loss mask is in effect 0. `advantages=None` gives zeros (to compute reference
        logprobs before the advantages, then `replace(advantages=…)`). `optional`: ref_logprobs,
        values, returns, each one per trajectory. Advantages are zeroed where loss_mask is 0.
        """
        for k in optional:
            if k not in _OPTIONAL:
                raise ValueError(f"unknown TrainBatch field {k!r}; optional ones: {_OPTIONAL}")
        per_traj = {"advantages": advantages, **optional}
        for k, xs in per_traj.items():
            if xs is not None and len(xs) != len(trajs):
                raise ValueError(f"{k} has {len(xs)} entries for {len(trajs)} trajectories")
        keep = [i for i, t in enumerate(trajs) if trainable(t, truncation)]
        if not keep:
            raise ValueError(
                f"no trainable trajectory among {len(trajs)} (all infra failures, no sampled "
                "tokens or truncated under rollout.truncated=mask); check the rollout's stop "
                "reasons"
            )
        cols: dict[str, list[Tensor]] = {k: [] for k in ("ids", "mask", "lp", "seq", *per_traj)}
        for s, i in enumerate(keep):
            t, n = trajs[i], len(trajs[i].token_ids)
            cols["ids"].append(torch.tensor(t.token_ids, dtype=torch.long))
            cols["mask"].append(torch.tensor(t.loss_mask, dtype=torch.bool))
            cols["lp"].append(torch.tensor(t.logprobs, dtype=torch.float32))
            cols["seq"].append(torch.full((n,), s, dtype=torch.long))
            for k, xs in per_traj.items():
                x = torch.zeros(n) if xs is None else torch.as_tensor(xs[i], dtype=torch.float32)
                if x.shape != (n,):
                    raise ValueError(f"{k}[{i}] has shape {tuple(x.shape)}, trajectory has {n} ids")
                cols[k].append(x)
        mask = torch.cat(cols["mask"])
        seq_ids = torch.cat(cols["seq"])
        opt = {k: torch.cat(cols[k]) if optional.get(k) is not None else None for k in optional}
        routes = _routes([trajs[i] for i in keep])
        return cls(
            token_ids=torch.cat(cols["ids"]),
            position_ids=_positions(seq_ids),
            loss_mask=mask,
            old_logprobs=torch.where(mask, torch.cat(cols["lp"]), 0.0),
            advantages=torch.where(mask, torch.cat(cols["advantages"]), 0.0),
            seq_ids=seq_ids,
            norm=global_norm(mask, seq_ids),
            source=keep,
            routes=routes,
            **opt,
        )


def _routes(trajs: Sequence[Trajectory]) -> Tensor | None:
    """[N, layers * k] routes of the concatenated trajectories (-1 past what the engine
    returned: the last sampled id, and a trajectory without routes); None when none has any."""
    given = [t.routes for t in trajs if t.routes is not None]
    if not given:
        return None
    width = {int(r.shape[1]) for r in given}
    if len(width) != 1:
        raise ValueError(f"trajectories' routes have {sorted(width)} experts per position")
    (w,) = width
    out = []
    for t in trajs:
        r = torch.full((len(t.token_ids), w), -1, dtype=torch.int32)
        if t.routes is not None:
            m = min(len(t.token_ids), int(t.routes.shape[0]))
            r[:m] = torch.as_tensor(t.routes[:m], dtype=torch.int32)
        out.append(r)
    return torch.cat(out)


def _lengths(seq_ids_N: Tensor) -> Tensor:
    return torch.bincount(seq_ids_N.cpu())


def _starts(seq_ids_N: Tensor) -> Tensor:
    lens = _lengths(seq_ids_N)
    return torch.cumsum(lens, 0) - lens


def _positions(seq_ids_N: Tensor) -> Tensor:
    lens = _lengths(seq_ids_N)
    return torch.arange(seq_ids_N.numel()) - _starts(seq_ids_N).repeat_interleave(lens)


def global_norm(loss_mask_N: Tensor, seq_ids_N: Tensor) -> LossNorm:
    """The loss normaliser of a whole step: trainable tokens, and sequences having any."""
    per_seq = torch.zeros(int(seq_ids_N.max()) + 1, dtype=torch.long)
    per_seq.index_add_(0, seq_ids_N.cpu(), loss_mask_N.cpu().long())
    return LossNorm(num_tokens=int(per_seq.sum()), num_seqs=int((per_seq > 0).sum()))


# ---------------------------------------------------------------------------------------------
# Micro-batches


def select(batch: TrainBatch, seqs: Sequence[int]) -> TrainBatch:
    """The sequences `seqs` of `batch`, packed in that order into one row; keeps the global norm."""
    lens = batch.seq_lens
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    idx = torch.cat([torch.arange(starts[s], starts[s] + lens[s]) for s in seqs])
    new_seq = torch.cat([torch.full((lens[s],), j, dtype=torch.long) for j, s in enumerate(seqs)])
    pick = {
        f.name: getattr(batch, f.name)[idx.to(batch.token_ids.device)]
        for f in dataclasses.fields(batch)
        if isinstance(getattr(batch, f.name), Tensor)
    }
    pick["seq_ids"] = new_seq.to(batch.token_ids.device)
    pick["position_ids"] = _positions(new_seq).to(batch.token_ids.device)
    source = [batch.source[s] for s in seqs] if batch.source else []
    return dataclasses.replace(batch, **pick, source=source)


def mini_batches(batch: TrainBatch, n: int, seed: int = 0) -> list[TrainBatch]:
    """Split a step's batch into `n` mini-batches of whole sequences, one optimizer step each.

    Sequences are shuffled with `seed` and dealt round-robin, so every mini-batch gets
    len // n or len // n + 1 of them. Each mini-batch gets its OWN loss normaliser (its tokens and
    sequences): its loss is a full mean over what that optimizer step sees. n=1 returns the batch.
    """
    if n < 1:
        raise ValueError(f"mini-batch count must be >= 1, got {n}")
    if n == 1:
        return [batch]
    if n > batch.num_seqs:
        raise ValueError(
            f"algo.mini_batches={n} exceeds the {batch.num_seqs} trainable sequences of this step "
            "(its other episodes failed on infrastructure, sampled nothing or were masked as "
            "truncated); lower algo.mini_batches or raise trainer.tasks_per_step x "
            "rollout.group_size"
        )
    order = torch.randperm(batch.num_seqs, generator=torch.Generator().manual_seed(seed)).tolist()
    out = []
    for k in range(n):
        mb = select(batch, sorted(order[k::n]))
        out.append(mb.replace(norm=global_norm(mb.loss_mask, mb.seq_ids)))
    return out


def padding_micro_batch(batch: TrainBatch, pad_id: int = 0) -> TrainBatch:
    """One token, no loss: lets a rank with no data left still run forward/backward in step."""
    dev = batch.token_ids.device
    one = {
        f.name: torch.zeros(1, dtype=getattr(batch, f.name).dtype, device=dev)
        for f in dataclasses.fields(batch)
        if isinstance(getattr(batch, f.name), Tensor)
    }
    one["token_ids"] = torch.full((1,), pad_id, dtype=torch.long, device=dev)
    if batch.routes is not None:  # no route known: the router decides
        one["routes"] = torch.full((1, batch.routes.shape[1]), -1, dtype=torch.int32, device=dev)
    return dataclasses.replace(batch, **one, source=[], is_padding=True)


def plan_micro_batches(
    lens: Sequence[int], dp_size: int, max_tokens: int, padded: bool = False
) -> list[list[list[int]]]:
    """Sequence indices per rank per micro-batch. -> [rank][micro-batch][seq].

    Sequences go to ranks longest first, each to the rank with the fewest tokens so far. Then
    every rank splits its share into the same number m of micro-batches:
    - packed rows (default): longest first into the lightest, the smallest m for which every
      micro-batch fits `max_tokens`;
    - `padded` (the rows of a right-padded batch, `learner.attention_layout=padded`): runs of
      similar length, longest first, each within `max_tokens` counted as rows x its longest
      sequence (what the padded batch computes), so little of it is padding; ranks with fewer
      runs split their largest until every rank has m.
    A sequence longer than `max_tokens` gets a micro-batch of its own. Empty slots become padding
    micro-batches. Each rank's micro-batches come largest first (`_largest_first`).
    """
    if dp_size < 1 or max_tokens < 1:
        raise ValueError(f"dp_size={dp_size} and max_tokens={max_tokens} must be >= 1")
    order = sorted(range(len(lens)), key=lambda s: (-lens[s], s))
    ranks: list[list[int]] = [[] for _ in range(dp_size)]
    load = [0] * dp_size
    for s in order:
        r = min(range(dp_size), key=lambda r: (load[r], len(ranks[r]), r))
        ranks[r].append(s)
        load[r] += lens[s]
    if padded:
        runs = [_runs(share, lens, max_tokens) for share in ranks]
        m = max(len(r) for r in runs)
        return [_largest_first(_split_to(r, m, lens), lens, padded) for r in runs]
    m = 1
    while True:
        plan = [_pack(share, lens, m, max_tokens) for share in ranks]
        if all(p is not None for p in plan):
            return [_largest_first(p, lens, padded) for p in plan]  # type: ignore[arg-type]
        m += 1


def _largest_first(bins: list[list[int]], lens: Sequence[int], padded: bool) -> list[list[int]]:
    """A rank's micro-batches, the most tokens first (padded: rows x longest). Each one's
    activations are then at most the size of the blocks the first left in the CUDA allocator's
    cache, so later ones reuse those blocks; a larger one after a smaller one asks the driver
    for new blocks beside the cached ones, and near the GPU's limit the allocator then frees its
    whole cache and retries (a synchronising stall, `train/alloc_retries`)."""

    def size(b: list[int]) -> int:
        return len(b) * max(lens[s] for s in b) if padded and b else sum(lens[s] for s in b)

    return [sorted(b) for b in sorted(bins, key=size, reverse=True)]


def _pack(share: list[int], lens: Sequence[int], m: int, max_tokens: int) -> list[list[int]] | None:
    bins: list[list[int]] = [[] for _ in range(m)]
    load = [0] * m
    for s in share:  # already longest first
        b = min(range(m), key=lambda b: (load[b], b))
        if bins[b] and load[b] + lens[s] > max_tokens:
            return None
        bins[b].append(s)
        load[b] += lens[s]
    return bins


def _runs(share: list[int], lens: Sequence[int], max_tokens: int) -> list[list[int]]:
    """`share` (longest first) cut into consecutive runs of at most `max_tokens` padded tokens."""
    runs: list[list[int]] = []
    for s in share:
        if runs and (len(runs[-1]) + 1) * lens[runs[-1][0]] <= max_tokens:
            runs[-1].append(s)
        else:
            runs.append([s])
    return runs


def _split_to(runs: list[list[int]], m: int, lens: Sequence[int]) -> list[list[int]]:
    """`runs` made m: the one with the most padded tokens split in halves while any has two
    sequences (halves never pad more), then empty runs (padding micro-batches)."""
    runs = list(runs)
    while len(runs) < m:
        many = [i for i, r in enumerate(runs) if len(r) > 1]
        if not many:
            break
        i = max(many, key=lambda i: len(runs[i]) * lens[runs[i][0]])
        half = len(runs[i]) // 2
        runs[i : i + 1] = [runs[i][:half], runs[i][half:]]
    return runs + [[] for _ in range(m - len(runs))]


def padded_tokens(plan: list[list[list[int]]], lens: Sequence[int]) -> int:
    """What a plan's micro-batches compute as right-padded batches: rows x longest, summed."""
    return sum(len(b) * max(lens[s] for s in b) for rank in plan for b in rank if b)


def micro_batches(
    batch: TrainBatch, dp_size: int, max_tokens: int, pad_id: int = 0, padded: bool = False
) -> list[list[TrainBatch]]:
    """Split a step's batch for `dp_size` ranks: [rank][micro-batch], the same count per rank,
    tokens balanced, each micro-batch one packed row of at most `max_tokens` tokens (`padded`:
    runs of similar length, at most `max_tokens` once right-padded; see `plan_micro_batches`),
    all carrying `batch.norm`."""
    plan = plan_micro_batches(batch.seq_lens, dp_size, max_tokens, padded)
    return [
        [select(batch, b) if b else padding_micro_batch(batch, pad_id) for b in rank]
        for rank in plan
    ]


def per_trajectory(
    per_rank: list[list[TrainBatch]], outputs: list[list[Tensor]], lengths: Sequence[int]
) -> list[Tensor]:
    """Scatter per-micro-batch outputs ([N] each, aligned with that micro-batch's tokens, as the
    learner returns them per rank) back to one [T] tensor per trajectory (`lengths[i]` tokens;
    zeros for trajectories in no micro-batch)."""
    out = [torch.zeros(n) for n in lengths]
    for mbs, xs in zip(per_rank, outputs, strict=True):
        for mb, x in zip(mbs, xs, strict=True):
            if not mb.is_padding:
                for src, x_T in zip(mb.source, mb.per_sequence(x), strict=True):
                    out[src] = x_T
    return out
