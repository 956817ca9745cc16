"""The peer reference for bench/train_step.py: TRL's GRPOTrainer on the same model, batch and
lengths, one GPU, its stock setup (transformers `generate` for sampling, no vLLM).

    python bench/trl_grpo.py --model DIR [--tasks 32 --group 8 --prompt-words 128 \
        --new-tokens 512 --steps 4 --micro-batch 16]
    python bench/train_step.py --shape 0.5b --trl      # agentrl first, then this, same run

Same work per step as agentrl's bench: `--tasks` prompts (envs/synthetic.FixedLengthEnv's user
messages, through the model's chat template) x `--group` samples, each sampled to exactly
`--new-tokens` tokens (min_new_tokens), a random reward, one optimizer step over all of them
(gradient accumulation over micro-batches of `--micro-batch` completions), bf16, gradient
checkpointing, beta 0 (no reference model, as agentrl's GRPO default), lr 1e-6. Prints the
median step time over the steps after the first. Needs `trl` (and its `datasets`); not a
dependency of agentrl.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def trl_step_times(model: Path, a: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Run TRL's GRPOTrainer for a.steps steps; per-step seconds and the batch's token counts."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agentrl.envs.synthetic import FixedLengthEnv

    tasks = FixedLengthEnv.load_tasks(n=a.tasks * a.steps, prompt_words=a.prompt_words)
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": t.data["prompt"]}]} for t in tasks]
    )
    tok = AutoTokenizer.from_pretrained(model)
    text = tok.apply_chat_template(data[0]["prompt"], add_generation_prompt=True, tokenize=False)
    prompt_tokens = len(tok(text, add_special_tokens=False)["input_ids"])

    def reward(completions: list[Any], **_: Any) -> list[float]:
        return [random.random() for _ in completions]

    per_step = a.tasks * a.group
    if per_step % a.micro_batch:
        raise SystemExit(f"--micro-batch {a.micro_batch} must divide {per_step} completions")
    cfg = GRPOConfig(
        output_dir=str(out_dir),
        max_steps=a.steps,
        learning_rate=1e-6,
        num_generations=a.group,
        per_device_train_batch_size=a.micro_batch,
        gradient_accumulation_steps=per_step // a.micro_batch,
        max_completion_length=a.new_tokens,
        generation_kwargs={"min_new_tokens": a.new_tokens},
        temperature=1.0,
        beta=0.0,
        bf16=torch.cuda.is_available(),
        use_cpu=not torch.cuda.is_available(),
        gradient_checkpointing=True,
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
    )
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.t0, self.steps = 0.0, []

        def on_step_begin(self, *args: Any, **kw: Any) -> None:
            sync()
            self.t0 = time.perf_counter()

        def on_step_end(self, *args: Any, **kw: Any) -> None:
            sync()
            self.steps.append(time.perf_counter() - self.t0)

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    clock = Clock()
    trainer = GRPOTrainer(
        model=policy, reward_funcs=reward, args=cfg, train_dataset=data, processing_class=tok,
        callbacks=[clock],
    )  # fmt: skip
    trainer.train()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history
               if "completions/mean_length" in h]  # fmt: skip
    del trainer, policy
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"step_s": clock.steps, "prompt_tokens": prompt_tokens, "completion_lengths": lengths}


def summary(res: dict[str, Any], per_step: int) -> float:
    """Print TRL's figures; return its median step seconds (steps after the first)."""
    steps = res["step_s"][1:] or res["step_s"]
    med = statistics.median(steps)
    tokens = per_step * (res["prompt_tokens"] + statistics.mean(res["completion_lengths"] or [0]))
    print(f"TRL GRPOTrainer: {per_step} completions per step, prompt {res['prompt_tokens']} tokens, "
          f"completion lengths {res['completion_lengths']}")  # fmt: skip
    print(f"TRL step {med:.2f} s (median of {len(steps)}; all: "
          f"{', '.join(f'{s:.1f}' for s in res['step_s'])}); {tokens / med:.0f} tok/s")  # fmt: skip
    return med


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--micro-batch", type=int, default=16, help="TRL completions per micro-batch")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--tasks", type=int, default=32)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompt-words", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--steps", type=int, default=4)
    add_args(p)
    a = p.parse_args()
    random.seed(0)
    with tempfile.TemporaryDirectory(prefix="agentrl-trl-") as d:
        summary(trl_step_times(Path(a.model), a, Path(d)), a.tasks * a.group)


if __name__ == "__main__":
    main()
