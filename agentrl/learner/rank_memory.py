"""What one learner rank measures of its memory: the most the GPU allocator held per phase
(logprobs, update, sync), the allocator's retries, and the rank's GPU and host memory now. The
worker (worker.py) reports these to the driver; memory.py plans with them."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import torch

from agentrl.learner import fsdp, memory


class RankMemory:
    def __init__(self, device: torch.device, device_type: str) -> None:
        self.device, self.on_gpu = device, device_type == "cuda"
        self.peaks: dict[str, float] = {}  # GiB the allocator held at most, per phase (GPU)

    @contextlib.contextmanager
    def peak(self, phase: str, keep_max: bool = False) -> Iterator[None]:
        """Record the most GPU memory the allocator held during the block as `phase`."""
        if not self.on_gpu:
            yield
            return
        torch.cuda.reset_peak_memory_stats()
        try:
            yield
        finally:
            gib = torch.cuda.max_memory_allocated() / 2**30
            self.peaks[phase] = max(gib, self.peaks.get(phase, 0.0)) if keep_max else gib

    def take_peaks(self) -> dict[str, float]:
        """GiB per phase since the last call; empty on CPU."""
        out, self.peaks = self.peaks, {}
        return out

    def alloc_retries(self) -> int:
        """The CUDA caching allocator's count of allocations it retried after freeing its cache
        (each one synchronises and returns memory to the driver: an update at the edge of the
        GPU's memory slows down without failing); 0 on CPU."""
        if not self.on_gpu:
            return 0
        return int(torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0))

    def stats(self, model: torch.nn.Module, opt: Any) -> dict[str, Any]:
        """GPU memory in GiB, the device's free and total bytes (0 on CPU), and the host this
        rank runs on with its available memory (MemAvailable, bytes) and the rank's state there."""
        host = {
            "host": socket.gethostname(),
            "host_available_bytes": memory.host_available_bytes(),
            "host_state_bytes": fsdp.host_state_bytes(model, opt),
        }
        if not self.on_gpu:
            gpu = {"allocated_gib": 0.0, "reserved_gib": 0.0, "free_bytes": 0, "total_bytes": 0}
            return {**gpu, **host}
        free, total = torch.cuda.mem_get_info()
        return {
            "allocated_gib": torch.cuda.memory_allocated() / 2**30,
            "reserved_gib": torch.cuda.memory_reserved() / 2**30,
            "free_bytes": free,
            "total_bytes": total,
            **host,
        }
