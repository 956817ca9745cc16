"""A checkpoint's role directories as a resume finds them whole (agentrl/ckpt_files.py), for
tests that build checkpoints by hand: a config, one safetensors file whose header accounts for
its size, and an optimizer directory in the sharded format."""

from __future__ import annotations

import json
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
    (optim / ".metadata").write_bytes(b"m")
    (optim / "__0_0.distcp").write_bytes(b"d")
    return step_dir / role
