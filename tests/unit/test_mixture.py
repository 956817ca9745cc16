"""env=mixture (agentrl/mixture.py): the weighted sampler (proportions, determinism, resume), the
config's checks (weights, names, unknown keys and envs, tools that clash), the per-env dispatch
of the rollout and the per-env metrics, step and evaluation."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from types import SimpleNamespace

import pytest
from pydantic import BaseModel

from agentrl.config import compose, validate
from agentrl.data import TaskSampler
from agentrl.env import ToolEnv
from agentrl.env_config import MixtureConfig
from agentrl.evaluate import evaluate
from agentrl.mixture import MixtureRollout, MixtureSampler, namespaced, split_id
from agentrl.tool import Tool, ToolResult
from agentrl.tools.python import PythonTool
from agentrl.types import ConfigError, FinishReason, Message, StopReason, Task, Trajectory, Turn


def tasks(name: str, n: int) -> list[Task]:
    return namespaced(name, [Task(id=str(i), data={"prompt": f"{name} {i}"}) for i in range(n)])


def sampler(weights: dict[str, float], seed: int = 0) -> MixtureSampler:
    sizes = {"code": 7, "units": 5, "add": 3}
    members = {name: TaskSampler(tasks(name, sizes[name]), seed=seed) for name in weights}
    return MixtureSampler(members, weights, seed=seed)


def envs_of(drawn: list[Task]) -> list[str]:
    return [split_id(t)[0] for t in drawn]


# -- the sampler ---------------------------------------------------------------------------------


def test_envs_are_drawn_in_proportion_to_their_weights():
    s = sampler({"code": 3.0, "units": 1.0})
    drawn = s.next(8000)
    share = Counter(envs_of(drawn))["code"] / len(drawn)
    assert share == pytest.approx(0.75, abs=0.02)
    # each env's own tasks go by its own epochs: every code task as often as every other
    per_task = Counter(t.id for t in drawn if t.id.startswith("code/"))
    assert len(per_task) == 7 and max(per_task.values()) - min(per_task.values()) <= 1
    thirds = Counter(envs_of(sampler({"code": 1, "units": 1, "add": 1}).next(6000)))
    assert all(n / 6000 == pytest.approx(1 / 3, abs=0.025) for n in thirds.values())


def test_the_draws_are_fixed_by_the_seed():
    a, b = sampler({"code": 1, "units": 1}, seed=4), sampler({"code": 1, "units": 1}, seed=4)
    first = [t.id for t in a.next(40)]
    assert first == [t.id for t in b.next(40)]
    assert first != [t.id for t in sampler({"code": 1, "units": 1}, seed=5).next(40)]
    assert {"code", "units"} == set(envs_of(a.next(40)))


def test_a_resumed_sampler_draws_what_the_stopped_one_would_have():
    whole = [t.id for t in sampler({"code": 2, "units": 1}, seed=3).next(50)]
    stopped = sampler({"code": 2, "units": 1}, seed=3)
    first = [t.id for t in stopped.next(17)]
    state = json.loads(json.dumps(stopped.state_dict()))  # as a checkpoint keeps it
    assert state["draws"] == 17 and set(state["envs"]) == {"code", "units"}
    resumed = sampler({"code": 2, "units": 1}, seed=3)
    resumed.load_state_dict(state)
    assert first + [t.id for t in resumed.next(33)] == whole


def test_a_resumed_run_may_change_the_weights_but_not_the_envs():
    stopped = sampler({"code": 1, "units": 1})
    stopped.next(10)
    reweighted = sampler({"code": 9, "units": 1})
    reweighted.load_state_dict(stopped.state_dict())  # goes on from draw 10, at the new weights
    assert reweighted.draws == 10
    with pytest.raises(ConfigError, match=r"drew from the envs \['code', 'units'\], this one"):
        sampler({"code": 1, "add": 1}).load_state_dict(stopped.state_dict())
    single = TaskSampler(tasks("code", 7)).state_dict()
    with pytest.raises(ConfigError, match="drew from a single env"):
        sampler({"code": 1, "units": 1}).load_state_dict(single)


def test_preview_sees_every_env_first():
    s = sampler({"code": 1, "units": 1})
    assert [t.id for t in s.tasks[:4]] == ["code/0", "units/0", "code/1", "units/1"]
    assert len(s.tasks) == 12


# -- the config ----------------------------------------------------------------------------------


class Square(Tool):
    name, description = "square", "Square a number."

    class Args(BaseModel):
        x: float

    def __call__(self, args, ctx) -> ToolResult:
        return ToolResult(content=str(args.x**2))


class OtherPython(Tool):  # the name of the built-in python tool, another meaning
    name, description = "python", "Evaluate one arithmetic expression."

    class Args(BaseModel):
        expression: str

    def __call__(self, args, ctx) -> ToolResult:
        return ToolResult(content="0")


class SquareEnv(ToolEnv):
    tools = [Square(), PythonTool()]  # python: the same tool as code_exec's (shared, fine)

    async def reward(self, trajectory) -> float:
        return 0.0


class ClashEnv(ToolEnv):
    tools = [OtherPython()]

    async def reward(self, trajectory) -> float:
        return 0.0


def test_env_mixture_composes_two_envs_with_equal_weights():
    cfg = compose(["env=mixture"])
    assert isinstance(cfg.env, MixtureConfig) and cfg.run_name == "mixture"
    assert {n: (m.target.rsplit(".", 1)[1], m.weight) for n, m in cfg.env.envs.items()} == {
        "code": ("CodeExecEnv", 1.0),
        "units": ("UnitsEnv", 1.0),
    }
    assert set(cfg.env.load_classes()) == {"code", "units"}
    # the weights are not the run's identity (a resumed run may change them); the envs are
    changed = compose(["env=mixture", "env.envs.code.weight=3", "env.envs.units.args.max_turns=2"])
    assert changed.identity() == cfg.identity() and changed.env.envs["code"].weight == 3
    assert compose(["env=mixture", "~env.envs.units"]).identity() != cfg.identity()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("env.envs.code.weight=0", r"env.envs.code.weight: must be > 0 .* ~env.envs.<name>"),
        ("env.envs.units.weight=-2", r"env.envs.units.weight: must be > 0"),
        ("env.envs.code.weight=inf", r"env.envs.code.weight=inf: not a finite number"),
        ("env.envs.code.wieght=2", r"env.envs.code.wieght: unknown key; did you mean .*weight\?"),
        ("+env.envs.code.wieght=2", r"env.envs.code.wieght: unknown key"),
        ("+env.wieghts=2", r"env.wieghts: unknown key"),
    ],
)
def test_bad_mixture_settings_fail_with_their_path(override, message):
    with pytest.raises(ConfigError, match=message):
        compose(["env=mixture", override])


def test_a_mixture_names_its_envs_for_metric_paths_and_needs_one():
    member = {"_target_": "agentrl.envs.examples.units.UnitsEnv"}
    with pytest.raises(ConfigError, match=r"env.envs.a/b: an env's name names its metrics"):
        validate({"env": {"envs": {"a/b": member}}})
    with pytest.raises(ConfigError, match="a mixture needs at least one env"):
        compose(["env=mixture", "~env.envs.units", "~env.envs.code"])


def test_unknown_envs_and_clashing_tools_are_refused_at_load():
    with pytest.raises(ConfigError, match=r"env.envs.code._target_='nope.Env' cannot be imported"):
        compose(["env=mixture", "env.envs.code._target_=nope.Env"]).env.load_classes()
    with pytest.raises(ConfigError, match=r"env.envs.units.args.max_turn: UnitsEnv has no .* did "
                       r"you mean env.envs.units.args.max_turns\?"):  # fmt: skip
        compose(["env=mixture", "env.envs.units.args.max_turn=2"]).env.load_classes()
    with pytest.raises(ConfigError, match=r"env.envs.units.tasks.m: unknown option"):
        cfg = compose(["env=mixture", "env.envs.units.tasks.m=2"])
        cfg.env.envs["units"].load_tasks(cfg.env.load_classes()["units"], where="env.envs.units")
    # the same tool (python) in two envs is one tool; one name with two meanings is not
    shared = compose(["env=mixture", f"env.envs.units._target_={__name__}.SquareEnv"])
    assert set(shared.env.load_classes()) == {"code", "units"}
    clash = compose(["env=mixture", f"env.envs.units._target_={__name__}.ClashEnv"])
    with pytest.raises(ConfigError, match=r"env.envs.code \(CodeExecEnv\) and env.envs.units "
                       r"\(ClashEnv\) both offer a tool named 'python'"):  # fmt: skip
        clash.env.load_classes()


# -- the rollout and the metrics -----------------------------------------------------------------


def traj(task: Task, i: int, reward: float, tool: bool) -> Trajectory:
    """A prompt of 2 tokens and one sampled turn of 2 (a tool call or not)."""
    turn = Turn(start=2, end=4, obs_end=4, weight_version="0", finish_reason=FinishReason.STOP,
                assistant=Message(role="assistant"), num_tool_calls=int(tool))  # fmt: skip
    return Trajectory(task_id=task.id, sample_index=i, token_ids=[0, 1, 2, 3],
                      loss_mask=[0, 0, 1, 1], logprobs=[0, 0, -1, -1], prompt_len=2,
                      turns=[turn], messages=[], stop_reason=StopReason.COMPLETED,
                      reward=reward)  # fmt: skip


class FakeRollout:
    """One env's Rollout: rewards `reward`, calls a tool when `tool`; records the tasks it got."""

    def __init__(self, reward: float, tool: bool) -> None:
        self.reward, self.tool, self.seen = reward, tool, []
        self.cfg = SimpleNamespace(group_size=2)
        self.engine = self.sandbox = None

    async def run_group(self, task: Task, n: int | None = None) -> list[Trajectory]:
        self.seen.append(task.id)
        return [traj(task, i, self.reward, self.tool) for i in range(n or 2)]


