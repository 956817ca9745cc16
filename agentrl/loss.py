"""Policy and value losses, by name. The key is exactly the config value (`algo.loss.name`).

Legend: N tokens of one packed micro-batch (concatenated sequences, no padding), S sequences in it.
The learner is algorithm-blind; per micro-batch `mb` (an `agentrl.batch.TrainBatch`) it does:

    from agentrl.learner.forward import token_logprobs
    from agentrl.loss import LossConfig, LossInputs, get_loss, reduce_metrics
    logprobs, entropy = token_logprobs(model, mb, with_entropy=cfg.entropy_coef > 0)
    loss, metrics = get_loss(cfg.name)(LossInputs.from_batch(mb, logprobs, entropy=entropy), cfg)
    loss.backward()   # every micro-batch, padding ones too; then optimizer.step()
    ...
    step_metrics = reduce_metrics(all_metrics_of_all_micro_batches_on_all_ranks)

Losses:
    ppo_clip    PPO clip with asymmetric range [1-clip_low, 1+clip_high] (DAPO clip-higher) and
                optional dual clip (clip_c > 1 bounds the loss of negative-advantage tokens at -A*c)
    gspo        the same clip on GSPO's sequence ratio exp(mean_t log(pi/pi_old)) (token form:
                sg[s_i] * pi_t / sg[pi_t], so the value is per sequence and the gradient GSPO's)
    value_clip  critic: 0.5 * max((V-R)^2, (clip(V, V_old±value_clip)-R)^2)
Terms added per token for the policy losses: kl_coef * KL(pi || ref) (k2, k3 or k3+, when
kl_mode="loss"; k3+ is k3's value with k2's gradient, an unbiased KL gradient from samples of pi;
k1 is refused there: its expected gradient is 0) and -entropy_coef * H. With kl_mode="reward"
the trainer subtracts `kl_reward_penalty` (coef * KL per token, no gradient; any kind, k3+ gives
k3's value) from the reward before the advantages, and the loss adds no KL.

Which logprobs form the ratio (`ratio`):
    trainer (default)  pi / pi_old with pi_old = `trainer_old_logprobs`, the policy's logprobs that
                       the learner recomputed before the batch's first optimizer step. Every
                       optimizer step of the batch (ppo_epochs x mini_batches) uses them, so the clip
                       bounds how far the batch moves the policy. Missing: a ValueError, no fallback.
    engine             pi / rollout_logprobs (what the engine returned while sampling); the clip then
                       also absorbs the engine/trainer mismatch. An explicit choice.
Rollout correction (`rollout_correction`, ratio=trainer only), from w = pi_old / pi_engine per token:
    tis   (default)    the per-token loss is multiplied by min(w, tis_cap)  (truncated IS, cap 2)
    mis                tokens with w outside [mis_low, mis_high] get no loss (masked IS); the others
                       are weighted by w (not 1: the kept tokens are still importance-corrected)
    none               no correction
The tokens were sampled from the engine, not from pi_old: without a correction the gradient is
biased by their mismatch. TIS is on by default because the trainer's logprobs are computed anyway,
w is ~1 where engine and trainer agree (so it costs nothing there), and cap 2 is the setting of
Yao et al.'s TIS (fengyao.notion.site/off-policy-rl; slime's --tis-clip and verl's
rollout_is_threshold default to 2 as well, with the correction off unless asked for). For GSPO the weights stay per token (the sequence ratio is unchanged).
Metrics: is_weight_mean/_max/_min (w before the cap) and rollout_logprob_diff
(mean |log pi_old - log pi_engine|), whenever ratio=trainer; is_capped_frac (tis) or
is_masked_frac (mis); zero_grad_token_frac and zero_grad_seq_frac: the share of loss tokens /
of sequences with a loss token whose policy-gradient term has exactly zero gradient (advantage
0, clipped on the side that stops the gradient, dual-clipped, masked by MIS; for GSPO the
sequence ratio is the one clipped, so a whole sequence goes at once). KL and entropy terms are
not counted: they move the policy, but not towards the reward.

Aggregation (`agg`) over per-token losses l_t with mask m_t, using the GLOBAL normaliser `norm`
(counts over all ranks and micro-batches of one optimizer step, from batch.py):
    token-mean               sum_t m_t l_t / norm.num_tokens
    seq-mean-token-mean      sum_s (sum_{t in s} m_t l_t / n_s) / norm.num_seqs
    seq-mean-token-sum-norm  sum_t m_t l_t / (norm.num_seqs * norm_len)     (Dr.GRPO)
So each micro-batch returns its share, and the SUM over all micro-batches of all ranks is the
full-batch loss: summing gradients over micro-batches gives the full-batch gradient. The ranks'
gradients must then be summed, not averaged: the learner sets FSDP2's gradient divide factor to 1
with sum reduction for the collectives (`learner/fsdp.py: shard_model`; gloo has no PREMUL_SUM), so
each rank calls a plain `loss.backward()`, never `loss * dp_size` (tests/e2e/test_learner.py: 2
gloo ranks give the 1-rank loss and gradients).

Metrics are 0-dim detached tensors, pre-divided by the global normaliser: reduce them over
micro-batches and ranks by summing, except keys ending in `_max` (max) and `_min` (min).
`reduce_metrics` does that and returns floats.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, field_validator, model_validator
from torch import Tensor

from agentrl.batch import LossNorm, TrainBatch
from agentrl.registry import Registry

__all__ = ["LossNorm"]  # re-exported: losses read it from their inputs

Agg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KLKind = Literal["k1", "k2", "k3", "k3+"]
_MAX_LOG_RATIO = 20.0  # exp() overflow guard; ratios this far from 1 are clipped anyway


class LossConfig(BaseModel):
    """`algo.loss` in the config."""

    model_config = ConfigDict(extra="forbid")

    name: str = "ppo_clip"
    agg: Agg = "token-mean"
    norm_len: int | None = None  # constant length for seq-mean-token-sum-norm (e.g. max tokens)
    clip_low: float = 0.2
    clip_high: float = 0.2  # DAPO clip-higher: e.g. 0.28
    clip_c: float | None = None  # dual clip, > 1 (e.g. 3.0); None = off
    ratio: Literal["trainer", "engine"] = "trainer"  # the ratio's denominator (module docstring)
    rollout_correction: Literal["tis", "mis", "none"] = "tis"  # engine/trainer mismatch
    tis_cap: float = 2.0  # tis: weights are capped here
    mis_low: float = 0.5  # mis: tokens with a weight outside [mis_low, mis_high] get no loss
    mis_high: float = 2.0
    kl_coef: float = 0.0
    kl_kind: KLKind = "k3"
    kl_mode: Literal["loss", "reward"] = "loss"  # reward: see kl_reward_penalty
    entropy_coef: float = 0.0
    value_clip: float | None = 0.2  # value_clip loss; None = unclipped

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        return LOSSES.check(v)

    @model_validator(mode="after")
    def _consistent(self) -> LossConfig:
        if min(self.clip_low, self.clip_high) < 0:  # clamp(r, 1-low, 1+high) then holds r off 1
            raise ValueError(
                f"algo.loss.clip_low={self.clip_low:g} / clip_high={self.clip_high:g}: a negative "
                "clip range puts the ratio's on-policy value 1 outside [1-clip_low, "
                "1+clip_high], so every token with a positive (clip_high < 0) or negative "
                "(clip_low < 0) advantage is clipped from the first step and gets no gradient. "
                "Use ranges >= 0 (0.2 is usual; DAPO's clip-higher: clip_high=0.28)"
            )
        if self.kl_coef < 0:
            raise ValueError(
                f"algo.loss.kl_coef={self.kl_coef:g} is negative: it rewards the policy for "
                "moving away from the reference, whatever the reward says. Use a coefficient "
                ">= 0 (1e-3 to 0.1 is usual; 0: no KL)"
            )
        if self.value_clip is not None and self.value_clip <= 0:  # clamp(-c, c) holds V at V_old
            raise ValueError(f"algo.loss.value_clip={self.value_clip:g} holds the critic at its "
                             "rollout values: use a range > 0 (0.2 is usual) or null")  # fmt: skip
        if self.clip_c is not None and self.clip_c <= 1.0:
            raise ValueError(f"algo.loss.clip_c={self.clip_c} must be > 1 (or null to disable)")
        if self.agg == "seq-mean-token-sum-norm" and not self.norm_len:
            raise ValueError(
                "algo.loss.agg=seq-mean-token-sum-norm needs algo.loss.norm_len (a constant such "
                "as the rollout's max sampled tokens)"
            )
        if self.tis_cap <= 0 or not 0 < self.mis_low < 1 < self.mis_high:
            raise ValueError(
                f"algo.loss.tis_cap={self.tis_cap} must be > 0 and algo.loss.mis_low="
                f"{self.mis_low} < 1 < algo.loss.mis_high={self.mis_high}, mis_low > 0"
            )
        if self.kl_coef > 0 and self.kl_mode == "loss" and self.kl_kind == "k1":
            raise ValueError(
                "algo.loss.kl_kind=k1 in the loss (kl_mode=loss) does nothing: its expected "
                "gradient is 0. Use kl_kind=k3+ (or k2, k3), or kl_mode=reward for k1"
            )
        if self.name == "gspo" and self.agg != "seq-mean-token-mean":
            if "agg" in self.model_fields_set:
                raise ValueError(
                    f"algo.loss.name=gspo needs agg=seq-mean-token-mean (its ratio is per "
                    f"sequence), got algo.loss.agg={self.agg}; drop the setting or use algo=gspo"
                )
            self.agg = "seq-mean-token-mean"
        return self


@dataclass
class LossInputs:
    """Everything a loss reads, for one packed micro-batch; every tensor is [N]."""

    logprobs: Tensor  # current policy, requires grad
    rollout_logprobs: Tensor  # from the engine that sampled (TrainBatch.old_logprobs)
    advantages: Tensor
    loss_mask: Tensor  # bool or 0/1
    seq_ids: Tensor  # int64, 0..S-1 within the micro-batch
    norm: LossNorm
    trainer_old_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    entropy: Tensor | None = None
    values: Tensor | None = None  # value_clip: current critic, requires grad
    old_values: Tensor | None = None  # value_clip: critic at rollout time (TrainBatch.values)
    returns: Tensor | None = None  # value_clip: targets (TrainBatch.returns)

    @classmethod
    def from_batch(
        cls, mb: TrainBatch, logprobs: Tensor | None = None, **kw: Tensor | None
    ) -> LossInputs:
        """Fill the batch's fields; pass the model outputs (entropy=, values=, …) as kw.

        `logprobs` may be left out only for the critic's value_clip loss."""
        lp = logprobs if logprobs is not None else torch.zeros_like(mb.old_logprobs)
        if kw.get("trainer_old_logprobs") is None:  # not passed, or None: the batch's own
            kw["trainer_old_logprobs"] = getattr(mb, "trainer_old_logprobs", None)
        return cls(
            logprobs=lp,
            rollout_logprobs=mb.old_logprobs,
            advantages=mb.advantages,
            loss_mask=mb.loss_mask,
            seq_ids=mb.seq_ids,
            norm=mb.norm,
            ref_logprobs=kw.pop("ref_logprobs", mb.ref_logprobs),
            old_values=kw.pop("old_values", mb.values),
            returns=kw.pop("returns", mb.returns),
            **kw,
        )


