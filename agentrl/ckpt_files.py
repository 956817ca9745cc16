"""Whether a checkpoint's files are all there and whole, read before a resume starts anything.

A checkpoint agentrl committed is whole (agentrl/ckpt.py: COMPLETE is written last), but the
directory can be damaged after: a copy killed half-way (`cp -r` and `rsync` write COMPLETE as
soon as any other file), a full disk on the way back from an archive, a file removed by hand.
Resumed, such a checkpoint failed late and unclearly, or not at all:

    policy/model/model.safetensors cut short   a traceback from the learner, after the engine
                                               had started on the same files
    policy/optim/ missing                      resumed with AdamW's moments from zero and the
                                               lr warm-up again, under a note that blamed
                                               checkpoint.save_optimizer=false

`damage(path, settings)` reads sizes and headers only (no weights, nothing unpickled): every
role's model/ (and a LoRA run's adapter/) holds a config and safetensors files whose headers
account for their sizes exactly, the files a sharded index names; and when the run saved its
optimizer (its recorded `checkpoint.save_optimizer`), each role's optim/ holds its schedule and
the files of its format. It says what is wrong, or None.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_ROLES = ("policy", "critic")
_MAX_HEADER = 100 << 20  # safetensors' own bound on a header


def damage(path: Path, settings: dict[str, Any]) -> str | None:
    """What is missing or cut short in the checkpoint `path`, or None (module docstring)."""
    if not (path / "policy").is_dir():
        return "it has no policy/ directory"
    for role in [r for r in _ROLES if (path / r).is_dir()]:
        for sub in ("model", "adapter"):
            d = path / role / sub
            if (sub == "model" or d.exists()) and (why := _weights(d)):
                return f"{role}/{sub}: {why}"
        if settings.get("checkpoint.save_optimizer") is True and (why := _optimizer(path / role)):
            return f"{role}/optim: {why} (the run saved its optimizer state)"
    return None


def _weights(d: Path) -> str | None:
    if not d.is_dir():
        return "missing"
    files = sorted(d.glob("*.safetensors"))
    if not files:
        return "no .safetensors file"
    if d.name == "model" and not (d / "config.json").is_file():
        return "no config.json"
    index = d / "model.safetensors.index.json"
    if index.is_file():
        try:
            named = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"{index.name} is not a safetensors index"
        if missing := sorted(named - {f.name for f in files}):
            return f"{missing[0]} is missing ({index.name} names it)"
    for f in files:
        if why := _cut_short(f):
            return why
    return None


def _cut_short(f: Path) -> str | None:
    """Whether a safetensors file's header accounts for its size (8 bytes of header length,
    the JSON header, then the tensors' bytes up to the largest end offset)."""
    size = f.stat().st_size
    with f.open("rb") as h:
        head = h.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 0 or n > min(size - 8, _MAX_HEADER):
            return f"{f.name} is cut short ({size:,} bytes, less than its header)"
        try:
            header = json.loads(h.read(n))
            ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
            want = 8 + n + max(ends, default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return f"{f.name} has no readable safetensors header"
    if want != size:
        return f"{f.name} is {size:,} bytes where its header accounts for {want:,}"
    return None


def _optimizer(role: Path) -> str | None:
    optim = role / "optim"
    if not optim.is_dir():
        return "missing"
    try:
        fmt = json.loads((optim / "schedule.json").read_text()).get("format")
    except (OSError, ValueError, AttributeError):
        return "schedule.json is missing or not a JSON record"
    if fmt == "sharded":
        if not (optim / ".metadata").is_file():
            return ".metadata is missing"
        if not any(f.stat().st_size for f in optim.glob("*.distcp")):
            return "no .distcp file with data"
    elif fmt == "full" and not (
        (optim / "optim.pt").is_file() and (optim / "optim.pt").stat().st_size
    ):
        return "optim.pt is missing or empty"
    return None
