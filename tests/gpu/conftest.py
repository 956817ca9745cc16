"""Shared pieces of the GPU tests: a small random bf16 Qwen3, a fresh Ray per test, a random
TrainBatch, and a real SGLang server on loopback (SGLang from ../shared/gpu-host on our hosts).

The suite runs in parallel: `pytest -m gpu tests/gpu -n 6 --dist loadgroup` (pytest-xdist) on
one GPU, each worker's tests on its own GPU where there are several (`_gpu_place`). Each test
holds a shared turn on the GPUs; one marked `gpu_alone` (it reads the device's free memory) runs
with no other test on them (gpu_helpers.gpu_turn). The longest tests go first, in the order
xdist's scheduler needs (`SECONDS`, `xdist_order`), and `--gpu-budget-s S` refuses to start a
run whose estimate exceeds S."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gpu_helpers import (
    GPU_IDS,
    MACHINE_GPUS,
    gpu_turn,
    host_gpus,
    is_two_gpu_test,
    lpt_seconds,
    per_process_gpu_memory_visible,
    planned_seconds,
    worker_gpu,
    xdist_order,
)

from agentrl.learner import RayConfig
from agentrl.learner.ray_start import start_ray, stop_ray


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = tmp_path_factory.mktemp("qwen3-small")
    cfg = Qwen3Config(
        vocab_size=151936, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
        tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    return out


@pytest.fixture
def ray_on(monkeypatch):
    """start(devices): a fresh Ray that sees only these GPUs."""

    def start(devices: str) -> None:
        stop_ray()
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", host_gpus(devices))
        start_ray(RayConfig(object_store_mb=512))

    yield start
    stop_ray()


@pytest.fixture(autouse=True)
def _gpu_place(request, monkeypatch):
    """On a machine of several GPUs, a one-GPU test sees only its worker's GPU (gw0 the first,
    gw1 the second, ...: `worker_gpu`), so the suite's load spreads over them; a two-GPU test
    sees them all. Its "0" is then that GPU (`host_gpus`), for Ray, SGLang and agentrl alike."""
    if MACHINE_GPUS > 1:
        every = ",".join(GPU_IDS)
        mine = every if is_two_gpu_test(request.node.nodeid) else worker_gpu()
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mine)
    yield


@pytest.fixture(autouse=True)
def _gpu_turn(request):
    """A `gpu_alone` test measures GPU memory: it runs alone only where NVML cannot name the
    processes that use it (then only the device's free memory tells)."""
    alone = request.node.get_closest_marker("gpu_alone") is not None
    with gpu_turn(alone=alone and not per_process_gpu_memory_visible()):
        yield


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--gpu-budget-s", type=float, default=None,
        help="refuse to start the GPU suite when its estimate (gpu_helpers.SECONDS, spread over "
        "the -n workers, longest first) exceeds this many seconds",
    )  # fmt: skip


@pytest.hookimpl(trylast=True)  # after tests/conftest.py's file order: this one decides
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The GPU tests in the order that makes xdist's workers end together: the longest start
    first, each worker's queued test paired against its running one (`xdist_order`). Every
    worker orders its collection alike (the controller checks they match)."""
    gpu = [it for it in items if "tests/gpu/" in it.path.as_posix()]
    if gpu:
        rest = [it for it in items if it not in gpu]
        workers = getattr(config, "workerinput", {}).get("workercount", 1)
        times = [planned_seconds(it.nodeid, MACHINE_GPUS) for it in gpu]
        items[:] = [gpu[i] for i in xdist_order(times, workers)] + rest


def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """On the controller, before any test runs: the suite's estimate on this many workers, and a
    refusal when it cannot fit `--gpu-budget-s` (a device call's limit)."""
    config = node.config
    if getattr(config, "_gpu_estimated", False):
        return
    config._gpu_estimated = True
    gpus = MACHINE_GPUS
    workers = int(config.getoption("numprocesses") or 1)
    est, work = lpt_seconds(ids, workers, gpus)
    budget = config.getoption("--gpu-budget-s", None)
    line = (
        f"GPU suite: {len(ids)} tests, about {work:.0f} s of work on {max(gpus, 1)} GPU(s): "
        f"about {est:.0f} s on {workers} workers (tests/gpu/gpu_helpers.py SECONDS)"
    )
    print(line, flush=True)
    if budget is not None and est > budget:
        pytest.exit(f"{line}, over --gpu-budget-s {budget:.0f}: not started. Run fewer tests, "
                    "or more workers where the GPU has room", returncode=3)  # fmt: skip
