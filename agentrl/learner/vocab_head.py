"""The learner's vocabulary head: per-token logprobs (and entropies) of the chosen tokens from the
final hidden states, without ever keeping [N, V] logits, forward or backward.

Legend: N selected tokens, H hidden, V vocab, C tokens of one chunk.

    lp_N, ent_N = head_logprobs(h_NH, w_VH, tgt_N, temperature=1.0, with_entropy=False,
                                kernel="triton")

Forward, per chunk of C rows: logits = h @ w.T in the model's dtype (fp32 accumulation), then one
pass of softmax statistics per row in fp32 (logsumexp, the target's logit, sum p*x); saved for
backward are h, the ids and three numbers per row. Backward recomputes each chunk's logits (one
matmul) and turns them into d loss/d logits in one elementwise pass,

    g_x = g_lp * (onehot - p) - g_ent * p * (log p + H)      x = logits / T, p = softmax(x)

then d/dh = (g_x / T) @ w and d/dw += (g_x / T).T @ h (accumulated over the chunks in w's dtype,
as autograd does with the checkpointed chunks). Against autograd through checkpointed chunks that
is one softmax pass instead of two in forward + recompute, and no gather/scatter backward, no
[C, V] fp32 temporaries beyond the one the torch kernel uses.

kernel: "triton" (two Triton kernels: one row-streaming statistics pass, one gradient pass written
in place over the recomputed logits; CUDA) or "torch" (the same math in torch ops, any device;
`compiled` runs it through torch.compile).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

KERNELS = ("triton", "torch")


def head_logprobs(
    h_NH: Tensor,
    w_VH: Tensor,
    tgt_N: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    kernel: str = "torch",
    chunk_tokens: int | None = None,
    compiled: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """log p(tgt[n] | h[n]) [N] fp32 and, with `with_entropy`, the entropies [N] of the rows'
    distributions at `temperature`. Differentiable in h and w (a custom autograd function).
    `chunk_tokens`: rows per [C, V] logits block (default 512 for torch, whose fp32 temporaries
    are 4x the block; 2048 for triton, which streams the block once in its own dtype)."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown head kernel {kernel!r}; use one of {KERNELS}")
    if kernel == "triton" and not h_NH.is_cuda:
        raise ValueError("the triton head kernel needs CUDA tensors; use kernel='torch'")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    ops = _triton_ops() if kernel == "triton" else _torch_ops(compiled)
    chunk = chunk_tokens or (2048 if kernel == "triton" else 512)
    lp, ent = _HeadLogprobs.apply(
        h_NH, w_VH, tgt_N, float(temperature), bool(with_entropy), ops, int(chunk)
    )
    return lp, (ent if with_entropy else None)


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


# ---------------------------------------------------------------------------------------------
# The autograd function (kernel-agnostic)


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, tgt, temperature, with_entropy, ops, chunk):  # type: ignore[override]
        n = h.shape[0]
        lp = torch.empty(n, dtype=torch.float32, device=h.device)
        lse = torch.empty_like(lp)
        ent = torch.empty_like(lp) if with_entropy else lp.new_zeros(0)
        for c in range(0, n, chunk):
            s = slice(c, c + chunk)
            logits = F.linear(h[s], w)
            ops.stats(logits, tgt[s], temperature, lp[s], lse[s], ent[s] if with_entropy else None)
        ctx.save_for_backward(h, w, tgt, lse, ent)
        ctx.temperature, ctx.with_entropy, ctx.ops, ctx.chunk = (
            temperature,
            with_entropy,
            ops,
            chunk,
        )
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):  # type: ignore[override]
        h, w, tgt, lse, ent = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (need_h or need_w):
            return (None,) * 7
        n = h.shape[0]
        g_lp = g_lp.float() if g_lp is not None else lse.new_zeros(n)
        g_ent = g_ent.float() if (ctx.with_entropy and g_ent is not None) else None
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros_like(w) if need_w else None
        for c in range(0, n, ctx.chunk):
            s = slice(c, c + ctx.chunk)
            logits = F.linear(h[s], w)
            g = ctx.ops.grad(  # d loss / d logits, in the logits' dtype (may reuse their memory)
                logits, tgt[s], lse[s], ent[s] if g_ent is not None else None,
                g_lp[s], g_ent[s] if g_ent is not None else None, ctx.temperature,
            )  # fmt: skip
            if need_h:
                torch.mm(g, w, out=grad_h[s])
            if need_w:
                grad_w.addmm_(g.t(), h[s])
        return grad_h, grad_w, None, None, None, None, None


class _Ops:
    """A kernel: `stats` fills lp, lse (and ent) of a chunk's rows in place; `grad` returns
    d loss/d logits of the chunk."""

    def __init__(self, stats: Callable, grad: Callable) -> None:
        self.stats, self.grad = stats, grad


# ---------------------------------------------------------------------------------------------
# torch kernel


def _torch_stats(logits, tgt, temperature, lp_out, lse_out, ent_out) -> None:
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    lse = torch.logsumexp(x, dim=-1)
    lse_out.copy_(lse)
    lp_out.copy_(x.gather(-1, tgt[:, None]).squeeze(-1) - lse)
    if ent_out is not None:
        ent_out.copy_(lse - (torch.softmax(x, dim=-1) * x).sum(-1))


