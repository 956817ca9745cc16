"""The gateway's cost: the same multi-turn workload through the native rollout and through the
gateway (an `openai` SDK agent per episode), on the same server, in the same run.

    python bench/gateway_overhead.py [--episodes 32] [--turns 4] [--tokens 32] [--repeats 3]
    python bench/gateway_overhead.py --url http://127.0.0.1:30000 --model DIR   # SGLang (GPU)
    python bench/gateway_overhead.py --agent-workers 4   # the agents in 4 processes of their own

Workload: --episodes episodes in flight together, each --turns assistant turns of exactly
--tokens sampled ids (ignore_eos), a user message "continue" after each turn but the last. The
native side is agentrl's Rollout on an Env doing that; the gateway side is an AgentEnv whose
agent sends the whole conversation to /v1/chat/completions each turn, with the assistant
messages it got back (every request extends its sequence: checked). Without --url the dev
server runs the shipped tiny model on CPU. With --agent-workers N the agents run in N processes
(rollout.gateway.agent_workers), not in the rollout's loop; "gateway" is then measured both ways.
Runs alternate, --repeats each; prints sampled
tokens/s of both (median), the ratio gateway / native, and the gateway's extra wall time per
request.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from agentrl.agent_env import AgentEnv
from agentrl.assets.build import resolve_builtin
from agentrl.engine import EngineClient, EngineConfig, launch_engines
from agentrl.env import AssistantTurn, Env, StepResult
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.types import Message, Task, Trajectory

NEXT = "continue"


def tasks(n: int, turns: int) -> list[Task]:
    return [Task(id=f"b{i}", data={"prompt": f"Task {i}: write about rivers and stones.",
                                   "turns": turns}) for i in range(n)]  # fmt: skip


class Native(Env):
    async def start(self) -> list[Message]:
        return [Message(role="user", content=self.task.data["prompt"])]

    async def step(self, turn: AssistantTurn) -> StepResult:
        if turn.index + 1 >= self.task.data["turns"]:
            return StepResult(done=True)
        return StepResult(messages=[Message(role="user", content=NEXT)])

    async def reward(self, trajectory: Trajectory) -> float:
        return 0.0


class ThroughGateway(AgentEnv):
    async def run(self, task: Task, client: Any) -> float:
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.data["prompt"]}]
        turns = task.data["turns"]
        for k in range(turns):
            out = await client.chat.completions.create(model="m", messages=messages)
            messages.append(out.choices[0].message.model_dump(exclude_none=True))
            if k + 1 < turns:
                messages.append({"role": "user", "content": NEXT})
        return 0.0


async def one(ro: Rollout, n: int, turns: int) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    groups = await ro.run(tasks(n, turns))
    wall = time.perf_counter() - t0
    trajs = [t for g in groups for t in g]
    bad = [
        t
        for t in trajs
        if t.stop_reason.value not in ("completed", "max_turns", "length") or t.error
    ]
    if bad:
        raise RuntimeError(f"{len(bad)} episodes failed: {bad[0].stop_reason} {bad[0].error}")
    forks = sum(t.metadata.get("gateway", {}).get("fork", 0) for t in trajs)
    if forks:
        raise RuntimeError(f"{forks} gateway requests forked: the workload must extend")
    return wall, sum(t.num_sampled for t in trajs), sum(len(t.turns) for t in trajs)


async def main(a: argparse.Namespace, urls: list[str], model: str) -> None:
    tok = AutoTokenizer.from_pretrained(model)
    cfg = RolloutConfig(group_size=1, max_new_tokens=a.tokens, ignore_eos=True,
                        max_context_tokens=4096, max_turns=a.turns)  # fmt: skip
    kinds: dict[str, tuple[type[Env], RolloutConfig]] = {
        "native": (Native, cfg), "gateway": (ThroughGateway, cfg)}  # fmt: skip
    if a.agent_workers:
        gw = cfg.gateway.model_copy(update={"agent_workers": a.agent_workers})
        kinds[f"gateway, {a.agent_workers} agent workers"] = (
            ThroughGateway, cfg.model_copy(update={"gateway": gw}))  # fmt: skip
    rows: dict[str, list[tuple[float, int, int]]] = {k: [] for k in kinds}
    async with EngineClient(urls) as engine:
        # one Rollout per kind for all runs, as a training run keeps its own (agent workers and
        # the gateway start once); a small run of each first warms them
        ros = {k: Rollout(engine, tok, env_cls, c) for k, (env_cls, c) in kinds.items()}
        try:
            for ro in ros.values():
                await one(ro, 2, a.turns)
            for _ in range(a.repeats):
                for k, ro in ros.items():
                    rows[k].append(await one(ro, a.episodes, a.turns))
        finally:
            for ro in ros.values():
                await ro.aclose()
    rate = {k: statistics.median(s / w for w, s, _ in v) for k, v in rows.items()}
    wall = {k: statistics.median(w for w, _, _ in v) for k, v in rows.items()}
    requests = rows["gateway"][0][2]
    print(f"workload: {a.episodes} episodes x {a.turns} turns x {a.tokens} tokens, in flight "
          f"together; {a.repeats} runs each (median)")  # fmt: skip
    for k in rows:
        print(f"  {k:31s} {rate[k]:9.1f} sampled tokens/s   wall {wall[k]:.3f} s")
    for k in rows:
        if k == "native":
            continue
        extra = (wall[k] - wall["native"]) / requests * 1e3
        print(f"ratio {k} / native: {rate[k] / rate['native']:.3f}; extra wall per request "
              f"{extra:.2f} ms ({requests} requests per run)")  # fmt: skip


if __name__ == "__main__":
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--url", help="a running SGLang server (else the dev server, on CPU)")
    p.add_argument("--model", help="the server's model dir (its tokenizer)")
    p.add_argument("--agent-workers", type=int, default=0,
                   help="also run the gateway side with the agents in N processes")  # fmt: skip
    a = p.parse_args()
    if a.url:
        asyncio.run(main(a, [a.url], a.model))
    else:
        tiny = resolve_builtin("tiny")
        with (
            tempfile.TemporaryDirectory() as logs,
            launch_engines(EngineConfig(), tiny, Path(logs)) as urls,
        ):
            asyncio.run(main(a, urls, str(tiny)))
