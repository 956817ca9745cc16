"""A group of multi-turn code_exec episodes: the real dev server (the shipped tiny tool-caller, real
Qwen tokenizer) on loopback, the real SGLang-protocol client, the real python tool. (The shipped
model, not a `tiny-toolcaller` build: building that one took 15-20 s of every CI run.)"""

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.assets.build import resolve_builtin
from agentrl.engine import EngineClient, EngineConfig, launch_engines
from agentrl.envs.code_exec import CodeExecEnv
from agentrl.metrics import rollout_metrics
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.types import StopReason


@pytest.fixture(scope="module")
def toolcaller():
    return resolve_builtin("tiny")


@pytest.fixture(scope="module")
def group(toolcaller, tmp_path_factory):
    tok = AutoTokenizer.from_pretrained(toolcaller)
    cfg = RolloutConfig(group_size=8, max_new_tokens=64, max_context_tokens=600, max_turns=3)
    tasks = CodeExecEnv.load_tasks(n=2, seed=3)

    async def go(urls):
        async with EngineClient(urls) as engine:
            ro = Rollout(engine, tok, CodeExecEnv, cfg)
            return [t for g in await ro.run(tasks) for t in g], ro

    with launch_engines(EngineConfig(), toolcaller, tmp_path_factory.mktemp("logs")) as urls:
        trajs, ro = asyncio.run(go(urls))
    return trajs, ro


def test_group_is_multi_turn_and_ends_with_reasons(group):
    trajs, _ = group
    assert len(trajs) == 16
    assert all(isinstance(t.stop_reason, StopReason) and t.error is None for t in trajs)
    assert max(len(t.turns) for t in trajs) >= 2, (
        "the tool-caller should produce multi-turn episodes"
    )
    m = rollout_metrics(trajs)
    assert m["rollout/tool_call_rate"] > 0 and m["rollout/sampled_tokens"] > 0


def test_every_trajectory_is_token_exact(group, toolcaller):
    """Teacher-forced logprobs of a plain transformers forward over each trajectory's ids equal the
    logprobs the server returned while sampling them — so the ids, the mask and the logprobs line up,
    and every turn's prompt was exactly the trajectory prefix."""
    trajs, ro = group
    model = AutoModelForCausalLM.from_pretrained(toolcaller, dtype=torch.float32).eval()
    for t in trajs:
        t.check()
        ids = torch.tensor([t.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
        ref = logp.gather(-1, ids[0, 1:, None])[:, 0]
        for turn in t.turns:
            got = torch.tensor(t.logprobs[turn.start : turn.end])
            want = ref[turn.start - 1 : turn.end - 1]
            # fp32, but the server decodes with a KV cache and this forward is one pass: the sums run
            # in another order, so a -18 logprob can differ by ~3e-4 (relative 2e-5). A wrong id or an
            # off-by-one prefix moves logprobs by whole nats.
            assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (
                t.task_id,
                (got - want).abs().max(),
            )
            sampled = t.token_ids[turn.start : turn.end]
            assert ro.renderer.assistant_text(sampled) == turn.text
        masked = [lp for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if not m]
        assert masked == [0.0] * len(masked)


def test_observations_follow_the_template(group):
    trajs, ro = group
    for t in trajs:
        for turn in t.turns:
            if turn.obs_end > turn.end:
                obs = t.token_ids[turn.end : turn.obs_end]
                sampled = t.token_ids[turn.start : turn.end]
                assert obs == ro.renderer.observation_ids(turn.observations, sampled)
