"""Asynchronous vs synchronous training on the same env, model and samples (issue 16).

    python bench/async_speedup.py                          # 16 steps each: sync, async s=1, 2, 4
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
--cpu prints, per mode, how busy the machine was after start-up (user and kernel time) and the
cores each part used (learner, dev server, sandbox service, trainer process): on a 2-core box
async mode keeps the machine busy, and its ratio is bounded by the CPU each sample costs.
On that box: s=2 1.53-1.57x in four runs, s=1 1.41-1.46x (the learner waits for the slowest episode of
the one batch allowed ahead), s=4 1.47-1.51x (busier machine, no faster step); docs/async.md.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from statistics import fmean

ENV = ["env=code_exec", "env._target_=agentrl.envs.examples.slow_tools.SlowToolsEnv"]


PARTS = {"ray::LearnerWorker": "learner", "agentrl.engine.dev": "dev server",
         "agentrl.sandbox.server": "sandbox", str(os.getpid()): "trainer"}  # fmt: skip


class CpuMeter:
    """Machine and per-part CPU from /proc, sampled each second from `warm_s` after start; the
    figures span the samples in which every part was alive (not the shutdown)."""

    def __init__(self, warm_s: float) -> None:
        self.warm_s, self.samples = warm_s, []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _snap() -> tuple[float, list[int], dict[str, tuple[str, int, int]]]:
        """The machine's counters and, per process: its part, utime + stime, and its reaped
        children's (cutime + cstime), in clock ticks."""
        box = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        procs = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            name = next((v for k, v in PARTS.items() if k in cmd or k == pid), None)
            if name is None:  # what else runs: Ray's own processes, the kernel's threads
                name = "ray (own)" if "ray" in cmd else "kernel threads" if not cmd else "other"
            f = stat[stat.rindex(")") + 2 :].split()
            procs[pid] = (name, int(f[11]) + int(f[12]), int(f[13]) + int(f[14]))
        return time.monotonic(), box, procs

    def _loop(self) -> None:
        if not self.done.wait(self.warm_s):
            while not self.done.wait(1.0 if self.samples else 0.0):
                self.samples.append(self._snap())

    def stop(self) -> str:
        self.done.set()
        self.thread.join()

        def named(sample) -> set[str]:
            return {n for n, _, _ in sample[2].values() if n in PARTS.values()}

        live = [x for x in self.samples if named(x) == named(self.samples[0])]
        if len(live) < 2:
            return "cpu: the run ended before the measurement began"
        (t0, box0, procs0), (t1, box1, procs1) = live[0], live[-1]
        wall, hz = t1 - t0, os.sysconf("SC_CLK_TCK")
        d = [b - a for a, b in zip(box0, box1, strict=True)]
        busy = 100 * (sum(d) - d[3] - d[4]) / sum(d)
        ticks: dict[str, int] = collections.Counter()
        for pid, (name, own, reaped) in procs1.items():  # alive at both ends of the span
            if pid in procs0 and procs0[pid][0] == name:
                ticks[name] += own - procs0[pid][1]
                if name == "sandbox":  # its workers (bwrap + interpreter per episode), reaped
                    ticks["sandbox workers"] += reaped - procs0[pid][2]
        used = {k: ticks[k] / hz / wall for k in sorted(ticks)}
        used["interrupts"] = (d[5] + d[6]) / sum(d) * (os.cpu_count() or 1)  # irq + softirq
        # the rest: processes that started and ended within the span, uncounted kernel work
        used["rest"] = busy / 100 * (os.cpu_count() or 1) - sum(used.values())
        cores = ", ".join(f"{k} {v:.2f}" for k, v in used.items())
        return (f"cpu ({wall:.0f} s after start-up): machine {busy:.0f} % busy (user "
                f"{100 * d[0] / sum(d):.0f}, kernel {100 * d[2] / sum(d):.0f}); cores: {cores}")  # fmt: skip


def run(mode: list[str], steps: int, overrides: list[str], cpu: bool = False):
    from agentrl.config import compose
    from agentrl.train import train

    tmp = Path(tempfile.mkdtemp(prefix="agentrl-async-"))
    cfg = compose([*ENV, f"trainer.steps={steps}", f"checkpoint.every={steps}",
                   f"checkpoint.dir={tmp}/ckpt", "checkpoint.resume=never", "logging=local",
                   *mode, *overrides])  # fmt: skip
    meter = CpuMeter(warm_s=25.0)
    if cpu:
        meter.thread.start()
    rows = asyncio.run(train(cfg, tmp / "out"))
    if cpu:
        print(f"{' '.join(mode)}: {meter.stop()}")
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
           "reward_last5": fmean(rewards[-5:]), "rewards": rewards, "versions": versions,
           "gaps": [r.get("train/logprob_diff", float("nan")) for r in rows]}  # fmt: skip
    stale = [r["async/staleness_mean"] for r in rows if "async/staleness_mean" in r]
    extra = f", staleness mean {fmean(stale):.2f}" if stale else ""
    phases = ("rollout", "logprobs", "update", "sync")
    extra += "; per step: " + ", ".join(f"{k} {fmean(r[f'timing_s/{k}'] for r in rows):.2f}s"
                                        for k in phases)  # fmt: skip
    learner = [r["train/step_s"] for r in rows if "train/step_s" in r]
    extra += f" (learner's own {fmean(learner):.2f}s)" if learner else ""
    print(f"{name:<10} loop {loop_s:6.1f} s  {out['samples_per_s']:6.2f} samples/s  "
          f"reward last 5 steps {out['reward_last5']:.3f}{extra}")  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--staleness", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--cpu", action="store_true", help="print machine and per-part CPU per mode")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    a = p.parse_args()
    from agentrl.config import compose

    c = compose([*ENV, *a.overrides])
    samples = c.trainer.tasks_per_step * c.rollout.group_size
    runs = {"sync": run(["trainer.mode=sync"], a.steps, a.overrides, a.cpu)}
    for s in a.staleness:
        mode = ["trainer.mode=async", f"trainer.async.max_staleness={s}"]
        runs[f"async s={s}"] = run(mode, a.steps, a.overrides, a.cpu)
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
    print("engine/trainer logprob gap per step (train/logprob_diff; async: staleness adds to it)")
    for k, r in res.items():
        print(f"{k:<10} " + " ".join(f"{x:.4f}" for x in r["gaps"]))
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
