"""The learner's AdamW has its moments before its first step (`optim.init_adam_state`), so they
are not carved out of the cache the first backward leaves: the state is the one torch's own first
step would make (same keys, shapes, dtypes, devices), and training with it gives the same
weights, bit for bit, as AdamW left to make it lazily."""

from __future__ import annotations

import pytest
import torch

from agentrl.learner import LearnerConfig
from agentrl.learner.optim import init_adam_state, make_optimizer


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        model(torch.randn(4, 6, generator=g)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()


def test_the_learners_optimizer_has_its_state_before_the_first_step():
    model = _model()
    opt, _ = make_optimizer(model, LearnerConfig(lr=1e-2))
    for p in model.parameters():
        st = opt.state[p]
        assert set(st) == {"step", "exp_avg", "exp_avg_sq"}
        assert float(st["step"]) == 0.0 and not st["exp_avg"].any() and not st["exp_avg_sq"].any()


@pytest.mark.parametrize("amsgrad", [False, True])
def test_made_up_front_it_is_the_state_and_the_training_of_a_lazy_adam(amsgrad):
    lazy_model, eager_model = _model(), _model()
    kw = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, amsgrad=amsgrad)
    lazy = torch.optim.AdamW(lazy_model.parameters(), **kw)
    eager = torch.optim.AdamW(eager_model.parameters(), **kw)
    init_adam_state(eager)
    _train(lazy_model, lazy, 1)  # torch makes its state here
    made = {k: (v.shape, v.dtype, v.device) for k, v in lazy.state[lazy_model[0].weight].items()}
    mine = {k: (v.shape, v.dtype, v.device) for k, v in eager.state[eager_model[0].weight].items()}
    assert mine == made
    _train(eager_model, eager, 1)
    _train(lazy_model, lazy, 3)
    _train(eager_model, eager, 3)
    for a, b in zip(lazy_model.parameters(), eager_model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert lazy.state_dict()["state"].keys() == eager.state_dict()["state"].keys()
