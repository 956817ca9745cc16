"""Settings given a value that the run never reads, said at start-up (a warning each): valid,
so validation takes them, and a user who set one believes it applies.

    rollout.truncated_reward=-1      counts only with rollout.truncated=penalise
    trainer.async.max_staleness=4    counts only with trainer.mode=async
    trainer.eval.size=8              counts only with trainer.eval.every > 0
    algo.loss.rollout_correction=mis counts only with algo.loss.ratio=trainer
    algo.loss.kl_kind=k2             counts only with algo.loss.kl_coef > 0

`idle_settings(settings, defaults)` reads the run's settings as dotted keys
(`Config.settings()`) and says which differ from their defaults while the setting they depend
on leaves them idle. A warning, not an error: one YAML file may serve runs of both kinds.

The composed config cannot tell a value given on purpose from the default it equals
(`algo.loss.rollout_correction=tis` is the default), so the loss's settings of `LOSS_NEEDS` are
also checked on the command line, where each key given is one the user wrote:
`unread_overrides(given)` (called by agentrl/cli/overrides.py: check_overrides) says which the
command line's own other settings leave unread. One command line is one run: an error.

    algo.loss.ratio=engine algo.loss.rollout_correction=mis   ConfigError: … does nothing with
                                                              algo.loss.ratio=engine …
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrl.advantage import needs_values

Settings = dict[str, Any]

_RATIO = "algo.loss.ratio"
_CORRECTION = "algo.loss.rollout_correction"
# loss setting -> the settings it needs, each with the values under which it is read (all of them)
LOSS_NEEDS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    _CORRECTION: ((_RATIO, ("trainer",)),),
    "algo.loss.tis_cap": ((_RATIO, ("trainer",)), (_CORRECTION, ("tis",))),
    "algo.loss.mis_low": ((_RATIO, ("trainer",)), (_CORRECTION, ("mis",))),
    "algo.loss.mis_high": ((_RATIO, ("trainer",)), (_CORRECTION, ("mis",))),
}
ASKS_NOTHING = {_CORRECTION: "none"}  # what ratio=engine does anyway: never idle
_WHY = {  # why a LOSS_NEEDS setting is unread when the setting it needs has another value
    _RATIO: "the rollout correction weighs each token by pi_old / pi_engine; ratio=engine takes "
    "the ratio against the engine's logprobs themselves, with no pi_old and no correction",
    _CORRECTION: "tis_cap caps the weights of rollout_correction=tis, mis_low / mis_high bound "
    "those of rollout_correction=mis",
}


def _loss_rule(key: str) -> tuple[str, Callable[[Settings], bool]]:
    needs = LOSS_NEEDS[key]
    said = " and ".join(f"{dep}={'|'.join(values)}" for dep, values in needs)

    def counts(s: Settings) -> bool:
        asks_nothing = key in ASKS_NOTHING and s.get(key) == ASKS_NOTHING[key]
        return asks_nothing or all(s.get(dep) in values for dep, values in needs)

    return said, counts


def _uses_critic(s: Settings) -> bool:
    enabled = s.get("algo.critic.enabled")
    return enabled if enabled is not None else needs_values(s.get("algo.advantage.name", ""))


# setting -> (what makes it count, said; whether it counts in these settings)
RULES: dict[str, tuple[str, Callable[[Settings], bool]]] = {
    "rollout.truncated_reward": (
        "rollout.truncated=penalise",
        lambda s: s.get("rollout.truncated") == "penalise",
    ),
    **{
        f"trainer.async.{k}": ("trainer.mode=async", lambda s: s.get("trainer.mode") == "async")
        for k in ("max_staleness", "stale_policy", "partial_rollouts")
    },
    "trainer.sampling.max_refill_rounds": (
        "trainer.sampling.dynamic_sampling=true",
        lambda s: bool(s.get("trainer.sampling.dynamic_sampling")),
    ),
    **{
        k: ("trainer.eval.every > 0", lambda s: bool(s.get("trainer.eval.every")))
        for k in (
            "trainer.eval.size",
            "trainer.eval.samples",
            "trainer.eval.split",
            "env.eval_tasks",
        )  # fmt: skip
    },
    "checkpoint.optimizer_format": (
        "checkpoint.save_optimizer=true",
        lambda s: bool(s.get("checkpoint.save_optimizer")),
    ),
    **{key: _loss_rule(key) for key in LOSS_NEEDS},
    **{
        f"algo.loss.{k}": ("algo.loss.kl_coef > 0", lambda s: bool(s.get("algo.loss.kl_coef")))
        for k in ("kl_kind", "kl_mode")  # train/kl_ref, the metric, is k3 whatever kl_kind says
    },
    "algo.loss.norm_len": (
        "algo.loss.agg=seq-mean-token-sum-norm",
        lambda s: s.get("algo.loss.agg") == "seq-mean-token-sum-norm",
    ),
    "algo.loss.value_clip": ("a critic (algo=ppo, or algo.critic.enabled=true)", _uses_critic),
}


def idle_settings(settings: Settings, defaults: Settings) -> list[str]:
    """One warning per setting of `RULES` that differs from its default and does not count."""
    out = []
    for key, (needs, counts) in RULES.items():
        if key in settings and settings[key] != defaults.get(key) and not counts(settings):
            out.append(
                f"{key}={settings[key]} has no effect in this run: it counts only with {needs} "
                "(drop it, or set that too)"
            )
    return out


def unread_overrides(given: Settings) -> list[str]:
    """One error per setting of `LOSS_NEEDS` that the command line gives (`given`: dotted key ->
    value, as Hydra parsed them; a sweep's keys left out) while another setting it gives leaves
    it unread: `algo.loss.ratio=engine algo.loss.rollout_correction=mis`."""
    out = []
    for key, needs in LOSS_NEEDS.items():
        if key not in given or given[key] == ASKS_NOTHING.get(key):
            continue
        for dep, values in needs:
            if dep in given and given[dep] not in values:
                out.append(
                    f"{key}={given[key]} does nothing with {dep}={given[dep]} ({_WHY[dep]}): "
                    f"drop {key}, or set {dep}={values[0]}"
                )
                break
    return out
