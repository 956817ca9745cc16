"""Checkpoint directory protocol: round trip, atomicity under a killed writer, keep_last, resume."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from agentrl import ckpt
from agentrl.ckpt import (
    CheckpointConfig,
    CheckpointError,
    CheckpointManager,
    TrainerState,
    capture_rng,
    load_trainer_state,
    restore_rng,
)

ROOT = Path(__file__).resolve().parents[2]


def save(mgr: CheckpointManager, step: int, payload: str = "w") -> None:
    with mgr.write(step) as pending:
        (pending.path / "model").mkdir()
        (pending.path / "model" / "weights.bin").write_text(f"{payload}{step}")
        pending.state = TrainerState(step=step, weight_version=str(step))


def test_round_trip_restores_state_and_rng(tmp_path: Path) -> None:
    import numpy as np

    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path)))
    rng = capture_rng()
    expected = (random.random(), float(np.random.rand()), torch.rand(3).tolist())
    with mgr.write(7) as pending:
        (pending.path / "model").mkdir()
        pending.state = TrainerState(
            step=7,
            weight_version="7",
            data_cursor={"epoch": 1, "index": 42, "order_seed": 5},
            rng=rng,
            wandb_run_id="abc123",
            consecutive_skips=1,
        )
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)

    path = CheckpointManager(CheckpointConfig(dir=str(tmp_path))).resume_path()
    assert path == tmp_path / "step_00000007"
    state = load_trainer_state(path)
    assert (state.step, state.weight_version, state.wandb_run_id) == (7, "7", "abc123")
    assert state.data_cursor == {"epoch": 1, "index": 42, "order_seed": 5}
    assert state.consecutive_skips == 1
    restore_rng(state.rng)
    assert (random.random(), float(np.random.rand()), torch.rand(3).tolist()) == expected
    assert (tmp_path / "latest").read_text() == "step_00000007"
    assert (path / "COMPLETE").exists() and (path / "model").is_dir()


_KILLED_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from agentrl.ckpt import CheckpointConfig, CheckpointManager, TrainerState
    root = Path(sys.argv[1])
    mgr = CheckpointManager(CheckpointConfig(dir=str(root)))
    with mgr.write(1) as p:
        (p.path / "model").mkdir()
        (p.path / "model" / "weights.bin").write_text("good")
        p.state = TrainerState(step=1)
    with mgr.write(2) as p:
        (p.path / "model").mkdir()
        with open(p.path / "model" / "weights.bin", "w") as f:
            f.write("half")
            f.flush()
            (root / "WRITING").touch()   # tell the test we are mid-write
            time.sleep(60)
        p.state = TrainerState(step=2)
    """
)


def test_killed_writer_never_becomes_latest(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(tmp_path)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "WRITING").exists():
            assert proc.poll() is None, "writer exited early"
            assert time.monotonic() < deadline, "writer never reached the mid-write point"
            time.sleep(0.05)
        assert any((tmp_path / ".tmp").iterdir())  # step 2 is staged, half written
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path)))
    assert mgr.resume_path() == tmp_path / "step_00000001"
    assert load_trainer_state(mgr.resume_path()).step == 1
    assert not (tmp_path / "step_00000002").exists()
    assert not (tmp_path / ".tmp").exists()  # leftovers removed on start
    save(mgr, 2)  # the run continues and writes step 2 for real
    assert mgr.resume_path() == tmp_path / "step_00000002"


def test_crash_between_rename_and_pointer_keeps_previous_latest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path)))
    save(mgr, 1)

    def die(*_a, **_k):
        raise OSError("killed")

    monkeypatch.setattr(ckpt, "write_file_atomic", die)
    with pytest.raises(OSError, match="killed"):
        save(mgr, 2)
    monkeypatch.undo()
    assert (tmp_path / "step_00000002" / "COMPLETE").exists()  # renamed, pointer not updated
    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path)))
    assert mgr.resume_path() == tmp_path / "step_00000001"  # `latest` decides
    save(mgr, 2, payload="again")  # re-saving the same step replaces the orphan
    assert mgr.resume_path() == tmp_path / "step_00000002"
    assert (tmp_path / "step_00000002" / "model" / "weights.bin").read_text() == "again2"


def test_failed_rename_or_exception_in_body_commits_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path)))
    save(mgr, 1)
    with pytest.raises(RuntimeError, match="worker died"), mgr.write(2) as p:
        (p.path / "model").mkdir()
        raise RuntimeError("worker died")
    with pytest.raises(CheckpointError, match="no TrainerState"), mgr.write(3):
        pass

    def disk_full(*_a: object) -> None:
        raise OSError("disk full")

    real_rename = os.rename
    monkeypatch.setattr(ckpt.os, "rename", disk_full)
    with pytest.raises(OSError, match="disk full"):
        save(mgr, 4)
    monkeypatch.setattr(ckpt.os, "rename", real_rename)
    assert [p.name for p in mgr.complete_checkpoints()] == ["step_00000001"]
    assert mgr.resume_path() == tmp_path / "step_00000001"
    assert not any((tmp_path / ".tmp").glob("step_*"))


