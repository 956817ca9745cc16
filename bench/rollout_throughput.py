"""Rollout throughput (issue 6): generated tokens/s of agentrl's multi-turn rollout
(`agentrl.rollout.Rollout` through `agentrl.engine.EngineClient`) against the engine's own batched
generation of the same prompts and lengths, on the same server, in the same run.

    python bench/rollout_throughput.py --url http://127.0.0.1:30000 --model DIR   # running SGLang
    python bench/rollout_throughput.py --engine sglang --model DIR [--mode both] [--episodes 256]
    python bench/rollout_throughput.py --engine dev --episodes 16 --new-tokens 32 --prompt-tokens 32

Modes (--mode single|multi|both):
- single: one assistant turn of --new-tokens tokens per episode.
- multi: --turns K assistant turns of --new-tokens // K tokens each; after every turn but the last
  a zero-latency env (envs/synthetic.py) answers with a fixed tool message (no sandbox, no parsing).
  With --tool-latency-ms M the multi-mode rollout also runs with each tool answer after a
  lognormal wait (median M ms, log-space spread --tool-latency-sigma: 1.0 puts p99 at 10x the
  median), the way real tools answer; its tokens/s is printed against the zero-latency rollout's.

Both sides sample with ignore_eos, so every turn is exactly its max_new_tokens long, and both use
the same prompt ids: the ids the Rollout renders from each episode's user message (distinct per
episode, --prompt-tokens long, chat template included). The reference sends them all in ONE raw
SGLang `/generate` request (a batch of input_ids, return_logprob on, as the rollout asks for;
--reference concurrent sends one request per prompt at once instead). In multi mode the reference
generates each episode's K x per-turn tokens in one request from the first prompt, so the ratio
includes the whole cost of the turn boundaries (re-prefill of observations, one request per turn,
rendering, client overhead); multi mode also times a bare multi-turn client (raw /generate per
turn, the same observation ids appended, no env or rendering), which splits the gap into what
the server's turn boundaries cost and what agentrl's client adds. The prefix cache is flushed
before every measured run; a warm-up
round of short runs on other prompts comes first. Prints, per mode: episodes, turns, generated
tokens, wall s and tok/s of each side, and the ratio rollout/reference; --json writes them too.
--coalesce W:M:C,... times the coalesced rollout once per variant (window ms, max wait ms, members
answered per loop iteration); the server's max_running_requests is printed beside the episodes in
flight (over-subscription: more episodes than its decode batch holds).
--engine launches the server through agentrl.engine.fleet.launch_engines (loopback, stopped at the
end): sglang with configs/engine/sglang.yaml's arguments minus --enable-memory-saver (keep it
with --memory-saver), CUDA graphs on; dev (CPU) serves the tiny random Qwen3 by default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import tempfile
import time
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson

from agentrl.collector import settle
from agentrl.engine import (
    EngineClient,
    EngineConfig,
    SamplingParams,
    default_api_key,
    launch_engines,
    parse_generate_response,
)
from agentrl.engine.checks import max_running
from agentrl.engine.coalesce import SETTLE_CHUNK
from agentrl.envs.synthetic import FixedLengthEnv
from agentrl.metrics import rollout_metrics
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.types import Message, StopReason, Task

WORDS = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "tree", "house", "water",
         "light", "green", "blue", "red"]  # fmt: skip


def make_tasks(rollout: Rollout, n: int, prompt_tokens: int, tag: str, seed: int):
    """n distinct user messages whose rendered prompts are exactly prompt_tokens long, and those
    prompt ids (rendered by the Rollout's own renderer, so both sides send the same ids)."""
    r, rng = rollout.renderer, random.Random(seed)
    words = [w for w in WORDS if len(r.encode(" " + w)) == 1]  # one token each, additive
    tasks, prompts = [], []
    for i in range(n):
        head = f"{tag} {i}:"
        need = prompt_tokens - len(r.prompt_ids([Message(role="user", content=head)]))
        if need < 0:
            raise SystemExit(f"--prompt-tokens {prompt_tokens} is shorter than the chat template "
                             f"around the episode header ({prompt_tokens - need} tokens)")  # fmt: skip
        text = head + "".join(" " + w for w in rng.choices(words, k=need))
        ids = r.prompt_ids([Message(role="user", content=text)])
        assert len(ids) == prompt_tokens, (len(ids), prompt_tokens)
        tasks.append(Task(id=f"{tag}-{i}", data={"prompt": text}))
        prompts.append(ids)
    return tasks, prompts


def make_rollout(
    engine: EngineClient, tokenizer: Any, a, turns: int, per_turn: int, latency: bool = False
) -> Rollout:
    cfg = RolloutConfig(
        group_size=1,
        max_turns=turns,
        max_new_tokens=per_turn,
        max_context_tokens=a.prompt_tokens + turns * (per_turn + 64) + 64,
        episode_timeout_s=7200,
        temperature=a.temperature,
        ignore_eos=True,
    )
    env: dict[str, Any] = {"turns": turns}
    if latency:  # each tool answer after a lognormal wait (envs/synthetic.py)
        env.update(tool_latency_ms=a.tool_latency_ms, tool_latency_sigma=a.tool_latency_sigma)
    return Rollout(engine, tokenizer, FixedLengthEnv, cfg, env_kwargs=env)


async def run_rollout(rollout: Rollout, tasks: list[Task], prompts, per_turn: int):
    """(generated tokens, wall s) of the rollout; checks every turn had exactly per_turn ids."""
    t0 = time.perf_counter()
    groups = await rollout.run(tasks)
    wall = time.perf_counter() - t0
    turns = rollout.cfg.max_turns
    for (traj,), ids in zip(groups, prompts, strict=True):
        lengths = [t.end - t.start for t in traj.turns]
        if traj.stop_reason is not StopReason.COMPLETED or lengths != [per_turn] * turns:
            raise SystemExit(f"episode {traj.task_id}: {traj.stop_reason} ({traj.error}), turn "
                             f"lengths {lengths}, expected {turns} x {per_turn}")  # fmt: skip
        assert traj.token_ids[: traj.prompt_len] == ids
    m = rollout_metrics([t for g in groups for t in g])
    rollout.last_cache = {k.removeprefix("rollout/"): m[k] for k in m if "prefix_cache" in k}
    return len(tasks) * turns * per_turn, wall


async def post_generate(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    """One raw SGLang /generate, its JSON answer; exits on an HTTP error."""
    async with http.post(url + "/generate", json=body) as r:
        if r.status != 200:
            raise SystemExit(f"{url}/generate: HTTP {r.status}: {(await r.text())[:500]}")
        return orjson.loads(await r.read())


async def run_reference(http: aiohttp.ClientSession, url: str, prompts, new_tokens: int, a):
    """(generated tokens, wall s) of raw /generate: one batched request, or one per prompt."""
    sp = SamplingParams(
        max_new_tokens=new_tokens, temperature=a.temperature, ignore_eos=True
    ).to_sglang()

    async def post(body: dict[str, Any]) -> Any:
        return await post_generate(
            http, url, body | {"sampling_params": sp, "return_logprob": True}
        )

    t0 = time.perf_counter()
    if a.reference == "batch":
        outs = await post({"input_ids": prompts})
    else:
        outs = await asyncio.gather(*(post({"input_ids": p}) for p in prompts))
    wall = time.perf_counter() - t0
    comps = [parse_generate_response(o, url) for o in outs]
    lengths = {len(c.token_ids) for c in comps}
    if len(comps) != len(prompts) or lengths != {new_tokens}:
        raise SystemExit(f"reference: {len(comps)} completions of lengths {sorted(lengths)}, "
                         f"expected {len(prompts)} x {new_tokens}")  # fmt: skip
    return len(prompts) * new_tokens, wall


async def run_bare_turns(http: aiohttp.ClientSession, url: str, prompts, obs: list[int], a,
                         turns: int, per_turn: int, style: str = "plain"):  # fmt: skip
    """(generated tokens, wall s) of a bare multi-turn client: every episode at once, `turns`
    raw /generate requests each, the next prompt = ids so far + sampled ids + `obs` (the same
    observation ids the rollout appends). SGLang's own cost of turn boundaries, without
    agentrl's (no env, no rendering, no parsing). Styles:
    - plain: one request per episode and turn, the whole context each time (radix cache reuse);
    - batched: each turn of all episodes as ONE batched request (no per-request HTTP cost: the
      bound of client-side coalescing; the turn boundary is then only the server's scheduling);
    - session: a streaming SGLang session per episode (/open_session streaming=true, server
      started with --enable-streaming-session): each later turn sends only the observation
      ids and continues on the KV the session slot held (no radix match, no re-admission of
      the prefix)."""
    sp = SamplingParams(max_new_tokens=per_turn, temperature=a.temperature, ignore_eos=True)
    body = {"sampling_params": sp.to_sglang(), "return_logprob": True}

    async def episode(ids: list[int]) -> int:
        n = 0
        for k in range(turns):
            out = (await post_generate(http, url, body | {"input_ids": ids}))["output_ids"]
            n += len(out)
            ids = ids + out + (obs if k < turns - 1 else [])
        return n

    async def session_episode(ids: list[int]) -> int:
        async with http.post(url + "/open_session",
                             json={"capacity_of_str_len": 1 << 20, "streaming": True}) as r:  # fmt: skip
            if r.status != 200:
                raise SystemExit(f"/open_session: HTTP {r.status}: {(await r.text())[:300]} "
                                 "(start the server with --enable-streaming-session)")  # fmt: skip
            sid = orjson.loads(await r.read())
        n, send = 0, ids
        try:
            for _ in range(turns):
                req = body | {"input_ids": send, "session_params": {"id": sid}}
                out = (await post_generate(http, url, req))["output_ids"]
                n += len(out)
                send = obs
        finally:
            async with http.post(url + "/close_session", json={"session_id": sid}) as r:
                await r.read()
        return n

    async def batched() -> list[int]:
        ids, counts = [list(p) for p in prompts], [0] * len(prompts)
        for k in range(turns):
            outs = await post_generate(http, url, body | {"input_ids": ids})
            for i, o in enumerate(outs):
                counts[i] += len(o["output_ids"])
                ids[i] = ids[i] + o["output_ids"] + (obs if k < turns - 1 else [])
        return counts

    t0 = time.perf_counter()
    if style == "batched":
        counts = await batched()
    else:
        one = session_episode if style == "session" else episode
        counts = await asyncio.gather(*(one(list(p)) for p in prompts))
    wall = time.perf_counter() - t0
    if set(counts) != {turns * per_turn}:
        raise SystemExit(
            f"bare turns ({style}): generated {sorted(set(counts))}, expected {turns * per_turn}"
        )
    return sum(counts), wall


async def flush(engine: EngineClient) -> None:
    """Empty the prefix cache, so the side measured second does not find the prompts cached."""
    if not all(await engine.control.flush_cache()):
        print("warning: /flush_cache refused; the second side may hit cached prompt prefixes")


async def measure(url: str, tokenizer: Any, a, mode: str) -> dict[str, Any]:
    turns = 1 if mode == "single" else a.turns
    per_turn = a.new_tokens // turns
    if per_turn < 1:
        raise SystemExit(f"--new-tokens {a.new_tokens} is less than one token per turn ({turns})")
    timeout = aiohttp.ClientTimeout(total=7200, sock_connect=10)
    async with (
        AsyncExitStack() as stack,
        EngineClient([url], timeout_s=7200, max_retries=0, max_connections=4096) as engine,
        aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0),
                              headers={"Authorization": f"Bearer {default_api_key()}"}) as http,
    ):  # fmt: skip
        rollout = make_rollout(engine, tokenizer, a, turns, per_turn)
        coalesced = {}  # variant name -> (its client's coalescer, its rollout)
        for name, (window, wait, chunk) in coalesce_variants(a).items():
            client = await stack.enter_async_context(EngineClient(
                [url], timeout_s=7200, max_retries=0, max_connections=4096,
                batch_window_ms=window, batch_max_wait_ms=wait))  # fmt: skip
            client.gen.coalescer.settle_chunk = chunk
            coalesced[name] = (client.gen.coalescer, make_rollout(client, tokenizer, a, turns,
                                                                  per_turn))  # fmt: skip
        slow = make_rollout(engine, tokenizer, a, turns, per_turn, latency=True)
        warm = make_rollout(engine, tokenizer, a, turns, min(per_turn, 8))
        w_tasks, w_prompts = make_tasks(warm, a.episodes, a.prompt_tokens, "warm-up", a.seed + 1)
        await run_reference(http, url, w_prompts, turns * min(per_turn, 8), a)
        await run_rollout(warm, w_tasks, w_prompts, min(per_turn, 8))
        tasks, prompts = make_tasks(rollout, a.episodes, a.prompt_tokens, "episode", a.seed)
        obs = rollout.renderer.observation_ids([FixedLengthEnv.observation_message()], [0])
        max_running = await server_max_running(http, url)
        ref, ro, bare, lat = [], [], [], []
        co: dict[str, list] = {name: [] for name in coalesced}
        co_size: dict[str, float] = {}
        variants: dict[str, list] = {v: [] for v in a.bare_variants.split(",") if v}
        for _ in range(a.rounds):
            await flush(engine)
            ref.append(await run_reference(http, url, prompts, turns * per_turn, a))
            await flush(engine)
            ro.append(await run_rollout(rollout, tasks, prompts, per_turn))
            for name, (cz, co_rollout) in coalesced.items():
                await flush(engine)
                n0, c0 = cz.batches_sent, cz.batched_calls
                co[name].append(await run_rollout(co_rollout, tasks, prompts, per_turn))
                co_size[name] = (cz.batched_calls - c0) / max(cz.batches_sent - n0, 1)
            if turns > 1 and a.tool_latency_ms > 0:
                await flush(engine)
                lat.append(await run_rollout(slow, tasks, prompts, per_turn))
            if turns > 1:
                await flush(engine)
                bare.append(await run_bare_turns(http, url, prompts, obs, a, turns, per_turn))
                for style, runs in variants.items():
                    await flush(engine)
                    runs.append(await run_bare_turns(http, url, prompts, obs, a, turns, per_turn,
                                                     style))  # fmt: skip
    (tokens, ref_s), (_, ro_s) = min(ref, key=lambda x: x[1]), min(ro, key=lambda x: x[1])
    bare_s = min(b[1] for b in bare) if bare else None
    return {
        "mode": mode,
        "episodes": a.episodes,
        "turns": turns,
        "tokens_per_turn": per_turn,
        "tokens": tokens,
        "rollout_s": ro_s,
        "reference_s": ref_s,
        "rollout_tok_s": tokens / ro_s,
        "reference_tok_s": tokens / ref_s,
        "ratio": ref_s / ro_s,
        "bare_turns_s": bare_s,  # multi: bare multi-turn client, same server and turns
        # multi with --tool-latency-ms: the rollout with lognormal tool waits, best wall s
        "tool_latency_s": min(x[1] for x in lat) if lat else None,
        "tool_latency_ms": a.tool_latency_ms,
        "tool_latency_sigma": a.tool_latency_sigma,
        # the same rollout with concurrent turns coalesced (engine.batch_window_ms), per
        # variant "window:max_wait:settle_chunk": best wall s, calls per batched request
        "coalesced": {
            k: {"s": min(x[1] for x in v), "turns_per_request": co_size[k]}
            for k, v in co.items()
            if v
        },
        "server_max_running_requests": max_running,
        # multi: the bare client's other styles (--bare-variants), best wall s of each
        "bare_variants_s": {k: min(x[1] for x in v) for k, v in variants.items() if v},
        # cached / prompt tokens per turn, of the rollout's last round (SGLang's cached_tokens)
        **getattr(rollout, "last_cache", {}),
    }


