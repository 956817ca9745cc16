"""TrainBatch, micro-batch planning, and packed logprobs on a real (tiny, random) Qwen3."""

from __future__ import annotations

import pytest
import torch

from agentrl.batch import (
    TrainBatch,
    micro_batches,
    mini_batches,
    padded_tokens,
    padding_micro_batch,
    plan_micro_batches,
)
from agentrl.learner.forward import logprobs_from_hidden, token_logprobs
from agentrl.loss import LossConfig, LossInputs, LossNorm, get_loss
from agentrl.types import FinishReason, Message, StopReason, Trajectory, Turn


def traj(turns, prompt, stop=StopReason.COMPLETED, first_id=0) -> Trajectory:
    pos, ts, mask = prompt, [], [0] * prompt
    for a, o in turns:
        ts.append(
            Turn(pos, pos + a, pos + a + o, "0", FinishReason.STOP, Message(role="assistant"))
        )
        mask += [1] * a + [0] * o
        pos += a + o
    return Trajectory(
        task_id="t", sample_index=0, token_ids=list(range(first_id, first_id + pos)),
        loss_mask=mask, logprobs=[-0.25 * m for m in mask], prompt_len=prompt, turns=ts,
        messages=[], stop_reason=stop,
    )  # fmt: skip


def test_from_trajectories_worked_example():
    # the TrainBatch docstring: P P P A A A O O O O A A | P P A A (+ a dropped infra failure)
    t0 = traj([(3, 4), (2, 0)], prompt=3, first_id=100)
    bad = traj([(2, 0)], prompt=1, stop=StopReason.ABORTED)
    t1 = traj([(2, 0)], prompt=2, first_id=200)
    adv = [torch.full((12,), 0.5), torch.ones(3), torch.full((4,), -1.0)]
    b = TrainBatch.from_trajectories([t0, bad, t1], adv)
    assert b.token_ids.tolist() == list(range(100, 112)) + [200, 201, 202, 203]
    assert b.position_ids.tolist() == list(range(12)) + [0, 1, 2, 3]
    assert b.seq_ids.tolist() == [0] * 12 + [1] * 4
    m = [0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1] + [0, 0, 1, 1]
    assert b.loss_mask.tolist() == [bool(x) for x in m]
    assert b.old_logprobs.tolist() == [-0.25 * x for x in m]
    assert b.advantages.tolist() == [0.5 * x for x in m[:12]] + [-1.0 * x for x in m[12:]]
    assert b.norm == LossNorm(num_tokens=7, num_seqs=2)
    assert b.source == [0, 2] and b.seq_lens == [12, 4]
    assert [x.tolist() for x in b.per_sequence(b.token_ids)][1] == [200, 201, 202, 203]
    b2 = TrainBatch.from_trajectories([t0, t1], None, ref_logprobs=[torch.zeros(12), torch.ones(4)])
    assert b2.advantages.abs().sum() == 0 and b2.ref_logprobs.tolist()[-1] == 1.0


def test_constructor_checks_alignment():
    ok = dict(
        token_ids=torch.tensor([1, 2, 3]), position_ids=torch.tensor([0, 1, 0]),
        loss_mask=torch.tensor([False, True, False]), old_logprobs=torch.zeros(3),
        advantages=torch.zeros(3), seq_ids=torch.tensor([0, 0, 1]), norm=LossNorm(1, 1),
    )  # fmt: skip
    TrainBatch(**ok)
    with pytest.raises(ValueError, match="advantages has shape \\(2,\\)"):
        TrainBatch(**{**ok, "advantages": torch.zeros(2)})
    with pytest.raises(ValueError, match="position_ids"):
        TrainBatch(**{**ok, "position_ids": torch.tensor([0, 1, 2])})
    with pytest.raises(ValueError, match="seq_ids"):
        TrainBatch(**{**ok, "seq_ids": torch.tensor([0, 0, 2])})
    with pytest.raises(ValueError, match="bool"):
        TrainBatch(**{**ok, "loss_mask": torch.tensor([0, 1, 0])})
    with pytest.raises(ValueError, match="advantages has 1 entries for 2"):
        TrainBatch.from_trajectories([traj([(1, 0)], 1), traj([(1, 0)], 1)], [[0.0, 1.0]])
    with pytest.raises(ValueError, match="no trainable trajectory"):
        TrainBatch.from_trajectories([traj([], 3)], None)


