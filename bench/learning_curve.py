"""The quick start's learning curve: reward and tool-call rate per step, and where the time goes.

    python bench/learning_curve.py                         # run the quick start, then report
    python bench/learning_curve.py trainer.steps=40        # … with Hydra overrides
    python bench/learning_curve.py --metrics runs/code_exec/metrics.jsonl   # report a finished run
    python bench/learning_curve.py --metrics M.jsonl --plot bench/learning_curve.png  # + a PNG
    python bench/learning_curve.py --metrics A.jsonl B.jsonl --plot both.png   # runs side by side

Prints a table (step, elapsed seconds, reward/mean, the reward's components if the env returns a
dict, e.g. reward/correct, and rollout/tool_call_rate) and the ratio of the last five steps' mean
reward to the first step's, the reference measured in the same run. Elapsed time is the sum of the steps' `timing_s/*` phases (the loop's own time, without
start-up). `--plot` needs matplotlib (`pip install matplotlib`), which agentrl itself does not use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from statistics import fmean


def read_metrics(path: Path) -> list[dict[str, float]]:
    """The training steps' rows (an evaluation logged on a row of its own, e.g. before step 1,
    has no rollout metrics and is left out)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "rollout/tool_call_rate" in r]


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(
            "--plot needs matplotlib, which agentrl does not use: pip install matplotlib"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def elapsed(rows: list[dict[str, float]]) -> list[float]:
    total, out = 0.0, []
    for r in rows:
        total += sum(v for k, v in r.items() if k.startswith("timing_s/") and k != "timing_s/step")
        out.append(total)
    return out


_NOT_COMPONENTS = {"mean", "max", "min", "std", "turn_sum", "return_mean"}


def components(rows: list[dict[str, float]]) -> list[str]:
    """The reward components the run logged (`reward/<name>` of an env's reward dict, e.g.
    `reward/correct`); an env whose reward is a number has none."""
    names = {k for r in rows for k in r if k.startswith("reward/")}
    return sorted(
        k for k in names if k.split("/", 1)[1] not in _NOT_COMPONENTS and not k.endswith("_all")
    )


def table(rows: list[dict[str, float]]) -> str:
    parts = components(rows)
    head = ["step", "elapsed s", "reward/mean", *parts, "tool_call_rate", "step s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    prev = 0.0
    for r, t in zip(rows, elapsed(rows), strict=True):
        rewards = [r.get(k, float("nan")) for k in ("reward/mean", *parts)]
        cells = [f"{int(r['step'])}", f"{t:.0f}", *(f"{v:.3f}" for v in rewards)]
        cells += [f"{r['rollout/tool_call_rate']:.2f}", f"{t - prev:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
        prev = t
    return "\n".join(lines)


def phases(rows: list[dict[str, float]]) -> str:
    keys = sorted(
        {k for r in rows for k in r if k.startswith("timing_s/") and k != "timing_s/step"}
    )
    means = {k.removeprefix("timing_s/"): fmean(r.get(k, 0.0) for r in rows) for k in keys}
    total = sum(means.values())
    return f"mean step time {total:.2f}s: " + ", ".join(
        f"{k} {v:.2f}s ({100 * v / total:.0f}%)"
        for k, v in sorted(means.items(), key=lambda x: -x[1])
    )


def _draw(ax, rows: list[dict[str, float]]) -> None:
    """Reward and tool-call rate per step on one axes."""
    steps = [int(r["step"]) for r in rows]
    ax.plot(steps, [r.get("reward/mean", float("nan")) for r in rows], label="reward/mean", lw=2)
    ax.plot(steps, [r["rollout/tool_call_rate"] for r in rows], label="rollout/tool_call_rate",
            lw=1.5, ls="--")  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)


def plot(rows: list[dict[str, float]], out: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
    _draw(ax, rows)
    steps = [int(r["step"]) for r in rows]
    top = ax.secondary_xaxis("top", functions=_step_to_minutes(steps, elapsed(rows)))
    top.set_xlabel("minutes (training loop)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out)


def plot_runs(runs: dict[str, list[dict[str, float]]], out: Path) -> None:
    """Several runs' curves side by side, one panel each."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.4), dpi=110, sharey=True)
    for ax, (name, rows) in zip(axes, runs.items(), strict=True):
        _draw(ax, rows)
        ax.set_title(name)
    axes[-1].legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out)


def _step_to_minutes(steps: list[int], secs: list[float]):
    import numpy as np

    xs, ys = np.array(steps, dtype=float), np.array(secs) / 60

    def fwd(s):
        return np.interp(s, xs, ys)

    def inv(m):
        return np.interp(m, ys, xs)

    return fwd, inv


def run(overrides: list[str]) -> Path:
    from agentrl.config import compose
    from agentrl.train import train

    tmp = Path(tempfile.mkdtemp(prefix="agentrl-curve-"))
    cfg = compose([f"checkpoint.dir={tmp}/ckpt", *overrides])
    t0 = time.monotonic()
    asyncio.run(train(cfg, tmp / "out"))
    print(f"wall time, start-up included: {time.monotonic() - t0:.0f}s (run dir {tmp})")
    return tmp / "out" / "metrics.jsonl"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--metrics", type=Path, nargs="+",
                   help="finished runs' metrics.jsonl (else: run one); several: side by side")  # fmt: skip
    p.add_argument("--plot", type=Path, help="write a PNG of the curve here (needs matplotlib)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for the run")
    a = p.parse_args()
    if a.metrics and len(a.metrics) > 1:
        runs = {m.parent.name: read_metrics(m) for m in a.metrics}
        for name, rows in runs.items():
            print(f"## {name}\n{table(rows)}\n{phases(rows)}")
        if a.plot:
            plot_runs(runs, a.plot)
            print(f"plot written to {a.plot}")
        return
    rows = read_metrics(a.metrics[0] if a.metrics else run(a.overrides))
    print(table(rows))
    print(phases(rows))
    first, last = (
        rows[0].get("reward/mean", 0.0),
        fmean(r.get("reward/mean", 0.0) for r in rows[-5:]),
    )
    print(f"reward: first step {first:.3f}, last five steps {last:.3f} "
          f"(x{last / first:.1f} the first step)" if first else f"reward: {first:.3f} → {last:.3f}")  # fmt: skip
    if a.plot:
        plot(rows, a.plot)
        print(f"plot written to {a.plot}")


if __name__ == "__main__":
    main()
