"""The `trainer` section, grouped by concern, and the keys that moved when it was grouped.

    trainer.steps, tasks_per_step, mode, driver_threads, deterministic   the loop itself
    trainer.async.*      mode=async only: staleness bound, its policy, partial rollouts
    trainer.sampling.*   which groups a step trains: over-sampling, dynamic sampling
    trainer.eval.*       the fixed evaluation set: how often, how many tasks, held out or not
    trainer.guards.*     when the run stops or warns: crashes, empty steps, no signal, gaps
    checkpoint.*         (a section of its own, agentrl/ckpt.py: CheckpointConfig)

`async` is a Python keyword: the field is `async_`, spelled `async` in YAML, on the command line
and in a checkpoint's settings (`trainer.async.max_staleness=2`).

`MOVED_KEYS` is the one table of keys an older config (a YAML file, a command line, a dict, a
checkpoint's recorded settings) may still use: the command line and validation refuse them with
the new key, a resumed run reads an old checkpoint's settings through it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

_ASYNC = ("max_staleness", "stale_policy", "partial_rollouts")
_SAMPLING = ("oversample_groups", "dynamic_sampling", "max_refill_rounds")
_EVAL = ("every", "size", "samples", "split")
_GUARDS = ("max_skipped_steps", "max_aborted_frac", "max_unavailable_frac", "max_empty_steps",
           "no_signal_steps", "warn_logprob_gap", "warn_tool_fail_rate")  # fmt: skip
_CHECKPOINT = ("dir", "every", "keep_last", "resume", "save_optimizer", "async_save",
               "optimizer_format")  # fmt: skip

# old dotted key -> new dotted key (the flat `trainer` section, before it was grouped)
MOVED_KEYS: dict[str, str] = {
    **{f"trainer.{k}": f"trainer.async.{k}" for k in _ASYNC},
    **{f"trainer.{k}": f"trainer.sampling.{k}" for k in _SAMPLING},
    **{f"trainer.eval_{k}": f"trainer.eval.{k}" for k in _EVAL},
    **{f"trainer.{k}": f"trainer.guards.{k}" for k in _GUARDS},
    **{f"trainer.{k}": f"checkpoint.{k}" for k in _CHECKPOINT},
}


def moved_settings(settings: dict[str, object]) -> dict[str, object]:
    """Dotted settings with every old key under its new name (a checkpoint written before the
    `trainer` section was grouped); a key both old and new keeps the new one's value."""
    old = {MOVED_KEYS[k]: v for k, v in settings.items() if k in MOVED_KEYS}
    return old | {k: v for k, v in settings.items() if k not in MOVED_KEYS}


class AsyncConfig(BaseModel):
    """trainer.mode=async: how far rollouts may run ahead of the learner."""

    model_config = ConfigDict(extra="forbid")

    max_staleness: int = Field(
        1,
        ge=0,
        description="the most weight versions a trained token may lag behind. 1 lets one "
        "batch roll out ahead, so the learner waits for that batch's slowest episode; 2 hides it "
        "when episodes have long tails (bench/async_speedup.py on 2 cores: 1.53-1.57x sync at 2, "
        "1.41-1.46x at 1), at the price of staler tokens",
    )
    stale_policy: Literal["wait", "drop"] = Field(
        "wait",
        description="wait (launch no more than the staleness bound allows) or drop "
        "(launch freely, drop groups found too stale)",
    )
    partial_rollouts: bool = Field(
        True,
        description="a weight push cuts the turns in flight (/abort_request, then "
        "/pause_generation) and they go on under the new weights, keeping what they sampled "
        "with its version (agentrl/engine/gate.py); false: the push waits for them to finish",
    )


class SamplingConfig(BaseModel):
    """Which groups a step trains on, beyond the tasks_per_step it draws."""

    model_config = ConfigDict(extra="forbid")

    oversample_groups: int = Field(
        0,
        ge=0,
        description="sync: roll out this many groups more than tasks_per_step and keep the "
        "first tasks_per_step to finish (the rest are aborted on the engine): a slow tail never "
        "holds the step, at the price of a bias towards quickly finished episodes (env=mixture: "
        "within each env, which keeps its share of the step's draws)",
    )
    dynamic_sampling: bool = Field(
        False,
        description="DAPO's dynamic sampling: groups that carry no gradient (every advantage 0, "
        "e.g. equal outcome and per-turn rewards under a group baseline; "
        "advantage.carries_gradient states the rule for gae and kl_mode=reward) are dropped and "
        "more tasks rolled out until tasks_per_step groups carry gradient "
        "(rollout/filtered_groups); reward/* is then over the kept groups, reward/*_all "
        "(mean_all, max_all, min_all, std_all) over all, the console's reward too",
    )
    max_refill_rounds: int = Field(
        3,
        ge=0,
        description="dynamic_sampling: extra rollout rounds per step at most (async: "
        "tasks_per_step x this many more groups); with no group carrying gradient by then, the "
        "step trains on the first ones it rolled out (and the no-signal warning counts it)",
    )


