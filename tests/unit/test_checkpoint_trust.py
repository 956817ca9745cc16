"""Resume reads a checkpoint's optimizer state as data (agentrl/learner/checkpoint.py): a pickle
payload planted in any file the load reads (DCP's `.metadata`, a non-tensor or a tensor item of
its `.distcp`, the schedule, the full format's optim.pt) runs nothing and is a CheckpointError;
a full disk during a save says so. One rank of FSDP2 on gloo, a two-layer model: real saves."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import pickle
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
from torch.distributed.fsdp import fully_shard

from agentrl.ckpt import CheckpointError
from agentrl.learner.checkpoint import CheckpointWriter, _save_optimizer, load_optimizer


class Plant:
    """Unpickled, creates `marker` (what a planted payload would do with os.system)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.fixture
def learner():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    sched.step()
    yield SimpleNamespace(model=model, opt=opt, sched=sched)
    dist.destroy_process_group()


def moments(lr) -> dict[str, torch.Tensor]:
    sd = get_optimizer_state_dict(lr.model, lr.opt)
    return {f"{k}.{m}": v.full_tensor().clone() for k, s in sd["state"].items()
            for m, v in s.items() if m != "step"}  # fmt: skip


def saved(lr, tmp_path: Path, fmt: str = "sharded") -> Path:
    out = tmp_path / "policy" / "optim"
    _save_optimizer(lr.model, lr.opt, lr.sched, out, fmt, 0, None)
    return out


def retrain(lr) -> None:
    lr.model(torch.randn(3, 4)).sum().backward()
    lr.opt.step()
    lr.sched.step()


def test_round_trip_in_both_formats_reads_only_json_and_data(learner, tmp_path: Path) -> None:
    for fmt in ("sharded", "full"):
        out = saved(learner, tmp_path / fmt, fmt)
        assert not (out / "schedule.pt").exists() and (out / "schedule.json").exists()
        before, last_epoch = moments(learner), learner.sched.last_epoch
        retrain(learner)
        load_optimizer(learner.model, learner.opt, learner.sched, out, 0)
        after = moments(learner)
        assert all(torch.equal(before[k], after[k]) for k in before)
        assert learner.sched.last_epoch == last_epoch
        assert learner.opt.param_groups[0]["lr"] == pytest.approx(learner.sched.get_last_lr()[0])
    # a checkpoint from before schedule.json: the same record through torch.save, still read
    meta = json.loads((out / "schedule.json").read_text())
    (out / "schedule.json").unlink()
    torch.save(meta, out / "schedule.pt")
    retrain(learner)
    load_optimizer(learner.model, learner.opt, learner.sched, out, 0)
    assert learner.sched.last_epoch == last_epoch


def plant_in_metadata(out: Path, marker: Path) -> None:
    (out / ".metadata").write_bytes(pickle.dumps(Plant(marker)))


def plant_in_item(out: Path, marker: Path, kind: type) -> None:
    """A legitimate `.metadata` whose first `kind` item (BytesStorageMetadata: the param groups'
    values; TensorStorageMetadata: a moment) now reads a torch.save'd payload appended to the
    data file."""
    with open(out / ".metadata", "rb") as f:
        md = pickle.load(f)  # our own file, just written
    fqn = next(k for k, v in md.state_dict_metadata.items() if isinstance(v, kind))
    index = next(i for i in md.storage_data if i.fqn == fqn)
    info = md.storage_data[index]
    payload = io.BytesIO()
    torch.save(Plant(marker), payload)
    data = out / info.relative_path
    offset = data.stat().st_size
    with open(data, "ab") as f:
        f.write(payload.getvalue())
    md.storage_data[index] = _StorageInfo(info.relative_path, offset, len(payload.getvalue()))
    with open(out / ".metadata", "wb") as f:
        pickle.dump(md, f)


@pytest.mark.parametrize("where", ["metadata", "bytes_item", "tensor_item"])
def test_a_planted_payload_in_the_sharded_optimizer_runs_nothing(learner, tmp_path, where):
    out = saved(learner, tmp_path)
    marker = tmp_path / "payload_ran"
    if where == "metadata":
        plant_in_metadata(out, marker)
    else:
        kind = BytesStorageMetadata if where == "bytes_item" else TensorStorageMetadata
        plant_in_item(out, marker, kind)
    with pytest.raises(CheckpointError, match=rf"{out}.*refused|cannot be read safely"):
        load_optimizer(learner.model, learner.opt, learner.sched, out, 0)
    assert not marker.exists()
    if where != "tensor_item":  # the hole itself: torch's own reader runs the payload
        state = {"optim": get_optimizer_state_dict(learner.model, learner.opt)}
        with contextlib.suppress(BaseException):  # whatever follows the payload
            dcp.load(state, checkpoint_id=str(out))
        assert marker.exists()


def test_metadata_that_reads_files_out_of_its_dir_is_refused(learner, tmp_path) -> None:
    out = saved(learner, tmp_path)
    with open(out / ".metadata", "rb") as f:
        md = pickle.load(f)
    index = next(iter(md.storage_data))
    md.storage_data[index] = _StorageInfo("../../trainer_state.json", 0, 10)
    with open(out / ".metadata", "wb") as f:
        pickle.dump(md, f)
    with pytest.raises(CheckpointError, match="not a file of this directory"):
        load_optimizer(learner.model, learner.opt, learner.sched, out, 0)


@pytest.mark.parametrize("where", ["schedule.json", "schedule.pt", "optim.pt"])
def test_a_planted_schedule_or_full_optimizer_file_runs_nothing(learner, tmp_path, where):
    out = saved(learner, tmp_path, "full")
    marker = tmp_path / "payload_ran"
    if where == "schedule.json":
        (out / "schedule.json").write_bytes(pickle.dumps(Plant(marker)))
    elif where == "schedule.pt":  # a checkpoint from before schedule.json
        (out / "schedule.json").unlink()
        torch.save({"format": "full", "scheduler": Plant(marker)}, out / "schedule.pt")
    else:
        torch.save({"state": Plant(marker)}, out / "optim.pt")
    with pytest.raises(CheckpointError, match=rf"{out}.*(not JSON|refused)"):
        load_optimizer(learner.model, learner.opt, learner.sched, out, 0)
    assert not marker.exists()


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 704 vs 598"),
        OSError(errno.ENOSPC, "No space left on device"),
    ],  # fmt: skip
    ids=["torch_unexpected_pos", "enospc"],
)
def test_a_full_disk_during_a_save_says_so(learner, tmp_path, monkeypatch, error, background):
    """The optimizer's DCP write fails as torch.save fails on a full disk (inside DCP's
    CheckpointException): the error names the path, the free bytes and `latest`."""

    def full(*_a, **_k):
        raise error

    writer = CheckpointWriter(0, torch.device("cpu"))
    learner.model.config = SimpleNamespace(save_pretrained=lambda out: None)  # no HF config here
    monkeypatch.setattr(torch, "save", full)  # what DCP's file writer calls per item
    path = tmp_path / ".tmp" / "step_00000002-ab12" / "policy"
    try:
        with pytest.raises(CheckpointError) as e:
            writer.save(learner.model, learner.opt, learner.sched, str(path), [], "", "sharded",
                        background)  # fmt: skip
            writer.finish(wait=True)
    finally:
        writer.pool.shutdown(wait=True)
    msg = str(e.value)
    assert f"writing {path}" in msg and "bytes free on that disk" in msg
    assert "`latest` stays on the previous checkpoint" in msg
