"""Settings under which a training run cannot learn, found before it starts (a red-team audit
ran each one: it exited 0, its console looked normal, and nothing said why the reward stayed
flat). Refused where no run could learn; warned where a run is only doubtful. Called by
`config.training_checks`."""

from __future__ import annotations

import math

from agentrl.advantage import AdvantageConfig
from agentrl.learner import LearnerConfig
from agentrl.loss import LossConfig
from agentrl.rollout import RolloutConfig
from agentrl.types import ConfigError

# the built-in estimators whose baseline is the episode's own group: with one episode a group,
# each advantage is its reward minus itself
GROUP_BASELINES = frozenset({"grpo", "drgrpo", "rloo", "reinforce_pp_baseline"})
NEAR_GREEDY_TEMPERATURE = 0.1  # below it a group's samples are mostly the same text
LARGE_EPS = 1e-2  # algo.advantage.eps past this shrinks every normalised advantage
# algo.loss.kl_coef past this outweighs the reward: the KL-regularised optimum is
# pi_ref * exp(reward / kl_coef) / Z, so with rewards (or normalised advantages) spread over about
# 1, no answer's probability can end more than a factor e^(1 / kl_coef) from the reference's
# (2.7 at 1, 1.1 at 10, 1.0001 at 1e4); the usual coefficients are 1e-3 to 0.1
LARGE_KL_COEF = 1.0


def signal_checks(
    r: RolloutConfig, lc: LearnerConfig, adv: AdvantageConfig, steps: int, per_step: int = 1
) -> list[str]:
    """ConfigError for settings that make every update zero; warnings for doubtful ones (the
    rollout, learner and advantage sections, trainer.steps, and the optimizer steps each of
    them takes: algo.ppo_epochs x algo.mini_batches)."""
    if r.temperature < 1e-6:
        raise ConfigError(
            f"rollout.temperature={r.temperature:g} is greedy decoding: the sampled tokens' "
            "logprobs are not those of a distribution the trainer can score (its logprobs "
            "divide by the temperature), so every update would be NaN. Train with a temperature "
            "> 0 (e.g. rollout.temperature=1.0); greedy is fine for `agentrl preview`"
        )
    if r.gateway.sampling == "request":
        raise ConfigError(
            "rollout.gateway.sampling=request in training: an agent's requests would sample "
            "at their own temperature/top_p while the learner scores every token at "
            f"rollout.temperature={r.temperature:g}, so the ratio, the rollout correction and "
            "the KL read another distribution than the one sampled. Keep "
            "rollout.gateway.sampling=run (request is for `agentrl gateway` and previews)"
        )
    if adv.name in GROUP_BASELINES and r.group_size == 1:
        raise ConfigError(
            f"rollout.group_size=1 with algo.advantage.name={adv.name}: its baseline is the "
            "mean of the episode's own group, so every advantage is 0 and nothing is learned. "
            "Sample several episodes a task (rollout.group_size=8), or use a critic (algo=ppo)"
        )
    if r.top_k == 1:
        raise ConfigError(
            "rollout.top_k=1 is greedy decoding: every sample of a group is the same text, so "
            "every advantage is 0 (and the logprobs are not of the distribution sampled). Keep "
            "rollout.top_k=-1"
        )
    warnings = []
    if r.temperature < NEAR_GREEDY_TEMPERATURE:
        warnings.append(
            f"rollout.temperature={r.temperature:g} is nearly greedy: a group's samples will be "
            "mostly the same text, with equal rewards and so no advantage. Sample at about 1.0"
        )
    if lc.lr == 0:
        warnings.append("learner.lr=0: the weights never change; nothing will be learned")
    warnings += schedule_checks(lc, steps, per_step)
    if adv.eps > LARGE_EPS:
        warnings.append(
            f"algo.advantage.eps={adv.eps:g} is added to every std the advantages are divided "
            "by: with rewards in [0, 1] it shrinks them towards 0. The default is 1e-6"
        )
    return warnings


def schedule_checks(lc: LearnerConfig, steps: int, per_step: int) -> list[str]:
    """The lr schedule's horizons against the run's length. The schedule advances once per
    optimizer step, `per_step` of them a trainer step (algo.ppo_epochs x algo.mini_batches): an
    audit set learner.total_steps=trainer.steps with algo.mini_batches=4, and the cosine reached
    its floor (lr 0) a quarter of the way in; the rest of the run trained nothing, its console
    and charts otherwise as usual."""
    total = steps * per_step
    run = (
        f"trainer.steps={steps}"
        if per_step == 1
        else f"the run's {total} optimizer steps (trainer.steps={steps} x {per_step} a step: "
        "algo.ppo_epochs x algo.mini_batches)"
    )
    warnings = []
    if lc.warmup_steps >= total:
        warnings.append(
            f"learner.warmup_steps={lc.warmup_steps} >= {run}: the learning rate is still "
            "warming up from 0 when the run ends (the schedule counts optimizer steps)"
        )
    if lc.lr_schedule != "constant" and lc.total_steps is not None and lc.total_steps < total:
        floor = lc.min_lr_ratio * lc.lr
        at = lc.total_steps // per_step + 1  # holds optimizer step `total_steps` (0-based)
        warnings.append(
            f"learner.lr_schedule={lc.lr_schedule} decays over learner.total_steps="
            f"{lc.total_steps} optimizer steps < {run}: from trainer step {at} on it trains at "
            f"the schedule's floor (learner.min_lr_ratio={lc.min_lr_ratio:g}, lr {floor:g}"
            + (": nothing is learned there" if floor == 0 else "")
            + f"). Set learner.total_steps={total}, or leave it unset for a constant lr"
        )
    return warnings


