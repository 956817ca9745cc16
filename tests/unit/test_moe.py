"""Routing replay's parts (agentrl/moe.py) on a small random Qwen3-MoE: routes read in one forward,
replayed exactly, another route changes the output and still trains the router; the wire form
(SGLang's base64 int32) round-trips; a batch carries the routes to the learner's token order."""

import numpy as np
import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from agentrl import moe
from agentrl.assets.build import cached_tiny_moe
from agentrl.batch import TrainBatch, padding_micro_batch, select
from agentrl.engine.protocol import encode_routed_experts, routed_experts
from agentrl.learner.forward import routes_in_order
from agentrl.types import FinishReason, Message, StopReason, Trajectory, Turn


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=300, hidden_size=32, intermediate_size=64,
                         moe_intermediate_size=16, num_experts=6, num_experts_per_tok=2,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, decoder_sparse_step=1, norm_topk_prob=True)  # fmt: skip
    m = Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in m.model.layers:
            layer.mlp.gate.weight.normal_(0, 0.5)
    return m


def test_routes_replay_exactly_and_other_routes_still_train_the_router(model):
    ids = list(range(10, 50))
    routes = moe.routes_of(model, ids)
    assert routes.shape == (40, 3 * 2) and moe.top_k(model) == (3, 2)
    x = torch.tensor([ids])
    with torch.no_grad():
        base = model(x).logits
        with moe.replay(model, routes):
            again = model(x).logits
        other = routes.clone()
        other[:, 0] = torch.where(other[:, 1] == (other[:, 0] + 1) % 6, other[:, 0] + 2,
                                  other[:, 0] + 1) % 6  # fmt: skip
        with moe.replay(model, other):
            moved = model(x).logits
        mixed = other.clone()
        mixed[20:] = -1  # unknown from position 20 on: the router's own experts
        with moe.replay(model, mixed):
            half = model(x).logits
    assert torch.allclose(base, again, atol=1e-5)
    assert (base - moved).abs().max() > 1e-3
    assert torch.allclose(half[0, :20], moved[0, :20], atol=1e-5)
    model.zero_grad()
    with moe.replay(model, other):
        model(x).logits.logsumexp(-1).mean().backward()
    assert model.model.layers[0].mlp.gate.weight.grad.abs().sum() > 0
    with (
        pytest.raises(ValueError, match="3 MoE layers x 2 experts"),
        moe.replay(model, routes[:, :4]),
    ):
        pass


def test_the_wire_form_round_trips():
    ids = np.arange(24, dtype=np.int32).reshape(4, 6)
    assert routed_experts(encode_routed_experts(ids)).tolist() == ids.ravel().tolist()
    assert routed_experts(None) is None


def _traj(n: int, routes) -> Trajectory:
    turn = Turn(start=2, end=n, obs_end=n, weight_version="0", finish_reason=FinishReason.STOP,
                assistant=Message(role="assistant"))  # fmt: skip
    return Trajectory("t", 0, list(range(n)), [0, 0] + [1] * (n - 2), [0.0] * n, 2, [turn], [],
                      StopReason.COMPLETED, routes=routes)  # fmt: skip


def test_a_batch_carries_routes_in_the_learners_token_order():
    a = _traj(5, np.arange(16, dtype=np.int32).reshape(4, 4))  # all but the last id routed
    b = _traj(3, None)  # no routes: -1, its tokens routed by the learner's own routers
    batch = TrainBatch.from_trajectories([a, b], None)
    assert batch.routes.shape == (8, 4)
    assert batch.routes[:4].flatten().tolist() == list(range(16))
    assert (batch.routes[4:] == -1).all()
    assert (select(batch, [1]).routes == -1).all()
    assert padding_micro_batch(batch).routes.tolist() == [[-1] * 4]
    padded = routes_in_order(batch, "padded")  # rows of width 5: b's row is padded
    assert padded.shape == (10, 4) and (padded[5:] == -1).all()
    assert padded[:4].flatten().tolist() == list(range(16))
    assert routes_in_order(batch, "packed") is batch.routes


