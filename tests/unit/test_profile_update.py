"""`learner.profile_step` profiles that step's update: the top ops and a Chrome trace land in
`learner.profile_dir`; `learner.profile_memory` adds the CUDA allocator's history (on CUDA only:
a CPU learner writes no memory snapshot, and says nothing false about one)."""

from __future__ import annotations

import gzip
import json
from types import SimpleNamespace

import torch

from agentrl.learner import LearnerConfig
from agentrl.learner.worker import LearnerWorker


def test_the_profiled_step_writes_its_ops_and_trace_and_other_steps_write_nothing(tmp_path):
    cfg = LearnerConfig(
        model_path="m", profile_step=2, profile_dir=str(tmp_path / "p"), profile_memory=True
    )
    worker = SimpleNamespace(cfg=cfg, device_type="cpu", rank=0)
    x = torch.randn(64, 64, requires_grad=True)
    with LearnerWorker._profiled(worker, 1):
        (x @ x).sum().backward()
    assert not (tmp_path / "p").exists()  # not the profiled step
    with LearnerWorker._profiled(worker, 2):
        (x @ x).sum().backward()
    assert "aten::mm" in (tmp_path / "p" / "update_rank0.txt").read_text()
    with gzip.open(tmp_path / "p" / "update_rank0.json.gz") as f:
        assert json.load(f)["traceEvents"]
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == [
        "update_rank0.json.gz",
        "update_rank0.txt",
    ]  # no allocator history without CUDA
