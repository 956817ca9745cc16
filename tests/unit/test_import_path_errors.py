"""An env class path that does not import is one line naming the setting, what went wrong and
where: a module name alone, a misspelt class (the closest name), a module whose own code fails
(its file:line), a module that needs a package not installed."""

from __future__ import annotations

import sys

import pytest

from agentrl import ConfigError
from agentrl.registry import import_path

MODULES = {
    "nu_good": "class KVEnv:\n    pass\n",
    "nu_nameerror": "x = 1\ny = undefined_name\n",
    "nu_syntax": "def f(:\n",
    "nu_needs": "import nu_not_installed_pkg\n",
}


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    for name, source in MODULES.items():
        (tmp_path / f"{name}.py").write_text(source)
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("nu_good", r"'nu_good' names no attribute of a module: give `module.Name`"),
        (
            "nu_good.KVEnvv",
            r"nu_good has no attribute 'KVEnvv'; did you mean env._target_=nu_good.KVEnv\?",
        ),
        ("nu_good:KVEnvv", r"did you mean env._target_=nu_good:KVEnv\?"),
        ("nu_nameerror.E", r"importing nu_nameerror raised NameError: .*nu_nameerror.py:2\); fix"),
        ("nu_syntax.E", r"importing nu_syntax raised SyntaxError: .*nu_syntax.py:1\); fix"),
        ("nu_needs.E", r"importing nu_needs needs 'nu_not_installed_pkg', which is not installed"),
        ("nu_missing.E", r"No module named 'nu_missing'.*run from its directory, or add that to"),
        ("KVEnv", r"names no attribute of a module: .*\(e.g. my_module.KVEnv, for the class KVEnv"),
        ("nu_good.py:KVEnv", r"is a file's path; .*: env._target_=nu_good.KVEnv \(run from the"),
        ("./nu_good.py", r"is a file's path; .*: env._target_=nu_good.MyEnv \(run from the folder"),
        ("/home/me/nu_good.py:KVEnv", r"_target_=nu_good.KVEnv \(run from /home/me, the folder"),
    ],
)
def test_an_env_path_that_does_not_import_says_why_in_one_line(user_modules, path, message):
    with pytest.raises(ConfigError, match=message) as e:
        import_path(path, "env._target_")
    assert "\n" not in str(e.value)


def test_a_good_path_imports(user_modules):
    assert import_path("nu_good.KVEnv", "env._target_").__name__ == "KVEnv"
    assert import_path("nu_good:KVEnv", "env._target_").__name__ == "KVEnv"


def test_an_env_without_a_reward_is_refused_at_the_door():
    """A new user's ToolEnv without reward() trained on: every episode ended reward_error, 0."""
    from agentrl.env_config import EnvConfig

    with pytest.raises(ConfigError, match=r"NoReward does not define reward\(\); add `async def"):
        EnvConfig(_target_="nu_envs_fixture:NoReward").load_class()
    assert EnvConfig(_target_="nu_envs_fixture:WithReward").load_class().__name__ == "WithReward"


@pytest.fixture(autouse=True)
def _envs_module(tmp_path, monkeypatch):
    source = (
        "from agentrl.env import ToolEnv\n"
        "class NoReward(ToolEnv):\n    pass\n"
        "class WithReward(ToolEnv):\n    async def reward(self, trajectory):\n        return 1.0\n"
    )
    (tmp_path / "nu_envs_fixture.py").write_text(source)
    monkeypatch.delitem(sys.modules, "nu_envs_fixture", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