class EvalConfig(BaseModel):
    """The fixed evaluation set (env.eval_tasks, agentrl/evaluate.py)."""

    model_config = ConfigDict(extra="forbid")

    every: int = Field(
        0,
        ge=0,
        description="evaluate the policy before the first step and every N steps (and after the "
        "last): `size` tasks of the evaluation set (env.eval_tasks), the same ones each time, "
        "`samples` episodes each, their episodes never trained on (eval/* metrics); 0: never",
    )
    size: int = Field(32, ge=1, description="tasks of each evaluation (the set's first N)")
    samples: int = Field(4, ge=1, description="episodes per evaluation task")
    split: Literal["heldout", "shared"] = Field(
        "heldout",
        description="heldout: training never samples a task that shares an id or a prompt with "
        "the evaluation set (drawn from env.tasks, or env.eval_tasks when given, and left out of "
        "the training list); shared: the training list stays whole",
    )


class GuardsConfig(BaseModel):
    """When the run stops with an error, or warns (agentrl/guards.py)."""

    model_config = ConfigDict(extra="forbid")

    max_skipped_steps: int = Field(
        3, ge=1, description="non-finite steps in a row before the run stops with an error"
    )
    max_aborted_frac: float = Field(
        0.2,
        ge=0,
        le=1,
        description="share of a step's episodes that may crash (aborted, reward_error) before "
        "the run stops with one of their tracebacks",
    )
    max_unavailable_frac: float = Field(
        0.1,
        ge=0,
        le=1,
        description="share of a step's episodes that may still have no sandbox after their "
        "groups were rolled out again (sandbox_unavailable) before the run stops with the cause",
    )
    max_empty_steps: int = Field(
        3, ge=1, description="steps in a row with no trainable trajectory before the run stops"
    )
    no_signal_steps: int = Field(
        5,
        ge=0,
        description="warn after this many steps in a row in which no group carries gradient "
        "(every advantage 0: advantage.carries_gradient); 0: off",
    )
    warn_logprob_gap: float = Field(
        0.1,
        ge=0,
        description="sync: warn (console, log, W&B alert) every step whose train/logprob_diff "
        "(the engine's logprobs of the tokens it sampled against the trainer's, same weights) "
        "is above this: the engine is not serving the trained model (a push that did not land "
        "whole, a wrong adapter, another dtype or tokenizer); bf16 stacks differ by 0.002-0.05 "
        "per token; 0: off",
    )
    warn_tool_fail_rate: float = Field(
        0.5,
        ge=0,
        le=1,
        description="warn (console, log, W&B alert) when a tool fails on more than this share of "
        "its calls in a step (8 calls at least; the model's errors and the tool's own exceptions "
        "both count), naming the tool and one of its errors: at the first such step, then every "
        "10 steps while it lasts (rollout/failing_tools, tools/<name>/fail_rate); 0: off",
    )


class TrainerConfig(BaseModel):
    """The loop: how long, how much per step, sync or async; its concerns in groups."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    steps: int = Field(60, ge=1, description="optimizer steps of the run")
    tasks_per_step: int = Field(8, ge=1, description="tasks per step; x rollout.group_size samples")
    mode: Literal["sync", "async"] = Field(
        "sync",
        description="sync: each step rolls out, then trains; async: rollouts run on in the "
        "background while the learner trains (agentrl/producer.py), within "
        "trainer.async.max_staleness",
    )
    driver_threads: int = Field(
        1,
        ge=1,
        description="torch CPU threads of the trainer process (batching, metrics; the learners "
        "and servers are processes of their own). More threads' spinning starved the engine's "
        "and learner's processes: 0.5B step on an H100 6.3 s at 16, 4.5 s at 1 (bench/train_step.py)",
    )
    deterministic: bool = Field(
        False,
        description="two runs of the same command give the same metrics, step by step (timings "
        "aside): every engine request carries a sampling seed from (seed, step, task, sample, "
        "turn), the dev server computes each request alone with no prefix cache (SGLang: "
        "--enable-deterministic-inference), torch deterministic algorithms in the learner. "
        "Sync mode only (no sampling.oversample_groups); rollouts are slower "
        "(docs/checkpoints.md: Reproducible runs)",
    )
    async_: AsyncConfig = Field(default_factory=AsyncConfig, alias="async")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    guards: GuardsConfig = Field(default_factory=GuardsConfig)
