"""One learner rank's half of a checkpoint: `model/` (a transformers dir) and `optim/`.

With `background=True` (checkpoint.async_save) training does not wait for the files, and on a GPU
not for the copies either: the weights (gathered on rank 0) and the optimizer shards are copied
into this writer's own pinned host buffers on a side CUDA stream, and the next step's kernels wait
for those copies on the GPU (`guard`), so the save returns once the copies are queued (state that
`learner.offload` left in host memory is copied before it returns: copying it in the writer's
thread instead wrote a state that was not the one at the save on an H100, the step from the
reloaded checkpoint off by as much as the step itself, tests/gpu/test_learner_gpu.py). Threads
then write the files from the host buffers while the next steps train (the optimizer through
`torch.distributed.checkpoint.save`, on a gloo group of its own, never the training group the
main thread uses meanwhile). The driver commits the checkpoint (agentrl/ckpt.py: COMPLETE marker,
rename, `latest`) only once every rank's `finish(wait)` says its writes are done, so a kill
during the copies or the writes leaves `latest` on the previous checkpoint. A write that fails for
a full disk says so (agentrl/ckpt.py: disk_full_error).

Loading runs nothing from the files. `optim/schedule.json` is JSON. The sharded optimizer state is
read through DCP with two replacements (`_SafeReader`, `_SafePlanner`): `.metadata`, a pickle,
is read by an unpickler that resolves only DCP's metadata records, torch.Size, dtypes and
layouts (each a plain record or a lookup by name: nothing it can build has behaviour), and whose
file references must be plain names in optim/; DCP's non-tensor items (the param groups' lr,
betas, ...) are read with `torch.load(weights_only=True)`, as DCP reads its tensor items itself
(torch 2.13, filesystem.py). The full format's `optim.pt` is read with `weights_only=True` too.
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from agentrl.ckpt import CheckpointError, disk_full_error
from agentrl.learner import fsdp, lora
from agentrl.learner.fsdp import ParamSpec


@contextlib.contextmanager
def _naming_a_full_disk(path: Any) -> Iterator[None]:
    """A write that failed for lack of space says so (the path, the free bytes, `latest` kept);
    anything else goes on as it was. BaseException: DCP's CheckpointException is one."""
    try:
        yield
    except BaseException as e:
        full = disk_full_error(path, e)
        if full is None:
            raise
        raise full from e


