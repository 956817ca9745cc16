"""Learner step time against the packed micro-batch size: one FSDP2 rank (gloo, in this process),
the same GRPO batch (episodes of random ids, of one length or, with --spread, of lengths drawn
uniformly in length ± spread) packed into rows of at most N tokens. A packed row's attention mask
is dense, so its cost grows with the square of its length.

    python bench/learner_microbatch.py [--model builtin:tiny] [--episodes 64 --length 130] \
        [--sizes 512 4096] [--repeats 3]
    python bench/learner_microbatch.py --length 400 --spread 300 --layouts padded --sizes 4096
    python bench/learner_microbatch.py --shape 1.5b --device cuda --episodes 256 --length 655 \
        --layouts padded --plans runs --sizes 16384 32768 --update-only \
        --variants attention_kernel=auto attention_kernel=flash     # GPU: learner settings, same run

`--variants` measures each listed set of learner settings (`key=value,key=value`, LearnerConfig
fields; `default` for none) on the same batch in the same process, one after the other. On CUDA
it also prints the update's MFU: 6·N·T / update seconds / the GPU's dense bf16 peak (N every
parameter, T every real token), train_step.py's learner figure without a separate logprob pass.

Prints, per attention layout (`learner.attention_layout`: packed row with a dense mask, or a
right-padded batch under a causal mask), micro-batch plan and size, the median seconds of the
logprob pass and of the update, the tokens the padded rows compute per real token, and the ratio
of each update time to the first row's (the reference, same run). Plans: `mixed`, longest first
into the lightest micro-batch (what the packed layout uses); `runs`, runs of similar length
within the budget counted with padding (what the padded layout uses).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time
from pathlib import Path

import torch


def make_batch(episodes: int, length: int, vocab: int, spread: int = 0, seed: int = 0):
    from agentrl.batch import TrainBatch, global_norm

    g = torch.Generator().manual_seed(seed)
    lens = (torch.randint(-spread, spread + 1, (episodes,), generator=g) + length).tolist()
    n = sum(lens)
    seq = torch.cat([torch.full((k,), i) for i, k in enumerate(lens)])
    pos = torch.cat([torch.arange(k) for k in lens])
    mask = torch.cat([torch.arange(k) >= k * 2 // 3 for k in lens])  # the last third sampled
    return TrainBatch(torch.randint(0, vocab, (n,), generator=g), pos, mask,
                      torch.where(mask, -2.0, 0.0), torch.where(mask, torch.randn(n, generator=g), 0.0),
                      seq, global_norm(mask, seq),
                      trainer_old_logprobs=torch.where(mask, -2.0, 0.0))  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="builtin:tiny")
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--length", type=int, default=130, help="tokens per episode")
    p.add_argument("--sizes", type=int, nargs="+", default=[512, 4096])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--layouts", nargs="+", default=["packed", "padded"])
    p.add_argument("--spread", type=int, default=0, help="episode lengths: length ± spread")
    p.add_argument("--plans", nargs="+", default=["mixed", "runs"], help="padded layout's plans")
    p.add_argument("--shape", help="a random Qwen2.5 shape (0.5b | 1.5b | 7b) instead of --model")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--variants", nargs="+", default=["default"], help="learner settings to compare")
    p.add_argument(
        "--fresh-shapes",
        action="store_true",
        help="draw the lengths again for every round (with --spread: new micro-batch shapes each "
        "update, as a trainer's steps have; kernels that plan per shape pay it every time)",
    )
    p.add_argument("--update-only", action="store_true", help="skip the separate logprob pass")
    p.add_argument(
        "--old-from-forward",
        action="store_true",
        help="pi_old from the update's own forward, as the trainer takes it with one optimizer "
        "step per batch (algo.old_logprobs=auto), instead of given with the batch",
    )
    p.add_argument(
        "--release",
        action="store_true",
        help="empty the CUDA cache before each update, as a colocated step does (the engine "
        "takes the memory back between updates)",
    )
    a = p.parse_args()

    import tempfile

    from agentrl.config import ModelConfig
    from agentrl.learner import LearnerConfig

    tmp = tempfile.TemporaryDirectory()
    if a.shape:
        from agentrl.assets.build import build_random_qwen25

        model = str(build_random_qwen25(Path(tmp.name) / f"qwen2.5-{a.shape}", a.shape))
    else:
        model = str(ModelConfig(path=a.model).resolve())
    base = LearnerConfig(model_path=model, device=a.device, lr=1e-4, threads_per_worker=a.threads)
    rows = []
    for variant in a.variants:
        sets = dict(kv.split("=", 1) for kv in variant.split(",")) if variant != "default" else {}
        for layout in a.layouts:
            cfg = LearnerConfig.model_validate(
                {**base.model_dump(), **sets, "attention_layout": layout}
            )
            rows += [(variant, *r) for r in measure(cfg, a)]
    print(f"{a.episodes} episodes x {a.length} ± {a.spread} tokens, {model}, {a.device}, "
          f"{a.threads} thread(s)")  # fmt: skip
    mfu = a.device == "cuda"
    if mfu:
        from train_step import count_params, peak_flops  # bench/, beside this file

        n_params, peak = count_params(Path(model))[1], peak_flops(None)
    print(f"{'variant':>28} {'layout':>7} {'plan':>6} {'max tokens':>10} {'micro-batches':>13} "
          f"{'padded/real':>11} {'logprobs s':>10} {'update s':>9} {'ratio':>6}"
          + (f" {'update MFU':>10}" if mfu else ""))  # fmt: skip
    for variant, layout, plan, size, n, pad, lp_s, up_s, real in rows:
        line = (f"{variant:>28} {layout:>7} {plan:>6} {size:>10} {n:>13} {pad:>11.2f} "
                f"{lp_s:>10.2f} {up_s:>9.2f} {up_s / rows[0][-2]:>6.2f}")  # fmt: skip
        if mfu:
            line += f" {100 * 6 * n_params * real / up_s / peak:>9.1f}%"
        print(line)
    tmp.cleanup()


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure(cfg, a) -> list[tuple]:
    from agentrl.batch import micro_batches, padded_tokens, plan_micro_batches
    from agentrl.learner.worker import LearnerWorker
    from agentrl.loss import LossConfig

    with socket.socket() as sock:  # a free loopback port for the one-rank process group
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    worker = LearnerWorker(cfg, "policy", 0, 1, f"tcp://127.0.0.1:{port}")
    worker.setup()
    vocab = worker.model.config.vocab_size

    def batch_of(seed: int):
        batch = make_batch(a.episodes, a.length, vocab, a.spread, seed)
        if a.old_from_forward:
            batch.trainer_old_logprobs = None
        return batch

    batch = batch_of(0)
    lens = batch.seq_lens
    real = sum(lens)
    rows = []
    plans = a.plans if cfg.attention_layout == "padded" else ["mixed"]
    for plan, size in [(p, s) for p in plans for s in a.sizes]:
        runs = plan == "runs"
        mbs = micro_batches(batch, 1, size, padded=runs)[0]
        pad = padded_tokens(plan_micro_batches(lens, 1, size, runs), lens) / real
        lp, up = [], []
        for round_ in range(a.repeats + 1):  # the first round warms up
            if a.fresh_shapes and round_:
                mbs = micro_batches(batch_of(round_), 1, size, padded=runs)[0]
            if a.release and torch.cuda.is_available():
                torch.cuda.empty_cache()
            sync()
            t0 = time.perf_counter()
            if not a.update_only:
                worker.compute_logprobs(mbs)
            sync()
            t1 = time.perf_counter()
            worker.train_step(mbs, "ppo_clip", LossConfig(name="ppo_clip"), 1.0, a.old_from_forward)
            if a.old_from_forward:
                worker.update_logprobs()
            sync()
            lp.append(t1 - t0)
            up.append(time.perf_counter() - t1)
        rows.append(
            (
                cfg.attention_layout,
                plan,
                size,
                len(mbs),
                pad,
                statistics.median(lp[1:]),
                statistics.median(up[1:]),
                real,
            )
        )
    worker.shutdown()
    return rows


if __name__ == "__main__":
    main()
