"""A checkpoint's role directories as a resume finds them whole (agentrl/ckpt_files.py), for
tests that build checkpoints by hand: a config, one safetensors file whose header accounts for
its size, and an optimizer directory in the sharded format (a one-byte shard and DCP metadata
naming it)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path


def safetensors_bytes(values: int = 1) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [values],
                               "data_offsets": [0, 4 * values]}}).encode()  # fmt: skip
    return len(header).to_bytes(8, "little") + header + b"\0" * (4 * values)


def whole_role(step_dir: Path, role: str = "policy") -> Path:
    """`step_dir/role` with model/ and optim/ as agentrl writes them (no real weights)."""
    model, optim = step_dir / role / "model", step_dir / role / "optim"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(safetensors_bytes())
    optim.mkdir(exist_ok=True)
    (optim / "schedule.json").write_text(json.dumps({"format": "sharded", "scheduler": {}}))
    (optim / ".metadata").write_bytes(dcp_metadata({"__0_0.distcp": 1}))
    (optim / "__0_0.distcp").write_bytes(b"d")
    return step_dir / role


def dcp_metadata(sizes: dict[str, int]) -> bytes:
    """DCP's `.metadata` for one bytes item filling each named .distcp file of `sizes`."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, MetadataIndex

    names = {f"optim.item{i}": (f, n) for i, (f, n) in enumerate(sizes.items())}
    return pickle.dumps(
        Metadata(
            state_dict_metadata={k: BytesStorageMetadata() for k in names},
            storage_data={MetadataIndex(k): _StorageInfo(f, 0, n) for k, (f, n) in names.items()},
        )
    )