LossFn = Callable[[LossInputs, LossConfig], tuple[Tensor, dict[str, Tensor]]]
LOSSES: Registry[LossFn] = Registry("loss", "algo.loss.name", called_with=("inputs", "cfg"))


def register(name: str) -> Callable[[LossFn], LossFn]:
    """Register `fn(inputs: LossInputs, cfg: LossConfig) -> (loss, metrics)` under `name`."""
    return LOSSES.register(name)


def get_loss(name: str) -> LossFn:
    """A registered name or an import path `module:function`."""
    return LOSSES.get(name)


def known_losses() -> list[str]:
    return LOSSES.names()


# ---------------------------------------------------------------------------------------------
# Pure building blocks


def aggregate(
    loss_N: Tensor,
    mask_N: Tensor,
    seq_ids_N: Tensor,
    norm: LossNorm,
    agg: Agg,
    norm_len: int | None,
) -> Tensor:
    """This micro-batch's share of the full-batch loss (see the module docstring)."""
    m = mask_N.to(loss_N.dtype)
    # where(), not a product: a NaN/inf on a masked token (e.g. a prompt token) must not leak in
    masked = torch.where(mask_N.bool(), loss_N, 0.0)
    if agg == "token-mean":
        return masked.sum() / max(norm.num_tokens, 1)
    if agg == "seq-mean-token-mean":
        n_S = torch.zeros(int(seq_ids_N.max()) + 1 if seq_ids_N.numel() else 0, dtype=loss_N.dtype)
        n_S = n_S.to(loss_N.device).index_add(0, seq_ids_N, m)
        per_token_weight = 1.0 / n_S.clamp(min=1.0)[seq_ids_N]
        return (masked * per_token_weight).sum() / max(norm.num_seqs, 1)
    if agg == "seq-mean-token-sum-norm":
        if not norm_len:
            raise ValueError("agg=seq-mean-token-sum-norm needs norm_len")
        return masked.sum() / (max(norm.num_seqs, 1) * norm_len)
    raise ValueError(f"unknown loss aggregation {agg!r}")


