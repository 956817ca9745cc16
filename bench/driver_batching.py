"""The trainer process's batching alone: `micro_batches` over a GRPO step's worth of tokens (256
sequences × 655, as bench/train_step.py's 0.5B and 1.5B steps), by torch CPU threads, in a quiet
process. The reference for what the same call costs inside a training run (`bench/train_step.py
--cprofile FILE`): there it took 0.48 s a call with 16 threads on a busy H100 host, here 7-15 ms at
1, 4 or 16 threads, which is why the trainer process runs on `trainer.driver_threads=1`.

    python bench/driver_batching.py [--threads 16 4 1] [--seqs 256 --length 655]
"""

from __future__ import annotations

import argparse
import time

import torch

from agentrl.batch import LossNorm, TrainBatch, micro_batches


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--threads", type=int, nargs="+", default=[torch.get_num_threads(), 4, 1])
    p.add_argument("--seqs", type=int, default=256)
    p.add_argument("--length", type=int, default=655)
    p.add_argument("--max-tokens", type=int, default=32768)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    n = args.seqs * args.length
    batch = TrainBatch(
        token_ids=torch.randint(0, 151_000, (n,)),
        position_ids=torch.arange(args.length).repeat(args.seqs),
        loss_mask=torch.rand(n) > 0.2,
        old_logprobs=torch.randn(n),
        advantages=torch.randn(n),
        seq_ids=torch.arange(args.seqs).repeat_interleave(args.length),
        norm=LossNorm(num_tokens=n, num_seqs=args.seqs),
        source=list(range(args.seqs)),
    )
    print(f"{args.seqs} sequences x {args.length} tokens, micro-batches of {args.max_tokens}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            micro_batches(batch, 1, args.max_tokens, padded=True)
            times.append(time.perf_counter() - t0)
        print(f"threads {threads:>3}: micro_batches best {1e3 * min(times):.1f} ms, "
              f"worst {1e3 * max(times):.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