def test_plan_balances_ranks_with_equal_micro_batch_counts():
    lens = [10, 9, 8, 3, 2, 1, 1]
    plan = plan_micro_batches(lens, dp_size=2, max_tokens=12)
    # ranks get 10+3+2+1+1 = 17 and 9+8 = 17 tokens, in 2 micro-batches each, none over 12
    assert [len(r) for r in plan] == [2, 2]
    assert sorted(s for r in plan for mb in r for s in mb) == list(range(7))
    assert [sum(lens[s] for mb in r for s in mb) for r in plan] == [17, 17]
    assert all(sum(lens[s] for s in mb) <= 12 for r in plan for mb in r)
    # a sequence over the budget gets a micro-batch of its own; spare slots become padding
    plan = plan_micro_batches([30, 2, 2], dp_size=2, max_tokens=8)
    assert plan == [[[0]], [[1, 2]]]
    plan = plan_micro_batches([5, 4], dp_size=3, max_tokens=8)
    assert plan == [[[0]], [[1]], [[]]]


def test_padded_plan_groups_similar_lengths_within_the_padded_budget():
    """`learner.attention_layout=padded`: a micro-batch costs rows x its longest sequence, so
    the plan runs similar lengths together; against the packed plan (longest first into the
    lightest, which mixes lengths) it pads far less, on every rank with the same count."""
    g = torch.Generator().manual_seed(0)
    lens = [int(x) for x in torch.randint(100, 700, (64,), generator=g)]
    for dp in (1, 2, 3):
        plan = plan_micro_batches(lens, dp, 4096, padded=True)
        assert len({len(r) for r in plan}) == 1
        assert sorted(s for r in plan for mb in r for s in mb) == list(range(64))
        for mb in (mb for r in plan for mb in r if len(mb) > 1):
            assert len(mb) * max(lens[s] for s in mb) <= 4096
        packed = plan_micro_batches(lens, dp, 4096)
        assert padded_tokens(plan, lens) < 0.9 * padded_tokens(packed, lens)
        assert padded_tokens(plan, lens) < 1.2 * sum(lens)
    # one sequence over the budget stands alone; a rank with fewer runs splits its largest (two
    # 90s + a 60 pad to 3 x 90 > 200: runs [90, 60] and [60]; rank 0's lone 300 gets a padding)
    assert plan_micro_batches([300, 90, 60, 60], 2, 200, padded=True) == [[[0], []], [[1, 2], [3]]]
    assert plan_micro_batches([300, 90, 60, 60], 2, 10_000, padded=True) == [[[0]], [[1, 2, 3]]]
    assert plan_micro_batches([90, 90, 80, 80, 10], 1, 400, padded=True) == [[[0, 1, 2, 3], [4]]]
    assert plan_micro_batches([90, 90, 80, 80, 10, 300], 2, 400, padded=True) == [
        [[5], [4]], [[0, 1], [2, 3]]]  # fmt: skip


def test_each_rank_runs_its_largest_micro_batch_first():
    """A micro-batch larger than the one before it needs CUDA blocks larger than the cached
    ones, and near the GPU's limit that is an allocator retry: every rank's plan is in
    non-increasing tokens (padded: rows x longest), whatever order the packer filled it in."""
    g = torch.Generator().manual_seed(1)
    for trial in range(20):
        lens = [int(x) for x in torch.randint(20, 900, (48,), generator=g)]
        for padded in (False, True):
            for dp in (1, 2, 3):
                for rank in plan_micro_batches(lens, dp, 2048, padded=padded):
                    sizes = [len(b) * max(lens[s] for s in b) if padded and b
                             else sum(lens[s] for s in b) for b in rank]  # fmt: skip
                    assert sizes == sorted(sizes, reverse=True), (trial, padded, dp, sizes)
    # the packer fills [7 + 1, 6 + 3] in that order: the 9-token one goes first
    assert plan_micro_batches([7, 6, 3, 1], 1, 10) == [[[1, 2], [0, 3]]]


def test_micro_batches_keep_the_global_norm_and_content():
    trajs = [traj([(a, 1), (1, 0)], prompt=p, first_id=100 * i) for i, (a, p) in
             enumerate([(5, 3), (2, 2), (7, 1), (1, 4), (3, 3)])]  # fmt: skip
    b = TrainBatch.from_trajectories(trajs, [torch.randn(len(t.token_ids)) for t in trajs])
    per_rank = micro_batches(b, dp_size=2, max_tokens=12)
    assert len(per_rank[0]) == len(per_rank[1])
    seen = {}
    # lengths 10, 6, 10, 7, 8 -> ranks 10+8 and 10+7+6: rank 1 needs 3 micro-batches of <= 12,
    # so rank 0 gets a padding one (1 token, no loss) to stay in step
    assert [[mb.is_padding for mb in r] for r in per_rank] == [[False, False, True], [False] * 3]
    for mb in (mb for r in per_rank for mb in r):
        assert mb.norm == b.norm and mb.num_tokens <= 12
        assert mb.position_ids.tolist() == [i for n in mb.seq_lens for i in range(n)]
        for s, src in enumerate(mb.source):
            seen[src] = (mb.per_sequence(mb.token_ids)[s], mb.per_sequence(mb.advantages)[s])
    for s, src in enumerate(b.source):
        assert torch.equal(seen[src][0], b.per_sequence(b.token_ids)[s])
        assert torch.equal(seen[src][1], b.per_sequence(b.advantages)[s])
    pad = micro_batches(b, dp_size=8, max_tokens=100)[-1][0]
    assert pad.is_padding and pad.num_tokens == 1 and not pad.loss_mask.any()


