"""Losses against numbers computed by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from agentrl.batch import TrainBatch
from agentrl.learner.forward import logprobs_from_hidden
from agentrl.loss import (
    LossConfig,
    LossInputs,
    LossNorm,
    aggregate,
    get_loss,
    kl_reward_penalty,
    known_losses,
    reduce_metrics,
)

LN2 = math.log(2.0)


def inputs(ratio, adv, seq=None, mask=None, **kw) -> tuple[LossInputs, torch.Tensor]:
    """Current logprobs = log(ratio) + old, with old = log .5 (so the ratio vs old is `ratio`)."""
    n = len(ratio)
    old = torch.full((n,), math.log(0.5))
    lp = (torch.log(torch.tensor(ratio, dtype=torch.float64)).float() + old).requires_grad_()
    mask_t = torch.ones(n, dtype=torch.bool) if mask is None else torch.tensor(mask)
    seq_t = torch.zeros(n, dtype=torch.long) if seq is None else torch.tensor(seq)
    norm = kw.pop("norm", LossNorm(int(mask_t.sum()), len(set(seq_t[mask_t].tolist())) if n else 0))
    kw.setdefault("trainer_old_logprobs", old)  # trainer and engine agree: IS weights are 1
    return LossInputs(lp, old, torch.tensor(adv), mask_t, seq_t, norm, **kw), lp


def test_ppo_clip_higher_asymmetry():
    # clip_low .2, clip_high .28:
    #   A=+1 r=1.5  -> max(-1.5, -1.28) = -1.28  (high clip, no gradient)
    #   A=-1 r=0.5  -> max(0.5, 0.8)    = 0.8    (low clip, no gradient)
    #   A=+1 r=0.7  -> max(-0.7, -0.8)  = -0.7   (unclipped; d/dlogp = -A r = -0.7)
    #   A=-1 r=1.25 -> max(1.25, 1.2)   = 1.25   (unclipped; d/dlogp = 1.25)
    # token-mean: (-1.28 + .8 - .7 + 1.25)/4 = .0175
    inp, lp = inputs([1.5, 0.5, 0.7, 1.25], [1.0, -1.0, 1.0, -1.0])
    cfg = LossConfig(clip_low=0.2, clip_high=0.28)
    loss, m = get_loss("ppo_clip")(inp, cfg)
    loss.backward()
    assert loss.item() == pytest.approx(0.0175, abs=1e-6)
    assert lp.grad.tolist() == pytest.approx([0.0, 0.0, -0.7 / 4, 1.25 / 4], abs=1e-6)
    assert m["pg_clipfrac_high"].item() == pytest.approx(0.25)
    assert m["pg_clipfrac_low"].item() == pytest.approx(0.25)
    assert m["ratio_max"].item() == pytest.approx(1.5) and m["ratio_min"].item() == pytest.approx(
        0.5
    )
    # symmetric .2 clips the first token at 1.2 instead: (-1.2 + .8 - .7 + 1.25)/4 = .0375
    inp, _ = inputs([1.5, 0.5, 0.7, 1.25], [1.0, -1.0, 1.0, -1.0])
    loss, _ = get_loss("ppo_clip")(inp, LossConfig(clip_low=0.2, clip_high=0.2))
    assert loss.item() == pytest.approx(0.0375, abs=1e-6)


def test_dual_clip_bounds_negative_advantages():
    # A=-1 r=5: plain PPO max(5, 1.2) = 5 (gradient 5); dual clip c=3: min(5, 3) = 3 (no gradient)
    # A=+1 r=5: -1.2 either way (dual clip only touches A<0).  token-mean over 2 tokens
    inp, lp = inputs([5.0, 5.0], [-1.0, 1.0])
    loss, _ = get_loss("ppo_clip")(inp, LossConfig())
    assert loss.item() == pytest.approx((5.0 - 1.2) / 2, abs=1e-5)
    inp, lp = inputs([5.0, 5.0], [-1.0, 1.0])
    loss, m = get_loss("ppo_clip")(inp, LossConfig(clip_c=3.0))
    loss.backward()
    assert loss.item() == pytest.approx((3.0 - 1.2) / 2, abs=1e-5)
    assert lp.grad.tolist() == [0.0, 0.0]
    assert m["pg_clipfrac_dual"].item() == pytest.approx(0.5)


def test_gspo_sequence_ratio():
    # seq 0: log ratios .05, .15 -> s = exp(.1) = 1.105171 on both tokens (unclipped, A=+1)
    # seq 1: log ratio .3 -> s = exp(.3) = 1.3499 -> clipped to 1.2 (A=+1), no gradient
    # seq-mean-token-mean: ((-1.105171 - 1.105171)/2 + -1.2)/2 = -1.1525855
    # gradient (GSPO = sg[s] * grad log pi_t): -A s / (n_s * S) = -1.105171 / (2*2) per token
    inp, lp = inputs(
        [math.exp(0.05), math.exp(0.15), math.exp(0.3)], [1.0, 1.0, 1.0], seq=[0, 0, 1]
    )
    cfg = LossConfig(name="gspo", agg="seq-mean-token-mean")
    loss, m = get_loss("gspo")(inp, cfg)
    loss.backward()
    s = math.exp(0.1)
    assert loss.item() == pytest.approx((-s - 1.2) / 2, abs=1e-6)
    assert lp.grad.tolist() == pytest.approx([-s / 4, -s / 4, 0.0], abs=1e-6)
    assert m["ratio_max"].item() == pytest.approx(math.exp(0.3), abs=1e-5)
    assert m["ratio_min"].item() == pytest.approx(s, abs=1e-6)  # not exp(.05): sequence ratio
    # token-level PPO on the same tokens differs: ratios exp(.05), exp(.15) per token
    inp, _ = inputs([math.exp(0.05), math.exp(0.15), math.exp(0.3)], [1.0, 1.0, 1.0], seq=[0, 0, 1])
    ppo, _ = get_loss("ppo_clip")(inp, cfg)
    assert ppo.item() == pytest.approx(((-math.exp(0.05) - math.exp(0.15)) / 2 - 1.2) / 2, abs=1e-6)


def test_tis_caps_the_rollout_trainer_weight():
    # trainer_old - rollout = log 3, log .5, 0 -> weights min(3, 2)=2, .5, 1 (cap 2)
    # current == trainer_old (ratio 1), A = 1: loss = -(2 + .5 + 1)/3; d/dlogp = -w/3
    rollout = torch.log(torch.tensor([0.1, 0.4, 0.3]))
    trainer_old = torch.log(torch.tensor([0.3, 0.2, 0.3]))
    lp = trainer_old.clone().requires_grad_()
    inp = LossInputs(
        lp, rollout, torch.ones(3), torch.ones(3, dtype=torch.bool),
        torch.zeros(3, dtype=torch.long), LossNorm(3, 1), trainer_old_logprobs=trainer_old,
    )  # fmt: skip
    loss, m = get_loss("ppo_clip")(inp, LossConfig(tis_cap=2.0))
    loss.backward()
    assert loss.item() == pytest.approx(-3.5 / 3, abs=1e-6)
    assert lp.grad.tolist() == pytest.approx([-2 / 3, -0.5 / 3, -1 / 3], abs=1e-6)
    assert m["is_weight_max"].item() == pytest.approx(3.0)  # before the cap
    assert m["is_weight_min"].item() == pytest.approx(0.5)
    assert m["is_weight_mean"].item() == pytest.approx(4.5 / 3, abs=1e-6)
    assert m["is_capped_frac"].item() == pytest.approx(1 / 3)
    assert m["rollout_logprob_diff"].item() == pytest.approx((math.log(3) + LN2) / 3, abs=1e-6)
    # masked IS: w=3 is outside [.4, 2] -> no loss; the others keep weight .5 and 1
    lp.grad = None
    loss, m = get_loss("ppo_clip")(inp, LossConfig(rollout_correction="mis", mis_low=0.4))
    loss.backward()
    assert loss.item() == pytest.approx(-1.5 / 3, abs=1e-6)
    assert lp.grad.tolist() == pytest.approx([0.0, -0.5 / 3, -1 / 3], abs=1e-6)
    assert m["is_masked_frac"].item() == pytest.approx(1 / 3)
    assert m["zero_grad_token_frac"].item() == pytest.approx(1 / 3)
    assert m["zero_grad_seq_frac"].item() == 0.0  # the sequence still has gradient
    # with ratio=engine the ratio is against the rollout: r = 3, .5, 1 -> clip: -1.2, -.5, -1
    loss3, _ = get_loss("ppo_clip")(inp, LossConfig(ratio="engine"))
    assert loss3.item() == pytest.approx(-(1.2 + 0.5 + 1) / 3, abs=1e-6)
    # ratio=trainer never falls back silently
    inp.trainer_old_logprobs = None
    with pytest.raises(ValueError, match="algo.loss.ratio=engine"):
        get_loss("ppo_clip")(inp, LossConfig())


def test_zero_gradient_share_per_token_and_sequence():
    # seq 0: A=+1 r=1.5 (clipped high), A=0 r=1        -> every token zero: a zero-gradient sequence
    # seq 1: A=-1 r=0.5 (clipped low),  A=+1 r=1.1      -> one of two tokens zero
    # seq 2: A=-1 r=5 with dual clip c=3 (zero)         -> zero sequence
    inp, lp = inputs([1.5, 1.0, 0.5, 1.1, 5.0], [1.0, 0.0, -1.0, 1.0, -1.0], seq=[0, 0, 1, 1, 2])
    loss, m = get_loss("ppo_clip")(inp, LossConfig(clip_c=3.0))
    loss.backward()
    assert m["zero_grad_token_frac"].item() == pytest.approx(4 / 5)
    assert m["zero_grad_seq_frac"].item() == pytest.approx(2 / 3)
    assert lp.grad.tolist() == pytest.approx([0, 0, 0, -1.1 / 5, 0], abs=1e-6)  # consistent
    # GSPO: the sequence ratio is clipped for the whole sequence
    inp, _ = inputs([math.exp(0.3), math.exp(0.3), 1.0], [1.0, 1.0, 1.0], seq=[0, 0, 1])
    _, m = get_loss("gspo")(inp, LossConfig(name="gspo"))
    assert m["zero_grad_seq_frac"].item() == pytest.approx(1 / 2)


def test_zero_gradient_share_counts_mis_masked_sequences_and_the_overflow_guard():
    # trainer_old - rollout = log 3 (outside [.5, 2]: masked) on seq 0's both tokens, 0 on seq 1's
    # seq 1: A=-1, log ratio 25 > the exp() guard of 20: clamped, so no gradient either (no dual
    # clip: without the guard its gradient would be e^25). Both sequences have zero gradient.
    rollout = torch.log(torch.tensor([0.1, 0.1, 0.5]))
    trainer_old = torch.log(torch.tensor([0.3, 0.3, 0.5]))
    lp = (trainer_old + torch.tensor([0.0, 0.0, 25.0])).requires_grad_()
    inp = LossInputs(
        lp, rollout, torch.tensor([1.0, 1.0, -1.0]), torch.ones(3, dtype=torch.bool),
        torch.tensor([0, 0, 1]), LossNorm(3, 2), trainer_old_logprobs=trainer_old,
    )  # fmt: skip
    loss, m = get_loss("ppo_clip")(inp, LossConfig(rollout_correction="mis"))
    loss.backward()
    assert lp.grad.tolist() == [0.0, 0.0, 0.0]
    assert m["is_masked_frac"].item() == pytest.approx(2 / 3)
    assert m["zero_grad_token_frac"].item() == pytest.approx(1.0)
    assert m["zero_grad_seq_frac"].item() == pytest.approx(1.0)
    # summed over two micro-batches of one step, the shares add up to the batch's share
    halves = [
        LossInputs(lp.detach()[i], rollout[i], inp.advantages[i], inp.loss_mask[i],
                   torch.zeros(len(i), dtype=torch.long), LossNorm(3, 2),
                   trainer_old_logprobs=trainer_old[i])
        for i in (torch.tensor([0, 1]), torch.tensor([2]))
    ]  # fmt: skip
    cfg = LossConfig(rollout_correction="mis")
    total = reduce_metrics(get_loss("ppo_clip")(h, cfg)[1] for h in halves)
    assert total["zero_grad_seq_frac"] == pytest.approx(1.0)
    assert total["zero_grad_token_frac"] == pytest.approx(1.0)
    assert total["is_weight_max"] == pytest.approx(3.0) and total["is_weight_min"] == 1.0


def test_no_correction_still_reports_the_mismatch():
    # w = 3, .5, 1 as in the TIS test; correction none: weight 1 everywhere, loss -(1+1+1)/3
    rollout = torch.log(torch.tensor([0.1, 0.4, 0.3]))
    trainer_old = torch.log(torch.tensor([0.3, 0.2, 0.3]))
    lp = trainer_old.clone().requires_grad_()
    inp = LossInputs(
        lp, rollout, torch.ones(3), torch.ones(3, dtype=torch.bool),
        torch.zeros(3, dtype=torch.long), LossNorm(3, 1), trainer_old_logprobs=trainer_old,
    )  # fmt: skip
    loss, m = get_loss("ppo_clip")(inp, LossConfig(rollout_correction="none"))
    assert loss.item() == pytest.approx(-1.0)
    assert m["is_weight_max"].item() == pytest.approx(3.0)
    assert m["rollout_logprob_diff"].item() == pytest.approx((math.log(3) + LN2) / 3, abs=1e-6)
    assert "is_capped_frac" not in m and "is_masked_frac" not in m
    # ratio=engine needs no trainer logprobs at all and reports no IS metric
    inp.trainer_old_logprobs = None
    _, m = get_loss("gspo")(inp, LossConfig(name="gspo", ratio="engine"))
    assert not any(k.startswith("is_") for k in m) and "zero_grad_seq_frac" in m


def test_from_batch_takes_the_trainer_logprobs_from_the_batch():
    mb = TrainBatch(
        token_ids=torch.tensor([5, 6, 7]), position_ids=torch.arange(3),
        loss_mask=torch.tensor([False, True, True]), old_logprobs=torch.tensor([0.0, -1.0, -2.0]),
        advantages=torch.ones(3), seq_ids=torch.zeros(3, dtype=torch.long), norm=LossNorm(2, 1),
        trainer_old_logprobs=torch.tensor([0.0, -1.5, -2.5]),
    )  # fmt: skip
    lp = torch.tensor([0.0, -1.5, -2.5])
    assert LossInputs.from_batch(mb, lp).trainer_old_logprobs.tolist() == [0.0, -1.5, -2.5]
    got = LossInputs.from_batch(mb, lp, trainer_old_logprobs=None).trainer_old_logprobs
    assert got.tolist() == [0.0, -1.5, -2.5]  # an explicit None does not hide the batch's
    given = torch.tensor([0.0, -1.0, -2.0])
    assert LossInputs.from_batch(mb, lp, trainer_old_logprobs=given).trainer_old_logprobs is given
    mb.trainer_old_logprobs = None
    with pytest.raises(ValueError, match="algo.loss.ratio=trainer needs trainer_old_logprobs"):
        get_loss("ppo_clip")(LossInputs.from_batch(mb, lp), LossConfig())


def test_kl_k3_loss_term_with_nonzero_coefficient():
    # pi = .5, .25; ref = .25, .5 -> ref/pi = .5, 2
    # k3 = ref/pi - 1 - log(ref/pi) = .5 - 1 + ln2 = .193147;  2 - 1 - ln2 = .306853
    # A = 0, ratio 1 -> only KL: loss = .1 * mean(k3) = .1 * .25 = .025
    # d k3 / d log pi = 1 - ref/pi = .5, -1 -> grad = .1 * (.5, -1) / 2
    lp = torch.log(torch.tensor([0.5, 0.25])).requires_grad_()
    ref = torch.log(torch.tensor([0.25, 0.5]))
    inp = LossInputs(
        lp, lp.detach().clone(), torch.zeros(2), torch.ones(2, dtype=torch.bool),
        torch.zeros(2, dtype=torch.long), LossNorm(2, 1), ref_logprobs=ref,
        trainer_old_logprobs=lp.detach().clone(),
    )  # fmt: skip
    loss, m = get_loss("ppo_clip")(inp, LossConfig(kl_coef=0.1, kl_kind="k3"))
    loss.backward()
    assert loss.item() == pytest.approx(0.025, abs=1e-7)
    assert lp.grad.tolist() == pytest.approx([0.025, -0.05], abs=1e-7)
    assert m["kl_ref"].item() == pytest.approx(0.25, abs=1e-6)
    # k3+: k3's value, k2's gradient d = log pi - log ref = ln2, -ln2 -> .1 * (ln2, -ln2) / 2
    lp.grad = None
    loss, m = get_loss("ppo_clip")(inp, LossConfig(kl_coef=0.1, kl_kind="k3+"))
    loss.backward()
    assert loss.item() == pytest.approx(0.025, abs=1e-7)
    assert lp.grad.tolist() == pytest.approx([0.05 * LN2, -0.05 * LN2], abs=1e-7)
    # k1 in the loss: its gradient is a constant, zero in expectation -> refused at the door
    with pytest.raises(ValidationError, match="kl_kind=k1 in the loss"):
        LossConfig(kl_coef=0.1, kl_kind="k1")
    # kl_mode=reward: no KL in the loss; the penalty is per token, masked, without gradient
    loss, _ = get_loss("ppo_clip")(inp, LossConfig(kl_coef=0.1, kl_mode="reward"))
    assert loss.item() == 0.0
    pen = kl_reward_penalty(lp, ref, torch.tensor([True, False]), 0.1, "k1")
    assert pen.tolist() == pytest.approx([0.1 * LN2, 0.0]) and not pen.requires_grad
    # as a reward penalty only the value counts: k3+ is k3 (.193147, .306853), k1 is allowed
    pen = kl_reward_penalty(lp, ref, torch.tensor([True, True]), 0.1, "k3+")
    assert pen.tolist() == pytest.approx([0.1 * (LN2 - 0.5), 0.1 * (1 - LN2)], abs=1e-7)
    assert not pen.requires_grad
    assert LossConfig(kl_coef=0.1, kl_kind="k1", kl_mode="reward").kl_kind == "k1"
    inp.ref_logprobs = None
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        get_loss("ppo_clip")(inp, LossConfig(kl_coef=0.1))


def test_entropy_bonus():
    # A = 0, entropies 1, 2, coef .01: loss = -.01 * 1.5
    inp, _ = inputs([1.0, 1.0], [0.0, 0.0], entropy=torch.tensor([1.0, 2.0]))
    loss, m = get_loss("ppo_clip")(inp, LossConfig(entropy_coef=0.01))
    assert loss.item() == pytest.approx(-0.015)
    assert m["entropy"].item() == pytest.approx(1.5)


def test_aggregation_modes():
    # seq 0: losses 1, 2, 3 on the mask (+ a masked NaN); seq 1: 4.  Global: 4 tokens, 2 seqs
    # token-mean 10/4 = 2.5; seq-mean-token-mean (6/3 + 4/1)/2 = 3; sum-norm(10) 10/(2*10) = .5
    loss = torch.tensor([1.0, 2.0, float("nan"), 3.0, 4.0])
    mask = torch.tensor([True, True, False, True, True])
    seq = torch.tensor([0, 0, 0, 0, 1])
    norm = LossNorm(4, 2)
    assert aggregate(loss, mask, seq, norm, "token-mean", None).item() == 2.5
    assert aggregate(loss, mask, seq, norm, "seq-mean-token-mean", None).item() == 3.0
    assert aggregate(loss, mask, seq, norm, "seq-mean-token-sum-norm", 10).item() == 0.5


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_no_trainable_tokens_gives_zero_loss_and_grad(agg):
    # a micro-batch whose only sequence has no loss token (and one that does, in seq-mean modes)
    inp, lp = inputs([1.3, 0.7, 1.0], [1.0, -1.0, 1.0], seq=[0, 0, 1], mask=[False, False, True],
                     norm=LossNorm(1, 1), entropy=torch.ones(3))  # fmt: skip
    cfg = LossConfig(agg=agg, norm_len=4, entropy_coef=0.1)
    loss, m = get_loss("ppo_clip")(inp, cfg)
    loss.backward()
    assert torch.isfinite(lp.grad).all() and lp.grad[:2].tolist() == [0.0, 0.0]
    inp, lp = inputs([1.3, 0.7], [1.0, -1.0], mask=[False, False], norm=LossNorm(0, 0),
                     entropy=torch.ones(2))  # fmt: skip
    loss, m = get_loss("ppo_clip")(inp, cfg)
    loss.backward()
    assert loss.item() == 0.0 and lp.grad.tolist() == [0.0, 0.0]
    assert all(math.isfinite(v) for v in reduce_metrics([m]).values())


class TinyLM(torch.nn.Module):
    """Embedding -> tanh -> tied projection: no attention, so packing is irrelevant here."""

    def __init__(self, vocab: int = 13, hidden: int = 8):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, hidden)

    def logprobs(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> tuple:
        h = torch.tanh(self.emb(ids))
        return logprobs_from_hidden(h, self.emb.weight, ids, pos, mask, with_entropy=True,
                                    chunk_tokens=3)  # fmt: skip


@pytest.mark.parametrize(
    ("name", "agg"),
    [("ppo_clip", "token-mean"), ("ppo_clip", "seq-mean-token-mean"),
     ("ppo_clip", "seq-mean-token-sum-norm"), ("gspo", "seq-mean-token-mean")],
)  # fmt: skip
def test_uneven_micro_batches_accumulate_to_the_full_batch_gradient(name, agg):
    torch.manual_seed(1)
    lens = [5, 9, 3, 7, 2]
    n = sum(lens)
    ids = torch.randint(0, 13, (n,))
    seq = torch.cat([torch.full((k,), s) for s, k in enumerate(lens)])
    pos = torch.cat([torch.arange(k) for k in lens])
    mask = (torch.rand(n) < 0.6) & (pos > 0)
    mask[seq == 4] = False  # one sequence with no trainable token
    adv = torch.randn(n)
    rollout = -torch.rand(n) * 3
    trainer_old = rollout + 0.5 * torch.randn(n)  # IS weights vary, some above the cap
    ref = -torch.rand(n) * 3
    per_seq = torch.zeros(len(lens)).index_add(0, seq, mask.float())
    norm = LossNorm(int(mask.sum()), int((per_seq > 0).sum()))
    cfg = LossConfig(name=name, agg=agg, norm_len=16, kl_coef=0.05, entropy_coef=0.01,
                     clip_high=0.28, tis_cap=2.0)  # fmt: skip

    def grad_of(groups: list[list[int]], norm_of) -> tuple[torch.Tensor, float]:
        model = TinyLM()
        total = 0.0
        for g in groups:
            idx = torch.cat([torch.nonzero(seq == s).squeeze(-1) for s in g])
            local_seq = torch.cat([torch.full((lens[s],), j) for j, s in enumerate(g)])
            lp, ent = model.logprobs(ids[idx], pos[idx], mask[idx])
            inp = LossInputs(
                lp, rollout[idx], adv[idx], mask[idx], local_seq, norm_of(idx, local_seq),
                ref_logprobs=ref[idx], entropy=ent, trainer_old_logprobs=trainer_old[idx],
            )  # fmt: skip
            loss, _ = get_loss(name)(inp, cfg)
            loss.backward()
            total += loss.item()
        return model.emb.weight.grad.clone(), total

    full, full_loss = grad_of([[0, 1, 2, 3, 4]], lambda i, s: norm)
    acc, acc_loss = grad_of([[1], [0, 4, 2], [3]], lambda i, s: norm)  # uneven: 9, 10, 7 tokens
    assert acc_loss == pytest.approx(full_loss, abs=1e-6)
    assert torch.allclose(acc, full, atol=1e-7, rtol=1e-5)

    # the bug this guards against: normalising each micro-batch by its own counts
    def local(i, s):
        m = mask[i]
        return LossNorm(int(m.sum()), len(set(s[m].tolist())))

    wrong, _ = grad_of([[1], [0, 4, 2], [3]], local)
    assert not torch.allclose(wrong, full, atol=1e-5)


def test_value_clip_loss():
    # token 0: v 1.5, old 1, R 2: err .25; clipped v 1.2 -> .64; loss .5*.64 = .32, no gradient
    # token 1: v 1.1, old 1, R 2: err .81 both ways -> .405; d/dv = v - R = -.9
    # token-mean: (.32 + .405)/2 = .3625; grads /2
    v = torch.tensor([1.5, 1.1], requires_grad=True)
    inp = LossInputs(
        torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.ones(2, dtype=torch.bool),
        torch.zeros(2, dtype=torch.long), LossNorm(2, 1), values=v,
        old_values=torch.tensor([1.0, 1.0]), returns=torch.tensor([2.0, 2.0]),
    )  # fmt: skip
    loss, m = get_loss("value_clip")(inp, LossConfig(value_clip=0.2))
    loss.backward()
    assert loss.item() == pytest.approx(0.3625)
    assert v.grad.tolist() == pytest.approx([0.0, -0.45])
    assert m["vf_clipfrac"].item() == pytest.approx(0.5)


def test_reduce_metrics():
    ms = [
        {"a": torch.tensor(0.25), "r_max": torch.tensor(2.0), "r_min": torch.tensor(0.5)},
        {"a": 0.5, "r_max": float("-inf"), "r_min": 0.25},
    ]
    assert reduce_metrics(ms) == {"a": 0.75, "r_max": 2.0, "r_min": 0.25}


def test_config_errors_are_clear():
    with pytest.raises(ValueError) as e:
        get_loss("ppo")
    msg = str(e.value)
    assert "\n" not in msg and "'ppo'" in msg
    assert all(k in msg for k in known_losses()) and "gspo" in msg
    with pytest.raises(ValidationError, match="unknown loss 'ppo'"):
        LossConfig(name="ppo")
    with pytest.raises(ValidationError, match="clip_c"):
        LossConfig(clip_c=0.9)
    with pytest.raises(ValidationError, match="clip_high=-0.1: a negative clip range"):
        LossConfig(clip_high=-0.1)
    with pytest.raises(ValidationError, match="kl_coef=-0.01 is negative"):
        LossConfig(kl_coef=-0.01)  # an audit: kl_mode=reward dropped it without a word
    with pytest.raises(ValidationError, match="norm_len"):
        LossConfig(agg="seq-mean-token-sum-norm")
    with pytest.raises(ValidationError, match="extra"):
        LossConfig(clip_hihg=0.3)
    # GSPO's ratio is per sequence: its aggregation is forced, a contrary explicit one refused
    assert LossConfig(name="gspo").agg == "seq-mean-token-mean"
    assert LossConfig(name="gspo", agg="seq-mean-token-mean").agg == "seq-mean-token-mean"
    with pytest.raises(ValidationError, match="algo.loss.name=gspo needs agg=seq-mean-token-mean"):
        LossConfig(name="gspo", agg="token-mean")


@pytest.mark.parametrize("setting", ["clip_high", "clip_low"])
def test_a_negative_clip_range_is_refused(setting):
    """An audit: algo.loss.clip_high=-0.1 (a sign slip for DAPO's 0.28) clips every token with a
    positive advantage at the first, on-policy step (ratio 1 > 1 + clip_high), so the policy
    only ever learnt to avoid its failures; the run looked as usual. clip_low < 0: the same for
    the negative advantages."""
    inp, lp = inputs([1.0, 1.0], [1.0, -1.0])
    loss, _ = get_loss("ppo_clip")(inp, LossConfig.model_construct(**{
        **LossConfig().model_dump(), setting: -0.1}))  # fmt: skip
    loss.backward()
    assert lp.grad[0 if setting == "clip_high" else 1] == 0  # the gradient it silently lost
    with pytest.raises(ValidationError, match=rf"{setting}.* no gradient"):
        LossConfig(**{setting: -0.1})
    assert LossConfig(clip_low=0.0, clip_high=0.0).clip_high == 0.0


@pytest.mark.parametrize("value_clip", [0.0, -0.2])
def test_a_value_clip_range_that_holds_the_critic_still_is_refused(value_clip):
    """algo.loss.value_clip <= 0 clamps the critic's value to its rollout-time value: 0 leaves a
    gradient only where the value moves away from the return, a negative range breaks the clamp.
    Refused at config time; null (unclipped) and ranges > 0 pass."""
    with pytest.raises(ValidationError, match="value_clip.*a range > 0"):
        LossConfig(value_clip=value_clip)
    assert LossConfig(value_clip=None).value_clip is None
    assert LossConfig(value_clip=0.5).value_clip == 0.5
