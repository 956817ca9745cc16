"""Where a lock-step turn boundary's time goes (issue 43), on a running SGLang server: a bare
multi-turn client records when each turn left and when its answers came back; the server's log
says when its scheduler ran each prefill and decode batch. Merged, every turn splits into

- in:      the turn sent -> the first prefill batch of it logged (HTTP, tokenizer manager, the
           scheduler receiving it);
- prefill: that first prefill batch -> the first decode batch that holds every episode;
- decode:  -> the last decode batch logged before the answers came back;
- out:     -> the last answer back at the client (the tail steps after the last log line, the
           finished requests' output handling, JSON, HTTP).

Start the server with millisecond log stamps and a decode line every few steps:

    SGLANG_LOG_MS=1 python -m sglang.launch_server ... --decode-log-interval 4 > server.log 2>&1 &
    python bench/turn_timeline.py --url http://127.0.0.1:30000 --log server.log \
        [--episodes 256 --turns 4 --per-turn 128 --prompt-tokens 128 --styles batched,plain]

Styles: batched (each turn of all episodes in ONE /generate), plain (one /generate per episode
and turn, all at once), either with a `_nolp` suffix: return_logprob off (what the logprobs
cost); `reference` is always timed first: one batched /generate of the whole
turns x per-turn tokens. Prompts are random token ids (distinct per episode), every later turn
appends the sampled ids and --obs-tokens fixed ids, as a tool answer would; return_logprob on and
ignore_eos, as agentrl asks. The cache is flushed before every run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import random
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

LINE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})[^\]]*\] (Prefill|Decode) batch[^,]*, (.*)$"
)
FIELD = re.compile(r"#([a-z-]+): (\d+)")


@dataclass
class Batch:
    """One scheduler log line: when, which kind, its counters (#new-seq, #running-req, ...)."""

    t: float
    kind: str  # "prefill" or "decode"
    counts: dict[str, int]


@dataclass
class Turn:
    """One turn of the client: when its requests left (first, last) and answers came back."""

    sent: float
    sent_last: float
    answered_first: float = 0.0
    answered: float = 0.0


@dataclass
class Run:
    style: str
    episodes: int
    turns: list[Turn] = field(default_factory=list)
    wall: float = 0.0


def parse_log(text: str) -> list[Batch]:
    """The prefill and decode batch lines of an SGLang log written with SGLANG_LOG_MS=1."""
    out = []
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        t = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
        counts = {k: int(v) for k, v in FIELD.findall(m.group(3))}
        out.append(Batch(t, m.group(2).lower(), counts))
    if not out:
        raise SystemExit("no 'Prefill batch' / 'Decode batch' lines with millisecond stamps in "
                         "the log: start the server with SGLANG_LOG_MS=1 (and --decode-log-interval)")  # fmt: skip
    return out


def split_turn(turn: Turn, batches: list[Batch], episodes: int) -> dict[str, float] | None:
    """The turn's four segments in seconds (module docstring), from the log lines between its
    first send and its last answer; None when the log has no prefill line in that window."""
    inside = [b for b in batches if turn.sent <= b.t <= turn.answered]
    prefills = [b for b in inside if b.kind == "prefill"]
    if not prefills:
        return None
    first = prefills[0].t
    full = [b for b in inside if b.kind == "decode" and b.counts.get("running-req", 0) >= episodes]
    decodes = [b for b in inside if b.kind == "decode"]
    t_full = full[0].t if full else prefills[-1].t
    t_last = decodes[-1].t if decodes else t_full
    return {
        "in": first - turn.sent,
        "prefill": t_full - first,
        "decode": max(t_last - t_full, 0.0),
        "out": turn.answered - max(t_last, t_full),
        "prefill_batches": float(len(prefills)),
        "new_seq_first": float(prefills[0].counts.get("new-seq", 0)),
        "send_spread": turn.sent_last - turn.sent,
        "answer_spread": turn.answered - turn.answered_first,
    }


def report(runs: list[Run], batches: list[Batch]) -> None:
    """A line per turn of each run, then each style's median over its later turns."""
    cols = ["in", "prefill", "decode", "out", "send_spread", "answer_spread"]
    print(f"{'run':>10} {'turn':>4} " + " ".join(f"{c:>13}" for c in cols)
          + "  prefill batches (first's #new-seq)")  # fmt: skip
    for run in runs:
        later: dict[str, list[float]] = {c: [] for c in cols}
        for k, turn in enumerate(run.turns):
            seg = split_turn(turn, batches, run.episodes)
            if seg is None:
                print(f"{run.style:>10} {k:>4}  (no prefill line inside this turn)")
                continue
            print(f"{run.style:>10} {k:>4} " + " ".join(f"{seg[c]:>13.3f}" for c in cols)
                  + f"  {seg['prefill_batches']:.0f} ({seg['new_seq_first']:.0f})")  # fmt: skip
            if k > 0 or len(run.turns) == 1:
                for c in cols:
                    later[c].append(seg[c])
        med = " ".join(
            f"{statistics.median(v) if v else float('nan'):>13.3f}" for v in later.values()
        )
        print(f"{run.style:>10}  med {med}  wall {run.wall:.2f} s")


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    async with http.post(url + "/generate", json=body) as r:
        if r.status != 200:
            raise SystemExit(f"/generate: HTTP {r.status}: {(await r.text())[:300]}")
        return orjson.loads(await r.read())


def body(ids: Any, new_tokens: int, logprob: bool = True) -> dict[str, Any]:
    sp = {"max_new_tokens": new_tokens, "temperature": 1.0, "ignore_eos": True}
    return {"input_ids": ids, "sampling_params": sp, "return_logprob": logprob}


async def plain_turn(http, url: str, ids: list[list[int]], per_turn: int, turn: Turn,
                     logprob: bool) -> list:  # fmt: skip
    """One request per episode, all at once; the turn's send and answer spreads recorded."""

    async def one(i: int) -> Any:
        turn.sent_last = max(turn.sent_last, time.time())
        out = await post(http, url, body(ids[i], per_turn, logprob))
        turn.answered_first = turn.answered_first or time.time()
        return out

    return await asyncio.gather(*(one(i) for i in range(len(ids))))


async def run_style(http, url: str, style: str, prompts: list[list[int]], a) -> Run:
    """One run of `style`: its turns timed on the client (time.time(), the log's clock)."""
    run = Run(style, len(prompts))
    ids = [list(p) for p in prompts]
    turns, per_turn = (1, a.turns * a.per_turn) if style == "reference" else (a.turns, a.per_turn)
    obs = list(range(1000, 1000 + a.obs_tokens))
    logprob = not style.endswith("_nolp")
    t0 = time.perf_counter()
    for k in range(turns):
        now = time.time()
        turn = Turn(sent=now, sent_last=now)
        if style.startswith("plain"):
            outs = await plain_turn(http, url, ids, per_turn, turn, logprob)
        else:
            outs = await post(http, url, body(ids, per_turn, logprob))
            turn.answered_first = time.time()
        turn.answered = time.time()
        run.turns.append(turn)
        for i, o in enumerate(outs):
            ids[i] = ids[i] + o["output_ids"] + (obs if k < turns - 1 else [])
    run.wall = time.perf_counter() - t0
    return run


async def main_async(a) -> list[Run]:
    rng = random.Random(a.seed)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=3600)) as http:  # fmt: skip
        warm = [
            [rng.randrange(100, 30000) for _ in range(a.prompt_tokens)] for _ in range(a.episodes)
        ]
        await post(http, a.url, body(warm, 16))
        runs = []
        for _ in range(a.rounds):
            for style in ["reference", *a.styles.split(",")]:
                prompts = [[rng.randrange(100, 30000) for _ in range(a.prompt_tokens)]
                           for _ in range(a.episodes)]  # fmt: skip
                async with http.post(a.url + "/flush_cache") as resp:
                    await resp.read()
                await asyncio.sleep(0.5)  # the flush lands; the log line order settles
                runs.append(await run_style(http, a.url, style, prompts, a))
        return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--log", required=True, help="the server's log (SGLANG_LOG_MS=1)")
    p.add_argument("--episodes", type=int, default=256)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--per-turn", type=int, default=128)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--obs-tokens", type=int, default=24)
    p.add_argument("--styles", default="batched,plain")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    runs = asyncio.run(main_async(a))
    time.sleep(0.5)  # the server's last lines reach its log
    report(runs, parse_log(Path(a.log).read_text(errors="replace")))


if __name__ == "__main__":
    main()