def test_keep_last_prunes_oldest(tmp_path: Path) -> None:
    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path), keep_last=2))
    for step in range(1, 6):
        save(mgr, step)
    assert [p.name for p in mgr.complete_checkpoints()] == ["step_00000004", "step_00000005"]
    assert mgr.latest() == tmp_path / "step_00000005"


def test_a_fresh_run_sets_an_earlier_runs_checkpoints_aside(tmp_path: Path) -> None:
    """checkpoint.resume=never over a run at step 12: its step_10 and step_12 stayed, keep_last
    pruned the new run's step_5 and kept them, and a resume without `latest` took step_12."""
    old = CheckpointManager(CheckpointConfig(dir=str(tmp_path), keep_last=2))
    for step in (10, 12):
        save(old, step, payload="old")
    fresh = CheckpointManager(CheckpointConfig(dir=str(tmp_path), keep_last=2, resume="never"))
    note = fresh.set_aside()
    assert note is not None and "step_00000010, step_00000012) moved to" in note
    aside = next((tmp_path / "earlier").iterdir())
    assert sorted(p.name for p in aside.iterdir()) == ["latest", "step_00000010", "step_00000012"]
    assert (aside / "step_00000012" / "model" / "weights.bin").read_text() == "old12"
    for step in (2, 5, 7):
        save(fresh, step, payload="new")
    assert [p.name for p in fresh.complete_checkpoints()] == ["step_00000005", "step_00000007"]
    (tmp_path / "latest").unlink()
    assert fresh.latest() == tmp_path / "step_00000007"
    assert fresh.set_aside() is not None and fresh.complete_checkpoints() == []
    assert len(list((tmp_path / "earlier").iterdir())) == 2  # never over the first one
    assert CheckpointManager(CheckpointConfig(dir=str(tmp_path / "new"))).set_aside() is None


def test_resume_modes(tmp_path: Path) -> None:
    assert CheckpointManager(CheckpointConfig(dir=str(tmp_path / "a"))).resume_path() is None
    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path / "b")))
    save(mgr, 3)
    save(mgr, 4)
    never = CheckpointManager(CheckpointConfig(dir=str(tmp_path / "b"), resume="never"))
    assert never.resume_path() is None
    pinned = CheckpointConfig(dir=str(tmp_path / "b"), resume=str(tmp_path / "b/step_00000003"))
    assert CheckpointManager(pinned).resume_path() == tmp_path / "b/step_00000003"
    bad = CheckpointConfig(dir=str(tmp_path / "b"), resume=str(tmp_path / "nope"))
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        CheckpointManager(bad).resume_path()
    # a broken pointer falls back to the newest complete checkpoint
    (tmp_path / "b" / "latest").write_text("step_00000099")
    assert mgr.latest() == tmp_path / "b/step_00000004"


def test_should_save_every_and_last(tmp_path: Path) -> None:
    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path), every=3))
    assert [s for s in range(1, 9) if mgr.should_save(s, last_step=8)] == [3, 6, 8]


POINTERS = ["../x", "../step_00000003", "/etc", "{abs}", "step_3/..", "step_00000003/../../x",
            ".", "", "step_00000099"]  # fmt: skip


@pytest.mark.parametrize("pointer", POINTERS)
def test_latest_is_a_step_name_of_this_dir_or_ignored(tmp_path: Path, pointer, caplog) -> None:
    """`latest` names one complete step_N dir of the root; anything else (a path out of it, an
    absolute path, a missing step) is ignored with a warning: the newest complete one is taken."""
    root = tmp_path / "run"
    mgr = CheckpointManager(CheckpointConfig(dir=str(root)))
    save(mgr, 3)
    save(mgr, 4)
    outside = tmp_path / "step_00000003"  # a complete-looking checkpoint outside the root
    outside.mkdir()
    (outside / "COMPLETE").write_text("3")
    (root / "latest").write_text(pointer.format(abs=outside))
    with caplog.at_level("WARNING", logger="agentrl.ckpt"):
        assert mgr.latest() == root / "step_00000004"
        assert mgr.resume_path() == root / "step_00000004"
    assert "ignored" in caplog.text and "newest complete" in caplog.text
    (root / "latest").write_text("step_00000003\n")  # a plain name (with a newline) is followed
    assert mgr.latest() == root / "step_00000003"