# a critic still warming up past this share of the run's optimizer steps leaves the policy
# training on values near the untrained head's for most of the run
CRITIC_WARMUP_SHARE = 0.5


def critic_schedule_checks(
    lc: LearnerConfig, warmup: int | None, lr: float | None, steps: int, per_step: int
) -> list[str]:
    """The critic's own lr (algo.critic.lr, None: learner.lr) and warm-up
    (algo.critic.warmup_steps, None: learner.warmup_steps) against the run's optimizer steps,
    as `schedule_checks` does the policy's: the critic steps once per mini-batch with the
    policy. GAE's advantages are the rewards minus the critic's values, so a critic that cannot
    train makes the policy learn from an untrained head's noise, every chart but critic/* as
    usual."""
    total = steps * per_step
    if (lr if lr is not None else lc.lr) == 0:
        return [
            "algo.critic.lr=0 (or learner.lr=0 inherited): the critic never trains, so every "
            "advantage is the reward minus an untrained head's value. Set algo.critic.lr"
        ]
    name = f"algo.critic.warmup_steps={warmup}"
    if warmup is None:
        warmup = lc.warmup_steps
        name = f"learner.warmup_steps={warmup} (the critic's: algo.critic.warmup_steps unset)"
    if warmup < CRITIC_WARMUP_SHARE * total:
        return []
    when = (
        "is still warming up from 0 when the run ends"
        if warmup >= total
        else f"reaches its lr only after {warmup / total:.0%} of the run (trainer step "
        f"{warmup // per_step + 1} of {steps})"
    )
    return [
        f"{name} of the run's {total} optimizer steps (trainer.steps={steps} x "
        f"{per_step} a step): the critic's learning rate {when}, so its values stay near their "
        "untrained start and the policy trains on advantages (reward minus value) that are "
        f"mostly the untrained head's noise. Set algo.critic.warmup_steps={total // 20} or "
        "fewer (a few percent of the run), or 0"
    ]


def kl_checks(loss: LossConfig) -> list[str]:
    """A warning when algo.loss.kl_coef is so large that the KL to the reference, not the
    reward, decides the update (LARGE_KL_COEF says why the bar is 1)."""
    coef = loss.kl_coef
    if coef <= LARGE_KL_COEF:
        return []
    where = (
        "is subtracted from the reward for every sampled token, so it outweighs a reward given "
        "once an episode even more"
        if loss.kl_mode == "reward"
        else "is added to every token's loss beside the advantage (about 1 in size)"
    )
    return [
        f"algo.loss.kl_coef={coef:g} with kl_mode={loss.kl_mode}: the KL term {where}. The "
        "best the run can reach is the reference reweighted by exp(reward / kl_coef): with "
        "rewards in [0, 1] no answer's probability can end more than "
        f"{100 * math.expm1(1 / coef):.2g}% above or below the reference's, however good it is: "
        "the KL, not the reward, bounds how far the policy moves. Use a coefficient of 1e-3 "
        "to 0.1 (algo.loss.kl_coef=0.01), or 0 for no KL"
    ]


def critic_checks(
    lc: LearnerConfig,
    critic_lr: float | None,
    critic_warmup: int | None,
    uses_critic: bool,
    steps: int,
    per_step: int,
) -> list[str]:
    """A LoRA policy's learner.lr is an adapter's rate (about 5-100x a full fine-tune's), but
    the critic trains every parameter of its backbone: it must not inherit that rate unasked.
    Warnings: a critic whose lr or warm-up keeps it untrained (`critic_schedule_checks`)."""
    if not uses_critic:
        return []
    if lc.lora.rank > 0 and critic_lr is None:
        raise ConfigError(
            f"learner.lora.rank={lc.lora.rank} with a critic (algo=ppo): the critic trains "
            f"every parameter, and algo.critic.lr defaults to learner.lr={lc.lr:g}, a rate for "
            "adapters; set algo.critic.lr to a full fine-tune's rate (e.g. the model's usual "
            "learner.lr)"
        )
    return critic_schedule_checks(lc, critic_warmup, critic_lr, steps, per_step)
