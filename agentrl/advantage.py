"""Advantage estimators, by name. The key is exactly the config value (`algo.advantage.name`).

Legend: G group (samples of one task), K turns (of one trajectory), T tokens (of one trajectory),
N trajectories (of one step).

What train.py calls, once per step, after the rollout (and after the reference model's logprobs
when the KL penalty goes into the reward, see `loss.kl_reward_penalty`):

    from agentrl.advantage import AdvantageConfig, compute_advantages
    out = compute_advantages(groups, AdvantageConfig(name="grpo"))  # groups: list[list[Trajectory]]
    out.advantages[n]   # float32 Tensor_T aligned with trajectory n's token_ids; 0 off the mask
    out.returns         # per-trajectory critic targets (gae only), else None
    out.metrics         # {"adv/mean": …, "adv/infra_excluded": …, …}

Trajectories are numbered n in the order `[t for g in groups for t in g]`.

Estimators (`name`):
    grpo                   A = (R - mean_G R) / (std_G R + eps); `norm_std=False` drops the division
    drgrpo                 A = R - mean_G R (Dr.GRPO; pair with loss agg "seq-mean-token-sum-norm")
    rloo                   A = R - mean of the *other* valid members of the group
    reinforce_pp_baseline  A = R - mean_G R, then whitened over all sampled tokens of the step
    gae                    token-level GAE(gamma, lam) from critic values; whitened by default

The group's statistics use only *valid* members: a trajectory whose StopReason is an
infrastructure failure (sandbox_unavailable, aborted) is left out of the baseline and gets
advantage 0 everywhere (and batch.py drops it, so it has no loss). A group with one valid member has
advantage 0 (no baseline to compare against). std is the sample std (Bessel); an all-equal group has
std 0 and advantage exactly 0, never NaN.

Reward levels (`reward_level`):
    trajectory  one number per trajectory, R = Trajectory.reward, put on every sampled token.
    turn        r_k = Turn.reward (None -> 0), with Trajectory.reward added to the last turn;
                turn k's sampled tokens get the return-to-go G_k = sum_{j>=k} gamma^(j-k) r_j,
                compared with the G_k of the group's valid members that reached turn k: a
                baseline b_k (and scale s_k) per turn index, over those members only. Turn k gets
                (G_k - b_k) / s_k; s_k = 1 when their std is 0 (all equal: advantage exactly 0);
                a turn index fewer than two valid members reached gets 0 (nothing to compare
                with). rloo leaves the member itself out of b_k. An episode of several
                sequences (an agent's) is one member: its G_k, the mean of its sequences'.
A KL (or other) reward penalty passed as `token_penalties` is summed per turn and subtracted
from that turn's reward (trajectory level: from R). With grpo, a group whose outcome rewards are
equal then gets its advantages from the KL alone, and the division by the group's std scales that
noise to full size (|A| ~ 1 per member, as in verl): prefer drgrpo or rloo (no std) with
kl_mode=reward, or keep kl_coef small.
At reward_level=trajectory per-turn rewards (Turn.reward) are ignored (train.py warns once).
For gae, rewards sit on the last sampled token of each turn and gamma/lam act per sampled token;
observation tokens (loss_mask 0) are skipped, as if the turns were one sampled sequence. Each
sequence of an episode is its own (ending with the outcome); with a reward penalty at trajectory
level each also carries its episode's other sequences' penalties on its last sampled token.

Truncated episodes (`Truncation`, from `rollout.truncated` / `rollout.truncated_reward`): an episode
that a token budget cut before the model finished it (stop reason `length`: a turn hit
max_new_tokens; `context_overflow`: the episode hit max_context_tokens, mid-turn or before its next
turn or observation; not `max_turns`, a limit of the task the episode ended within) is
    train     (default) scored by the env and trained like any other episode (verl's behaviour)
    mask      kept in its group's baseline with its own reward, so its group-mates' advantages are
              exactly what they would be under `train`; its own advantages are 0 and batch.py leaves
              it out of the TrainBatch (no gradient, not in the loss normaliser). TRL's
              mask_truncated_completions, for multi-turn episodes
    penalise  its outcome reward (Trajectory.reward) is replaced by `rollout.truncated_reward` before
              the baselines; per-turn rewards of turns that finished stay; trained in full
reward/* metrics keep the env's own rewards; rollout/truncated* count the episodes.

Whether a group carries gradient (`carries_gradient`): one test, on its advantages, for dynamic
sampling, the no-signal warning and `adv/zero_std_groups`; its docstring states the rule.

Adding an estimator: a function `(episodes: list[Episode], cfg) -> (advantages, returns | None)`
decorated with `@register("my_name")`, then `algo.advantage.name=my_name`.

Size: the estimators share one `Episode` record, its group statistics and the rules above (valid
members, truncation, turn baselines), and this docstring is the reference for their maths; split,
a rule would sit apart from the code that applies it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, field_validator
from torch import Tensor

from agentrl.registry import Registry
from agentrl.types import TRUNCATED_STOPS, Trajectory

# a token budget cut the episode before the model finished it (the module docstring says why these)


def is_truncated(t: Trajectory) -> bool:
    return t.stop_reason in TRUNCATED_STOPS


@dataclass(frozen=True)
class Truncation:
    """What training does with a truncated episode (`is_truncated`): `rollout.truncated` is the
    mode (train | mask | penalise, see the module docstring), `rollout.truncated_reward` the
    reward that replaces its outcome reward under penalise."""

    mode: Literal["train", "mask", "penalise"] = "train"
    reward: float = 0.0

    def masked(self, t: Trajectory) -> bool:
        """Kept in its group's baseline, but no gradient: advantage 0, left out of the batch."""
        return self.mode == "mask" and is_truncated(t)

    def penalised(self, t: Trajectory) -> bool:
        return self.mode == "penalise" and is_truncated(t)

    def reward_of(self, t: Trajectory) -> float:
        """The outcome reward the advantages read."""
        return self.reward if self.penalised(t) else t.reward


