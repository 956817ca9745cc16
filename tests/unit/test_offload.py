"""learner.offload: what the colocated learner moves off the GPU while the engine samples."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from agentrl.learner import LearnerConfig
from agentrl.learner.fsdp import offload
from agentrl.learner.worker import LearnerWorker


@pytest.mark.parametrize(
    ("what", "moved"),
    [("all", ("model", "opt")), ("optimizer", (None, "opt")), ("none", (None, None))],
)
def test_offload_setting_picks_what_moves(what, moved):
    worker = SimpleNamespace(cfg=LearnerConfig(offload=what), model="model", opt="opt")
    assert LearnerWorker._movable(worker) == moved


def test_offload_rejects_unknown_values_and_moves_only_what_it_is_given():
    with pytest.raises(ValidationError, match="offload"):
        LearnerConfig(offload="gpu")
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    offload(None, opt, "cpu")  # the model untouched, the moments moved (here: stay on CPU)
    offload(None, None, "cpu")
    assert all(v.device.type == "cpu" for s in opt.state.values() for v in s.values())