class CheckpointWriter:
    # gathered weight buckets (rank 0, several ranks) alive on the GPU until their copies are done
    IN_FLIGHT_BUCKETS = 2

    def __init__(self, rank: int, device: torch.device) -> None:
        self.rank, self.device = rank, device
        self.group = dist.new_group(backend="gloo")  # collective: every rank builds it at setup
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-write")
        self.pending: list[Future] = []
        # host copies, kept between checkpoints (pinned on GPU hosts): fresh pageable memory
        # costs page faults on every save (7.5 s for 1.5B on an H100), and only pinned memory
        # lets the copies run on a side stream. Our own, not DCP's stager: its pinned
        # DefaultStager fails on FSDP2's DTensor optimizer state in torch 2.11 (KeyError in its
        # deepcopy)
        self.host: dict[Any, torch.Tensor] = {}
        cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if cuda else None
        self.copied: torch.cuda.Event | None = None  # the last save's copies, recorded on stream
        self.reserving: Future | None = None  # reserve()'s allocation
        self.fresh_in_save = 0
        self.root: Path | None = None  # the checkpoint being saved (named by a full disk's error)

    def save(
        self,
        model: torch.nn.Module,
        opt: torch.optim.Optimizer | None,
        sched: Any,
        path: str,
        buckets: list[list[ParamSpec]],
        model_src: str,
        fmt: str,
        background: bool,
    ) -> int:
        """Collective. Waits for the previous checkpoint's writes first. Returns how many host
        buffers it had to allocate itself (0 once `reserve` made them)."""
        self.finish(wait=True)
        self.root = Path(path)
        with _naming_a_full_disk(path):
            return self._save(model, opt, sched, buckets, model_src, fmt, background)

    def _save(self, model, opt, sched, buckets, model_src: str, fmt: str, background: bool) -> int:
        assert self.root is not None
        self.fresh_in_save = 0
        if self.reserving is not None:
            self.reserving.result()
            self.reserving = None
        root = self.root
        if lora.is_lora(model):  # the adapters too: resume needs them (merged weights are final)
            adapters = fsdp.gather_adapters(model)
            if self.rank == 0:
                self.write(background, lora.save_adapter_files, adapters, model, root / "adapter")
        if not background:
            fsdp.write_hf_dir(model, root / "model", model_src, buckets, self.rank)
            _save_optimizer(model, opt, sched, root / "optim", fmt, self.rank, None)
            dist.barrier()
            return 0
        if self.stream is not None:  # the copies read what the update wrote
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        staged, events = [], []
        for i, b in enumerate(buckets):
            if len(events) >= self.IN_FLIGHT_BUCKETS:  # bound the gathered weights on the GPU
                events.pop(0).synchronize()
            staged.append(self._stage(fsdp.gather_full(model, b, self.rank, self.device), ("w", i)))
            if self.stream is not None:
                events.append(self.stream.record_event())
        if self.rank == 0:
            args = (staged, len(staged), root / "model", model_src, model.config)
            self.write(True, fsdp.write_hf_files, *args)
        _save_optimizer(model, opt, sched, root / "optim", fmt, self.rank, self)
        if self.stream is not None:
            self.copied = self.stream.record_event()
        dist.barrier()
        return self.fresh_in_save

    def reserve(self, model: torch.nn.Module, opt: torch.optim.Optimizer | None, buckets) -> None:
        """Allocate the pinned host buffers of the next background save in a thread now (at
        start-up, while the first rollout runs): pinning the 18 GB of a 1.5B model's weights
        and moments took 15.6 s in its first save. `save` joins the thread first. (On CPU the
        buffers are plain memory, reserved the same way.)"""
        pin = self.stream is not None
        shapes: dict[Any, tuple[tuple[int, ...], torch.dtype]] = {}
        if self.rank == 0:
            for i, bucket in enumerate(buckets):
                for spec in bucket:
                    shapes[(("w", i), spec.name)] = (tuple(spec.shape), fsdp.to_dtype(spec.dtype))
        if opt is not None:  # AdamW's moments and step, shaped like the shards (also before
            for name, p in model.named_parameters():  # the first step, when it has no state)
                if p.requires_grad:
                    local = p.to_local() if isinstance(p, DTensor) else p
                    for moment in ("exp_avg", "exp_avg_sq"):
                        key = ((("optim", "state"), name), moment)
                        shapes[key] = (tuple(local.shape), local.dtype)
                    shapes[((("optim", "state"), name), "step")] = ((), torch.float32)

        def alloc() -> None:
            for key, (shape, dtype) in shapes.items():
                buf = self.host.get(key)
                if buf is None or tuple(buf.shape) != shape or buf.dtype != dtype:
                    self.host[key] = torch.empty(shape, dtype=dtype, pin_memory=pin)

        self.reserving = self.pool.submit(alloc)

    def guard(self) -> None:
        """Before anything changes the weights or the optimizer state in place (the next step):
        the current stream waits, on the GPU, for the last save's copies to the host."""
        if self.copied is not None:
            torch.cuda.current_stream(self.device).wait_event(self.copied)
            self.copied = None

    def write(self, background: bool, fn: Any, *args: Any) -> None:
        """Now, or in the writer's thread once the copies are done (finish() waits for it)."""
        if not background:
            fn(*args)
            return
        stream, root = self.stream, self.root

        def run() -> Any:
            if stream is not None:
                stream.synchronize()  # the host buffers hold the copies
            if root is None:
                return fn(*args)
            with _naming_a_full_disk(root):
                return fn(*args)

        self.pending.append(self.pool.submit(run))

    def _stage(self, tensors: dict[Any, Any], key: Any) -> dict[Any, Any]:
        """Copies of `tensors` (a tree of dicts) in this writer's own host buffers: never the
        live tensors (with one rank on CPU a gathered tensor *is* the parameter, which the next
        step changes in place). On a GPU the copies are queued on the side stream; DTensors come
        back as DTensors over their host shard (what DCP saves)."""
        out: dict[Any, Any] = {}
        for name, t in tensors.items():
            if isinstance(t, dict):
                out[name] = self._stage(t, (key, name))
            elif isinstance(t, DTensor):
                local = self._copy(t.to_local(), (key, name))
                out[name] = DTensor.from_local(
                    local, t.device_mesh, t.placements, run_check=False, shape=t.shape,
                    stride=t.stride(),
                )  # fmt: skip
            elif isinstance(t, torch.Tensor):
                out[name] = self._copy(t, (key, name))
            else:
                out[name] = t
        return out

    def _copy(self, t: torch.Tensor, key: Any) -> torch.Tensor:
        buf = self.host.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = self.host[key] = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
            self.fresh_in_save += 1
        if t.is_cuda and self.stream is not None:
            # `t` may come from kernels queued after the save began (a bucket's gather and cast)
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                buf.copy_(t, non_blocking=True)
            t.record_stream(self.stream)  # its memory is not reused before the copy is done
        else:
            buf.copy_(t)
        return buf

    def finish(self, wait: bool) -> bool:
        """True when this rank's writes are done (raising their error); `wait` blocks for them."""
        if not wait and not all(f.done() for f in self.pending):
            return False
        for f in self.pending:
            f.result()
        self.pending = []
        return True


