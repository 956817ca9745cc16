"""The tensor-parallel shard plan (agentrl/learner/tp.py) against SGLang's layout rules: every
element of every parameter lands on the ranks that hold it, once per copy SGLang keeps; each
rank's fused tensors have SGLang's per-rank shapes; and the ranks' shards put together give back
the full fused weights."""

from __future__ import annotations

import pytest
import torch

from agentrl.learner.tp import Heads, Piece, pack, plan_tp, shard

# Qwen2.5-1.5B's shapes (12 query heads, 2 key/value heads of 128, intermediate 8960), two layers,
# a vocabulary that is not a multiple of 64 (151,936 is; 151,900 exercises the padding)
H, K, D, HID, INTER, VOCAB = 12, 2, 128, 1536, 8960, 151_900
HEADS = Heads(H, K, D)


def shapes(bias: bool = True) -> list[tuple[str, tuple[int, ...]]]:
    out = [("model.embed_tokens.weight", (VOCAB, HID)), ("model.norm.weight", (HID,)),
           ("lm_head.weight", (VOCAB, HID))]  # fmt: skip
    for i in range(2):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (H * D, HID)),
            (p + "self_attn.k_proj.weight", (K * D, HID)),
            (p + "self_attn.v_proj.weight", (K * D, HID)),
            (p + "self_attn.o_proj.weight", (HID, H * D)),
            (p + "mlp.gate_proj.weight", (INTER, HID)),
            (p + "mlp.up_proj.weight", (INTER, HID)),
            (p + "mlp.down_proj.weight", (HID, INTER)),
            (p + "input_layernorm.weight", (HID,)),
            (p + "post_attention_layernorm.weight", (HID,)),
        ]
        if bias:
            out += [(p + f"self_attn.{m}.bias", (n * D,)) for m, n in (("q_proj", H),
                    ("k_proj", K), ("v_proj", K))]  # fmt: skip
    return out


# small real tensors: 4 query heads and 2 key/value heads of 3, a 10-row vocabulary (padded to 64)
SMALL_HEADS = Heads(4, 2, 3)
SMALL = [("model.embed_tokens.weight", (10, 6)),
         ("model.layers.0.self_attn.q_proj.weight", (12, 6)),
         ("model.layers.0.self_attn.k_proj.weight", (6, 6)),
         ("model.layers.0.self_attn.v_proj.weight", (6, 6)),
         ("model.layers.0.self_attn.o_proj.weight", (6, 12)),
         ("model.layers.0.mlp.gate_proj.weight", (8, 6)),
         ("model.layers.0.mlp.up_proj.weight", (8, 6)),
         ("model.layers.0.mlp.down_proj.weight", (6, 8))]  # fmt: skip