def coalesce_variants(a) -> dict[str, tuple[float, float, int]]:
    """--coalesce "W:M[:C],..." (and --batch-window-ms W with --batch-max-wait-ms M): each
    variant's window ms, max wait ms and settle chunk (members answered per loop iteration)."""
    specs = [s for s in a.coalesce.split(",") if s.strip()]
    if a.batch_window_ms > 0:
        specs.insert(0, f"{a.batch_window_ms:g}:{a.batch_max_wait_ms:g}")
    out = {}
    for spec in specs:
        parts = spec.strip().split(":")
        try:
            w, m = float(parts[0]), float(parts[1])
            c = int(parts[2]) if len(parts) > 2 else SETTLE_CHUNK
        except (IndexError, ValueError):
            raise SystemExit(f"--coalesce {spec!r}: want WINDOW_MS:MAX_WAIT_MS[:CHUNK]") from None
        if w <= 0 or m <= 0 or c < 1 or len(parts) > 3:
            raise SystemExit(f"--coalesce {spec!r}: window and wait > 0, chunk >= 1")
        out[f"{w:g}:{m:g}:{c}"] = (w, m, c)
    return out


async def server_max_running(http: aiohttp.ClientSession, url: str) -> int | None:
    """The server's max_running_requests (SGLang's /get_server_info), None where not told:
    how many episodes its decode batch holds, against how many the bench keeps in flight."""
    for route in ("/server_info", "/get_server_info"):
        async with http.get(url + route) as r:
            if r.status == 200:
                return max_running(orjson.loads(await r.read()))
    return None