def test_each_group_goes_to_its_env_and_says_so():
    code, units = FakeRollout(1.0, tool=True), FakeRollout(0.25, tool=False)
    mix = MixtureRollout({"code": code, "units": units, "add": FakeRollout(0.0, tool=False)})
    drawn = [*tasks("code", 2), *tasks("units", 1)]
    groups = asyncio.run(mix.run(drawn))
    assert code.seen == ["0", "1"] and units.seen == ["0"]  # the env sees its own ids
    assert [[t.task_id for t in g] for g in groups] == [["code/0"] * 2, ["code/1"] * 2,
                                                        ["units/0"] * 2]  # fmt: skip
    assert [g[0].metadata["env"] for g in groups] == ["code", "code", "units"]
    m = mix.env_metrics(groups)
    assert m["env/code/groups"] == 2 and m["env/units/groups"] == 1 and m["env/add/groups"] == 0
    assert m["env/code/reward_mean"] == 1.0 and m["env/units/reward_mean"] == 0.25
    assert m["env/code/tool_call_rate"] == 1.0 and m["env/units/tool_call_rate"] == 0.0
    assert m["env/code/trajectories"] == 4 and "env/add/reward_mean" not in m
    with pytest.raises(ValueError, match="no env 'other' in this mixture"):
        asyncio.run(mix.run_group(Task(id="other/0")))


