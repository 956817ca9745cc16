"""Resume is explicit about every setting (agentrl/settings_diff.py): walked over every setting of
the composed config, a changed value is either printed as applied or refused with its reason,
and no secret is written into a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt_kit import whole_role

from agentrl.config import compose
from agentrl.run import resume_point
from agentrl.settings_diff import IGNORED, REFUSED, compare, refusal, rule_of
from agentrl.types import ConfigError


def _other(v):
    """A different value of the same kind."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, int | float):
        return v + 1 if v != -1 else 7
    if isinstance(v, str):
        return v + "x"
    if isinstance(v, list):
        return [*v, "x"]
    return "x" if v is None else {"x": 1}


def _settings(*overrides: str) -> dict:
    return compose(list(overrides)).settings()


def test_every_setting_changed_on_resume_is_applied_and_said_or_refused_with_its_reason():
    saved = _settings()
    assert len(saved) > 200
    applied = refused = 0
    for key, value in saved.items():
        now = {**saved, key: _other(value)}
        changes = compare(saved, now)
        if any(key == p or key.startswith(p + ".") for p in IGNORED):
            assert changes == []
            continue
        (c,) = changes  # never silently dropped
        assert str(c) == f"{key} {value if value is not None else '(unset)'} → {now[key]}"
        error = refusal(changes, 4, "ckpt/step_00000004")
        if c.refused:
            refused += 1
            assert error is not None and key in error and c.refused in error
        else:
            applied += 1
            assert error is None
    assert refused >= 10 and applied > 150, (refused, applied)


def test_the_refusal_rules_name_real_settings():
    keys = _settings("env=mixture").keys() | _settings().keys()
    for pattern in REFUSED:
        assert any(rule_of(k) == REFUSED[pattern] for k in keys), pattern
    assert rule_of("env.envs.units.tasks.n") and not rule_of("env.envs.units.weight")
    assert rule_of("model.tokenizer") and not rule_of("learner.model_path_x")


def test_no_secret_goes_into_a_checkpoint():
    s = _settings("engine.api_key=sk-secret", "sandbox.token=tok-secret")
    assert "sk-secret" not in str(s) and "tok-secret" not in str(s)
    assert not [k for k in s if k.endswith(("api_key", "token"))]


def test_resume_point_refuses_a_changed_seed_before_anything_starts(tmp_path):
    from agentrl.ckpt import CheckpointManager, TrainerState

    cfg = compose([f"checkpoint.dir={tmp_path}", "seed=3"])
    mgr = CheckpointManager(cfg.checkpoint.of_run(cfg.run_name))
    with mgr.write(2) as staged:
        whole_role(staged.path)
        staged.state = TrainerState(step=2, identity=cfg.identity(), settings=cfg.settings())
    assert resume_point(cfg) == mgr.resume_path()  # the same settings: resumed
    again = compose([f"checkpoint.dir={tmp_path}", "seed=4", "learner.lr=0.5"])
    with pytest.raises(ConfigError, match=r"seed 3 → 4: the data order") as e:
        resume_point(again)
    assert "learner.lr" not in str(e.value)  # applied, not refused


def _saved(tmp_path, cfg, step: int = 2) -> str:
    from agentrl.ckpt import CheckpointManager, TrainerState

    mgr = CheckpointManager(cfg.checkpoint.of_run(cfg.run_name))
    with mgr.write(step) as staged:
        whole_role(staged.path)
        staged.state = TrainerState(step=step, identity=cfg.identity(), settings=cfg.settings())
    return str(mgr.latest())


def test_a_named_checkpoint_refuses_what_a_found_one_refuses(tmp_path):
    """Found by a review: with checkpoint.resume=<dir> (resumed on purpose) a refused change was
    not checked, and `model.path a → b from step 3` was printed as applied while the checkpoint's
    weights loaded. Named or found, it stops before anything starts, naming both values."""
    cfg = compose([f"checkpoint.dir={tmp_path}/a"])
    path = _saved(tmp_path, cfg)
    named = [f"checkpoint.dir={tmp_path}/b", f"checkpoint.resume={path}"]  # another run's dir
    assert str(resume_point(compose([*named, "learner.lr=0.5"]))) == path  # applies: resumed
    other = compose([*named, "model.path=/models/other", "learner.lr=0.5"])
    with pytest.raises(ConfigError, match=r"cannot change") as e:
        resume_point(other)
    assert f"model.path {cfg.model.path} → /models/other: the checkpoint" in str(e.value)
    assert path in str(e.value) and "learner.lr" not in str(e.value)  # applied, not refused


def test_a_resume_prints_the_changes_it_applies_and_never_a_refused_one(tmp_path):
    """What the learner side prints on resume is what applies; a refused change that reached it
    (not through resume_point) stops it rather than being printed as applied."""
    from rich.console import Console

    from agentrl.run_learners import _resume

    class Group:  # the policy's learner group: loads nothing, changes nothing
        def load_checkpoint(self, path, optimizer):
            return {}

    class Sampler:
        def load_state_dict(self, state):
            self.state = state

    cfg = compose([f"checkpoint.dir={tmp_path}"])
    path = _saved(tmp_path, cfg, step=4)
    console = Console(record=True, width=200)
    lr = compose([f"checkpoint.dir={tmp_path}", "learner.lr=0.5"])
    assert _resume(lr, Path(path), {"policy": Group()}, Sampler(), console).step == 4
    assert f"learner.lr {cfg.learner.lr} → 0.5 from step 5" in console.export_text()
    moved = compose([f"checkpoint.dir={tmp_path}", "model.path=/models/other"])
    with pytest.raises(ConfigError, match=r"model.path .* → /models/other: the checkpoint"):
        _resume(moved, Path(path), {"policy": Group()}, Sampler(), console)
    assert "/models/other" not in console.export_text()