def _torch_grad(logits, tgt, lse, ent, g_lp, g_ent, temperature) -> Tensor:
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    logp = x - lse[:, None]
    p = logp.exp()
    g = p * -g_lp[:, None]
    if g_ent is not None:
        g = g - g_ent[:, None] * p * (logp + ent[:, None])
    g.scatter_add_(-1, tgt[:, None], g_lp[:, None])
    if temperature != 1.0:
        g = g / temperature
    return g.to(logits.dtype)


@functools.cache
def _torch_ops(compiled: bool) -> _Ops:
    if not compiled:
        return _Ops(_torch_stats, _torch_grad)

    def stats(logits, tgt, temperature, lp_out, lse_out, ent_out):
        out = _compiled_stats(logits, tgt, temperature, ent_out is not None)
        lp_out.copy_(out[0])
        lse_out.copy_(out[1])
        if ent_out is not None:
            ent_out.copy_(out[2])

    return _Ops(stats, torch.compile(_torch_grad, dynamic=True))


@functools.cache
def _compiled_stats_fn() -> Callable:
    def stats(logits, tgt, temperature, with_entropy):
        x = logits.float() / temperature
        lse = torch.logsumexp(x, dim=-1)
        lp = x.gather(-1, tgt[:, None]).squeeze(-1) - lse
        ent = lse - (torch.softmax(x, dim=-1) * x).sum(-1) if with_entropy else lse
        return lp, lse, ent

    return torch.compile(stats, dynamic=True)


def _compiled_stats(logits, tgt, temperature, with_entropy):
    return _compiled_stats_fn()(logits, tgt, temperature, with_entropy)


# ---------------------------------------------------------------------------------------------
# Triton kernel


@functools.cache
def _triton_ops() -> _Ops:
    """The Triton kernels, compiled on first use (triton is imported here, not at import)."""
    return _Ops(_triton_stats(), _triton_grad())


def _triton_stats() -> Callable:
    import triton
    import triton.language as tl

    @triton.jit
    def stats_kernel(
        logits_ptr, tgt_ptr, lp_ptr, lse_ptr, ent_ptr, V, stride, inv_t,
        WITH_ENT: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        # one program per row: an online (max, sum exp, sum exp*x) over the row, per lane
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * stride
        m = tl.full([BLOCK], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        t = tl.zeros([BLOCK], tl.float32)
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < V
            x = tl.load(base + cols, mask=mask, other=float("-inf")).to(tl.float32) * inv_t
            m_new = tl.maximum(m, x)
            scale = tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new))
            e = tl.where(mask, tl.exp(x - m_new), 0.0)
            s = s * scale + e
            if WITH_ENT:
                t = t * scale + e * tl.where(mask, x, 0.0)
            m = m_new
        big = tl.max(m, 0)
        w = tl.where(m == float("-inf"), 0.0, tl.exp(m - big))
        total = tl.sum(s * w, 0)
        lse = big + tl.log(total)
        tgt = tl.load(tgt_ptr + row)
        x_t = tl.load(base + tgt).to(tl.float32) * inv_t
        tl.store(lse_ptr + row, lse)
        tl.store(lp_ptr + row, x_t - lse)
        if WITH_ENT:
            tl.store(ent_ptr + row, lse - tl.sum(t * w, 0) / total)

    stats_block = 2048

    def stats(logits, tgt, temperature, lp_out, lse_out, ent_out):
        rows, v = logits.shape
        if rows == 0:
            return
        with_ent = ent_out is not None
        stats_kernel[(rows,)](
            logits, tgt, lp_out, lse_out, ent_out if with_ent else lse_out, v, logits.stride(0),
            1.0 / temperature, WITH_ENT=with_ent, BLOCK=stats_block, num_warps=8,
        )  # fmt: skip

    return stats


def _triton_grad() -> Callable:
    import triton
    import triton.language as tl

    @triton.jit
    def grad_kernel(
        logits_ptr, tgt_ptr, lse_ptr, ent_ptr, glp_ptr, gent_ptr, V, stride, inv_t,
        WITH_ENT: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        # one program per (row, block of columns); writes d loss/d logits over the logits
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < V
        ptr = logits_ptr + row * stride + cols
        x = tl.load(ptr, mask=mask, other=0.0).to(tl.float32) * inv_t
        logp = x - tl.load(lse_ptr + row)
        p = tl.exp(logp)
        g_lp = tl.load(glp_ptr + row)
        g = -g_lp * p
        if WITH_ENT:
            g -= tl.load(gent_ptr + row) * p * (logp + tl.load(ent_ptr + row))
        g = tl.where(cols == tl.load(tgt_ptr + row), g + g_lp, g)
        tl.store(ptr, (g * inv_t).to(logits_ptr.dtype.element_ty), mask=mask)

    grad_block = 4096

    def grad(logits, tgt, lse, ent, g_lp, g_ent, temperature):
        rows, v = logits.shape
        if rows == 0:
            return logits
        logits = logits.contiguous()
        with_ent = g_ent is not None
        grad_kernel[(rows, triton.cdiv(v, grad_block))](
            logits, tgt, lse, ent if with_ent else lse, g_lp.contiguous(),
            g_ent.contiguous() if with_ent else g_lp, v, logits.stride(0), 1.0 / temperature,
            WITH_ENT=with_ent, BLOCK=grad_block, num_warps=8,
        )  # fmt: skip
        return logits

    return grad