def copies(name: str, tp: int) -> int:
    """How many ranks SGLang keeps each element of `name` on."""
    module = name.split(".")[-2]
    if module in ("k_proj", "v_proj"):
        return max(1, tp // K)
    if module.endswith("norm") or module == "norm":
        return tp
    return 1


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_every_parameter_is_covered_once_per_copy(tp):
    plan = plan_tp(shapes(), tp, HEADS)
    assert len(plan) == tp
    for name, shape in shapes():
        dim = 1 if name.split(".")[-2] in ("o_proj", "down_proj") else 0
        hits = torch.zeros(shape[dim], dtype=torch.int64)
        for pieces in plan:
            for p in (p for p in pieces if p.source == name):
                assert p.dim == dim
                hits[p.start : p.stop] += 1
        assert bool((hits == copies(name, tp)).all()), (name, tp, hits.unique())


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_each_rank_has_sglangs_per_rank_shapes_without_gaps(tp):
    plan = plan_tp(shapes(), tp, HEADS)
    kv_heads = max(1, K // tp)
    padded = -(-VOCAB // 64) * 64
    want = {
        "model.layers.0.self_attn.qkv_proj.weight": (H // tp + 2 * kv_heads) * D,
        "model.layers.0.self_attn.qkv_proj.bias": (H // tp + 2 * kv_heads) * D,
        "model.layers.0.mlp.gate_up_proj.weight": 2 * INTER // tp,
        "model.layers.0.self_attn.o_proj.weight": H * D // tp,
        "model.layers.0.mlp.down_proj.weight": INTER // tp,
        "model.embed_tokens.weight": padded // tp,
        "model.norm.weight": HID,
    }
    for pieces in plan:
        for target, size in want.items():
            mine = sorted((p.offset, p.stop - p.start) for p in pieces if p.target == target)
            assert {p.target_size for p in pieces if p.target == target} == {size}
            at = 0
            for offset, n in mine:  # contiguous, in order, no overlap
                assert offset == at
                at += n
            pad = target == "model.embed_tokens.weight"
            assert at == size or (pad and at <= size), (target, at, size)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_shards_put_together_give_the_full_fused_weights(tp):
    """Small shapes, real tensors: rank shards concatenated along their split dim equal the TP=1
    fused tensors (q|k|v per rank becomes q|k|v whole once the head groups are put back)."""
    heads, small = SMALL_HEADS, SMALL
    g = torch.Generator().manual_seed(0)
    full = {n: torch.randn(s, generator=g) for n, s in small}
    shards = [shard(full, pieces) for pieces in plan_tp(small, tp, heads)]
    attn, mlp = "model.layers.0.self_attn.", "model.layers.0.mlp."
    q_rows, kv_rows = 12 // tp, 6 // min(tp, 2)
    qs = [s[attn + "qkv_proj.weight"][:q_rows] for s in shards]
    ks = [s[attn + "qkv_proj.weight"][q_rows : q_rows + kv_rows] for s in shards]
    assert torch.equal(torch.cat(qs), full[attn + "q_proj.weight"])
    distinct_k = ks[:: max(1, tp // 2)]  # tp=4: two ranks share each kv head
    assert torch.equal(torch.cat(distinct_k), full[attn + "k_proj.weight"])
    gate = torch.cat([s[mlp + "gate_up_proj.weight"][: 8 // tp] for s in shards])
    assert torch.equal(gate, full[mlp + "gate_proj.weight"])
    down = torch.cat([s[mlp + "down_proj.weight"] for s in shards], dim=1)
    assert torch.equal(down, full[mlp + "down_proj.weight"])
    emb = torch.cat([s["model.embed_tokens.weight"] for s in shards])  # 10 rows padded to 64
    assert emb.shape[0] == 64 and torch.equal(emb[:10], full["model.embed_tokens.weight"])
    assert not emb[10:].any()


def test_a_tp_that_does_not_divide_the_heads_is_refused():
    with pytest.raises(ValueError, match="engine.tp=3"):
        plan_tp(shapes(), 3, HEADS)
    with pytest.raises(ValueError, match="needs"):
        plan_tp([("model.layers.0.mlp.gate_proj.weight", (8, 6))], 2, HEADS)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_pack_is_the_shards_in_one_buffer(tp):
    """What the colocated push sends a TP rank: the rank's shards as views of one flat buffer,
    cast once, the vocabulary's padding rows zeroed even where the buffer held garbage."""
    heads, small = SMALL_HEADS, [*SMALL, ("model.norm.weight", (6,))]
    g = torch.Generator().manual_seed(1)
    full = {n: torch.randn(s, generator=g) for n, s in small}
    torch.full((4096,), float("nan")).sum()  # leave garbage around for torch.empty to find
    for pieces in plan_tp(small, tp, heads):
        flat, views = pack(full.__getitem__, pieces, torch.bfloat16, "cpu")
        want = shard(full, pieces)
        assert [n for n, _ in views] == list(want)
        assert flat.numel() == sum(v.numel() for _, v in views)
        for name, view in views:
            assert view.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
            assert torch.equal(view, want[name].to(torch.bfloat16)), name


def test_pack_refuses_pieces_that_leave_a_hole():
    piece = Piece("a", "a", 0, 0, 2, 1, 3)  # rows land at 1, leaving row 0 unwritten
    with pytest.raises(ValueError, match="in order"):
        pack({"a": torch.zeros(4, 2)}.__getitem__, [piece], torch.float32, "cpu")
