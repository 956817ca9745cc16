"""CUDA-IPC payloads for SGLang's `/update_weights_from_tensor` (the colocated hybrid engine).

One bucket of full tensors is flattened into ONE contiguous uint8 CUDA tensor (SGLang's
`flattened_bucket` load format), so a whole bucket crosses the process boundary as a single
CUDA-IPC handle instead of one handle per parameter. The payload is what SGLang itself expects:
`MultiprocessingSerializer.serialize({"flattened_tensor", "metadata"}, output_str=True)` with
SGLang's torch-reduction patch (devices named by UUID, so the server maps them to its own index).

The sender must keep the flattened tensor alive until the server has loaded it: `IpcHold` keeps
the last payload's tensor until `release()`.
"""

from __future__ import annotations

import torch


def flattened_payload(named: list[tuple[str, torch.Tensor]]) -> tuple[str, torch.Tensor]:
    """(base64 payload for one server rank, the flattened CUDA tensor it points to)."""
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    monkey_patch_torch_reductions()
    bucket = FlattenedTensorBucket(named_tensors=named)
    flat = bucket.get_flattened_tensor()
    data = {"flattened_tensor": flat, "metadata": bucket.get_metadata()}
    return MultiprocessingSerializer.serialize(data, output_str=True), flat


class IpcHold:
    """Tensors whose IPC handles are in flight; dropped once the server has answered."""

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []

    def keep(self, t: torch.Tensor) -> None:
        self.tensors.append(t)

    def release(self) -> None:
        self.tensors.clear()
