"""Dev server throughput: batched vs one-at-a-time, and continuous vs dynamic batching.

    python bench/devserver_throughput.py [--model DIR] [--requests 8] [--new-tokens 64]

1. The same work (R requests of --new-tokens greedy tokens each) sent all at once, then one at
   a time: generated tokens/s of each and their ratio.
2. Multi-turn episodes that arrive and return at different times (tool calls in between), on a
   `--scheduler continuous` server and on a `--scheduler dynamic` one: tokens/s and the ratio.
Servers run on 127.0.0.1 and are stopped at the end. Default model: the tiny random Qwen3.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from agentrl.engine import EngineClient, EngineConfig, SamplingParams, launch_engines


@contextmanager
def devserver(model: str, threads: int, *args: str):
    """One dev server on loopback (agentrl.engine.fleet does the launch, health wait and stop)."""
    cfg = EngineConfig(extra_args=["--threads", str(threads), *args])
    with (
        tempfile.TemporaryDirectory() as logs,
        launch_engines(cfg, Path(model), Path(logs)) as urls,
    ):
        yield urls[0]


def prompt(i: int, n: int) -> list[int]:
    return [(1000 + 7919 * i + 31 * j) % 150000 for j in range(n)]


async def same_work(url: str, a: argparse.Namespace) -> dict[str, float]:
    """Best of --rounds: R requests at once, then the same R one at a time (tokens/s)."""
    params = SamplingParams(max_new_tokens=a.new_tokens, temperature=0, ignore_eos=True)
    prompts = [prompt(i, a.prompt_len) for i in range(a.requests)]
    best = {"batched": 0.0, "serial": 0.0}
    async with EngineClient([url]) as engine:
        await engine.generate(prompts[0], params)  # warm-up
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            comps = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
            rate = sum(len(c.token_ids) for c in comps) / (time.perf_counter() - t0)
            best["batched"] = max(best["batched"], rate)
            t0 = time.perf_counter()
            comps = [await engine.generate(p, params) for p in prompts]
            rate = sum(len(c.token_ids) for c in comps) / (time.perf_counter() - t0)
            best["serial"] = max(best["serial"], rate)
    return best


async def episodes(url: str, n: int, turns: int, seed: int = 0) -> float:
    """n multi-turn episodes, staggered starts and random tool latency: generated tokens/s."""
    rng = random.Random(seed)
    plan = [
        (rng.uniform(0, 0.3), [(rng.randint(16, 96), rng.uniform(0.0, 0.15)) for _ in range(turns)])
        for _ in range(n)
    ]

    async def episode(i: int, start: float, steps: list[tuple[int, float]]) -> int:
        await asyncio.sleep(start)
        ids, total = prompt(i, 32), 0
        for new, tool_s in steps:
            params = SamplingParams(max_new_tokens=new, temperature=0, ignore_eos=True)
            comp = await engine.generate(ids, params, key=f"ep{i}")
            total += len(comp.token_ids)
            ids = ids + comp.token_ids + prompt(i + 1, 12)  # the tool's observation
            await asyncio.sleep(tool_s)
        return total

    async with EngineClient([url]) as engine:
        await engine.generate(prompt(0, 8), SamplingParams(max_new_tokens=4))  # warm-up
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(episode(i, s, st) for i, (s, st) in enumerate(plan)))
        return sum(counts) / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None, help="HF model dir (default: tiny random Qwen3)")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="server torch threads")
    p.add_argument("--rounds", type=int, default=3, help="best of N (shared machines are noisy)")
    a = p.parse_args()
    if a.model is None:
        from agentrl.assets.build import cached_tiny_random

        a.model = str(cached_tiny_random())
    print(f"model: {Path(a.model).name}")
    results = {}
    for scheduler in ("continuous", "dynamic"):
        with devserver(a.model, a.threads, "--scheduler", scheduler) as url:
            if scheduler == "continuous":
                r = asyncio.run(same_work(url, a))
                print(
                    f"{a.requests} requests x {a.new_tokens} tokens, all at once: "
                    f"{r['batched']:8.1f} tok/s"
                )
                print(
                    f"{a.requests} requests x {a.new_tokens} tokens, one at a time: "
                    f"{r['serial']:8.1f} tok/s"
                )
                print(f"batched / one-at-a-time: {r['batched'] / r['serial']:.2f}x")
            results[scheduler] = max(
                asyncio.run(episodes(url, a.episodes, a.turns)) for _ in range(a.rounds)
            )
            print(
                f"{a.episodes} multi-turn episodes, --scheduler {scheduler}: "
                f"{results[scheduler]:8.1f} tok/s"
            )
    print(f"continuous / dynamic: {results['continuous'] / results['dynamic']:.2f}x")


if __name__ == "__main__":
    main()
