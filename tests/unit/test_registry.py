"""The one Registry class, and extending agentrl from a user module without editing agentrl/:
an advantage estimator, a loss, a parser, a sandbox backend and a weight-sync method, each named
by import path (or registered by name from the env's module) in the config."""

from __future__ import annotations

import asyncio
import sys
import textwrap

import pytest
import torch

from agentrl import ConfigError, Registry
from agentrl.advantage import AdvantageConfig, compute_advantages
from agentrl.config import compose
from agentrl.loss import LOSSES, LossConfig, LossInputs, get_loss
from agentrl.parsers import get_parser
from agentrl.sandbox import make_sandbox
from agentrl.types import FinishReason, Message, StopReason, Trajectory, Turn
from agentrl.weight_sync import make_weight_sync

USER_MODULE = '''
import torch
from agentrl.advantage import register as register_estimator
from agentrl.parsers import HermesParser
from agentrl.envs.code_exec import CodeExecEnv
from agentrl.sandbox.subproc import SubprocessSandbox
from agentrl.learner.sync.disk import DiskSync

CALLS = []

def plus_one(episodes, cfg):
    """Advantage = reward + 1 on every sampled token (no group baseline)."""
    CALLS.append("estimator")
    return [e.loss_mask_T.float() * (e.score + 1.0) for e in episodes], None

@register_estimator("user_named")
def user_named(episodes, cfg):
    CALLS.append("named")
    return [e.loss_mask_T.float() * 0.0 for e in episodes], None

def neg_logprob(inp, cfg):
    CALLS.append("loss")
    m = inp.loss_mask.float()
    return -(inp.logprobs * inp.advantages * m).sum() / inp.norm.num_tokens, {}

class MyParser(HermesParser):
    pass

class MySandbox(SubprocessSandbox):
    pass

def make_sandbox(cfg):
    CALLS.append("sandbox")
    return MySandbox(max_concurrency=2)

class MySync(DiskSync):
    pass

class MyEnv(CodeExecEnv):
    pass
'''