def test_logprobs_from_hidden_matches_full_log_softmax_with_grads():
    torch.manual_seed(0)
    n, h, v = 11, 6, 50
    hidden = torch.randn(n, h, requires_grad=True)
    w = torch.randn(v, h, requires_grad=True)
    ids = torch.randint(0, v, (n,))
    pos = torch.tensor([0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3])
    mask = torch.tensor([0, 0, 1, 1, 0, 1, 1, 0, 0, 1, 1], dtype=torch.bool)
    lp, ent = logprobs_from_hidden(hidden, w, ids, pos, mask, with_entropy=True, chunk_tokens=2,
                                   temperature=0.7)  # fmt: skip
    (lp.sum() + 0.3 * ent.sum()).backward()
    g_h, g_w = hidden.grad.clone(), w.grad.clone()
    hidden.grad = w.grad = None
    full = (hidden @ w.T / 0.7).log_softmax(-1)  # the memory-hungry reference
    ref_lp = torch.zeros(n).index_put(
        (torch.arange(1, n),), full[:-1].gather(1, ids[1:, None])[:, 0]
    )
    ref_ent = torch.zeros(n).index_put(
        (torch.arange(1, n),), -(full[:-1].exp() * full[:-1]).sum(-1)
    )
    ref_lp, ref_ent = ref_lp * mask, ref_ent * mask
    (ref_lp.sum() + 0.3 * ref_ent.sum()).backward()
    assert torch.allclose(lp, ref_lp, atol=1e-5) and torch.allclose(ent, ref_ent, atol=1e-5)
    assert torch.allclose(g_h, hidden.grad, atol=1e-5) and torch.allclose(g_w, w.grad, atol=1e-5)


@pytest.fixture(scope="module")
def tiny():
    """Loads the tiny random Qwen3 once per attention implementation, for this module."""
    from transformers import AutoModelForCausalLM

    from agentrl.assets.build import cached_tiny_random

    path, loaded = cached_tiny_random(), {}

    def get(attn: str):
        if attn not in loaded:
            loaded[attn] = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn)
        loaded[attn].zero_grad(set_to_none=True)
        return loaded[attn]

    return get


def packed_batch(lens, seed=0) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    n = sum(lens)
    seq = torch.cat([torch.full((k,), s) for s, k in enumerate(lens)])
    pos = torch.cat([torch.arange(k) for k in lens])
    mask = (torch.rand(n, generator=g) < 0.7) & (pos > 0)
    old = torch.where(mask, -torch.rand(n, generator=g) * 12, 0.0)
    return TrainBatch(
        token_ids=torch.randint(0, 151000, (n,), generator=g), position_ids=pos, loss_mask=mask,
        old_logprobs=old, trainer_old_logprobs=old + 0.1 * torch.randn(n, generator=g),
        advantages=torch.where(mask, torch.randn(n, generator=g), 0.0), seq_ids=seq,
        norm=LossNorm(int(mask.sum()), len(lens)), source=list(range(len(lens))),
    )  # fmt: skip


