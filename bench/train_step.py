"""GRPO step time per phase and learner MFU: the real trainer (`agentrl.train`) on a random model
of a Qwen2.5 shape, with the synthetic fixed-length env (envs/synthetic.py: the prompts and the
sampled lengths are the same whatever the weights), SGLang colocated on the same GPU.

    python bench/train_step.py --shape 0.5b [--tasks 32 --group 8 --prompt-words 128 \
        --new-tokens 512 --steps 4] [-- extra.hydra=overrides]
    python bench/train_step.py --shape tiny --engine dev --tasks 2 --group 4 --new-tokens 32  # CPU
    python bench/train_step.py --shape 0.5b --trl      # then TRL's GRPOTrainer, same model and batch
    python bench/train_step.py --shape qwen3-30b-a3b --layers 2 [-- learner.routing_replay=true]

Prints, per phase, the median seconds over the steps after the first (the first compiles and
warms up), the tokens per step, and two utilisation figures against the GPU's dense bf16 peak:

- learner MFU = (2·N·T for the logprob pass + 6·N·T for the update) / (logprobs + update time)
- step MFU    = 6·N·T / whole step time (the issue's definition: what the GPU spends on learning)

N counts every parameter (embeddings included), T every token of the batch (prompt + sampled);
for a mixture-of-experts model N is the active parameters: each MoE layer's experts count k of E.
--trl then runs TRL's GRPOTrainer on the same model, batch and lengths (bench/trl_grpo.py) and
prints the ratio of step times, TRL / agentrl.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch
import trl_grpo  # bench/trl_grpo.py, beside this file

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "H20": 148.0, "A100": 312.0, "L40S": 362.0}
PHASES = ["rollout", "advantage", "to_learner", "logprobs", "update", "sync"]


def peak_flops(override: float | None) -> float:
    if override:
        return override * 1e12
    if not torch.cuda.is_available():
        return float("nan")
    name = torch.cuda.get_device_name()
    for key, tflops in PEAK_BF16_TFLOPS.items():
        if key in name:
            return tflops * 1e12
    return float("nan")


def count_params(model_dir: Path) -> tuple[int, int]:
    """(all parameters, active ones per token): a sparse layer's experts count top-k of E."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for name, p in model.named_parameters() if ".mlp.experts." in name)
    share = getattr(config, "num_experts_per_tok", 1) / getattr(config, "num_experts", 1)
    return total, total - experts + int(experts * share)


def build(shape: str, tmp: Path, layers: int) -> Path:
    from agentrl.assets.build import build_random_qwen3_moe, build_random_qwen25, cached_tiny_random

    if shape == "tiny":
        return cached_tiny_random(template="qwen")
    if shape == "qwen3-30b-a3b":
        return build_random_qwen3_moe(tmp / f"qwen3-30b-a3b-{layers}l-random", layers)
    return build_random_qwen25(tmp / f"qwen2.5-{shape}-random", shape)


def overrides(args: argparse.Namespace, model: Path, tmp: Path) -> list[str]:
    gpu = args.engine == "sglang"
    return [
        "env=custom",
        "env._target_=agentrl.envs.synthetic.FixedLengthEnv",
        f"env.tasks.n={max(args.tasks * args.steps, 64)}",
        f"env.tasks.prompt_words={args.prompt_words}",
        "model=local",
        f"model.path={model}",
        f"engine={args.engine}",
        *(["weight_sync.method=tensor"] if gpu else []),
        "sandbox=subprocess",
        "logging=local",
        f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.new_tokens}",
        "rollout.ignore_eos=true",  # exactly new_tokens per episode, whatever the weights
        f"env.args.turns={args.turns}",
        f"env.args.observation_words={args.obs_words}",
        f"rollout.max_context_tokens={context_tokens(args)}",
        *([f"rollout.max_obs_tokens={int(1.1 * args.obs_words) + 64}"] if args.obs_words else []),
        f"trainer.steps={args.steps}",
        f"trainer.tasks_per_step={args.tasks}",
        f"checkpoint.every={args.steps}",  # one checkpoint, after the last step
        f"checkpoint.dir={tmp}/ckpt",
        "checkpoint.resume=never",
        *args.hydra,
    ]