@pytest.fixture
def user_ext(tmp_path, monkeypatch):
    (tmp_path / "user_ext.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("user_ext", None)


def test_registry_refuses_duplicates_and_lists_known_names():
    reg: Registry = Registry("widget", setting="thing.widget")
    reg.register("a")(len)
    reg.register("a")(len)  # the same object again (a re-imported module) is fine
    with pytest.raises(ValueError, match="widget 'a' is registered twice"):
        reg.register("a")(print)
    with pytest.raises(ValueError, match="plain name"):
        reg.register("pkg.mod:x")
    with pytest.raises(ConfigError, match=r"unknown widget 'b'; set thing.widget to one of: a"):
        reg.get("b")
    assert reg.get("builtins:len") is len and reg.get("os.path.join").__name__ == "join"
    with pytest.raises(ConfigError, match="thing.widget='nope_mod:x' cannot be imported"):
        reg.get("nope_mod:x")


def test_a_second_builtin_loss_name_raises():
    with pytest.raises(ValueError, match="registered twice"):
        LOSSES.register("ppo_clip")(lambda inp, cfg: None)


def traj(reward: float) -> Trajectory:
    """Two prompt tokens, three sampled ones."""
    turn = Turn(start=2, end=5, obs_end=5, weight_version="0", finish_reason=FinishReason.STOP,
                assistant=Message(role="assistant"))  # fmt: skip
    return Trajectory(task_id="t", sample_index=0, token_ids=[1, 2, 3, 4, 5],
                      loss_mask=[0, 0, 1, 1, 1], logprobs=[0, 0, -0.5, -0.5, -0.5], prompt_len=2,
                      turns=[turn], messages=[], stop_reason=StopReason.COMPLETED, reward=reward)  # fmt: skip


def test_user_estimator_loss_parser_backend_and_sync_by_import_path(user_ext):
    cfg = compose([
        "env=code_exec", "algo.advantage.name=user_ext:plus_one",
        "algo.loss.name=user_ext:neg_logprob", "rollout.parser=user_ext:MyParser",
        "sandbox.backend=user_ext:make_sandbox", "weight_sync.method=user_ext:MySync",
    ])  # fmt: skip
    import user_ext as ext

    out = compute_advantages([[traj(1.0), traj(0.0)]], cfg.algo.advantage)
    assert [a.tolist() for a in out.advantages] == [[0, 0, 2, 2, 2], [0, 0, 1, 1, 1]]
    assert get_loss(cfg.algo.loss.name) is ext.neg_logprob
    assert type(get_parser(cfg.rollout.parser)) is ext.MyParser
    sb = make_sandbox(cfg.sandbox)
    assert isinstance(sb, ext.MySandbox)
    res = asyncio.run(sb.run("print(6 * 7)", timeout=10))
    asyncio.run(sb.aclose())
    assert res.stdout == "42\n"
    sync = make_weight_sync(cfg.weight_sync, learner=None, engine=None)  # type: ignore[arg-type]
    assert type(sync) is ext.MySync  # the class itself: its rank half is run by reference
    assert ext.CALLS[:2] == ["estimator", "sandbox"]


def test_names_registered_by_the_env_module_are_known_when_the_config_is_checked(user_ext):
    assert "user_ext" not in sys.modules
    cfg = compose(["env=custom", "env._target_=user_ext.MyEnv", "algo.advantage.name=user_named"])
    assert cfg.algo.advantage.name == "user_named"
    with pytest.raises(ConfigError, match="unknown advantage estimator 'user_nameless'"):
        compose(["env=custom", "env._target_=user_ext.MyEnv", "algo.advantage.name=user_nameless"])


def test_a_user_loss_computes_through_the_same_inputs():
    from agentrl.batch import LossNorm

    inp = LossInputs(logprobs=torch.tensor([-1.0, -2.0]), rollout_logprobs=torch.zeros(2),
                     advantages=torch.tensor([1.0, 1.0]), loss_mask=torch.ones(2),
                     seq_ids=torch.zeros(2, dtype=torch.long), norm=LossNorm(2, 1),
                     trainer_old_logprobs=torch.zeros(2))  # fmt: skip
    loss, _ = get_loss("ppo_clip")(inp, LossConfig())
    assert torch.isfinite(loss)
    assert AdvantageConfig(name="grpo").name == "grpo"


def test_an_env_named_by_its_old_top_level_path_is_pointed_to_agentrl_envs(monkeypatch) -> None:
    from pathlib import Path

    from agentrl.registry import import_path

    root = str(Path(__file__).resolve().parents[2])  # where envs/ sits (PYTHONPATH=. on a GPU host)
    monkeypatch.setattr(
        sys, "path", [p for p in sys.path if Path(p or ".").resolve() != Path(root)]
    )
    for name in [m for m in sys.modules if m == "envs" or m.startswith("envs.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ConfigError, match=r"did you mean agentrl\.envs\.code_exec\.CodeExecEnv"):
        import_path("envs.code_exec.CodeExecEnv", "env._target_")


@pytest.mark.parametrize(
    ("override", "said"),
    [("algo.advantage.name=os:getcwd", r"algo\.advantage\.name='os:getcwd' is posix\.getcwd, "
      r"which cannot be called as an advantage estimator is, fn\(episodes, cfg\)"),
     ("algo.loss.name=agentrl.loss:LossConfig", r"is the class LossConfig, which cannot be "
      r"called as a loss is, fn\(inputs, cfg\)"),
     ("algo.loss.name=math:pi", r"is a float, which cannot be called as a loss is"),
     ("sandbox.backend=os:getcwd", r"sandbox\.backend='os:getcwd' is posix\.getcwd, which "
      r"cannot be called as a sandbox backend is, fn\(cfg\)")],
)  # fmt: skip
def test_an_import_path_to_the_wrong_kind_of_object_is_refused_at_the_door(override, said):
    """Found by a red-team pass: any importable name passed the config (a class, a constant, a
    function of other parameters) and failed with a TypeError at the first step, or in the
    sandbox's start, after everything had started."""
    with pytest.raises(ConfigError, match=said):
        compose(["env=code_exec", override])
