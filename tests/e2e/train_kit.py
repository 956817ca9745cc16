"""Shared pieces of the training-run tests (test_train*.py): the small run's overrides and what
they read back from a run."""

import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["trainer.tasks_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=48",
         "rollout.max_turns=2", "ray.num_cpus=2", "+env.args.format_reward=0.5"]  # fmt: skip


def overrides(tmp: Path, *extra: str) -> list[str]:
    return [*SMALL, f"checkpoint.dir={tmp}/ckpt", *extra]


def steps_of(path: Path) -> list[list[str]]:
    """Task ids per step, from trajectories.jsonl."""
    by_step: dict[int, list[str]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        by_step.setdefault(row["step"], []).append(row["task_id"])
    return [sorted(set(v)) for _, v in sorted(by_step.items())]


def token_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) of a plain forward, aligned with `ids` (0 at position 0)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1]
    lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    return torch.cat([torch.zeros(1), lp])