def test_replay_on_a_dense_model_is_refused_before_the_start():
    from agentrl.config import compose, training_checks
    from agentrl.types import ConfigError

    with pytest.raises(ConfigError, match="not a mixture-of-experts model"):
        training_checks(compose(["learner.routing_replay=true"]))


def test_expert_weights_go_out_in_a_checkpoints_layout_and_come_back(tmp_path):
    """transformers' fused experts split into the per-expert tensors of the model's own
    checkpoint (what SGLang's loader reads), stacked back exactly; the direct push names
    SGLang's fused-MoE parameters; dense names pass through."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from agentrl.learner import ipc

    path = cached_tiny_moe()
    files = load_file(str(path / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(path)
    state = model.state_dict()
    split = dict(moe.to_checkpoint(state.items()))
    assert set(split) == set(files) | {"lm_head.weight"}  # the tied head is not in the file
    assert all(torch.equal(split[k], files[k]) for k in files)
    back = moe.from_checkpoint(files, state)
    assert all(torch.equal(back[k], state[k]) for k in back) and set(state) - set(back) == {
        "lm_head.weight"
    }
    fused = "model.layers.0.mlp.experts.gate_up_proj"
    assert moe.checkpoint_shapes(fused, tuple(state[fused].shape))[0] == (
        "model.layers.0.mlp.experts.0.gate_proj.weight",
        tuple(files["model.layers.0.mlp.experts.0.gate_proj.weight"].shape),
    )
    groups = dict(ipc.direct_groups([fused, "model.layers.0.mlp.experts.down_proj"]))
    assert groups == {"model.layers.0.mlp.experts.w13_weight": [fused],
                      "model.layers.0.mlp.experts.w2_weight": ["model.layers.0.mlp.experts.down_proj"]}  # fmt: skip
    del files["model.layers.1.mlp.experts.3.up_proj.weight"]
    with pytest.raises(ValueError, match="experts.3.up_proj"):
        moe.from_checkpoint(files, state)


def test_a_moe_model_at_tp_above_one_is_pushed_as_flattened_buckets():
    from agentrl.learner.fsdp import ParamSpec
    from agentrl.learner.sync.base import WeightSyncError
    from agentrl.learner.sync.tensor import load_format

    dense = [ParamSpec("model.layers.0.mlp.gate_proj.weight", (8, 4), "bfloat16")]
    sparse = [*dense, ParamSpec("model.layers.0.mlp.experts.gate_up_proj", (2, 8, 4), "bfloat16")]
    assert load_format("auto", 2, dense) == "auto" and load_format("auto", 1, sparse) == "auto"
    assert load_format("auto", 2, sparse) == "flattened_bucket"
    with pytest.raises(WeightSyncError, match="tp > 1"):
        load_format("direct", 2, sparse)


def test_sglang_is_not_started_on_a_tied_moe_head_it_would_never_load(tmp_path):
    """SGLang's Qwen3-MoE builds its own output head: a checkpoint that ties it to the embedding
    (no lm_head.weight in its files) is refused before any server starts (an H100 run served it
    0.26 per token from the trainer's logprobs); its own head, or a dense model, starts."""
    from agentrl.assets.build import build_tiny_moe, cached_tiny_random
    from agentrl.engine.checks import check_head_loads
    from agentrl.types import ConfigError

    with pytest.raises(ConfigError, match="tie_word_embeddings=true and no lm_head.weight"):
        check_head_loads(cached_tiny_moe())
    check_head_loads(build_tiny_moe(tmp_path / "untied", tied=False))
    check_head_loads(cached_tiny_random())  # a tied dense Qwen3: SGLang ties its head
    check_head_loads(tmp_path / "not-a-checkpoint")  # left to SGLang
