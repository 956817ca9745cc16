"""A loss setting the run never reads is said at start-up. `algo.loss.ratio=engine
algo.loss.rollout_correction=mis` trained without a word and without the correction: the
correction is applied only to a ratio against the trainer's pi_old, and the composed config
cannot tell an explicit `rollout_correction=tis` from its default. So the command line is
checked (an error: one command line is one run), and the composed config warns as for any
setting the run never reads (agentrl/idle_settings.py)."""

from __future__ import annotations

import sys

import pytest

from agentrl.cli.overrides import check_argv
from agentrl.config import CONFIG_DIR, Config, check_command_line, compose, training_checks
from agentrl.types import ConfigError

ENGINE_WHY = (
    "(the rollout correction weighs each token by pi_old / pi_engine; ratio=engine takes the "
    "ratio against the engine's logprobs themselves, with no pi_old and no correction)"
)


@pytest.mark.parametrize("correction", ["mis", "tis"])  # tis: the default, given on purpose
def test_a_rollout_correction_with_ratio_engine_stops_the_command_line(
    monkeypatch, capsys, correction
):
    monkeypatch.delenv("AGENTRL_DEBUG", raising=False)
    argv = ["agentrl train", "algo.loss.ratio=engine", f"algo.loss.rollout_correction={correction}"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as e:
        check_command_line()  # what agentrl train runs before Hydra reads sys.argv
    assert e.value.code == 2
    assert (
        f"algo.loss.rollout_correction={correction} does nothing with algo.loss.ratio=engine "
        f"{ENGINE_WHY}: drop algo.loss.rollout_correction, or set algo.loss.ratio=trainer"
    ) in capsys.readouterr().err
    with pytest.raises(ConfigError, match="does nothing with algo.loss.ratio=engine"):
        compose(argv[1:][::-1])  # either order, and compose() in a notebook


@pytest.mark.parametrize(
    ("overrides", "said"),
    [(["algo.loss.ratio=engine", "++algo.loss.tis_cap=3"],
      f"algo.loss.tis_cap=3 does nothing with algo.loss.ratio=engine {ENGINE_WHY}"),
     (["algo.loss.mis_high=4", "algo.loss.ratio=engine"],
      "algo.loss.mis_high=4 does nothing with algo.loss.ratio=engine"),
     (["algo.loss.rollout_correction=mis", "algo.loss.tis_cap=3"],
      "algo.loss.tis_cap=3 does nothing with algo.loss.rollout_correction=mis (tis_cap caps the "
      "weights of rollout_correction=tis, mis_low / mis_high bound those of "
      "rollout_correction=mis): drop algo.loss.tis_cap, or set algo.loss.rollout_correction=tis"),
     (["algo.loss.rollout_correction=none", "algo.loss.mis_low=0.3"],
      "algo.loss.mis_low=0.3 does nothing with algo.loss.rollout_correction=none")],
)  # fmt: skip
def test_a_correction_setting_its_command_line_leaves_unread_is_refused(overrides, said):
    with pytest.raises(ConfigError, match="invalid override") as e:
        check_argv(overrides, Config, CONFIG_DIR)
    assert said in str(e.value)


@pytest.mark.parametrize(
    "overrides",
    [["algo.loss.ratio=engine", "algo.loss.rollout_correction=none"],  # says what happens
     ["algo.loss.ratio=trainer", "algo.loss.rollout_correction=mis", "algo.loss.mis_low=0.3"],
     ["algo.loss.ratio=engine", "~algo.loss.tis_cap"],
     ["-m", "algo.loss.ratio=trainer,engine", "algo.loss.rollout_correction=mis"]],  # a sweep
)  # fmt: skip
def test_a_correction_the_run_reads_passes(overrides):
    check_argv(overrides, Config, CONFIG_DIR)


@pytest.mark.parametrize(
    ("overrides", "loss", "said"),
    [(["algo.loss.ratio=engine"], {"rollout_correction": "mis"},
      "algo.loss.rollout_correction=mis has no effect in this run: it counts only with "
      "algo.loss.ratio=trainer (drop it, or set that too)"),
     (["algo.loss.rollout_correction=mis"], {"tis_cap": 3.0}, "algo.loss.tis_cap=3.0 has no "
      "effect in this run: it counts only with algo.loss.ratio=trainer and "
      "algo.loss.rollout_correction=tis"),
     (["algo.loss.mis_low=0.3"], {}, "algo.loss.mis_low=0.3 has no effect in this run: it "
      "counts only with algo.loss.ratio=trainer and algo.loss.rollout_correction=mis"),
     (["algo.loss.kl_kind=k2"], {}, "algo.loss.kl_kind=k2 has no effect in this run: it counts "
      "only with algo.loss.kl_coef > 0"),
     (["algo.loss.kl_mode=reward"], {}, "algo.loss.kl_mode=reward has no effect"),
     (["algo.loss.norm_len=512"], {}, "algo.loss.norm_len=512 has no effect in this run: it "
      "counts only with algo.loss.agg=seq-mean-token-sum-norm"),
     (["algo=grpo", "algo.loss.value_clip=0.5"], {}, "algo.loss.value_clip=0.5 has no effect in "
      "this run: it counts only with a critic (algo=ppo, or algo.critic.enabled=true)")],
)  # fmt: skip
def test_a_loss_setting_the_run_never_reads_warns(overrides, loss, said):
    """`loss`: values a YAML file gives (the command line would have refused them)."""
    cfg = compose(overrides)
    for key, value in loss.items():
        setattr(cfg.algo.loss, key, value)
    assert any(w.startswith(said) for w in training_checks(cfg))


@pytest.mark.parametrize(
    "overrides",
    [["algo.loss.ratio=engine", "algo.loss.rollout_correction=none"],
     ["algo.loss.rollout_correction=mis", "algo.loss.mis_low=0.3"],
     ["algo.loss.kl_coef=0.01", "algo.loss.kl_kind=k2", "algo.loss.kl_mode=reward"],
     ["algo=ppo", "algo.loss.value_clip=0.5"],
     ["algo.critic.enabled=true", "algo.loss.value_clip=0.5"],
     ["algo=drgrpo", "algo.loss.norm_len=512"]],
)  # fmt: skip
def test_a_loss_setting_the_run_reads_does_not_warn(overrides):
    assert not [w for w in training_checks(compose(overrides)) if "no effect" in w]
