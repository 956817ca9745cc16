"""CheckpointWriter's host copies (agentrl/learner/checkpoint.py): live host tensors are copied
before a background save returns; state that `learner.offload` left in pinned host memory (never
written in place) is copied in the writer's thread, off the training loop's path."""

import socket
import threading

import pytest
import torch
import torch.distributed as dist

from agentrl.learner.checkpoint import CheckpointWriter


@pytest.fixture
def writer(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    w = CheckpointWriter(0, torch.device("cpu"))
    # the CPU stands in for a GPU learner's offloaded state: tensors of more than one element
    # are "pinned host state", scalars are live (as Adam's step counters are)
    monkeypatch.setattr(w, "_offloaded", lambda t: t.numel() > 1)
    yield w
    w.pool.shutdown(wait=True)
    dist.destroy_process_group()


def test_offloaded_state_is_copied_in_the_writers_thread_and_live_state_at_once(writer):
    weights, step = torch.arange(1000.0), torch.tensor(7.0)
    gate = threading.Event()
    writer.pool.submit(gate.wait)  # the writer's one thread is busy: nothing of ours runs yet
    writer.host[("k", "w")] = torch.full((1000,), -1.0)  # the writer's buffer (reserve()'s)
    staged = writer._stage({"w": weights, "step": step}, "k")
    seen = {}
    writer.write(True, lambda tree: seen.update({k: v.clone() for k, v in tree.items()}), staged)
    step += 1  # the next optimizer step bumps the live counter in place
    assert float(staged["step"]) == 7.0  # copied before write() returned
    assert staged["w"] is writer.host[("k", "w")]  # the writer's own buffer...
    assert bool((staged["w"] == -1).all())  # ...not filled yet: that is the thread's work
    assert not writer.finish(wait=False)
    gate.set()
    assert writer.finish(wait=True)
    assert torch.equal(seen["w"], torch.arange(1000.0)) and float(seen["step"]) == 7.0
    assert writer.deferred == []


def test_offloaded_state_staged_for_no_write_is_copied_by_the_save_itself(writer):
    """A save that stages state but writes none of it on this rank leaves no copy pending."""
    model = torch.nn.Linear(4, 4)
    writer.rank = 1  # not the rank that writes the weights
    before = model.weight.detach().clone()
    staged = writer._stage({"w": model.weight.detach()}, "k")
    assert len(writer.deferred) == 1
    writer.save(model, None, None, "/nonexistent", [], "", "sharded", background=True)
    assert writer.deferred == [] and torch.equal(staged["w"], before)