def test_a_step_dir_linked_out_of_the_root_is_not_a_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "run"
    mgr = CheckpointManager(CheckpointConfig(dir=str(root)))
    save(mgr, 3)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "COMPLETE").write_text("9")
    (root / "step_00000009").symlink_to(elsewhere)
    (root / "latest").write_text("step_00000009")
    assert mgr.latest() == root / "step_00000003"
    assert mgr.complete_checkpoints() == [root / "step_00000003"]


@pytest.mark.parametrize("name", ["pytorch_model.bin", "modeling_evil.py", "weights.pt"])
def test_resume_refuses_code_or_pickled_weights_where_the_engine_loads(
    tmp_path: Path, name
) -> None:
    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path)))
    with mgr.write(5) as pending:
        (pending.path / "policy" / "model").mkdir(parents=True)
        (pending.path / "policy" / "model" / "model.safetensors").write_bytes(b"")
        pending.state = TrainerState(step=5)
    assert mgr.resume_path() == tmp_path / "step_00000005"
    (tmp_path / "step_00000005" / "policy" / "model" / name).write_bytes(b"\x80\x04.")
    with pytest.raises(CheckpointError, match=rf"holds \['{name}'\].*run code"):
        mgr.resume_path()


def test_a_tampered_trainer_state_is_an_error_not_code(tmp_path: Path) -> None:
    import pickle

    marker = tmp_path / "ran"
    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path / "c")))
    save(mgr, 1)
    evil = pickle.dumps(type("Evil", (), {"__reduce__": lambda s: (open, (str(marker), "w"))})())
    (tmp_path / "c" / "step_00000001" / ckpt.STATE_FILE).write_bytes(evil)
    with pytest.raises(CheckpointError, match="not a trainer state agentrl wrote.*Invalid JSON"):
        load_trainer_state(mgr.latest())
    assert not marker.exists()


def test_a_full_disk_at_commit_says_so_and_keeps_latest(tmp_path: Path, monkeypatch) -> None:
    import errno

    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path)))
    save(mgr, 1)

    def full(_root: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "fsync_tree", full)
    with pytest.raises(CheckpointError) as e:
        save(mgr, 2)
    msg = str(e.value)
    assert "no space left" in msg and str(tmp_path / ".tmp") in msg
    assert "bytes free" in msg and "`latest` stays on the previous checkpoint" in msg
    assert mgr.latest() == tmp_path / "step_00000001"
    assert not any((tmp_path / ".tmp").glob("step_*"))


def test_torchs_unexpected_pos_is_read_as_a_full_disk(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    torch_err = RuntimeError(
        "[enforce fail at inline_container.cc:626] . unexpected pos 704 vs 598"
    )
    dcp_err = CheckpointException("Failed to save", {0: (torch_err, None)})
    for e in (torch_err, dcp_err):
        err = ckpt.disk_full_error(tmp_path / "gone" / "optim", e)
        assert err is not None and "unexpected pos 704 vs 598" in str(err)
        assert f"{tmp_path / 'gone' / 'optim'}" in str(err) and "bytes free" in str(err)
    assert ckpt.disk_full_error(tmp_path, RuntimeError("shape mismatch")) is None


def test_checkpoint_dir_keeps_a_tmp_folder_of_the_users(tmp_path):
    """Found by a red-team pass: checkpoint.dir naming a directory of the user's (`.`, a
    project) removed its `.tmp` folder whole; only the manager's own leftovers go."""
    (tmp_path / ".tmp" / "mine").mkdir(parents=True)
    (tmp_path / ".tmp" / "mine" / "notes.txt").write_text("keep")
    (tmp_path / ".tmp" / "step_00000004-0123abcd").mkdir()  # a killed write's leftover
    (tmp_path / ".tmp" / "old-step_00000002-89abcdef").mkdir()
    CheckpointManager(CheckpointConfig(dir=str(tmp_path)))
    assert sorted(p.name for p in (tmp_path / ".tmp").iterdir()) == ["mine"]
    assert (tmp_path / ".tmp" / "mine" / "notes.txt").read_text() == "keep"


def test_resume_naming_a_runs_checkpoints_dir_names_a_checkpoint_in_it(tmp_path: Path) -> None:
    """checkpoint.resume=runs/x/checkpoints (the folder, not a step of it) said only 'no
    COMPLETE file; use resume=auto', which looks in this run's own folder."""
    mgr = CheckpointManager(CheckpointConfig(dir=str(tmp_path / "x")))
    save(mgr, 2)
    save(mgr, 10)
    named = CheckpointConfig(dir=str(tmp_path / "y"), resume=str(tmp_path / "x"))
    with pytest.raises(CheckpointError, match=r"it holds checkpoints: name one, e\.g\. "
                       r"checkpoint\.resume=.*x/step_00000010$"):  # fmt: skip
        CheckpointManager(named).resume_path()
