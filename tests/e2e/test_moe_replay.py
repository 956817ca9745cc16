"""A mixture-of-experts model trains end to end, with and without routing replay
(learner.routing_replay, R3): a tiny random Qwen3-MoE (8 experts, 2 per token, grouped expert
matmuls) on the synthetic env (two turns of any text, a seeded
random reward: groups with variance), sampled by the dev server in bf16 and trained in fp32 on CPU, so the two forwards route
some tokens to different experts. With replay the engine returns each position's experts
(return_routed_experts, SGLang's wire format) and the learner's routers keep them: the trainer's
logprobs of the sampled tokens move closer to the engine's (train/logprob_diff)."""

import asyncio

import pytest

from agentrl.assets.build import cached_tiny_moe
from agentrl.config import compose
from agentrl.train import train

ENV = "agentrl.envs.synthetic.FixedLengthEnv"  # any text, two turns, a seeded random reward
pytestmark = pytest.mark.usefixtures("shared_ray")  # one Ray for the module's runs (conftest)


def run(tmp_path, replay: bool) -> list[dict]:
    cfg = compose([f"model.path={cached_tiny_moe()}", "env=custom", f"env._target_={ENV}",
                   "env.tasks.n=16", "env.args.turns=2", "trainer.steps=1",
                   "trainer.deterministic=true", "trainer.tasks_per_step=2", "rollout.group_size=4",
                   "rollout.max_new_tokens=16", "engine.extra_args=[--dtype,bfloat16]", "logging=local",
                   f"learner.routing_replay={str(replay).lower()}", "learner.lr=1e-4",
                   f"checkpoint.dir={tmp_path}/ckpt{int(replay)}"])  # fmt: skip
    return asyncio.run(train(cfg, tmp_path / f"out{int(replay)}"))


def test_a_moe_model_trains_and_replay_closes_the_logprob_gap(tmp_path):
    without, with_replay = run(tmp_path, False), run(tmp_path, True)
    gaps = [[h["train/logprob_diff"] for h in hist] for hist in (without, with_replay)]
    print("train/logprob_diff without replay", gaps[0], "with", gaps[1])
    for hist in (without, with_replay):
        assert len(hist) == 1 and all(h["train/skipped"] == 0 for h in hist)
        assert all(h["train/grad_norm"] > 0 for h in hist)
    # the engine returned the experts of every position it computed: all ids but the last
    assert "rollout/routed_positions" not in without[0]
    assert with_replay[0]["rollout/routed_positions"] == with_replay[0]["rollout/tokens"] - 8
    # step 1: the same draws (seeded) and weights, so the engine's logprobs are the same; the
    # learner's change only after a position whose experts replay replaced. (Here the bf16 engine
    # and the fp32 learner route about 1% of token-layers differently; the rest of the gap is
    # bf16 rounding, which replay cannot remove.)
    assert without[0]["rollout/sampled_tokens"] == with_replay[0]["rollout/sampled_tokens"]
    assert gaps[1][0] <= gaps[0][0]
    # the checkpoint is in the hub's layout (experts one by one, as SGLang and vLLM load them),
    # not the learner's fused parameters; transformers loads it back into the fused ones
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    ckpt = tmp_path / "ckpt1" / (tmp_path / "ckpt1" / "latest").read_text().strip() / "policy"
    names: set[str] = set()
    for f in (ckpt / "model").glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            names |= set(st.keys())
    assert "model.layers.1.mlp.experts.7.up_proj.weight" in names
    assert not any(n.endswith(("experts.gate_up_proj", "experts.down_proj")) for n in names)
    assert AutoModelForCausalLM.from_pretrained(ckpt / "model").model.layers[1].mlp.experts
