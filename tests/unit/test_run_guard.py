"""Runs are named and guarded: the default name comes from the env, a checkpoint of another run
is never resumed by accident, and a finished run says so and starts nothing."""

from __future__ import annotations

import asyncio

import pytest
from ckpt_kit import whole_role

from agentrl import ConfigError
from agentrl.ckpt import CheckpointManager, TrainerState
from agentrl.config import compose
from agentrl.run import resume_point
from agentrl.train import train


def checkpoint(cfg, step: int, identity: dict) -> str:
    mgr = CheckpointManager(cfg.checkpoint.of_run(cfg.run_name))
    with mgr.write(step) as pending:
        whole_role(pending.path)
        pending.state = TrainerState(step=step, identity=identity)
    return str(mgr.latest())


def test_the_default_run_name_comes_from_the_env():
    assert compose(["env=code_exec"]).run_name == "code_exec"
    assert compose(["env=code_exec_turns"]).run_name == "code_exec_turns"
    assert compose(["env=code_exec", "run_name=exp1"]).run_name == "exp1"


def test_a_checkpoint_of_another_run_is_not_resumed_by_accident(tmp_path):
    cfg = compose(["env=code_exec", f"checkpoint.dir={tmp_path}"])
    other = {**cfg.identity(), "env": "my_env.AddEnv"}
    path = checkpoint(cfg, 2, other)
    with pytest.raises(ConfigError, match=r"holds another run \(env: 'my_env.AddEnv' there"):
        resume_point(cfg)
    on_purpose = compose(
        ["env=code_exec", f"checkpoint.dir={tmp_path}", f"checkpoint.resume={path}"]
    )
    assert str(resume_point(on_purpose)) == path
    assert resume_point(compose(["env=code_exec", f"checkpoint.dir={tmp_path}",
                                 "checkpoint.resume=never"])) is None  # fmt: skip


def test_a_finished_run_says_so_and_starts_nothing(tmp_path, capsys):
    cfg = compose(["env=code_exec", f"checkpoint.dir={tmp_path}", "trainer.steps=3"])
    checkpoint(cfg, 3, cfg.identity())
    assert asyncio.run(train(cfg, tmp_path / "out")) == []
    assert not (tmp_path / "out").exists()  # nothing was built: no Ray, no servers, no W&B
    assert "already at step 3 of trainer.steps=3" in capsys.readouterr().out


def test_a_misspelt_env_option_in_a_run_that_has_a_checkpoint_is_named_as_such(tmp_path):
    """The second run of a new env, with a typo: the error named the checkpoint's other settings
    (tasks: {...} there, {..., 'nn': 10} here), not the typo."""
    base = ["env=code_exec", f"checkpoint.dir={tmp_path}"]
    checkpoint(compose(base), 2, compose(base).identity())
    with pytest.raises(ConfigError, match=r"env.tasks.nn: unknown option of CodeExecEnv"):
        resume_point(compose([*base, "env.tasks.nn=10"]))
    with pytest.raises(ConfigError, match=r"No module named 'code_execc'"):
        resume_point(compose([*base, "env._target_=code_execc.CodeExecEnv"]))
