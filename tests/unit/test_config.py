import pytest

from agentrl.config import compose
from agentrl.parsers import ConfigError


@pytest.mark.parametrize(
    "override,needle",
    [
        ("+rollout.max_turn=3", "rollout.max_turn: unknown key"),
        ("algo.advantage.name=ppo2", "algo.advantage.name"),
        ("algo.loss.name=nope", "algo.loss.name"),
        ("weight_sync.method=carrier_pigeon", "weight_sync.method"),
        ("rollout.group_size=0", "rollout.group_size"),
    ],
)
def test_bad_config_fails_at_the_door_with_its_path(override, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        compose([override])


def test_default_config_composes():
    cfg = compose()
    assert cfg.env.target == "envs.code_exec.CodeExecEnv" and cfg.algo.advantage.name == "grpo"
    assert cfg.engine.host == "127.0.0.1"


def test_env_target_must_be_an_env():
    with pytest.raises(ConfigError, match="not a subclass of agentrl.Env"):
        compose(["env._target_=agentrl.types.Task"]).env.load_class()
