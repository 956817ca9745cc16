"""Evaluation during training (`trainer.eval_every`): the same tasks, rolled out by the policy
before the first step and every N steps, never trained on.

A step's `reward/mean` is over the tasks that step happened to draw, so it moves with how hard
they were as much as with the policy (the units env, seed 0: 0.22 at step 1, 0.02 at step 2,
0.53 at step 3); the evaluation set is fixed, so `eval/reward_mean` moves with the policy alone.

    tasks = pick_eval_tasks(all_tasks, size=32, seed=0)   # a fixed sample
    metrics = await evaluate(rollout, tasks, samples=4)   # {"eval/reward_mean": ..., ...}
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import TYPE_CHECKING

from agentrl.metrics import rollout_metrics
from agentrl.types import ConfigError, Task

if TYPE_CHECKING:
    from agentrl.rollout import Rollout

# rollout_metrics' names → eval/ names (what an evaluation reports); and every reward/<x> but
# max and min as eval/reward_<x> (mean, std, each component)
EVAL_NAMES = {
    "rollout/tool_call_rate": "eval/tool_call_rate",
    "rollout/turns": "eval/turns",
    "rollout/parse_errors": "eval/parse_errors",
}


def pick_eval_tasks(tasks: list[Task], size: int, seed: int) -> list[Task]:
    """`size` tasks of the evaluation set: a fixed sample drawn with `seed`, so every evaluation
    of a run (and of the runs resuming it) scores the same tasks."""
    if not tasks:
        raise ConfigError("trainer.eval_every is set and the evaluation set is empty: "
                          "check env.eval_tasks")  # fmt: skip
    order = list(range(len(tasks)))
    random.Random(seed * 1_000_003 + 7).shuffle(order)
    return [tasks[i] for i in order[:size]]


async def evaluate(rollout: Rollout, tasks: list[Task], samples: int) -> dict[str, float]:
    """Roll out `samples` episodes of every task with the weights the engines serve now; the
    eval/ metrics: reward (mean, std, each component), tool-call rate, turns, parse errors,
    episodes that failed for infrastructure reasons (not scored), and the seconds it took."""
    t0 = time.perf_counter()
    groups = await asyncio.gather(*(rollout.run_group(t, samples) for t in tasks))
    trajs = [tr for g in groups for tr in g]
    raw = rollout_metrics(trajs)
    out = {new: raw[old] for old, new in EVAL_NAMES.items() if old in raw}
    for key, value in raw.items():
        if key.startswith("reward/") and key not in ("reward/max", "reward/min"):
            out[f"eval/reward_{key.removeprefix('reward/')}"] = value
    out["eval/episodes"] = float(len(trajs))
    out["eval/failed"] = float(sum(t.stop_reason.is_infra_failure for t in trajs))
    out["eval/timing_s"] = time.perf_counter() - t0
    return out
