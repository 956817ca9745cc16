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
    policy/optim/__0_0.distcp cut short        one line from the learner, after the engine
    (or the full format's optim.pt)            had started

`damage(path, settings)` reads sizes and headers only (no weights, nothing run): every role's
model/ (and a LoRA run's adapter/) holds a config and safetensors files whose headers account
for their sizes exactly, the files a sharded index names; and when the run saved its optimizer
(its recorded `checkpoint.save_optimizer`), each role's optim/ holds its schedule and the files
of its format, whole: every .distcp file DCP's `.metadata` names, as long as the items it reads
from it, or an optim.pt whose zip directory is there at its end. `.metadata` is a pickle, read by
an unpickler that imports nothing (`_AsData`: every class it names is a plain record, so nothing
in the file can run; the learner's own reader checks it against DCP's classes later). It says
what is wrong, or None.
"""

from __future__ import annotations

import json
import pickle
import zipfile
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
        return _shards(optim)
    if fmt == "full":
        return _zip_whole(optim / "optim.pt")
    return None


def _shards(optim: Path) -> str | None:
    """Every .distcp file `.metadata` names is there and reaches the end of its last item."""
    ends = _distcp_ends(optim / ".metadata")
    if isinstance(ends, str):
        return ends
    for name, end in sorted(ends.items()):
        f = optim / name
        if not f.is_file():
            return f"{name} is missing (.metadata names it)"
        if (size := f.stat().st_size) < end:
            return f"{name} is cut short ({size:,} bytes where .metadata accounts for {end:,})"
    return None


def _zip_whole(f: Path) -> str | None:
    """torch.save writes a zip: its directory, at the end, is the first thing a cut loses."""
    if not (f.is_file() and (size := f.stat().st_size)):
        return f"{f.name} is missing or empty"
    try:
        with zipfile.ZipFile(f) as z:
            z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return f"{f.name} is cut short ({size:,} bytes, no zip directory at its end)"
    return None


class _Record:
    """An object of a class `.metadata` names, as data: its arguments and its state."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Record:
        obj = super().__new__(cls)
        obj.args, obj.state = args, None
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _AsData(pickle.Unpickler):
    """Imports nothing: each global the pickle names is a `_Record` class of that name."""

    def find_class(self, module: str, name: str) -> type:
        return type(name, (_Record,), {"__module__": __name__})


def _distcp_ends(metadata: Path) -> dict[str, int] | str:
    """Per .distcp file `metadata` names, the end of the last item read from it (DCP's
    `Metadata.storage_data`: index -> _StorageInfo(relative_path, offset, length)); or what is
    wrong with it."""
    try:
        with metadata.open("rb") as f:
            md = _AsData(f).load()
    except Exception:  # noqa: BLE001 - whatever a cut pickle raises, the answer is the same
        size = metadata.stat().st_size
        return f"{metadata.name} is cut short or not DCP metadata ({size:,} bytes)"
    state = md.state if isinstance(md, _Record) else None
    items = state.get("storage_data") if isinstance(state, dict) else None
    if not isinstance(items, dict) or not items:
        return f"{metadata.name} is not DCP metadata as agentrl writes it (no storage_data)"
    ends: dict[str, int] = {}
    for info in items.values():
        s = info.state if isinstance(info, _Record) and isinstance(info.state, dict) else {}
        name, offset, length = s.get("relative_path"), s.get("offset"), s.get("length")
        if not (isinstance(name, str) and isinstance(offset, int) and isinstance(length, int)):
            return f"{metadata.name} has an item that is not a file's offset and length"
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            return f"{metadata.name} reads from {name!r}, not a file of optim/"
        ends[name] = max(ends.get(name, 0), offset + length)
    return ends
