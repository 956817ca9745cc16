"""The dev server's batched draw (agentrl/devbatch.py `_draw`): one inverse-CDF draw for all the
sampled rows without a seed or filter of their own, which replaced one multinomial call per row."""

from __future__ import annotations

import math

import torch

from agentrl.devbatch import _draw


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