def _save_optimizer(
    model, opt, sched, out: Path, fmt: str, rank: int, writer: CheckpointWriter | None
) -> None:
    """Writes `out` now, or with a writer behind the next steps (its finish() waits). `opt`
    None (checkpoint.save_optimizer=false): the schedule's position only, format "none"."""
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        meta = {"format": fmt if opt is not None else "none", "scheduler": sched.state_dict()}
        (out / SCHEDULE).write_text(json.dumps(meta, indent=1))
    dist.barrier()
    if opt is None:
        return
    if fmt == "sharded":
        state = {"optim": get_optimizer_state_dict(model, opt)}
        if writer is None:
            dcp.save(state, checkpoint_id=str(out))
            return
        # host copies queued now; DCP writes them in the writer's thread on the writer's group
        staged = {"optim": writer._stage(state["optim"], "optim")}  # the keys reserve() made
        save = partial(dcp.save, checkpoint_id=str(out), process_group=writer.group)
        writer.write(True, save, staged)
        return
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_optimizer_state_dict(model, opt, options=opts)  # CPU copies on rank 0
    if rank == 0:
        if writer is None:
            torch.save(full, out / "optim.pt")
        else:
            writer.write(True, torch.save, full, out / "optim.pt")


def load_optimizer(model, opt, sched, src: Path, rank: int) -> None:
    """Collective: the optimizer and lr schedule from `src` (either format; the sharded one onto
    any world size). Nothing in `src` is unpickled beyond the allow-lists of the module docstring;
    a file that needs more is a CheckpointError naming it."""
    meta = _read_schedule(src)
    fmt = meta.get("format")
    if fmt == "sharded":
        state = {"optim": get_optimizer_state_dict(model, opt)}
        reader = _SafeReader(src)
        reader.read_metadata()  # checked here first: its error is one clear line on every rank
        try:
            dcp.load(state, storage_reader=reader, planner=_SafePlanner())
        except CheckpointException as e:  # DCP gathers every rank's failure into one
            why = _first_failure(e)
            raise CheckpointError(
                f"{src}: the sharded optimizer state cannot be read safely: {why}; "
                "resume another checkpoint"
            ) from None
        set_optimizer_state_dict(model, opt, state["optim"])
    elif fmt == "full":
        full = _torch_load(src / "optim.pt") if rank == 0 else {}
        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_optimizer_state_dict(model, opt, full, options=opts)
    elif fmt != "none":  # none: saved without the optimizer, its moments start fresh
        raise CheckpointError(f"{src}: unknown optimizer format {fmt!r} (sharded or full)")
    sched.load_state_dict(meta["scheduler"])


