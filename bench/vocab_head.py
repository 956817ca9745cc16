"""The learner's vocabulary head, forward + backward, on a Qwen2.5 head: per-token logprobs of the
chosen tokens (and, with --entropy, entropies under the loss) from bf16 hidden states.

    python bench/vocab_head.py [--tokens 16384 --hidden 1536 --vocab 151936 --entropy --reps 5]

Prints ms per call and the ratio against the reference measured in the same run: plain autograd
through [512, V] fp32 logits chunks, each checkpointed (recomputed in backward), which is what the
learner did before agentrl/learner/vocab_head.py. Kernels: vocab_head's torch and triton (CUDA).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from agentrl.learner.vocab_head import head_logprobs, triton_available


def checkpointed_chunks(h, w, tgt, with_entropy, chunk=512):
    def one(h, w, tgt):
        logits = F.linear(h, w).float()
        lse = torch.logsumexp(logits, dim=-1)
        lp = logits.gather(-1, tgt[:, None]).squeeze(-1) - lse
        ent = lse - (torch.softmax(logits, -1) * logits).sum(-1) if with_entropy else lse * 0
        return lp, ent

    outs = [
        checkpoint(one, h[c : c + chunk], w, tgt[c : c + chunk], use_reentrant=False)
        for c in range(0, h.shape[0], chunk)
    ]
    return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])


def timed(fn, h0, w0, tgt, a, b, reps: int, sync) -> tuple[float, float]:
    """Median seconds of forward + backward, and the peak memory (GiB) above the inputs."""
    times = []
    for i in range(reps + 1):
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        if h0.is_cuda:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        sync()
        t0 = time.perf_counter()
        lp, ent = fn(h, w, tgt)
        loss = (lp * a).sum() + ((ent * b).sum() if ent is not None else 0)
        loss.backward()
        sync()
        if i:  # the first call warms up (kernel compiles, allocator)
            times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30 if h0.is_cuda else float("nan")
    return sorted(times)[len(times) // 2], peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--hidden", type=int, default=1536)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--entropy", action="store_true", help="an entropy term in the loss too")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    dev, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    g = torch.Generator(device=dev).manual_seed(0)
    h0 = torch.randn(args.tokens, args.hidden, device=dev, generator=g).to(dtype)
    w0 = (torch.randn(args.vocab, args.hidden, device=dev, generator=g) * 0.05).to(dtype)
    tgt = torch.randint(0, args.vocab, (args.tokens,), device=dev, generator=g)
    a = torch.randn(args.tokens, device=dev, generator=g)
    b = torch.randn(args.tokens, device=dev, generator=g)
    ent = args.entropy

    candidates = {
        "checkpointed chunks (reference)": lambda h, w, t: checkpointed_chunks(h, w, t, ent)
    }
    kernels = ["torch"] + (["triton"] if triton_available() else [])
    for k in kernels:
        candidates[f"vocab_head {k}"] = lambda h, w, t, k=k: head_logprobs(
            h, w, t, with_entropy=ent, kernel=k
        )
    # the matmuls alone (logits forward, recompute, two gradient matmuls): the floor
    flops = 4 * 2 * args.tokens * args.hidden * args.vocab
    print(f"{args.tokens} tokens x ({args.hidden} -> {args.vocab}) {dtype}, entropy term: {ent}; "
          f"{dev}; matmul work {flops / 1e12:.2f} TFLOP")  # fmt: skip
    ref = None
    for name, fn in candidates.items():
        s, peak = timed(fn, h0, w0, tgt, a, b, args.reps, sync)
        ref = ref or s
        print(f"  {name:<34} {1e3 * s:8.1f} ms  {flops / s / 1e12:6.0f} TFLOP/s  "
              f"peak +{peak:5.2f} GiB  {ref / s:5.2f}x the reference")  # fmt: skip


if __name__ == "__main__":
    main()
