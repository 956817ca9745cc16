"""The learning tests' rule (test_learning*.py, test_async.py): a run evaluates the policy on a
fixed set before its first step and after its last (trainer.eval.every = its steps; 32 tasks x 4
samples by default), and passes when that evaluation rose by `margin`.

A step's own reward/mean is over the 8 tasks it drew, and their difficulty moves it as much as the
policy does: rules on the first and last steps' rewards failed runs that had learned
(docs/evaluation.md; tests/e2e/test_learning_envs.py has an example)."""

from __future__ import annotations

import json
from pathlib import Path


def eval_overrides(steps: int) -> list[str]:
    """The Hydra overrides of a learning test's run of `steps` steps."""
    return [f"trainer.steps={steps}", f"checkpoint.every={steps}", f"trainer.eval.every={steps}",
            "logging=local"]  # fmt: skip


def evaluations(out: Path) -> dict[int, float]:
    """eval/reward_mean by step, from the run's metrics.jsonl."""
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {int(r["step"]): r["eval/reward_mean"] for r in rows if "eval/reward_mean" in r}


def assert_learned(out: Path, steps: int, margin: float, what: str = "the policy") -> dict:
    evals = evaluations(out)
    print(f"{what}: evaluation by step {evals}")
    assert sorted(evals) == [0, steps], f"expected evaluations at steps 0 and {steps}: {evals}"
    assert evals[steps] >= evals[0] + margin, (
        f"{what}: the evaluation did not rise by {margin}: {evals}"
    )
    return evals
