"""The `direct` CUDA-IPC layout (agentrl/learner/ipc.py): which checkpoint tensors are fused into
which SGLang parameter, and the packing into one buffer (run here on CPU tensors)."""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from agentrl.learner.ipc import direct_groups, pack_direct
from agentrl.learner.sync.base import WeightSyncError
from agentrl.learner.sync.tensor import plan_packers


def test_groups_fuse_qkv_and_gate_up_in_sglang_order():
    attn = "model.layers.0.self_attn"
    mlp = "model.layers.0.mlp"
    names = [
        "model.embed_tokens.weight", f"{attn}.q_proj.weight", f"{attn}.q_proj.bias",
        f"{attn}.v_proj.weight", f"{attn}.k_proj.weight", f"{attn}.k_proj.bias",
        f"{attn}.v_proj.bias", f"{attn}.o_proj.weight", f"{mlp}.up_proj.weight",
        f"{mlp}.gate_proj.weight", f"{mlp}.down_proj.weight",
    ]  # fmt: skip
    assert direct_groups(names) == [
        ("model.embed_tokens.weight", ["model.embed_tokens.weight"]),
        (f"{attn}.qkv_proj.weight", [f"{attn}.{x}_proj.weight" for x in "qkv"]),
        (f"{attn}.qkv_proj.bias", [f"{attn}.{x}_proj.bias" for x in "qkv"]),
        (f"{attn}.o_proj.weight", [f"{attn}.o_proj.weight"]),
        (f"{mlp}.gate_up_proj.weight", [f"{mlp}.gate_proj.weight", f"{mlp}.up_proj.weight"]),
        (f"{mlp}.down_proj.weight", [f"{mlp}.down_proj.weight"]),
    ]


def test_checkpoint_already_fused_is_copied_as_is():
    name = "model.layers.0.self_attn.qkv_proj.weight"
    assert direct_groups([name]) == [(name, [name])]


def test_incomplete_group_is_an_error():
    with pytest.raises(ValueError, match="qkv_proj.weight: needs 3 parts"):
        direct_groups(["l.self_attn.q_proj.weight", "l.self_attn.k_proj.weight"])


def test_pack_is_one_buffer_of_concatenations():
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    tensors = {n: p.detach() for n, p in model.named_parameters()}
    groups = direct_groups(list(tensors))
    fp32 = {n: t.float() for n, t in tensors.items()}  # master weights; the engine wants bf16
    flat, views = pack_direct(fp32.__getitem__, groups, torch.bfloat16, "cpu")
    assert flat.numel() == sum(t.numel() for t in tensors.values())
    assert flat.dtype == torch.bfloat16
    lo, hi = flat.data_ptr(), flat.data_ptr() + flat.numel() * flat.element_size()
    for (target, names), (name, view) in zip(groups, views, strict=True):
        assert name == target and lo <= view.data_ptr() < hi
        assert torch.equal(view, torch.cat([tensors[n] for n in names]))
    qkv = dict(views)["model.layers.1.self_attn.qkv_proj.weight"]
    assert qkv.shape == ((4 + 2 + 2) * 8, 32)  # q heads + k heads + v heads, by head_dim


def test_direct_plan_keeps_groups_whole_and_vocab_apart():
    from agentrl.learner.fsdp import ParamSpec
    from agentrl.learner.sync import plan_direct

    cfg = Qwen3Config(vocab_size=779, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)  # fmt: skip
    model = Qwen3ForCausalLM(cfg)
    specs = [ParamSpec(n, tuple(p.shape), "bfloat16") for n, p in model.named_parameters()]
    layer_bytes = sum(s.nbytes for s in specs if ".layers.0." in s.name)
    buckets, groups = plan_direct(specs, bucket_mb=1.5 * layer_bytes / 2**20)
    assert groups[0] is None
    assert [s.name for s in buckets[0]] == ["model.embed_tokens.weight", "lm_head.weight"]
    assert sorted(s.name for b in buckets for s in b) == sorted(s.name for s in specs)
    for bucket, grp in zip(buckets[1:], groups[1:], strict=True):
        assert [s.name for s in bucket] == [n for _, names in grp for n in names]
    assert len(buckets) >= 3  # the size limit split the layers, never inside a fused group
    # a vocabulary the engine does not pad (a multiple of 64, like Qwen's) is copied directly
    cfg.vocab_size = 832
    specs = [ParamSpec(n, tuple(p.shape), "bfloat16")
             for n, p in Qwen3ForCausalLM(cfg).named_parameters()]  # fmt: skip
    buckets, groups = plan_direct(specs, bucket_mb=1.5 * layer_bytes / 2**20)
    assert None not in groups


def test_each_colocated_server_is_packed_for_by_the_learner_rank_on_its_gpu():
    """[server][TP rank] -> learner rank, by GPU id, whatever order Ray gave the ranks their GPUs;
    several servers see only their own GPUs, so one without a learner rank beside it is an error
    that names the setting; one server may still be served across GPUs (t mod world size)."""
    assert plan_packers([["0"], ["1"]], ["1", "0"], 1) == [[1], [0]]
    assert plan_packers([["4", "5"], ["6", "7"]], ["6", "4", "7", "5"], 2) == [[1, 3], [0, 2]]
    with pytest.raises(WeightSyncError, match=r"server 1 runs on GPU 1.*learner.num_workers=2"):
        plan_packers([["0"], ["1"]], ["0"], 1)
    assert plan_packers([["0", "1"]], ["3"], 2) == [[0, 0]]  # one server: as before


def test_bucket_size_auto_is_the_methods_own_and_a_number_wins():
    """weight_sync.bucket_mb=auto: the CUDA-IPC push sends the fewest buckets (each one a server
    request), the others keep 256 MB; a number given is used as is; 0 or less is refused."""
    from pydantic import ValidationError

    from agentrl.learner.sync import SYNC_METHODS
    from agentrl.learner.sync.base import WeightSyncConfig

    def size(method: str, bucket_mb: float | str = "auto") -> float:
        cfg = WeightSyncConfig(method=method, bucket_mb=bucket_mb)
        return SYNC_METHODS.get(method)(cfg, learner=None, engine=None).bucket_mb

    assert size("tensor") == 4096 and size("distributed") == 256 and size("disk") == 256
    assert size("tensor", 64) == 64 and size("distributed", "512") == 512
    for bad in (0, -1, "big"):
        with pytest.raises(ValidationError, match="bucket_mb"):
            WeightSyncConfig(bucket_mb=bad)