def engine_config(a) -> EngineConfig:
    """configs/engine/<kind>.yaml, standalone: no colocation, CUDA graphs on, no memory saver."""
    import yaml  # the yaml alone, not Hydra: GPU hosts may lack it

    path = Path(__file__).resolve().parents[1] / "configs" / "engine" / f"{a.engine}.yaml"
    cfg = EngineConfig(**(yaml.safe_load(path.read_text()) or {}))
    drop = {"--disable-cuda-graph"} | (set() if a.memory_saver else {"--enable-memory-saver"})
    extra = [x for x in cfg.extra_args if x not in drop]
    if a.engine == "dev":
        extra += ["--threads", str(a.threads)]
    extra += shlex.split(a.server_args)
    return cfg.model_copy(update={"colocate": False, "extra_args": extra, "urls": []})


def resolve_model(a, url: str | None) -> str:
    if a.model:
        return a.model
    if a.engine == "dev" and not url:
        from agentrl.assets.build import cached_tiny_random

        return str(cached_tiny_random())
    if url:  # the server's own tokenizer, when it lives on this host
        auth = {"Authorization": f"Bearer {default_api_key()}"}  # $AGENTRL_ENGINE_API_KEY
        info = httpx.get(url + "/model_info", timeout=10, headers=auth)
        if info.status_code == 404:
            info = httpx.get(url + "/get_model_info", timeout=10, headers=auth)
        data = info.json() if info.status_code == 200 else {}
        path = data.get("tokenizer_path") or data.get("model_path")
        if path and Path(path).is_dir():
            return path
    raise SystemExit("pass --model DIR: the served model (or a dir with its tokenizer)")


