"""What the router (smg) adds per request: the same /generate calls to one dev server, sent
straight to it and through SGLang's model gateway in front of it, in the same run.

    python bench/router_overhead.py [--requests 256] [--concurrency 32] [--new-tokens 1]

Starts one dev server (the shipped tiny model) and smg (consistent hashing, as a run starts it)
on loopback, warms both paths, then times --requests /generate calls of --new-tokens tokens with
--concurrency in flight, direct and routed (best of --rounds). Prints ms per request of each, the
difference (the router's own cost per request) and the ratio routed / direct. Needs the `router`
extra (`pip install -e '.[router]'`).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from agentrl.engine import EngineClient, EngineConfig, SamplingParams, launch_engines, launch_router

TINY = Path(__file__).resolve().parents[1] / "agentrl" / "assets" / "tiny"


async def timed(url: str, router: str | None, a) -> float:
    """Best ms per request over the rounds."""
    params = SamplingParams(max_new_tokens=a.new_tokens, temperature=1.0, ignore_eos=True)
    async with EngineClient([url], router=router, max_connections=4096) as engine:
        sem = asyncio.Semaphore(a.concurrency)

        async def one(i: int) -> None:
            async with sem:
                await engine.generate([100 + i % 50, 7, 8, 9], params, key=f"episode-{i % 64}")

        await asyncio.gather(*(one(i) for i in range(a.concurrency * 2)))  # warm
        best = float("inf")
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(a.requests)))
            best = min(best, (time.perf_counter() - t0) / a.requests * 1e3)
        return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    cfg = EngineConfig(router="smg")
    with ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        urls = stack.enter_context(launch_engines(cfg, TINY, logs))
        router = stack.enter_context(launch_router(cfg, urls, logs))
        direct = asyncio.run(timed(urls[0], None, a))
        routed = asyncio.run(timed(urls[0], router, a))
    print(f"{a.requests} /generate calls of {a.new_tokens} token(s), {a.concurrency} in flight, "
          f"one dev server, best of {a.rounds}")  # fmt: skip
    print(f"direct   {direct:7.3f} ms/request")
    print(f"routed   {routed:7.3f} ms/request (smg, consistent hashing)")
    print(
        f"router cost {routed - direct:+.3f} ms/request; ratio routed / direct {routed / direct:.2f}"
    )


if __name__ == "__main__":
    main()