def kl_estimate(logprobs_N: Tensor, ref_logprobs_N: Tensor, kind: KLKind) -> Tensor:
    """Per-token estimate of KL(pi || ref) from samples of pi.

    k1 = log pi - log ref;  k2 = 0.5 (log pi - log ref)^2;
    k3 = ref/pi - 1 - log(ref/pi) (low variance, >= 0; clamped at 10 like the usual low_var_kl);
    k3+ = the value of k3 with the gradient of k2, (log pi - log ref) d log pi: unbiased for the
    gradient of KL(pi || ref) when the tokens are sampled from pi (k3's own gradient is not).
    """
    d = logprobs_N - ref_logprobs_N
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d.pow(2)
    if kind in ("k3", "k3+"):
        neg = (-d).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        k3 = (neg.exp() - 1.0 - neg).clamp(max=10.0)
        if kind == "k3":
            return k3
        k2 = 0.5 * d.pow(2)
        return k3.detach() + k2 - k2.detach()
    raise ValueError(f"unknown kl_kind {kind!r}; known: k1, k2, k3, k3+")


def kl_reward_penalty(
    logprobs_T: Tensor, ref_logprobs_T: Tensor, loss_mask_T: Tensor, coef: float, kind: KLKind
) -> Tensor:
    """KL as a reward penalty: per-token amounts coef * KL, 0 off the mask, no gradient.

    Pass the list of these (one per trajectory) as `compute_advantages(..., token_penalties=…)`;
    use with kl_mode="reward" so the loss does not add KL a second time.
    """
    with torch.no_grad():
        kl = kl_estimate(logprobs_T.float(), ref_logprobs_T.float(), kind)
        return torch.where(loss_mask_T.bool(), coef * kl, 0.0)


