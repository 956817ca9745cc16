"""Helpers of the GPU tests (a module with a unique name: conftest modules are not importable)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from agentrl.batch import TrainBatch, global_norm


def make_batch(seed: int = 0, n_seqs: int = 8) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    ids, mask, seq, pos = [], [], [], []
    for s in range(n_seqs):
        n = int(torch.randint(40, 200, (1,), generator=g))
        p = int(torch.randint(10, n - 10, (1,), generator=g))
        ids.append(torch.randint(0, 50000, (n,), generator=g))
        m = torch.zeros(n, dtype=torch.bool)
        m[p:] = True
        mask.append(m)
        seq.append(torch.full((n,), s))
        pos.append(torch.arange(n))
    mask_N, seq_N = torch.cat(mask), torch.cat(seq)
    n = mask_N.numel()
    old = torch.where(mask_N, -torch.rand(n, generator=g) * 3 - 10, 0.0)
    adv = torch.where(mask_N, torch.randn(n, generator=g), 0.0)
    return TrainBatch(
        torch.cat(ids), torch.cat(pos), mask_N, old, adv, seq_N, global_norm(mask_N, seq_N)
    )


@contextmanager
def launch_sglang(model_dir: Path, log_dir: Path, gpu: str, *extra: str, timeout_s: float = 420):
    """`python -m sglang.launch_server` on 127.0.0.1 and one GPU; yields its URL."""
    pytest.importorskip("sglang")
    port = 31000 + os.getpid() % 1000
    log = Path(log_dir) / "server.log"
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir),
           "--host", "127.0.0.1", "--port", str(port), "--skip-tokenizer-init",
           "--attention-backend", "triton", "--sampling-backend", "pytorch",
           "--grammar-backend", "none", "--mm-feature-transport", "cpu", "--disable-cuda-graph",
           "--mem-fraction-static", "0.3", "--dtype", "bfloat16", *extra]  # fmt: skip
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu, "NCCL_SOCKET_IFNAME": "lo"}
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        deadline = time.monotonic() + timeout_s
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
