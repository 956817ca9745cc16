"""checkpoint.save_optimizer=false leaves AdamW's moments out of a checkpoint, not the learning
rate schedule's position: a resumed run goes on with its warm-up and decay where they were. One
rank of FSDP2 on gloo, a two-layer model: real saves."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from agentrl.ckpt import optimizer_note
from agentrl.learner import LearnerConfig
from agentrl.learner.checkpoint import _save_optimizer, load_optimizer
from agentrl.learner.optim import apply_hparams


@pytest.fixture
def gloo():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def learner(steps: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))  # warm-up
    for _ in range(steps):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        sched.step()
    return model, opt, sched


def test_a_checkpoint_without_the_optimizer_keeps_the_schedules_position(gloo, tmp_path: Path):
    """Found by a red-team pass: with checkpoint.save_optimizer=false nothing of optim/ was
    written, so a resumed run's schedule started again at step 0: a warm-up of 10 steps ran
    again from lr 0 after a resume at step 6, and a decay restarted at its top, without a word."""
    model, opt, sched = learner(6)
    out = tmp_path / "step_00000006" / "policy" / "optim"
    _save_optimizer(model, None, sched, out, "sharded", 0, None)  # save_optimizer=false
    assert json.loads((out / "schedule.json").read_text())["format"] == "none"
    model2, opt2, sched2 = learner(0)  # the resumed run's fresh learner
    load_optimizer(model2, opt2, sched2, out, 0)
    apply_hparams(opt2, sched2, LearnerConfig(lr=1e-2))  # as the worker's load does next
    assert sched2.last_epoch == 6 and opt2.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.7)
    assert not opt2.state or all(not s for s in opt2.state.values())  # moments: none saved
    note = optimizer_note(out.parent.parent)
    assert "no optimizer state" in note and "checkpoint.save_optimizer" in note
    _save_optimizer(model, opt, sched, out, "sharded", 0, None)
    assert optimizer_note(out.parent.parent) is None
