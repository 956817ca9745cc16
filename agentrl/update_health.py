"""What an update's metrics say: pure functions from the learner's metrics (one optimizer step's,
or a trainer step's mean over them) to a warning's text, None when there is nothing to say.
`guards.Guards` counts, keeps the streaks and windows, and warns; these only read numbers:
the engine's logprobs far from the trainer's (`engine_gap`), learner memory at its limit
(`memory_edge`), a KL reward penalty that outweighs the rewards (`kl_drowns`), a rollout
correction that masks most tokens (`mis_masks`); and per optimizer step, updates that
learner.grad_clip shrinks to almost nothing (`clip_shrink`, `clip_starves`) and a PPO clip that
holds most tokens' ratios (`clipped_share`, `clip_discards`)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def engine_gap(metrics: dict[str, float], bar: float, step: int) -> str | None:
    """The warning to give when the engine's logprobs of its own samples are further than `bar`
    per token from the trainer's with the same weights (`train/logprob_diff`): the engine does
    not serve the trained model. bar 0: not checked."""
    gap = metrics.get("train/logprob_diff", 0.0)
    if not bar or gap <= bar:
        return None
    return (
        f"step {step}: the engine's logprobs of its own samples are {gap:.3f} per token from the "
        f"trainer's with the same weights (trainer.guards.warn_logprob_gap={bar}): the engine does not "
        "serve the trained model; check the last weight push (sync/*), the engine's dtype and "
        "LoRA settings"
    )


def memory_edge(metrics: dict[str, float]) -> str | None:
    """The warning to give when the policy's update ran at the edge of the GPU's memory: the
    allocator had to free its cache and retry (`policy/alloc_retries`), which synchronises the
    GPU each time and can cost seconds a step with nothing failing. Its advice depends on where:
    forward/backward (activations) or the optimizer step (`policy/alloc_retries_optimizer`)."""
    n = int(metrics.get("policy/alloc_retries", 0))
    if n <= 0:
        return None
    in_opt = int(metrics.get("policy/alloc_retries_optimizer", 0))
    where = (
        f"{in_opt} of them in the optimizer step, after the activations were freed: smaller "
        "micro-batches do not help there (the weights, gradients and Adam's moments are all on "
        "the GPU then); give the engine less (--mem-fraction-static) or use more learner ranks"
        if in_opt
        else "all in forward/backward: lower learner.micro_batch_tokens, set "
        "learner.activation_checkpointing=on, or give the engine less (--mem-fraction-static) "
        "or the learner more (learner.offload)"
    )
    return (
        f"the learner's CUDA allocator ran out of cached memory {n} time(s) in this update and "
        f"retried after emptying its cache (a synchronisation each time: slow, not failed); {where}"
    )


KL_DROWNS = 10.0  # kl_mode=reward: a penalty an episode this many times the rewards' spread


def kl_drowns(metrics: dict[str, float]) -> str | None:
    """kl_mode=reward: the warning to give when the KL penalty an episode carries
    (`train/kl_reward_penalty`: summed over its tokens, mean) is more than KL_DROWNS times the
    spread of the step's rewards (`reward/std`): the advantages then rank the episodes by their
    KL to the reference more than by their reward. None otherwise (no penalty, or one reward for
    every episode: `watch_one_reward`'s case)."""
    penalty = abs(metrics.get("train/kl_reward_penalty", 0.0))
    spread = metrics.get("reward/std", 0.0)
    if not spread > 0 or not penalty > KL_DROWNS * spread:
        return None
    return (
        f"the KL penalty (algo.loss.kl_mode=reward) took {penalty:.3g} from each episode's reward, "
        f"{penalty / spread:.0f}x the spread of the rewards (reward/std {spread:.3g}): the "
        "advantages follow the KL to the reference, not the reward, so the policy is held near "
        "the reference whatever it earns. Lower algo.loss.kl_coef (the penalty is summed over "
        "every sampled token), or use kl_mode=loss"
    )


MIS_MASKS_MOST = 0.5  # rollout_correction=mis: a step whose masked share of tokens is past this


def mis_masks(metrics: dict[str, float]) -> str | None:
    """rollout_correction=mis: the warning to give when the correction masked most of the
    sampled tokens (`policy/is_masked_frac`): their weight pi_trainer / pi_engine fell outside
    [mis_low, mis_high], so they get no gradient whatever their advantage. Neither the no-signal
    warning (the advantages are not 0) nor the logprob gap (its bar is 0.1 a token; async: off)
    saw an audit's run with mis_low=0.99, mis_high=1.01 train on a few tokens a step."""
    share = metrics.get("policy/is_masked_frac", 0.0)
    if not share > MIS_MASKS_MOST:
        return None
    gap = metrics.get("policy/rollout_logprob_diff", metrics.get("train/logprob_diff", 0.0))
    return (
        f"the rollout correction (algo.loss.rollout_correction=mis) masked {share:.0%} of the "
        "sampled tokens: their weight pi_trainer / pi_engine fell outside [algo.loss.mis_low, "
        f"algo.loss.mis_high] (the mean |log gap| is {gap:.3g} a token), so they get no gradient "
        "whatever their advantage. Widen the bounds (0.5 and 2 are usual) or use "
        "rollout_correction=tis; in async mode lower trainer.async.max_staleness; in sync mode "
        "a large gap means the engine does not serve the trainer's weights (sync/*)"
    )


CLIP_SHRINKS = 100.0  # learner.grad_clip scaling an update down more than this: it barely moves


def clip_shrink(out: dict[str, float], role: str, clip: float) -> float:
    """How many times learner.grad_clip scaled `role`'s update down in one optimizer step: its
    gradient norm before the clip (`<role>/grad_norm`: torch's clip_grad_norm_ returns the norm
    it clipped from, learner/optim.py) over the clip. 1 when the clip is off (0) or did not bite,
    and for a step with a non-finite norm (skipped: `Guards.count_skip`'s case)."""
    norm = out.get(f"{role}/grad_norm", 0.0)
    if clip <= 0 or not math.isfinite(norm):
        return 1.0
    return max(norm / clip, 1.0)


def clip_starves(role: str, clip: float, shrinks: Sequence[float]) -> str:
    """The warning to give when learner.grad_clip scaled most of `role`'s recent updates down
    more than CLIP_SHRINKS times (`shrinks`: the last optimizer steps' `clip_shrink`)."""
    big = sorted(s for s in shrinks if s > CLIP_SHRINKS)
    typical = big[len(big) // 2]
    return (
        f"learner.grad_clip={clip:g} scaled the {role}'s updates down {typical:.0f}x (median; "
        f"the gradient norm before the clip was about {typical * clip:.3g}) in {len(big)} of "
        f"the last {len(shrinks)} optimizer steps: each step moves the weights {typical:.0f}x "
        "less than learner.lr says, so the run learns almost nothing while its loss and reward "
        "charts look as usual. Raise learner.grad_clip to about the gradient norm's usual size "
        "(1.0 is usual; 0 turns clipping off); if the norm itself is that large, lower learner.lr "
        "and check the rewards' scale. Said once per run"
    )


CLIPPED_MOST = 0.5  # PPO clip: an optimizer step whose clipped share of the tokens is past this


def clipped_share(out: dict[str, float]) -> float | None:
    """The share of the sampled tokens whose ratio PPO's clip held in one optimizer step of the
    policy (`pg_clipfrac_low` + `_high` + `_dual`, as train/clipfrac): on the side their
    advantage pushes, so they get no gradient. None: the loss reports no clip."""
    keys = [f"policy/pg_clipfrac_{side}" for side in ("low", "high", "dual")]
    if not any(k in out for k in keys):
        return None
    return sum(out.get(k, 0.0) for k in keys)


def clip_discards(shares: Sequence[float]) -> str:
    """The warning to give when PPO's clip held most tokens in most of the recent optimizer
    steps (`shares`: their `clipped_share`)."""
    big = [s for s in shares if s > CLIPPED_MOST]
    return (
        f"PPO's clip held the ratio of {sum(big) / len(big):.0%} of the sampled tokens (mean; "
        f"train/clipfrac) in {len(big)} of the last {len(shares)} optimizer steps: those tokens "
        "get no gradient, so most of each update is discarded. Likely causes: learner.lr too "
        "high (the policy leaves [1 - algo.loss.clip_low, 1 + algo.loss.clip_high] within a "
        "step), too many optimizer steps on one batch (algo.ppo_epochs x algo.mini_batches), or "
        "in async mode stale rollouts (lower trainer.async.max_staleness; with "
        "algo.loss.ratio=engine the ratio's denominator is the old engine's). Said once per run"
    )
