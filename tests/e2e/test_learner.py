"""The FSDP2 learner on Ray (gloo, CPU) with the tiny Qwen3: 2 ranks == 1 rank, NaN steps are
skipped, checkpoints round-trip (also onto another world size), reference/critic roles, and Ray
listens on loopback only."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.batch import TrainBatch, global_norm, micro_batches
from agentrl.learner import LearnerConfig, LearnerError, RayConfig
from agentrl.learner.forward import token_logprobs
from agentrl.learner.fsdp import ParamSpec, plan_buckets
from agentrl.learner.group import LearnerGroup
from agentrl.learner.optim import lr_factor
from agentrl.learner.ray_start import listening_sockets, start_ray
from agentrl.loss import LossConfig

PPO = LossConfig(name="ppo_clip")
# eps=1e-3 keeps Adam's first update smooth in the gradient (lr * g / (|g| + eps)), so a 1e-6
# gradient difference moves a parameter by at most ~1e-6 * lr / eps, not up to lr.
CFG = dict(lr=1e-3, eps=1e-3, grad_clip=0.0)


def make_batch(seed: int = 0, n_seqs: int = 5) -> TrainBatch:
    """Sequences of 6..19 random ids; the tail of each (after a random prompt) is trainable."""
    g = torch.Generator().manual_seed(seed)
    ids, mask, seq = [], [], []
    for s in range(n_seqs):
        n = int(torch.randint(6, 20, (1,), generator=g))
        p = int(torch.randint(2, n - 2, (1,), generator=g))
        ids.append(torch.randint(0, 5000, (n,), generator=g))
        m = torch.zeros(n, dtype=torch.bool)
        m[p:] = True
        mask.append(m)
        seq.append(torch.full((n,), s))
    ids_N, mask_N, seq_N = torch.cat(ids), torch.cat(mask), torch.cat(seq)
    n = ids_N.numel()
    pos = torch.cat([torch.arange(int((seq_N == s).sum())) for s in range(n_seqs)])
    old = torch.where(mask_N, -torch.rand(n, generator=g) * 5 - 8, 0.0)
    adv = torch.where(mask_N, torch.randn(n, generator=g), 0.0)
    # the trainer's recomputed logprobs (the ratio's denominator) agree with the engine's here
    return TrainBatch(ids_N, pos, mask_N, old, adv, seq_N, global_norm(mask_N, seq_N),
                      trainer_old_logprobs=old)  # fmt: skip


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def ray_up(_ray_session):
    """The e2e tests' shared Ray (conftest), left running for the next module's runs."""
    start_ray(RayConfig())


@pytest.fixture(scope="module")
def groups(ray_up, tiny_model_dir):
    one = LearnerGroup(LearnerConfig(model_path=str(tiny_model_dir), num_workers=1, **CFG))
    two = LearnerGroup(LearnerConfig(model_path=str(tiny_model_dir), num_workers=2, **CFG))
    # the checkpoint's host buffers reserved before the first step, as the trainer does at
    # start-up (pinned on GPUs: pinning inside the first save blocked training 15.6 s at 1.5B),
    # while the optimizer has no state: the AdamW moments are predicted from the shards, under
    # the keys the save copies them to (the first test's background save allocates nothing)
    two.prepare_checkpoint()
    yield one, two
    one.shutdown()
    two.shutdown()


def test_two_ranks_match_one_rank_then_skip_nan_then_checkpoint(groups, tmp_path: Path) -> None:
    one, two = groups
    batch = make_batch()
    mbs1 = micro_batches(batch, dp_size=1, max_tokens=24)
    mbs2 = micro_batches(batch, dp_size=2, max_tokens=24)
    assert len(mbs2[0]) == len(mbs2[1]) and len(mbs1[0]) != len(mbs2[0])  # uneven splits

    # Same loss and gradients: the ranks' loss shares add up to the 1-rank loss.
    loss1 = sum(one.accumulate_grads(mbs1, "ppo_clip", PPO))
    loss2 = sum(two.accumulate_grads(mbs2, "ppo_clip", PPO))
    grads1, grads2 = one.full_grads(), two.full_grads()
    one.zero_grad()
    two.zero_grad()
    assert loss1 == pytest.approx(loss2, abs=1e-6)
    assert len(grads1) == 24 and max(g.abs().max().item() for g in grads1.values()) > 0.1
    assert max_diff(grads1, grads2) < 1e-5

    # Same update.
    before = one.full_state()
    m1 = one.train_step(mbs1, "ppo_clip", PPO)
    m2 = two.train_step(mbs2, "ppo_clip", PPO)
    assert m1["policy/loss"] == pytest.approx(loss1, abs=1e-6)
    assert m2["policy/loss"] == pytest.approx(loss1, abs=1e-6)
    assert m1["policy/grad_norm"] == pytest.approx(m2["policy/grad_norm"], rel=1e-5)
    assert m2["policy/tokens"] == batch.loss_mask.sum().item() and m2["policy/skipped"] == 0
    after1, after2 = one.full_state(), two.full_state()
    assert max_diff(before, after1) > 5e-4  # the step moved the weights (lr 1e-3)
    assert max_diff(after1, after2) < 2e-6

    # A NaN in one rank's data: every rank skips the step, weights and lr schedule stay.
    poisoned = mbs2[1][0].replace(advantages=torch.full_like(mbs2[1][0].advantages, float("nan")))
    m = two.train_step([mbs2[0], [poisoned, *mbs2[1][1:]]], "ppo_clip", PPO)
    assert m["policy/skipped"] == 1.0 and m["policy/lr"] == m2["policy/lr"]
    assert max_diff(after2, two.full_state()) == 0.0

    # Checkpoint (sharded optimizer), step again, reload, step again: the same weights.
    ckpt = tmp_path / "ckpt"
    two.save_checkpoint(str(ckpt))
    assert (ckpt / "model" / "config.json").exists() and (ckpt / "optim" / ".metadata").exists()
    batch2 = make_batch(seed=1)
    two.train_step(micro_batches(batch2, 2, 24), "ppo_clip", PPO)
    expected = two.full_state()
    two.load_checkpoint(str(ckpt))
    assert max_diff(two.full_state(), after2) == 0.0
    two.train_step(micro_batches(batch2, 2, 24), "ppo_clip", PPO)
    assert max_diff(two.full_state(), expected) == 0.0
    # ... onto one rank (the sharded optimizer state is resharded), and a full-format save.
    one.load_checkpoint(str(ckpt))
    one.train_step(micro_batches(batch2, 1, 24), "ppo_clip", PPO)
    assert max_diff(one.full_state(), expected) < 2e-6
    one.save_checkpoint(str(tmp_path / "full"), fmt="full")
    two.load_checkpoint(str(tmp_path / "full"))
    assert max_diff(two.full_state(), one.full_state()) == 0.0

    # In the background (checkpoint.async_save): a step trains while the files are written, and
    # what was written is the state at the save (weights and optimizer), not after that step.
    # It copies into the buffers the fixture reserved before the first step (0 allocated here)
    at_save = two.full_state()
    assert two.save_checkpoint(str(tmp_path / "bg"), background=True) == 0
    two.train_step(micro_batches(batch2, 2, 24), "ppo_clip", PPO)
    moved = two.full_state()
    assert max_diff(moved, at_save) > 5e-4
    assert two.finish_checkpoint(wait=True)
    two.load_checkpoint(str(tmp_path / "bg"))
    assert max_diff(two.full_state(), at_save) == 0.0
    two.train_step(micro_batches(batch2, 2, 24), "ppo_clip", PPO)
    assert max_diff(two.full_state(), moved) == 0.0
    one.save_checkpoint(str(tmp_path / "bg_full"), fmt="full", background=True)
    assert one.finish_checkpoint(wait=True)
    two.load_checkpoint(str(tmp_path / "bg_full"))
    assert max_diff(two.full_state(), one.full_state()) == 0.0

    # The model dir is a plain transformers checkpoint of the trained weights.
    hf = AutoModelForCausalLM.from_pretrained(ckpt / "model", dtype=torch.float32)
    saved = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    assert max_diff(saved, after2) == 0.0
    assert (ckpt / "model" / "tokenizer.json").exists()


def test_old_logprobs_from_the_update_are_the_scoring_pass(groups, tmp_path: Path) -> None:
    """algo.old_logprobs=auto with one optimizer step per batch: the step takes pi_old from its
    own forward instead of a scoring pass before it. Same numbers: the logprobs it reports are
    the scoring pass's, and the step lands on the same weights. Both from the same state: the
    module's two-rank group, saved first (weights and optimizer; a reload is exact, as the first
    test checks) and loaded back before each way and after."""
    _, group = groups
    batch = make_batch(seed=4)
    no_old = batch.replace(trainer_old_logprobs=None)
    start = str(tmp_path / "start")
    group.save_checkpoint(start)
    state, lps, metrics = [], [], []
    try:
        for from_update in (False, True):
            group.load_checkpoint(start)
            per_rank = micro_batches(batch if not from_update else no_old, 2, 24)
            if from_update:
                metrics.append(group.train_step(per_rank, "ppo_clip", PPO, 1.0, True))
                lps.append(group.update_logprobs())
            else:
                old = group.compute_logprobs(per_rank)
                lps.append(old)
                scored = [
                    [mb.replace(trainer_old_logprobs=lp) for mb, lp in zip(mbs, r, strict=True)]
                    for mbs, r in zip(per_rank, old, strict=True)
                ]
                metrics.append(group.train_step(scored, "ppo_clip", PPO))
            state.append(group.full_state())
    finally:
        group.load_checkpoint(start)  # the module's group as this test found it
    for r in range(2):
        for a, b in zip(lps[0][r], lps[1][r], strict=True):
            assert torch.allclose(a, b, atol=1e-6)
    assert metrics[0]["policy/loss"] == pytest.approx(metrics[1]["policy/loss"], abs=1e-6)
    assert metrics[1]["policy/ratio_max"] == pytest.approx(1.0, abs=1e-6)
    assert max_diff(state[0], state[1]) < 1e-6


def test_reference_matches_plain_forward_and_critic_learns(ray_up, tiny_model_dir) -> None:
    batch = make_batch(seed=2)
    cfg = LearnerConfig(model_path=str(tiny_model_dir), mixed_precision="bf16",  # a GPU's
                        micro_batch_tokens="auto")  # fmt: skip
    ref = LearnerGroup(cfg, role="reference")
    try:
        # it never trains: its weights are kept in bf16, what FSDP2 casts them to anyway
        assert ref.info[0]["frozen_bf16_gb"] > 0
        assert ref.micro_batch_tokens == 4096  # auto sizes by a GPU's memory; a CPU gets 4096
        lp = ref.compute_logprobs(micro_batches(batch, 1, 1000))[0][0]
        with pytest.raises(RuntimeError, match="no optimizer"):
            ref.train_step(micro_batches(batch, 1, 1000), "ppo_clip", PPO)
    finally:
        ref.shutdown()
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        expected, _ = token_logprobs(plain, batch)
    assert lp.shape == batch.token_ids.shape
    assert (lp - expected).abs().max() < 0.05 and (lp[batch.loss_mask] < 0).all()

    returns = torch.where(batch.loss_mask, 1.0, 0.0)
    vbatch = batch.replace(values=torch.zeros_like(returns), returns=returns)
    vloss = LossConfig(name="value_clip", value_clip=None)
    critic = LearnerGroup(
        LearnerConfig(model_path=str(tiny_model_dir), lr=1e-2), role="critic", name="critic"
    )
    try:
        values = critic.compute_values(micro_batches(vbatch, 1, 1000))[0][0]
        assert values.shape == batch.token_ids.shape
        assert (values[batch.position_ids == 0] == 0).all()
        losses = [
            critic.train_step(micro_batches(vbatch, 1, 1000), "value_clip", vloss)["critic/vf_loss"]
            for _ in range(4)
        ]
    finally:
        critic.shutdown()
    assert losses[-1] < 0.5 * losses[0]


def test_lora_over_a_bf16_base_trains_its_fp32_adapters(ray_up, tiny_model_dir) -> None:
    """LoRA's base never trains: with bf16 compute it is stored in bf16 (half a 7B base: 14 GB),
    beside fp32 adapters in the same FSDP2 units; two ranks train them and the merged weights
    move only where adapters are."""
    batch = make_batch(seed=3)
    bf16 = dict(mixed_precision="bf16")
    lora_cfg = LearnerConfig(model_path=str(tiny_model_dir), num_workers=2, lora={"rank": 4},
                             **bf16, **CFG)  # fmt: skip
    policy = LearnerGroup(lora_cfg)
    try:
        assert all(i["frozen_bf16_gb"] > 0 for i in policy.info)
        specs = policy.param_specs()
        before = policy.full_state("float32")  # merged: the bf16 base + its fp32 adapters
        metrics = policy.train_step(micro_batches(batch, 2, 24), "ppo_clip", PPO)
        after = policy.full_state("float32")
    finally:
        policy.shutdown()
    assert math.isfinite(metrics["policy/loss"]) and metrics["policy/grad_norm"] > 0
    assert {s.dtype for s in specs} == {"bfloat16"}
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert moved and all(n.endswith("proj.weight") for n in moved), sorted(moved)[:5]


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc")
def test_ray_and_learner_listen_on_loopback_only(groups) -> None:
    ours = listening_sockets()  # this process and its descendants: gcs, raylet, workers, gloo
    assert len(ours) >= 4, ours
    exposed = {k: a for k, a in ours.items() if not a.startswith(("127.0.0.1:", "::1:"))}
    assert not exposed, f"listening beyond loopback: {exposed}"


def test_learner_ranks_are_not_niced(groups) -> None:
    """Ray starts workers at nice 15 unless told otherwise; a niced rank loses every core it
    shares with the dev server and the sandbox (the async loop's update took twice as long)."""
    for group in groups:
        assert [i["nice"] for i in group.info] == [0] * group.world_size


def test_ray_start_failure_is_one_clear_line(tmp_path: Path, monkeypatch) -> None:
    import ray

    def boom(**_kw):
        raise RuntimeError("Failed to start GCS server\nlong traceback …")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", boom)
    with pytest.raises(LearnerError) as e:
        start_ray(RayConfig())
    msg = str(e.value)
    assert "\n" not in msg and "could not start Ray on 127.0.0.1" in msg
    assert "Failed to start GCS server" in msg


def test_lr_schedule_and_buckets() -> None:
    assert [lr_factor(s, 2, None, "constant") for s in range(4)] == [0.5, 1.0, 1.0, 1.0]
    assert lr_factor(2, 2, 12, "linear") == 1.0 and lr_factor(7, 2, 12, "linear") == 0.5
    assert lr_factor(12, 2, 12, "cosine", min_ratio=0.1) == pytest.approx(0.1)
    assert lr_factor(7, 2, 12, "cosine") == pytest.approx(0.5)
    specs = [ParamSpec(n, shape, "float32") for n, shape in
             [("a", (256,)), ("b", (256,)), ("big", (1024,)), ("c", (10,)), ("d", (200,))]]  # fmt: skip
    plan = [[s.name for s in b] for b in plan_buckets(specs, bucket_bytes=2048)]
    assert plan == [["a", "b"], ["big"], ["c", "d"]]  # order kept; a too-big tensor goes alone
