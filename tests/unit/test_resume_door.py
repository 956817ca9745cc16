"""A checkpoint a run cannot resume stops `agentrl train` at the door with one line: the
setting, the path and the fix, no traceback (exit 2), as a bad setting does."""

from __future__ import annotations

import sys

import pytest

from agentrl import train


@pytest.mark.parametrize("state", ["missing", "damaged"])
def test_a_resume_dir_that_cannot_be_resumed_is_one_line(tmp_path, monkeypatch, capsys, state):
    """Found by a red-team pass: checkpoint.resume=<a dir that does not exist> (or one whose
    trainer_state.json is damaged) ended `python -m agentrl.train` with a CheckpointError
    traceback, exit status 1, where every other mistake at the door is one line and exit 2."""
    ckpt = tmp_path / "step_00000003"
    if state == "damaged":
        ckpt.mkdir()
        (ckpt / "COMPLETE").write_text("3")
        (ckpt / "trainer_state.json").write_text('{"step": ')
    monkeypatch.delenv("AGENTRL_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["agentrl train", "env=code_exec",
                                      f"checkpoint.resume={ckpt}", f"checkpoint.dir={tmp_path}/c",
                                      f"hydra.run.dir={tmp_path}/out"])  # fmt: skip
    with pytest.raises(SystemExit) as done:
        train.main()
    err = capsys.readouterr().err
    assert done.value.code == 2 and "Traceback" not in err, err[-2000:]
    line = err.splitlines()[0]
    assert line.startswith("error: ") and str(ckpt) in line
    if state == "missing":
        assert "checkpoint.resume" in line and "does not exist" in line, line
