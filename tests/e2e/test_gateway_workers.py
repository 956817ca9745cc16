"""The gateway (agentrl/gateway/) against the real dev server, continued from test_gateway.py:
agents in worker processes of their own, an engine's refusal, and penalties under
`sampling=request`."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from gateway_post import post_once
from gateway_record import Recording, assert_token_exact
from transformers import AutoTokenizer

from agentrl.assets.build import resolve_builtin
from agentrl.engine import EngineClient, EngineConfig, launch_engines
from agentrl.envs.examples.agent_openai import AddAgent, add_tasks
from agentrl.gateway import Gateway, GatewayConfig, GenerationDefaults
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.seeding import sampling_round
from agentrl.types import StopReason, Task, Trajectory

TINY = resolve_builtin("tiny")  # the shipped tiny model, as test_gateway.py's


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with launch_engines(EngineConfig(), TINY, tmp_path_factory.mktemp("logs")) as urls:
        yield urls


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(TINY)


class InWorker(AddAgent):
    """AddAgent that notes the process it ran in (an attribute set in run, read by reward);
    task "raise" raises after its first request, task "die" ends its worker process."""

    async def run(self, task: Task, client: Any) -> Any:
        self.pid = os.getpid()
        if task.id in ("raise", "die"):
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
            if task.id == "die":
                os._exit(3)
            raise ValueError("the agent's own bug, in its worker")
        return await super().run(task, client)

    async def reward(self, trajectory: Trajectory) -> dict[str, float]:
        return {"total": float(self.result), "pid": float(self.pid)}


def test_agents_in_worker_processes_are_recorded_the_same_and_fail_the_same(server, tok):
    """rollout.gateway.agent_workers=2: run() executes in two processes of their own, each
    sampled turn is still token-exact, an attribute run() set reaches reward(), an agent that
    raises is the episode's agent_error with its worker's traceback, a worker that dies aborts
    its episode (infrastructure) and the next episode gets a fresh worker."""
    cfg = RolloutConfig(max_new_tokens=48, max_context_tokens=700, group_size=3,
                        gateway=GatewayConfig(agent_workers=2))  # fmt: skip

    async def go():
        async with EngineClient(server) as engine:
            rec = Recording(engine)
            ro = Rollout(rec, tok, InWorker, cfg)
            try:
                with sampling_round(0, "first"):  # seeded: some episode solves its task
                    first = await ro.run(add_tasks(4))
                raised = await ro.run([Task(id="raise", data={})])
                died = await ro.run([Task(id="die", data={})])  # apart: it takes its worker's
                with sampling_round(0, "after"):
                    after = await ro.run(add_tasks(2))
            finally:
                await ro.aclose()
            return first, raised + died, after, rec

    first, bad, after, rec = asyncio.run(go())
    trajs = [t for g in first + after for t in g]
    assert all(t.stop_reason is StopReason.COMPLETED for t in trajs)
    pids = {t.reward_components["pid"] for t in trajs}
    assert len(pids) >= 2 and float(os.getpid()) not in pids  # two workers, not this process
    assert sum(t.reward for t in trajs) > 0
    for t in trajs:
        assert_token_exact(t, rec)
    by = {g[0].task_id: g for g in bad}
    assert all(t.stop_reason is StopReason.AGENT_ERROR for t in by["raise"])
    assert "ValueError: the agent's own bug, in its worker" in by["raise"][0].error
    assert "Traceback" in by["raise"][0].error and by["raise"][0].num_sampled > 0
    assert all(t.stop_reason is StopReason.ABORTED for t in by["die"])
    assert "agent worker process ended (exit code 3)" in by["die"][0].error


def test_a_request_the_engine_refuses_is_a_502_and_the_episode_is_the_systems_failure(server, tok):
    """A red-team pass: an engine's 4xx other than a prompt too long (here the dev server's,
    for a run's top_k of 0, which SGLang refuses too) was a plain-text 500 and the episode the
    agent's error, scored 0 in its group. The run's settings or the engine are at fault, not the
    policy: the agent gets an OpenAI error body, and the episode is `aborted`, out of the
    baseline, with the engine's reason."""

    async def go():
        async with EngineClient(server) as engine:
            parser = Rollout.prepare(tok, AddAgent, RolloutConfig())[1]
            gw = Gateway(engine, tok, parser, defaults=GenerationDefaults(top_k=0))
            return await post_once(gw, {"messages": [{"role": "user", "content": "1+2?"}]})

    ep, r = asyncio.run(go())
    assert r.status_code == 502 and r.json()["error"]["code"] == "engine_error", r.text
    assert "top_k" in r.json()["error"]["message"]
    assert ep.stop is StopReason.ABORTED and "EngineRequestError" in ep.error
    assert not ep.sequences or not ep.sequences[0].seq.turns  # nothing recorded


def test_penalties_under_sampling_request_are_sampled_by_the_dev_server(server, tok):
    """rollout.gateway.sampling=request (`agentrl gateway`): a request with presence and
    frequency penalties was refused by the dev server, a 502 and the episode `aborted`. The dev
    server samples them as SGLang does; the answer is recorded token-exact."""

    async def go():
        async with EngineClient(server) as engine:
            rec = Recording(engine)
            parser = Rollout.prepare(tok, AddAgent, RolloutConfig())[1]
            gw = Gateway(rec, tok, parser, GatewayConfig(sampling="request"),
                         GenerationDefaults(max_new_tokens=24))  # fmt: skip
            body = {"messages": [{"role": "user", "content": "Count to ten."}],
                    "presence_penalty": 0.5, "frequency_penalty": 1.0, "temperature": 0}  # fmt: skip
            ep, r = await post_once(gw, body)
            return ep, r, rec

    ep, r, rec = asyncio.run(go())
    assert r.status_code == 200, r.text
    assert ep.stop is None and r.json()["usage"]["completion_tokens"] > 0
    ((prompt, out, lps),) = rec.calls
    (cap,) = ep.trained()
    (turn,) = cap.seq.turns
    assert cap.seq.ids[: turn.start] == prompt and cap.seq.ids[turn.start : turn.end] == out
    assert cap.seq.logprobs[turn.start : turn.end] == lps
