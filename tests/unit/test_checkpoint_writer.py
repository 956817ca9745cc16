"""CheckpointWriter's host copies (agentrl/learner/checkpoint.py): every host tensor a background
save stages is copied before the save returns, so what is written is the state at the save
whatever the next step does to it. (Copying `learner.offload`'s pinned host state in the
writer's thread instead wrote a later state on an H100: tests/gpu/test_learner_gpu.py.)"""

import socket
import threading

import pytest
import torch
import torch.distributed as dist

from agentrl.learner.checkpoint import CheckpointWriter


@pytest.fixture
def writer():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    w = CheckpointWriter(0, torch.device("cpu"))
    yield w
    w.pool.shutdown(wait=True)
    dist.destroy_process_group()


def test_host_state_is_copied_before_a_background_write_returns(writer):
    weights, step = torch.arange(1000.0), torch.tensor(7.0)
    gate = threading.Event()
    writer.pool.submit(gate.wait)  # the writer's one thread is busy: nothing of ours runs yet
    staged = writer._stage({"w": weights, "step": step}, "k")
    seen = {}
    writer.write(True, lambda tree: seen.update({k: v.clone() for k, v in tree.items()}), staged)
    weights.mul_(2)  # the next step changes the live state in place
    step += 1
    assert staged["w"].data_ptr() != weights.data_ptr()  # a buffer of the writer's own
    assert not writer.finish(wait=False)
    gate.set()
    assert writer.finish(wait=True)
    assert torch.equal(seen["w"], torch.arange(1000.0)) and float(seen["step"]) == 7.0