@pytest.mark.parametrize("layout", ["packed", "padded"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logprobs_equal_unpacked_on_tiny_qwen(tiny, attn, layout):
    model = tiny(attn).eval()
    b = packed_batch([7, 12, 5, 9])
    with torch.no_grad():
        packed, _ = token_logprobs(model, b, all_tokens=True, layout=layout)
        for s, ids in enumerate(b.per_sequence(b.token_ids)):
            logits = model(input_ids=ids[None]).logits[0].float()
            ref = logits[:-1].log_softmax(-1).gather(1, ids[1:, None])[:, 0]
            got = b.per_sequence(packed)[s]
            assert got[0] == 0.0
            assert (got[1:] - ref).abs().max() < 1e-5, attn
        # the check has teeth: without the position restarts the sequences see each other
        leaky = b.replace(
            seq_ids=torch.zeros_like(b.seq_ids), position_ids=torch.arange(b.num_tokens), source=[]
        )
        mixed, _ = token_logprobs(model, leaky, all_tokens=True, layout=layout)
        assert (mixed - packed).abs().max() > 1e-3


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_tiny_qwen_micro_batch_gradients_equal_full_batch(tiny, layout):
    b = packed_batch([6, 14, 3, 9, 4], seed=1)
    cfg = LossConfig(agg="seq-mean-token-mean", clip_high=0.28, entropy_coef=0.01)

    def grads(mbs: list[TrainBatch]) -> dict[str, torch.Tensor]:
        model = tiny("sdpa")  # eval mode: dropout off (the tiny config has none anyway)
        for mb in mbs:
            lp, ent = token_logprobs(model, mb, with_entropy=True, chunk_tokens=8, layout=layout)
            loss, _ = get_loss("ppo_clip")(LossInputs.from_batch(mb, lp, entropy=ent), cfg)
            loss.backward()
        return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    full = grads([b])
    split = micro_batches(b, dp_size=2, max_tokens=16)  # two "ranks", summed as DP would
    assert len(split[0]) == len(split[1]) >= 2
    acc = grads([mb for rank in split for mb in rank])
    assert full.keys() == acc.keys()
    for k in full:
        assert torch.allclose(acc[k], full[k], atol=1e-6, rtol=1e-4), k
    # a padding micro-batch (a rank with no data left) still backpropagates, with zero gradient
    pad = grads([padding_micro_batch(b)])
    assert pad.keys() == full.keys() and all(g.abs().max() == 0 for g in pad.values())


def test_mini_batches_split_whole_sequences_with_their_own_norm():
    trajs = [
        traj([(a, 1), (1, 0)], prompt=2, first_id=100 * i) for i, a in enumerate([5, 2, 7, 1, 3])
    ]
    b = TrainBatch.from_trajectories(trajs, [torch.randn(len(t.token_ids)) for t in trajs])
    minis = mini_batches(b, 2, seed=3)
    assert len(minis) == 2 and sorted(len(m.source) for m in minis) == [2, 3]
    assert sorted(s for m in minis for s in m.source) == [0, 1, 2, 3, 4]
    for m in minis:  # each optimizer step's loss is a full mean over its own tokens
        assert m.norm.num_tokens == int(m.loss_mask.sum()) and m.norm.num_seqs == len(m.source)
        for s, src in enumerate(m.source):
            assert torch.equal(m.per_sequence(m.advantages)[s], b.per_sequence(b.advantages)[src])
    assert sum(m.norm.num_tokens for m in minis) == b.norm.num_tokens
    assert [m.source for m in mini_batches(b, 2, seed=3)] == [m.source for m in minis]
    assert mini_batches(b, 1) == [b]
    with pytest.raises(ValueError, match="algo.mini_batches=6"):
        mini_batches(b, 6)


def test_trainer_old_logprobs_travel_with_the_batch():
    trajs = [traj([(3, 1), (2, 0)], prompt=2), traj([(2, 0)], prompt=3, first_id=50)]
    old = [torch.arange(len(t.token_ids), dtype=torch.float32) for t in trajs]
    b = TrainBatch.from_trajectories(trajs, None, trainer_old_logprobs=old)
    assert torch.equal(b.trainer_old_logprobs, torch.cat(old))
    mb = micro_batches(b, 1, 4)[0][0]
    inp = LossInputs.from_batch(mb, torch.zeros(mb.num_tokens))
    assert inp.trainer_old_logprobs is not None
    assert torch.equal(inp.trainer_old_logprobs, mb.trainer_old_logprobs)


def test_critic_values_are_the_same_in_both_layouts_and_aligned_like_logprobs():
    from transformers import AutoModelForTokenClassification

    from agentrl.assets.build import cached_tiny_random
    from agentrl.learner.forward import token_values

    torch.manual_seed(0)
    critic = AutoModelForTokenClassification.from_pretrained(cached_tiny_random(), num_labels=1)
    b = packed_batch([7, 12, 5])
    with torch.no_grad():
        padded, packed = token_values(critic, b, "padded"), token_values(critic, b, "packed")
        assert (padded - packed).abs().max() < 1e-5
        for s, ids in enumerate(b.per_sequence(b.token_ids)):
            alone = critic(input_ids=ids[None]).logits[0, :, 0]
            got = b.per_sequence(padded)[s]
            # values[t]: the state in which token t was chosen, i.e. read after token t-1
            assert got[0] == 0.0 and (got[1:] - alone[:-1]).abs().max() < 1e-5