def clipped_objective(
    ratio_N: Tensor, adv_N: Tensor, clip_low: float, clip_high: float, clip_c: float | None
) -> Tensor:
    """Per-token PPO loss: max(-A r, -A clip(r, 1-low, 1+high)), and for A<0 at most -A c."""
    pg = torch.maximum(-adv_N * ratio_N, -adv_N * ratio_N.clamp(1.0 - clip_low, 1.0 + clip_high))
    if clip_c is not None:
        pg = torch.where(adv_N < 0, torch.minimum(pg, -adv_N * clip_c), pg)
    return pg


def reduce_metrics(ms: Iterable[Mapping[str, Tensor | float]]) -> dict[str, float]:
    """Combine micro-batch/rank metrics: sum, except `*_max` (max) and `*_min` (min)."""
    out: dict[str, float] = {}
    for m in ms:
        for k, v in m.items():
            x = float(v)
            if k not in out:
                out[k] = x
            elif k.endswith("_max"):
                out[k] = max(out[k], x)
            elif k.endswith("_min"):
                out[k] = min(out[k], x)
            else:
                out[k] += x
    return {k: (v if abs(v) != float("inf") else 0.0) for k, v in out.items()}


# ---------------------------------------------------------------------------------------------
# Policy losses


def _masked_mean(x_N: Tensor, mask_N: Tensor, norm: LossNorm) -> Tensor:
    return torch.where(mask_N, x_N, 0.0).sum() / max(norm.num_tokens, 1)


def _masked_max(x_N: Tensor, mask_N: Tensor) -> Tensor:
    return torch.where(mask_N, x_N, -float("inf")).max() if x_N.numel() else x_N.new_tensor(0.0)


def _masked_min(x_N: Tensor, mask_N: Tensor) -> Tensor:
    return torch.where(mask_N, x_N, float("inf")).min() if x_N.numel() else x_N.new_tensor(0.0)


@dataclass
class _Old:
    """The ratio's denominator and the rollout correction of one micro-batch."""

    logprobs: Tensor
    weight: Tensor | None = None  # per-token loss weight (tis: capped w; mis: w or 0)
    metrics: dict[str, Tensor] | None = None


