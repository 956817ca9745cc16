"""One run per directory (agentrl/runlock.py): a second run meets a live run's lock and is refused
before it moves or writes anything; a dead run's lock is taken over; the lock goes on exit."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from agentrl import ConfigError
from agentrl.config import compose
from agentrl.run import open_run
from agentrl.runlock import LOCK_NAME, hold_run_dirs
from agentrl.train import train


async def _open(cfg, out):
    async with open_run(cfg, out):
        raise AssertionError("the second run was built")


def test_a_second_run_in_a_live_dir_is_refused_and_moves_nothing(tmp_path):
    ckpt = tmp_path / "ckpt"  # checkpoint.dir outside the run dir: locked too
    cfg = compose(["env=code_exec", f"checkpoint.dir={ckpt}"])
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    with hold_run_dirs(out, ckpt):  # the live run
        (ckpt / ".tmp" / "step_2-writing").mkdir(parents=True)  # its checkpoint being saved
        for start in (lambda: _open(cfg, out), lambda: train(cfg, out)):
            with pytest.raises(ConfigError) as e:
                asyncio.run(start())
            msg = str(e.value)
            assert "\n" not in msg and str(out) in msg and f"pid {os.getpid()} on " in msg
            assert "run_name=<another name>" in msg and "stop the other run" in msg
        assert (out / "metrics.jsonl").read_text() == '{"step": 1}\n'
        assert not (out / "archive").exists()
        assert (ckpt / ".tmp" / "step_2-writing").is_dir()  # the lookup did not clear it
        cfg_elsewhere = compose(["env=code_exec", f"checkpoint.dir={ckpt}", "run_name=other"])
        with pytest.raises(ConfigError, match=r"ckpt \(its checkpoint dir, checkpoint.dir\)"):
            asyncio.run(_open(cfg_elsewhere, tmp_path / "other"))


def test_a_run_naming_another_runs_own_checkpoint_dir_is_refused(tmp_path):
    """Found by a red-team pass (two real runs): run b with checkpoint.dir=runs/a/checkpoints
    took no lock run a held (a's covered its checkpoints by its output dir's lock), set a's
    live checkpoints aside as an earlier run's and wrote its own steps over them."""
    out = tmp_path / "a"
    with hold_run_dirs(out, out / "checkpoints"):  # run a, its checkpoints where they go
        cfg = compose(["env=code_exec", f"checkpoint.dir={out / 'checkpoints'}", "run_name=b"])
        with pytest.raises(ConfigError, match=r"a/checkpoints \(its checkpoint dir, checkpoint"
                           r"\.dir\) is in use by another run: .* run_name=<another name> "
                           r"\(and another checkpoint\.dir\)"):  # fmt: skip
            asyncio.run(_open(cfg, tmp_path / "b"))
        with pytest.raises(ConfigError, match=r"a \(its checkpoint dir"):  # a's output dir
            asyncio.run(_open(compose(["env=code_exec", f"checkpoint.dir={out}"]), tmp_path / "c"))


def test_a_dead_runs_lock_is_taken_over(tmp_path):
    kill_self = (
        "import os, signal, sys; from agentrl.runlock import hold_run_dirs\n"
        "with hold_run_dirs(sys.argv[1]): os.kill(os.getpid(), signal.SIGKILL)"
    )
    dead = subprocess.Popen([sys.executable, "-c", kill_self, str(tmp_path)])
    assert dead.wait(timeout=30) == -9
    left = json.loads((tmp_path / LOCK_NAME).read_text())
    assert left["pid"] == dead.pid
    notes: list[str] = []
    with hold_run_dirs(tmp_path, say=notes.append):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert len(notes) == 1 and f"pid {left['pid']} on " in notes[0] and "gone" in notes[0]


def test_the_lock_goes_on_exit_errors_too(tmp_path):
    with pytest.raises(RuntimeError), hold_run_dirs(tmp_path):
        raise RuntimeError("the run failed")
    assert (tmp_path / LOCK_NAME).read_text() == ""  # released cleanly: nothing to take over
    notes: list[str] = []
    with hold_run_dirs(tmp_path, say=notes.append):
        pass
    assert notes == []