class AdvantageConfig(BaseModel):
    """`algo.advantage` in the config."""

    model_config = ConfigDict(extra="forbid")

    name: str = "grpo"
    reward_level: Literal["trajectory", "turn"] = "trajectory"
    norm_std: bool = True  # grpo: divide by the group's std
    eps: float = 1e-6  # added to every std we divide by
    gamma: float = 1.0  # discount: per turn (turn rewards) or per sampled token (gae)
    lam: float = 1.0  # gae lambda
    whiten: bool | None = None  # whiten over the step's sampled tokens; None = estimator default

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        return ESTIMATORS.check(v)


@dataclass(frozen=True)
class Episode:
    """Tensor view of one trajectory: what estimators read (built by `episodes_from`)."""

    group: int
    valid: bool  # False: infrastructure failure, excluded from baselines, advantage 0
    loss_mask_T: Tensor  # bool
    spans: list[tuple[int, int]]  # sampled [start, end) of each turn, K of them
    rewards_K: Tensor  # per-turn rewards; the last one includes the trajectory reward
    returns_K: Tensor  # what turn k's tokens get before the baseline
    score: float  # the episode's return G_0, what group baselines are computed from
    values_T: Tensor | None = None  # critic, aligned like logprobs (gae only)
    penalty_T: Tensor | None = None  # per-token reward penalty (e.g. coef * KL), subtracted
    trained: bool = True  # False: truncated under rollout.truncated=mask, in baselines, advantage 0
    member: int = -1  # the group member (episode) it belongs to; -1: its own (see episodes_from)


@dataclass
class AdvantageOutput:
    advantages: list[Tensor]  # N × Tensor_T
    returns: list[Tensor] | None = None  # N × Tensor_T, critic targets (gae)
    metrics: dict[str, float] = field(default_factory=dict)


EstimatorFn = Callable[[list[Episode], AdvantageConfig], tuple[list[Tensor], list[Tensor] | None]]
ESTIMATORS: Registry[EstimatorFn] = Registry(
    "advantage estimator", "algo.advantage.name", called_with=("episodes", "cfg")
)