# {"format": "sharded" | "full" | "none" (no optimizer state), "scheduler": LambdaLR.state_dict()}
SCHEDULE = "schedule.json"


def _read_schedule(src: Path) -> dict[str, Any]:
    if (src / SCHEDULE).exists():
        try:
            meta = json.loads((src / SCHEDULE).read_text())
        except ValueError as e:
            raise CheckpointError(f"{src / SCHEDULE}: not JSON ({e})") from None
    else:  # written before schedule.json (the same dict through torch.save)
        meta = _torch_load(src / "schedule.pt")
    if not isinstance(meta, dict) or not isinstance(meta.get("scheduler"), dict):
        raise CheckpointError(f"{src}: {SCHEDULE} is not a {{format, scheduler}} record")
    return meta


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # weights_only refused a global: code, not data
        raise CheckpointError(f"{path}: refused, {_reason(e)}") from None


def _first_failure(e: CheckpointException) -> str:
    for exc, _ in e.failures.values():
        return f"refused, {_reason(exc)}" if isinstance(exc, pickle.UnpicklingError) else (
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}")  # fmt: skip
    return str(e)


def _reason(e: BaseException) -> str:
    """What torch's weights_only unpickler refused, without its advice to load the file with
    weights_only=False (which would run the payload)."""
    for line in str(e).splitlines():
        if "WeightsUnpickler error:" in line:
            what = line.split("WeightsUnpickler error:", 1)[1].split(" was not an allowed")[0]
            return f"it holds more than tensors and plain data ({what.strip()[:200]})"
    return f"it holds more than tensors and plain data ({str(e).splitlines()[0][:200]})"


# -- DCP, read as data ----------------------------------------------------------------------------
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_META_GLOBALS = {
    *((_DCP_METADATA, n) for n in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                   "TensorStorageMetadata", "BytesStorageMetadata",
                                   "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by its name (torch.strided)
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),  # StorageMeta.checkpoint_id
    ("pathlib._local", "PosixPath"), ("pathlib._local", "PurePosixPath"),
}  # fmt: skip
_DTYPES = {n for n, v in vars(torch).items() if isinstance(v, torch.dtype)}


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's `.metadata` as data: only the globals above resolve (the stdlib's "restricting
    globals"); REDUCE/NEWOBJ/BUILD can then only construct those records or look a name up."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _META_GLOBALS or (module == "torch" and name in _DTYPES):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")


class _SafeReader(FileSystemReader):
    """FileSystemReader whose metadata is read by _MetadataUnpickler and checked: every item's
    file a plain name in this directory, no stream transforms (agentrl writes none)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self._get_metadata_path(kwargs.get("rank")))
        try:
            with open(path, "rb") as f:
                md = _MetadataUnpickler(f).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as e:
            raise CheckpointError(f"{path}: refused, not DCP metadata as agentrl writes it ({e}); "
                                  "the checkpoint was altered or written by something else; "
                                  "resume another checkpoint") from None  # fmt: skip
        bad = _check_metadata(md)
        if bad:
            raise CheckpointError(f"{path}: refused, {bad}; resume another checkpoint")
        if md.storage_meta is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md


def _check_metadata(md: Any) -> str | None:
    if not isinstance(md, Metadata) or not isinstance(md.storage_data, dict):
        return f"it holds a {type(md).__name__}, not DCP Metadata"
    for index, info in md.storage_data.items():
        name = getattr(info, "relative_path", None)
        if (
            not isinstance(name, str)
            or not name
            or "/" in name
            or "\\" in name
            or name in (".", "..")
        ):
            return f"item {index} reads from {name!r}, not a file of this directory"
        if getattr(info, "transform_descriptors", None):
            return f"item {index} asks for stream transforms {info.transform_descriptors!r}"
    return None


class _SafePlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner whose non-tensor items are read with weights_only=True (the default
    planner unpickles them with weights_only=False)."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
