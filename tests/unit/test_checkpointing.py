"""learner.activation_checkpointing=auto: how many blocks are recomputed for the memory at hand
(agentrl/learner/memory.py), and that recomputing only some blocks changes nothing but memory."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from agentrl.learner import fsdp
from agentrl.learner.memory import block_activation_bytes, blocks_to_checkpoint

GIB = 1024**3
QWEN_1_5B = SimpleNamespace(
    hidden_size=1536, intermediate_size=8960, num_attention_heads=12, num_key_value_heads=2
)


class _LigerNorm(torch.autograd.Function):
    """Saves what liger-kernel 0.8.5's RMSNorm saves (ops/rms_norm.py: X and RSTD)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd)
        return (x.float() * rstd).to(x.dtype) * weight


class _LigerSwiGLU(torch.autograd.Function):
    """Saves what liger-kernel 0.8.5's SwiGLU saves (ops/swiglu.py: a and b)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.nn.functional.silu(a) * b


def saved_bytes_per_token(kernels: str, tokens: int = 256) -> float:
    """What one Qwen2.5-1.5B-shaped transformers block (bf16) keeps for backward, per token:
    every tensor autograd saves, its parameters, input and rotary tables aside."""
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

    cfg = Qwen2Config(**vars(QWEN_1_5B), num_hidden_layers=1, vocab_size=64)
    cfg._attn_implementation = "sdpa"
    block = Qwen2DecoderLayer(cfg, 0).to(torch.bfloat16)
    if kernels == "liger":
        for norm in (block.input_layernorm, block.post_attention_layernorm):
            norm.forward = lambda x, n=norm: _LigerNorm.apply(x, n.weight, n.variance_epsilon)
        mlp = block.mlp
        mlp.forward = lambda x: mlp.down_proj(_LigerSwiGLU.apply(mlp.gate_proj(x), mlp.up_proj(x)))
    x = torch.randn(1, tokens, cfg.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    pos = torch.arange(tokens)[None]
    cos, sin = Qwen2RotaryEmbedding(cfg)(x, pos)
    skip = {t.untyped_storage().data_ptr() for t in (x, cos, sin, *block.parameters())}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in skip:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, attention_mask=None, position_ids=pos, position_embeddings=(cos, sin))
    return sum(saved.values()) / tokens


@pytest.mark.parametrize("kernels", ["off", "liger"])
def test_block_bytes_estimate_covers_what_the_block_saves(kernels):
    """The estimate against the tensors a real block saves: torch's ops 104 KB, liger's 70 KB at
    1.5B. An H200 update that kept 23 of 28 eager blocks of 47k-token micro-batches ran out of
    memory at 113 GB of activations: 104.5 KB per token and kept block."""
    est = block_activation_bytes(QWEN_1_5B, kernels=kernels)
    measured = saved_bytes_per_token(kernels)
    assert measured <= est <= 1.05 * measured, (est, measured)
    if kernels == "off":
        assert est >= 104_000
    assert block_activation_bytes(QWEN_1_5B, 4, kernels) >= 2 * est - 1000


@pytest.mark.parametrize(
    ("tokens", "budget_gib", "expected"),
    [
        (16384, 50, 0),  # an H100 with the engine released: everything kept
        (16384, 20, "some"),  # half the room: part recomputed
        (32768, 30, "some"),
        (32768, 2, 28),  # a 32k episode in little room: all recomputed
        (16384, -5, 28),  # no room at all (the estimate went negative): all
        (0, 1, 0),  # an empty step
    ],
)
def test_blocks_to_checkpoint_fits_the_budget(tokens, budget_gib, expected):
    per, inp = block_activation_bytes(QWEN_1_5B), 2 * 1536
    k = blocks_to_checkpoint(28, tokens, per, inp, budget_gib * GIB)
    if expected == "some":
        assert 0 < k < 28
    else:
        assert k == expected
    if 0 < k < 28:  # the fewest that fit: one block fewer would not
        used = lambda k: tokens * per + (28 - k) * tokens * per + k * tokens * inp  # noqa: E731
        assert used(k) <= budget_gib * GIB + tokens * per
        assert used(k - 1) > budget_gib * GIB


def test_recomputing_some_blocks_gives_the_same_gradients():
    """On the installed transformers: set_checkpointed recomputes exactly the first k blocks (their
    forward runs again in backward) and the gradients are the same for k = 0, 1, all."""
    from transformers import AutoModelForCausalLM

    from agentrl.assets.build import cached_tiny_random

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(cached_tiny_random(), dtype=torch.float32)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    blocks = fsdp.blocks(model)
    calls = [0] * len(blocks)
    for i, b in enumerate(blocks):  # the block's MLP runs once per forward of the block's body
        b.mlp.register_forward_pre_hook(lambda *_a, i=i: calls.__setitem__(i, calls[i] + 1))
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    grads = {}
    for k in (0, 1, len(blocks)):
        fsdp.set_checkpointed(blocks, k)
        calls[:] = [0] * len(blocks)
        model.zero_grad()
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        # a recomputed block runs its forward a second time in backward
        assert calls == [2 if i < k else 1 for i in range(len(blocks))], (k, calls)
        grads[k] = [p.grad.clone() for p in model.parameters()]
    for k in (1, len(blocks)):
        for a, b in zip(grads[0], grads[k], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("head", ["causal_lm", "value_head"])
def test_the_workers_plan_reads_the_gpu_memory_it_is_given(head, monkeypatch):
    """The worker's per-step plan for a policy and for a critic (which has no vocabulary head),
    with the CUDA memory queries answering as a GPU would: all kept with room, all recomputed
    without."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    from agentrl.assets.build import cached_tiny_random
    from agentrl.learner import LearnerConfig
    from agentrl.learner.worker import LearnerWorker

    cls = AutoModelForCausalLM if head == "causal_lm" else AutoModelForTokenClassification
    extra = {} if head == "causal_lm" else {"num_labels": 1}
    model = cls.from_pretrained(cached_tiny_random(), dtype=torch.float32, **extra)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    blocks = fsdp.blocks(model)
    worker = SimpleNamespace(
        model=model, cfg=LearnerConfig(attention_layout="padded"), device=torch.device("cpu"),
        _ckpt_blocks=blocks, _block_bytes=block_activation_bytes(model.config),
        _block_input_bytes=2 * model.config.hidden_size, checkpointed_blocks=-1,
    )  # fmt: skip
    mb = SimpleNamespace(token_ids=torch.zeros(9, dtype=torch.long),
                         position_ids=torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 3]))  # fmt: skip
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    for free, expected in ((60 * GIB, 0), (0, len(blocks))):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None, f=free: (f, 80 * GIB))
        LearnerWorker._plan_checkpointing(worker, [mb])
        assert worker.checkpointed_blocks == expected
        assert [b.gradient_checkpointing for b in blocks] == [expected > 0] * len(blocks)
