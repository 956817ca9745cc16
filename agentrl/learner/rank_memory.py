"""What one learner rank measures of its memory: the most the GPU allocator held per phase
(logprobs, update, sync), the allocator's retries, and the rank's GPU and host memory now. The
worker (worker.py) reports these to the driver; memory.py plans with them."""

from __future__ import annotations

import contextlib
import os
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

    @contextlib.contextmanager
    def expandable(self, on: bool = True) -> Iterator[None]:
        """The block in PyTorch's expandable segments (learner.update_memory=expandable): the
        allocator maps pages into one growing region per stream instead of cutting fixed-size
        segments, so activations of packed micro-batches, each a different size, do not leave
        the cache in pieces that the next one cannot use. At 1.5B colocated on an H200 (119 GiB
        of 139) the fixed segments ran out in one or two of five updates (an allocator retry,
        about 0.1 s) though the memory sufficed; expandable ones never did, but handing them
        back to the engine after the update took 0.18 s longer a step. Off again afterwards:
        the weight push shares its buffers over CUDA IPC, which wants ordinary segments.
        Nothing to do on CPU, or where PYTORCH_CUDA_ALLOC_CONF chooses expandable segments."""
        if not (on and self.on_gpu) or "expandable_segments" in os.environ.get(
            "PYTORCH_CUDA_ALLOC_CONF", ""
        ):
            yield
            return
        _allocator_settings("expandable_segments:True")
        try:
            yield
        finally:
            _allocator_settings("expandable_segments:False")

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


def _allocator_settings(setting: str) -> None:
    """PyTorch's allocator settings, changed while the process runs (torch >= 2.9 names it
    `_accelerator_setAllocatorSettings`; before, the CUDA allocator's own)."""
    fn = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if fn is None:
        fn = torch._C._cuda_cudaCachingAllocator_set_allocator_settings
    fn(setting)
