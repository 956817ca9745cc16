"""Several envs in one run (`env=mixture`): tasks drawn by weight, each env's own episodes, metrics
and evaluation apart.

    agentrl train env=mixture env.envs.code.weight=3 env.envs.units.weight=1

configs/env/mixture.yaml composes two env files as members (`env.envs.<name>`: `_target_`, `args`,
`tasks`, `eval_tasks` as a single env's, plus `weight`); `+env@env.envs.mine=custom
env.envs.mine._target_=my_env.AddEnv` adds one, `~env.envs.units` drops one. What a mixture does:

- Each env keeps its own class: tools (the chat template offers an episode only its env's),
  system prompt, reward, task list and its `args` (`max_turns` included: leave rollout.max_turns
  unset, or it overrides every env's). Two envs may share a tool only when the model sees the
  same tool (name, description and arguments): the same name meaning two things is refused.
- Tasks: env `e` is drawn with probability weight_e / sum(weights); draw i of a run uses its own
  generator seeded from (seed, i), and each env's tasks come from its own `TaskSampler`, so the
  sampler's state is the draw count and one cursor per env, and a resumed run draws exactly what
  the stopped one would have. Weights are not part of the run's identity: a resumed run may
  change them and goes on from its draw count. A task's id becomes `<env>/<id>` (the env's
  own code sees the original id); every group is one env's, so group baselines never mix envs.
  Over-sampled (trainer.sampling.oversample_groups), each env keeps its share of the step's
  draws, its first groups to finish: the spares replace only their own env's slow groups.
- Run-wide, not per env: sampling (rollout.temperature, max_new_tokens, context budgets: one
  policy, one logprob temperature for the trainer), rollout.group_size, trainer.tasks_per_step.
  Estimators that whiten over the step (reinforce_pp_baseline, gae) whiten every env's tokens
  together; grpo, drgrpo and rloo are per group.
- Metrics: the totals as in a single-env run, and per env `env/<name>/*` (`env_metrics`); each
  trajectory's `metadata["env"]` names its env (trajectories.jsonl, `agentrl view --env NAME`).
- Evaluation (trainer.eval.every): each env's own held-out set of trainer.eval.size tasks (from
  its tasks, or its eval_tasks), `eval/<name>/*` beside the totals over every episode (the envs
  weigh by their set's size, not by their weight).

    sampler = MixtureSampler({"code": TaskSampler(code), "units": TaskSampler(units)},
                             {"code": 3.0, "units": 1.0}, seed=0)
    tasks = sampler.next(8)      # ids "code/17", "units/kg_to_pounds-3", …
    rollout = MixtureRollout({"code": Rollout(...), "units": Rollout(...)})
    groups = await rollout.run(tasks)  # each group by its own env's Rollout
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.advantage import Truncation
from agentrl.data import TaskSampler
from agentrl.env import Env
from agentrl.metrics import by_env, rollout_metrics
from agentrl.oversample import run_groups
from agentrl.rollout import Rollout
from agentrl.types import ConfigError, Task, Trajectory

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a metric path segment: no '/'

# rollout_metrics' names → the per-env names (env/<name>/…); every reward/<x> but max and min
# goes as reward_<x> (`summary`)
ENV_NAMES = {
    "rollout/trajectories": "trajectories",
    "rollout/tool_call_rate": "tool_call_rate",
    "rollout/turns": "turns",
    "rollout/tool_calls": "tool_calls",
    "rollout/tool_errors": "tool_errors",
    "rollout/tool_exceptions": "tool_exceptions",
    "rollout/parse_errors": "parse_errors",
    "rollout/sampled_tokens": "sampled_tokens",
    "rollout/truncated": "truncated",
}


def check_name(name: str, where: str = "env.envs") -> str:
    """An env's name names its metrics: env/<name>/…, eval/<name>/… (eval/tools/ is the tools')."""
    if not NAME.fullmatch(name) or name == "tools":
        raise ValueError(
            f"{where}.{name}: an env's name names its metrics (env/<name>/…): use letters, "
            "digits, '_', '-' and '.', and not 'tools' (eval/tools/ is the tools' metrics)"
        )
    return name


def namespaced(name: str, tasks: Sequence[Task]) -> list[Task]:
    """`tasks` with ids `<name>/<id>`: unique across the mixture, and they say their env."""
    return [Task(id=f"{name}/{t.id}", data=t.data) for t in tasks]


def split_id(task: Task) -> tuple[str, Task]:
    """(the env's name, the task as its env loaded it) of a mixture's task."""
    name, sep, inner = task.id.partition("/")
    if not sep:
        raise ValueError(f"task {task.id!r} is not a mixture's (ids are <env>/<id>)")
    return name, Task(id=inner, data=task.data)


def check_tools(classes: Mapping[str, type[Env]], where: str = "env.envs") -> None:
    """Envs may share a tool name only for the same tool as the model sees it (name,
    description, argument schema): one name meaning two things across the mixture would teach
    the policy a contradiction (and merge the two in the per-tool metrics)."""
    seen: dict[str, tuple[str, dict[str, Any]]] = {}
    for env, cls in classes.items():
        for tool in cls.tools:
            schema = tool.schema()
            first = seen.setdefault(tool.name, (env, schema))
            if first[1] != schema:
                raise ConfigError(
                    f"{where}.{first[0]} ({classes[first[0]].__name__}) and {where}.{env} "
                    f"({cls.__name__}) both offer a tool named {tool.name!r}, with another "
                    "description or other arguments: the policy would read one name two ways. "
                    "Rename one (its Tool.name) or give both envs the same tool"
                )


class MixtureSampler:
    """Tasks of several envs, drawn by weight (module docstring); the TaskSampler interface."""

    def __init__(
        self, samplers: Mapping[str, TaskSampler], weights: Mapping[str, float], seed: int = 0
    ) -> None:
        if not samplers or set(samplers) != set(weights):
            raise ValueError(f"envs {sorted(samplers)} and weights {sorted(weights)} differ")
        bad = {k: w for k, w in weights.items() if not w > 0}
        if bad:
            raise ValueError(f"weights must be > 0, got {bad}")
        self.samplers, self.seed = dict(samplers), seed
        total = sum(weights.values())
        self.shares = {name: weights[name] / total for name in self.samplers}
        self.draws = 0  # tasks drawn so far: the generator of draw i is seeded from (seed, i)
        # every env's tasks, interleaved (code/0, units/0, code/1, …): `agentrl preview` shows
        # the first few, so each env's come first
        lists = [s.tasks for s in self.samplers.values()]
        self.tasks = [ts[i] for i in range(max(map(len, lists))) for ts in lists if i < len(ts)]

    def pick(self, i: int) -> str:
        """The env of draw `i`: a uniform number of its own against the cumulative shares."""
        u = random.Random(f"agentrl-mixture:{self.seed}:{i}").random()
        for name, share in self.shares.items():
            u -= share
            if u < 0:
                return name
        return list(self.shares)[-1]  # rounding

    def next(self, n: int) -> list[Task]:
        out = []
        for _ in range(n):
            out += self.samplers[self.pick(self.draws)].next(1)
            self.draws += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "draws": self.draws,
            "envs": {name: s.state_dict() for name, s in self.samplers.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The cursor of a mixture of the same envs (their weights may have changed)."""
        theirs = sorted(state.get("envs", {}))
        if theirs != sorted(self.samplers):
            was = f"the envs {theirs}" if theirs else "a single env"
            raise ConfigError(
                f"the checkpoint's run drew from {was}, this one from {sorted(self.samplers)} "
                "(env.envs): resume with the envs it ran with, or start fresh "
                "(checkpoint.resume=never, or another run_name)"
            )
        for name, sampler in self.samplers.items():
            sampler.load_state_dict(state["envs"][name])
        self.draws = int(state["draws"])


class MixtureRollout:
    """One `Rollout` per env; a task goes to the env its id names (`<env>/<id>`), and its
    trajectories keep that id and say their env (`metadata["env"]`). `run` as Rollout.run."""

    def __init__(self, members: Mapping[str, Rollout]) -> None:
        if not members:
            raise ValueError("a mixture needs at least one env")
        self.members = dict(members)
        first = next(iter(self.members.values()))  # built from one config: the same parts
        self.cfg, self.engine, self.sandbox = first.cfg, first.engine, first.sandbox

    async def run(self, tasks: list[Task], keep: int | None = None) -> list[list[Trajectory]]:
        """`Rollout.run`; over-sampled (`keep`), each env keeps its share of the first `keep`
        draws (`run_groups`), so the weights hold whichever env finishes first."""
        return await run_groups(self.run_group, tasks, keep, kind=lambda t: split_id(t)[0])

    async def aclose(self) -> None:
        for member in self.members.values():
            await member.aclose()

    async def run_group(self, task: Task, n: int | None = None) -> list[Trajectory]:
        name, inner = self._member(task)
        return self._mark(name, task, await self.members[name].run_group(inner, n))

    def _member(self, task: Task) -> tuple[str, Task]:
        name, inner = split_id(task)
        if name not in self.members:
            raise ValueError(f"task {task.id!r}: no env {name!r} in this mixture")
        return name, inner

    @staticmethod
    def _mark(name: str, task: Task, trajs: list[Trajectory]) -> list[Trajectory]:
        for tr in trajs:
            tr.task_id = task.id
            tr.metadata["env"] = name
        return trajs

    def env_metrics(
        self, groups: Sequence[Sequence[Trajectory]], truncation: Truncation | None = None
    ) -> dict[str, float]:
        """env/<name>/*: each env's groups this step (0 for one that drew none) and, when it has
        some, `ENV_NAMES` and its rewards over its own trajectories (`summary`)."""
        out = {f"env/{name}/groups": 0.0 for name in self.members}
        for name, gs in by_env(groups).items():
            out[f"env/{name}/groups"] = float(len(gs))
            out.update(summary([t for g in gs for t in g], f"env/{name}/", ENV_NAMES, truncation))
        return out


def summary(
    trajs: list[Trajectory],
    prefix: str,
    names: Mapping[str, str],
    truncation: Truncation | None = None,
) -> dict[str, float]:
    """`rollout_metrics` of `trajs` under `prefix`: the keys `names` maps, every reward/<x> but
    max and min as reward_<x>, and `failed` (infrastructure failures: not scored)."""
    if not trajs:
        return {}
    raw = rollout_metrics(trajs, truncation)
    out = {f"{prefix}{new}": raw[old] for old, new in names.items() if old in raw}
    for key, value in raw.items():
        if key.startswith("reward/") and key not in ("reward/max", "reward/min"):
            out[f"{prefix}reward_{key.removeprefix('reward/')}"] = value
    out[f"{prefix}failed"] = float(sum(t.stop_reason.is_infra_failure for t in trajs))
    return out
