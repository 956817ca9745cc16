"""Evaluation during training (`trainer.eval.every`): the same tasks, rolled out by the policy
before the first step and every N steps, never trained on.

A step's `reward/mean` is over the tasks that step happened to draw, so it moves with how hard
they were as much as with the policy (the units env, seed 0: 0.22 at step 1, 0.02 at step 2,
0.53 at step 3); the evaluation set is fixed, so `eval/reward_mean` moves with the policy alone.

    tasks = pick_eval_tasks(all_tasks, size=32, seed=0)   # a fixed sample
    metrics, trajs = await evaluate(rollout, tasks, samples=4)  # {"eval/reward_mean": ...}

A mixture's evaluation (env=mixture: each env's own set, agentrl/mixture.py) reports each env
apart as well, `eval/<env>/reward_mean` and the rest, beside the totals over every episode.

The episodes themselves (`trajs`, task by task) are what the trainer saves to
<out>/eval_trajectories.jsonl (`Tracker.log_eval`), so `agentrl view RUN --eval` can draw them.

Held out by default (trainer.eval.split=heldout): the training list loses every task that shares
an id or a prompt with the evaluation set, so the policy is scored on questions it never trained
on; `shared` keeps the training list whole (the evaluation then re-scores trained questions).

    train, tasks, line = eval_task_sets(all_tasks, None, size=32, seed=0, split="heldout")
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

from agentrl.data import held_out
from agentrl.metrics import by_env, one_per_episode, rollout_metrics
from agentrl.tool import gather_all
from agentrl.types import ConfigError, Task

if TYPE_CHECKING:
    from agentrl.rollout import Rollout
    from agentrl.types import Trajectory

# rollout_metrics' names → eval/ names (what an evaluation reports); and every reward/<x> but
# max and min as eval/reward_<x> (mean, std, each component), every tools/<name>/<x> as
# eval/tools/<name>/<x> (`eval_metrics`)
EVAL_NAMES = {
    "rollout/tool_call_rate": "tool_call_rate",
    "rollout/turns": "turns",
    "rollout/parse_errors": "parse_errors",
    "rollout/tool_calls": "tool_calls",
    "rollout/tool_errors": "tool_errors",
    "rollout/tool_exceptions": "tool_exceptions",
}
PER_TURN = ("tool_call_rate",)  # a share of turns; the other EVAL_NAMES are per episode


def pick_eval_tasks(tasks: list[Task], size: int, seed: int) -> list[Task]:
    """`size` tasks of the evaluation set: a fixed sample drawn with `seed`, so every evaluation
    of a run (and of the runs resuming it) scores the same tasks."""
    if not tasks:
        raise ConfigError("trainer.eval.every is set and the evaluation set is empty: "
                          "check env.eval_tasks")  # fmt: skip
    order = list(range(len(tasks)))
    random.Random(seed * 1_000_003 + 7).shuffle(order)
    return [tasks[i] for i in order[:size]]


def eval_task_sets(
    train: list[Task], candidates: list[Task] | None, size: int, seed: int, split: str
) -> tuple[list[Task], list[Task], str]:
    """The training tasks, the evaluation tasks and the console line that says which split it is.
    `candidates`: the list env.eval_tasks loads, None to draw from `train` itself; `split`:
    trainer.eval.split. Held out, the evaluation set is drawn first and the training list
    loses every task sharing an id or a prompt with it (a ConfigError when none is left)."""
    tasks = pick_eval_tasks(train if candidates is None else candidates, size, seed)
    source = "env.tasks" if candidates is None else "env.eval_tasks"
    if split == "shared":
        shared = len(train) - len(held_out(train, tasks))
        line = (f"evaluation: {len(tasks)} tasks of {source}, not held out "
                f"(trainer.eval.split=shared): {shared} of the {len(train)} training tasks "
                "share an id or a prompt with them")  # fmt: skip
        return train, tasks, line
    kept = held_out(train, tasks)
    if not kept:
        raise ConfigError(
            f"trainer.eval.split=heldout: the {len(tasks)} evaluation tasks share an id or a "
            f"prompt with all {len(train)} tasks of env.tasks, leaving none to train on; lower "
            "trainer.eval.size, give env.eval_tasks its own tasks, or set "
            "trainer.eval.split=shared"
        )
    line = (f"evaluation: {len(tasks)} held-out tasks of {source} (trainer.eval.split=heldout): "
            f"training on the other {len(kept)} of {len(train)}, none sharing an id or a "
            "prompt with them")  # fmt: skip
    return kept, tasks, line


async def evaluate(
    rollout: Rollout, tasks: list[Task], samples: int
) -> tuple[dict[str, float], list[Trajectory]]:
    """Roll out `samples` episodes of every task with the weights the engines serve now; the
    eval/ metrics (reward: mean, std, each component; tool-call rate, turns, parse errors; tool
    calls, errors and exceptions, also per tool; episodes that failed for infrastructure reasons
    (not scored); the seconds it took) and the episodes, `samples` per task in the order of
    `tasks`."""
    t0 = time.perf_counter()
    groups = await gather_all(rollout.run_group(t, samples) for t in tasks)  # one raises: all stop
    trajs = [tr for g in groups for tr in g]
    out = eval_metrics(trajs)
    for env, gs in by_env(groups).items():  # env=mixture: each env's episodes apart too
        out.update(eval_metrics([tr for g in gs for tr in g], f"eval/{env}/"))
    out["eval/timing_s"] = time.perf_counter() - t0
    return out, trajs


def eval_metrics(trajs: list[Trajectory], prefix: str = "eval/") -> dict[str, float]:
    """The eval/ metrics of `trajs` under `prefix` (a mixture's env: `eval/<env>/`): the
    `EVAL_NAMES` (per episode: an episode of several sequences counts once), every reward/<x>
    but max and min as reward_<x>, tools/<name>/* as they are, the episodes and those that
    failed for infrastructure reasons (not scored)."""
    raw = rollout_metrics(trajs)
    episodes = one_per_episode(trajs)
    # rollout_metrics' counts are per sequence; an episode may be several (one_per_episode)
    per_episode = len(trajs) / max(len(episodes), 1)
    out = {f"{prefix}{new}": raw[old] * (1.0 if new in PER_TURN else per_episode)
           for old, new in EVAL_NAMES.items() if old in raw}  # fmt: skip
    for key, value in raw.items():
        if key.startswith("reward/") and key not in ("reward/max", "reward/min"):
            out[f"{prefix}reward_{key.removeprefix('reward/')}"] = value
        elif key.startswith("tools/"):
            out[f"{prefix}{key}"] = value
    out[f"{prefix}episodes"] = float(len(episodes))
    out[f"{prefix}failed"] = float(sum(t.stop_reason.is_infra_failure for t in episodes))
    return out
