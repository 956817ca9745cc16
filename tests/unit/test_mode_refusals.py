"""Combinations of settings that would train on the wrong numbers without a word, refused
before a run starts, each with the settings and the fix (config.training_checks)."""

import pytest

from agentrl.config import compose, training_checks
from agentrl.types import ConfigError


def test_request_sampling_through_the_gateway_is_refused_for_training():
    """The learner scores every token at rollout.temperature; an agent's own temperature (a
    framework's default 0.7) would make the engine sample another distribution."""
    cfg = compose(["rollout.gateway.sampling=request"])  # fine for `agentrl gateway`
    with pytest.raises(ConfigError, match=r"rollout.gateway.sampling=request.*sampling=run"):
        training_checks(cfg)
    assert training_checks(compose(["rollout.gateway.sampling=run"])) == []


def test_a_lora_policy_s_critic_needs_its_own_learning_rate():
    """The critic trains every parameter; learner.lr is then an adapter's rate (a PPO run with
    learner.lora.rank=8 learner.lr=5e-3 logged critic/lr 0.005 for the full critic)."""
    lora = ["algo=ppo", "learner.lora.rank=8", "learner.lr=5e-3"]
    with pytest.raises(ConfigError, match=r"learner.lora.rank=8 .*set algo.critic.lr"):
        training_checks(compose(lora))
    assert training_checks(compose([*lora, "algo.critic.lr=1e-3"])) == []
    assert training_checks(compose(["learner.lora.rank=8"])) == []  # no critic: nothing to ask
    assert training_checks(compose(["algo=ppo"])) == []  # full fine-tune: learner.lr suits both
