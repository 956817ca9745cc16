"""A checkpoint whose optimizer files were cut short after it was written (a copy killed half-way):
a .distcp shard, DCP's .metadata, or the full format's optim.pt. Only the learner refused it,
after the engine had started on the checkpoint (a shard: one line; optim.pt: torch.load's
"OSError: [Errno 22] Invalid argument"); now the resume refuses it before anything starts,
naming the file and the checkpoint, as it does a safetensors file cut short.
Real saves: one rank of FSDP2 on gloo, a two-layer model, AdamW after one step."""

from __future__ import annotations

import os
import pickle
import shutil
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from ckpt_kit import whole_role
from torch.distributed.fsdp import fully_shard

from agentrl.ckpt import CheckpointConfig, CheckpointError, CheckpointManager, TrainerState
from agentrl.config import compose
from agentrl.learner.checkpoint import _save_optimizer, load_optimizer
from agentrl.run import resume_point


@pytest.fixture(scope="module")
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


def write(mgr: CheckpointManager, step: int, lr, fmt: str, settings: dict) -> Path:
    """Checkpoint `step` through the manager: the kit's model/ and this optimizer, saved."""
    with mgr.write(step) as pending:
        optim = whole_role(pending.path) / "optim"
        shutil.rmtree(optim)
        _save_optimizer(lr.model, lr.opt, lr.sched, optim, fmt, 0, None)
        pending.state = TrainerState(step=step, settings=settings)
    return mgr.root / f"step_{step:08d}"


def cut(f: Path, by: int) -> int:
    os.truncate(f, f.stat().st_size - by)
    return f.stat().st_size


SAVED = {"checkpoint.save_optimizer": True}
CASES = {  # format, file under policy/optim, what is said of it
    "a shard": ("sharded", "__0_0.distcp",
                r"__0_0\.distcp is cut short \({size:,} bytes where \.metadata accounts for "
                r"{full:,}\)"),
    "the metadata": ("sharded", ".metadata",
                     r"\.metadata is cut short or not DCP metadata \({size:,} bytes\)"),
    "optim.pt": ("full", "optim.pt",
                 r"optim\.pt is cut short \({size:,} bytes, no zip directory at its end\)"),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_an_optimizer_file_cut_short_is_refused_naming_it_and_the_earlier_step(
    learner, tmp_path, case
):
    fmt, name, said = CASES[case]
    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path), keep_last=5))
    write(mgr, 1, learner, fmt, SAVED)
    step2 = write(mgr, 2, learner, fmt, SAVED)
    mgr.check_whole(step2)  # whole, as written: nothing said
    f = step2 / "policy" / "optim" / name
    full = f.stat().st_size
    said = said.format(size=cut(f, 100), full=full)
    with pytest.raises(CheckpointError, match=(
        rf"checkpoint .*step_00000002 is damaged: policy/optim: {said} \(the run saved its "
        r"optimizer state\)\. .*resume the one before it \(checkpoint\.resume=.*step_00000001\)"
    )):  # fmt: skip
        mgr.check_whole(mgr.resume_path())
    mgr.check_whole(tmp_path / "step_00000001")
    # the learner fails on it too, after the engine has started (optim.pt: an OSError, EINVAL)
    with pytest.raises((CheckpointError, OSError)):
        load_optimizer(learner.model, learner.opt, learner.sched, f.parent, 0)


def test_resume_point_refuses_a_cut_shard_before_anything_starts(learner, tmp_path):
    cfg = compose([f"checkpoint.dir={tmp_path}"])
    mgr = CheckpointManager(cfg.checkpoint.of_run(cfg.run_name))
    assert cfg.checkpoint.save_optimizer and cfg.checkpoint.optimizer_format == "sharded"
    with mgr.write(3) as pending:
        optim = whole_role(pending.path) / "optim"
        shutil.rmtree(optim)
        _save_optimizer(learner.model, learner.opt, learner.sched, optim, "sharded", 0, None)
        pending.state = TrainerState(step=3, identity=cfg.identity(), settings=cfg.settings())
    assert resume_point(cfg) == tmp_path / "step_00000003"
    cut(tmp_path / "step_00000003" / "policy" / "optim" / "__0_0.distcp", 1)
    with pytest.raises(CheckpointError, match=r"step_00000003 is damaged: policy/optim: "
                       r"__0_0\.distcp is cut short .*copy it again, or start fresh"):  # fmt: skip
        resume_point(cfg)


class Plant:
    """Unpickled by a reader that imports what a pickle names, creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_the_check_reads_metadata_as_data_and_runs_nothing(learner, tmp_path):
    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path), keep_last=5))
    step = write(mgr, 1, learner, "sharded", SAVED)
    marker = tmp_path / "payload_ran"
    (step / "policy" / "optim" / ".metadata").write_bytes(pickle.dumps(Plant(marker)))
    with pytest.raises(CheckpointError, match=r"policy/optim: \.metadata is not DCP metadata"):
        mgr.check_whole(step)
    assert not marker.exists()