def context_tokens(args: argparse.Namespace) -> int:
    """An episode's most tokens: the prompt, every turn's sampled tokens and the observations
    between them (the Qwen BPE makes 1.08 tokens of a word; +64 per message for the template)."""
    obs = (args.turns - 1) * (int(1.1 * args.obs_words) + 64)
    return int(1.1 * args.prompt_words) + 64 + args.turns * (args.new_tokens + 64) + obs


def report(history: list[dict[str, float]], n_params: int, peak: float, wall_s: float) -> float:
    """Print the phases and MFU; return the step seconds (sum of the phases' medians)."""
    rows = history[1:] or history  # the first step warms up (compiles, allocates)
    med = {p: statistics.median(h.get(f"timing_s/{p}", 0.0) for h in rows) for p in PHASES}
    step_s = sum(med.values())
    # the trainer checkpoints every checkpoint.every steps and always after the last one: a cost of
    # the run, not of a step (TRL's reference saves nothing), so shown apart
    ckpt = [h["timing_s/checkpoint"] for h in history if h.get("timing_s/checkpoint", 0) >= 0.01]
    tokens = statistics.median(h["train/batch_tokens"] for h in rows)
    sampled = statistics.median(h["rollout/sampled_tokens"] for h in rows)
    print(f"\n{n_params / 1e9:.3f}B parameters; per step: {tokens:.0f} tokens "
          f"({sampled:.0f} sampled); median of steps 2..{len(history)}; wall {wall_s:.0f}s")  # fmt: skip
    for p in PHASES:
        print(f"  {p:<11} {med[p]:8.3f} s  {100 * med[p] / step_s:5.1f} %")
    print(f"  {'step':<11} {step_s:8.3f} s")
    inside = [h["train/step_s"] for h in rows if "train/step_s" in h]
    if inside:  # the learner's own clock: its micro-batch loop and optimizer step, nothing else
        print(f"  (update inside the learner: {statistics.median(inside):.3f} s)")
    parts = sorted(k for k in rows[0] if k.startswith("sync/") and k.endswith("_s"))
    if parts:  # the weight push by part (agentrl/learner/sync/tensor.py: take_times)
        print("  (sync by part: " + ", ".join(
            f"{k[5:]} {statistics.median(h.get(k, 0.0) for h in rows):.3f}" for k in parts) + ")")  # fmt: skip
    print(f"  (checkpoint, not in the step: {', '.join(f'{c:.1f} s' for c in ckpt) or 'none'})")
    learner_s = med["logprobs"] + med["update"]
    # model FLOPs: 6N per token for the update's forward + backward, 2N for a separate pi_old
    # pass when one ran (algo.old_logprobs=auto skips it with one optimizer step per batch);
    # activation checkpointing's recompute is hardware work, not counted
    passes = 6 + (2 if med["logprobs"] > 0.01 else 0)
    learner_mfu = passes * n_params * tokens / learner_s / peak
    step_mfu = 6 * n_params * tokens / step_s / peak
    print(f"rollout {sampled / med['rollout']:.0f} sampled tok/s; learner "
          f"{tokens / learner_s:.0f} tok/s")  # fmt: skip
    print(f"learner MFU {100 * learner_mfu:.1f} %  step MFU {100 * step_mfu:.1f} %  "
          f"(peak {peak / 1e12:.0f} TFLOP/s bf16)")  # fmt: skip
    # the engine sampled with the weights pushed after the step before: its logprobs of the
    # sampled tokens against the learner's, per step (steps 2.. follow a push)
    peaks = sorted({k for h in history for k in h if k.startswith("perf/peak_mem_gb/")})
    if peaks:
        print("learner GPU memory at most (GiB, the allocator's, the most over steps): " + ", ".join(
            f"{k.rsplit('/', 1)[1]} {max(h.get(k, 0.0) for h in history):.1f}" for k in peaks))  # fmt: skip
    mbs = [h["train/micro_batches"] for h in history if "train/micro_batches" in h]
    if mbs:  # learner.micro_batch_tokens (auto: sized by the GPU's memory) decides how many
        print(f"micro-batches per step: {', '.join(f'{m:.0f}' for m in mbs)}")
    blocks = [h["train/checkpointed_blocks"] for h in history if "train/checkpointed_blocks" in h]
    if blocks:
        print(f"blocks recomputed in backward per step: {', '.join(f'{b:.0f}' for b in blocks)}")
    retries = [(h["train/alloc_retries"], h.get("train/alloc_retries_optimizer", 0.0))
               for h in history if "train/alloc_retries" in h]  # fmt: skip
    if retries:  # the CUDA allocator emptied its cache and retried (0 on CPU)
        print("allocator retries per step (of them in the optimizer step): "
              + ", ".join(f"{a:.0f} ({o:.0f})" for a, o in retries))  # fmt: skip
    gaps = ", ".join(f"{h.get('train/logprob_diff', float('nan')):.4f}" for h in history)
    print(f"engine vs learner logprob gap per step (mean |diff|): {gaps}")
    return step_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shape", default="0.5b", help="0.5b | 1.5b | 7b | qwen3-30b-a3b | tiny (CPU)")
    p.add_argument("--layers", type=int, default=2,
                   help="qwen3-30b-a3b: layers of its 48 (2 train colocated on one H100; 4 ran "
                   "out of memory in the update)")  # fmt: skip
    p.add_argument(
        "--model", type=Path, help="a model directory to use instead of building --shape"
    )
    p.add_argument("--engine", default="sglang", choices=["sglang", "dev"])
    p.add_argument("--tasks", type=int, default=32, help="tasks per step")
    p.add_argument("--group", type=int, default=8, help="samples per task")
    p.add_argument("--prompt-words", type=int, default=128, help="about one token each")
    p.add_argument("--new-tokens", type=int, default=512, help="sampled tokens per turn")
    p.add_argument("--turns", type=int, default=1, help="assistant turns per episode")
    p.add_argument("--obs-words", type=int, default=0, help="words per tool message (0: 'ok')")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument(
        "--profile",
        metavar="DIR",
        help="torch.profiler over step 2's update: the top ops and a "
        "trace (update_rank0.txt, .json.gz) in DIR",
    )
    p.add_argument(
        "--profile-memory",
        action="store_true",
        help="with --profile: also the CUDA allocator's history over that update "
        "(memory_rank0.pickle in DIR, for pytorch.org/memory_viz: where a retry happened)",
    )
    p.add_argument(
        "--cprofile",
        metavar="FILE",
        help="cProfile the trainer process (the driver: batching, Ray calls, metrics) into FILE",
    )
    p.add_argument("--peak-tflops", type=float, help="dense bf16 peak (default: by GPU name)")
    p.add_argument("--trl", action="store_true", help="also TRL's GRPOTrainer (needs trl)")
    trl_grpo.add_args(p)
    p.add_argument("hydra", nargs="*", help="more Hydra overrides, after --")
    args = p.parse_args()
    # the learner's set-up line (kernels, micro-batches, checkpointing) beside the figures
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("agentrl.learner.group").setLevel(logging.INFO)

    from agentrl.config import compose
    from agentrl.train import train

    with tempfile.TemporaryDirectory(prefix="agentrl-step-") as d:
        tmp = Path(d)
        model = args.model or build(args.shape, tmp, args.layers)
        more = []
        if args.profile:
            more = ["learner.profile_step=2", f"learner.profile_dir={Path(args.profile).resolve()}"]
            more += ["learner.profile_memory=true"] if args.profile_memory else []
        cfg = compose(overrides(args, model, tmp) + more)
        t0 = time.perf_counter()
        if args.cprofile:
            import cProfile
            import pstats

            with cProfile.Profile() as prof:
                history = asyncio.run(train(cfg, tmp / "out"))
            prof.dump_stats(args.cprofile)
            pstats.Stats(prof).sort_stats("cumulative").print_stats("agentrl", 40)
        else:
            history = asyncio.run(train(cfg, tmp / "out"))
        wall = time.perf_counter() - t0
        n_all, n_params = count_params(model)
        if n_params != n_all:
            print(
                f"mixture of experts: {n_all / 1e9:.3f}B parameters, {n_params / 1e9:.3f}B active"
            )
        step_s = report(history, n_params, peak_flops(args.peak_tflops), wall)
        if args.trl:
            res = trl_grpo.trl_step_times(model, args, tmp / "trl")
            trl_s = trl_grpo.summary(res, args.tasks * args.group)
            print(
                f"ratio TRL step / agentrl step: {trl_s / step_s:.2f} ({trl_s:.2f} s / {step_s:.2f} s)"
            )


if __name__ == "__main__":
    main()
