"""Partial rollouts on real SGLang (trainer.async.partial_rollouts): a weight push cuts two long
sampled generations with /pause_generation (abort mode); they go on under the new weights. The tokens
kept from before the push have the old weights' logprobs and version, the later ones the new
weights' (each checked against SGLang's own prefill scoring of the whole sequence under each
model), and nothing was sampled twice."""

from __future__ import annotations

import asyncio
from statistics import fmean

import pytest
import torch
from gpu_helpers import launch_sglang, prefill_logprobs

from agentrl.engine import EngineClient, SamplingParams
from agentrl.types import FinishReason

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.xdist_group("partial"),  # one worker: the module's server starts once
]
PROMPTS = [[9707, 11, 1879, 0, 4340, 525, 498], [785, 3974, 13876, 38835, 30]]
N = 1500


@pytest.fixture(scope="module")
def model1_dir(tmp_path_factory, model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    out = tmp_path_factory.mktemp("qwen3-small-seed1")
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    return out


def test_a_push_cuts_generations_and_they_go_on_with_each_tokens_logprob(
    model_dir, model1_dir, tmp_path
):
    async def scenario(url: str) -> None:
        params = SamplingParams(max_new_tokens=N, temperature=1.0, ignore_eos=True)
        async with EngineClient([url]) as engine:
            await engine.control.update_weights_from_disk(str(model_dir), weight_version="0")
            calls = [asyncio.create_task(engine.generate(p, params)) for p in PROMPTS]
            await asyncio.sleep(1.0)
            async with engine.exclusive(pause=True) as inflight:
                assert inflight == 2
                await engine.control.update_weights_from_disk(str(model1_dir), weight_version="1")
            cut = await asyncio.wait_for(asyncio.gather(*calls), 300)
            new = [await prefill_logprobs(url, p + c.token_ids, len(p)) for p, c in zip(
                PROMPTS, cut, strict=True)]  # fmt: skip
            await engine.control.update_weights_from_disk(str(model_dir), weight_version="0")
            old = [await prefill_logprobs(url, p + c.token_ids, len(p)) for p, c in zip(
                PROMPTS, cut, strict=True)]  # fmt: skip
        for c, lp_new, lp_old in zip(cut, new, old, strict=True):
            assert c.finish_reason is FinishReason.LENGTH and len(c.token_ids) == N
            assert [v for _, v in c.segments] == ["0", "1"], c.segments
            k = c.segments[0][0]
            assert 0 < k < N
            kept = fmean(abs(a - b) for a, b in zip(c.logprobs[:k], lp_old[:k], strict=True))
            later = fmean(abs(a - b) for a, b in zip(c.logprobs[k:], lp_new[k:], strict=True))
            wrong = fmean(abs(a - b) for a, b in zip(c.logprobs[k:], lp_old[k:], strict=True))
            print(f"cut after {k}/{N} tokens: |engine - prefill| kept (model0) {kept:.4f}, "
                  f"later (model1) {later:.4f}; later against model0 {wrong:.4f}")  # fmt: skip
            assert kept <= 0.02 and later <= 0.02
            assert wrong > 10 * max(later, 0.01)  # the two models really differ

    with launch_sglang(model_dir, tmp_path, "0") as url:
        asyncio.run(scenario(url))
