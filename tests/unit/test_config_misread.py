"""Values a config door took and misread, found by a red-team pass on bad input: a true/false
where a number goes (pydantic reads it as 1), NaN and infinities (no setting means one), a
top_k every engine request is refused with, a run name too long for a directory."""

from __future__ import annotations

import pytest

from agentrl.config import compose, validate
from agentrl.run import env_classes, samplers
from agentrl.types import ConfigError


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "trainer.steps=true",
            r"trainer\.steps=true: a true/false where a number goes \(it "
            r"would be read as 1\)",
        ),  # a one-step run, not the 60 of the default
        ("checkpoint.every=false", r"checkpoint\.every=false: a true/false where a number goes"),
        ("learner.lr=inf", r"learner\.lr=inf: not a finite number"),  # NaN weights at step 1
        ("learner.eps=inf", r"learner\.eps=inf: not a finite number"),  # no update at all
        ("rollout.temperature=inf", r"rollout\.temperature=inf: not a finite number"),
        ("algo.loss.kl_coef=nan", r"algo\.loss\.kl_coef=nan: not a finite number"),  # a warning
        ("algo.advantage.gamma=nan", r"algo\.advantage\.gamma=nan: not a finite number"),
        ("rollout.truncated_reward=nan", r"rollout\.truncated_reward=nan: not a finite number"),
        (
            "rollout.top_k=0",
            r"rollout\.top_k=0: the engines take -1 \(every token; SGLang and "
            r"the dev server refuse each request with 0\) or k >= 1",
        ),  # fmt: skip
        ("rollout.top_k=-5", r"rollout\.top_k=-5: the engines take -1"),
        ("run_name=" + "a" * 101, r"use up to 100 letters"),  # OSError: File name too long
    ],
)
def test_a_misread_setting_is_refused_with_its_key(override, message):
    with pytest.raises(ConfigError, match=message):
        compose([override])


def test_a_mixture_members_weight_and_a_yaml_file_are_checked_too():
    with pytest.raises(ConfigError, match=r"env\.envs\.code\.weight=true: a true/false"):
        compose(["env=mixture", "env.envs.code.weight=true"])
    raw = {"env": {"_target_": "agentrl.envs.code_exec.CodeExecEnv"}, "learner": {"lr": True}}
    with pytest.raises(ConfigError, match=r"learner\.lr=true: a true/false where a number goes"):
        validate(raw)  # as a YAML file gives it: `lr: true`


def test_what_each_setting_takes_still_passes():
    cfg = compose(["learner.micro_batch_tokens=auto", "weight_sync.bucket_mb=auto",
                   "logging.wandb.enabled=true", "rollout.top_k=20", "trainer.steps=1e3",
                   "run_name=" + "a" * 100])  # fmt: skip
    assert (cfg.rollout.top_k, cfg.trainer.steps, cfg.logging.wandb.enabled) == (20, 1000, True)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("env.args.max_turns=true", r"env\.args\.max_turns=true: a true/false where a number"),
        ("env.args.format_reward=nan", r"env\.args\.format_reward=nan: not a finite number"),
        ("env.tasks.n=true", r"env\.tasks\.n=true: a true/false where a number goes"),  # 1 task
    ],
)
def test_an_env_setting_misread_is_refused_by_name(override, message):
    cfg = compose(["env=code_exec", override])
    with pytest.raises(ConfigError, match=message):
        samplers(cfg, env_classes(cfg))
