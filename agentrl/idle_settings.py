"""Settings given a value that the run never reads, said at start-up (a warning each): valid,
so validation takes them, and a user who set one believes it applies.

    rollout.truncated_reward=-1      counts only with rollout.truncated=penalise
    trainer.async.max_staleness=4    counts only with trainer.mode=async
    trainer.eval.size=8              counts only with trainer.eval.every > 0

`idle_settings(settings, defaults)` reads the run's settings as dotted keys
(`Config.settings()`) and says which differ from their defaults while the setting they depend
on leaves them idle. A warning, not an error: one YAML file may serve runs of both kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Settings = dict[str, Any]

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
