"""A resumed run trains with the optimizer settings it was started with now, not the
checkpoint's: loading an optimizer state restores its lr, betas, eps and weight decay (and the
schedule's base lr) silently; `apply_hparams` puts this run's back and says what changed."""

from __future__ import annotations

import torch

from agentrl.learner import LearnerConfig
from agentrl.learner.optim import apply_hparams, lr_factor, make_optimizer


def _trained(cfg: LearnerConfig, steps: int):
    model = torch.nn.Linear(4, 2)
    opt, sched = make_optimizer(model, cfg)
    for _ in range(steps):
        model(torch.ones(1, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    return model, opt, sched


def test_a_changed_lr_and_betas_apply_from_the_resumed_step():
    old = LearnerConfig(lr=1e-3, warmup_steps=4, total_steps=20)
    model, opt, sched = _trained(old, 3)
    state, sched_state = opt.state_dict(), sched.state_dict()

    new = old.model_copy(update={"lr": 5e-3, "betas": (0.9, 0.95), "weight_decay": 0.1})
    opt2, sched2 = make_optimizer(model, new)
    opt2.load_state_dict(state)
    sched2.load_state_dict(sched_state)
    assert opt2.param_groups[0]["lr"] != 5e-3 * lr_factor(
        3, 4, 20, new.lr_schedule, new.min_lr_ratio
    )

    changed = apply_hparams(opt2, sched2, new)
    assert changed == {
        "lr": (1e-3, 5e-3),
        "betas": ((0.9, 0.999), (0.9, 0.95)),
        "weight_decay": (0.0, 0.1),
    }
    want = 5e-3 * lr_factor(3, 4, 20, new.lr_schedule, new.min_lr_ratio)
    assert abs(opt2.param_groups[0]["lr"] - want) < 1e-15 and sched2.get_last_lr() == [want]
    sched2.step()  # the schedule goes on from its position, at the new base lr
    want4 = 5e-3 * lr_factor(4, 4, 20, new.lr_schedule, new.min_lr_ratio)
    assert abs(opt2.param_groups[0]["lr"] - want4) < 1e-15


def test_unchanged_settings_report_nothing():
    cfg = LearnerConfig(lr=1e-3)
    model, opt, sched = _trained(cfg, 2)
    assert apply_hparams(opt, sched, cfg) == {}
