"""Asynchronous vs synchronous training on the same env, model and samples (issue 16).

    python bench/async_speedup.py                          # 16 steps each: sync, async s=1, s=4
    python bench/async_speedup.py --steps 30 --staleness 1 -- rollout.group_size=4

The env is code_exec with slow tools (envs/examples/slow_tools.py: every tool call waits 50-500 ms,
log-uniform, 5 % of calls 2 s), the model the shipped tiny one, learner and dev server on this
machine. Each mode trains --steps steps of the same tasks_per_step x group_size samples (the same
token budget); the figure is samples per second of the training loop (the steps' own time, start-up
excluded) and the ratio async / sync, measured in the same run. Also printed: the reward curves
and async's staleness. Two curves per mode, from the run's trajectories.jsonl:
- per step: the mean reward of the samples each step trained on (x = samples drawn so far);
- per policy version: the mean reward of the episodes each policy version generated (x = samples
  that policy had been trained on). An episode's version is the oldest its tokens were sampled
  with. In sync mode the two are the same curve; in async mode a step trains on episodes from
  older versions (staleness), so its per-step curve lags by about the mean staleness while the
  per-version curve shows what each update learned.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import tempfile
from pathlib import Path
from statistics import fmean

ENV = ["env=code_exec", "env._target_=envs.examples.slow_tools.SlowToolsEnv"]


def run(mode: list[str], steps: int, overrides: list[str]) -> tuple[list[dict], list[float]]:
    from agentrl.config import compose
    from agentrl.train import train

    tmp = Path(tempfile.mkdtemp(prefix="agentrl-async-"))
    cfg = compose([*ENV, f"trainer.steps={steps}", f"trainer.every={steps}",
                   f"trainer.dir={tmp}/ckpt", "trainer.resume=never", "logging=local",
                   *mode, *overrides])  # fmt: skip
    rows = asyncio.run(train(cfg, tmp / "out"))
    return rows, by_version(tmp / "out" / "trajectories.jsonl")


def by_version(path: Path) -> list[float]:
    """Mean reward of the episodes each policy version generated (its oldest token's version)."""
    rewards: dict[int, list[float]] = collections.defaultdict(list)
    with path.open() as f:
        for line in f:
            tr = json.loads(line)
            rewards[min(int(t["weight_version"]) for t in tr["turns"])].append(tr["reward"])
    return [fmean(rewards[v]) for v in sorted(rewards)]


def summary(name: str, result: tuple[list[dict], list[float]], samples: int) -> dict:
    rows, versions = result
    loop_s = sum(r["timing_s/step"] for r in rows)
    rewards = [r["reward/mean"] for r in rows]
    out = {"loop_s": loop_s, "samples_per_s": samples * len(rows) / loop_s,
           "reward_last5": fmean(rewards[-5:]), "rewards": rewards, "versions": versions}  # fmt: skip
    stale = [r["async/staleness_mean"] for r in rows if "async/staleness_mean" in r]
    extra = f", staleness mean {fmean(stale):.2f}" if stale else ""
    phases = ("rollout", "logprobs", "update", "sync")
    extra += "; per step: " + ", ".join(f"{k} {fmean(r[f'timing_s/{k}'] for r in rows):.2f}s"
                                        for k in phases)  # fmt: skip
    print(f"{name:<10} loop {loop_s:6.1f} s  {out['samples_per_s']:6.2f} samples/s  "
          f"reward last 5 steps {out['reward_last5']:.3f}{extra}")  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--staleness", type=int, nargs="+", default=[1, 4])
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    a = p.parse_args()
    from agentrl.config import compose

    c = compose([*ENV, *a.overrides])
    samples = c.trainer.tasks_per_step * c.rollout.group_size
    runs = {"sync": run(["trainer.mode=sync"], a.steps, a.overrides)}
    for s in a.staleness:
        mode = ["trainer.mode=async", f"trainer.max_staleness={s}"]
        runs[f"async s={s}"] = run(mode, a.steps, a.overrides)
    print(f"\n{a.steps} steps x {samples} samples, slow tools (50-500 ms, 5 % 2 s)")
    res = {k: summary(k, v, samples) for k, v in runs.items()}
    for k in res:
        if k != "sync":
            print(
                f"throughput {k} / sync: {res[k]['samples_per_s'] / res['sync']['samples_per_s']:.2f}x"
            )
    print("\nreward per step (the samples each step trained on)")
    for k, r in res.items():
        print(f"{k:<10} " + " ".join(f"{x:.2f}" for x in r["rewards"]))
    print("reward per policy version (the episodes each version generated)")
    for k, r in res.items():
        print(f"{k:<10} " + " ".join(f"{x:.2f}" for x in r["versions"]))
    # per training sample: the same policy versions in every mode (async's last versions
    # generated episodes no step trained on before the run ended)
    last = min(len(r["versions"]) for r in res.values())
    span = f"versions {max(0, last - 5)}-{last - 1}"
    print(f"mean reward of {span}: " + ", ".join(
        f"{k} {fmean(r['versions'][max(0, last - 5) : last]):.3f}" for k, r in res.items()))  # fmt: skip


if __name__ == "__main__":
    main()
