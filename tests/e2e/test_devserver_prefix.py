"""The dev server's prefix cache (agentrl/engine/dev/cache.py) on loopback: a turn's prompt that extends
the last turn is computed only past what the cache holds, identical prompts admitted together
are computed once, and every logprob still equals a plain forward over the row's own ids; a
weight update or /flush_cache empties the cache."""

from __future__ import annotations

import asyncio

from test_devserver import TOL, load, ref_logprobs  # the dev server tests' plain-forward check

from agentrl.assets.build import cached_tiny_random
from agentrl.engine import EngineClient, SamplingParams

P = [(31 * j + 7) % 150000 for j in range(40)]  # 2.5 blocks of 16
OBS = [101, 102, 103, 104, 105, 106, 107, 108]


def assert_exact(model, prompt: list[int], comp) -> None:
    ref = ref_logprobs(model, prompt, comp.token_ids)
    assert max(abs(a - b) for a, b in zip(comp.logprobs, ref, strict=True)) < TOL


async def prefill_tokens(engine: EngineClient) -> int:
    return (await engine.control.server_info())[0]["internal_states"][0]["stats"].get(
        "prefill_tokens", 0
    )


def sampling(seed: int, n: int = 12) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=1.0, seed=seed, ignore_eos=True)


async def test_next_turn_reuses_the_last_and_rows_of_mixed_hits_stay_exact(
    scratch_base_server, tiny_model_dir
):
    model = load(tiny_model_dir)
    async with EngineClient([scratch_base_server]) as engine:
        await engine.control.flush_cache()
        first = await engine.generate(P, sampling(1))
        assert first.cached_tokens == 0
        assert_exact(model, P, first)
        turn2 = P + first.token_ids + OBS
        before = await prefill_tokens(engine)
        second = await engine.generate(turn2, sampling(2, 8))
        # the finished turn left prompt + output but its last token (whose KV it never computed)
        assert second.cached_tokens == len(P) + len(first.token_ids) - 1
        assert await prefill_tokens(engine) - before == len(OBS) + 1
        assert_exact(model, turn2, second)
        # one batch: a long hit, a short hit (the prompt only), a miss; padding sits between the
        # cached columns and the new ones, differently per row
        other = P + [7, 8, 9, 10, 11]
        fresh = [(17 * j + 3) % 150000 for j in range(23)]
        prompts = [turn2 + second.token_ids + OBS, other, fresh]
        comps = await asyncio.gather(*(engine.generate(p, sampling(3 + i)) for i, p in
                                       enumerate(prompts)))  # fmt: skip
    assert [c.cached_tokens for c in comps] == [len(turn2) + 7, len(P), 0]
    for p, c in zip(prompts, comps, strict=True):
        assert_exact(model, p, c)


async def test_identical_prompts_together_are_computed_once(scratch_base_server, tiny_model_dir):
    model = load(tiny_model_dir)
    prompt = [(13 * j + 1) % 150000 for j in range(50)]
    async with EngineClient([scratch_base_server]) as engine:
        await engine.control.flush_cache()
        before = await prefill_tokens(engine)
        comps = await asyncio.gather(*(engine.generate(prompt, sampling(s)) for s in range(6)))
        computed = await prefill_tokens(engine) - before
    # computed once, whether the six came in one prefill (50) or some came after it (1 each)
    assert computed <= len(prompt) + 5, computed
    assert len({tuple(c.token_ids) for c in comps}) > 1  # their own seeds, their own samples
    for c in comps:
        assert_exact(model, prompt, c)


async def test_weight_update_and_flush_empty_the_cache(scratch_base_server, tiny_model_dir):
    new_dir = cached_tiny_random(seed=1)
    model1 = load(new_dir)
    async with EngineClient([scratch_base_server]) as engine:
        first = await engine.generate(P, sampling(1))
        again = await engine.generate(P + first.token_ids, sampling(2))
        assert again.cached_tokens > 0
        await engine.control.update_weights_from_disk(str(new_dir), weight_version="1")
        after = await engine.generate(P + first.token_ids, sampling(2))
        assert after.cached_tokens == 0  # the old weights' keys/values are gone
        assert_exact(model1, P + first.token_ids, after)
        hit = await engine.generate(P + first.token_ids, sampling(3))
        assert hit.cached_tokens > 0
        assert await engine.control.flush_cache() == [True]
        miss = await engine.generate(P + first.token_ids, sampling(3))
        assert miss.cached_tokens == 0
        await engine.control.update_weights_from_disk(str(tiny_model_dir), weight_version="0")
