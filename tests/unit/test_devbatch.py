"""The dev server's batched draw (agentrl/engine/dev/batch.py `_draw`): one inverse-CDF draw for all the
sampled rows without a seed or filter of their own, which replaced one multinomial call per row;
and its solo mode (--enable-deterministic-inference), where a request's numbers are its own."""

from __future__ import annotations

import math

import torch

from agentrl.engine.dev.batch import _draw


def test_batched_draw_follows_each_rows_distribution() -> None:
    gen = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(torch.randn(4, 50, generator=gen) * 2, -1)
    n = 40_000
    draws = _draw(logp.repeat(n, 1), gen).view(n, 4)  # row r of every block: distribution r
    for r in range(4):
        freq = torch.bincount(draws[:, r], minlength=50).double() / n
        total_variation = 0.5 * (freq - logp[r].double().exp()).abs().sum().item()
        assert total_variation < 0.03, (r, total_variation)  # sampling noise is about 0.01


def test_batched_draw_never_picks_a_token_of_probability_zero() -> None:
    gen = torch.Generator().manual_seed(1)
    logp = torch.log_softmax(torch.tensor([[0.0, -math.inf, 0.0, -math.inf, -30.0]]), -1)
    seen = set(_draw(logp.repeat(20_000, 1), gen).tolist())
    assert seen <= {0, 2, 4} and {0, 2} <= seen
    # a row whose whole mass sits on its last token: the draw stays on it
    last = torch.log_softmax(torch.tensor([[-math.inf, -math.inf, 0.0]]), -1)
    assert set(_draw(last.repeat(1000, 1), gen).tolist()) == {2}


def test_solo_mode_gives_a_request_the_same_ids_and_logprobs_whatever_runs_beside_it() -> None:
    """--enable-deterministic-inference (trainer.deterministic): a seeded request computed alone
    samples the same ids with bit-equal logprobs whether it runs by itself or joins requests of
    other lengths mid-way (batched, its logprobs moved by ~2e-5 on this model)."""
    import random

    from agentrl.assets.build import resolve_builtin
    from agentrl.engine.dev.batch import BatchEngine
    from agentrl.engine.dev.request import Req

    rng = random.Random(0)
    prompt = [rng.randrange(1000) for _ in range(40)]
    others = [[rng.randrange(1000) for _ in range(rng.randrange(5, 90))] for _ in range(6)]

    def req(ids: list[int], seed: int) -> Req:
        return Req(rid=f"r{seed}-{len(ids)}", prompt=ids, max_new_tokens=20, temperature=1.0,
                   top_p=1.0, top_k=-1, min_p=0.0, stop_ids=frozenset(), ignore_eos=True,
                   return_logprob=True, gen=torch.Generator().manual_seed(seed), fut=None)  # fmt: skip

    def run(waves: dict[int, list[Req]]) -> None:
        engine = BatchEngine(str(resolve_builtin("tiny")), "cpu", torch.float32, "sdpa", 0,
                             prefix_cache_mb=256, solo=True)  # fmt: skip
        reqs = [r for wave in waves.values() for r in wave]
        step = 0
        while any(r.finish is None for r in reqs):
            engine.step(waves.get(step, []))
            step += 1

    alone, crowded = req(prompt, 7), req(prompt, 7)
    run({0: [alone]})
    run({0: [req(o, i) for i, o in enumerate(others[:3])],
         4: [crowded, *(req(o, 9) for o in others[3:])]})  # fmt: skip
    assert len(alone.out) == 20
    assert (crowded.out, crowded.logprobs) == (alone.out, alone.logprobs)
