"""Learner step time against the packed micro-batch size: one FSDP2 rank (gloo, in this process),
the same GRPO batch (episodes of random ids, of one length or, with --spread, of lengths drawn
uniformly in length ± spread) packed into rows of at most N tokens. A packed row's attention mask
is dense, so its cost grows with the square of its length.

    python bench/learner_microbatch.py [--model builtin:tiny] [--episodes 64 --length 130] \
        [--sizes 512 4096] [--repeats 3]
    python bench/learner_microbatch.py --length 400 --spread 300 --layouts padded --sizes 4096

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

import torch


def make_batch(episodes: int, length: int, vocab: int, spread: int = 0):
    from agentrl.batch import TrainBatch, global_norm

    g = torch.Generator().manual_seed(0)
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
    a = p.parse_args()

    from agentrl.config import ModelConfig
    from agentrl.learner import LearnerConfig

    model = str(ModelConfig(path=a.model).resolve())
    cfg = LearnerConfig(model_path=model, device="cpu", lr=1e-4, threads_per_worker=a.threads)
    rows = []
    for layout in a.layouts:
        cfg = cfg.model_copy(update={"attention_layout": layout})
        rows += measure(cfg, a)
    print(f"{a.episodes} episodes x {a.length} ± {a.spread} tokens, {model}, {a.threads} thread(s)")
    print(f"{'layout':>7} {'plan':>6} {'max tokens':>10} {'micro-batches':>13} {'padded/real':>11} "
          f"{'logprobs s':>10} {'update s':>9} {'ratio':>6}")  # fmt: skip
    for layout, plan, size, n, pad, lp_s, up_s in rows:
        print(f"{layout:>7} {plan:>6} {size:>10} {n:>13} {pad:>11.2f} {lp_s:>10.2f} "
              f"{up_s:>9.2f} {up_s / rows[0][-1]:>6.2f}")  # fmt: skip


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
    batch = make_batch(a.episodes, a.length, vocab, a.spread)
    lens = batch.seq_lens
    rows = []
    plans = a.plans if cfg.attention_layout == "padded" else ["mixed"]
    for plan, size in [(p, s) for p in plans for s in a.sizes]:
        runs = plan == "runs"
        mbs = micro_batches(batch, 1, size, padded=runs)[0]
        pad = padded_tokens(plan_micro_batches(lens, 1, size, runs), lens) / sum(lens)
        lp, up = [], []
        for _ in range(a.repeats + 1):  # the first round warms up
            t0 = time.perf_counter()
            worker.compute_logprobs(mbs)
            t1 = time.perf_counter()
            worker.train_step(mbs, "ppo_clip", LossConfig(name="ppo_clip"))
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
            )
        )
    worker.shutdown()
    return rows


if __name__ == "__main__":
    main()