def _old_and_correction(inp: LossInputs, cfg: LossConfig) -> _Old:
    rollout = inp.rollout_logprobs.to(inp.logprobs.dtype)
    if cfg.ratio == "engine":
        return _Old(rollout)
    if inp.trainer_old_logprobs is None:
        raise ValueError(
            "algo.loss.ratio=trainer needs trainer_old_logprobs (the policy's logprobs recomputed "
            "by the learner before the update; the trainer fills them). Pass them, or set "
            "algo.loss.ratio=engine to take the ratio against the engine's logprobs"
        )
    old = inp.trainer_old_logprobs.to(inp.logprobs.dtype)
    mask, n = inp.loss_mask.bool(), inp.norm
    lw = (old - rollout).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).detach()
    w = lw.exp()
    m = {  # reported with rollout_correction=none too: the mismatch is worth seeing
        "is_weight_mean": _masked_mean(w, mask, n),
        "is_weight_max": _masked_max(w, mask),
        "is_weight_min": _masked_min(w, mask),
        "rollout_logprob_diff": _masked_mean(lw.abs(), mask, n),
    }
    if cfg.rollout_correction == "none":
        return _Old(old, None, m)
    if cfg.rollout_correction == "tis":
        m["is_capped_frac"] = _masked_mean((w > cfg.tis_cap).float(), mask, n)
        return _Old(old, w.clamp(max=cfg.tis_cap), m)
    keep = (w >= cfg.mis_low) & (w <= cfg.mis_high)
    m["is_masked_frac"] = _masked_mean((~keep).float(), mask, n)
    return _Old(old, torch.where(keep, w, 0.0), m)


def _zero_grad(
    adv_N: Tensor, log_ratio_N: Tensor, ratio_N: Tensor, weight_N: Tensor | None, cfg: LossConfig
) -> Tensor:
    """Tokens whose policy-gradient term has exactly zero gradient (bool [N]).

    Strict inequalities: at the clip boundary itself clamp() still passes the gradient."""
    clipped = ((adv_N > 0) & (ratio_N > 1 + cfg.clip_high)) | (
        (adv_N < 0) & (ratio_N < 1 - cfg.clip_low)
    )
    if cfg.clip_c is not None:
        clipped |= (adv_N < 0) & (ratio_N > cfg.clip_c)
    # the exp() overflow guard clamps the log ratio, which stops the gradient beyond it
    zero = (adv_N == 0) | clipped | (log_ratio_N.abs() > _MAX_LOG_RATIO)
    if weight_N is not None:
        zero |= weight_N == 0
    return zero


def _seq_share(flag_N: Tensor, mask_N: Tensor, seq_ids_N: Tensor, norm: LossNorm) -> Tensor:
    """Sequences (with a loss token) whose every loss token has `flag`, / norm.num_seqs."""
    size = int(seq_ids_N.max()) + 1 if seq_ids_N.numel() else 0
    zeros = torch.zeros(size, device=flag_N.device)
    tokens = zeros.index_add(0, seq_ids_N, mask_N.float())
    flagged = zeros.index_add(0, seq_ids_N, (mask_N & flag_N).float())
    return ((tokens > 0) & (flagged == tokens)).float().sum() / max(norm.num_seqs, 1)