def test_evaluation_reports_each_env_and_the_whole():
    mix = MixtureRollout({"code": FakeRollout(1.0, True), "units": FakeRollout(0.0, False)})
    out, episodes = asyncio.run(evaluate(mix, [*tasks("code", 1), *tasks("units", 3)], samples=2))
    assert out["eval/reward_mean"] == 0.25 and out["eval/episodes"] == 8 == len(episodes)
    assert out["eval/code/reward_mean"] == 1.0 and out["eval/code/episodes"] == 2
    assert out["eval/units/reward_mean"] == 0.0 and out["eval/units/tool_call_rate"] == 0.0
    assert {e.metadata["env"] for e in episodes} == {"code", "units"}


class PacedRollout(FakeRollout):
    """An env whose groups take `delay_s` each."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(0.0, tool=False)
        self.delay_s = delay_s

    async def run_group(self, task: Task, n: int | None = None) -> list[Trajectory]:
        await asyncio.sleep(self.delay_s)
        return await super().run_group(task, n)


def test_over_sampling_keeps_each_envs_share_of_the_draws():
    """trainer.sampling.oversample_groups with env=mixture: of 4 groups a step (2 slow, 2 quick
    among the first 4 draws) and 2 spares, each env keeps its own 2, its first to finish; the
    quick env's spare is dropped. Kept by finishing order across envs, the quick env took 3 of
    the 4 (a real 4-step run of code and units at weights 1:1 trained 4 code groups and 12 units)."""
    mix = MixtureRollout({"slow": PacedRollout(0.05), "quick": PacedRollout(0.0)})
    ids = ["slow/0", "quick/0", "slow/1", "quick/1", "quick/2", "slow/2"]
    groups = asyncio.run(mix.run([Task(id=i) for i in ids], keep=4))
    kept = [g[0].task_id for g in groups]
    assert sorted(kept) == ["quick/0", "quick/1", "slow/0", "slow/1"]  # in launch order, below
    assert kept == ["slow/0", "quick/0", "slow/1", "quick/1"]
