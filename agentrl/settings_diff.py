"""What a resumed run does with each setting that differs from its checkpoint's: applied and said,
or refused with the reason. Never silently kept.

A checkpoint records the run's settings (`settings_of`: the composed config, flattened to dotted
keys, secrets left out) in trainer_state.json. On resume `compare` sets them beside this
command's. Most settings are read afresh every step, by a process started for this run, so a
change simply applies from the next step: it is printed, `learner.lr 0.001 → 0.005 from step 11`.
A few cannot apply to a run already under way (`REFUSED`: the weights, the data order and the
adapter's shape are the checkpoint's); changing one is an error that names the setting, both
values and what to do. `IGNORED` settings name the checkpoint itself (its directory, `resume`).

The rules are patterns over dotted keys (`*` is one key segment); a key matches a rule when the
rule names it or a section above it. tests/unit/test_settings_diff.py walks every setting.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

from agentrl.trainer_config import moved_settings

# pattern -> why a running run cannot take a new value
REFUSED: dict[str, str] = {
    "seed": "the data order and the random states continue from the checkpoint's",
    "learner.seed": "the learner's random states continue from the checkpoint's",
    "env._target_": "another env is another run",
    "env.tasks": "the data order is a cursor over the checkpoint's task list",
    "env.envs.*._target_": "another env is another run",
    "env.envs.*.tasks": "the data order is a cursor over the checkpoint's task lists",
    "env.eval_tasks": "the held-out tasks decide the training list the data cursor walks",
    "env.envs.*.eval_tasks": "the held-out tasks decide the training list the data cursor walks",
    "trainer.eval.split": "the held-out tasks decide the training list the data cursor walks",
    "trainer.eval.size": "the held-out tasks decide the training list the data cursor walks",
    "model": "the checkpoint's weights and token ids are of its model",
    "learner.model_path": "the checkpoint's weights are of its model",
    "algo.advantage.name": "another algorithm is another run",
    "algo.loss.name": "another algorithm is another run",
    "algo.critic.enabled": "the critic's weights are in the checkpoint, or not",
    "algo.critic.model_path": "the critic's weights are the checkpoint's",
    "learner.lora.rank": "the checkpoint's adapter has its shape",
    "learner.lora.alpha": "the checkpoint's adapter was trained at its scale",
    "learner.lora.target_modules": "the checkpoint's adapter has its targets",
    "trainer.mode": "a checkpoint holds the groups in flight of its mode",
}
IGNORED = ("run_name", "checkpoint.dir", "checkpoint.resume")  # they name the checkpoint found
SECRET = ("*api_key", "*token")  # never written into a checkpoint


def _matches(key: str, pattern: str) -> bool:
    parts, pat = key.split("."), pattern.split(".")
    return len(parts) >= len(pat) and fnmatch.fnmatchcase(".".join(parts[: len(pat)]), pattern)


def rule_of(key: str) -> str | None:
    """The refusal reason of `key`, or None when a new value applies."""
    return next((why for pat, why in REFUSED.items() if _matches(key, pat)), None)


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def settings_of(dumped: dict[str, Any]) -> dict[str, Any]:
    """The settings a checkpoint records: `Config.model_dump(mode="json", by_alias=True)`,
    flattened to dotted keys, without secrets (tokens and API keys)."""
    flat = _flat(dumped)
    return {k: v for k, v in flat.items() if not any(fnmatch.fnmatchcase(k, s) for s in SECRET)}


@dataclass(frozen=True)
class Change:
    key: str
    then: Any
    now: Any
    refused: str | None = None  # the reason, when it cannot apply

    def __str__(self) -> str:
        return f"{self.key} {_show(self.then)} → {_show(self.now)}"


def _show(v: Any) -> str:
    return "(unset)" if v is None else str(v)


def compare(saved: dict[str, Any], now: dict[str, Any]) -> list[Change]:
    """Every setting whose value differs, in key order. A key the checkpoint does not have (a
    setting newer than it) or that `settings_of` left out is not compared; one it records under
    an older name (`trainer.eval_every`) is compared under its new one (`MOVED_KEYS`)."""
    saved = moved_settings(saved)
    out = []
    for key in sorted(set(saved) & set(now)):
        if saved[key] == now[key] or any(_matches(key, p) for p in IGNORED):
            continue
        out.append(Change(key, saved[key], now[key], rule_of(key)))
    return out


def refusal(changes: list[Change], step: int, path: str) -> str | None:
    """The error for the refused changes, or None."""
    bad = [c for c in changes if c.refused]
    if not bad:
        return None
    lines = "\n".join(f"  {c}: {c.refused}" for c in bad)
    return (
        f"this command changes settings that a resumed run cannot change (checkpoint {path}, "
        f"step {step}):\n{lines}\nGive them the checkpoint's values to resume it, or start "
        "another run (run_name=<a new name>, or checkpoint.resume=never)"
    )
