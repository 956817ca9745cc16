"""The rollout client's own CPU work, without any model.

    python bench/rollout_overhead.py [--prompt-words 128] [--new-tokens 128] [--repeats 200]
    python bench/rollout_overhead.py --http [--episodes 256] [--turns 4] [--group-size 8] [--gc-freeze]

Default: per assistant turn, render the prompt, decode the sampled ids, parse tool calls, render
the observation delta (agentrl.render, agentrl.parsers), against the reference of one plain
`tokenizer.encode` of the same prompt text. Prints milliseconds per call of each part, their sum
per turn, and the ratio turn / encode; and the sum per turn with the fast paths off
(`Renderer(fast=False)`: transformers' own apply_chat_template, encode, decode), as a ratio.

--http: the whole client per request, HTTP included. A loopback server in this process answers
every /generate at once with a canned SGLang body (--new-tokens ids with logprobs), so all time
is client time. Measures agentrl's Rollout (EngineClient + envs/synthetic.FixedLengthEnv,
--episodes x --turns, all in flight together), and two references on the same server and
concurrency: bare aiohttp posts of the same body (the floor), and bare httpx posts (the client
agentrl used before). Prints ms per request of each and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time


def per_call(fn, repeats: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats * 1e3


def canned_body(new_tokens: int) -> bytes:
    rng = random.Random(0)
    ids = [rng.randint(1000, 150000) for _ in range(new_tokens)]
    meta = {
        "finish_reason": {"type": "length", "length": new_tokens},
        "prompt_tokens": 100,
        "weight_version": "0",
        "output_token_logprobs": [[-rng.random() * 5, t, None] for t in ids],
    }
    return json.dumps({"output_ids": ids, "meta_info": meta}).encode()


async def instant_server(body: bytes, delay_s: float = 0.0) -> asyncio.Server:
    """HTTP/1.1 keep-alive server on 127.0.0.1 answering every request with `body` (a batched
    request, input_ids a list of lists, with a list of as many), `delay_s` after it arrived."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    answer = head % len(body) + body

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
                n = next(
                    int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length:")
                )
                request = await reader.readexactly(n)
                if delay_s:
                    await asyncio.sleep(delay_s)
                if request.startswith(b'{"input_ids":[[') or request.startswith(
                    b'{"input_ids": [['
                ):
                    many = b"[" + b",".join([body] * len(json.loads(request)["input_ids"])) + b"]"
                    writer.write(head % len(many) + many)
                else:
                    writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)


def fixed_length_rollouts(a):
    """(make, tasks): `make(engine)` is agentrl's Rollout of envs/synthetic.FixedLengthEnv with
    --turns turns of --new-tokens ids, and `tasks` its --episodes tasks of --prompt-words words."""
    from transformers import AutoTokenizer

    from agentrl.assets.build import cached_tokenizer
    from agentrl.envs.synthetic import FixedLengthEnv
    from agentrl.rollout import Rollout, RolloutConfig

    tok = AutoTokenizer.from_pretrained(cached_tokenizer("qwen"))
    group = a.group_size
    if a.episodes % group:
        raise SystemExit(f"--episodes {a.episodes} is not a multiple of --group-size {group}")
    cfg = RolloutConfig(group_size=group, max_turns=a.turns, max_new_tokens=a.new_tokens,
                        max_context_tokens=a.prompt_words * 2 + a.turns * (a.new_tokens + 64),
                        ignore_eos=True)  # fmt: skip
    tasks = FixedLengthEnv.load_tasks(n=a.episodes // group, prompt_words=a.prompt_words)

    def make(engine):
        return Rollout(engine, tok, FixedLengthEnv, cfg, env_kwargs={"turns": a.turns})

    return make, tasks


async def http_overhead(a) -> None:
    import aiohttp
    import httpx

    from agentrl import collector
    from agentrl.engine import EngineClient

    server = await instant_server(canned_body(a.new_tokens))
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    n, requests = a.episodes, a.episodes * a.turns
    payload = {"input_ids": list(range(a.prompt_words)), "return_logprob": True,
               "sampling_params": {"max_new_tokens": a.new_tokens}}  # fmt: skip
    rounds: dict[str, list[float]] = {}

    async def measure(name: str, round_fn) -> None:
        await round_fn()  # connections opened, caches warm
        settled = collector.settle() if a.gc_freeze else None  # as Trainer.run does
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            await round_fn()
            rounds.setdefault(name, []).append((time.perf_counter() - t0) / requests * 1e3)
        if settled is not None:
            collector.restore(settled)

    make, tasks = fixed_length_rollouts(a)
    async with EngineClient([url], max_connections=4096) as engine:
        rollout = make(engine)
        await measure("agentrl Rollout", lambda: rollout.run(tasks))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def post() -> None:
            for _ in range(a.turns):
                async with session.post(url + "/generate", json=payload) as r:
                    await r.json()

        await measure("bare aiohttp", lambda: asyncio.gather(*(post() for _ in range(n))))

    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=4096)
    async with httpx.AsyncClient(limits=limits, timeout=600) as client:

        async def post_httpx() -> None:
            for _ in range(a.turns):
                (await client.post(url + "/generate", json=payload)).json()

        await measure("bare httpx", lambda: asyncio.gather(*(post_httpx() for _ in range(n))))
    server.close()

    print(f"{n} episodes x {a.turns} turns in flight, {a.new_tokens} ids per answer")
    best = {k: min(v) for k, v in rounds.items()}
    for k, v in rounds.items():
        print(f"{k:<16} {min(v):7.3f} ms/request (median of {len(v)} rounds "
              f"{statistics.median(v):.3f})")  # fmt: skip
    ours, floor, old = best["agentrl Rollout"], best["bare aiohttp"], best["bare httpx"]
    print(f"ratio Rollout / bare aiohttp {ours / floor:.2f}; bare httpx / Rollout {old / ours:.1f}")


