"""The vocabulary head's fused logprobs (agentrl/learner/vocab_head.py) against plain autograd
through the full logits: values, entropies and both gradients, with and without an entropy term,
at temperature 1 and not, over several chunks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from agentrl.learner.vocab_head import head_logprobs


def reference(h, w, tgt, temperature):
    x = F.linear(h, w) / temperature
    lse = torch.logsumexp(x, -1)
    lp = x.gather(-1, tgt[:, None]).squeeze(-1) - lse
    ent = lse - (torch.softmax(x, -1) * x).sum(-1)
    return lp, ent


def leaves(n=37, hidden=16, vocab=53, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(n, hidden, generator=g, dtype=dtype) * 0.7).requires_grad_()
    w = torch.randn(vocab, hidden, generator=g, dtype=dtype).requires_grad_()
    tgt = torch.randint(0, vocab, (n,), generator=g)
    return h, w, tgt


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("entropy_term", [True, False])
def test_fused_head_matches_autograd_through_the_full_logits(temperature, entropy_term):
    h, w, tgt = leaves()
    g = torch.Generator().manual_seed(1)  # not the global RNG: xdist's test order moved it
    a = torch.randn(h.shape[0], dtype=h.dtype, generator=g)
    b = torch.randn(h.shape[0], dtype=h.dtype, generator=g)
    lp, ent = head_logprobs(h, w, tgt, temperature=temperature, with_entropy=True, chunk_tokens=8)
    lp_ref, ent_ref = reference(h, w, tgt, temperature)
    # the statistics are kept in fp32 whatever the input dtype: fp32 rounding, not more
    torch.testing.assert_close(lp, lp_ref.float(), rtol=0, atol=2e-6)
    torch.testing.assert_close(ent, ent_ref.float(), rtol=1e-5, atol=2e-6)
    loss = (lp * a).sum() + ((ent * b).sum() if entropy_term else 0)
    loss_ref = (lp_ref * a).sum() + ((ent_ref * b).sum() if entropy_term else 0)
    gh, gw = torch.autograd.grad(loss, (h, w))
    gh_ref, gw_ref = torch.autograd.grad(loss_ref, (h, w))
    for ours, ref in ((gh, gh_ref), (gw, gw_ref)):
        assert ours.dtype == ref.dtype
        # fp32 statistics: the entropy's gradient at temperature 0.6 reached 1.7e-5 of rounding
        # in 12 of 200 draws of a and b (the global RNG's, until a test run failed on one)
        torch.testing.assert_close(ours, ref, rtol=3e-5, atol=3e-5)
        assert ref.abs().max() > 0.1  # a real gradient, not two zeros


def test_without_entropy_returns_none_and_trains_only_what_requires_grad():
    h, w, tgt = leaves()
    w.requires_grad_(False)  # a frozen head (LoRA's base): no gradient computed for it
    lp, ent = head_logprobs(h, w, tgt, chunk_tokens=5)
    assert ent is None
    (gh,) = torch.autograd.grad(lp.sum(), (h,))
    (gh_ref,) = torch.autograd.grad(reference(h, w, tgt, 1.0)[0].sum(), (h,))
    torch.testing.assert_close(gh, gh_ref, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # the logprob pass: no graph, same numbers
        again, _ = head_logprobs(h, w, tgt, chunk_tokens=64)
    assert not again.requires_grad
    torch.testing.assert_close(again, lp.detach(), rtol=0, atol=1e-6)


def test_bf16_head_stays_close_to_fp32():
    h, w, tgt = leaves(n=64, hidden=32, vocab=300, dtype=torch.float32)
    lp32, ent32 = head_logprobs(h, w, tgt, with_entropy=True)
    lp16, ent16 = head_logprobs(h.bfloat16(), w.bfloat16(), tgt, with_entropy=True)
    assert lp16.dtype == torch.float32  # logprobs are fp32 whatever the model's dtype
    assert (lp16 - lp32).abs().mean() < 0.05
    assert (ent16 - ent32).abs().mean() < 0.05


def test_bad_arguments_are_refused():
    h, w, tgt = leaves()
    with pytest.raises(ValueError, match="unknown head kernel"):
        head_logprobs(h, w, tgt, kernel="cuda")
    with pytest.raises(ValueError, match="needs CUDA"):
        head_logprobs(h, w, tgt, kernel="triton")
    with pytest.raises(ValueError, match="temperature"):
        head_logprobs(h, w, tgt, temperature=0.0)


def test_triton_kernels_match_torch_in_the_interpreter():
    """The Triton kernels' arithmetic, run by Triton's CPU interpreter where triton is installed
    (the CUDA run is tests/gpu/test_learner_gpu.py). A fresh process: the interpreter must be
    chosen before triton is imported."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run(
        [sys.executable, "-c", INTERPRETED], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok"), out.stdout


INTERPRETED = """
import torch
ops_t, ops_r = vocab_head._triton_ops(), vocab_head._torch_ops(False)
g = torch.Generator().manual_seed(1)
rows, vocab = 5, 5000  # several stats blocks, one partial
for temperature in (1.0, 0.6):
    logits = torch.randn(rows, vocab, generator=g) * 3
    tgt = torch.randint(0, vocab, (rows,), generator=g)
    stats = []
    for ops in (ops_t, ops_r):
        out = [torch.empty(rows) for _ in range(3)]
        ops.stats(logits.clone(), tgt, temperature, *out)
        stats.append(out)
    for ours, ref in zip(*stats):
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=5e-5)
    _, lse, ent = stats[1]
    g_lp, g_ent = torch.randn(rows, generator=g), torch.randn(rows, generator=g)
    for ge in (g_ent, None):
        ours = ops_t.grad(logits.clone(), tgt, lse, ent, g_lp, ge, temperature)
        ref = ops_r.grad(logits.clone(), tgt, lse, ent, g_lp, ge, temperature)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
print("ok")
"""
