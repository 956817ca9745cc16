"""Updates that look healthy and learn (almost) nothing, warned once per run by the guards after
each optimizer step (agentrl/guards.py: `Guards.after_optimizer_step`, texts in
agentrl/update_health.py): a learner.grad_clip far below the gradient norm, which scales every
update down to nothing, and a PPO clip that holds most tokens step after step. The figures the
guards read come from the real pieces: the learner's clip (`optim.grad_norm_and_clip`) and the
loss's clip fractions (`ppo_clip`), named as the learner group names them."""

from __future__ import annotations

import io

import torch
from rich.console import Console

from agentrl.batch import LossNorm
from agentrl.config import Config
from agentrl.learner.optim import grad_norm_and_clip
from agentrl.loss import LossConfig, LossInputs, get_loss, reduce_metrics
from agentrl.train import make_guards


def run_guards(**learner: float):
    """The guards a run builds from its config (`train.make_guards`), with the warnings' titles
    and the console's text."""
    cfg = Config(env={"_target_": "agentrl.envs.code_exec:CodeExecEnv"}, learner=learner)
    alerts: list[str] = []
    out = io.StringIO()
    g = make_guards(cfg, Console(file=out, width=2000), lambda title, msg: alerts.append(title))
    return g, alerts, out


def grad_norm_with_clip(clip: float) -> tuple[float, float]:
    """One backward of a small model through the learner's own clip: the norm it reports (the
    worker's `grad_norm` metric) and the norm of the gradients it leaves for the optimizer."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    (model(torch.ones(4, 8)) * 50).pow(2).sum().backward()
    reported = grad_norm_and_clip(model, clip)
    left = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    return reported, float(left)


def test_the_reported_gradient_norm_is_the_one_before_the_clip():
    """The guard divides `<role>/grad_norm` by learner.grad_clip: it must be the norm before
    the clip (after it, it could never exceed the clip)."""
    unclipped, _ = grad_norm_with_clip(0.0)
    reported, left = grad_norm_with_clip(1e-4)
    assert reported > 1e3 and abs(reported - unclipped) < 1e-3 * unclipped
    assert abs(left - 1e-4) < 1e-6  # the optimizer sees the clipped gradient


def test_a_tiny_grad_clip_that_shrinks_every_update_is_warned_once_with_its_figure():
    """learner.grad_clip=1e-4 with gradient norms of 0.5: every update 5000x smaller than the
    lr says, and no chart but grad_norm (which looks fine) shows it."""
    g, alerts, out = run_guards(grad_clip=1e-4)
    for _ in range(4):
        g.after_optimizer_step({"policy/grad_norm": 0.5, "policy/skipped": 0.0})
    assert alerts == []  # a few steps are not yet a pattern
    for _ in range(20):
        g.after_optimizer_step({"policy/grad_norm": 0.5, "policy/skipped": 0.0})
    assert alerts == ["updates shrunk by grad_clip"]  # once per run
    text = out.getvalue()
    assert "learner.grad_clip=0.0001 scaled the policy's updates down 5000x" in text
    assert "in 5 of the last 5 optimizer steps" in text and "Raise learner.grad_clip" in text


def test_the_usual_clip_and_the_critics_own_norm_are_judged_apart():
    g, alerts, out = run_guards()  # learner.grad_clip=1.0
    for k in range(30):  # a spike now and then is what the clip is for
        g.after_optimizer_step({"policy/grad_norm": 500.0 if k % 4 == 0 else 0.8,
                                "critic/grad_norm": 300.0 if k >= 20 else 2.0})  # fmt: skip
    assert alerts == ["updates shrunk by grad_clip"]
    assert "scaled the critic's updates down 300x" in out.getvalue()
    off, alerts, _ = run_guards(grad_clip=0.0)  # no clipping: nothing scaled down
    for _ in range(20):
        off.after_optimizer_step({"policy/grad_norm": 1e4, "policy/skipped": 0.0})
    assert alerts == []


def ppo_step(pos: float, neg: float = 1.0) -> dict[str, float]:
    """One optimizer step's policy metrics, as the learner group names them, from the ppo_clip
    loss over 10 tokens: 5 with a positive advantage and the ratio pi / pi_old `pos`, 5 with a
    negative one and the ratio `neg`."""
    n = 10
    old = torch.full((n,), -1.0)
    lp = (old + torch.tensor([pos, neg] * 5).log()).requires_grad_()
    inp = LossInputs(logprobs=lp, rollout_logprobs=old, trainer_old_logprobs=old,
                     advantages=torch.tensor([1.0, -1.0] * 5), loss_mask=torch.ones(n),
                     seq_ids=torch.zeros(n, dtype=torch.long), norm=LossNorm(n, 1))  # fmt: skip
    _, metrics = get_loss("ppo_clip")(inp, LossConfig())
    return {f"policy/{k}": v for k, v in reduce_metrics([metrics]).items()}


def test_a_ppo_clip_that_holds_most_tokens_step_after_step_is_warned_once():
    """Ratios of 3 hold every token with a positive advantage (half of them) past 1 + 0.2: at
    exactly half nothing is said. Ratios of 3 and 1/3 hold all of them (the ones with a
    negative advantage below 1 - 0.2): most of each update is discarded."""
    g, alerts, _ = run_guards()
    assert ppo_step(3.0)["policy/pg_clipfrac_high"] == 0.5
    for _ in range(20):
        g.after_optimizer_step(ppo_step(3.0))
        g.after_optimizer_step(ppo_step(1.0))  # an epoch's first mini-batch: pi_old is pi
    assert alerts == []
    g, alerts, out = run_guards()
    for k in range(20):
        g.after_optimizer_step(ppo_step(3.0, 1 / 3) if k % 4 else ppo_step(1.0))
    assert alerts == ["PPO clip discards most tokens"]  # once per run
    text = out.getvalue()
    assert "held the ratio of 100% of the sampled tokens" in text and "5 of the last 7" in text
    assert "learner.lr too high" in text and "trainer.async.max_staleness" in text
