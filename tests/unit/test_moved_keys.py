"""The `trainer` section grouped by concern (agentrl/trainer_config.py): a key of the old flat
section fails with its new name wherever a config comes from (the command line, a YAML file, a
dict), every entry of the one table names a real setting, and a checkpoint that recorded the old
names resumes without a spurious change."""

from __future__ import annotations

import pytest
from ckpt_kit import whole_role
from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from agentrl.config import CONFIG_DIR, Config, compose, load_config
from agentrl.run import resume_point
from agentrl.settings_diff import compare
from agentrl.trainer_config import MOVED_KEYS
from agentrl.types import ConfigError

ENV = {"_target_": "agentrl.envs.code_exec:CodeExecEnv"}


def test_every_moved_key_names_a_setting_and_no_longer_exists():
    settings = compose([]).settings()
    assert len(MOVED_KEYS) == 24
    for old, new in MOVED_KEYS.items():
        assert new in settings and old not in settings, (old, new)


def test_an_old_key_on_the_command_line_names_its_new_key_with_the_other_mistakes():
    with pytest.raises(ConfigError) as e:
        compose(["trainer.eval_every=5", "trainer.dir=/tmp/x", "learner.lrr=1"])
    lines = str(e.value).splitlines()
    assert lines[1:] == [
        "  trainer.eval_every moved to trainer.eval.every: write trainer.eval.every=5",
        "  trainer.dir moved to checkpoint.dir: write checkpoint.dir=/tmp/x",
        "  learner.lrr: unknown key; did you mean learner.lr?",
    ]


def test_an_old_key_in_a_yaml_file_names_its_new_key(tmp_path):
    (tmp_path / "old.yaml").write_text(
        "defaults:\n  - config\n  - _self_\n"
        f"hydra:\n  searchpath:\n    - file://{CONFIG_DIR}\n"
        "trainer:\n  max_staleness: 2\n  steps: 3\n"
    )
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
        composed = hydra_compose(config_name="old")
    with pytest.raises(ConfigError) as e:
        load_config(composed)
    assert "trainer.max_staleness moved to trainer.async.max_staleness (got 2)" in str(e.value)


def test_an_old_key_in_a_dict_names_its_new_key():
    with pytest.raises(ConfigError, match=r"trainer\.no_signal_steps moved to trainer\.guards\."):
        load_config({"env": ENV, "trainer": {"no_signal_steps": 2}})
    cfg = load_config({"env": ENV, "trainer": {"async": {"max_staleness": 2}}})
    assert cfg.trainer.async_.max_staleness == 2  # spelt `async`, read as `async_`
    by_name = Config(env=ENV, trainer={"async_": {"max_staleness": 3}})  # populate_by_name
    assert by_name.trainer.async_.max_staleness == 3


def _old_style(settings: dict) -> dict:
    """The settings as a checkpoint written before the grouping recorded them."""
    back = {new: old for old, new in MOVED_KEYS.items()}
    return {back.get(k, k): v for k, v in settings.items()}


def test_an_old_checkpoints_settings_compare_under_the_new_names():
    now = compose([]).settings()
    old = _old_style(now)
    assert "trainer.eval_every" in old and "trainer.eval.every" not in old
    assert compare(old, now) == []  # nothing changed: nothing said
    changed = compare({**old, "trainer.eval_every": 5, "trainer.eval_size": 8}, now)
    assert [(c.key, c.then, c.now) for c in changed] == [
        ("trainer.eval.every", 5, 0), ("trainer.eval.size", 8, 32)
    ]  # fmt: skip
    assert changed[1].refused and not changed[0].refused


def test_an_old_checkpoint_resumes_and_its_refusals_name_the_new_keys(tmp_path):
    from agentrl.ckpt import CheckpointManager, TrainerState

    cfg = compose([f"checkpoint.dir={tmp_path}"])
    mgr = CheckpointManager(cfg.checkpoint.of_run(cfg.run_name))

    def save(step: int, **changed: object) -> None:
        with mgr.write(step) as staged:
            whole_role(staged.path)
            old = _old_style(cfg.settings()) | {"trainer.dir": "elsewhere", **changed}
            staged.state = TrainerState(step=step, identity=cfg.identity(), settings=old)

    save(2)  # trainer.dir names the checkpoint found: ignored, as checkpoint.dir is
    assert resume_point(cfg) == mgr.resume_path()
    save(3, **{"trainer.eval_split": "shared"})
    with pytest.raises(ConfigError, match=r"trainer\.eval\.split shared → heldout: the held-out"):
        resume_point(cfg)
