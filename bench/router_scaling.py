"""Several engines behind the router vs one (issue 19, run 4): agentrl's multi-turn rollout of the
same episodes through one server, then through N servers behind SGLang's model gateway (smg,
consistent hashing on the episode: every turn of an episode reaches the server holding its
prefix), in the same run.

    python bench/router_scaling.py --engine sglang --model DIR --servers 2 --episodes 256
    python bench/router_scaling.py --engine dev --episodes 16 --new-tokens 32    # CPU smoke run

SGLang server i gets GPU i (engine.num_servers=N, placement local: agentrl.engine.fleet). Each side
renders the same prompts, samples with ignore_eos (every turn exactly --new-tokens // --turns
long; the env answers at once with a fixed tool message: envs/synthetic.py), flushes the servers'
prefix caches first and runs a short warm-up; best of --rounds. Prints, per server count: tokens/s,
the ratio against one server, the prefix-cache hit of first and later turns
(`rollout/prefix_cache_hit_*`: SGLang's cached_tokens / prompt tokens). Without smg installed (`pip install -e '.[router]'`) the client balances the
servers itself (engine.router=none) and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import shlex
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rollout_throughput import engine_config, make_rollout, make_tasks, resolve_model, run_rollout

from agentrl.engine import EngineClient, EngineConfig, launch_fleet, launch_router


async def measure(cfg: EngineConfig, urls: list[str], router: str | None, tokenizer: Any, a):
    turns, per_turn = a.turns, a.new_tokens // a.turns
    client = cfg.model_copy(update={"urls": urls, "timeout_s": 7200, "max_retries": 0})
    async with EngineClient.from_config(client, router=router) as engine:
        rollout = make_rollout(engine, tokenizer, a, turns, per_turn)
        warm = make_rollout(engine, tokenizer, a, turns, min(per_turn, 8))
        w_tasks, w_prompts = make_tasks(warm, a.episodes, a.prompt_tokens, "warm-up", a.seed + 1)
        await run_rollout(warm, w_tasks, w_prompts, min(per_turn, 8))
        tasks, prompts = make_tasks(rollout, a.episodes, a.prompt_tokens, "episode", a.seed)
        best = None
        for _ in range(a.rounds):
            if not all(await engine.control.flush_cache()):
                print("warning: /flush_cache refused; cached prefixes may flatter this round")
            tokens, wall = await run_rollout(rollout, tasks, prompts, per_turn)
            if best is None or wall < best[1]:
                best = (tokens, wall, dict(rollout.last_cache))
    assert best is not None
    tokens, wall, cache = best
    return {"servers": len(urls), "router": "smg" if router else "client", "tokens": tokens,
            "wall_s": wall, "tok_s": tokens / wall, **cache}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--engine", default="dev", choices=["dev", "sglang"])
    p.add_argument("--model", help="model dir (default for dev: the tiny random Qwen3)")
    p.add_argument("--servers", type=int, default=2, help="N: compared against one server")
    p.add_argument("--episodes", type=int, help="default 256 (sglang), 16 (dev)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=512, help="per episode, split in --turns")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=1, help="best of N per side")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="dev server torch threads")
    p.add_argument("--memory-saver", action="store_true", help="sglang: keep the memory saver")
    p.add_argument("--server-args", default="", help="more launch arguments (one string)")
    p.add_argument("--log-dir", help="keep the servers' and router's logs here")
    a = p.parse_args()
    a.url, a.episodes = None, a.episodes or (16 if a.engine == "dev" else 256)
    if a.new_tokens // a.turns < 1:
        raise SystemExit(f"--new-tokens {a.new_tokens} is less than one token per turn")
    from transformers import AutoTokenizer

    model = resolve_model(a, None)
    tokenizer = AutoTokenizer.from_pretrained(model)
    base = engine_config(a)
    if importlib.util.find_spec("smg") is None:
        print("smg is not installed: the client balances the servers (engine.router=none)")
    rows = []
    for n in sorted({1, a.servers}):
        cfg = base.model_copy(update={"num_servers": n, "base_port": 30000 + 10 * n})
        with ExitStack() as stack:
            logs = Path(a.log_dir or stack.enter_context(tempfile.TemporaryDirectory())) / f"n{n}"
            fleet = stack.enter_context(launch_fleet(cfg, Path(model), logs))
            router = stack.enter_context(launch_router(cfg, fleet.urls, logs))
            rows.append(asyncio.run(measure(cfg, fleet.urls, router, tokenizer, a)))
        print(f"{n} server(s): {rows[-1]['tok_s']:.0f} tok/s", flush=True)
    one = rows[0]["tok_s"]
    print(f"\nmodel {Path(model).name}, {a.episodes} episodes x {a.turns} turns x "
          f"{a.new_tokens // a.turns} tokens, prompt {a.prompt_tokens}, {a.engine} "
          f"{shlex.join(base.extra_args)}")  # fmt: skip
    print(f"{'servers':>7} {'via':>6} {'tok/s':>9} {'x one':>6} {'hit first':>9} {'hit later':>9}")
    for r in rows:
        print(f"{r['servers']:>7} {r['router']:>6} {r['tok_s']:>9.0f} {r['tok_s'] / one:>6.2f} "
              f"{r.get('prefix_cache_hit_first', float('nan')):>9.3f} "
              f"{r.get('prefix_cache_hit_later', float('nan')):>9.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
