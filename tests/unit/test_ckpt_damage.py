"""The checkpoint door, found by a red-team pass on bad input (real runs of the tiny model): a
checkpoint damaged after its commit (a copy killed half-way, a file removed). A model.safetensors
cut short ended the resume with a learner traceback after the engine had started on it; a
policy/optim/ removed resumed with AdamW's moments from zero and the lr warm-up again, under a
note blaming checkpoint.save_optimizer=false. Now refused before anything starts, naming the
earlier checkpoint to resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ckpt_kit import safetensors_bytes, whole_role

from agentrl.ckpt import CheckpointConfig, CheckpointError, CheckpointManager, TrainerState
from agentrl.config import compose
from agentrl.run import resume_point

SAVED_OPTIMIZER = {"checkpoint.save_optimizer": True}


def _two_steps(root: Path, settings: dict | None = None) -> CheckpointManager:
    mgr = CheckpointManager(CheckpointConfig(dir=str(root), keep_last=5))
    for step in (1, 2):
        with mgr.write(step) as pending:
            whole_role(pending.path)
            pending.state = TrainerState(step=step, settings=settings or SAVED_OPTIMIZER)
    return mgr


def _cut(f: Path, by: int = 1) -> None:
    os.truncate(f, f.stat().st_size - by)


DAMAGE = {
    "safetensors cut short": (lambda m: _cut(m / "model.safetensors"),
                              r"policy/model: model\.safetensors is (\d+) bytes where its header "
                              r"accounts for \d+"),
    "safetensors gone": (lambda m: (m / "model.safetensors").unlink(),
                         r"policy/model: no \.safetensors file"),
    "header cut": (lambda m: (m / "model.safetensors").write_bytes(b"\x10\0\0"),
                   r"policy/model: model\.safetensors is cut short \(3 bytes, less than "
                   r"its header\)"),
    "config gone": (lambda m: (m / "config.json").unlink(), r"policy/model: no config\.json"),
    "a shard gone": (lambda m: (m / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"w": "model.safetensors", "v": "model-00002.safetensors"}})),
        r"policy/model: model-00002\.safetensors is missing \(model\.safetensors\.index\.json "
        r"names it\)"),
    "optimizer gone": (lambda m: [f.unlink() for f in (m.parent / "optim").iterdir()],
                       r"policy/optim: schedule\.json is missing .*\(the run saved its optimizer"),
    "shards gone": (lambda m: (m.parent / "optim" / "__0_0.distcp").unlink(),
                    r"policy/optim: __0_0\.distcp is missing \(\.metadata names it\)"),
}  # fmt: skip


@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_checkpoint_is_refused_naming_the_earlier_one(tmp_path, case):
    mgr = _two_steps(tmp_path)
    damage, said = DAMAGE[case]
    damage(tmp_path / "step_00000002" / "policy" / "model")
    with pytest.raises(CheckpointError, match=rf"checkpoint .*step_00000002 is damaged: {said}"
                       r".*: resume the one before it \(checkpoint\.resume=.*step_00000001\), "
                       r"copy it again, or start fresh \(checkpoint\.resume=never\)"):  # fmt: skip
        mgr.check_whole(mgr.resume_path())
    mgr.check_whole(tmp_path / "step_00000001")  # whole: nothing said


def test_an_optimizer_a_run_did_not_save_is_not_asked_for(tmp_path):
    """checkpoint.save_optimizer=false writes no moments; a checkpoint older than its settings
    record says nothing either way: both resume as before (with optimizer_note's line)."""
    for settings in ({"checkpoint.save_optimizer": False}, {"seed": 0}):
        root = tmp_path / str(len(settings) + len(str(settings)))
        mgr = _two_steps(root, settings)
        for f in (root / "step_00000002" / "policy" / "optim").iterdir():
            f.unlink()
        mgr.check_whole(mgr.resume_path())


def test_a_critic_and_an_adapter_are_checked_too(tmp_path):
    mgr = _two_steps(tmp_path)
    step = tmp_path / "step_00000002"
    critic = whole_role(step, "critic")
    (critic / "model" / "model.safetensors").write_bytes(safetensors_bytes(2)[:-1])
    with pytest.raises(
        CheckpointError, match=r"critic/model: model\.safetensors is \d+ bytes where"
    ):
        mgr.check_whole(step)
    whole_role(step, "critic")
    (step / "policy" / "adapter").mkdir()
    with pytest.raises(CheckpointError, match=r"policy/adapter: no \.safetensors file"):
        mgr.check_whole(step)


def test_resume_point_refuses_a_damaged_checkpoint_before_anything_starts(tmp_path):
    cfg = compose([f"checkpoint.dir={tmp_path}"])
    mgr = CheckpointManager(cfg.checkpoint.of_run(cfg.run_name))
    with mgr.write(3) as staged:
        whole_role(staged.path)
        staged.state = TrainerState(step=3, identity=cfg.identity(), settings=cfg.settings())
    assert resume_point(cfg) == tmp_path / "step_00000003"
    _cut(tmp_path / "step_00000003" / "policy" / "model" / "model.safetensors", 2)
    with pytest.raises(CheckpointError, match=r"step_00000003 is damaged: policy/model: model\."
                       r"safetensors is \d+ bytes .*written: copy it again, or start "
                       r"fresh"):  # fmt: skip
        resume_point(cfg)
