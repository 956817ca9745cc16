"""A trainer step of several optimizer steps (algo.mini_batches, algo.ppo_epochs) logs the sum of
the learner's counts and seconds, not their mean: with 2 mini-batches train/tokens read half the
step's tokens (60 of 120 in a PPO + LoRA run); ratios and losses stay means."""

from __future__ import annotations

from agentrl.metrics import mean_over_steps


def test_counts_and_seconds_add_up_and_the_rest_is_averaged() -> None:
    steps = [
        {"policy/tokens": 60.0, "policy/batch_tokens": 200.0, "policy/micro_batches": 2.0,
         "policy/step_s": 0.5, "policy/alloc_retries": 1.0, "critic/tokens": 60.0,
         "policy/loss": 0.25, "policy/ratio_max": 1.1, "policy/ratio_min": 0.9,
         "policy/skipped": 0.0},
        {"policy/tokens": 60.0, "policy/batch_tokens": 180.0, "policy/micro_batches": 1.0,
         "policy/step_s": 0.75, "policy/alloc_retries": 0.0, "critic/tokens": 60.0,
         "policy/loss": 0.75, "policy/ratio_max": 1.3, "policy/ratio_min": 0.95,
         "policy/skipped": 1.0},
    ]  # fmt: skip
    out = mean_over_steps(steps)
    assert out["policy/tokens"] == 120.0 and out["critic/tokens"] == 120.0
    assert out["policy/batch_tokens"] == 380.0 and out["policy/micro_batches"] == 3.0
    assert out["policy/step_s"] == 1.25 and out["policy/alloc_retries"] == 1.0
    assert out["policy/loss"] == 0.5  # a mean
    assert out["policy/ratio_max"] == 1.3 and out["policy/ratio_min"] == 0.9
    assert out["policy/skipped"] == 1.0
