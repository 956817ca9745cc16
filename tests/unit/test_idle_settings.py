"""A setting given a value the run never reads is said at start-up. Found by a red-team pass:
rollout.truncated_reward=-1 without rollout.truncated=penalise, trainer.async.* in a sync run,
trainer.eval.* with evaluation off: each was taken without a word and did nothing."""

from __future__ import annotations

import itertools

import pytest

from agentrl.config import CONFIG_DIR, compose, training_checks


@pytest.mark.parametrize(
    ("overrides", "said"),
    [(["rollout.truncated_reward=-1"], "rollout.truncated_reward=-1.0 has no effect in this "
      "run: it counts only with rollout.truncated=penalise (drop it, or set that too)"),
     (["trainer.async.max_staleness=4"], "trainer.async.max_staleness=4 has no effect in this "
      "run: it counts only with trainer.mode=async"),
     (["trainer.eval.size=8"], "trainer.eval.size=8 has no effect in this run: it counts only "
      "with trainer.eval.every > 0"),
     (["trainer.sampling.max_refill_rounds=9"], "trainer.sampling.max_refill_rounds=9 has no "
      "effect in this run: it counts only with trainer.sampling.dynamic_sampling=true"),
     (["checkpoint.save_optimizer=false", "checkpoint.optimizer_format=full"],
      "checkpoint.optimizer_format=full has no effect in this run")],
)  # fmt: skip
def test_a_setting_the_run_never_reads_is_said(overrides, said):
    assert any(w.startswith(said) for w in training_checks(compose(overrides)))


def test_set_with_what_makes_it_count_it_is_not():
    for overrides in (["rollout.truncated_reward=-1", "rollout.truncated=penalise"],
                      ["trainer.eval.size=8", "trainer.eval.every=2"]):  # fmt: skip
        assert not [w for w in training_checks(compose(overrides)) if "no effect" in w]


def test_no_shipped_config_sets_an_idle_setting():
    groups = {g: sorted(p.stem for p in (CONFIG_DIR / g).glob("*.yaml"))
              for g in ("algo", "env", "model", "learner")}  # fmt: skip
    for algo, env in itertools.product(groups["algo"], ["code_exec", "units", "mixture"]):
        warnings = training_checks(compose([f"algo={algo}", f"env={env}"]))
        assert not [w for w in warnings if "no effect" in w], (algo, env)
    for model in groups["model"]:
        assert not [w for w in training_checks(compose([f"model={model}"])) if "no effect" in w]
