"""learner.update_memory: the update switches PyTorch's allocator to expandable segments and back
(rank_memory.RankMemory.expandable). On CPU, with the setting off, or where
PYTORCH_CUDA_ALLOC_CONF already names expandable_segments, the allocator is left alone. The
switch itself runs on CUDA only (bench/train_step.py on a GPU: no retries at 1.5B)."""

from __future__ import annotations

import pytest
import torch

from agentrl.learner import LearnerConfig, rank_memory
from agentrl.learner.rank_memory import RankMemory


def _calls(monkeypatch) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(rank_memory, "_allocator_settings", seen.append)
    return seen


def test_the_update_runs_in_expandable_segments_and_switches_back(monkeypatch):
    seen = _calls(monkeypatch)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    mem = RankMemory(torch.device("cpu"), "cuda")  # a GPU rank's bookkeeping, no CUDA needed
    with pytest.raises(RuntimeError), mem.expandable(True):
        assert seen == ["expandable_segments:True"]
        raise RuntimeError("the update failed")
    assert seen == ["expandable_segments:True", "expandable_segments:False"]


@pytest.mark.parametrize("case", ["cpu", "off", "user"])
def test_the_allocator_is_left_alone(monkeypatch, case):
    seen = _calls(monkeypatch)
    monkeypatch.setenv(
        "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False" if case == "user" else ""
    )
    mem = RankMemory(torch.device("cpu"), "cpu" if case == "cpu" else "cuda")
    with mem.expandable(case != "off"):
        pass
    assert seen == []


def test_ordinary_segments_are_the_default_and_expandable_a_choice():
    assert LearnerConfig().update_memory == "segments"
    assert LearnerConfig(update_memory="expandable").update_memory == "expandable"
    with pytest.raises(ValueError):
        LearnerConfig(update_memory="growing")