def fast_paths(tokenizer: Any) -> str:
    """Whether the client's fast paths (agentrl/fastpath.py) are on with this transformers: the
    rollout's client work per turn depends on it, so every figure says which it had."""
    import transformers

    from agentrl.fastpath import ChatTemplate, Codec

    t, c = ChatTemplate(tokenizer, None, {}), Codec(tokenizer)
    on = {"template": t.direct, "encode": c.backend is not None, "decode": c.decoder is not None}
    return (f"client fast paths (transformers {transformers.__version__}): "
            + ", ".join(f"{k} {'on' if v else 'OFF'}" for k, v in on.items()))  # fmt: skip


def report(rows: list[dict[str, Any]], header: str) -> None:
    print(header)
    print(f"{'mode':<7} {'episodes':>8} {'turns':>5} {'tokens':>8} {'rollout s':>10} "
          f"{'rollout tok/s':>13} {'ref s':>8} {'ref tok/s':>10} {'ratio':>6}")  # fmt: skip
    for r in rows:
        print(f"{r['mode']:<7} {r['episodes']:>8} {r['turns']:>5} {r['tokens']:>8} "
              f"{r['rollout_s']:>10.2f} {r['rollout_tok_s']:>13.1f} {r['reference_s']:>8.2f} "
              f"{r['reference_tok_s']:>10.1f} {r['ratio']:>6.2f}")  # fmt: skip
    for r in rows:
        print(f"ratio rollout/reference ({r['mode']}, {r['turns']} x {r['tokens_per_turn']} "
              f"tokens): {r['ratio']:.2f}")  # fmt: skip
        if "prefix_cache_hit" in r:
            print(f"  prefix cache hit (cached / prompt tokens): all turns "
                  f"{r['prefix_cache_hit']:.3f}, first turns {r['prefix_cache_hit_first']:.3f}, "
                  f"later turns {r['prefix_cache_hit_later']:.3f}")  # fmt: skip
        if r.get("server_max_running_requests"):
            print(f"  server max_running_requests {r['server_max_running_requests']}, "
                  f"{r['episodes']} episodes in flight")  # fmt: skip
        for name, co in (r.get("coalesced") or {}).items():
            c = co["s"]
            w, m, k = name.split(":")
            print(f"  rollout coalesced (window {w} ms, max wait {m} ms, answered {k} at a "
                  f"time): {c:.2f} s, {r['tokens'] / c:.1f} tok/s, ratio to reference "
                  f"{r['reference_s'] / c:.2f}, {co['turns_per_request']:.1f} turns per "
                  "request")  # fmt: skip
        if r.get("tool_latency_s"):
            t = r["tool_latency_s"]
            print(f"  rollout with tool latency (lognormal, median {r['tool_latency_ms']:g} ms, "
                  f"sigma {r['tool_latency_sigma']:g}): {t:.2f} s, {r['tokens'] / t:.1f} tok/s; "
                  f"against zero latency {r['rollout_s'] / t:.2f}")  # fmt: skip
        bare = {"plain (raw /generate per turn, no env or rendering)": r.get("bare_turns_s")}
        for style, b in {**bare, **(r.get("bare_variants_s") or {})}.items():
            if b:
                print(f"  bare multi-turn client, {style}: {b:.2f} s, {r['tokens'] / b:.1f} "
                      f"tok/s, ratio to reference {r['reference_s'] / b:.2f}; rollout / bare "
                      f"{b / r['rollout_s']:.2f}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="benchmark this running server (nothing is launched)")
    p.add_argument("--engine", default="dev", choices=["dev", "sglang"], help="else launch one")
    p.add_argument("--model", help="model dir (default: tiny random Qwen3 for dev; for --url "
                   "the server's /model_info path if it is a local dir)")  # fmt: skip
    p.add_argument("--mode", default="both", choices=["single", "multi", "both"])
    p.add_argument("--episodes", type=int, help="default 256 (sglang, --url), 16 (dev)")
    p.add_argument("--prompt-tokens", type=int, default=128, help="rendered prompt length")
    p.add_argument("--new-tokens", type=int, default=512, help="per episode; multi: split in K")
    p.add_argument("--turns", type=int, default=4, help="K, assistant turns in multi mode")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--reference", default="batch", choices=["batch", "concurrent"],
                   help="one /generate with all prompts, or one request per prompt at once")  # fmt: skip
    p.add_argument("--rounds", type=int, default=1, help="best of N per side")
    p.add_argument("--runs", type=int, default=1, help="whole bench runs on the one server")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="dev server torch threads")
    p.add_argument("--memory-saver", action="store_true", help="sglang: keep the memory saver")
    p.add_argument("--server-args", default="", help="more launch arguments (one string)")
    p.add_argument(
        "--batch-window-ms",
        type=float,
        default=0.0,
        help="also time the rollout with engine.batch_window_ms=this (coalesced turns)",
    )
    p.add_argument("--batch-max-wait-ms", type=float, default=50.0,
                   help="engine.batch_max_wait_ms for the coalesced rollout")  # fmt: skip
    p.add_argument("--coalesce", default="", help="also time the rollout coalesced with each "
                   "WINDOW_MS:MAX_WAIT_MS[:CHUNK] variant (CHUNK: members answered per event-loop "
                   f"iteration, default {SETTLE_CHUNK}), comma-separated")  # fmt: skip
    p.add_argument(
        "--bare-variants",
        default="",
        help="multi: also time the bare client as batched (one request per turn of all "
        "episodes) and/or session (SGLang streaming sessions; needs --server-args "
        "--enable-streaming-session), comma-separated",
    )
    p.add_argument("--tool-latency-ms", type=float, default=0.0,
                   help="multi: also time the rollout with tool answers after lognormal waits "
                   "of this median (ms)")  # fmt: skip
    p.add_argument("--tool-latency-sigma", type=float, default=1.0,
                   help="the waits' log-space spread (1.0: p99 = 10x the median)")  # fmt: skip
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--log-dir", help="keep the launched server's log here (default: a temp dir)")
    a = p.parse_args()
    if a.episodes is None:
        a.episodes = 16 if a.engine == "dev" and not a.url else 256
    from transformers import AutoTokenizer

    modes = ["single", "multi"] if a.mode == "both" else [a.mode]
    with ExitStack() as stack:
        url = a.url.rstrip("/") if a.url else None
        model = resolve_model(a, url)
        if url is None:
            logs = Path(a.log_dir or stack.enter_context(tempfile.TemporaryDirectory()))
            logs.mkdir(parents=True, exist_ok=True)
            url = stack.enter_context(launch_engines(engine_config(a), Path(model), logs))[0]
        tokenizer = AutoTokenizer.from_pretrained(model)
        print(fast_paths(tokenizer))
        # the collector as a training run's process sets it (agentrl/train.py): the set-up's
        # objects (transformers, torch: ~300k) out of its full passes, the young ones spaced
        settle()
        server = "external" if a.url else a.engine
        runs = []
        for run in range(a.runs):  # one server, --runs runs of the whole bench
            rows = [asyncio.run(measure(url, tokenizer, a, m)) for m in modes]
            report(rows, f"run {run + 1} of {a.runs}: server {url} ({server}), model "
                         f"{Path(model).name}, prompt {a.prompt_tokens} tokens, temperature "
                         f"{a.temperature:g}, reference {a.reference}, best of {a.rounds}")  # fmt: skip
            runs.append(rows)
    if a.runs > 1:
        for i, m in enumerate(modes):
            print(f"ratio rollout/reference ({m}), {a.runs} runs: "
                  + ", ".join(f"{rows[i]['ratio']:.2f}" for rows in runs))  # fmt: skip
    if a.json:
        out = {"server": server, "url": url, "model": model, "args": vars(a), "results": runs[-1],
               "runs": runs}  # fmt: skip
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