def _serve(body: bytes, delay_s: float, conn) -> None:
    """instant_server in a process of its own (its port sent on `conn`), until terminated."""

    async def run() -> None:
        server = await instant_server(body, delay_s)
        conn.send(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(run())


async def lockstep(a) -> None:
    """--lockstep-ms D: a server (a process of its own) that answers every turn D ms after it
    arrived, as a decode that takes D whatever else runs would, and does nothing else. The
    rollout's wall against turns x D is then what the client's own work at the turn boundaries
    costs the episodes: per-episode requests; coalesced (engine.batch_window_ms=2), its batches
    answered 16 members at a time (engine/coalesce.py); and coalesced with each batch answered
    all at once (how it was: every member's turn in one loop iteration before any next request
    left)."""
    import multiprocessing as mp

    from agentrl.engine import EngineClient

    ctx = mp.get_context("fork")  # the server on a core of its own: only the client measured
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(canned_body(a.new_tokens), a.lockstep_ms / 1000,
                                            theirs), daemon=True)  # fmt: skip
    proc.start()
    url = f"http://127.0.0.1:{ours.recv()}"
    make, tasks = fixed_length_rollouts(a)
    ideal = a.turns * a.lockstep_ms / 1000
    sides = [("per-episode requests", 0.0, None), ("coalesced, answered in chunks", 2.0, None),
             ("coalesced, answered at once", 2.0, 10**9)]  # fmt: skip
    print(f"{a.episodes} episodes x {a.turns} turns, each answered {a.lockstep_ms:g} ms after it "
          f"arrived: ideal {ideal:.2f} s")  # fmt: skip
    for name, window, settle in sides:
        async with EngineClient([url], max_connections=4096, batch_window_ms=window) as engine:
            if settle:
                engine.gen.coalescer.settle_chunk = settle
            rollout = make(engine)
            await rollout.run(tasks[: max(a.episodes // 8, 1)])  # connections, caches
            best = float("inf")
            for _ in range(a.rounds):
                t0 = time.perf_counter()
                await rollout.run(tasks)
                best = min(best, time.perf_counter() - t0)
            cz = engine.gen.coalescer
            per = cz.batched_calls / max(cz.batches_sent, 1) if window else 1.0
        print(f"{name:<32} {best:6.2f} s  ideal/wall {ideal / best:.2f}  "
              f"{per:.0f} turns per request")  # fmt: skip
    proc.terminate()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prompt-words", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--http", action="store_true", help="whole client per request, HTTP included")
    p.add_argument("--episodes", type=int, default=256)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--gc-freeze", action="store_true", help="--http: set the collector as a "
                   "training run does (Trainer.run, agentrl/collector.py): the objects made "
                   "before the measured rounds frozen, the young passes spaced")  # fmt: skip
    p.add_argument("--group-size", type=int, default=1, help="--http: samples per task (the "
                   "episodes are --episodes / this tasks' groups; a group shares its prompt)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lockstep-ms", type=float, default=0.0,
                   help="turns answered after this many ms: the turn boundaries' cost")  # fmt: skip
    a = p.parse_args()
    if a.lockstep_ms:
        asyncio.run(lockstep(a))
        return
    if a.http:
        asyncio.run(http_overhead(a))
        return

    from transformers import AutoTokenizer

    from agentrl.assets.build import cached_tokenizer
    from agentrl.parsers import get_parser
    from agentrl.render import Renderer
    from agentrl.types import Message

    tok = AutoTokenizer.from_pretrained(cached_tokenizer("qwen"))
    parser = get_parser("hermes")
    text = " ".join(["alpha"] * a.prompt_words)
    msgs = [Message(role="user", content=text)]
    sampled = [random.Random(0).randint(0, 150000) for _ in range(a.new_tokens)]
    obs = [Message(role="tool", content="ok", name="noop")]

    def turn_parts(r: Renderer) -> dict[str, float]:
        said = r.assistant_text(sampled)
        return {
            "prompt_ids": per_call(lambda: r.prompt_ids(msgs), a.repeats),
            "assistant_text": per_call(lambda: r.assistant_text(sampled), a.repeats),
            "parse": per_call(lambda: parser.parse(said, {}, truncated=False), a.repeats),
            "observation_ids": per_call(lambda: r.observation_ids(obs, sampled), a.repeats),
        }

    # the reference: transformers' own apply_chat_template/encode/decode (agentrl/fastpath.py)
    wrapped = sum(turn_parts(Renderer(tok, [], fast=False)).values())
    parts = turn_parts(Renderer(tok, []))
    encode = per_call(lambda: tok.encode(text), a.repeats)
    for k, v in parts.items():
        print(f"{k:<16} {v:7.3f} ms")
    turn = sum(parts.values())
    print(f"per turn {turn:.3f} ms; plain encode {encode:.3f} ms; ratio {turn / encode:.1f}")
    print(f"per turn through transformers' wrappers (Renderer(fast=False)) {wrapped:.3f} ms; "
          f"ratio wrappers / fast {wrapped / turn:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
