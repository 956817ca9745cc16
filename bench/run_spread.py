"""Run-to-run spread: the same training command run N times, and how far the runs end apart.

    python bench/run_spread.py                                  # the quick start x3, default
    python bench/run_spread.py --runs 2 --modes default deterministic trainer.steps=3
    python bench/run_spread.py --runs 5 trainer.eval.every=10   # + evaluations (eval/*)

Each run is a fresh `python -m agentrl.train env=code_exec [overrides]` process, one after the
other, in a directory of its own under --out; `--modes deterministic` adds
trainer.deterministic=true. Per mode it prints every run's final reward (the last step's
reward/mean, and the mean of the last five steps), the evaluations' eval/reward_mean (the first,
before any training, and the last), its seconds per step (timing_s/step, start-up excluded),
the spread of each figure over the runs (max - min), and the first step at which any metric but
the timings (`agentrl.metrics.is_timing`) differs between runs ("identical" when none does).
With two modes, the last line is the second's seconds per step as a ratio of the first's,
measured in the same invocation.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import fmean

from agentrl.metrics import is_timing

ROOT = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, "-m", "agentrl.train", "env=code_exec"]
MODES = {"default": [], "deterministic": ["trainer.deterministic=true"]}


def train(run_dir: Path, overrides: list[str]) -> list[dict[str, float]]:
    """One run of the command; its metrics.jsonl rows (an evaluation before step 1 has its own)."""
    cmd = [*COMMAND, f"hydra.run.dir={run_dir}", f"checkpoint.dir={run_dir}/checkpoints",
           "checkpoint.resume=never", *overrides]  # fmt: skip
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:
        done = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): see {log.name}")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if x.strip()]


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    steps = [r for r in rows if "reward/mean" in r]
    evals = [r["eval/reward_mean"] for r in rows if "eval/reward_mean" in r]
    out = {
        "final reward": steps[-1]["reward/mean"],
        "last-5 reward": fmean(r["reward/mean"] for r in steps[-5:]),
    }
    if evals:
        out.update({"first eval": evals[0], "last eval": evals[-1]})
    out["s/step"] = fmean(r["timing_s/step"] for r in steps)
    return out


def first_difference(runs: list[list[dict[str, float]]], only: str | None = None) -> str | None:
    """Where the runs first part: the step and a few of the metrics (timings aside, or just
    `only`) that differ; None when none does."""
    for i, rows in enumerate(zip(*runs, strict=False)):
        keys = sorted({k for r in rows for k in r if not is_timing(k) and only in (None, k)})
        differ = [k for k in keys if len({json.dumps(r.get(k)) for r in rows}) > 1]
        if differ:
            more = f", … ({len(differ)} metrics)" if len(differ) > 3 else ""
            return f"step {int(rows[0].get('step', i))} ({', '.join(differ[:3])}{more})"
    return "their lengths" if len({len(r) for r in runs}) > 1 else None


def report(mode: str, runs: list[list[dict[str, float]]]) -> float:
    sums = [summary(rows) for rows in runs]
    print(f"\n{mode}: {len(runs)} runs")
    for i, s in enumerate(sums, 1):
        print(f"  run {i}: " + ", ".join(f"{k} {v:.3f}" for k, v in s.items()))
    for key in sums[0]:
        values = [s[key] for s in sums if not math.isnan(s[key])]
        if values and key != "s/step":
            print(f"  {key}: {min(values):.3f}–{max(values):.3f} "
                  f"(spread {max(values) - min(values):.3f}, mean {fmean(values):.3f})")  # fmt: skip
    where = first_difference(runs)
    if where is None:
        print("  runs identical: every metric but the timings, at every step")
    else:
        loss = first_difference(runs, "train/loss")
        print(f"  runs first differ at {where}; train/loss from {loss or 'never'}")
    return fmean(s["s/step"] for s in sums)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="runs per mode")
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=["default"])
    p.add_argument("--out", type=Path, help="where the runs go (default: a new temp dir)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, the same for every run")
    a = p.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="agentrl-spread-"))
    print(f"{' '.join(['python -m agentrl.train env=code_exec', *a.overrides])}: {a.runs} runs "
          f"per mode ({', '.join(a.modes)}), one after another, in {out}")  # fmt: skip
    per_step = {}
    for mode in a.modes:
        runs = []
        for i in range(a.runs):
            t0 = time.monotonic()
            run_dir = out / f"{mode}-{i + 1}"
            runs.append(train(run_dir, [*a.overrides, *MODES[mode]]))
            print(f"  {mode} run {i + 1}: {time.monotonic() - t0:.0f}s wall", flush=True)
        per_step[mode] = report(mode, runs)
    if len(per_step) == 2:
        (m1, t1), (m2, t2) = per_step.items()
        print(f"\nseconds per step: {m2} {t2:.2f} / {m1} {t1:.2f} = {t2 / t1:.2f}x")


if __name__ == "__main__":
    main()