def register(
    name: str, whiten: bool = False, needs_values: bool = False
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Register an estimator under `name`. `whiten`: its default for `cfg.whiten=None`;
    `needs_values`: it reads critic values (`Episode.values_T`), so the run trains a critic."""
    return ESTIMATORS.register(name, whiten=whiten, needs_values=needs_values)


def get_estimator(name: str) -> EstimatorFn:
    """A registered name or an import path `module:function`."""
    return ESTIMATORS.get(name)


def known_estimators() -> list[str]:
    return ESTIMATORS.names()


def needs_values(name: str) -> bool:
    """Whether the estimator reads critic values (gae; a user estimator registered with
    `needs_values=True`)."""
    return bool(ESTIMATORS.meta(name).get("needs_values", False))


# ---------------------------------------------------------------------------------------------
# Pure building blocks (each tested by hand)


def discounted_returns(rewards_K: Tensor, gamma: float) -> Tensor:
    """G_k = sum_{j>=k} gamma^(j-k) r_j."""
    out = torch.zeros_like(rewards_K)
    acc = 0.0
    for k in range(len(rewards_K) - 1, -1, -1):
        acc = rewards_K[k] + gamma * acc
        out[k] = acc
    return out


def spread_turns(per_turn_K: Tensor, spans: Sequence[tuple[int, int]], length: int) -> Tensor:
    """Put turn k's value on tokens spans[k][0]:spans[k][1]; 0 elsewhere. -> Tensor_T."""
    out = torch.zeros(length, dtype=torch.float32)
    for (start, end), v in zip(spans, per_turn_K.tolist(), strict=True):
        out[start:end] = v
    return out


def group_stats(
    scores_G: Tensor, valid_G: Tensor, kind: Literal["mean", "mean_std", "loo"], eps: float
) -> tuple[Tensor, Tensor]:
    """Baseline and scale per member: advantage = (return - baseline) / scale.

    mean: b = mean of valid, s = 1.  mean_std: s = std of valid (Bessel) + eps.
    loo: b_i = mean of the other valid members, s = 1.  Fewer than 2 valid: b = own score, s = 1.
    """
    scores_G = scores_G.double()
    n = int(valid_G.sum())
    if n < 2:
        return scores_G.clone(), torch.ones_like(scores_G)
    v = scores_G[valid_G]
    mean = v.mean()
    ones = torch.ones_like(scores_G)
    if kind == "mean":
        return mean * ones, ones
    if kind == "mean_std":
        return mean * ones, (v.std(correction=1) + eps) * ones
    if kind == "loo":
        return (v.sum() - scores_G) / (n - 1), ones
    raise ValueError(f"unknown group statistic {kind!r}; known: mean, mean_std, loo")


def gae(rewards_T: Tensor, values_T: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """GAE over one sequence of sampled tokens (already compacted). -> (advantages_T, returns_T).

    delta_t = r_t + gamma V_{t+1} - V_t (V after the last token is 0);
    A_t = delta_t + gamma lam A_{t+1};  returns_t = A_t + V_t.
    """
    r, v = rewards_T.tolist(), values_T.tolist()  # plain floats: a token loop over tensors is slow
    adv = [0.0] * len(r)
    nxt_v, nxt_a = 0.0, 0.0
    for t in range(len(r) - 1, -1, -1):
        nxt_a = r[t] + gamma * nxt_v - v[t] + gamma * lam * nxt_a
        adv[t] = nxt_a
        nxt_v = v[t]
    adv_T = torch.tensor(adv, dtype=values_T.dtype)
    return adv_T, adv_T + values_T


def whiten(values: list[Tensor], masks: list[Tensor], eps: float) -> list[Tensor]:
    """(x - mean) / (std + eps) over the masked entries of all tensors together; 0 off the mask."""
    flat = torch.cat([v[m] for v, m in zip(values, masks, strict=True)] + [torch.zeros(0)])
    if flat.numel() < 2:
        return [torch.zeros_like(v) for v in values]
    mean, std = flat.double().mean(), flat.double().std(correction=1)
    return [
        torch.where(m, ((v.double() - mean) / (std + eps)).float(), 0.0)
        for v, m in zip(values, masks, strict=True)
    ]


# ---------------------------------------------------------------------------------------------
# Trajectories -> episodes


def episodes_from(
    groups: Sequence[Sequence[Trajectory]],
    cfg: AdvantageConfig,
    values: Sequence[Tensor] | None = None,
    token_penalties: Sequence[Tensor] | None = None,
    truncation: Truncation = Truncation(),
) -> list[Episode]:
    """Flatten groups into Episodes (order `[t for g in groups for t in g]`)."""
    trajs = [(g, t) for g, group in enumerate(groups) for t in group]
    for name, xs in (("values", values), ("token_penalties", token_penalties)):
        if xs is not None and len(xs) != len(trajs):
            raise ValueError(f"{name} has {len(xs)} entries for {len(trajs)} trajectories")
    out = []
    members: dict[tuple[int, str], int] = {}
    for n, (g, t) in enumerate(trajs):
        session = t.metadata.get("session")  # an agent's sequences share their episode's
        member = members.setdefault((g, session), n) if session else n
        mask = torch.tensor(t.loss_mask, dtype=torch.bool)
        spans = [(turn.start, turn.end) for turn in t.turns]
        pen = None if token_penalties is None else torch.as_tensor(token_penalties[n]).float()
        val = None if values is None else torch.as_tensor(values[n]).float()
        for name, x in (("values", val), ("token_penalties", pen)):
            if x is not None and x.shape != mask.shape:
                raise ValueError(
                    f"{name}[{n}] has shape {tuple(x.shape)}, trajectory has {mask.numel()} ids"
                )
        rewards = torch.tensor([turn.reward or 0.0 for turn in t.turns], dtype=torch.float64)
        if cfg.reward_level == "trajectory":
            rewards.zero_()
        if pen is not None:
            rewards -= torch.tensor([float(pen[s:e].sum()) for s, e in spans], dtype=torch.float64)
        outcome = truncation.reward_of(t)
        if len(spans):
            rewards[-1] += outcome
        score = float(rewards.sum()) if len(spans) else outcome
        if cfg.reward_level == "turn":
            returns = discounted_returns(rewards, cfg.gamma)
            score = float(returns[0]) if len(spans) else score
        else:
            returns = torch.full_like(rewards, score)
        out.append(
            Episode(
                group=g,
                valid=not t.stop_reason.is_infra_failure,
                loss_mask_T=mask,
                spans=spans,
                rewards_K=rewards,
                returns_K=returns,
                score=score,
                values_T=val,
                penalty_T=pen,
                trained=not truncation.masked(t),
                member=member,
            )
        )
    if token_penalties is not None and cfg.reward_level == "trajectory":
        _episode_penalties(out)
    return out


def _episode_penalties(eps: list[Episode]) -> None:
    """Trajectory level with a reward penalty (kl_mode=reward): an episode of several sequences
    (an agent's) is scored once, its outcome less the penalty of ALL its sequences' tokens,
    and each of them carries that score. Each sequence had its own outcome less its own
    penalty, and the baseline read the first: the KL of the others never reached the
    episode's advantage (an audit)."""
    seqs: dict[int, list[int]] = {}
    for n, e in enumerate(eps):
        seqs.setdefault(e.member, []).append(n)
    for same in seqs.values():
        if len(same) < 2 or any(eps[n].penalty_T is None for n in same):
            continue
        pens = [sum(float(eps[n].penalty_T[a:b].sum()) for a, b in eps[n].spans) for n in same]  # type: ignore[index]
        score = eps[same[0]].score + pens[0] - sum(pens)  # the outcome less every sequence's
        for n in same:
            returns = torch.full_like(eps[n].returns_K, score)
            eps[n] = replace(eps[n], score=score, returns_K=returns)


def compute_advantages(
    groups: Sequence[Sequence[Trajectory]],
    cfg: AdvantageConfig,
    values: Sequence[Tensor] | None = None,
    token_penalties: Sequence[Tensor] | None = None,
    truncation: Truncation = Truncation(),
) -> AdvantageOutput:
    """Per-token advantages for every trajectory of the step.

    `values`: critic values per trajectory (Tensor_T, aligned like logprobs), required by gae.
    `token_penalties`: per-token amounts subtracted from the reward, e.g. from
    `loss.kl_reward_penalty` (summed per turn for the group estimators).
    `truncation`: what truncated episodes get (rollout.truncated; the module docstring).
    """
    fn = get_estimator(cfg.name)
    eps = episodes_from(groups, cfg, values, token_penalties, truncation)
    raw, ret = fn(eps, cfg)
    masks = [_trains(e) for e in eps]
    adv = whiten(raw, masks, cfg.eps) if _whitens(cfg) else raw
    adv = [torch.where(m, a.float(), 0.0) for a, m in zip(adv, masks, strict=True)]
    return AdvantageOutput(adv, ret, _metrics(eps, raw, adv, masks))


def _trains(e: Episode) -> Tensor:
    """The tokens that get an advantage (and are whitened over): sampled, of an episode that is
    neither an infrastructure failure nor masked as truncated."""
    return e.loss_mask_T & e.valid & e.trained


def _whitens(cfg: AdvantageConfig) -> bool:
    return cfg.whiten if cfg.whiten is not None else ESTIMATORS.meta(cfg.name).get("whiten", False)


SIGNAL_ATOL = 1e-6  # |A| at most this is no signal: rounding residue of a baseline (rloo ~1e-16)


def _any_nonzero(adv: Sequence[Tensor], masks: Sequence[Tensor]) -> bool:
    """Some masked (sampled, valid) token has an advantage above SIGNAL_ATOL in size."""
    return any(bool((a[m].abs() > SIGNAL_ATOL).any()) for a, m in zip(adv, masks, strict=True))


def carries_gradient(
    group: Sequence[Trajectory],
    cfg: AdvantageConfig,
    reward_penalty: bool = False,
    truncation: Truncation = Truncation(),
) -> bool:
    """Whether this group can move the policy: a sampled token of a valid member (not an
    infrastructure failure) has a non-zero advantage (|A| > SIGNAL_ATOL). The one test behind
    dynamic sampling (trainer.sampling.dynamic_sampling, sync and async), the no-signal warning
    and `adv/zero_std_groups`.

    It runs in the driver, before the learner's pass, so the rule for what is known only later:
    - no valid member with a sampled token: False (nothing to train);
    - an estimator that reads critic values (gae, `needs_values`): True. The values make every
      token's advantage non-zero in general, equal rewards or not, and are not known yet;
    - `reward_penalty` (kl_mode=reward with kl_coef > 0) and two or more valid members (episodes,
      however many sequences each): True. The per-token KL (the reference's logprobs come later)
      differs between members, and a group baseline turns the difference into advantages (see
      the module docstring on grpo);
    - otherwise the estimator itself, on this group alone, from the outcome reward and the
      per-turn rewards as `cfg.reward_level` reads them (at `trajectory` per-turn rewards do not
      count; at `turn` equal outcomes with different turn rewards carry gradient): True when an
      advantage is non-zero. Step whitening (reinforce_pp_baseline) is left out: it maps the
      whole step's advantages at once, and gives a group all 0 before it only the step's common
      shift, which compares nothing within the group.
    A lone valid member has advantage 0 under every built-in estimator, KL or not. Members
    masked as truncated (`truncation`) count in the baseline but never as the one that trains:
    a group whose every valid member is masked carries none.
    """
    valid = [t for t in group if not t.stop_reason.is_infra_failure]
    if not any(t.num_sampled for t in valid if not truncation.masked(t)):
        return False
    members = {t.metadata.get("session") or id(t) for t in valid}  # an episode's sequences: one
    if needs_values(cfg.name) or (reward_penalty and len(members) > 1):
        return True
    eps = episodes_from([group], cfg, truncation=truncation)
    adv, _ = get_estimator(cfg.name)(eps, cfg)
    return _any_nonzero(adv, [_trains(e) for e in eps])


def _metrics(
    eps: list[Episode], raw: list[Tensor], adv: list[Tensor], masks: list[Tensor]
) -> dict[str, float]:
    """`adv/zero_std_groups`: share of the groups with a valid member whose advantages are all 0
    before step whitening (`carries_gradient`'s test, with the actual values and penalties)."""
    flat = torch.cat([a[m] for a, m in zip(adv, masks, strict=True)] + [torch.zeros(0)])
    by_group: dict[int, list[int]] = {}
    for i, e in enumerate(eps):
        if e.valid:
            by_group.setdefault(e.group, []).append(i)
    flat_groups = [
        not _any_nonzero([raw[i] for i in idx], [masks[i] for i in idx])
        for idx in by_group.values()
    ]
    return {
        "adv/mean": float(flat.mean()) if flat.numel() else 0.0,
        "adv/std": float(flat.std()) if flat.numel() > 1 else 0.0,
        "adv/max": float(flat.max()) if flat.numel() else 0.0,
        "adv/min": float(flat.min()) if flat.numel() else 0.0,
        "adv/infra_excluded": float(sum(not e.valid for e in eps)),
        "adv/zero_std_groups": sum(flat_groups) / max(len(flat_groups), 1),
    }


# ---------------------------------------------------------------------------------------------
# Registered estimators


def _group_baseline(
    eps: list[Episode], cfg: AdvantageConfig, kind: Literal["mean", "mean_std", "loo"]
) -> list[Tensor]:
    out: list[Tensor | None] = [None] * len(eps)
    groups: dict[int, list[int]] = {}
    for i, e in enumerate(eps):
        groups.setdefault(e.group, []).append(i)
    for idx in groups.values():
        per_turn = (
            _per_turn_index(eps, idx, cfg, kind)
            if cfg.reward_level == "turn"
            else _per_episode(eps, idx, cfg, kind)
        )
        for i in idx:
            e = eps[i]
            out[i] = spread_turns(per_turn[i].float(), e.spans, len(e.loss_mask_T))
    return out  # type: ignore[return-value]


def _per_episode(
    eps: list[Episode], idx: list[int], cfg: AdvantageConfig, kind: str
) -> dict[int, Tensor]:
    """Trajectory level: one baseline over the group's episode scores, on every turn. The
    sequences of one episode (an agent's, `Episode.member`) count once, as their first, and
    each gets the episode's advantage."""
    first: dict[int, int] = {}
    for i in idx:
        first.setdefault(eps[i].member if eps[i].member >= 0 else i, i)
    uniq = list(first.values())
    scores = torch.tensor([eps[i].score for i in uniq], dtype=torch.float64)
    valid = torch.tensor([eps[i].valid for i in uniq], dtype=torch.bool)
    base, scale = group_stats(scores, valid, kind, cfg.eps)  # type: ignore[arg-type]
    at = {i: j for j, i in enumerate(uniq)}
    out = {}
    for i in idx:
        j = at[first[eps[i].member if eps[i].member >= 0 else i]]
        adv = (eps[i].returns_K - base[j]) / scale[j]
        if int(valid.sum()) < 2:  # nothing to compare with: no signal
            adv = torch.zeros_like(adv)
        out[i] = adv
    return out


def _per_turn_index(
    eps: list[Episode], idx: list[int], cfg: AdvantageConfig, kind: str
) -> dict[int, Tensor]:
    """Turn level: turn k's return-to-go G_k is compared with the G_k of the group's valid
    members that reached a turn k (a baseline per turn index, not the episode's G_0). A turn
    index that fewer than two valid members reached gets advantage 0; a std of 0 divides by 1.
    An episode of several sequences (an agent's, `Episode.member`) is one member, as at
    trajectory level: its G_k is the mean over its sequences that reached k."""
    out = {i: torch.zeros_like(eps[i].returns_K) for i in idx}
    depth = max((len(eps[i].returns_K) for i in idx), default=0)
    for k in range(depth):
        members: dict[int, list[int]] = {}
        for i in idx:
            if eps[i].valid and len(eps[i].returns_K) > k:
                members.setdefault(eps[i].member if eps[i].member >= 0 else i, []).append(i)
        if len(members) < 2:
            continue
        g_k = torch.stack([torch.stack([eps[i].returns_K[k] for i in seqs]).double().mean()
                           for seqs in members.values()])  # fmt: skip
        valid = torch.ones(len(members), dtype=torch.bool)
        base, scale = group_stats(g_k, valid, kind, 0.0)  # type: ignore[arg-type]
        if kind == "mean_std":
            std = scale[0]
            scale = torch.ones_like(scale) if std == 0 else scale + cfg.eps
        for j, seqs in enumerate(members.values()):
            for i in seqs:
                out[i][k] = (eps[i].returns_K[k].double() - base[j]) / scale[j]
    return out


@register("grpo")
def grpo_estimator(eps: list[Episode], cfg: AdvantageConfig) -> tuple[list[Tensor], None]:
    return _group_baseline(eps, cfg, "mean_std" if cfg.norm_std else "mean"), None


@register("drgrpo")
def drgrpo_estimator(eps: list[Episode], cfg: AdvantageConfig) -> tuple[list[Tensor], None]:
    return _group_baseline(eps, cfg, "mean"), None


@register("rloo")
def rloo_estimator(eps: list[Episode], cfg: AdvantageConfig) -> tuple[list[Tensor], None]:
    return _group_baseline(eps, cfg, "loo"), None


@register("reinforce_pp_baseline", whiten=True)
def reinforce_pp_baseline_estimator(
    eps: list[Episode], cfg: AdvantageConfig
) -> tuple[list[Tensor], None]:
    return _group_baseline(eps, cfg, "mean"), None


def _others_penalty(eps: list[Episode]) -> list[float]:
    """Per sequence: the reward penalty (kl_mode=reward) on the sampled tokens of the OTHER
    sequences of its episode (`Episode.member`: an agent's, or one rollout.thinking=template or
    rollout.context rewrote); 0 for an episode of one sequence."""
    own = [0.0 if e.penalty_T is None else sum(float(e.penalty_T[a:b].sum()) for a, b in e.spans)
           for e in eps]  # fmt: skip
    total: dict[int, float] = {}
    for e, p in zip(eps, own, strict=True):
        total[e.member] = total.get(e.member, 0.0) + p
    return [total[e.member] - p for e, p in zip(eps, own, strict=True)]


@register("gae", whiten=True, needs_values=True)
def gae_estimator(eps: list[Episode], cfg: AdvantageConfig) -> tuple[list[Tensor], list[Tensor]]:
    """Each sequence is GAE's own: its turns' rewards (the outcome on its last), its tokens'
    penalties. At trajectory level an episode of several sequences also charges each one, at its
    last sampled token, its other sequences' penalties, so that every sequence's return from its
    first token is the episode's score, as the group estimators read it (`_episode_penalties`).
    Before, a sequence never saw the KL of the sequences its episode went on in."""
    advs, rets = [], []
    others = _others_penalty(eps) if cfg.reward_level == "trajectory" else [0.0] * len(eps)
    for n, e in enumerate(eps):
        if e.values_T is None:
            raise ValueError(
                f"gae needs critic values for every trajectory (none for #{n}); "
                "pass values=… or pick a critic-free estimator (grpo, rloo, …)"
            )
        idx = e.loss_mask_T.nonzero().squeeze(-1)
        rewards = torch.zeros(len(e.loss_mask_T), dtype=torch.float64)
        if e.penalty_T is not None:
            rewards -= e.penalty_T.double()
        # Turn rewards already hold the outcome on the last turn; their penalty part is
        # per-token here, so only the env's part goes on each turn's last sampled token.
        for k, (start, end) in enumerate(e.spans):
            if end > start:
                env_part = e.rewards_K[k]
                if e.penalty_T is not None:
                    env_part = env_part + e.penalty_T[start:end].double().sum()
                rewards[end - 1] += env_part
        if len(idx):
            rewards[idx[-1]] -= others[n]
        a, r = gae(rewards[idx], e.values_T.double()[idx], cfg.gamma, cfg.lam)
        adv = torch.zeros(len(e.loss_mask_T), dtype=torch.float32)
        ret = torch.zeros(len(e.loss_mask_T), dtype=torch.float32)
        if e.valid:
            adv[idx], ret[idx] = a.float(), r.float()
        advs.append(adv)
        rets.append(ret)
    return advs, rets