def _policy_loss(
    inp: LossInputs, cfg: LossConfig, log_ratio_N: Tensor, old: _Old
) -> tuple[Tensor, dict[str, Tensor]]:
    tis_N = old.weight
    mask = inp.loss_mask.bool()
    adv = inp.advantages.to(inp.logprobs.dtype)
    ratio = log_ratio_N.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).exp()
    pg = clipped_objective(ratio, adv, cfg.clip_low, cfg.clip_high, cfg.clip_c)
    if tis_N is not None:
        pg = pg * tis_N
    total = pg
    kl = None
    if cfg.kl_coef and cfg.kl_mode == "loss":
        if inp.ref_logprobs is None:
            raise ValueError(
                "algo.loss.kl_coef > 0 with kl_mode=loss needs ref_logprobs: enable the reference "
                "model, or set kl_coef=0"
            )
        kl = kl_estimate(inp.logprobs, inp.ref_logprobs.to(inp.logprobs.dtype), cfg.kl_kind)
        total = total + cfg.kl_coef * kl
    if cfg.entropy_coef:
        if inp.entropy is None:
            raise ValueError("algo.loss.entropy_coef > 0 needs entropy from token_logprobs(...)")
        total = total - cfg.entropy_coef * inp.entropy
    loss = aggregate(total, mask, inp.seq_ids, inp.norm, cfg.agg, cfg.norm_len)

    with torch.no_grad():
        n = inp.norm
        r = ratio.detach()
        metrics = {
            "pg_loss": aggregate(pg.detach(), mask, inp.seq_ids, n, cfg.agg, cfg.norm_len),
            "pg_clipfrac_low": _masked_mean(((adv < 0) & (r < 1 - cfg.clip_low)).float(), mask, n),
            "pg_clipfrac_high": _masked_mean(
                ((adv > 0) & (r > 1 + cfg.clip_high)).float(), mask, n
            ),
            "approx_kl": _masked_mean(r - 1 - log_ratio_N.detach(), mask, n),
            "ratio_mean": _masked_mean(r, mask, n),
            "ratio_max": _masked_max(r, mask),
            "ratio_min": _masked_min(r, mask),
            "loss_tokens": mask.sum().to(r.dtype),
        }
        if cfg.clip_c is not None:
            dual = (adv < 0) & (r > cfg.clip_c)
            metrics["pg_clipfrac_dual"] = _masked_mean(dual.float(), mask, n)
        metrics.update(old.metrics or {})
        zero = _zero_grad(adv, log_ratio_N.detach(), r, tis_N, cfg)
        metrics["zero_grad_token_frac"] = _masked_mean(zero.float(), mask, n)
        metrics["zero_grad_seq_frac"] = _seq_share(zero, mask, inp.seq_ids, n)
        if kl is not None:
            metrics["kl_ref"] = _masked_mean(kl.detach(), mask, n)
        if inp.entropy is not None:
            metrics["entropy"] = _masked_mean(inp.entropy.detach(), mask, n)
    return loss, metrics


@register("ppo_clip")
def ppo_clip_loss(inp: LossInputs, cfg: LossConfig) -> tuple[Tensor, dict[str, Tensor]]:
    old = _old_and_correction(inp, cfg)
    return _policy_loss(inp, cfg, inp.logprobs - old.logprobs, old)


def gspo_log_ratio(logprobs_N: Tensor, old_N: Tensor, mask_N: Tensor, seq_ids_N: Tensor) -> Tensor:
    """GSPO-token log ratio: sg[mean_{t in s} (log pi - log old)] + log pi_t - sg[log pi_t]."""
    m = mask_N.to(logprobs_N.dtype)
    d = (logprobs_N - old_N).detach() * m
    size = int(seq_ids_N.max()) + 1 if seq_ids_N.numel() else 0
    sums = torch.zeros(size, dtype=d.dtype, device=d.device).index_add(0, seq_ids_N, d)
    counts = torch.zeros(size, dtype=d.dtype, device=d.device).index_add(0, seq_ids_N, m)
    seq_lr = (sums / counts.clamp(min=1.0))[seq_ids_N]
    return seq_lr + logprobs_N - logprobs_N.detach()


@register("gspo")
def gspo_loss(inp: LossInputs, cfg: LossConfig) -> tuple[Tensor, dict[str, Tensor]]:
    old = _old_and_correction(inp, cfg)
    lr = gspo_log_ratio(inp.logprobs, old.logprobs, inp.loss_mask.bool(), inp.seq_ids)
    return _policy_loss(inp, cfg, lr, old)


# ---------------------------------------------------------------------------------------------
# Critic


@register("value_clip")
def value_clip_loss(inp: LossInputs, cfg: LossConfig) -> tuple[Tensor, dict[str, Tensor]]:
    if inp.values is None or inp.old_values is None or inp.returns is None:
        raise ValueError("value_clip needs values (critic output), old_values and returns")
    mask = inp.loss_mask.bool()
    v, old = inp.values, inp.old_values.to(inp.values.dtype)
    ret = inp.returns.to(v.dtype)
    err = (v - ret).pow(2)
    if cfg.value_clip is not None:
        v_clip = old + (v - old).clamp(-cfg.value_clip, cfg.value_clip)
        err_clip = (v_clip - ret).pow(2)
        per_token = 0.5 * torch.maximum(err, err_clip)
    else:
        err_clip = err
        per_token = 0.5 * err
    loss = aggregate(per_token, mask, inp.seq_ids, inp.norm, cfg.agg, cfg.norm_len)
    with torch.no_grad():
        metrics = {
            "vf_loss": loss.detach(),
            "vf_clipfrac": _masked_mean((err_clip > err).float(), mask, inp.norm),
            "value_mean": _masked_mean(v.detach(), mask, inp.norm),
        }
    return loss, metrics
